//! Device claiming on the real binary: a device opens a claim over HTTP or MQTT with a
//! secret, a customer user claims it by name with that secret and gets the device; a wrong
//! secret, an expired claim or a device with a customer is refused, a tenant administrator
//! cannot claim, and a customer user gives back only its own devices.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::mqtt::*;
use common::*;

#[test]
fn a_customer_user_claims_a_device_with_its_secret() {
    let s = Server::start();
    let jwt = s.login();
    let (a, b) = (s.customer(&jwt, "A"), s.customer(&jwt, "B"));
    let d1 = s.device(&jwt, "claim-me", "CLAIMTOKEN1");
    s.device(&jwt, "claim-mqtt", "CLAIMTOKEN2");
    let (_, ann) = s.user(&jwt, "ann@a.test", Some(&a), "ann-secret");
    let (_, bob) = s.user(&jwt, "bob@b.test", Some(&b), "bob-secret");
    let claim = |who: &str, name: &str, secret: &str| {
        let (st, out) =
            s.json("POST", &format!("/api/customer/device/{name}/claim"), who, Some(json!({"secretKey": secret})));
        (st, out["response"].as_str().unwrap_or_default().to_owned(), out)
    };
    let open = |token: &str, body: &str| s.req("POST", &format!("/api/v1/{token}/claim"), None, Some(body)).0;

    assert_eq!(claim(&ann, "claim-me", "s3").1, "FAILURE", "no open claim");
    assert_eq!(open("CLAIMTOKEN1", r#"{"secretKey":"s3","durationMs":60000}"#), 200);
    assert_eq!(open("NOSUCHTOKEN", r#"{"secretKey":"s3"}"#), 401);
    assert_eq!(open("CLAIMTOKEN1", r#"{"secretKey":7}"#), 400);
    // (the bad request did not replace the open claim)
    assert_eq!(claim(&ann, "claim-me", "wrong").1, "FAILURE");
    assert_eq!(claim(&ann, "claim-me", "s3").1, "FAILURE", "a wrong secret closed the claim");
    assert_eq!(open("CLAIMTOKEN1", r#"{"secretKey":"s3","durationMs":1}"#), 200);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(claim(&ann, "claim-me", "s3").1, "FAILURE", "expired");

    assert_eq!(open("CLAIMTOKEN1", r#"{"secretKey":"s3"}"#), 200);
    assert_eq!(claim(&jwt, "claim-me", "s3").0, 403, "a tenant administrator does not claim");
    assert_eq!(claim(&ann, "no-such-device", "s3").0, 404);
    assert_eq!(s.json("GET", &format!("/api/device/{d1}"), &ann, None).0, 403, "not hers yet");
    let (st, result, out) = claim(&ann, "claim-me", "s3");
    assert_eq!((st, result.as_str()), (200, "SUCCESS"), "{out}");
    assert_eq!(out["device"]["customerId"]["id"].as_str(), Some(&*a));
    assert_eq!(s.json("GET", &format!("/api/device/{d1}"), &ann, None).0, 200);
    // Claimed: nobody else gets it, even with a new claim and its secret.
    assert_eq!(open("CLAIMTOKEN1", r#"{"secretKey":"x"}"#), 200);
    let (st, result, _) = claim(&bob, "claim-me", "x");
    assert_eq!((st, result.as_str()), (400, "CLAIMED"));
    assert_eq!(s.json("GET", &format!("/api/device/{d1}"), &bob, None).0, 403);

    // Given back only by its customer's users.
    assert_eq!(s.req("DELETE", "/api/customer/device/claim-me/claim", Some(&bob), None).0, 403);
    assert_eq!(s.req("DELETE", "/api/customer/device/claim-me/claim", Some(&ann), None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/device/{d1}"), &ann, None).0, 403);

    // Over MQTT, acknowledged once the claim is open; no secret means an empty one.
    let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("CLAIMTOKEN2"), 60);
    c.publish("v1/devices/me/claim", br#"{"durationMs":60000}"#, QoS::AtLeastOnce, Some(1));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == 0));
    c.publish("v1/devices/me/claim", b"[1]", QoS::AtLeastOnce, Some(2));
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == reason::PAYLOAD_FORMAT_INVALID));
    let (st, result, _) = claim(&bob, "claim-mqtt", "");
    assert_eq!((st, result.as_str()), (200, "SUCCESS"));
}
