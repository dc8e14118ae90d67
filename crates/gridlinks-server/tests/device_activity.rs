//! Device activity as ThingsBoard keeps it (server attributes `active`, `lastConnectTime`,
//! `lastDisconnectTime`, `lastActivityTime`, `inactivityAlarmTime`), reported by MQTT, HTTP
//! and a gateway's sub-devices, with a device's own `inactivityTimeout`, pushed over the
//! WebSocket API and kept across a restart. The real binary, with a short default timeout.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::time::Duration;

use common::mqtt::*;
use common::ws::{next, open, send};
use common::*;

const TIMEOUT_MS: &str = "2000";

fn server_attrs(s: &Server, jwt: &str, id: &str) -> J {
    let (st, list) =
        s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/SERVER_SCOPE"), jwt, None);
    assert_eq!(st, 200, "{list}");
    J::Object(
        list.as_array().unwrap().iter().map(|a| (a["key"].as_str().unwrap().to_owned(), a["value"].clone())).collect(),
    )
}

fn wait_attr(s: &Server, jwt: &str, id: &str, key: &str, want: J) -> J {
    let mut last = J::Null;
    wait_until(&format!("{key} = {want} for {id}"), || {
        last = server_attrs(s, jwt, id);
        last[key] == want
    });
    last
}

#[test]
fn activity_of_mqtt_http_and_gateway_devices() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("GRIDLINKS_ACTIVITY_INACTIVITY_TIMEOUT", TIMEOUT_MS), ("GRIDLINKS_ACTIVITY_CHECK_INTERVAL", "200")];
    let mut s = Server::start_on(dir.path(), &env);
    let jwt = s.login();
    let mqtt_dev = s.device(&jwt, "mqtt-dev", "ACTMQTT");
    let http_dev = s.device(&jwt, "http-dev", "ACTHTTP");
    let patient = s.device(&jwt, "patient", "ACTSLOW");
    s.gateway(&jwt, "gw", "ACTGW");

    // The WebSocket API sees `active` change.
    let mut ws = open(&s, "/api/ws", Duration::from_secs(60));
    let sub = json!({"cmdId": 1, "type": "ATTRIBUTES", "entityType": "DEVICE", "entityId": mqtt_dev, "scope": "SERVER_SCOPE"});
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [sub]}));
    next(&mut ws);

    // MQTT: connect, a message, disconnect.
    let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("ACTMQTT"), 60);
    let a = wait_attr(&s, &jwt, &mqtt_dev, "active", json!(true));
    assert!(a["lastConnectTime"].as_i64().unwrap() > 0 && a["lastActivityTime"].is_i64(), "{a}");
    let pushed = next(&mut ws);
    assert_eq!(pushed["data"]["active"][0][1], json!("true"), "{pushed}");
    c.publish("v1/devices/me/telemetry", br#"{"t":1}"#, QoS::AtLeastOnce, Some(1));
    assert!(matches!(c.recv(), Some(Packet::PubAck(_))));
    c.disconnect();
    let a = wait_attr(&s, &jwt, &mqtt_dev, "active", json!(false));
    assert!(a["lastDisconnectTime"].as_i64().unwrap() >= a["lastConnectTime"].as_i64().unwrap(), "{a}");
    assert!(a["inactivityAlarmTime"].as_i64().unwrap() > a["lastActivityTime"].as_i64().unwrap(), "{a}");

    // HTTP: each request is activity; a device's own inactivityTimeout wins over the default.
    let timeout = format!("/api/plugins/telemetry/DEVICE/{patient}/attributes/SERVER_SCOPE");
    assert_eq!(s.req("POST", &timeout, Some(&jwt), Some(r#"{"inactivityTimeout":600000}"#)).0, 200);
    assert_eq!(s.telemetry("ACTHTTP", r#"{"x":1}"#), 200);
    assert_eq!(s.telemetry("ACTSLOW", r#"{"x":1}"#), 200);
    wait_attr(&s, &jwt, &http_dev, "active", json!(true));
    wait_attr(&s, &jwt, &http_dev, "active", json!(false));
    assert_eq!(server_attrs(&s, &jwt, &patient)["active"], json!(true), "its own timeout is 10 minutes");

    // A gateway's sub-device: connect and disconnect events, telemetry as activity.
    let (mut g, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("ACTGW"), 60);
    g.publish("v1/gateway/connect", br#"{"device":"sub-1"}"#, QoS::AtLeastOnce, Some(1));
    assert!(matches!(g.recv(), Some(Packet::PubAck(a)) if a.reason == 0));
    let (_, found) = s.json("GET", "/api/tenant/devices?deviceName=sub-1", &jwt, None);
    let sub = found["id"]["id"].as_str().unwrap().to_owned();
    let a = wait_attr(&s, &jwt, &sub, "active", json!(true));
    assert!(a["lastConnectTime"].is_i64(), "{a}");
    g.publish("v1/gateway/disconnect", br#"{"device":"sub-1"}"#, QoS::AtLeastOnce, Some(2));
    assert!(matches!(g.recv(), Some(Packet::PubAck(a)) if a.reason == 0));
    wait_until("the sub-device's disconnect", || server_attrs(&s, &jwt, &sub)["lastDisconnectTime"].is_i64());

    // The device list filters on it (ThingsBoard's deviceInfos `active`).
    let (st, page) = s.json("GET", "/api/tenant/deviceInfos?pageSize=100&page=0&active=true", &jwt, None);
    assert_eq!(st, 200, "{page}");
    let names: Vec<&str> = page["data"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"patient") && names.contains(&"gw") && !names.contains(&"mqtt-dev"), "{names:?}");
    assert!(page["data"].as_array().unwrap().iter().all(|d| d["active"] == json!(true)), "{page}");

    // A clean restart keeps what was written; the patient stays active, then goes silent
    // for good once its own timeout is short.
    drop(ws);
    assert!(s.sigterm().success());
    let mut s = Server::start_on(dir.path(), &env);
    let jwt = s.login();
    assert_eq!(server_attrs(&s, &jwt, &patient)["active"], json!(true));
    assert_eq!(s.req("POST", &timeout, Some(&jwt), Some(r#"{"inactivityTimeout":500}"#)).0, 200);
    wait_attr(&s, &jwt, &patient, "active", json!(false));
    assert!(s.sigterm().success());
}
