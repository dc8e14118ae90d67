//! MQTT 5 features of the broker for pub/sub clients, against the real binary with the raw
//! test client: properties passed through, subscription identifiers, topic aliases,
//! message expiry, retained messages (with their properties) surviving `kill -9`, QoS 2
//! towards subscribers, and the client's Maximum Packet Size.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::mqtt::*;
use common::Server;

fn anonymous_server() -> Server {
    Server::start_env(&[("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true")])
}

fn publish(topic: &str, payload: &[u8], packet_id: u16, retain: bool, properties: PublishProperties) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain,
        topic: topic.into(),
        packet_id: Some(packet_id),
        payload: Bytes::copy_from_slice(payload),
        properties,
    })
}

fn next_publish(c: &mut Raw) -> Publish {
    loop {
        match c.recv() {
            Some(Packet::Publish(p)) => return p,
            Some(Packet::PubAck(_)) => continue,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
}

fn subscribe_with_id(c: &mut Raw, packet_id: u16, filter: &str, id: u32) -> SubAck {
    c.send(&Packet::Subscribe(Subscribe {
        packet_id,
        filters: vec![SubscriptionRequest {
            filter: filter.into(),
            qos: QoS::AtLeastOnce,
            no_local: false,
            retain_as_published: false,
            retain_handling: 0,
        }],
        subscription_identifier: Some(id),
        user_properties: Vec::new(),
    }));
    match c.recv() {
        Some(Packet::SubAck(a)) => a,
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

fn ack(c: &mut Raw, p: &Publish) {
    c.ack(p.packet_id.unwrap());
}

fn rich_properties() -> PublishProperties {
    PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(3600),
        response_topic: Some("replies/1".into()),
        correlation_data: Some(Bytes::from_static(b"\x01\x02")),
        user_properties: vec![("site".into(), "north".into()), ("site".into(), "south".into())],
        content_type: Some("application/json".into()),
        ..Default::default()
    }
}

#[test]
fn properties_pass_through_with_subscription_identifiers() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    let (mut v5, ack5) = Raw::connect_as(port, ProtocolVersion::V5, "sub5", None);
    assert_eq!(ack5.properties.subscription_identifiers_available, Some(1));
    assert_eq!(subscribe_with_id(&mut v5, 1, "plant/#", 42).return_codes, [1]);
    let (mut v3, _) = Raw::connect_as(port, ProtocolVersion::V3_1_1, "sub3", None);
    assert_eq!(v3.subscribe(1, &["plant/#"]).return_codes, [1]);

    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "pub", None);
    p.send(&publish("plant/a", b"{\"t\":1}", 1, false, rich_properties()));
    assert!(matches!(p.recv(), Some(Packet::PubAck(a)) if a.reason == 0));

    let got = next_publish(&mut v5);
    let mut want = rich_properties();
    want.subscription_identifiers = vec![42];
    let expiry = got.properties.message_expiry_interval.unwrap();
    assert!((3599..=3600).contains(&expiry), "remaining expiry {expiry}");
    want.message_expiry_interval = Some(expiry);
    assert_eq!(got.properties, want);
    assert_eq!(&got.payload[..], b"{\"t\":1}");
    // MQTT 3.1.1 has no properties: the payload alone.
    let got3 = next_publish(&mut v3);
    assert_eq!((got3.topic.as_str(), &got3.payload[..]), ("plant/a", &b"{\"t\":1}"[..]));
}

#[test]
fn topic_aliases_from_the_client_are_resolved() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    let (mut sub, _) = Raw::connect_as(port, ProtocolVersion::V5, "sub", None);
    sub.subscribe(1, &["alias/#"]);
    let (mut p, ack) = Raw::connect_as(port, ProtocolVersion::V5, "pub", None);
    let max = ack.properties.topic_alias_maximum.unwrap();
    assert!(max >= 1);
    let aliased = |topic: &str, alias: u16, id: u16| {
        publish(topic, b"x", id, false, PublishProperties { topic_alias: Some(alias), ..Default::default() })
    };
    p.send(&aliased("alias/long/topic/name", 1, 1));
    p.send(&aliased("", 1, 2));
    for _ in 0..2 {
        let got = next_publish(&mut sub);
        assert_eq!(got.topic, "alias/long/topic/name");
        assert_eq!(got.properties.topic_alias, None, "the alias is the publisher's, not passed on");
    }
    // An alias never set, or beyond the maximum, is a protocol error.
    p.send(&aliased("", 2, 3));
    let codes: Vec<_> = std::iter::from_fn(|| p.recv())
        .filter_map(|p| if let Packet::Disconnect(d) = p { Some(d.reason) } else { None })
        .collect();
    assert_eq!(codes, [reason::PROTOCOL_ERROR]);
    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "pub2", None);
    p.send(&aliased("alias/x", max + 1, 1));
    assert_eq!(p.expect_close().0.map(|d| d.reason), Some(reason::TOPIC_ALIAS_INVALID));
}

/// Our topic aliases towards a client that takes them (Topic Alias Maximum in its CONNECT):
/// a topic goes once with its alias, then the alias alone; once all are taken the oldest is
/// given to the next topic, which goes with it. Resolved here as a client would, every
/// message arrives on its own topic; the bytes on the wire are counted against a client
/// that takes none.
#[test]
fn topic_aliases_towards_the_client_save_the_topic_after_its_first_use() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    let subscriber = |id: &str, max: Option<u16>| {
        let (mut c, _) = Raw::connect_custom(port, ProtocolVersion::V5, |c| {
            c.client_id = id.into();
            c.properties.topic_alias_maximum = max;
        });
        c.subscribe(1, &["plant/#"]);
        c
    };
    let (mut with, mut without) = (subscriber("with-aliases", Some(2)), subscriber("no-aliases", None));
    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "pub", None);
    let a = "plant/north-hall/line-04/press-17/telemetry";
    let (b, c) = ("plant/b", "plant/c");
    let topics = [a, a, a, b, c, a, c];
    for (i, t) in topics.iter().enumerate() {
        p.send(&publish(t, b"{\"v\":1}", i as u16 + 1, false, PublishProperties::default()));
    }
    // The client's side: alias -> topic.
    let mut known: std::collections::HashMap<u16, String> = Default::default();
    let mut wire = Vec::new();
    for want in topics {
        let got = next_publish(&mut with);
        let alias = got.properties.topic_alias.expect("every copy carries an alias");
        if !got.topic.is_empty() {
            known.insert(alias, got.topic.clone());
        }
        assert_eq!(known.get(&alias).map(String::as_str), Some(want), "alias {alias}");
        wire.push((got.topic.clone(), alias));
        ack(&mut with, &got);
    }
    let named: Vec<bool> = wire.iter().map(|(t, _)| !t.is_empty()).collect();
    assert_eq!(named, [true, false, false, true, true, true, false], "{wire:?}");
    assert_eq!(wire.iter().map(|(_, a)| *a).collect::<Vec<_>>(), [1, 1, 1, 2, 1, 2, 1]);

    // Bandwidth: 100 copies of one long topic, with and without aliases.
    let mut sizes = [0usize; 2];
    for i in 0..100u16 {
        p.send(&publish(a, b"{\"v\":1}", 100 + i, false, PublishProperties::default()));
        for (n, c) in [&mut with, &mut without].into_iter().enumerate() {
            let got = next_publish(c);
            ack(c, &got);
            sizes[n] += bytes_of(ProtocolVersion::V5, &[Packet::Publish(got)]).len();
        }
    }
    eprintln!("100 copies on a {}-byte topic: {} bytes with aliases, {} without", a.len(), sizes[0], sizes[1]);
    // Each aliased copy saves the topic but for the 3 bytes of its alias property.
    assert!(sizes[0] * 3 < sizes[1], "{sizes:?}");
}

/// A client that sends more QoS 1 publishes than the Receive Maximum it was told, all in
/// one write (so none is answered before the last is read): DISCONNECT 0x93. In lenient
/// mode it is slowed down instead and every publish is acknowledged.
#[test]
fn exceeding_the_receive_maximum_is_0x93_unless_lenient() {
    for lenient in [false, true] {
        let server = Server::start_env(&[
            ("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"),
            ("GRIDLINKS_MQTT_RECEIVE_MAXIMUM", "2"),
            ("GRIDLINKS_MQTT_RECEIVE_MAXIMUM_LENIENT", if lenient { "true" } else { "false" }),
        ]);
        let (mut c, ack) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "eager", None);
        assert_eq!(ack.properties.receive_maximum, Some(2));
        let three: Vec<Packet> =
            (1..=3).map(|i| publish("eager/x", b"1", i, false, PublishProperties::default())).collect();
        c.send_raw(&bytes_of(ProtocolVersion::V5, &three)).unwrap();
        let mut acked = Vec::new();
        let mut disconnect = None;
        while let Some(p) = c.recv() {
            match p {
                Packet::PubAck(a) => acked.push(a.packet_id),
                Packet::Disconnect(d) => disconnect = Some(d.reason),
                other => panic!("{other:?}"),
            }
            if lenient && acked.len() == 3 {
                break;
            }
        }
        if lenient {
            assert_eq!((acked, disconnect), (vec![1, 2, 3], None));
        } else {
            // The two within the window are answered (they were read first), then the end.
            assert_eq!((acked, disconnect), (vec![1, 2], Some(reason::RECEIVE_MAXIMUM_EXCEEDED)));
        }
    }
}

#[test]
fn expired_messages_are_not_delivered() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    // A subscriber that takes one QoS 1 message at a time and does not acknowledge yet.
    let (mut sub, _) = Raw::connect_custom(port, ProtocolVersion::V5, |c| {
        c.client_id = "slow".into();
        c.properties.receive_maximum = Some(1);
    });
    sub.subscribe(1, &["exp/#"]);
    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "pub", None);
    let expiring = |secs| PublishProperties { message_expiry_interval: Some(secs), ..Default::default() };
    p.send(&publish("exp/1", b"first", 1, false, PublishProperties::default()));
    p.send(&publish("exp/2", b"short-lived", 2, false, expiring(1)));
    p.send(&publish("exp/3", b"long-lived", 3, false, expiring(600)));
    let first = next_publish(&mut sub);
    assert_eq!(first.topic, "exp/1");
    std::thread::sleep(Duration::from_millis(1500));
    ack(&mut sub, &first);
    // exp/2 expired while it waited in the queue: exp/3 comes next, with its time left.
    let next = next_publish(&mut sub);
    assert_eq!(next.topic, "exp/3");
    // Its time left is less the wait (1.5 s, more on a busy machine).
    assert!(next.properties.message_expiry_interval.is_some_and(|s| (540..=600).contains(&s)), "{next:?}");
}

#[test]
fn retained_messages_with_their_properties_survive_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let env = [("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true")];
    let mut server = Server::start_on(&dir, &env);
    let (mut p, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "pub", None);
    p.send(&publish("lamp/1", b"on", 1, true, rich_properties()));
    p.send(&publish(
        "lamp/2",
        b"short",
        2,
        true,
        PublishProperties { message_expiry_interval: Some(1), ..Default::default() },
    ));
    p.send(&publish("lamp/3", b"gone", 3, true, PublishProperties::default()));
    p.send(&publish("lamp/3", b"", 4, true, PublishProperties::default()));
    for _ in 0..4 {
        assert!(matches!(p.recv(), Some(Packet::PubAck(a)) if a.reason < 0x80));
    }
    // Acknowledged, so on disk: a crash right now loses none of it.
    server.kill9();
    std::thread::sleep(Duration::from_millis(1100));
    let server = Server::start_on(&dir, &env);
    let (mut sub, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "sub", None);
    assert_eq!(sub.subscribe(1, &["lamp/#"]).return_codes, [1]);
    let got = next_publish(&mut sub);
    assert_eq!((got.topic.as_str(), &got.payload[..], got.retain), ("lamp/1", &b"on"[..], true));
    assert_eq!(got.properties.user_properties, rich_properties().user_properties);
    assert_eq!(got.properties.content_type.as_deref(), Some("application/json"));
    assert!(got.properties.message_expiry_interval.is_some_and(|s| s < 3600 && s > 3500));
    // lamp/2 expired meanwhile and lamp/3 was cleared: nothing else.
    sub.stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    assert!(matches!(sub.try_recv(), Err(_) | Ok(None)), "only lamp/1 is retained");
}

fn resp(packet_id: u16) -> PubResp {
    PubResp { packet_id, reason: 0, reason_string: None, user_properties: Vec::new() }
}

#[test]
fn qos2_towards_subscribers_is_exactly_once_and_holds_the_window_until_pubcomp() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    let (mut sub, _) = Raw::connect_custom(port, ProtocolVersion::V5, |c| {
        c.client_id = "q2".into();
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(600);
        c.properties.receive_maximum = Some(1);
    });
    sub.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscriptionRequest {
            filter: "q2/#".into(),
            qos: QoS::ExactlyOnce,
            no_local: false,
            retain_as_published: false,
            retain_handling: 0,
        }],
        subscription_identifier: None,
        user_properties: Vec::new(),
    }));
    assert!(matches!(sub.recv(), Some(Packet::SubAck(a)) if a.return_codes == [2]));
    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "pub", None);
    for i in 1..=2u16 {
        p.publish(&format!("q2/{i}"), b"x", QoS::ExactlyOnce, Some(i));
        assert!(matches!(p.recv(), Some(Packet::PubRec(r)) if r.packet_id == i));
        p.send(&Packet::PubRel(resp(i)));
        assert!(matches!(p.recv(), Some(Packet::PubComp(c)) if c.packet_id == i));
    }
    let first = next_publish(&mut sub);
    assert_eq!((first.topic.as_str(), first.qos), ("q2/1", QoS::ExactlyOnce));
    let id = first.packet_id.unwrap();
    sub.send(&Packet::PubRec(resp(id)));
    assert!(matches!(sub.recv(), Some(Packet::PubRel(r)) if r.packet_id == id && r.reason == 0));
    // Receive Maximum 1: the second message waits for the PUBCOMP, not the PUBREC.
    sub.stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    assert!(matches!(sub.try_recv(), Err(_) | Ok(None)), "a second QoS 2 message before PUBCOMP");
    sub.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sub.send(&Packet::PubComp(resp(id)));
    let second = next_publish(&mut sub);
    assert_eq!(second.topic, "q2/2");
    // PUBREC sent, then the connection drops: on resume only the PUBREL comes again.
    let id2 = second.packet_id.unwrap();
    sub.send(&Packet::PubRec(resp(id2)));
    assert!(matches!(sub.recv(), Some(Packet::PubRel(r)) if r.packet_id == id2));
    drop(sub);
    std::thread::sleep(Duration::from_millis(200));
    let (mut sub, ack) = Raw::connect_custom(port, ProtocolVersion::V5, |c| {
        c.client_id = "q2".into();
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(600);
    });
    assert!(ack.session_present);
    assert!(matches!(sub.recv(), Some(Packet::PubRel(r)) if r.packet_id == id2), "the PUBREL is owed, not the message");
    sub.send(&Packet::PubComp(resp(id2)));
    sub.stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    assert!(matches!(sub.try_recv(), Err(_) | Ok(None)), "nothing else: exactly once");
}

#[test]
fn nothing_larger_than_the_clients_maximum_packet_size_is_sent() {
    let server = anonymous_server();
    let port = server.mqtt_port;
    // Receive Maximum 1: a discarded message must free its window slot, or nothing follows.
    let (mut sub, _) = Raw::connect_custom(port, ProtocolVersion::V5, |c| {
        c.client_id = "small".into();
        c.properties.maximum_packet_size = Some(64);
        c.properties.receive_maximum = Some(1);
    });
    assert_eq!(sub.subscribe(1, &["size/#"]).return_codes, [1]);
    let (mut p, _) = Raw::connect_as(port, ProtocolVersion::V5, "pub", None);
    for (i, len) in [(1u16, 1000usize), (2, 10)] {
        p.send(&publish("size/t", &vec![b'x'; len], i, false, PublishProperties::default()));
        assert!(matches!(p.recv(), Some(Packet::PubAck(a)) if a.packet_id == i && a.reason == 0));
    }
    let got = next_publish(&mut sub);
    assert_eq!(got.payload.len(), 10, "the 1,000-byte message is not sent; the next one is");
    ack(&mut sub, &got);
    // A refusal whose reason string would not fit comes without it.
    sub.send(&publish("v1/devices/me/telemetry", &[b'{'; 150], 9, false, PublishProperties::default()));
    match sub.recv() {
        Some(Packet::PubAck(a)) => assert_eq!((a.packet_id, a.reason, a.reason_string), (9, 0x87, None)),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    let (_, metrics) = server.req("GET", "/metrics", None, None);
    assert!(metrics.contains("gridlinks_mqtt_too_large_discarded_total 1\n"), "{metrics}");
}

/// `mqtt.max_keep_alive`: an MQTT 5 client asking more (or none) is told the bound in
/// CONNACK (Server Keep Alive) and held to it — silent past 1.5 times it, it is closed; one
/// asking less keeps its own and hears nothing; an MQTT 3.1.1 client cannot be told and
/// keeps its own (as Mosquitto's `max_keepalive`; tests/compat compares the CONNACKs).
#[test]
fn server_keep_alive_bounds_mqtt5_clients() {
    let s = Server::start_env(&[("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"), ("GRIDLINKS_MQTT_MAX_KEEP_ALIVE", "1")]);
    let (mut none, ack) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, None, 0);
    assert_eq!((ack.code, ack.properties.server_keep_alive), (0, Some(1)), "{ack:?}");
    let (closing, _) = none.expect_close();
    assert!(closing.as_ref().is_none_or(|d| d.reason == reason::KEEP_ALIVE_TIMEOUT), "{closing:?}");
    let (_, ack) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, None, 600);
    assert_eq!(ack.properties.server_keep_alive, Some(1));
    let s2 = Server::start_env(&[("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"), ("GRIDLINKS_MQTT_MAX_KEEP_ALIVE", "60")]);
    let (_, ack) = Raw::connect(s2.mqtt_port, ProtocolVersion::V5, None, 30);
    assert_eq!((ack.code, ack.properties.server_keep_alive), (0, None), "within the bound: its own");
    let (_, ack) = Raw::connect(s2.mqtt_port, ProtocolVersion::V3_1_1, None, 600);
    assert_eq!(ack.code, 0, "3.1.1 keeps its own");
}

/// Request Problem Information = 0: acknowledgements carry no reason string (MQTT 5
/// §3.1.2.11.7); asked for (the default), the same refusal says why. The refusal here: a
/// publish over `mqtt.rate_limit_messages`, PUBACK 0x97.
#[test]
fn request_problem_information_zero_keeps_reason_strings_off_acknowledgements() {
    let s =
        Server::start_env(&[("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"), ("GRIDLINKS_MQTT_RATE_LIMIT_MESSAGES", "1")]);
    let refusals = |problem_information: Option<u8>| -> Vec<Option<String>> {
        let (mut c, ack) = Raw::connect_custom(s.mqtt_port, ProtocolVersion::V5, |c| {
            c.client_id = format!("rpi-{problem_information:?}");
            c.properties.request_problem_information = problem_information;
        });
        assert_eq!(ack.code, 0);
        // Twenty at once: all but the first are over one per second.
        for id in 1..=20u16 {
            c.send(&publish("rpi/t", b"x", id, false, PublishProperties::default()));
        }
        let mut refused = Vec::new();
        for _ in 1..=20 {
            match c.recv() {
                Some(Packet::PubAck(a)) if a.reason == reason::QUOTA_EXCEEDED => refused.push(a.reason_string),
                Some(Packet::PubAck(_)) => {}
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
        refused
    };
    let told = refusals(None);
    assert!(!told.is_empty() && told.iter().all(Option::is_some), "{told:?}");
    let lean = refusals(Some(0));
    assert!(!lean.is_empty() && lean.iter().all(Option::is_none), "{lean:?}");
}
