//! MQTT_BASIC device credentials (ThingsBoard's client id / user name / password) on the
//! real binary with rumqttc: set through `POST /api/device/credentials`, shown without the
//! password, accepted only with the right client id and password, throttled, and replaced
//! again by an access token.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::time::Duration;

use common::*;
use rumqttc::{Client, ConnectReturnCode, Event, Incoming, MqttOptions, QoS};

/// Connects; the CONNACK code.
fn connect(port: u16, client_id: &str, user: Option<(&str, &str)>) -> (ConnectReturnCode, Option<Client>) {
    let mut opts = MqttOptions::new(client_id, "127.0.0.1", port);
    if let Some((u, p)) = user {
        opts.set_credentials(u, p);
    }
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut conn) = Client::new(opts, 16);
    // Password checks run on low-priority threads: on a busy machine a CONNACK can take
    // longer than the client's default 5 s.
    conn.eventloop.network_options.set_connection_timeout(30);
    for ev in conn.iter() {
        match ev {
            Ok(Event::Incoming(Incoming::ConnAck(ack))) => {
                let ok = ack.code == ConnectReturnCode::Success;
                if ok {
                    std::thread::spawn(move || for _ in conn.iter() {});
                }
                return (ack.code, ok.then_some(client));
            }
            Ok(_) => {}
            Err(rumqttc::ConnectionError::ConnectionRefused(code)) => return (code, None),
            Err(e) => panic!("{e}"),
        }
    }
    unreachable!()
}

fn set_basic(s: &Server, jwt: &str, id: &str, value: J) -> (u16, J) {
    let body = json!({"deviceId": {"entityType": "DEVICE", "id": id}, "credentialsType": "MQTT_BASIC",
        "credentialsValue": value.to_string()});
    s.json("POST", "/api/device/credentials", jwt, Some(body))
}

#[test]
fn mqtt_basic_credentials_replace_the_token() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "basic-1", "BASIC1TOKEN");
    let (st, cred) =
        set_basic(&s, &jwt, &id, json!({"clientId": "meter-17", "userName": "meter", "password": "s3cret"}));
    assert_eq!((st, cred["credentialsType"].as_str()), (200, Some("MQTT_BASIC")), "{cred}");
    let shown: J = serde_json::from_str(cred["credentialsValue"].as_str().unwrap()).unwrap();
    assert_eq!(shown, json!({"clientId": "meter-17", "userName": "meter", "password": null}), "no password shown");
    let (_, again) = s.json("GET", &format!("/api/device/{id}/credentials"), &jwt, None);
    assert_eq!(again["credentialsType"], "MQTT_BASIC");
    // The old token stops working.
    assert_eq!(s.telemetry("BASIC1TOKEN", r#"{"t":1}"#), 401);

    // The right client id, user name and password: a device, whose telemetry is stored.
    let (code, client) = connect(s.mqtt_port, "meter-17", Some(("meter", "s3cret")));
    assert_eq!(code, ConnectReturnCode::Success);
    client.unwrap().publish("v1/devices/me/telemetry", QoS::AtLeastOnce, false, r#"{"via":"basic"}"#).unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (_, v) =
            s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=via"), &jwt, None);
        if v["via"][0]["value"] == "basic" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "telemetry not stored: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A wrong password or client id: refused.
    assert_eq!(connect(s.mqtt_port, "meter-17", Some(("meter", "wrong"))).0, ConnectReturnCode::BadUserNamePassword);
    assert_eq!(connect(s.mqtt_port, "other-id", Some(("meter", "s3cret"))).0, ConnectReturnCode::BadUserNamePassword);

    // Client id only, no password.
    let id2 = s.device(&jwt, "basic-2", "BASIC2TOKEN");
    assert_eq!(set_basic(&s, &jwt, &id2, json!({"clientId": "sensor-only-id"})).0, 200);
    assert_eq!(connect(s.mqtt_port, "sensor-only-id", None).0, ConnectReturnCode::Success);
    assert_eq!(connect(s.mqtt_port, "unknown-id", None).0, ConnectReturnCode::BadUserNamePassword);

    // Clashes are refused: the same credentials on another device, a user name that is a token.
    let (st, err) = set_basic(&s, &jwt, &id2, json!({"userName": "meter", "password": "x"}));
    assert_eq!(st, 400, "{err}");
    let id3 = s.device(&jwt, "basic-3", "BASIC3TOKEN");
    assert_eq!(set_basic(&s, &jwt, &id3, json!({"userName": "BASIC3TOKEN"})).0, 200, "its own token may be reused");
    let id4 = s.device(&jwt, "basic-4", "BASIC4TOKEN");
    assert_eq!(set_basic(&s, &jwt, &id4, json!({"userName": "BASIC2TOKEN"})).0, 200, "a token no longer in force");
    let id5 = s.device(&jwt, "basic-5", "BASIC5TOKEN");
    s.device(&jwt, "basic-6", "LIVETOKEN6");
    assert_eq!(set_basic(&s, &jwt, &id5, json!({"userName": "LIVETOKEN6"})).0, 400, "another device's token");
    assert_eq!(set_basic(&s, &jwt, &id5, json!({"password": "only"})).0, 400, "neither client id nor user name");

    // An access token again: MQTT_BASIC is gone, the token works.
    let body = json!({"deviceId": {"entityType": "DEVICE", "id": id}, "credentialsType": "ACCESS_TOKEN", "credentialsId": "BACKTOKEN"});
    let (st, c) = s.json("POST", "/api/device/credentials", &jwt, Some(body));
    assert_eq!((st, c["credentialsType"].as_str()), (200, Some("ACCESS_TOKEN")));
    assert_eq!(connect(s.mqtt_port, "meter-17", Some(("meter", "s3cret"))).0, ConnectReturnCode::BadUserNamePassword);
    assert_eq!(s.telemetry("BACKTOKEN", r#"{"t":2}"#), 200);
}

#[test]
fn wrong_basic_passwords_are_throttled() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "basic-t", "BASICTTOKEN");
    assert_eq!(set_basic(&s, &jwt, &id, json!({"userName": "guarded", "password": "right"})).0, 200);
    let mut codes = Vec::new();
    while codes.len() < 8 && codes.last() != Some(&ConnectReturnCode::ServiceUnavailable) {
        codes.push(connect(s.mqtt_port, "x", Some(("guarded", "wrong"))).0);
    }
    assert_eq!(codes.last(), Some(&ConnectReturnCode::ServiceUnavailable), "throttled after a few: {codes:?}");
    // Throttled, the right password is refused too: asked at once, inside the first delay
    // (1 s from the failure that started it; a connect is a loopback round trip).
    assert_ne!(connect(s.mqtt_port, "x", Some(("guarded", "right"))).0, ConnectReturnCode::Success);
}

/// X509_CERTIFICATE credentials: stored with ThingsBoard's fingerprint (SHA3-256 of the PEM
/// body), one device's only, replacing the access token until a token is set again. (A
/// device connects with one once a TLS transport exists.)
#[test]
fn x509_credentials_are_fingerprinted_unique_and_replace_the_token() {
    let s = Server::start();
    let jwt = s.login();
    let a = s.device(&jwt, "x509-a", "X509ATOKEN");
    let b = s.device(&jwt, "x509-b", "X509BTOKEN");
    let set = |id: &str, kind: &str, value: Option<&str>, cred_id: Option<&str>| {
        let body = json!({"deviceId": {"entityType": "DEVICE", "id": id}, "credentialsType": kind,
            "credentialsValue": value, "credentialsId": cred_id});
        s.json("POST", "/api/device/credentials", &jwt, Some(body))
    };
    let pem = "-----BEGIN CERTIFICATE-----\nTUlJQg==\nQUJD\n-----END CERTIFICATE-----\n";
    let (st, cred) = set(&a, "X509_CERTIFICATE", Some(pem), None);
    assert_eq!(st, 200, "{cred}");
    // SHA3-256 of "TUlJQg==QUJD", as ThingsBoard's EncryptionUtil.getSha3Hash gives it.
    let fingerprint = "00b152cc25250420dd9c200022cd0ce522d13694e66c3c48f91e7ce165561b55";
    assert_eq!(
        (cred["credentialsType"].as_str(), cred["credentialsId"].as_str(), cred["credentialsValue"].as_str()),
        (Some("X509_CERTIFICATE"), Some(fingerprint), Some("TUlJQg==QUJD"))
    );
    let (_, again) = s.json("GET", &format!("/api/device/{a}/credentials"), &jwt, None);
    assert_eq!(again["credentialsId"], fingerprint);
    assert_eq!(s.telemetry("X509ATOKEN", r#"{"t":1}"#), 401, "the token no longer works");
    assert_eq!(set(&b, "X509_CERTIFICATE", Some(pem), None).0, 400, "another device's certificate");
    assert_eq!(set(&b, "X509_CERTIFICATE", Some("not a certificate!"), None).0, 400);
    // A token again: the certificate is free for another device.
    assert_eq!(set(&a, "ACCESS_TOKEN", None, Some("X509ANEW")).0, 200);
    assert_eq!(s.telemetry("X509ANEW", r#"{"t":2}"#), 200);
    assert_eq!(set(&b, "X509_CERTIFICATE", Some(pem), None).0, 200);
}
