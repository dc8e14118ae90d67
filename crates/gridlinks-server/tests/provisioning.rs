//! Device provisioning over HTTP, MQTT (rumqttc with user name `provision`) and CoAP (raw
//! UDP) on the real binary: both strategies, every refusal, and wrong secrets throttled.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::net::UdpSocket;
use std::time::Duration;

use common::*;
use rumqttc::{Client, Event, Incoming, MqttOptions, QoS};

fn profile(s: &Server, jwt: &str, name: &str, strategy: &str, key: &str, secret: &str) -> String {
    let body = json!({
        "name": name, "provisionType": strategy, "provisionDeviceKey": key,
        "profileData": {"provisionConfiguration": {"type": strategy, "provisionDeviceSecret": secret}},
    });
    let (st, p) = s.json("POST", "/api/deviceProfile", jwt, Some(body));
    assert_eq!(st, 200, "{p}");
    p["id"]["id"].as_str().unwrap().to_owned()
}

fn http_provision(s: &Server, body: J) -> J {
    let (st, text) = s.req("POST", "/api/v1/provision", None, Some(&body.to_string()));
    assert_eq!(st, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn device_type(s: &Server, jwt: &str, name: &str) -> String {
    let (st, d) = s.json("GET", &format!("/api/tenant/devices?deviceName={name}"), jwt, None);
    assert_eq!(st, 200, "{d}");
    d["type"].as_str().unwrap().to_owned()
}

#[test]
fn devices_provision_themselves_over_http_with_either_strategy() {
    let s = Server::start();
    let jwt = s.login();
    profile(&s, &jwt, "sensors", "ALLOW_CREATE_NEW_DEVICES", "key-new", "secret-new");
    let pre_id = profile(&s, &jwt, "meters", "CHECK_PRE_PROVISIONED_DEVICES", "key-pre", "secret-pre");
    profile(&s, &jwt, "closed", "DISABLED", "key-off", "secret-off");
    let ask = |name: &str, key: &str, secret: &str| {
        http_provision(&s, json!({"deviceName": name, "provisionDeviceKey": key, "provisionDeviceSecret": secret}))
    };

    // Allow-create: a new device with the profile and a generated token that works.
    let r = ask("sensor-1", "key-new", "secret-new");
    assert_eq!((r["status"].as_str(), r["credentialsType"].as_str()), (Some("SUCCESS"), Some("ACCESS_TOKEN")), "{r}");
    let token = r["credentialsValue"].as_str().unwrap();
    assert_eq!(token.len(), 20);
    assert_eq!(s.telemetry(token, r#"{"t":1}"#), 200);
    assert_eq!(device_type(&s, &jwt, "sensor-1"), "sensors");
    // Once only; a device may bring its own token.
    let again = ask("sensor-1", "key-new", "secret-new");
    assert_eq!(again["status"], "FAILURE", "{again}");
    let own = http_provision(
        &s,
        json!({"deviceName": "sensor-2", "provisionDeviceKey": "key-new",
        "provisionDeviceSecret": "secret-new", "credentialsType": "ACCESS_TOKEN", "token": "SENSOR2TOKEN"}),
    );
    assert_eq!((own["status"].as_str(), own["credentialsValue"].as_str()), (Some("SUCCESS"), Some("SENSOR2TOKEN")));
    let basic = http_provision(
        &s,
        json!({"deviceName": "sensor-3", "provisionDeviceKey": "key-new",
        "provisionDeviceSecret": "secret-new", "credentialsType": "MQTT_BASIC", "username": "u"}),
    );
    assert_eq!(basic["status"], "FAILURE", "{basic}");

    // Pre-provisioned: only a device that exists in the profile, once.
    let body = json!({"name": "meter-1", "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": pre_id}});
    assert_eq!(s.json("POST", "/api/device?accessToken=METER1TOKEN", &jwt, Some(body)).0, 200);
    let r = ask("meter-1", "key-pre", "secret-pre");
    assert_eq!((r["status"].as_str(), r["credentialsValue"].as_str()), (Some("SUCCESS"), Some("METER1TOKEN")), "{r}");
    let id =
        s.json("GET", "/api/tenant/devices?deviceName=meter-1", &jwt, None).1["id"]["id"].as_str().unwrap().to_owned();
    let (_, attrs) =
        s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/SERVER_SCOPE"), &jwt, None);
    assert!(
        attrs.as_array().unwrap().iter().any(|a| a["key"] == "provisionState" && a["value"] == "provisioned"),
        "{attrs}"
    );
    assert_eq!(ask("meter-1", "key-pre", "secret-pre")["status"], "FAILURE", "provisioned already");
    assert_eq!(ask("meter-2", "key-pre", "secret-pre")["status"], "NOT_FOUND", "not pre-provisioned");
    assert_eq!(ask("sensor-1", "key-pre", "secret-pre")["status"], "NOT_FOUND", "another profile's device");

    // A disabled profile, a wrong secret, an unknown key, garbage.
    assert_eq!(ask("x", "key-off", "secret-off")["status"], "NOT_FOUND");
    let wrong = ask("x", "key-new", "not-the-secret");
    assert_eq!(wrong["status"], "NOT_FOUND");
    assert!(wrong["errorMsg"].as_str().unwrap().contains("provision key and secret"), "{wrong}");
    assert_eq!(ask("x", "no-such-key", "secret-new")["status"], "NOT_FOUND");
    let (st, text) = s.req("POST", "/api/v1/provision", None, Some("{not json"));
    assert_eq!(st, 200);
    assert!(text.contains("FAILURE"), "{text}");
    // MQTT's provisioning user name cannot be a device's token.
    let (st, err) = s.json("POST", "/api/device?accessToken=provision", &jwt, Some(json!({"name": "p"})));
    assert_eq!(st, 400, "{err}");
}

#[test]
fn wrong_secrets_are_throttled() {
    let s = Server::start();
    let jwt = s.login();
    profile(&s, &jwt, "sensors", "ALLOW_CREATE_NEW_DEVICES", "key-t", "secret-t");
    let mut throttled = None;
    for i in 0..20 {
        let r = http_provision(
            &s,
            json!({"deviceName": "t", "provisionDeviceKey": "key-t", "provisionDeviceSecret": format!("guess-{i}")}),
        );
        if r["status"] == "FAILURE" {
            throttled = Some((i, r));
            break;
        }
        assert_eq!(r["status"], "NOT_FOUND");
    }
    let (after, r) = throttled.expect("guesses are throttled");
    assert!(r["errorMsg"].as_str().unwrap().contains("too many"), "{r}");
    assert!(after >= 3, "a few free attempts first ({after})");
    // The right secret is refused too while the wait runs: guessing buys nothing.
    let right = http_provision(
        &s,
        json!({"deviceName": "t", "provisionDeviceKey": "key-t", "provisionDeviceSecret": "secret-t"}),
    );
    assert_eq!(right["status"], "FAILURE");
}

#[test]
fn mqtt_and_coap_devices_provision_too() {
    let s = Server::start();
    let jwt = s.login();
    profile(&s, &jwt, "sensors", "ALLOW_CREATE_NEW_DEVICES", "key-m", "secret-m");

    // MQTT: user name "provision", subscribe to the answer, publish the request.
    let mut opts = MqttOptions::new("prov-1", "127.0.0.1", s.mqtt_port);
    opts.set_credentials("provision", "");
    let (client, mut conn) = Client::new(opts, 16);
    client.subscribe("/provision/response", QoS::AtMostOnce).unwrap();
    let req = json!({"deviceName": "mqtt-sensor", "provisionDeviceKey": "key-m", "provisionDeviceSecret": "secret-m"});
    client.publish("/provision/request", QoS::AtLeastOnce, false, req.to_string()).unwrap();
    let mut answer = None;
    for ev in conn.iter() {
        if let Ok(Event::Incoming(Incoming::Publish(p))) = ev {
            assert_eq!(p.topic, "/provision/response");
            answer = Some(serde_json::from_slice::<J>(&p.payload).unwrap());
            break;
        }
        ev.unwrap();
    }
    let answer = answer.unwrap();
    assert_eq!(answer["status"], "SUCCESS", "{answer}");
    let token = answer["credentialsValue"].as_str().unwrap();
    assert_eq!(s.telemetry(token, r#"{"t":1}"#), 200);
    assert_eq!(device_type(&s, &jwt, "mqtt-sensor"), "sensors");
    // A provisioning connection may do nothing else: telemetry ends it.
    client.publish("v1/devices/me/telemetry", QoS::AtLeastOnce, false, r#"{"t":1}"#).unwrap();
    let closed = conn.iter().find_map(|ev| ev.err()).is_some();
    assert!(closed);

    // CoAP: POST /api/v1/provision, answered 2.05 with the same JSON.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut p = coap_lite::Packet::new();
    p.header.set_version(1);
    p.header.set_type(coap_lite::MessageType::Confirmable);
    p.header.code = coap_lite::MessageClass::Request(coap_lite::RequestType::Post);
    p.header.message_id = 7;
    for seg in ["api", "v1", "provision"] {
        p.add_option(coap_lite::CoapOption::UriPath, seg.as_bytes().to_vec());
    }
    p.payload =
        json!({"deviceName": "coap-sensor", "provisionDeviceKey": "key-m", "provisionDeviceSecret": "secret-m"})
            .to_string()
            .into_bytes();
    udp.send_to(&p.to_bytes().unwrap(), ("127.0.0.1", s.coap_port)).unwrap();
    let mut buf = [0u8; 2048];
    let n = udp.recv(&mut buf).unwrap();
    let r = coap_lite::Packet::from_bytes(&buf[..n]).unwrap();
    assert_eq!(r.header.code, coap_lite::MessageClass::Response(coap_lite::ResponseType::Content));
    let answer: J = serde_json::from_slice(&r.payload).unwrap();
    assert_eq!(answer["status"], "SUCCESS", "{answer}");
    assert_eq!(device_type(&s, &jwt, "coap-sensor"), "sensors");
}
