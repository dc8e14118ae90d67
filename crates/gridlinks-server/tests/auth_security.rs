//! Secrets, logins and credentials as an attacker would try them: reading the data
//! directory, guessing passwords at full speed, enumerating user names, replaying refresh
//! tokens, and naming an application like a device's token.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::mqtt::*;
use common::*;

const V5: ProtocolVersion = ProtocolVersion::V5;

/// Every directory under `dir` (itself included) and every file: their permission bits.
fn modes(dir: &Path) -> Vec<(std::path::PathBuf, u32, bool)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        out.push((d.clone(), std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, true));
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path(), m.permissions().mode() & 0o777, false));
            }
        }
    }
    out
}

fn assert_private(dir: &Path) {
    let all = modes(dir);
    assert!(all.len() > 5, "{all:?}");
    for (path, mode, is_dir) in all {
        let expected = if is_dir { 0o700 } else { 0o600 };
        assert_eq!(mode, expected, "{} is {mode:o}", path.display());
    }
}

fn authorized(s: &Server, token: &str) -> u16 {
    s.req("GET", "/api/auth/user", Some(token), None).0
}

#[test]
fn the_data_directory_and_the_secret_are_private_to_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    // An older installation left files readable by everyone.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("old-notes"), "x").unwrap();
    std::fs::set_permissions(dir.join("old-notes"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    s.device(&jwt, "d", "PRIVATE_TOKEN");
    assert_eq!(s.telemetry("PRIVATE_TOKEN", r#"{"t":1}"#), 200);
    assert_private(&dir);
    let secret = std::fs::read(dir.join("jwt.secret")).unwrap();
    assert!(secret.len() >= 32);
    // Files created after start-up and across a restart stay private.
    s.sigterm();
    let s = Server::start_on(&dir, &[]);
    assert_eq!(s.telemetry("PRIVATE_TOKEN", r#"{"t":2}"#), 200);
    assert_private(&dir);
    assert_eq!(std::fs::read(dir.join("jwt.secret")).unwrap(), secret, "the secret survives a restart");
}

#[test]
fn rotating_the_secret_logs_every_session_out() {
    let s = Server::start();
    let (st, pair) = s.try_login("admin", ADMIN_PASSWORD);
    assert_eq!(st, 200);
    let (token, refresh_token) = (pair["token"].as_str().unwrap(), pair["refreshToken"].as_str().unwrap());
    assert_eq!(authorized(&s, token), 200);
    let before = std::fs::read(s.data_dir.join("jwt.secret")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gridlinks"))
        .args(["admin", "rotate-secret", "--data-dir"])
        .arg(&s.data_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = std::fs::read(s.data_dir.join("jwt.secret")).unwrap();
    assert_ne!(before, after);
    assert_eq!(std::fs::metadata(s.data_dir.join("jwt.secret")).unwrap().permissions().mode() & 0o777, 0o600);
    // The wait ends once the old token is refused; 60 s is a hang guard.
    let deadline = Instant::now() + Duration::from_secs(60);
    while authorized(&s, token) == 200 {
        assert!(Instant::now() < deadline, "the old access token still works");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.refresh(refresh_token).0, 401);
    let fresh = s.login();
    assert_eq!(authorized(&s, &fresh), 200);
}

#[test]
fn refresh_tokens_are_single_use_and_reuse_ends_the_login() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let (_, first) = s.try_login("admin", ADMIN_PASSWORD);
    let r1 = first["refreshToken"].as_str().unwrap().to_owned();
    let (st, second) = s.refresh(&r1);
    assert_eq!(st, 200);
    let (a2, r2) = (second["token"].as_str().unwrap().to_owned(), second["refreshToken"].as_str().unwrap().to_owned());
    assert_ne!(r1, r2);
    assert_eq!(authorized(&s, &a2), 200);
    // The old refresh token is refused, and its reuse ends the whole login.
    assert_eq!(s.refresh(&r1).0, 401);
    assert_eq!(s.refresh(&r2).0, 401);
    assert_eq!(authorized(&s, &a2), 401);
    assert_eq!(authorized(&s, first["token"].as_str().unwrap()), 401);
    // Another login is untouched by that; its refresh token works across a restart, once.
    let (_, other) = s.try_login("admin", ADMIN_PASSWORD);
    let r = other["refreshToken"].as_str().unwrap().to_owned();
    s.sigterm();
    let s = Server::start_on(&dir, &[]);
    let (st, next) = s.refresh(&r);
    assert_eq!(st, 200);
    assert_eq!(s.refresh(&r).0, 401);
    // Logout ends a login.
    let (_, fresh) = s.try_login("admin", ADMIN_PASSWORD);
    let t = fresh["token"].as_str().unwrap();
    assert_eq!(s.req("POST", "/api/auth/logout", Some(t), None).0, 200);
    assert_eq!(authorized(&s, t), 401);
    assert_eq!(s.refresh(fresh["refreshToken"].as_str().unwrap()).0, 401);
    let _ = next;
}

#[test]
fn password_guessing_is_slowed_down_per_address_and_user() {
    let s = Server::start_env(&[("GRIDLINKS_AUTH_LOGIN_FREE_ATTEMPTS", "3")]);
    for _ in 0..4 {
        assert_eq!(s.try_login("admin", "guess").0, 401);
    }
    // Now even the right password waits: 429 with Retry-After, without a check.
    let (st, body) = s.try_login("admin", ADMIN_PASSWORD);
    assert_eq!(st, 429, "{body}");
    assert_eq!(body["errorCode"], 33);
    let started = Instant::now();
    let mut ok = false;
    // Until the right password works (a hang guard of 60 s; the wait is ~1 s).
    while started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        if s.try_login("admin", ADMIN_PASSWORD).0 == 200 {
            ok = true;
            break;
        }
    }
    assert!(ok, "the right password works once the wait is over");
    assert!(started.elapsed() >= Duration::from_millis(400), "the wait was enforced");
    // MQTT application logins are throttled the same way (CONNACK 0x9F with a reason).
    let jwt = s.login();
    let cred = json!({"username": "app", "password": "right", "publish": ["#"], "subscribe": ["#"]});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &jwt, Some(cred)).0, 200);
    for _ in 0..4 {
        assert_eq!(Raw::login(s.mqtt_port, V5, "c", "app", "wrong").1.code, reason::BAD_USER_NAME_OR_PASSWORD);
    }
    let (_, ack) = Raw::login(s.mqtt_port, V5, "c", "app", "right");
    assert_eq!(ack.code, reason::CONNECTION_RATE_EXCEEDED);
    assert!(ack.properties.reason_string.unwrap().contains("retry in"));
}

/// An unknown user name costs what a wrong password costs (both take an argon2 check), so
/// names cannot be told apart by timing; on MQTT they get the same refusal too.
#[test]
fn unknown_user_names_cannot_be_told_apart() {
    let s = Server::start_env(&[("GRIDLINKS_AUTH_LOGIN_FREE_ATTEMPTS", "1000")]);
    let once = |user: &str| {
        let started = Instant::now();
        assert_eq!(s.try_login(user, "wrong").0, 401);
        started.elapsed()
    };
    // Interleaved, so both see the same load on a busy machine; compared by their medians,
    // so one badly scheduled attempt does not decide. (A skipped password check answers in
    // ~1 ms against ~25 ms for argon2: far outside the band either way.)
    let (mut wrong_password, mut unknown_user) = (Vec::new(), Vec::new());
    for _ in 0..9 {
        wrong_password.push(once("admin"));
        unknown_user.push(once("nobody"));
    }
    wrong_password.sort();
    unknown_user.sort();
    let (wrong_password, unknown_user) = (wrong_password[4], unknown_user[4]);
    let ratio = unknown_user.as_secs_f64() / wrong_password.as_secs_f64();
    assert!((0.5..2.0).contains(&ratio), "median: unknown user {unknown_user:?} vs wrong password {wrong_password:?}");
    let jwt = s.login();
    let cred = json!({"username": "app", "password": "right", "publish": ["#"], "subscribe": ["#"]});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &jwt, Some(cred)).0, 200);
    let known = Raw::login(s.mqtt_port, V5, "c1", "app", "wrong").1;
    let unknown = Raw::login(s.mqtt_port, V5, "c2", "nobody", "wrong").1;
    assert_eq!((known.code, known.properties.reason_string), (unknown.code, unknown.properties.reason_string));
}

#[test]
fn application_user_names_and_device_tokens_never_collide() {
    let s = Server::start();
    let jwt = s.login();
    s.device(&jwt, "dev", "SAME_NAME");
    let cred = |name: &str| json!({"username": name, "password": "pw", "publish": ["#"], "subscribe": ["#"]});
    let (st, body) = s.json("POST", "/api/mqtt/clients", &jwt, Some(cred("SAME_NAME")));
    assert_eq!(st, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("device access token"), "{body}");
    // The device is not locked out.
    assert_eq!(Raw::connect(s.mqtt_port, V5, Some("SAME_NAME"), 60).1.code, 0);
    // The other way round: a token may not be an application's user name.
    assert_eq!(s.json("POST", "/api/mqtt/clients", &jwt, Some(cred("appuser"))).0, 200);
    let (st, body) = s.json("POST", "/api/device?accessToken=appuser", &jwt, Some(json!({"name": "dev2"})));
    assert_eq!(st, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("application user name"), "{body}");
    let mapping = json!({"columns": [{"type": "NAME"}, {"type": "ACCESS_TOKEN"}], "delimiter": ",", "update": false, "header": false});
    let (st, r) =
        s.json("POST", "/api/device/bulk_import", &jwt, Some(json!({"file": "dev3,appuser\n", "mapping": mapping})));
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["created"], 0);
    assert!(r["errorsList"][0].as_str().unwrap().contains("application user name"), "{r}");
    assert_eq!(Raw::login(s.mqtt_port, V5, "app", "appuser", "pw").1.code, 0);
}
