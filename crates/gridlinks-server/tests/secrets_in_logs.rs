//! No secret reaches the log: a server logging everything (`GRIDLINKS_LOG=debug`, JSON
//! lines) goes through logins (right and wrong), refreshes, device tokens over MQTT, HTTP
//! and CoAP-less paths, MQTT_BASIC and application passwords (right and wrong), an API key
//! and a user activation; then the log is searched for every secret it saw. Also checks
//! that `log.format = "json"` writes one JSON object per line, and `/metrics` behind
//! `metrics.token` on a listener of its own (`metrics.bind`).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::mqtt::*;
use common::*;
use serde_json::json;

#[test]
fn secrets_never_reach_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("server.log");
    let metrics_port = free_port();
    let metrics_bind = format!("127.0.0.1:{metrics_port}");
    let metrics_token = "metrics-Secret-7f3a9c";
    let env = [
        ("GRIDLINKS_LOG", "debug"),
        ("GRIDLINKS_LOG_FORMAT", "json"),
        ("GRIDLINKS_METRICS_BIND", metrics_bind.as_str()),
        ("GRIDLINKS_METRICS_TOKEN", metrics_token),
    ];
    let mut s = Server::start_logged(&tmp.path().join("data"), &env, &log);
    let mut secrets: Vec<String> = vec![ADMIN_PASSWORD.into(), SYSADMIN_PASSWORD.into(), metrics_token.into()];

    // REST logins: right, wrong, refreshed.
    let (st, login) = s.try_login("admin", ADMIN_PASSWORD);
    assert_eq!(st, 200);
    let jwt = login["token"].as_str().unwrap().to_owned();
    let refresh = login["refreshToken"].as_str().unwrap().to_owned();
    assert_eq!(s.try_login("admin", "Wrong-Password-5521").0, 401);
    let (st, refreshed) = s.refresh(&refresh);
    assert_eq!(st, 200);
    secrets.extend([
        jwt.clone(),
        refresh,
        refreshed["token"].as_str().unwrap().to_owned(),
        "Wrong-Password-5521".into(),
    ]);

    // A device token over HTTP and MQTT; a wrong one.
    let token = "DevTokenSecret9913";
    let id = s.device(&jwt, "logged", token);
    assert_eq!(s.telemetry(token, r#"{"t":1}"#), 200);
    let (mut c, ack) = Raw::connect(s.mqtt_port, ProtocolVersion::V3_1_1, Some(token), 60);
    assert_eq!(ack.code, 0);
    c.disconnect();
    let (_, ack) = Raw::connect(s.mqtt_port, ProtocolVersion::V3_1_1, Some("NotATokenSecret4471"), 60);
    assert_ne!(ack.code, 0);
    secrets.extend([token.into(), "NotATokenSecret4471".into()]);

    // MQTT_BASIC credentials and an application credential, right and wrong passwords.
    let basic = json!({"deviceId": {"entityType": "DEVICE", "id": id}, "credentialsType": "MQTT_BASIC",
        "credentialsValue": json!({"clientId": "logged-1", "userName": "basicuser", "password": "BasicPassSecret31"}).to_string()});
    assert_eq!(s.json("POST", "/api/device/credentials", &jwt, Some(basic)).0, 200);
    assert_eq!(Raw::login(s.mqtt_port, ProtocolVersion::V5, "logged-1", "basicuser", "BasicPassSecret31").1.code, 0);
    assert_ne!(Raw::login(s.mqtt_port, ProtocolVersion::V5, "logged-1", "basicuser", "BasicWrongSecret32").1.code, 0);
    let app = json!({"username": "logapp", "password": "AppPassSecret77", "publish": ["a/#"], "subscribe": ["a/#"]});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &jwt, Some(app)).0, 200);
    assert_eq!(Raw::login(s.mqtt_port, ProtocolVersion::V5, "app-1", "logapp", "AppPassSecret77").1.code, 0);
    assert_ne!(Raw::login(s.mqtt_port, ProtocolVersion::V5, "app-2", "logapp", "AppWrongSecret78").1.code, 0);
    secrets
        .extend(["BasicPassSecret31", "BasicWrongSecret32", "AppPassSecret77", "AppWrongSecret78"].map(String::from));

    // An API key, used once.
    let (st, key) = s.json("POST", "/api/apiKey", &jwt, Some(json!({"description": "log", "expirationTime": 0})));
    assert_eq!(st, 200, "{key}");
    let key = key["value"].as_str().unwrap().to_owned();
    let me = ureq::get(&format!("{}/api/auth/user", s.base)).set("X-Authorization", &format!("ApiKey {key}")).call();
    assert_eq!(me.unwrap().status(), 200);
    secrets.push(key);

    // A user activated with a password.
    let (_, user_token) = s.user(&jwt, "logged@example.com", None, "UserPassSecret55");
    secrets.extend(["UserPassSecret55".to_owned(), user_token]);

    // /metrics: on its own listener, behind its token; not on the main one.
    let metrics = |auth: Option<&str>| {
        let mut r = ureq::get(&format!("http://{metrics_bind}/metrics"));
        if let Some(a) = auth {
            r = r.set("Authorization", a);
        }
        match r.call() {
            Ok(resp) => (resp.status(), resp.into_string().unwrap()),
            Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap_or_default()),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(metrics(None).0, 401);
    assert_eq!(metrics(Some("Bearer wrong-token")).0, 401);
    let (st, text) = metrics(Some(&format!("Bearer {metrics_token}")));
    assert_eq!(st, 200);
    assert!(text.contains("gridlinks_mqtt_connections") && text.ends_with("# EOF\n"), "{text}");
    assert_eq!(s.req("GET", "/metrics", None, None).0, 404);

    assert!(s.sigterm().success());
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
    assert!(lines.len() > 20, "a debug log of the whole run: {} JSON lines", lines.len());
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string(), "{line}");
    }
    assert!(text.contains("gridlinks ready"));
    for secret in &secrets {
        assert!(!text.contains(secret.as_str()), "the log holds a secret ({} bytes): {secret}", secret.len());
    }
}
