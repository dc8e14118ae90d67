//! Gateways adopting devices that exist already, as ThingsBoard's do (its performance-test
//! tool creates the sub-devices over REST first, then gateways connect them), with the
//! protections kept: a device another gateway owns is never taken over, a gateway is never
//! adopted, another tenant's device of the same name is never touched, and adoption can be
//! refused per server or per device profile. Real clients (rumqttc, and raw MQTT 5 for the
//! refusals' reason codes) against the real binary.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::sync::mpsc;
use std::time::Duration;

use common::mqtt::*;
use common::rumqtt::rumqttc_client;
use common::*;
use rumqttc::{Client, Incoming};

/// Waits for the event `pick` accepts (a generous bound that only catches a hang).
fn wait_for<T>(rx: &mpsc::Receiver<Incoming>, mut pick: impl FnMut(Incoming) -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(i) => {
                if let Some(t) = pick(i) {
                    return t;
                }
            }
            Err(e) => panic!("no MQTT event: {e}"),
        }
    }
}

/// Publishes at QoS 1 with rumqttc and waits for its PUBACK.
fn publish_acked(c: &Client, rx: &mpsc::Receiver<Incoming>, topic: &str, payload: &str) {
    c.publish(topic, rumqttc::QoS::AtLeastOnce, false, payload).unwrap();
    wait_for(rx, |i| matches!(i, Incoming::PubAck(_)).then_some(()));
}

/// Publishes at QoS 1 over raw MQTT 5 and returns the PUBACK's reason code.
fn publish(c: &mut Raw, pid: u16, topic: &str, payload: &str) -> u8 {
    c.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, Some(pid));
    match c.recv() {
        Some(Packet::PubAck(a)) => a.reason,
        other => panic!("expected PUBACK, got {other:?}"),
    }
}

fn values(s: &Server, jwt: &str, id: &str, key: &str) -> J {
    let path = format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys={key}&startTs=0&endTs=9999999999999");
    s.json("GET", &path, jwt, None).1
}

fn device(s: &Server, jwt: &str, id: &str) -> J {
    let (st, d) = s.json("GET", &format!("/api/device/{id}"), jwt, None);
    assert_eq!(st, 200, "{d}");
    d
}

/// The ids of the devices `gateway` owns, from the relation API.
fn owned_by(s: &Server, jwt: &str, gateway: &str) -> Vec<String> {
    let (st, rel) = s.json("GET", &format!("/api/relations?fromId={gateway}&fromType=DEVICE"), jwt, None);
    assert_eq!(st, 200, "{rel}");
    rel.as_array().unwrap().iter().map(|r| r["to"]["id"].as_str().unwrap().to_owned()).collect()
}

/// A second tenant and its administrator's access token.
fn second_tenant(s: &Server) -> String {
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let (st, t) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta"})));
    assert_eq!(st, 200, "{t}");
    let body = json!({"email": "admin@beta.test", "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": t["id"]["id"]}});
    s.activated_user(&sys, body, "beta-secret").1
}

const V5: ProtocolVersion = ProtocolVersion::V5;

#[test]
fn a_gateway_adopts_a_device_made_over_rest_and_keeps_it() {
    let s = Server::start();
    let jwt = s.login();
    let sensor = s.device(&jwt, "sensor-1", "SENSOR1");
    let gw_a = s.gateway(&jwt, "gw-a", "GWA");
    s.gateway(&jwt, "gw-b", "GWB");

    // As ThingsBoard's performance test does: connect the existing device, send for it.
    let (a, rx) = rumqttc_client(s.mqtt_port, "GWA", "gw-a");
    wait_for(&rx, |i| matches!(i, Incoming::ConnAck(_)).then_some(()));
    publish_acked(&a, &rx, "v1/gateway/connect", r#"{"device":"sensor-1"}"#);
    publish_acked(&a, &rx, "v1/gateway/telemetry", r#"{"sensor-1":[{"ts":1700000000000,"values":{"temp":21.5}}]}"#);
    publish_acked(&a, &rx, "v1/gateway/attributes", r#"{"sensor-1":{"firmware":"v2.1"}}"#);
    assert_eq!(values(&s, &jwt, &sensor, "temp")["temp"][0]["value"], "21.5");
    let (_, attrs) =
        s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{sensor}/values/attributes/CLIENT_SCOPE"), &jwt, None);
    assert_eq!(attrs[0]["value"], "v2.1", "{attrs}");
    // Bound to gateway A, as ThingsBoard records it; still the same device with its token.
    let d = device(&s, &jwt, &sensor);
    assert_eq!(d["additionalInfo"]["lastConnectedGateway"].as_str(), Some(gw_a.as_str()), "{d}");
    assert_eq!(owned_by(&s, &jwt, &gw_a), std::slice::from_ref(&sensor));
    assert_eq!(s.telemetry("SENSOR1", r#"{"own":1}"#), 200);
    publish_acked(&a, &rx, "v1/gateway/disconnect", r#"{"device":"sensor-1"}"#);

    // Gateway B cannot take it over, by any gateway topic.
    let (mut b, _) = Raw::connect(s.mqtt_port, V5, Some("GWB"), 60);
    assert_eq!(publish(&mut b, 1, "v1/gateway/connect", r#"{"device":"sensor-1"}"#), reason::NOT_AUTHORIZED);
    let theft = r#"{"sensor-1":[{"ts":1700000001000,"values":{"temp":99}}]}"#;
    assert_eq!(publish(&mut b, 2, "v1/gateway/telemetry", theft), reason::NOT_AUTHORIZED);
    assert_eq!(
        publish(&mut b, 3, "v1/gateway/attributes", r#"{"sensor-1":{"firmware":"evil"}}"#),
        reason::NOT_AUTHORIZED
    );
    assert_eq!(values(&s, &jwt, &sensor, "temp")["temp"].as_array().unwrap().len(), 1);
    let d = device(&s, &jwt, &sensor);
    assert_eq!(d["additionalInfo"]["lastConnectedGateway"].as_str(), Some(gw_a.as_str()), "{d}");
    // Nor is a gateway adopted by another.
    assert_eq!(publish(&mut b, 4, "v1/gateway/telemetry", r#"{"gw-a":{"x":1}}"#), reason::NOT_AUTHORIZED);
    assert_eq!(owned_by(&s, &jwt, &gw_a).len(), 1);
    // A plain device still may not use the gateway API at all.
    let (mut plain, _) = Raw::connect(s.mqtt_port, V5, Some("SENSOR1"), 60);
    assert_eq!(publish(&mut plain, 1, "v1/gateway/connect", r#"{"device":"other"}"#), reason::NOT_AUTHORIZED);
    // Gateway A goes on sending for it.
    publish_acked(&a, &rx, "v1/gateway/telemetry", r#"{"sensor-1":[{"ts":1700000002000,"values":{"temp":22}}]}"#);
    assert_eq!(values(&s, &jwt, &sensor, "temp")["temp"][0]["value"], "22");
}

#[test]
fn another_tenants_device_of_the_same_name_is_never_touched() {
    let s = Server::start();
    let alpha = s.login();
    let beta = second_tenant(&s);
    let b_meter = s.device(&beta, "meter", "BETAMETER");
    let b_before = device(&s, &beta, &b_meter);
    let gw = s.gateway(&alpha, "gw", "GW");
    let (mut g, _) = Raw::connect(s.mqtt_port, V5, Some("GW"), 60);
    assert_eq!(publish(&mut g, 1, "v1/gateway/connect", r#"{"device":"meter"}"#), 0);
    assert_eq!(publish(&mut g, 2, "v1/gateway/telemetry", r#"{"meter":{"kwh":7}}"#), 0);
    // Alpha got a device of its own, owned by its gateway.
    let (st, a_meter) = s.json("GET", "/api/tenant/devices?deviceName=meter", &alpha, None);
    assert_eq!(st, 200, "{a_meter}");
    let a_meter = a_meter["id"]["id"].as_str().unwrap().to_owned();
    assert_ne!(a_meter, b_meter);
    assert_eq!(values(&s, &alpha, &a_meter, "kwh")["kwh"][0]["value"], "7");
    assert_eq!(owned_by(&s, &alpha, &gw), [a_meter]);
    // Beta's is as it was: no data, no gateway.
    assert_eq!(values(&s, &beta, &b_meter, "kwh"), json!({}));
    assert_eq!(device(&s, &beta, &b_meter), b_before);
    let (_, rel) = s.json("GET", &format!("/api/relations?toId={b_meter}&toType=DEVICE"), &beta, None);
    assert_eq!(rel, json!([]));
}

#[test]
fn adoption_is_refused_when_the_server_or_the_device_profile_says_so() {
    let profile = |s: &Server, jwt: &str, name: &str, adoption: &str| -> String {
        let (st, p) =
            s.json("POST", "/api/deviceProfile", jwt, Some(json!({"name": name, "gatewayAdoption": adoption})));
        assert_eq!(st, 200, "{p}");
        p["id"]["id"].as_str().unwrap().to_owned()
    };
    let device_of = |s: &Server, jwt: &str, name: &str, profile: &str| {
        let body = json!({"name": name, "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": profile}});
        assert_eq!(s.json("POST", "/api/device", jwt, Some(body)).0, 200);
    };

    // Adoption on (the default), one profile refusing it.
    let s = Server::start();
    let jwt = s.login();
    let (st, bad) = s.json("POST", "/api/deviceProfile", &jwt, Some(json!({"name": "x", "gatewayAdoption": "MAYBE"})));
    assert_eq!(st, 400, "{bad}");
    let locked = profile(&s, &jwt, "locked", "REFUSE");
    device_of(&s, &jwt, "vault", &locked);
    s.device(&jwt, "free", "FREE");
    s.gateway(&jwt, "gw", "GW");
    let (mut g, _) = Raw::connect(s.mqtt_port, V5, Some("GW"), 60);
    assert_eq!(publish(&mut g, 1, "v1/gateway/telemetry", r#"{"vault":{"x":1}}"#), reason::NOT_AUTHORIZED);
    assert_eq!(publish(&mut g, 2, "v1/gateway/telemetry", r#"{"free":{"x":1}}"#), 0);

    // Adoption off for the server, one profile allowing it.
    let s = Server::start_env(&[("GRIDLINKS_LIMITS_GATEWAY_ADOPTS_DEVICES", "false")]);
    let jwt = s.login();
    let open = profile(&s, &jwt, "open", "ALLOW");
    device_of(&s, &jwt, "welcome", &open);
    let plain = s.device(&jwt, "plain", "PLAIN");
    s.gateway(&jwt, "gw", "GW");
    let (mut g, _) = Raw::connect(s.mqtt_port, V5, Some("GW"), 60);
    assert_eq!(publish(&mut g, 1, "v1/gateway/connect", r#"{"device":"plain"}"#), reason::NOT_AUTHORIZED);
    assert_eq!(publish(&mut g, 2, "v1/gateway/telemetry", r#"{"plain":{"x":1}}"#), reason::NOT_AUTHORIZED);
    assert_eq!(values(&s, &jwt, &plain, "x"), json!({}));
    assert_eq!(publish(&mut g, 3, "v1/gateway/telemetry", r#"{"welcome":{"x":1}}"#), 0);
    // New devices are still created for it.
    assert_eq!(publish(&mut g, 4, "v1/gateway/telemetry", r#"{"brand-new":{"x":1}}"#), 0);
}
