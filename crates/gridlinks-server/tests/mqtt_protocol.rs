//! The MQTT transport's protocol behaviour, with a raw client on the project's codec:
//! authentication codes, reason codes for bad input, limits, keep-alive.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::io::Write;
use std::time::Duration;

use common::mqtt::*;
use common::*;

const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

fn server_with_device() -> (Server, String, String) {
    let s = Server::start_env(&[("GRIDLINKS_MQTT_CONNECT_TIMEOUT", "500"), ("GRIDLINKS_MQTT_MAX_PACKET_SIZE", "2048")]);
    let jwt = s.login();
    let id = s.device(&jwt, "mqtt-dev", "MQTT_TOKEN");
    (s, jwt, id)
}

#[test]
fn connack_codes_for_tokens() {
    let (s, _, _) = server_with_device();
    let p = s.mqtt_port;
    assert_eq!(Raw::connect(p, V3, Some("MQTT_TOKEN"), 60).1.code, 0);
    assert_eq!(Raw::connect(p, V3, None, 60).1.code, 0x04);
    assert_eq!(Raw::connect(p, V3, Some(""), 60).1.code, 0x04);
    assert_eq!(Raw::connect(p, V3, Some("WRONG"), 60).1.code, 0x05);
    let (_, ack) = Raw::connect(p, V5, Some("MQTT_TOKEN"), 60);
    assert_eq!(ack.code, 0);
    assert_eq!(ack.properties.receive_maximum, Some(64));
    assert_eq!(ack.properties.maximum_packet_size, Some(2048));
    assert_eq!(Raw::connect(p, V5, None, 60).1.code, 0x86);
    assert_eq!(Raw::connect(p, V5, Some("WRONG"), 60).1.code, 0x87);
    // MQTT 3.1 CONNECT is accepted too.
    assert_eq!(Raw::connect(p, ProtocolVersion::V3_1, Some("MQTT_TOKEN"), 60).1.code, 0);
    // A refused client is closed.
    let (mut c, _) = Raw::connect(p, V3, Some("WRONG"), 60);
    assert!(c.recv().is_none());
}

#[test]
fn qos1_puback_after_commit_and_qos2_flow() {
    let (s, jwt, id) = server_with_device();
    let (mut c, _) = Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 60);
    for i in 1..=20u16 {
        c.publish(
            "v1/devices/me/telemetry",
            format!(r#"{{"ts":{i},"values":{{"n":{i}}}}}"#).as_bytes(),
            QoS::AtLeastOnce,
            Some(i),
        );
    }
    // Acks come back in order.
    for i in 1..=20u16 {
        match c.recv() {
            Some(Packet::PubAck(a)) => assert_eq!(a.packet_id, i),
            other => panic!("{other:?}"),
        }
    }
    // Acknowledged means queryable.
    let (_, v) = s.json(
        "GET",
        &format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=n&startTs=0&endTs=100&limit=100"),
        &jwt,
        None,
    );
    assert_eq!(v["n"].as_array().unwrap().len(), 20);
    // QoS 2: PUBREC after commit, PUBCOMP after PUBREL; a redelivery is stored once.
    c.publish("v1/devices/me/telemetry", br#"{"ts":50,"values":{"q2":1}}"#, QoS::ExactlyOnce, Some(77));
    assert!(matches!(c.recv(), Some(Packet::PubRec(r)) if r.packet_id == 77));
    c.publish("v1/devices/me/telemetry", br#"{"ts":50,"values":{"q2":1}}"#, QoS::ExactlyOnce, Some(77));
    assert!(matches!(c.recv(), Some(Packet::PubRec(r)) if r.packet_id == 77));
    c.send(&Packet::PubRel(PubResp { packet_id: 77, reason: 0, reason_string: None, user_properties: vec![] }));
    assert!(matches!(c.recv(), Some(Packet::PubComp(r)) if r.packet_id == 77));
    let (_, v) = s.json(
        "GET",
        &format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=q2&startTs=0&endTs=100"),
        &jwt,
        None,
    );
    assert_eq!(v["q2"].as_array().unwrap().len(), 1);
    c.send(&Packet::PingReq);
    assert!(matches!(c.recv(), Some(Packet::PingResp)));
}

#[test]
fn bad_payload_and_unknown_topic_v5_keep_the_connection() {
    let (s, jwt, id) = server_with_device();
    let (mut c, _) = Raw::connect(s.mqtt_port, V5, Some("MQTT_TOKEN"), 60);
    c.publish("v1/devices/me/telemetry", b"{not json", QoS::AtLeastOnce, Some(1));
    match c.recv() {
        Some(Packet::PubAck(a)) => {
            assert_eq!((a.packet_id, a.reason), (1, 0x99));
            assert!(a.reason_string.unwrap().contains("invalid JSON"));
        }
        other => panic!("{other:?}"),
    }
    c.publish("v1/devices/me/nonsense", b"{}", QoS::AtLeastOnce, Some(2));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == 0x90));
    c.publish("v1/devices/me/telemetry", br#"{"ok":1}"#, QoS::AtLeastOnce, Some(3));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == 0 && a.packet_id == 3));
    let (_, keys) = s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/keys/timeseries"), &jwt, None);
    assert_eq!(keys, json!(["ok"]));
    let (_, m) = s.req("GET", "/metrics", None, None);
    assert!(m.contains("gridlinks_mqtt_bad_publishes_total 2"), "{m}");
}

#[test]
fn bad_payload_and_unknown_topic_v3_close_the_connection() {
    let (s, _, _) = server_with_device();
    let (mut c, _) = Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 60);
    c.publish("v1/devices/me/telemetry", b"[1,2,3]", QoS::AtLeastOnce, Some(1));
    let (d, _) = c.expect_close();
    assert!(d.is_none(), "MQTT 3.1.1 has no DISCONNECT from the server");
    let (mut c, _) = Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 60);
    c.publish("not/a/thingsboard/topic", b"{}", QoS::AtMostOnce, None);
    c.expect_close();
    // Other connections are unaffected.
    let (mut ok, _) = Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 60);
    ok.publish("v1/devices/me/telemetry", br#"{"a":1}"#, QoS::AtLeastOnce, Some(9));
    assert!(matches!(ok.recv(), Some(Packet::PubAck(a)) if a.packet_id == 9));
}

#[test]
fn oversize_and_malformed_packets_close_only_that_connection() {
    let (s, _, _) = server_with_device();
    let (mut bystander, _) = Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 60);
    let (mut c, _) = Raw::connect(s.mqtt_port, V5, Some("MQTT_TOKEN"), 60);
    // Announce a 100 MB PUBLISH: refused from the fixed header alone.
    c.send_raw(&[0x32, 0x80, 0x80, 0x80, 0x30]).unwrap();
    let (d, _) = c.expect_close();
    assert_eq!(d.map(|d| d.reason), Some(0x95));
    let (mut c, _) = Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 60);
    c.publish("v1/devices/me/telemetry", &vec![b'x'; 4000], QoS::AtLeastOnce, Some(1));
    c.expect_close();
    let (mut c, _) = Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 60);
    c.send_raw(&[0x30, 0x03, 0x00, 0x05, 0x61]).unwrap(); // topic length beyond the packet
    c.expect_close();
    bystander.send(&Packet::PingReq);
    assert!(matches!(bystander.recv(), Some(Packet::PingResp)));
}

#[test]
fn silent_clients_are_dropped() {
    let (s, _, _) = server_with_device();
    // TCP connect, no CONNECT: dropped after mqtt.connect_timeout (500 ms here).
    let mut raw = Raw::open(s.mqtt_port, V3);
    let (_, took) = raw.expect_close();
    // Closed, not timed out: expect_close gives up after its 10 s read timeout, and a busy
    // machine may take a while beyond the 500 ms.
    assert!(took < Duration::from_secs(9), "{took:?}");
    // CONNECT with keep-alive 1 s, then silence: dropped after 1.5 s.
    let (mut c, _) = Raw::connect(s.mqtt_port, V5, Some("MQTT_TOKEN"), 1);
    let (d, took) = c.expect_close();
    assert_eq!(d.map(|d| d.reason), Some(0x8D));
    assert!(took >= Duration::from_millis(1400) && took < Duration::from_secs(9), "{took:?}");
    // A client that pings stays: pings every 600 ms with keep-alive 2 s (3 s allowed) for
    // longer than that, each with 2.4 s to spare for a busy machine.
    let (mut c, _) = Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 2);
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(600));
        c.send(&Packet::PingReq);
        assert!(matches!(c.recv(), Some(Packet::PingResp)));
    }
    let _ = c.stream.flush();
}

#[test]
fn deleting_a_device_closes_its_connections() {
    let (s, jwt, id) = server_with_device();
    let (mut c, _) = Raw::connect(s.mqtt_port, V5, Some("MQTT_TOKEN"), 60);
    assert_eq!(s.req("DELETE", &format!("/api/device/{id}"), Some(&jwt), None).0, 200);
    let (d, _) = c.expect_close();
    assert_eq!(d.map(|d| d.reason), Some(0x87));
    assert_eq!(Raw::connect(s.mqtt_port, V3, Some("MQTT_TOKEN"), 60).1.code, 0x05);
}

#[test]
fn rate_limit_breaches_name_the_limit() {
    let s = Server::start_env(&[("GRIDLINKS_MQTT_RATE_LIMIT_MESSAGES", "5")]);
    let jwt = s.login();
    s.device(&jwt, "chatty", "CHATTY");
    let (mut c, _) = Raw::connect(s.mqtt_port, V5, Some("CHATTY"), 60);
    for pid in 1..=20u16 {
        c.publish("v1/devices/me/telemetry", br#"{"x":1}"#, QoS::AtLeastOnce, Some(pid));
    }
    let mut refused = 0;
    for _ in 1..=20 {
        match c.recv() {
            Some(Packet::PubAck(a)) if a.reason == 0 => {}
            Some(Packet::PubAck(a)) => {
                assert_eq!(a.reason, 0x97);
                assert!(a.reason_string.unwrap().contains("mqtt.rate_limit_messages = 5"));
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(refused >= 10, "only {refused} of 20 refused at 5/s");
    // MQTT 3.1.1 cannot refuse one message: the connection is closed.
    let (mut c, _) = Raw::connect(s.mqtt_port, V3, Some("CHATTY"), 60);
    for pid in 1..=20u16 {
        if c.try_send(&publish_packet("v1/devices/me/telemetry", br#"{"x":1}"#, QoS::AtLeastOnce, Some(pid))).is_err() {
            break;
        }
    }
    loop {
        match c.try_recv() {
            Ok(Some(Packet::PubAck(_))) => {}
            Ok(None) | Err(_) => break,
            Ok(Some(other)) => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_burst_beyond_the_in_flight_limit_is_fully_acknowledged() {
    // 3 in flight at most: a 3.1.1 client that sends 50 publishes in one write must still get
    // all 50 PUBACKs without sending anything else (buffered packets must not wait for bytes).
    let s = Server::start_env(&[("GRIDLINKS_MQTT_RECEIVE_MAXIMUM", "3")]);
    let jwt = s.login();
    s.device(&jwt, "bursty", "BURST");
    let (mut c, _) = Raw::connect(s.mqtt_port, V3, Some("BURST"), 60);
    let mut burst = bytes::BytesMut::new();
    for pid in 1..=50u16 {
        let p = publish_packet(
            "v1/devices/me/telemetry",
            format!(r#"{{"ts":{pid},"values":{{"b":1}}}}"#).as_bytes(),
            QoS::AtLeastOnce,
            Some(pid),
        );
        encode(&p, V3, &mut burst).unwrap();
    }
    c.send_raw(&burst).unwrap();
    for pid in 1..=50u16 {
        assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.packet_id == pid));
    }
}
