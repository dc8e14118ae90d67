//! Pub/sub between clients that are not devices (applications with credentials, and
//! anonymous clients with `mqtt.allow_anonymous`): wildcard subscriptions, QoS 0/1,
//! retained messages, ACLs, the device API closed to such clients, client-id takeover and
//! shared subscriptions; against the real binary with Mosquitto's own command-line
//! clients and the raw test client.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::mqtt::*;
use common::{json, Server};

fn anonymous_server() -> Server {
    Server::start_env(&[("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true")])
}

/// `mosquitto_pub` with `args`; panics unless it exits 0 (with -q 1: after its PUBACK).
fn mosquitto_pub(port: u16, args: &[&str]) {
    let status = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .status()
        .expect("mosquitto_pub (apt-get install mosquitto-clients)");
    assert!(status.success(), "mosquitto_pub {args:?}: {status}");
}

/// Starts `mosquitto_sub` printing `topic payload` lines, and waits until it is subscribed
/// (its -d output shows the SUBACK). The output is read by [`received`].
fn mosquitto_sub(port: u16, args: &[&str]) -> std::process::Child {
    // stdbuf: line-buffered, so the SUBACK trace is readable before any message arrives.
    let mut child = Command::new("stdbuf")
        .args(["-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", &port.to_string(), "-v", "-d"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub (apt-get install mosquitto-clients)");
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    for line in lines.by_ref() {
        if line.unwrap().contains("SUBACK") {
            break;
        }
    }
    SUBSCRIBERS.with(|s| s.borrow_mut().push(lines));
    child
}

thread_local! {
    static SUBSCRIBERS: std::cell::RefCell<Vec<std::io::Lines<std::io::BufReader<std::process::ChildStdout>>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The next `n` `topic payload` lines of the most recent subscriber (skipping -d debug lines).
fn received(n: usize) -> Vec<String> {
    SUBSCRIBERS.with(|s| {
        let mut subs = s.borrow_mut();
        let lines = subs.last_mut().unwrap();
        let mut out = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if line.starts_with("Client ") || line.starts_with("Subscribed") {
                continue; // -d protocol trace
            }
            out.push(line);
            if out.len() == n {
                break;
            }
        }
        out
    })
}

#[test]
fn anonymous_clients_are_refused_unless_allowed() {
    let server = Server::start();
    let (_, ack) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "app", None);
    assert_eq!(ack.code, reason::BAD_USER_NAME_OR_PASSWORD);
    let server = anonymous_server();
    let (_, ack) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "app", None);
    assert_eq!(ack.code, reason::SUCCESS);
    assert_eq!(ack.properties.retain_available, Some(1));
    assert_eq!(ack.properties.shared_subscription_available, Some(1));
}

#[test]
fn wildcard_subscribers_get_qos1_messages_from_mosquitto_clients() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    let mut sub = mosquitto_sub(port, &["-q", "1", "-t", "plant/+/temp", "-C", "3"]);
    mosquitto_pub(port, &["-q", "1", "-t", "plant/a/temp", "-m", "21"]);
    mosquitto_pub(port, &["-q", "0", "-t", "plant/b/temp", "-m", "22"]);
    mosquitto_pub(port, &["-q", "1", "-t", "plant/a/humidity", "-m", "not for us"]);
    mosquitto_pub(port, &["-q", "1", "-t", "plant/c/temp", "-m", "23"]);
    assert_eq!(received(3), ["plant/a/temp 21", "plant/b/temp 22", "plant/c/temp 23"]);
    assert!(sub.wait().unwrap().success());
}

#[test]
fn retained_messages_reach_later_subscribers_until_cleared() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    mosquitto_pub(port, &["-q", "1", "-r", "-t", "lamp/1", "-m", "on"]);
    let mut sub = mosquitto_sub(port, &["-t", "lamp/#", "-C", "1"]);
    assert_eq!(received(1), ["lamp/1 on"]);
    assert!(sub.wait().unwrap().success());
    // An empty retained payload clears it: a new subscriber gets nothing.
    mosquitto_pub(port, &["-q", "1", "-r", "-t", "lamp/1", "-n"]);
    let (mut c, _) = Raw::connect_as(port, ProtocolVersion::V5, "late", None);
    assert_eq!(c.subscribe(1, &["lamp/#"]).return_codes, [1]);
    c.stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    assert!(matches!(c.try_recv(), Err(_) | Ok(None)), "no retained message left");
}

#[test]
fn the_device_api_stays_closed_to_anonymous_clients() {
    let server = anonymous_server();
    let (mut c, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "nosy", None);
    c.publish("v1/devices/me/telemetry", b"{\"t\":1}", QoS::AtLeastOnce, Some(1));
    match c.recv() {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason, reason::NOT_AUTHORIZED),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    assert_eq!(c.subscribe(2, &["v1/devices/me/attributes", "ok/#"]).return_codes, [reason::NOT_AUTHORIZED, 1]);
    // Nor may clients forge the server's canonical telemetry topics.
    c.publish("gridlinks/devices/x/telemetry", b"[]", QoS::AtLeastOnce, Some(3));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == reason::NOT_AUTHORIZED));
    // MQTT 3.1.1 cannot refuse a PUBLISH: the connection is closed.
    let (mut c3, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V3_1_1, "nosy3", None);
    c3.publish("v1/devices/me/telemetry", b"{}", QoS::AtLeastOnce, Some(1));
    c3.expect_close();
}

#[test]
fn a_second_connection_with_the_same_client_id_takes_the_session_over() {
    let server = anonymous_server();
    let (mut first, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "same", None);
    first.subscribe(1, &["t"]);
    let (mut second, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "same", None);
    let (disconnect, _) = first.expect_close();
    assert_eq!(disconnect.map(|d| d.reason), Some(reason::SESSION_TAKEN_OVER), "MQTT 5 says why");
    // The new session starts clean: no subscription carried over.
    let (mut publisher, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "pub", None);
    publisher.publish("t", b"x", QoS::AtLeastOnce, Some(1));
    match publisher.recv() {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason, reason::NO_MATCHING_SUBSCRIBERS),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    assert_eq!(second.subscribe(1, &["t"]).return_codes, [1]);
}

#[test]
fn shared_subscribers_take_turns() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    let (mut w1, _) = Raw::connect_as(port, ProtocolVersion::V5, "w1", None);
    let (mut w2, _) = Raw::connect_as(port, ProtocolVersion::V5, "w2", None);
    assert_eq!(w1.subscribe(1, &["$share/workers/jobs/+"]).return_codes, [1]);
    assert_eq!(w2.subscribe(1, &["$share/workers/jobs/+"]).return_codes, [1]);
    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "boss", None);
    for i in 1..=4u16 {
        p.publish(&format!("jobs/{i}"), b"j", QoS::AtLeastOnce, Some(i));
        assert!(matches!(p.recv(), Some(Packet::PubAck(a)) if a.reason == reason::SUCCESS));
    }
    for w in [&mut w1, &mut w2] {
        for _ in 0..2 {
            assert!(matches!(w.recv(), Some(Packet::Publish(m)) if m.topic.starts_with("jobs/")));
        }
    }
}

#[test]
fn qos1_deliveries_respect_the_subscribers_receive_maximum() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    let (mut sub, ack) = Raw::connect_custom(port, ProtocolVersion::V5, |c| {
        c.client_id = "slow".into();
        c.properties.receive_maximum = Some(2);
    });
    assert_eq!(ack.code, reason::SUCCESS);
    assert_eq!(sub.subscribe(1, &["q/#"]).return_codes, [1]);
    let (mut publisher, _) = Raw::connect_as(port, ProtocolVersion::V5, "fast", None);
    for i in 1..=5u16 {
        publisher.publish(&format!("q/{i}"), b"m", QoS::AtLeastOnce, Some(i));
        assert!(matches!(publisher.recv(), Some(Packet::PubAck(a)) if a.reason == reason::SUCCESS));
    }
    let next = |c: &mut Raw| match c.recv() {
        Some(Packet::Publish(p)) => (p.topic, p.packet_id.unwrap()),
        other => panic!("expected PUBLISH, got {other:?}"),
    };
    let (t1, id1) = next(&mut sub);
    let (t2, id2) = next(&mut sub);
    assert_eq!((t1.as_str(), t2.as_str()), ("q/1", "q/2"));
    assert_ne!(id1, id2);
    // Two unacknowledged: nothing more until a PUBACK.
    sub.stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    assert!(matches!(sub.try_recv(), Err(_) | Ok(None)), "a third QoS 1 message before any PUBACK");
    sub.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sub.send(&Packet::PubAck(PubResp { packet_id: id1, reason: 0, reason_string: None, user_properties: Vec::new() }));
    let (t3, id3) = next(&mut sub);
    assert_eq!(t3, "q/3");
    assert_ne!(id3, id2, "an id still in flight is not reused");
}

#[test]
fn applications_log_in_with_credentials_managed_over_rest_and_stay_within_their_acl() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut server = Server::start_on(&dir, &[]);
    let port = server.mqtt_port;
    let jwt = server.login();
    let cred = json!({"username": "dash", "password": "pw1", "publish": ["apps/dash/#"], "subscribe": ["apps/#"]});
    let (status, body) = server.json("POST", "/api/mqtt/clients", &jwt, Some(cred));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["username"], "dash");
    assert!(body.get("passwordHash").is_none() && !body.to_string().contains("pw1"), "{body}");
    let (status, body) = server.json(
        "POST",
        "/api/mqtt/clients",
        &jwt,
        Some(json!({"username": "x", "password": "p", "publish": ["a/#/b"]})),
    );
    assert_eq!((status, body["errorCode"].as_i64()), (400, Some(31)), "{body}");
    assert_eq!(server.json("POST", "/api/mqtt/clients", "bad-jwt", Some(json!({}))).0, 401);

    // A real client: wrong password refused, right one publishes and subscribes in its ACL.
    let wrong = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-u", "dash", "-P", "nope", "-t", "apps/dash/x", "-m", "1"])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!wrong.success());
    let mut sub =
        mosquitto_sub(port, &["-u", "dash", "-P", "pw1", "-i", "dash-sub", "-q", "1", "-t", "apps/#", "-C", "1"]);
    mosquitto_pub(port, &["-u", "dash", "-P", "pw1", "-q", "1", "-t", "apps/dash/x", "-m", "hi"]);
    assert_eq!(received(1), ["apps/dash/x hi"]);
    assert!(sub.wait().unwrap().success());

    // Outside the ACL: MQTT 5 reason codes.
    let (mut c, ack) = Raw::login(port, ProtocolVersion::V5, "dash-raw", "dash", "pw1");
    assert_eq!(ack.code, reason::SUCCESS);
    c.publish("other/x", b"1", QoS::AtLeastOnce, Some(1));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == reason::NOT_AUTHORIZED));
    assert_eq!(
        c.subscribe(2, &["other/#", "apps/+/x", "#"]).return_codes,
        [reason::NOT_AUTHORIZED, 1, reason::NOT_AUTHORIZED]
    );
    // No anonymous access by default, and devices' tokens are not application logins.
    assert_eq!(Raw::connect_as(port, ProtocolVersion::V5, "anon", None).1.code, reason::BAD_USER_NAME_OR_PASSWORD);

    // Changing the credential closes its live connections; the new ACL applies on reconnect.
    let (status, _) = server.json(
        "POST",
        "/api/mqtt/clients",
        &jwt,
        Some(json!({"username": "dash", "publish": ["other/#"], "subscribe": []})),
    );
    assert_eq!(status, 200);
    c.expect_close();
    let (mut c, ack) = Raw::login(port, ProtocolVersion::V5, "dash-raw", "dash", "pw1");
    assert_eq!(ack.code, reason::SUCCESS, "the password was kept");
    c.publish("other/x", b"1", QoS::AtLeastOnce, Some(1));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == reason::NO_MATCHING_SUBSCRIBERS));

    // Credentials survive a restart; deleting one ends its sessions and its logins.
    server.sigterm();
    let server = Server::start_on(&dir, &[]);
    let jwt = server.login();
    let (status, list) = server.json("GET", "/api/mqtt/clients", &jwt, None);
    assert_eq!((status, list[0]["username"].as_str()), (200, Some("dash")), "{list}");
    assert_eq!(list[0]["publish"], json!(["other/#"]));
    let (mut c, ack) = Raw::login(server.mqtt_port, ProtocolVersion::V3_1_1, "dash-raw", "dash", "pw1");
    assert_eq!(ack.code, 0);
    assert_eq!(server.req("DELETE", "/api/mqtt/clients/dash", Some(&jwt), None).0, 200);
    c.expect_close();
    // A deleted user name with a password is refused like a wrong password (no enumeration).
    assert_eq!(
        Raw::login(server.mqtt_port, ProtocolVersion::V3_1_1, "dash-raw", "dash", "pw1").1.code,
        reason::V3_BAD_USERNAME_OR_PASSWORD
    );
    assert_eq!(server.json("GET", "/api/mqtt/clients/dash", &jwt, None).0, 404);
}

#[test]
fn the_anonymous_acl_is_configurable() {
    let server = Server::start_env(&[
        ("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"),
        ("GRIDLINKS_MQTT_ANONYMOUS_PUBLISH", "public/#"),
        ("GRIDLINKS_MQTT_ANONYMOUS_SUBSCRIBE", "public/#, gridlinks/devices/+/telemetry"),
    ]);
    let (mut c, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "anon", None);
    assert_eq!(
        c.subscribe(1, &["public/+", "private/#", "gridlinks/devices/+/telemetry"]).return_codes,
        [1, reason::NOT_AUTHORIZED, 1]
    );
    c.publish("private/x", b"1", QoS::AtLeastOnce, Some(1));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == reason::NOT_AUTHORIZED));
    // A will is a publish too: outside the ACL, the CONNECT is refused.
    let (_, ack) = Raw::connect_custom(server.mqtt_port, ProtocolVersion::V5, |c| c.will = Some(will("private/w")));
    assert_eq!(ack.code, reason::NOT_AUTHORIZED);
    c.publish("public/x", b"1", QoS::AtLeastOnce, Some(2));
    // Its own message comes back (it subscribed public/+), before or after the PUBACK.
    let two = [c.recv(), c.recv()];
    assert!(
        two.iter().any(|p| matches!(p, Some(Packet::PubAck(a)) if a.packet_id == 2 && a.reason == reason::SUCCESS)),
        "{two:?}"
    );
    assert!(two.iter().any(|p| matches!(p, Some(Packet::Publish(m)) if m.topic == "public/x")), "{two:?}");
}

#[test]
fn committed_device_telemetry_reaches_applications_on_canonical_topics() {
    let server = Server::start();
    let port = server.mqtt_port;
    let jwt = server.login();
    let cred = json!({"username": "app", "password": "pw", "subscribe": ["gridlinks/devices/+/telemetry"]});
    assert_eq!(server.json("POST", "/api/mqtt/clients", &jwt, Some(cred)).0, 200);
    let id = server.device(&jwt, "pump/1", "tok1");
    let (mut app, _) = Raw::login(port, ProtocolVersion::V5, "app", "app", "pw");
    assert_eq!(app.subscribe(1, &["gridlinks/devices/+/telemetry"]).return_codes, [1]);
    let next = |c: &mut Raw| match c.recv() {
        Some(Packet::Publish(p)) => (p.topic, serde_json::from_slice::<common::J>(&p.payload).unwrap()),
        other => panic!("expected PUBLISH, got {other:?}"),
    };

    // MQTT ingest: the device's PUBACK, and the application's copy with the stored points.
    let (mut dev, _) = Raw::connect(port, ProtocolVersion::V3_1_1, Some("tok1"), 60);
    dev.publish("v1/devices/me/telemetry", br#"{"ts":5000,"values":{"t":21.5,"on":true}}"#, QoS::AtLeastOnce, Some(1));
    assert!(matches!(dev.recv(), Some(Packet::PubAck(_))));
    let (topic, body) = next(&mut app);
    assert_eq!(topic, "gridlinks/devices/pump%2F1/telemetry", "'/' in a name is escaped");
    assert_eq!(body, json!([{"ts": 5000, "values": {"t": 21.5, "on": true}}]));
    assert!(server.stored_timestamps(&jwt, &id, "t").contains(&5000), "delivered after the commit");

    // HTTP ingest too, with the server's timestamp.
    assert_eq!(server.telemetry("tok1", r#"{"h":3}"#), 200);
    let (_, body) = next(&mut app);
    assert_eq!(body[0]["values"], json!({"h": 3}));
    assert!(body[0]["ts"].as_i64().unwrap() > 1_600_000_000_000);
}

fn will(topic: &str) -> LastWill {
    LastWill {
        topic: topic.into(),
        payload: bytes::Bytes::from_static(b"offline"),
        qos: QoS::AtLeastOnce,
        retain: true,
        properties: PublishProperties::default(),
        delay_interval: None,
    }
}

#[test]
fn wills_are_published_when_clients_vanish_but_not_after_a_normal_disconnect() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    let (mut watcher, _) = Raw::connect_as(port, ProtocolVersion::V5, "watcher", None);
    assert_eq!(watcher.subscribe(1, &["status/#"]).return_codes, [1]);
    let with_will = |id: &str, version, keep_alive| {
        Raw::connect_custom(port, version, |c| {
            c.client_id = id.into();
            c.keep_alive = keep_alive;
            c.will = Some(will(&format!("status/{id}")));
        })
        .0
    };
    let next = |c: &mut Raw| match c.recv() {
        Some(Packet::Publish(p)) => {
            c.send(&Packet::PubAck(PubResp {
                packet_id: p.packet_id.unwrap(),
                reason: 0,
                reason_string: None,
                user_properties: Vec::new(),
            }));
            format!("{} {}", p.topic, String::from_utf8_lossy(&p.payload))
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    };

    // A normal DISCONNECT discards the will.
    let mut polite = with_will("polite", ProtocolVersion::V3_1_1, 60);
    polite.disconnect();
    // A dropped socket publishes it.
    drop(with_will("dropped", ProtocolVersion::V3_1_1, 60));
    assert_eq!(next(&mut watcher), "status/dropped offline");
    // MQTT 5 DISCONNECT 0x04 asks for it.
    let mut asks = with_will("asks", ProtocolVersion::V5, 60);
    asks.send(&Packet::Disconnect(Disconnect {
        reason: reason::DISCONNECT_WITH_WILL_MESSAGE,
        session_expiry_interval: None,
        reason_string: None,
        server_reference: None,
    }));
    assert_eq!(next(&mut watcher), "status/asks offline");
    // A keep-alive timeout (1 s, so 1.5 s of silence) publishes it.
    let _silent = with_will("silent", ProtocolVersion::V3_1_1, 1);
    assert_eq!(next(&mut watcher), "status/silent offline");
    // Nothing from "polite"; the retained wills wait for later subscribers.
    let mut late = mosquitto_sub(port, &["-t", "status/#", "-C", "3"]);
    let mut got = received(3);
    got.sort();
    assert_eq!(got, ["status/asks offline", "status/dropped offline", "status/silent offline"]);
    assert!(late.wait().unwrap().success());
}
