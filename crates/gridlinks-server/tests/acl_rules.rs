//! Access rules that say no, on the real binary: `[[mqtt.acl_rules]]` (ordered, first match
//! decides, `%c`/`%u` filled in, per user, client-id pattern or anonymous) and a credential's
//! own `rules`, before its allow lists; a deny rule inside a granted wildcard withholds its
//! topics at delivery (live and retained); `mqtt.deny_action`.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::mqtt::*;
use common::{json, Server};

/// A server with anonymous clients and `extra` TOML in its `[mqtt]` table, then `rules`.
fn start(extra: &str) -> (Server, tempfile::TempDir) {
    let cfg = tempfile::tempdir().unwrap();
    let path = cfg.path().join("gridlinks.toml");
    std::fs::write(
        &path,
        format!(
            r##"
[mqtt]
allow_anonymous = true
anonymous_publish = ["#"]
anonymous_subscribe = ["#"]
{extra}

[[mqtt.acl_rules]]
permission = "deny"
topics = ["plant/secret/#"]

[[mqtt.acl_rules]]
permission = "allow"
topics = ["clients/%c/#"]
user = "app"

[[mqtt.acl_rules]]
permission = "deny"
action = "publish"
topics = ["readonly/#"]
anonymous = true

[[mqtt.acl_rules]]
permission = "deny"
action = "subscribe"
topics = ["lines/%c/private"]
client_id = "line-*"
"##
        ),
    )
    .unwrap();
    (Server::start_env(&[("GRIDLINKS_CONFIG", path.to_str().unwrap())]), cfg)
}

/// The reason code of the next PUBACK (a copy of a subscription's that comes first is
/// acknowledged and passed over).
fn puback_reason(c: &mut Raw) -> u8 {
    loop {
        match c.recv() {
            Some(Packet::PubAck(a)) => return a.reason,
            Some(Packet::Publish(p)) => {
                let id = p.packet_id.unwrap();
                c.send(&Packet::PubAck(PubResp {
                    packet_id: id,
                    reason: 0,
                    reason_string: None,
                    user_properties: Vec::new(),
                }));
            }
            other => panic!("expected PUBACK, got {other:?}"),
        }
    }
}

#[test]
fn deny_rules_refuse_inside_wildcards_and_withhold_at_delivery() {
    let (server, _cfg) = start("");
    let port = server.mqtt_port;
    let jwt = server.login();
    // The credential's own rules come after the configured ones, before its allow lists.
    let cred = json!({"username": "app", "password": "pw", "publish": ["plant/#"], "subscribe": ["plant/#"],
        "rules": [{"permission": "deny", "action": "publish", "topic": "plant/locked"}]});
    let (st, body) = server.json("POST", "/api/mqtt/clients", &jwt, Some(cred));
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["rules"][0]["topic"], "plant/locked");
    let bad = json!({"username": "b", "password": "pw", "rules": [{"permission": "deny", "action": "publish", "topic": "a/#/b"}]});
    assert_eq!(server.json("POST", "/api/mqtt/clients", &jwt, Some(bad)).0, 400);

    // A retained message inside the denied topics, before anyone subscribes.
    let (mut anon, _) = Raw::connect_as(port, ProtocolVersion::V5, "anon-pub", None);
    anon.send(&Packet::Publish(Publish { retain: true, ..publish_fields("plant/secret/kept", 1) }));
    assert_eq!(puback_reason(&mut anon), reason::NOT_AUTHORIZED, "the configured deny rule is everyone's");
    let (mut app, ack) = Raw::login(port, ProtocolVersion::V5, "app-1", "app", "pw");
    assert_eq!(ack.code, reason::SUCCESS);
    app.send(&Packet::Publish(Publish { retain: true, ..publish_fields("plant/open/kept", 1) }));
    assert!(matches!(puback_reason(&mut app), 0 | reason::NO_MATCHING_SUBSCRIBERS));

    // One SUBSCRIBE: the covered filter refused in its slot, the rest granted; the
    // wildcard that only overlaps the denied topics is granted.
    let granted = app.subscribe(2, &["plant/secret/#", "plant/#", "clients/app-1/#", "clients/other/#"]).return_codes;
    assert_eq!(granted, [reason::NOT_AUTHORIZED, 1, 1, reason::NOT_AUTHORIZED]);
    assert_eq!(app.next_topic(), "plant/open/kept", "the retained message outside the denied topics");

    // Live: the denied topic is withheld, the next one arrives (in order, so nothing was
    // held back by mistake).
    let (mut other, _) = Raw::connect_as(port, ProtocolVersion::V5, "anon-2", None);
    for (i, topic) in ["plant/secret/x", "plant/a", "clients/app-1/y"].iter().enumerate() {
        other.publish(topic, b"1", QoS::AtLeastOnce, Some(i as u16 + 1));
        let want =
            if topic.starts_with("plant/secret") { reason::NOT_AUTHORIZED } else { reason::NO_MATCHING_SUBSCRIBERS };
        let got = puback_reason(&mut other);
        assert!(got == want || got == 0, "{topic}: {got:#x}");
    }
    assert_eq!(app.next_topic(), "plant/a");
    assert_eq!(app.next_topic(), "clients/app-1/y");

    // Publishing: the credential's deny rule inside its own allow list; %c.
    app.publish("plant/locked", b"1", QoS::AtLeastOnce, Some(7));
    assert_eq!(puback_reason(&mut app), reason::NOT_AUTHORIZED);
    app.publish("clients/app-1/z", b"1", QoS::AtLeastOnce, Some(8));
    assert!(matches!(puback_reason(&mut app), 0 | reason::NO_MATCHING_SUBSCRIBERS));
    app.publish("clients/app-2/z", b"1", QoS::AtLeastOnce, Some(9));
    assert_eq!(puback_reason(&mut app), reason::NOT_AUTHORIZED, "another client's %c topic");

    // Anonymous-only and client-id-pattern rules.
    anon.publish("readonly/x", b"1", QoS::AtLeastOnce, Some(3));
    assert_eq!(puback_reason(&mut anon), reason::NOT_AUTHORIZED);
    let (mut line, _) = Raw::connect_as(port, ProtocolVersion::V5, "line-4", None);
    assert_eq!(
        line.subscribe(1, &["lines/line-4/private", "lines/line-5/private"]).return_codes,
        [reason::NOT_AUTHORIZED, 1]
    );
}

/// A `Publish` at QoS 1 with `packet_id`, no properties.
fn publish_fields(topic: &str, packet_id: u16) -> Publish {
    match publish_packet(topic, b"1", QoS::AtLeastOnce, Some(packet_id)) {
        Packet::Publish(p) => p,
        _ => unreachable!(),
    }
}

#[test]
fn deny_action_decides_what_a_refused_publish_gets() {
    // reason (the default): MQTT 5 is told, 3.1.1 cannot be and is disconnected.
    let (server, _cfg) = start("");
    let (mut v5, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "r5", None);
    v5.publish("plant/secret/x", b"1", QoS::AtLeastOnce, Some(1));
    assert_eq!(puback_reason(&mut v5), reason::NOT_AUTHORIZED);
    let (mut v3, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V3_1_1, "r3", None);
    v3.publish("plant/secret/x", b"1", QoS::AtLeastOnce, Some(1));
    v3.expect_close();
    drop(server);

    // ignore: as Mosquitto, 3.1.1 gets a plain PUBACK and the message is dropped.
    let (server, _cfg) = start(r#"deny_action = "ignore""#);
    let (mut sub, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "watcher", None);
    assert_eq!(sub.subscribe(1, &["plant/#"]).return_codes, [1]);
    let (mut v3, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V3_1_1, "i3", None);
    v3.publish("plant/secret/x", b"1", QoS::AtLeastOnce, Some(1));
    assert_eq!(puback_reason(&mut v3), 0);
    v3.publish("plant/b", b"1", QoS::AtLeastOnce, Some(2));
    assert_eq!(puback_reason(&mut v3), 0);
    assert_eq!(sub.next_topic(), "plant/b", "the refused message was not routed");
    drop(server);

    // disconnect: MQTT 5 too, with DISCONNECT 0x87.
    let (server, _cfg) = start(r#"deny_action = "disconnect""#);
    let (mut v5, _) = Raw::connect_as(server.mqtt_port, ProtocolVersion::V5, "d5", None);
    v5.publish("plant/secret/x", b"1", QoS::AtLeastOnce, Some(1));
    let (disconnect, _) = v5.expect_close();
    assert_eq!(disconnect.map(|d| d.reason), Some(reason::NOT_AUTHORIZED));
}

/// MQTT 5 Response Information: given only when asked, a prefix of the client's own that
/// its ACL then allows (the configured deny rules still hold); none for devices' topics.
#[test]
fn response_information_is_a_prefix_the_client_may_use() {
    let (server, _cfg) = start("");
    let jwt = server.login();
    let cred = json!({"username": "asker", "password": "pw", "publish": ["plant/x"], "subscribe": []});
    assert_eq!(server.json("POST", "/api/mqtt/clients", &jwt, Some(cred)).0, 200);
    let ask = |client_id: &str, asked: Option<u8>| {
        Raw::connect_custom(server.mqtt_port, ProtocolVersion::V5, |c| {
            c.client_id = client_id.into();
            c.username = Some("asker".into());
            c.password = Some(bytes::Bytes::from_static(b"pw"));
            c.properties.request_response_information = asked;
        })
    };
    let (_, plain) = ask("quiet", None);
    assert_eq!(plain.properties.response_information, None, "not asked, not given");
    let (mut c, ack) = ask("asking-1", Some(1));
    assert_eq!(ack.properties.response_information.as_deref(), Some("responses/asking-1"));
    assert_eq!(
        c.subscribe(1, &["responses/asking-1/#", "responses/asking-2/#"]).return_codes,
        [1, reason::NOT_AUTHORIZED]
    );
    c.publish("responses/asking-1/r", b"1", QoS::AtLeastOnce, Some(2));
    assert!(matches!(puback_reason(&mut c), 0 | reason::NO_MATCHING_SUBSCRIBERS));
    c.publish("responses/other/r", b"1", QoS::AtLeastOnce, Some(3));
    assert_eq!(puback_reason(&mut c), reason::NOT_AUTHORIZED);
}
