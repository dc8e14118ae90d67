//! Dashboards as stored documents, through ThingsBoard's REST paths on the real binary:
//! created, read with and without their configuration, listed, searched, updated, deleted,
//! and kept across a restart.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

#[test]
fn dashboards_are_kept_as_given() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    let config = json!({"widgets": {"w1": {"type": "timeseries", "config": {"datasources": []}}}, "states": {}});
    let (st, d) = s.json("POST", "/api/dashboard", &jwt, Some(json!({"title": "Boilers", "configuration": config})));
    assert_eq!(st, 200, "{d}");
    assert_eq!((d["id"]["entityType"].as_str(), d["title"].as_str()), (Some("DASHBOARD"), Some("Boilers")));
    let id = d["id"]["id"].as_str().unwrap().to_owned();
    let (_, full) = s.json("GET", &format!("/api/dashboard/{id}"), &jwt, None);
    assert_eq!(full["configuration"], config);
    let (_, info) = s.json("GET", &format!("/api/dashboard/info/{id}"), &jwt, None);
    assert!(info.get("configuration").is_none(), "{info}");
    assert_eq!(info["title"], "Boilers");

    for title in ["Pumps", "Overview"] {
        assert_eq!(s.json("POST", "/api/dashboard", &jwt, Some(json!({"title": title}))).0, 200);
    }
    let titles = |q: &str| -> Vec<String> {
        let (st, page) = s.json("GET", &format!("/api/tenant/dashboards?pageSize=10&page=0{q}"), &jwt, None);
        assert_eq!(st, 200, "{page}");
        page["data"].as_array().unwrap().iter().map(|d| d["title"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(titles(""), ["Boilers", "Overview", "Pumps"]);
    assert_eq!(titles("&textSearch=PUM"), ["Pumps"]);
    assert_eq!(titles("&sortProperty=title&sortOrder=DESC"), ["Pumps", "Overview", "Boilers"]);

    // Updated in place (same id, same creation time), then refused without a title.
    let mut changed = full.clone();
    changed["title"] = json!("Boiler room");
    let (st, u) = s.json("POST", "/api/dashboard", &jwt, Some(changed));
    assert_eq!((st, u["id"]["id"].as_str(), &u["createdTime"]), (200, Some(&*id), &full["createdTime"]));
    let (st, err) = s.json("POST", "/api/dashboard", &jwt, Some(json!({"configuration": {}})));
    assert_eq!((st, err["message"].as_str()), (400, Some("Dashboard title should be specified!")));
    let ghost = json!({"title": "x", "id": {"entityType": "DASHBOARD", "id": "00000000-0000-0000-0000-000000000009"}});
    assert_eq!(s.json("POST", "/api/dashboard", &jwt, Some(ghost)).0, 404);

    // Kept across a restart; deleted for good.
    s.sigterm();
    let s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    let (_, again) = s.json("GET", &format!("/api/dashboard/{id}"), &jwt, None);
    assert_eq!((again["title"].as_str(), &again["configuration"]), (Some("Boiler room"), &config));
    assert_eq!(s.req("DELETE", &format!("/api/dashboard/{id}"), Some(&jwt), None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/dashboard/{id}"), &jwt, None).0, 404);
    assert_eq!(s.req("DELETE", &format!("/api/dashboard/{id}"), Some(&jwt), None).0, 404);
    // Without a login: 401.
    assert_eq!(s.req("GET", "/api/tenant/dashboards?pageSize=10&page=0", None, None).0, 401);
}
