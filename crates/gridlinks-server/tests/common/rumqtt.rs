//! rumqttc (an MQTT client written outside the project) on a thread, its events on a channel.

use std::sync::mpsc;
use std::time::Duration;

use rumqttc::{Client, Event, Incoming, MqttOptions};

/// A rumqttc client (MQTT 3.1.1) logged in with `token`, its events on a channel.
pub fn rumqttc_client(port: u16, token: &str, id: &str) -> (Client, mpsc::Receiver<Incoming>) {
    let mut opts = MqttOptions::new(id, "127.0.0.1", port);
    opts.set_credentials(token, "");
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut conn) = Client::new(opts, 64);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for ev in conn.iter() {
            match ev {
                Ok(Event::Incoming(i)) => {
                    if tx.send(i).is_err() {
                        return;
                    }
                }
                Ok(Event::Outgoing(_)) => {}
                // A refused publish closes an MQTT 3.1.1 connection: the test sees no PUBACK.
                Err(_) => return,
            }
        }
    });
    (client, rx)
}
