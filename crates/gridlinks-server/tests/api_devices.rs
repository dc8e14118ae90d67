//! Admin REST API against the real binary: login, devices, credentials, listing.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

#[test]
fn login_refresh_and_auth_required() {
    let s = Server::start();
    let (st, _) = s.req("POST", "/api/auth/login", None, Some(r#"{"username":"admin","password":"nope"}"#));
    assert_eq!(st, 401);
    let (st, pair) = s.try_login("admin", ADMIN_PASSWORD);
    assert_eq!(st, 200);
    let refresh = pair["refreshToken"].as_str().unwrap();
    // The refresh token is not an access token.
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=1&page=0", Some(refresh), None).0, 401);
    let (st, fresh) = s.refresh(refresh);
    assert_eq!(st, 200, "{fresh}");
    let token = fresh["token"].as_str().unwrap();
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=1&page=0", Some(token), None).0, 200);
    let (st, b) = s.req("GET", "/api/tenant/devices?pageSize=1&page=0", None, None);
    assert_eq!(st, 401);
    let err: J = serde_json::from_str(&b).unwrap();
    assert_eq!((err["status"].as_i64(), err["errorCode"].as_i64()), (Some(401), Some(10)));
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=1&page=0", Some("x.y.z"), None).0, 401);
}

#[test]
fn device_lifecycle_matches_thingsboard_shapes() {
    let s = Server::start();
    let jwt = s.login();
    let (st, d) =
        s.json("POST", "/api/device", &jwt, Some(json!({"name":"Boiler 1","type":"boiler","label":"Cellar"})));
    assert_eq!(st, 200, "{d}");
    assert_eq!(d["id"]["entityType"], "DEVICE");
    assert_eq!(d["name"], "Boiler 1");
    assert_eq!(d["type"], "boiler");
    assert_eq!(d["label"], "Cellar");
    assert_eq!(d["customerId"]["id"], "13814000-1dd2-11b2-8080-808080808080");
    assert!(d["createdTime"].as_i64().unwrap() > 1_600_000_000_000);
    let id = d["id"]["id"].as_str().unwrap().to_owned();

    let (st, creds) = s.json("GET", &format!("/api/device/{id}/credentials"), &jwt, None);
    assert_eq!(st, 200);
    assert_eq!(creds["credentialsType"], "ACCESS_TOKEN");
    assert_eq!(creds["deviceId"]["id"], id.as_str());
    let token = creds["credentialsId"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 20, "generated tokens are 20 characters as in ThingsBoard");
    assert_eq!(s.telemetry(&token, r#"{"t":1}"#), 200);

    let (st, again) = s.json("GET", &format!("/api/device/{id}"), &jwt, None);
    assert_eq!((st, &again["name"]), (200, &json!("Boiler 1")));

    // Names are unique.
    let (st, e) = s.json("POST", "/api/device", &jwt, Some(json!({"name":"Boiler 1"})));
    assert_eq!((st, e["errorCode"].as_i64()), (400, Some(31)));
    assert_eq!(e["message"], "Device with such name already exists!");
    // Tokens are unique.
    let (st, _) = s.json("POST", &format!("/api/device?accessToken={token}"), &jwt, Some(json!({"name":"Other"})));
    assert_eq!(st, 400);

    // Update through POST with the id keeps the token.
    let mut upd = again.clone();
    upd["label"] = json!("Roof");
    let (st, u) = s.json("POST", "/api/device", &jwt, Some(upd));
    assert_eq!((st, &u["label"], &u["id"]["id"]), (200, &json!("Roof"), &json!(id)));

    // Lookup by name, 404 for unknown, 400 for a bad id.
    let (st, byname) = s.json("GET", "/api/tenant/devices?deviceName=Boiler%201", &jwt, None);
    assert_eq!((st, &byname["id"]["id"]), (200, &json!(id)));
    assert_eq!(s.json("GET", "/api/tenant/devices?deviceName=none", &jwt, None).0, 404);
    assert_eq!(s.json("GET", "/api/device/00000000-0000-0000-0000-000000000000", &jwt, None).0, 404);
    assert_eq!(s.json("GET", "/api/device/not-a-uuid", &jwt, None).0, 400);

    // Delete: the token stops working at once.
    assert_eq!(s.req("DELETE", &format!("/api/device/{id}"), Some(&jwt), None).0, 200);
    assert_eq!(s.telemetry(&token, r#"{"t":1}"#), 401);
    assert_eq!(s.json("GET", &format!("/api/device/{id}"), &jwt, None).0, 404);
    assert_eq!(s.req("DELETE", &format!("/api/device/{id}"), Some(&jwt), None).0, 404);
}

#[test]
fn paging_and_text_search() {
    let s = Server::start();
    let jwt = s.login();
    for i in 0..25 {
        let label = if i % 5 == 0 { "north" } else { "south" };
        let (st, _) = s.json("POST", "/api/device", &jwt, Some(json!({"name": format!("dev-{i:02}"), "label": label})));
        assert_eq!(st, 200);
    }
    let (_, p) = s.json("GET", "/api/tenant/devices?pageSize=10&page=2", &jwt, None);
    assert_eq!(p["totalElements"], 25);
    assert_eq!(p["totalPages"], 3);
    assert_eq!(p["hasNext"], false);
    assert_eq!(p["data"].as_array().unwrap().len(), 5);
    assert_eq!(p["data"][0]["name"], "dev-20");
    let (_, p) = s.json("GET", "/api/tenant/devices?pageSize=10&page=0&sortProperty=name&sortOrder=DESC", &jwt, None);
    assert_eq!((p["data"][0]["name"].as_str(), p["hasNext"].as_bool()), (Some("dev-24"), Some(true)));
    // Case-insensitive substring on name or label.
    let (_, p) = s.json("GET", "/api/tenant/devices?pageSize=100&page=0&textSearch=NORTH", &jwt, None);
    assert_eq!(p["totalElements"], 5);
    let (_, p) = s.json("GET", "/api/tenant/devices?pageSize=100&page=0&textSearch=v-1", &jwt, None);
    assert_eq!(p["totalElements"], 10);
}
