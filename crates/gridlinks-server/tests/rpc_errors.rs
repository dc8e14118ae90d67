//! Server-side RPC failures say why: ThingsBoard's statuses (409 not connected, 408 / 504
//! no answer in time, 406 an answer that is not JSON) with its error body
//! `{"status","message","errorCode","timestamp"}`, which the console shows. Real binary,
//! a raw MQTT device.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::mqtt::{Packet, ProtocolVersion, QoS, Raw};
use common::*;

/// Asserts a ThingsBoard error body for `status` whose message contains `says`.
fn assert_error_body(status: u16, body: &str, says: &str) {
    let v: J = serde_json::from_str(body).unwrap_or_else(|e| panic!("{status}: not a JSON body ({e}): {body:?}"));
    assert_eq!(v["status"], status, "{v}");
    assert_eq!(v["errorCode"], 2, "{v}");
    assert!(v["timestamp"].as_i64().is_some_and(|t| t > 0), "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{status}: {message:?} should say {says:?}");
}

#[test]
fn rpc_failures_carry_an_error_body_saying_why() {
    let s = Server::start();
    let jwt = s.login();
    let rpc = |path: &str, body: &str| s.req("POST", path, Some(&jwt), Some(body));

    // Not connected: 409, on both generations of the API, one-way and two-way.
    let offline = s.device(&jwt, "rpc-offline", "RPC_OFFLINE");
    for kind in ["oneway", "twoway"] {
        for api in ["/api/plugins/rpc", "/api/rpc"] {
            let (status, body) = rpc(&format!("{api}/{kind}/{offline}"), r#"{"method":"x","params":{},"timeout":500}"#);
            assert_eq!(status, 409, "{api}/{kind}: {body}");
            assert_error_body(409, &body, "not connected");
        }
    }

    // Connected and subscribed but silent: 408 (v1) and 504 (v2), saying the request was
    // delivered and not answered in time.
    let device = s.device(&jwt, "rpc-silent", "RPC_SILENT");
    let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V3_1_1, Some("RPC_SILENT"), 60);
    c.subscribe(1, &["v1/devices/me/rpc/request/+"]);
    let (status, body) =
        rpc(&format!("/api/plugins/rpc/twoway/{device}"), r#"{"method":"x","params":{},"timeout":300}"#);
    assert_eq!(status, 408, "{body}");
    assert_error_body(408, &body, "did not answer within the timeout");
    let (status, body) = rpc(&format!("/api/rpc/twoway/{device}"), r#"{"method":"x","params":{},"timeout":300}"#);
    assert_eq!(status, 504, "{body}");
    assert_error_body(504, &body, "did not answer within the timeout");

    // An answer that is not JSON: 406, saying so. The call waits while the device answers.
    std::thread::scope(|scope| {
        let call = scope.spawn(|| {
            rpc(&format!("/api/plugins/rpc/twoway/{device}"), r#"{"method":"ask","params":{},"timeout":30000}"#)
        });
        let id = loop {
            match c.recv() {
                Some(Packet::Publish(p)) if serde_json::from_slice::<J>(&p.payload).unwrap()["method"] == "ask" => {
                    break p.topic.rsplit('/').next().unwrap().to_owned();
                }
                Some(_) => continue,
                None => panic!("the device's connection closed"),
            }
        };
        c.publish(&format!("v1/devices/me/rpc/response/{id}"), b"not json", QoS::AtMostOnce, None);
        let (status, body) = call.join().unwrap();
        assert_eq!(status, 406, "{body}");
        assert_error_body(406, &body, "not JSON");
    });

    // A one-way call that is delivered stays a bare 200.
    let (status, body) = rpc(&format!("/api/plugins/rpc/oneway/{device}"), r#"{"method":"reboot","params":{}}"#);
    assert_eq!((status, body.as_str()), (200, ""));
}
