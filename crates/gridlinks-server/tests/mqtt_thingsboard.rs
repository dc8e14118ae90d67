//! ThingsBoard's MQTT device API end to end with real clients: rumqttc (Rust) and
//! Mosquitto's `mosquitto_pub`/`mosquitto_sub` (C), against the real binary.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use common::rumqtt::rumqttc_client;
use common::*;
use rumqttc::{Incoming, QoS};

fn wait_for<T>(rx: &mpsc::Receiver<Incoming>, mut pick: impl FnMut(Incoming) -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(i) => {
                if let Some(t) = pick(i) {
                    return t;
                }
            }
            Err(e) => panic!("timed out waiting for an MQTT event: {e}"),
        }
    }
}

fn publish_of(i: Incoming) -> Option<(String, serde_json::Value)> {
    match i {
        Incoming::Publish(p) => Some((p.topic, serde_json::from_slice(&p.payload).unwrap())),
        _ => None,
    }
}

#[test]
fn rumqttc_telemetry_attributes_push_request_and_rpc() {
    let s = Server::start_env(&[("GRIDLINKS_RPC_MIN_TIMEOUT", "100")]);
    let jwt = s.login();
    let id = s.device(&jwt, "thermostat", "THERMO");
    let (client, rx) = rumqttc_client(s.mqtt_port, "THERMO", "thermostat-1");
    wait_for(&rx, |i| matches!(i, Incoming::ConnAck(_)).then_some(()));
    for t in ["v1/devices/me/attributes", "v1/devices/me/attributes/response/+", "v1/devices/me/rpc/request/+"] {
        client.subscribe(t, QoS::AtLeastOnce).unwrap();
        wait_for(&rx, |i| matches!(i, Incoming::SubAck(_)).then_some(()));
    }

    // Telemetry and client attributes, read back over REST once PUBACKed.
    client
        .publish("v1/devices/me/telemetry", QoS::AtLeastOnce, false, r#"{"ts":1000,"values":{"temperature":21.5}}"#)
        .unwrap();
    wait_for(&rx, |i| matches!(i, Incoming::PubAck(_)).then_some(()));
    client.publish("v1/devices/me/attributes", QoS::AtLeastOnce, false, r#"{"firmware":"1.0.3"}"#).unwrap();
    wait_for(&rx, |i| matches!(i, Incoming::PubAck(_)).then_some(()));
    let base = format!("/api/plugins/telemetry/DEVICE/{id}");
    let (_, v) =
        s.json("GET", &format!("{base}/values/timeseries?keys=temperature&useStrictDataTypes=true"), &jwt, None);
    assert_eq!(v["temperature"], json!([{"ts":1000,"value":21.5}]));
    let (_, a) = s.json("GET", &format!("{base}/values/attributes/CLIENT_SCOPE"), &jwt, None);
    assert_eq!(a[0]["value"], "1.0.3");

    // Shared attribute pushed when an admin changes it.
    assert_eq!(
        s.req("POST", &format!("{base}/attributes/SHARED_SCOPE"), Some(&jwt), Some(r#"{"targetTemp":22}"#)).0,
        200
    );
    let (topic, body) = wait_for(&rx, publish_of);
    assert_eq!((topic.as_str(), body), ("v1/devices/me/attributes", json!({"targetTemp":22})));

    // Attribute request/response.
    client
        .publish(
            "v1/devices/me/attributes/request/7",
            QoS::AtLeastOnce,
            false,
            r#"{"clientKeys":"firmware","sharedKeys":"targetTemp"}"#,
        )
        .unwrap();
    let (topic, body) = wait_for(&rx, publish_of);
    assert_eq!(topic, "v1/devices/me/attributes/response/7");
    assert_eq!(body, json!({"client":{"firmware":"1.0.3"},"shared":{"targetTemp":22}}));

    // Two-way RPC: REST call → device → REST answer.
    let base_url = s.base.clone();
    let jwt2 = jwt.clone();
    let dev = id.clone();
    let call = std::thread::spawn(move || {
        let r = ureq::post(&format!("{base_url}/api/plugins/rpc/twoway/{dev}"))
            .set("X-Authorization", &format!("Bearer {jwt2}"))
            .send_string(r#"{"method":"getTemp","params":{"unit":"C"},"timeout":5000}"#);
        match r {
            Ok(resp) => (resp.status(), resp.into_string().unwrap()),
            Err(ureq::Error::Status(c, resp)) => (c, resp.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        }
    });
    let (topic, body) = wait_for(&rx, publish_of);
    assert!(topic.starts_with("v1/devices/me/rpc/request/"), "{topic}");
    assert_eq!(body, json!({"method":"getTemp","params":{"unit":"C"}}));
    let rpc_id = topic.rsplit('/').next().unwrap().to_owned();
    client
        .publish(format!("v1/devices/me/rpc/response/{rpc_id}"), QoS::AtLeastOnce, false, r#"{"temp":21.5}"#)
        .unwrap();
    let (status, answer) = call.join().unwrap();
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&answer).unwrap(), json!({"temp":21.5}));

    // One-way RPC is delivered; an unanswered two-way call times out with 408 (v1) / 504 (v2).
    assert_eq!(
        s.req("POST", &format!("/api/plugins/rpc/oneway/{id}"), Some(&jwt), Some(r#"{"method":"reboot","params":{}}"#))
            .0,
        200
    );
    let (_, body) = wait_for(&rx, publish_of);
    assert_eq!(body["method"], "reboot");
    assert_eq!(
        s.req(
            "POST",
            &format!("/api/plugins/rpc/twoway/{id}"),
            Some(&jwt),
            Some(r#"{"method":"x","params":{},"timeout":200}"#)
        )
        .0,
        408
    );
    assert_eq!(
        s.req(
            "POST",
            &format!("/api/rpc/twoway/{id}"),
            Some(&jwt),
            Some(r#"{"method":"x","params":{},"timeout":200}"#)
        )
        .0,
        504
    );

    // Client-side RPC is answered clearly as not supported.
    client
        .publish("v1/devices/me/rpc/request/5", QoS::AtLeastOnce, false, r#"{"method":"getTime","params":{}}"#)
        .unwrap();
    client.subscribe("v1/devices/me/rpc/response/+", QoS::AtLeastOnce).unwrap();
    // (The requests of the timed-out calls above arrive first; skip them.)
    let (topic, body) = wait_for(&rx, |i| publish_of(i).filter(|(t, _)| t.contains("/rpc/response/")));
    assert_eq!(topic, "v1/devices/me/rpc/response/5");
    assert!(body["error"].as_str().unwrap().contains("not supported"));

    // A device without a connection: 409, as ThingsBoard answers.
    let other = s.device(&jwt, "offline", "OFFLINE");
    assert_eq!(
        s.req("POST", &format!("/api/plugins/rpc/oneway/{other}"), Some(&jwt), Some(r#"{"method":"x","params":{}}"#)).0,
        409
    );
    client.disconnect().unwrap();
}

#[test]
fn gateway_creates_sub_devices_and_stores_their_data() {
    let s = Server::start();
    let jwt = s.login();
    s.gateway(&jwt, "gateway-1", "GW");
    let (client, rx) = rumqttc_client(s.mqtt_port, "GW", "gw");
    wait_for(&rx, |i| matches!(i, Incoming::ConnAck(_)).then_some(()));
    client.publish("v1/gateway/connect", QoS::AtLeastOnce, false, r#"{"device":"Sensor A","type":"thermo"}"#).unwrap();
    wait_for(&rx, |i| matches!(i, Incoming::PubAck(_)).then_some(()));
    client
        .publish(
            "v1/gateway/telemetry",
            QoS::AtLeastOnce,
            false,
            r#"{"Sensor A":[{"ts":10,"values":{"t":1}}],"Sensor B":[{"ts":20,"values":{"t":2}}]}"#,
        )
        .unwrap();
    wait_for(&rx, |i| matches!(i, Incoming::PubAck(_)).then_some(()));
    client.publish("v1/gateway/attributes", QoS::AtLeastOnce, false, r#"{"Sensor B":{"fw":"2.0"}}"#).unwrap();
    wait_for(&rx, |i| matches!(i, Incoming::PubAck(_)).then_some(()));
    client.publish("v1/gateway/disconnect", QoS::AtLeastOnce, false, r#"{"device":"Sensor A"}"#).unwrap();
    wait_for(&rx, |i| matches!(i, Incoming::PubAck(_)).then_some(()));

    let (st, a) = s.json("GET", "/api/tenant/devices?deviceName=Sensor%20A", &jwt, None);
    assert_eq!((st, a["type"].as_str()), (200, Some("thermo")));
    let (_, b) = s.json("GET", "/api/tenant/devices?deviceName=Sensor%20B", &jwt, None);
    let (a, b) = (a["id"]["id"].as_str().unwrap(), b["id"]["id"].as_str().unwrap());
    let (_, v) = s.json(
        "GET",
        &format!("/api/plugins/telemetry/DEVICE/{a}/values/timeseries?keys=t&useStrictDataTypes=true"),
        &jwt,
        None,
    );
    assert_eq!(v["t"], json!([{"ts":10,"value":1}]));
    let (_, v) =
        s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{b}/values/attributes/CLIENT_SCOPE"), &jwt, None);
    assert_eq!(v[0]["value"], 2.0);
    // Sub-devices are ordinary devices afterwards: they have credentials.
    let (st, c) = s.json("GET", &format!("/api/device/{b}/credentials"), &jwt, None);
    assert_eq!((st, c["credentialsId"].as_str().map(str::len)), (200, Some(20)));
    client.disconnect().unwrap();
}

#[test]
fn mosquitto_clients_publish_and_receive() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "mosq", "MOSQ");
    let port = s.mqtt_port.to_string();
    // mosquitto_pub with -q 1 exits 0 only after the PUBACK.
    for (version, ts) in [("mqttv311", 1), ("mqttv5", 2)] {
        let st = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "-u", "MOSQ", "-q", "1", "-V", version])
            .args(["-t", "v1/devices/me/telemetry", "-m", &format!(r#"{{"ts":{ts},"values":{{"v":{ts}}}}}"#)])
            .status()
            .expect("mosquitto_pub (apt-get install mosquitto-clients)");
        assert!(st.success());
    }
    let (_, v) = s.json(
        "GET",
        &format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=v&startTs=0&endTs=10"),
        &jwt,
        None,
    );
    assert_eq!(v["v"].as_array().unwrap().len(), 2);
    // A wrong token is refused: mosquitto_pub fails.
    let st = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port, "-u", "NOPE", "-q", "1", "-t", "v1/devices/me/telemetry", "-m", "{}"])
        .status()
        .unwrap();
    assert!(!st.success());
    // mosquitto_sub receives a shared-attribute update.
    let sub = Command::new("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-u",
            "MOSQ",
            "-q",
            "1",
            "-C",
            "1",
            "-W",
            "10",
            "-t",
            "v1/devices/me/attributes",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until its subscription is live, then change the attribute (60 s: a hang guard).
    let base = format!("/api/plugins/telemetry/DEVICE/{id}/attributes/SHARED_SCOPE");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut out = None;
    let mut sub = Some(sub);
    while std::time::Instant::now() < deadline {
        assert_eq!(s.req("POST", &base, Some(&jwt), Some(r#"{"mode":"eco"}"#)).0, 200);
        std::thread::sleep(Duration::from_millis(200));
        let child = sub.as_mut().unwrap();
        if child.try_wait().unwrap().is_some() {
            out = Some(sub.take().unwrap().wait_with_output().unwrap());
            break;
        }
    }
    let out = out.expect("mosquitto_sub received nothing");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), r#"{"mode":"eco"}"#);
}
