//! Observe (RFC 7641) on `…/attributes` (shared attribute updates) and `…/rpc`
//! (server-side RPC requests).
//!
//! An observation is one client endpoint and token watching one resource of one device. It
//! holds a device session (the same kind a MQTT or custom TCP connection holds), so
//! server-side RPC and shared attribute updates reach it exactly as they reach the others.
//! Each notification is a confirmable message, retransmitted as RFC 7252 §4.2 says; a Reset,
//! or no acknowledgement after [`MAX_RETRANSMIT`] retransmissions, ends the observation, as
//! does a GET with Observe 1, a new registration with the same token, the device's
//! deletion (a final 4.04) or shutdown. Observations are bounded in total
//! (`coap.max_observations`) and per access token (`mqtt.max_connections_per_credential`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coap_lite::{MessageType, ResponseType};
use gridlinks_broker::sessions::{Outbound, SessionLink};
use gridlinks_codec::mqtt::QoS;
use gridlinks_storage::AttributeEntry;
use gridlinks_thingsboard::attributes::device_response;
use gridlinks_thingsboard::topic;
use gridlinks_types::{AttributeScope, DeviceId};
use serde_json::{json, Value as J};
use tokio::sync::{oneshot, watch, Notify};

use super::{message, Server};
use gridlinks_platform::sessions::CredentialSlot;

/// Time before the first retransmission of a notification (RFC 7252's ACK_TIMEOUT; the
/// actual wait is 1 to 1.5 times it, then doubles).
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// Retransmissions of a notification before the client is taken to be gone.
pub const MAX_RETRANSMIT: u32 = 4;

/// What an observation watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// `GET …/attributes`: shared attribute updates, `{"key":value,…}`.
    Attributes,
    /// `GET …/rpc`: server-side RPC requests, `{"id":N,"method":…,"params":…}`.
    Rpc,
}

/// One live observation, as the registry keeps it.
struct Entry {
    /// Ends the observation's task.
    stop: Arc<Notify>,
    /// Tells this entry from a later one under the same key.
    serial: u64,
}

/// Live observations by (client endpoint, token).
#[derive(Default)]
pub struct Observations {
    map: parking_lot::Mutex<HashMap<(SocketAddr, Vec<u8>), Entry>>,
    serial: AtomicU64,
    /// CON notifications waiting for their ACK (true) or Reset (false), by (peer, message id).
    awaiting: parking_lot::Mutex<HashMap<(SocketAddr, u16), oneshot::Sender<bool>>>,
}

impl Observations {
    /// Live observations.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Ends the observation `key`, if there is one; true if there was.
    pub fn cancel(&self, key: &(SocketAddr, Vec<u8>)) -> bool {
        match self.map.lock().remove(key) {
            Some(e) => {
                e.stop.notify_one();
                true
            }
            None => false,
        }
    }

    /// An ACK (`acked`) or Reset for the server's message `mid` to `peer`; false if no
    /// notification waits for it.
    pub fn answered(&self, peer: SocketAddr, mid: u16, acked: bool) -> bool {
        match self.awaiting.lock().remove(&(peer, mid)) {
            Some(tx) => tx.send(acked).is_ok(),
            None => false,
        }
    }

    /// Ends every observation (shutdown).
    pub fn cancel_all(&self) {
        for (_, e) in self.map.lock().drain() {
            e.stop.notify_one();
        }
    }
}

/// Why an observation cannot be registered.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// `coap.max_observations` are live.
    #[error("{0} observations are live (coap.max_observations): retry later")]
    Full(usize),
    /// The access token has its share.
    #[error("this access token has {0} sessions (mqtt.max_connections_per_credential)")]
    PerToken(usize),
}

/// Registers an observation of `watched` on `device` by `peer` with `token` (replacing
/// one with the same endpoint and token) and starts its notifications.
pub fn register(
    server: &Arc<Server>,
    peer: SocketAddr,
    token: Vec<u8>,
    access_token: &str,
    device: DeviceId,
    watched: Watched,
) -> Result<(), Refused> {
    let key = (peer, token);
    let obs = &server.observations;
    let max = server.platform.core.cfg.coap.max_observations;
    // A re-registration replaces its predecessor, so it needs no room of its own.
    let replacing = obs.cancel(&key);
    if !replacing && obs.len() >= max {
        return Err(Refused::Full(max));
    }
    let per_token = server.platform.core.cfg.mqtt.max_connections_per_credential;
    // NUL cannot start an MQTT credential: the two kinds of keys never meet.
    let Some(slot) = server.platform.devices.counts.acquire(&format!("\0coap/{access_token}"), per_token) else {
        return Err(Refused::PerToken(per_token));
    };
    let sessions = &server.platform.devices.sessions;
    let link = sessions.register(device, server.platform.core.cfg.mqtt.outbound_queue);
    let filter = match watched {
        Watched::Attributes => topic::ATTRIBUTES,
        Watched::Rpc => topic::RPC_REQUESTS,
    };
    // A fresh session has no subscription to exceed a limit with.
    let _ = sessions.subscribe(device, link.id, filter, QoS::AtMostOnce);
    let stop = Arc::new(Notify::new());
    let serial = obs.serial.fetch_add(1, Ordering::Relaxed);
    obs.map.lock().insert(key.clone(), Entry { stop: stop.clone(), serial });
    let task = Task { server: server.clone(), key, device, link, watched, stop, serial, _slot: slot };
    tokio::spawn(task.run(server.shutdown.clone()));
    Ok(())
}

/// An observation's notifier.
struct Task {
    server: Arc<Server>,
    key: (SocketAddr, Vec<u8>),
    device: DeviceId,
    link: SessionLink,
    watched: Watched,
    stop: Arc<Notify>,
    serial: u64,
    _slot: CredentialSlot,
}

impl Task {
    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        'observing: loop {
            tokio::select! {
                () = self.stop.notified() => break,
                _ = shutdown.changed() => break,
                () = self.link.inbox.wake.notified() => {}
            }
            if self.link.close_reason().is_some() {
                // The device was deleted (or the server stops): a final error ends the
                // observation on the client's side too (RFC 7641 §3.2).
                let end = message(
                    MessageType::NonConfirmable,
                    self.server.mid(),
                    &self.key.1,
                    ResponseType::NotFound,
                    &[],
                    b"the device was deleted".to_vec(),
                    false,
                );
                self.server.send(&end, self.key.0).await;
                break;
            }
            for o in self.link.inbox.drain() {
                let Some(body) = notification(self.watched, &o) else { continue };
                if !self.confirm(body).await {
                    break 'observing;
                }
            }
        }
        self.server.platform.devices.sessions.unregister(self.device, self.link.id);
        let obs = &self.server.observations;
        let mut map = obs.map.lock();
        if map.get(&self.key).is_some_and(|e| e.serial == self.serial) {
            map.remove(&self.key);
        }
        drop(map);
    }

    /// Sends `body` as a confirmable notification until it is acknowledged; false when the
    /// client answered with a Reset or never acknowledged (the observation ends).
    async fn confirm(&self, body: Vec<u8>) -> bool {
        let server = &self.server;
        let (peer, token) = (&self.key.0, &self.key.1);
        let mid = server.mid();
        let bytes = super::notification(mid, token, server.observe_seq(), body);
        let (tx, mut rx) = oneshot::channel();
        server.observations.awaiting.lock().insert((*peer, mid), tx);
        // 1 to 1.5 times ACK_TIMEOUT, then doubling (RFC 7252 §4.2).
        let mut wait = ACK_TIMEOUT + ACK_TIMEOUT.mul_f64(f64::from(super::rand_u16()) / f64::from(u16::MAX) / 2.0);
        for _ in 0..=MAX_RETRANSMIT {
            server.send(&bytes, *peer).await;
            server.metrics.notifications.fetch_add(1, Ordering::Relaxed);
            match tokio::time::timeout(wait, &mut rx).await {
                Ok(answer) => return answer.unwrap_or(false),
                Err(_) => wait *= 2,
            }
        }
        server.observations.awaiting.lock().remove(&(*peer, mid));
        false
    }
}

/// The notification body for a session message: shared attributes as published, or an
/// RPC request with its id (`{"id":N,"method":…,"params":…}`, as ThingsBoard sends it).
fn notification(watched: Watched, o: &Outbound) -> Option<Vec<u8>> {
    match watched {
        Watched::Attributes => Some(o.msg.payload.to_vec()),
        Watched::Rpc => {
            let Some(topic::DeviceTopic::RpcRequest(id)) = topic::DeviceTopic::parse(&o.msg.topic) else {
                return None;
            };
            let id: u32 = id.parse().ok()?;
            let body: J = serde_json::from_slice(&o.msg.payload).ok()?;
            let out =
                json!({"id": id, "method": body.get("method")?, "params": body.get("params").unwrap_or(&J::Null)});
            Some(out.to_string().into_bytes())
        }
    }
}

/// The shared attributes a registration answers with: `{"k":v,…}`, the shape of the
/// notifications that follow.
pub fn shared_attributes(entries: Vec<AttributeEntry>) -> Vec<u8> {
    let values = entries.into_iter().map(|a| (a.key, a.value)).collect();
    let mut response = device_response([(AttributeScope::Shared, values)]);
    response.get_mut("shared").map_or_else(|| json!({}), J::take).to_string().into_bytes()
}
