//! API keys (ThingsBoard 4.3) on the real binary: created, used as
//! `X-Authorization: ApiKey …`, listed without their values, disabled, expired, deleted,
//! kept across a restart, and never stored in the clear.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::time::Duration;

use common::*;

/// A request authenticated with an API key; (status, body).
fn with_key(s: &Server, method: &str, path: &str, key: &str, body: Option<J>) -> (u16, J) {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
    let r = agent
        .request(method, &format!("{}{path}", s.base))
        .set("X-Authorization", &format!("ApiKey {key}"))
        .set("Content-Type", "application/json");
    let res = match body {
        Some(b) => r.send_string(&b.to_string()),
        None => r.call(),
    };
    let (status, text) = match res {
        Ok(resp) => (resp.status(), resp.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {path}: {e}"),
    };
    (status, serde_json::from_str(&text).unwrap_or(J::Null))
}

fn files_contain(dir: &std::path::Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().any(|e| {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_contain(&p, needle)
        } else {
            std::fs::read(&p).unwrap_or_default().windows(needle.len()).any(|w| w == needle)
        }
    })
}

#[test]
fn api_keys_authenticate_until_disabled_expired_or_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    let (_, me) = s.json("GET", "/api/auth/user", &jwt, None);
    let user = me["id"]["id"].as_str().unwrap().to_owned();

    let (st, key) = s.json("POST", "/api/apiKey", &jwt, Some(json!({"description": "ci", "expirationTime": 0})));
    assert_eq!(st, 200, "{key}");
    let value = key["value"].as_str().unwrap().to_owned();
    let id = key["id"]["id"].as_str().unwrap().to_owned();
    assert_eq!((key["id"]["entityType"].as_str(), key["enabled"].as_bool()), (Some("API_KEY"), Some(true)));
    assert_eq!(key["userId"]["id"].as_str(), Some(&*user));

    // The key does what a login does.
    let devices = "/api/tenant/devices?pageSize=10&page=0";
    assert_eq!(with_key(&s, "GET", devices, &value, None).0, 200);
    let (st, d) = with_key(&s, "POST", "/api/device", &value, Some(json!({"name": "by-key"})));
    assert_eq!((st, d["name"].as_str()), (200, Some("by-key")));
    let (st, _) = with_key(&s, "GET", devices, &format!("{value}x"), None);
    assert_eq!(st, 401);
    assert_eq!(with_key(&s, "GET", devices, "glk_00000000000000000000000000000000nothing", None).0, 401);

    // Listed without the value; the description can change.
    let (st, list) = s.json("GET", &format!("/api/apiKeys/{user}?pageSize=10&page=0"), &jwt, None);
    assert_eq!(st, 200, "{list}");
    assert_eq!(list["totalElements"], 1);
    assert!(list["data"][0].get("value").is_none(), "{list}");
    let (st, k) = s.json("PUT", &format!("/api/apiKey/{id}/description"), &jwt, Some(json!("nightly export")));
    assert_eq!((st, k["description"].as_str()), (200, Some("nightly export")));

    // Disabled: refused; enabled again: works.
    let (st, k) = s.json("PUT", &format!("/api/apiKey/{id}/enabled/false"), &jwt, None);
    assert_eq!((st, k["enabled"].as_bool()), (200, Some(false)));
    assert_eq!(with_key(&s, "GET", devices, &value, None).0, 401);
    assert_eq!(s.json("PUT", &format!("/api/apiKey/{id}/enabled/true"), &jwt, None).0, 200);
    assert_eq!(with_key(&s, "GET", devices, &value, None).0, 200);

    // A key that expires: works, then not, and says so. 3 s: its first use must come
    // before that, even on a busy machine; the wait ends just past it.
    let soon = gridlinks_types::Ts::now().0 + 3000;
    let (_, short) = s.json("POST", "/api/apiKey", &jwt, Some(json!({"description": "short", "expirationTime": soon})));
    let short_value = short["value"].as_str().unwrap().to_owned();
    assert_eq!(with_key(&s, "GET", devices, &short_value, None).0, 200);
    while gridlinks_types::Ts::now().0 <= soon + 100 {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(with_key(&s, "GET", devices, &short_value, None).0, 401);
    let (_, list) = s.json("GET", &format!("/api/apiKeys/{user}?pageSize=10&page=0"), &jwt, None);
    assert!(list["data"].as_array().unwrap().iter().any(|k| k["description"] == "short" && k["expired"] == true));

    // Kept across a restart, in force at once, and never stored in the clear.
    s.sigterm();
    assert!(!files_contain(&dir, value.as_bytes()), "the key's value is on disk");
    let s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    assert_eq!(with_key(&s, "GET", devices, &value, None).0, 200);
    assert_eq!(s.req("DELETE", &format!("/api/apiKey/{id}"), Some(&jwt), None).0, 200);
    assert_eq!(with_key(&s, "GET", devices, &value, None).0, 401);
    // No such user.
    let other = "00000000-0000-0000-0000-000000000001";
    assert_eq!(s.json("GET", &format!("/api/apiKeys/{other}?pageSize=10&page=0"), &jwt, None).0, 404);
}
