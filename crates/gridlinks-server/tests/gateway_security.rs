//! The gateway API as an attacker would try it: a plain device writing into others, a
//! gateway writing into devices it does not own, a flood of sub-device creations.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::mqtt::*;
use common::*;

const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

/// Publishes at QoS 1 and returns the PUBACK's reason code.
fn publish(c: &mut Raw, pid: u16, topic: &str, payload: &str) -> u8 {
    c.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, Some(pid));
    match c.recv() {
        Some(Packet::PubAck(a)) => {
            assert_eq!(a.packet_id, pid);
            a.reason
        }
        other => panic!("expected PUBACK, got {other:?}"),
    }
}

fn values(s: &Server, jwt: &str, id: &str, key: &str) -> J {
    s.json(
        "GET",
        &format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys={key}&startTs=0&endTs=9999999999999"),
        jwt,
        None,
    )
    .1
}

fn client_attributes(s: &Server, jwt: &str, id: &str) -> J {
    s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/CLIENT_SCOPE"), jwt, None).1
}

fn device_named(s: &Server, jwt: &str, name: &str) -> u16 {
    s.json("GET", &format!("/api/tenant/devices?deviceName={name}"), jwt, None).0
}

const INJECT: &str = r#"{"devB":[{"ts":1700000000000,"values":{"injected":42}}]}"#;

#[test]
fn a_device_that_is_not_a_gateway_cannot_write_into_another() {
    let s = Server::start();
    let jwt = s.login();
    s.device(&jwt, "devA", "TOKEN_A");
    let b = s.device(&jwt, "devB", "TOKEN_B");
    let (mut c, _) = Raw::connect(s.mqtt_port, V5, Some("TOKEN_A"), 60);
    assert_eq!(publish(&mut c, 1, "v1/gateway/telemetry", INJECT), reason::NOT_AUTHORIZED);
    assert_eq!(publish(&mut c, 2, "v1/gateway/attributes", r#"{"devB":{"injected":1}}"#), reason::NOT_AUTHORIZED);
    assert_eq!(publish(&mut c, 3, "v1/gateway/connect", r#"{"device":"fresh"}"#), reason::NOT_AUTHORIZED);
    // A flood of "new devices" creates none.
    for i in 0..200u16 {
        let body = format!(r#"{{"flood-{i}":{{"x":1}}}}"#);
        assert_eq!(publish(&mut c, 10 + i, "v1/gateway/telemetry", &body), reason::NOT_AUTHORIZED);
    }
    assert_eq!(values(&s, &jwt, &b, "injected"), json!({}));
    assert_eq!(client_attributes(&s, &jwt, &b), json!([]));
    assert_eq!(device_named(&s, &jwt, "fresh"), 404);
    assert_eq!(device_named(&s, &jwt, "flood-0"), 404);
    // MQTT 3.1.1 cannot refuse a publish: the connection is closed, nothing is stored.
    let (mut c3, _) = Raw::connect(s.mqtt_port, V3, Some("TOKEN_A"), 60);
    c3.publish("v1/gateway/telemetry", INJECT.as_bytes(), QoS::AtLeastOnce, Some(1));
    c3.expect_close();
    assert_eq!(values(&s, &jwt, &b, "injected"), json!({}));
}

/// With adoption refused (`limits.gateway_adopts_devices = false`; by default a gateway adopts a
/// device of no gateway, see gateway_adoption.rs).
#[test]
fn a_gateway_writes_only_to_devices_it_created_or_was_assigned() {
    let s = Server::start_env(&[("GRIDLINKS_LIMITS_GATEWAY_ADOPTS_DEVICES", "false")]);
    let jwt = s.login();
    let gw = s.gateway(&jwt, "gw-1", "GW1");
    s.gateway(&jwt, "gw-2", "GW2");
    let b = s.device(&jwt, "devB", "TOKEN_B");
    let (mut g1, _) = Raw::connect(s.mqtt_port, V5, Some("GW1"), 60);
    let (mut g2, _) = Raw::connect(s.mqtt_port, V5, Some("GW2"), 60);
    // Its own new device: created, stored.
    assert_eq!(publish(&mut g1, 1, "v1/gateway/telemetry", r#"{"own":{"t":1}}"#), 0);
    // A device created over REST belongs to no gateway, and adoption is off.
    assert_eq!(publish(&mut g1, 2, "v1/gateway/telemetry", INJECT), reason::NOT_AUTHORIZED);
    // Another gateway's device is refused, and a message naming one is refused whole.
    assert_eq!(publish(&mut g2, 1, "v1/gateway/telemetry", r#"{"own":{"t":666}}"#), reason::NOT_AUTHORIZED);
    assert_eq!(publish(&mut g2, 2, "v1/gateway/connect", r#"{"device":"own"}"#), reason::NOT_AUTHORIZED);
    assert_eq!(
        publish(&mut g1, 3, "v1/gateway/telemetry", r#"{"own":{"t":2},"devB":{"injected":1}}"#),
        reason::NOT_AUTHORIZED
    );
    let own =
        s.json("GET", "/api/tenant/devices?deviceName=own", &jwt, None).1["id"]["id"].as_str().unwrap().to_owned();
    let stored: Vec<i64> = values(&s, &jwt, &own, "t")["t"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["value"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(stored, [1]);
    assert_eq!(values(&s, &jwt, &b, "injected"), json!({}));
    // The relation API shows and changes who owns what.
    let (st, rel) = s.json("GET", &format!("/api/relations?fromId={gw}&fromType=DEVICE"), &jwt, None);
    assert_eq!(st, 200);
    assert_eq!(rel.as_array().unwrap().len(), 1);
    assert_eq!((rel[0]["to"]["id"].as_str(), rel[0]["type"].as_str()), (Some(own.as_str()), Some("Created")));
    let assign = json!({"from": {"entityType": "DEVICE", "id": gw}, "to": {"entityType": "DEVICE", "id": b}, "type": "Created", "typeGroup": "COMMON"});
    assert_eq!(s.json("POST", "/api/relation", &jwt, Some(assign)).0, 200);
    assert_eq!(publish(&mut g1, 4, "v1/gateway/telemetry", INJECT), 0);
    assert_eq!(values(&s, &jwt, &b, "injected")["injected"][0]["value"], "42");
    let (_, rel) = s.json("GET", &format!("/api/relations?toId={b}&toType=DEVICE"), &jwt, None);
    assert_eq!(rel[0]["from"]["id"].as_str(), Some(gw.as_str()));
    let unassign = format!("/api/relation?fromId={gw}&fromType=DEVICE&relationType=Created&toId={b}&toType=DEVICE");
    assert_eq!(s.json("DELETE", &unassign, &jwt, None).0, 200);
    assert_eq!(publish(&mut g1, 5, "v1/gateway/attributes", r#"{"devB":{"x":1}}"#), reason::NOT_AUTHORIZED);
    // Only gateways own devices: a "Created" relation from a plain device is an ordinary
    // relation (ThingsBoard allows any), and the device gains no gateway API by it.
    let plain = s.device(&jwt, "plain", "PLAIN");
    let other = json!({"from": {"entityType": "DEVICE", "id": plain}, "to": {"entityType": "DEVICE", "id": b}, "type": "Created"});
    assert_eq!(s.json("POST", "/api/relation", &jwt, Some(other)).0, 200);
    let (mut p, _) = Raw::connect(s.mqtt_port, V5, Some("PLAIN"), 60);
    assert_eq!(publish(&mut p, 1, "v1/gateway/telemetry", r#"{"devB":{"t":9}}"#), reason::NOT_AUTHORIZED);
    assert_eq!(values(&s, &jwt, &b, "t").get("t").map(|v| v[0]["value"].clone()), None, "nothing written for devB");
    // Turning a gateway into a plain device closes the gateway API to it at once.
    let (_, mut d) = s.json("GET", &format!("/api/device/{gw}"), &jwt, None);
    d["additionalInfo"] = json!({"gateway": false});
    assert_eq!(s.json("POST", "/api/device", &jwt, Some(d)).0, 200);
    assert_eq!(publish(&mut g1, 6, "v1/gateway/telemetry", r#"{"own":{"t":3}}"#), reason::NOT_AUTHORIZED);
}

#[test]
fn device_creation_through_a_gateway_is_bounded() {
    let s = Server::start_env(&[("GRIDLINKS_LIMITS_MAX_DEVICES_PER_GATEWAY", "5")]);
    let jwt = s.login();
    s.gateway(&jwt, "gw", "GW");
    let (mut g, _) = Raw::connect(s.mqtt_port, V5, Some("GW"), 60);
    for i in 0..5u16 {
        assert_eq!(publish(&mut g, i + 1, "v1/gateway/connect", &format!(r#"{{"device":"sub-{i}"}}"#)), 0);
    }
    assert_eq!(publish(&mut g, 10, "v1/gateway/connect", r#"{"device":"sub-5"}"#), reason::QUOTA_EXCEEDED);
    assert_eq!(publish(&mut g, 11, "v1/gateway/telemetry", r#"{"sub-6":{"t":1}}"#), reason::QUOTA_EXCEEDED);
    assert_eq!(device_named(&s, &jwt, "sub-5"), 404);
    assert_eq!(device_named(&s, &jwt, "sub-6"), 404);
    // Its existing devices still take data.
    assert_eq!(publish(&mut g, 12, "v1/gateway/telemetry", r#"{"sub-0":{"t":1}}"#), 0);
}
