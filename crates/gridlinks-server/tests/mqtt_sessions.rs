//! Persistent sessions of pub/sub clients against the real binary: subscriptions and
//! queued QoS 1 copies survive disconnects, `kill -9` and restarts; unacknowledged copies
//! come again with DUP and their packet id; a publisher's unreleased QoS 2 messages are
//! not routed twice; session expiry; clean start; will delay.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::mqtt::*;
use common::Server;

const ENV: [(&str, &str); 1] = [("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true")];

/// Connects `id` with clean start off (MQTT 5: with `expiry`; 3.1.1: a persistent session).
fn resume(port: u16, version: ProtocolVersion, id: &str, expiry: u32) -> (Raw, ConnAck) {
    Raw::connect_custom(port, version, |c| {
        c.client_id = id.into();
        c.clean_start = false;
        if version == ProtocolVersion::V5 {
            c.properties.session_expiry_interval = Some(expiry);
        }
    })
}

fn next_publish(c: &mut Raw) -> Publish {
    match c.recv() {
        Some(Packet::Publish(p)) => p,
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

fn ack(c: &mut Raw, p: &Publish) {
    c.send(&Packet::PubAck(PubResp {
        packet_id: p.packet_id.unwrap(),
        reason: 0,
        reason_string: None,
        user_properties: Vec::new(),
    }));
}

/// Publishes `n` QoS 1 messages `{prefix}{i}` to `topic`, each acknowledged.
fn publish_acked(port: u16, topic: &str, prefix: &str, n: u16) {
    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "publisher", None);
    for i in 1..=n {
        p.publish(topic, format!("{prefix}{i}").as_bytes(), QoS::AtLeastOnce, Some(i));
        assert!(matches!(p.recv(), Some(Packet::PubAck(a)) if a.packet_id == i && a.reason < 0x80));
    }
    p.disconnect();
}

fn nothing_more(c: &mut Raw) {
    c.stream.set_read_timeout(Some(Duration::from_millis(400))).unwrap();
    assert!(matches!(c.try_recv(), Err(_) | Ok(None)), "unexpected packet");
    c.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
}

#[test]
fn a_persistent_session_keeps_its_subscriptions_and_queues_while_offline() {
    let server = Server::start_env(&ENV);
    let port = server.mqtt_port;
    let (mut sub, ack3) = resume(port, ProtocolVersion::V3_1_1, "keeper", 0);
    assert!(!ack3.session_present);
    assert_eq!(sub.subscribe(1, &["keep/#"]).return_codes, [1]);
    sub.disconnect();
    publish_acked(port, "keep/a", "m", 3);
    let (mut sub, ack3) = resume(port, ProtocolVersion::V3_1_1, "keeper", 0);
    assert!(ack3.session_present);
    let got: Vec<_> = (0..3).map(|_| next_publish(&mut sub)).collect();
    let payloads: Vec<_> = got.iter().map(|p| String::from_utf8_lossy(&p.payload).into_owned()).collect();
    assert_eq!(payloads, ["m1", "m2", "m3"], "in order, none lost");
    got.iter().for_each(|p| ack(&mut sub, p));
    // Still subscribed: live messages flow without a new SUBSCRIBE.
    publish_acked(port, "keep/b", "live", 1);
    assert_eq!(&next_publish(&mut sub).payload[..], b"live1");
    // A clean start discards the session.
    drop(sub);
    let (_, ack) = Raw::connect_custom(port, ProtocolVersion::V3_1_1, |c| c.client_id = "keeper".into());
    assert!(!ack.session_present);
}

#[test]
fn unacknowledged_copies_come_again_with_dup_and_their_packet_id() {
    let server = Server::start_env(&ENV);
    let port = server.mqtt_port;
    let (mut sub, _) = resume(port, ProtocolVersion::V5, "forgetful", 3600);
    sub.subscribe(1, &["dup/#"]);
    publish_acked(port, "dup/x", "d", 2);
    let first = next_publish(&mut sub);
    let second = next_publish(&mut sub);
    assert!(!first.dup);
    ack(&mut sub, &first);
    // The connection drops before the second PUBACK, once the server has read the first
    // (a PINGRESP answers a PINGREQ read after it: no guessed sleep).
    sub.send(&Packet::PingReq);
    assert!(matches!(sub.recv(), Some(Packet::PingResp)));
    drop(sub);
    let (mut sub, ack) = resume(port, ProtocolVersion::V5, "forgetful", 3600);
    assert!(ack.session_present);
    let again = next_publish(&mut sub);
    assert_eq!((again.dup, again.packet_id, &again.payload[..]), (true, second.packet_id, &b"d2"[..]));
    crate::ack(&mut sub, &again);
    nothing_more(&mut sub);
}

#[test]
fn queued_and_in_flight_copies_survive_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut server = Server::start_on(&dir, &ENV);
    let port = server.mqtt_port;
    // One subscriber offline, one online that receives without acknowledging.
    let (mut away, _) = resume(port, ProtocolVersion::V3_1_1, "away", 0);
    away.subscribe(1, &["crash/#"]);
    away.disconnect();
    let (mut busy, _) = resume(port, ProtocolVersion::V5, "busy", 3600);
    busy.subscribe(1, &["crash/#"]);
    publish_acked(port, "crash/t", "c", 50);
    for _ in 0..50 {
        next_publish(&mut busy);
    }
    // Every PUBLISH was acknowledged, so every copy is on disk.
    server.kill9();
    let mut server = Server::start_on(&dir, &ENV);
    let port = server.mqtt_port;
    for (id, version) in [("away", ProtocolVersion::V3_1_1), ("busy", ProtocolVersion::V5)] {
        let (mut c, ack) = resume(port, version, id, 3600);
        assert!(ack.session_present, "{id}: session restored");
        let mut got = BTreeSet::new();
        for _ in 0..50 {
            let p = next_publish(&mut c);
            crate::ack(&mut c, &p);
            got.insert(String::from_utf8_lossy(&p.payload).into_owned());
        }
        assert_eq!(got.len(), 50, "{id}: every acknowledged message, once");
        nothing_more(&mut c);
        c.disconnect();
    }
    // Copies delivered and acknowledged are not delivered again after another restart.
    server.sigterm();
    let server = Server::start_on(&dir, &ENV);
    for (id, version) in [("away", ProtocolVersion::V3_1_1), ("busy", ProtocolVersion::V5)] {
        let (mut c, ack) = resume(server.mqtt_port, version, id, 3600);
        assert!(ack.session_present);
        nothing_more(&mut c);
    }
}

#[test]
fn an_expired_session_is_gone() {
    let server = Server::start_env(&ENV);
    let port = server.mqtt_port;
    let (mut sub, _) = resume(port, ProtocolVersion::V5, "brief", 1);
    sub.subscribe(1, &["brief/#"]);
    sub.disconnect();
    std::thread::sleep(Duration::from_millis(1600));
    publish_acked(port, "brief/x", "late", 1);
    let (mut sub, ack) = resume(port, ProtocolVersion::V5, "brief", 1);
    assert!(!ack.session_present);
    nothing_more(&mut sub);
    // The server caps what it grants and says so.
    let (_, ack) = resume(port, ProtocolVersion::V5, "greedy", u32::MAX - 1);
    assert_eq!(ack.properties.session_expiry_interval, Some(604_800));
}

#[test]
fn a_will_delay_waits_and_a_resumed_session_cancels_it() {
    let server = Server::start_env(&ENV);
    let port = server.mqtt_port;
    let (mut watcher, _) = Raw::connect_as(port, ProtocolVersion::V5, "watcher", None);
    watcher.subscribe(1, &["wd/#"]);
    let with_will = |id: &str, delay: u32| {
        Raw::connect_custom(port, ProtocolVersion::V5, |c| {
            c.client_id = id.into();
            c.properties.session_expiry_interval = Some(60);
            c.will = Some(LastWill {
                topic: format!("wd/{id}"),
                payload: bytes::Bytes::from_static(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: PublishProperties::default(),
                delay_interval: Some(delay),
            });
        })
        .0
    };
    // "back" has a delay a busy machine cannot overrun before it returns; "lost" a short one.
    const BACK_DELAY: Duration = Duration::from_secs(5);
    let dropped = std::time::Instant::now();
    drop(with_will("back", BACK_DELAY.as_secs() as u32));
    drop(with_will("lost", 1));
    // "back" returns within its delay: its will is not published.
    std::thread::sleep(Duration::from_millis(300));
    let (_back, ack) = resume(port, ProtocolVersion::V5, "back", 60);
    assert!(ack.session_present);
    let p = next_publish(&mut watcher);
    assert_eq!(p.topic, "wd/lost");
    // Past "back"'s delay its will still has not come.
    std::thread::sleep((BACK_DELAY + Duration::from_millis(500)).saturating_sub(dropped.elapsed()));
    nothing_more(&mut watcher);
}

fn resp(packet_id: u16) -> PubResp {
    PubResp { packet_id, reason: 0, reason_string: None, user_properties: Vec::new() }
}

/// Sends QoS 2 PUBLISH `id` (DUP when `dup`) and expects its PUBREC.
fn publish_qos2(c: &mut Raw, topic: &str, payload: &[u8], id: u16, dup: bool) {
    c.send(&Packet::Publish(Publish {
        dup,
        qos: QoS::ExactlyOnce,
        retain: false,
        topic: topic.into(),
        packet_id: Some(id),
        payload: payload.to_vec().into(),
        properties: PublishProperties::default(),
    }));
    assert!(matches!(c.recv(), Some(Packet::PubRec(r)) if r.packet_id == id && r.reason < 0x80));
}

/// Sends PUBREL `id` and expects a PUBCOMP that knew it (reason 0).
fn release(c: &mut Raw, id: u16) {
    c.send(&Packet::PubRel(resp(id)));
    assert!(
        matches!(c.recv(), Some(Packet::PubComp(r)) if r.packet_id == id && r.reason == 0),
        "PUBREL {id} not known"
    );
}

/// The publisher's side of QoS 2 is session state too: a PUBLISH sent again after a
/// reconnect, or after a server crash, with the id of a message already received (PUBREC
/// sent, PUBREL not yet) is not delivered a second time.
#[test]
fn a_publishers_qos2_message_is_delivered_once_across_reconnects_and_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut server = Server::start_on(&dir, &ENV);
    let (mut watch, _) = resume(server.mqtt_port, ProtocolVersion::V5, "watch", 3600);
    watch.subscribe(1, &["once/#"]);
    let (mut p, _) = resume(server.mqtt_port, ProtocolVersion::V5, "sender", 3600);
    publish_qos2(&mut p, "once/a", b"a", 7, false);
    // The PUBREC is lost with the connection; the client sends the PUBLISH again.
    drop(p);
    std::thread::sleep(Duration::from_millis(200));
    let (mut p, ack) = resume(server.mqtt_port, ProtocolVersion::V5, "sender", 3600);
    assert!(ack.session_present);
    publish_qos2(&mut p, "once/a", b"a", 7, true);
    release(&mut p, 7);
    publish_qos2(&mut p, "once/b", b"b", 8, false);
    // The server crashes before the PUBREL of message 8.
    server.kill9();
    let server = Server::start_on(&dir, &ENV);
    let (mut p, ack) = resume(server.mqtt_port, ProtocolVersion::V5, "sender", 3600);
    assert!(ack.session_present);
    publish_qos2(&mut p, "once/b", b"b", 8, true);
    release(&mut p, 8);
    // Released: id 8 is free again and names a new message.
    publish_qos2(&mut p, "once/c", b"c", 8, false);
    release(&mut p, 8);
    let (mut watch2, _) = resume(server.mqtt_port, ProtocolVersion::V5, "watch", 3600);
    drop(watch);
    let mut got = Vec::new();
    for _ in 0..3 {
        let m = next_publish(&mut watch2);
        crate::ack(&mut watch2, &m);
        got.push(String::from_utf8_lossy(&m.payload).into_owned());
    }
    got.sort();
    assert_eq!(got, ["a", "b", "c"]);
    nothing_more(&mut watch2);
}

/// Towards a QoS 2 subscriber the server's side of the exchange survives a crash: a
/// message the client received (PUBREC sent) gets only its PUBREL again, with its packet
/// id; one sent but not acknowledged comes again with the packet id it had, so the client
/// recognises it. Neither is delivered twice; none is lost.
#[test]
fn a_qos2_subscribers_exchanges_survive_kill_9_with_their_packet_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut server = Server::start_on(&dir, &ENV);
    let (mut sub, _) = resume(server.mqtt_port, ProtocolVersion::V5, "twice-shy", 3600);
    assert_eq!(sub.subscribe_qos(1, &["q2/#"], QoS::ExactlyOnce).return_codes, [2]);
    let (mut p, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "q2-publisher", None);
    for (i, payload) in [b"m1", b"m2", b"m3"].iter().enumerate() {
        let id = u16::try_from(i).unwrap() + 1;
        publish_qos2(&mut p, "q2/t", &payload[..], id, false);
        release(&mut p, id);
    }
    let m: Vec<Publish> = (0..3).map(|_| next_publish(&mut sub)).collect();
    assert!(m.iter().all(|p| p.qos == QoS::ExactlyOnce));
    let id = |i: usize| m[i].packet_id.unwrap();
    // m1 completes; m2 is received (PUBREC) and released by the server; m3 is not
    // acknowledged at all.
    for i in 0..2 {
        sub.send(&Packet::PubRec(resp(id(i))));
        assert!(matches!(sub.recv(), Some(Packet::PubRel(r)) if r.packet_id == id(i)));
    }
    sub.send(&Packet::PubComp(resp(id(0))));
    std::thread::sleep(Duration::from_millis(300));
    server.kill9();
    let server = Server::start_on(&dir, &ENV);
    let (mut sub, ack) = resume(server.mqtt_port, ProtocolVersion::V5, "twice-shy", 3600);
    assert!(ack.session_present);
    let mut owed = sub.recv();
    if matches!(&owed, Some(Packet::PubRel(r)) if r.packet_id == id(0)) {
        // m1's PUBCOMP reached the server, its row's deletion not the disk before the
        // crash: a PUBREL the client answers again (allowed; the message is not resent).
        sub.send(&Packet::PubComp(resp(id(0))));
        owed = sub.recv();
    }
    assert!(
        matches!(&owed, Some(Packet::PubRel(r)) if r.packet_id == id(1)),
        "m2 is owed its PUBREL, not the message: {owed:?}"
    );
    sub.send(&Packet::PubComp(resp(id(1))));
    let again = next_publish(&mut sub);
    assert_eq!((again.packet_id, &again.payload[..]), (Some(id(2)), &b"m3"[..]), "m3 again, with its packet id");
    sub.send(&Packet::PubRec(resp(id(2))));
    assert!(matches!(sub.recv(), Some(Packet::PubRel(r)) if r.packet_id == id(2)));
    sub.send(&Packet::PubComp(resp(id(2))));
    nothing_more(&mut sub);
}

/// A persistent session's queue longer than the packet id space (TBMQ once skipped stored
/// messages at the wrap): all 70,000 come, in order, ids wrapping from 65,535 to 1, none
/// skipped.
#[test]
fn a_queue_longer_than_the_packet_id_space_is_delivered_whole_and_in_order() {
    const N: u32 = 70_000;
    let server = Server::start_env(&[
        ("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"),
        ("GRIDLINKS_MQTT_CLIENT_OUTBOUND_QUEUE", "70000"),
        // Windows of 500 are past the Receive Maximum: backpressure, not 0x93.
        ("GRIDLINKS_MQTT_RECEIVE_MAXIMUM_LENIENT", "true"),
    ]);
    let port = server.mqtt_port;
    let (mut sub, _) = resume(port, ProtocolVersion::V5, "long", 3600);
    sub.subscribe(1, &["long/#"]);
    sub.disconnect();
    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "long-publisher", None);
    // Pipelined in windows of 500.
    for chunk in (1..=N).collect::<Vec<_>>().chunks(500) {
        for &i in chunk {
            p.publish(
                "long/t",
                i.to_string().as_bytes(),
                QoS::AtLeastOnce,
                Some(u16::try_from(i % 60_000 + 1).unwrap()),
            );
        }
        for _ in chunk {
            assert!(matches!(p.recv(), Some(Packet::PubAck(a)) if a.reason < 0x80));
        }
    }
    let (mut sub, connack) = resume(port, ProtocolVersion::V5, "long", 3600);
    assert!(connack.session_present);
    let mut ids = Vec::new();
    for i in 1..=N {
        let m = next_publish(&mut sub);
        assert_eq!(std::str::from_utf8(&m.payload).unwrap(), i.to_string(), "message {i} in order, none skipped");
        ids.push(m.packet_id.unwrap());
        ack(&mut sub, &m);
    }
    // Consecutive ids, wrapping from 65,535 to 1 once on the way.
    assert!(ids.windows(2).all(|w| w[1] == w[0] % 65_535 + 1), "consecutive packet ids");
    assert_eq!(ids.windows(2).filter(|w| w[1] < w[0]).count(), 1);
    nothing_more(&mut sub);
}

/// A connection resuming a persistent session that is still connected takes it over: the
/// old connection is told why and closed, and what it sent without acknowledgement comes
/// again on the new one (DUP, same ids), before live messages.
#[test]
fn resuming_a_connected_persistent_session_takes_it_over_with_its_unacknowledged_copies() {
    let server = Server::start_env(&ENV);
    let port = server.mqtt_port;
    let (mut first, _) = resume(port, ProtocolVersion::V5, "twin", 3600);
    first.subscribe(1, &["twin/#"]);
    publish_acked(port, "twin/a", "t", 2);
    let sent: Vec<Publish> = (0..2).map(|_| next_publish(&mut first)).collect();
    let (mut second, connack) = resume(port, ProtocolVersion::V5, "twin", 3600);
    assert!(connack.session_present);
    let (disconnect, _) = first.expect_close();
    assert_eq!(disconnect.map(|d| d.reason), Some(reason::SESSION_TAKEN_OVER));
    for old in &sent {
        let again = next_publish(&mut second);
        assert_eq!((again.dup, again.packet_id, &again.payload), (true, old.packet_id, &old.payload));
        ack(&mut second, &again);
    }
    publish_acked(port, "twin/b", "live", 1);
    assert_eq!(&next_publish(&mut second).payload[..], b"live1");
}
