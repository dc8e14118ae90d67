//! Packets a client sends back to back, in one write, as MQTT allows: with the CONNECT
//! (before the CONNACK came back) and before a DISCONNECT or a close. Every one of them is
//! processed, in order, over TCP and over WebSocket. The clients here pipeline far past
//! their MQTT 5 Receive Maximum, so the servers run with `mqtt.receive_maximum_lenient`
//! (backpressure); the strict default is `mqtt5_broker.rs`'s.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::time::Duration;

use common::mqtt::*;
use common::*;

const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

fn pipelining_server() -> Server {
    Server::start_env(&[("GRIDLINKS_MQTT_RECEIVE_MAXIMUM_LENIENT", "true")])
}

fn connect(version: ProtocolVersion, token: &str) -> Packet {
    connect_packet(version, Some(token), 60)
}

fn point(ts: usize) -> Vec<u8> {
    format!(r#"{{"ts":{ts},"values":{{"n":{ts}}}}}"#).into_bytes()
}

/// `n` telemetry publishes at `qos` (ts 1..=n).
fn publishes(n: usize, qos: QoS) -> Vec<Packet> {
    (1..=n)
        .map(|i| {
            publish_packet("v1/devices/me/telemetry", &point(i), qos, (qos != QoS::AtMostOnce).then_some(i as u16))
        })
        .collect()
}

/// Polls until `n` points of `n` are stored (or [`PATIENCE`] passes); the stored count.
fn wait_stored(s: &Server, jwt: &str, id: &str, n: usize) -> usize {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let stored = s.stored_timestamps(jwt, id, "n").len();
        if stored >= n || std::time::Instant::now() > deadline {
            return stored;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_publish_in_the_same_write_as_connect_is_acknowledged_without_more_bytes() {
    let s = pipelining_server();
    let jwt = s.login();
    let id = s.device(&jwt, "pipe", "PIPE_TOKEN");
    for version in [V3, V5] {
        let mut c = Raw::open(s.mqtt_port, version);
        let pid = if version == V3 { 1 } else { 2 };
        let publish = publish_packet("v1/devices/me/telemetry", &point(pid), QoS::AtLeastOnce, Some(pid as u16));
        c.send_raw(&bytes_of(version, &[connect(version, "PIPE_TOKEN"), publish])).unwrap();
        assert!(matches!(c.recv(), Some(Packet::ConnAck(a)) if a.code == 0));
        match c.recv() {
            Some(Packet::PubAck(a)) => assert_eq!((a.packet_id, a.reason), (pid as u16, 0)),
            other => panic!("{version:?}: expected PUBACK, got {other:?}"),
        }
    }
    assert_eq!(s.stored_timestamps(&jwt, &id, "n").len(), 2);
}

#[test]
fn connect_publish_disconnect_in_one_write_stores_and_closes() {
    let s = pipelining_server();
    let jwt = s.login();
    let id = s.device(&jwt, "pipe", "PIPE_TOKEN");
    let mut c = Raw::open(s.mqtt_port, V3);
    let publish = publish_packet("v1/devices/me/telemetry", &point(7), QoS::AtMostOnce, None);
    c.send_raw(&bytes_of(V3, &[connect(V3, "PIPE_TOKEN"), publish, disconnect_packet()])).unwrap();
    assert!(matches!(c.recv(), Some(Packet::ConnAck(a)) if a.code == 0));
    // The server closes the socket itself after the DISCONNECT (the read would time out otherwise).
    assert!(c.recv().is_none(), "the server closes after DISCONNECT");
    assert_eq!(wait_stored(&s, &jwt, &id, 1), 1);
}

#[test]
fn an_application_gets_its_suback_when_subscribe_follows_connect_at_once() {
    let s = Server::start_env(&[("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true")]);
    for i in 0..20 {
        let version = if i % 2 == 0 { V3 } else { V5 };
        let mut c = Raw::open(s.mqtt_port, version);
        let mut conn = connect_packet(version, None, 60);
        if let Packet::Connect(c) = &mut conn {
            c.client_id = format!("app-{i}");
        }
        let sub = Packet::Subscribe(Subscribe {
            packet_id: 9,
            filters: vec![SubscriptionRequest {
                filter: "a/b".into(),
                qos: QoS::AtLeastOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
            }],
            subscription_identifier: None,
            user_properties: Vec::new(),
        });
        c.send_raw(&bytes_of(version, &[conn, sub])).unwrap();
        assert!(matches!(c.recv(), Some(Packet::ConnAck(a)) if a.code == 0));
        match c.recv() {
            Some(Packet::SubAck(a)) => assert_eq!((a.packet_id, a.return_codes), (9, vec![1])),
            other => panic!("try {i}: expected SUBACK, got {other:?}"),
        }
    }
}

/// Every QoS: 2,000 publishes then DISCONNECT in one write are all stored; so are 2,000
/// followed by a plain close of the socket.
#[test]
fn every_publish_before_a_disconnect_or_close_is_stored() {
    let s = pipelining_server();
    let jwt = s.login();
    let n = 2000;
    for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce].into_iter().enumerate() {
        for close in [false, true] {
            let token = format!("TOK_{i}_{close}");
            let id = s.device(&jwt, &format!("dev-{i}-{close}"), &token);
            let mut c = Raw::connect(s.mqtt_port, V5, Some(&token), 60).0;
            let mut packets = publishes(n, qos);
            if !close {
                packets.push(disconnect_packet());
            }
            c.send_raw(&bytes_of(V5, &packets)).unwrap();
            if close {
                c.stream.shutdown(std::net::Shutdown::Write).unwrap();
            }
            let stored = wait_stored(&s, &jwt, &id, n);
            assert_eq!(stored, n, "{qos:?}, {}: {stored} of {n} stored", if close { "close" } else { "DISCONNECT" });
        }
    }
}

#[test]
fn over_websocket_too() {
    let s = pipelining_server();
    let jwt = s.login();
    let id = s.device(&jwt, "ws-pipe", "WS_TOKEN");
    let n = 500;
    // CONNECT, a QoS 1 publish, many QoS 0 ones and DISCONNECT in one WebSocket message.
    let mut c = WsRaw::open(s.ws_port, V5);
    let mut packets = vec![
        connect(V5, "WS_TOKEN"),
        publish_packet("v1/devices/me/telemetry", &point(n + 1), QoS::AtLeastOnce, Some(1)),
    ];
    packets.extend(publishes(n, QoS::AtMostOnce));
    packets.push(disconnect_packet());
    c.send_raw(&bytes_of(V5, &packets));
    assert!(matches!(c.recv(), Some(Packet::ConnAck(a)) if a.code == 0));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.packet_id == 1 && a.reason == 0));
    assert_eq!(wait_stored(&s, &jwt, &id, n + 1), n + 1);
}

/// Device publishes that arrive in one read are committed as one batch. A malformed one in
/// the middle is refused alone (MQTT 5: its PUBACK says why), a publish on another topic
/// keeps its place between them, and every acknowledgement comes back in order.
#[test]
fn a_batch_of_publishes_is_acknowledged_in_order_each_with_its_own_outcome() {
    let s = pipelining_server();
    let jwt = s.login();
    let id = s.device(&jwt, "batch", "BATCH_TOKEN");
    let mut packets = vec![connect(V5, "BATCH_TOKEN")];
    for i in 1..=300u16 {
        let packet = match i {
            100 => publish_packet("v1/devices/me/telemetry", b"{not json", QoS::AtLeastOnce, Some(i)),
            150 => publish_packet("v1/devices/me/attributes", br#"{"fw":"1.2"}"#, QoS::AtLeastOnce, Some(i)),
            200 => publish_packet("v1/devices/me/nonsense", b"{}", QoS::AtLeastOnce, Some(i)),
            _ => publish_packet("v1/devices/me/telemetry", &point(usize::from(i)), QoS::AtLeastOnce, Some(i)),
        };
        packets.push(packet);
    }
    let mut c = Raw::open(s.mqtt_port, V5);
    c.send_raw(&bytes_of(V5, &packets)).unwrap();
    assert!(matches!(c.recv(), Some(Packet::ConnAck(a)) if a.code == 0));
    for i in 1..=300u16 {
        let expected = match i {
            100 => reason::PAYLOAD_FORMAT_INVALID,
            200 => reason::TOPIC_NAME_INVALID,
            _ => 0,
        };
        match c.recv() {
            Some(Packet::PubAck(a)) => assert_eq!((a.packet_id, a.reason), (i, expected), "PUBACK {i}"),
            other => panic!("expected PUBACK {i}, got {other:?}"),
        }
    }
    assert_eq!(wait_stored(&s, &jwt, &id, 297), 297, "every well-formed telemetry publish is stored");
    let (status, attrs) = s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes"), &jwt, None);
    assert_eq!(status, 200);
    assert!(attrs.to_string().contains("\"fw\""), "{attrs}");
}
