//! The gateway API beyond telemetry, tried as an attacker would: attribute requests, shared
//! attribute pushes and deletions, server-side RPC and claims for sub-devices reach only the
//! gateway that owns them; another gateway's requests, answers and claims for them are
//! refused with nothing read, answered or opened. Raw MQTT 5 clients (for reason codes)
//! against the real binary.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::mqtt::*;
use common::*;

const V5: ProtocolVersion = ProtocolVersion::V5;

/// A gateway connected over raw MQTT 5, subscribed to its push topics.
fn gateway_client(s: &Server, token: &str) -> Raw {
    let (mut c, ack) = Raw::connect(s.mqtt_port, V5, Some(token), 60);
    assert_eq!(ack.code, 0);
    let sub = c.subscribe(1, &["v1/gateway/attributes", "v1/gateway/rpc", "v1/gateway/attributes/response"]);
    assert_eq!(sub.return_codes, vec![1, 1, 1]);
    c
}

/// Publishes at QoS 1; the PUBACK's reason code (publishes delivered meanwhile are kept).
fn publish(c: &mut Raw, pid: u16, topic: &str, payload: &str, seen: &mut Vec<(String, J)>) -> u8 {
    c.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, Some(pid));
    loop {
        match c.recv() {
            Some(Packet::PubAck(a)) if a.packet_id == pid => return a.reason,
            Some(Packet::Publish(p)) => seen.push(received(c, p)),
            other => panic!("expected PUBACK, got {other:?}"),
        }
    }
}

/// Acknowledges a delivered publish; its topic and JSON body.
fn received(c: &mut Raw, p: Publish) -> (String, J) {
    if let Some(pid) = p.packet_id {
        c.send(&Packet::PubAck(PubResp {
            packet_id: pid,
            reason: 0,
            reason_string: None,
            user_properties: Vec::new(),
        }));
    }
    (p.topic, serde_json::from_slice(&p.payload).unwrap())
}

/// The next publish delivered to `c`.
fn next_publish(c: &mut Raw) -> (String, J) {
    match c.recv() {
        Some(Packet::Publish(p)) => received(c, p),
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

fn connect_sub(c: &mut Raw, pid: u16, name: &str) {
    let mut seen = Vec::new();
    assert_eq!(publish(c, pid, "v1/gateway/connect", &format!(r#"{{"device":"{name}"}}"#), &mut seen), 0);
    assert!(seen.is_empty(), "{seen:?}");
}

fn device_id(s: &Server, jwt: &str, name: &str) -> String {
    let (st, d) = s.json("GET", &format!("/api/tenant/devices?deviceName={name}"), jwt, None);
    assert_eq!(st, 200, "{d}");
    d["id"]["id"].as_str().unwrap().to_owned()
}

#[test]
fn attribute_requests_pushes_and_deletions_reach_only_the_owning_gateway() {
    let s = Server::start();
    let jwt = s.login();
    s.gateway(&jwt, "gw-a", "GWA");
    s.gateway(&jwt, "gw-b", "GWB");
    let mut a = gateway_client(&s, "GWA");
    let mut b = gateway_client(&s, "GWB");
    connect_sub(&mut a, 2, "meter-a");
    connect_sub(&mut b, 2, "meter-b");
    let (ma, mb) = (device_id(&s, &jwt, "meter-a"), device_id(&s, &jwt, "meter-b"));
    let mut seen = Vec::new();
    assert_eq!(publish(&mut a, 3, "v1/gateway/attributes", r#"{"meter-a":{"fw":"v1.0","serial":7}}"#, &mut seen), 0);

    // Shared attributes pushed to the owner only, as {"device","data"}.
    let (st, _) = s.json(
        "POST",
        &format!("/api/plugins/telemetry/DEVICE/{ma}/SHARED_SCOPE"),
        &jwt,
        Some(json!({"mode":"eco","limit":5})),
    );
    assert_eq!(st, 200);
    assert_eq!(
        next_publish(&mut a),
        ("v1/gateway/attributes".into(), json!({"device":"meter-a","data":{"mode":"eco","limit":5}}))
    );
    let (st, _) =
        s.json("POST", &format!("/api/plugins/telemetry/DEVICE/{mb}/SHARED_SCOPE"), &jwt, Some(json!({"b":1})));
    assert_eq!(st, 200);
    // B's first push is its own device's: meter-a's never reached it.
    assert_eq!(next_publish(&mut b), ("v1/gateway/attributes".into(), json!({"device":"meter-b","data":{"b":1}})));

    // Attribute requests: one key → "value"; a list → "values"; client and shared apart.
    assert_eq!(
        publish(
            &mut a,
            4,
            "v1/gateway/attributes/request",
            r#"{"id":11,"device":"meter-a","client":false,"key":"mode"}"#,
            &mut seen
        ),
        0
    );
    assert_eq!(
        next_publish(&mut a),
        ("v1/gateway/attributes/response".into(), json!({"id":11,"device":"meter-a","value":"eco"}))
    );
    assert_eq!(
        publish(
            &mut a,
            5,
            "v1/gateway/attributes/request",
            r#"{"id":12,"device":"meter-a","client":true,"keys":["fw","serial","mode"]}"#,
            &mut seen
        ),
        0
    );
    assert_eq!(next_publish(&mut a).1, json!({"id":12,"device":"meter-a","values":{"fw":"v1.0","serial":7}}));

    // Gateway B asks for, answers for and claims A's device: refused, nothing answered.
    for (pid, topic, body) in [
        (6, "v1/gateway/attributes/request", r#"{"id":13,"device":"meter-a","client":true,"key":"fw"}"#),
        (7, "v1/gateway/rpc", r#"{"device":"meter-a","id":1,"data":{"stolen":true}}"#),
        (8, "v1/gateway/claim", r#"{"meter-b":{"secretKey":"x"},"meter-a":{"secretKey":"x"}}"#),
    ] {
        assert_eq!(publish(&mut b, pid, topic, body, &mut seen), reason::NOT_AUTHORIZED, "{topic}");
    }
    // A plain device may not use gateway topics at all.
    s.device(&jwt, "plain", "PLAIN");
    let (mut plain, _) = Raw::connect(s.mqtt_port, V5, Some("PLAIN"), 60);
    let req = r#"{"id":1,"device":"meter-a","client":true,"key":"fw"}"#;
    assert_eq!(publish(&mut plain, 1, "v1/gateway/attributes/request", req, &mut seen), reason::NOT_AUTHORIZED);
    // Malformed requests are refused as such.
    for (pid, body) in [
        (9, "{"),
        (10, r#"{"id":"x","device":"meter-a","client":true,"key":"fw"}"#),
        (11, r#"{"id":1,"device":"meter-a","client":true}"#),
    ] {
        assert_eq!(
            publish(&mut a, pid, "v1/gateway/attributes/request", body, &mut seen),
            reason::PAYLOAD_FORMAT_INVALID,
            "{body}"
        );
    }
    assert!(seen.is_empty(), "nothing was pushed or answered meanwhile: {seen:?}");

    // Deleted shared attributes: {"deleted":[…]} inside the gateway's envelope.
    let (st, _) =
        s.req("DELETE", &format!("/api/plugins/telemetry/DEVICE/{ma}/SHARED_SCOPE?keys=mode"), Some(&jwt), None);
    assert_eq!(st, 200);
    assert_eq!(
        next_publish(&mut a),
        ("v1/gateway/attributes".into(), json!({"device":"meter-a","data":{"deleted":["mode"]}}))
    );
    // B's claim opened nothing, not even for its own meter-b (the request was refused whole).
    let customer = s.customer(&jwt, "c");
    let (_, user) = s.user(&jwt, "u@c.test", Some(&customer), "user-pw");
    let (st, body) = s.json("POST", "/api/customer/device/meter-b/claim", &user, Some(json!({"secretKey":"x"})));
    assert_ne!(st, 200, "{body}");
}

#[test]
fn server_side_rpc_to_a_sub_device_goes_through_its_gateway_and_only_its_answer_counts() {
    let s = Server::start();
    let jwt = s.login();
    s.gateway(&jwt, "gw-a", "GWA");
    s.gateway(&jwt, "gw-b", "GWB");
    let mut a = gateway_client(&s, "GWA");
    let mut b = gateway_client(&s, "GWB");
    connect_sub(&mut a, 2, "valve");
    let valve = device_id(&s, &jwt, "valve");

    let call = {
        let (base, jwt, valve) = (s.base.clone(), jwt.clone(), valve.clone());
        std::thread::spawn(move || {
            ureq::post(&format!("{base}/api/plugins/rpc/twoway/{valve}"))
                .set("X-Authorization", &format!("Bearer {jwt}"))
                .send_json(json!({"method":"open","params":{"pct":40},"timeout":60000}))
                .map(|r| r.into_json::<J>().unwrap())
                .map_err(|e| e.to_string())
        })
    };
    let (topic, req) = next_publish(&mut a);
    assert_eq!(topic, "v1/gateway/rpc");
    assert_eq!(
        (&req["device"], &req["data"]["method"], &req["data"]["params"]),
        (&json!("valve"), &json!("open"), &json!({"pct":40}))
    );
    let id = req["data"]["id"].as_u64().unwrap();
    // Gateway B tries to answer first: refused; A's answer is the one the caller gets.
    let mut seen = Vec::new();
    let forged = format!(r#"{{"device":"valve","id":{id},"data":{{"forged":true}}}}"#);
    assert_eq!(publish(&mut b, 3, "v1/gateway/rpc", &forged, &mut seen), reason::NOT_AUTHORIZED);
    let answer = format!(r#"{{"device":"valve","id":{id},"data":{{"opened":40}}}}"#);
    assert_eq!(publish(&mut a, 3, "v1/gateway/rpc", &answer, &mut seen), 0);
    assert_eq!(call.join().unwrap().unwrap(), json!({"opened":40}));
    assert!(seen.is_empty(), "{seen:?}");

    // With the gateway gone, the sub-device is not reachable: 409, as for any device with
    // no session (the call waits for none).
    a.disconnect();
    let (st, body) =
        s.json("POST", &format!("/api/plugins/rpc/oneway/{valve}"), &jwt, Some(json!({"method":"close","params":{}})));
    assert_eq!(st, 409, "{body}");
    assert!(body["message"].as_str().unwrap().contains("v1/gateway/rpc"), "{body}");
}

#[test]
fn a_gateway_claim_opens_each_sub_device_for_a_customer() {
    let s = Server::start();
    let jwt = s.login();
    s.gateway(&jwt, "gw-a", "GWA");
    let mut a = gateway_client(&s, "GWA");
    connect_sub(&mut a, 2, "lock-1");
    let mut seen = Vec::new();
    let claim = r#"{"lock-1":{"secretKey":"k1","durationMs":60000},"lock-2":{"secretKey":"k2"}}"#;
    assert_eq!(publish(&mut a, 3, "v1/gateway/claim", claim, &mut seen), 0);
    let customer = s.customer(&jwt, "c");
    let (_, user) = s.user(&jwt, "u@c.test", Some(&customer), "user-pw");
    let (st, body) = s.json("POST", "/api/customer/device/lock-1/claim", &user, Some(json!({"secretKey":"wrong"})));
    assert_ne!(st, 200, "{body}");
    // lock-2 was created for the claim (as ThingsBoard connects a named sub-device).
    let (st, body) = s.json("POST", "/api/customer/device/lock-2/claim", &user, Some(json!({"secretKey":"k2"})));
    assert_eq!((st, &body["response"]), (200, &json!("SUCCESS")), "{body}");
    assert_eq!(body["device"]["customerId"]["id"], json!(customer));
}
