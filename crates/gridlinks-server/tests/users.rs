//! Users on the real binary: tenant administrators and customer users created over
//! ThingsBoard's REST paths, activated through their link, logged in with ThingsBoard's JWT
//! claims, changing their password; and the customer boundary tried as an attacker would:
//! a customer user against every REST path of the server, on its own devices, on another
//! customer's and on the tenant's.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

/// The claims of a JWT (its middle part, base64url without padding).
fn claims(token: &str) -> J {
    let part = token.split('.').nth(1).unwrap();
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let (mut bits, mut n, mut out) = (0u32, 0, Vec::new());
    for c in part.bytes() {
        bits = (bits << 6) | alphabet.iter().position(|&a| a == c).unwrap() as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    serde_json::from_slice(&out).unwrap()
}

fn login(s: &Server, user: &str, password: &str) -> (u16, J) {
    let (st, body) =
        s.req("POST", "/api/auth/login", None, Some(&json!({"username": user, "password": password}).to_string()));
    (st, serde_json::from_str(&body).unwrap_or(J::Null))
}

/// Logins with the old password while it changes, every 100 ms: none of them works after
/// the change, neither its access token nor its refresh token, however close to the change
/// it was made (revocation does not go by the clock's seconds).
#[test]
fn a_password_change_ends_every_login_made_with_the_old_password() {
    // The old password fails after the change: those failures must not throttle the test.
    let s = Server::start_env(&[("GRIDLINKS_AUTH_LOGIN_FREE_ATTEMPTS", "1000")]);
    let jwt = s.login();
    let (_, cat_jwt) = s.user(&jwt, "cat@acme.test", None, "old-secret");
    let changing = std::sync::atomic::AtomicBool::new(true);
    let logged_in = std::sync::atomic::AtomicUsize::new(0);
    let (pairs, changed) = std::thread::scope(|scope| {
        let logger = scope.spawn(|| {
            let mut pairs = Vec::new();
            while changing.load(std::sync::atomic::Ordering::Relaxed) {
                if let (200, pair) = login(&s, "cat@acme.test", "old-secret") {
                    pairs.push(pair);
                    logged_in.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            pairs
        });
        // The change comes once the old password has logged in a few times (a count, not
        // a guessed time: argon2 on a busy machine is slow).
        wait_until("logins with the old password", || logged_in.load(std::sync::atomic::Ordering::Relaxed) >= 3);
        let body = json!({"currentPassword": "old-secret", "newPassword": "new-secret"});
        let (st, changed) = s.json("POST", "/api/auth/changePassword", &cat_jwt, Some(body));
        assert_eq!(st, 200, "{changed}");
        std::thread::sleep(std::time::Duration::from_millis(700));
        changing.store(false, std::sync::atomic::Ordering::Relaxed);
        (logger.join().unwrap(), changed)
    });
    assert!(!pairs.is_empty(), "the old password logged in before the change");
    for pair in &pairs {
        let token = pair["token"].as_str().unwrap();
        assert_eq!(s.json("GET", "/api/auth/user", token, None).0, 401, "an old password's access token still works");
        let (st, again) = s.refresh(pair["refreshToken"].as_str().unwrap());
        assert_eq!(st, 401, "an old password's refresh token still works: {again}");
    }
    assert_eq!(s.json("GET", "/api/auth/user", &cat_jwt, None).0, 401);
    assert_eq!(s.json("GET", "/api/auth/user", changed["token"].as_str().unwrap(), None).0, 200);
    assert_eq!(login(&s, "cat@acme.test", "new-secret").0, 200);
}

#[test]
fn users_activate_log_in_with_thingsboard_claims_and_change_password() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    let (_, acme) = s.json("POST", "/api/customer", &jwt, Some(json!({"title": "Acme"})));
    let acme_id = acme["id"]["id"].as_str().unwrap().to_owned();

    // Created without a password: no login until the link is used.
    let body = json!({"email": "Ann@Acme.test", "authority": "CUSTOMER_USER", "firstName": "Ann",
        "customerId": {"entityType": "CUSTOMER", "id": acme_id}});
    let (st, ann) = s.json("POST", "/api/user?sendActivationMail=false", &jwt, Some(body.clone()));
    assert_eq!(st, 200, "{ann}");
    assert_eq!(
        (ann["email"].as_str(), ann["authority"].as_str(), ann["customerId"]["id"].as_str()),
        (Some("ann@acme.test"), Some("CUSTOMER_USER"), Some(&*acme_id))
    );
    let ann_id = ann["id"]["id"].as_str().unwrap().to_owned();
    assert_eq!(login(&s, "ann@acme.test", "").0, 401);
    // Refused: the same email, the configured administrator's name, a bad email, a missing
    // customer, a system administrator.
    assert_eq!(s.json("POST", "/api/user", &jwt, Some(body)).0, 400);
    assert_eq!(s.json("POST", "/api/user", &jwt, Some(json!({"email": "admin", "authority": "TENANT_ADMIN"}))).0, 400);
    assert_eq!(s.json("POST", "/api/user", &jwt, Some(json!({"email": "no at", "authority": "TENANT_ADMIN"}))).0, 400);
    let no_customer = json!({"email": "x@y.z", "authority": "CUSTOMER_USER"});
    assert_eq!(s.json("POST", "/api/user", &jwt, Some(no_customer)).0, 400);
    let sys = json!({"email": "root@y.z", "authority": "SYS_ADMIN"});
    assert_eq!(s.json("POST", "/api/user", &jwt, Some(sys)).0, 403);

    // The activation link: each request replaces the last; a bad token or a short password
    // is refused; using it logs the user in.
    let link = |s: &Server| {
        let (st, link) = s.req("GET", &format!("/api/user/{ann_id}/activationLink"), Some(&jwt), None);
        assert_eq!(st, 200, "{link}");
        link.split("activateToken=").nth(1).unwrap().to_owned()
    };
    let first = link(&s);
    let token = link(&s);
    let activate = |t: &str, pw: &str| {
        s.req("POST", "/api/noauth/activate", None, Some(&json!({"activateToken": t, "password": pw}).to_string()))
    };
    assert_eq!(activate(&first, "secret-1").0, 404, "an earlier link stops working");
    assert_eq!(activate("guess", "secret-1").0, 404);
    assert_eq!(activate(&token, "short").0, 400);
    let (st, pair) = activate(&token, "secret-1");
    assert_eq!(st, 200, "{pair}");
    let pair: J = serde_json::from_str(&pair).unwrap();
    assert_eq!(pair["scope"], "CUSTOMER_USER");
    assert_eq!(activate(&token, "secret-2").0, 404, "a link works once");
    assert_eq!(s.req("GET", &format!("/api/user/{ann_id}/activationLink"), Some(&jwt), None).0, 400);

    // ThingsBoard's claims.
    let (st, p) = login(&s, "ANN@acme.test", "secret-1");
    assert_eq!(st, 200, "{p}");
    let ann_jwt = p["token"].as_str().unwrap().to_owned();
    let c = claims(&ann_jwt);
    let (_, me) = s.json("GET", "/api/auth/user", &jwt, None);
    let tenant = me["tenantId"]["id"].as_str().unwrap();
    assert_eq!(c["sub"], "ann@acme.test");
    assert_eq!(c["scopes"], json!(["CUSTOMER_USER"]));
    assert_eq!((c["userId"].as_str(), c["customerId"].as_str()), (Some(&*ann_id), Some(&*acme_id)));
    assert_eq!((c["tenantId"].as_str(), c["firstName"].as_str()), (Some(tenant), Some("Ann")));
    assert_eq!((c["enabled"].as_bool(), c["isPublic"].as_bool()), (Some(true), Some(false)));
    assert_eq!(claims(&jwt)["customerId"], J::Null, "a tenant administrator has no customer");
    let (st, me) = s.json("GET", "/api/auth/user", &ann_jwt, None);
    assert_eq!((st, me["email"].as_str(), me["id"]["id"].as_str()), (200, Some("ann@acme.test"), Some(&*ann_id)));

    // A password change: the wrong current password is refused; the right one gives a new
    // pair, and tokens issued before stop working (in the same second too).
    let change = |t: &str, cur: &str, new: &str| {
        s.json("POST", "/api/auth/changePassword", t, Some(json!({"currentPassword": cur, "newPassword": new})))
    };
    assert_eq!(change(&ann_jwt, "wrong", "secret-2").0, 400);
    let (st, pair) = change(&ann_jwt, "secret-1", "secret-2");
    assert_eq!(st, 200, "{pair}");
    assert_eq!(s.json("GET", "/api/auth/user", &ann_jwt, None).0, 401, "tokens issued before the change");
    let new_jwt = pair["token"].as_str().unwrap().to_owned();
    assert_eq!(s.json("GET", "/api/auth/user", &new_jwt, None).0, 200);
    assert_eq!(login(&s, "ann@acme.test", "secret-1").0, 401);
    assert_eq!(change(&jwt, ADMIN_PASSWORD, "whatever").0, 400, "the configured administrator's is configured");

    // A second tenant administrator manages the tenant.
    let (bob_id, bob_jwt) = s.user(&jwt, "bob@corp.test", None, "bob-secret");
    assert_eq!(claims(&bob_jwt)["scopes"], json!(["TENANT_ADMIN"]));
    assert_eq!(s.json("GET", "/api/tenant/devices?pageSize=10&page=0", &bob_jwt, None).0, 200);
    let (_, list) = s.json("GET", "/api/users?pageSize=10&page=0", &bob_jwt, None);
    let emails: Vec<&str> = list["data"].as_array().unwrap().iter().map(|u| u["email"].as_str().unwrap()).collect();
    assert_eq!(emails, ["ann@acme.test", "bob@corp.test"]);
    let (_, list) = s.json("GET", &format!("/api/customer/{acme_id}/users?pageSize=10&page=0"), &jwt, None);
    assert_eq!(list["totalElements"], 1);

    // Users survive a restart; tokens stay valid.
    s.sigterm();
    let mut s = Server::start_on(&dir, &[]);
    assert_eq!(s.json("GET", "/api/auth/user", &new_jwt, None).0, 200);
    assert_eq!(login(&s, "bob@corp.test", "bob-secret").0, 200);

    // A deleted user's tokens stop working at once; deleting oneself is refused.
    let jwt = s.login();
    assert_eq!(s.json("DELETE", &format!("/api/user/{bob_id}"), &bob_jwt, None).0, 400);
    assert_eq!(s.json("DELETE", &format!("/api/user/{bob_id}"), &jwt, None).0, 200);
    assert_eq!(s.json("GET", "/api/auth/user", &bob_jwt, None).0, 401);
    assert_eq!(login(&s, "bob@corp.test", "bob-secret").0, 401);
    // A deleted customer's users go with it.
    assert_eq!(s.json("DELETE", &format!("/api/customer/{acme_id}"), &jwt, None).0, 200);
    assert_eq!(s.json("GET", "/api/auth/user", &new_jwt, None).0, 401);
    s.sigterm();
    let s = Server::start_on(&dir, &[]);
    assert_eq!(login(&s, "ann@acme.test", "secret-2").0, 401, "gone after a restart too");
}

/// Every route of the server (read from its source) a customer user is tried on: allowed on
/// its own customer's devices, 403 (or 404 where the id is unknown) everywhere else, and no
/// answer carries another's data.
#[test]
fn a_customer_user_reaches_only_its_customers_devices_on_every_path() {
    let s = Server::start();
    let jwt = s.login();
    let (a, b) = (s.customer(&jwt, "A"), s.customer(&jwt, "B"));
    let mine = s.device(&jwt, "mine-1", "MINETOKEN1");
    let theirs = s.device(&jwt, "theirs-1", "THEIRSTOKEN1");
    let tenants = s.device(&jwt, "tenant-1", "TENANTTOKEN1");
    for (c, d) in [(&a, &mine), (&b, &theirs)] {
        assert_eq!(s.json("POST", &format!("/api/customer/{c}/device/{d}"), &jwt, None).0, 200);
    }
    for t in ["MINETOKEN1", "THEIRSTOKEN1", "TENANTTOKEN1"] {
        assert_eq!(s.telemetry(t, &json!({"secret": format!("value-of-{t}")}).to_string()), 200);
    }
    let attrs = json!({"attr": "shared-secret"}).to_string();
    for d in [&mine, &theirs, &tenants] {
        let path = format!("/api/plugins/telemetry/DEVICE/{d}/attributes/SHARED_SCOPE");
        assert_eq!(s.req("POST", &path, Some(&jwt), Some(&attrs)).0, 200);
    }
    let dashboard = |title: &str, c: &str| {
        let (_, d) = s.json("POST", "/api/dashboard", &jwt, Some(json!({"title": title})));
        let id = d["id"]["id"].as_str().unwrap().to_owned();
        assert_eq!(s.json("POST", &format!("/api/customer/{c}/dashboard/{id}"), &jwt, None).0, 200);
        id
    };
    let (dash_a, dash_b) = (dashboard("dash-A", &a), dashboard("dash-B", &b));
    let asset = |name: &str, c: Option<&str>| {
        let (_, x) = s.json("POST", "/api/asset", &jwt, Some(json!({"name": name, "type": "building"})));
        let id = x["id"]["id"].as_str().unwrap().to_owned();
        if let Some(c) = c {
            assert_eq!(s.json("POST", &format!("/api/customer/{c}/asset/{id}"), &jwt, None).0, 200);
        }
        id
    };
    let (mine_asset, their_asset, tenant_asset) =
        (asset("asset-A", Some(&a)), asset("asset-B", Some(&b)), asset("asset-T", None));
    for (x, d) in [(&mine_asset, &mine), (&their_asset, &theirs), (&tenant_asset, &tenants)] {
        let r = json!({"from": {"entityType": "ASSET", "id": x}, "to": {"entityType": "DEVICE", "id": d}, "type": "Contains"});
        assert_eq!(s.json("POST", "/api/relation", &jwt, Some(r)).0, 200);
    }
    let alarm = |d: &str| {
        let body = json!({"originator": {"entityType": "DEVICE", "id": d}, "type": "Leak", "severity": "MAJOR"});
        let (st, x) = s.json("POST", "/api/alarm", &jwt, Some(body));
        assert_eq!(st, 200, "{x}");
        x["id"]["id"].as_str().unwrap().to_owned()
    };
    let (mine_alarm, their_alarm, tenant_alarm) = (alarm(&mine), alarm(&theirs), alarm(&tenants));
    let (ann, ann_jwt) = s.user(&jwt, "ann@a.test", Some(&a), "ann-secret");
    let (bob, _) = s.user(&jwt, "bob@b.test", Some(&b), "bob-secret");
    let (_, admin) = s.json("GET", "/api/auth/user", &jwt, None);
    let admin_id = admin["id"]["id"].as_str().unwrap().to_owned();
    let tenant = admin["tenantId"]["id"].as_str().unwrap().to_owned();

    // Its own customer's device: read and controlled as ThingsBoard allows a customer user.
    let tel = |d: &str| format!("/api/plugins/telemetry/DEVICE/{d}");
    let ok = [
        ("GET", format!("/api/device/{mine}"), None),
        ("GET", format!("/api/device/{mine}/credentials"), None),
        ("GET", format!("{}/values/timeseries?keys=secret", tel(&mine)), None),
        ("GET", format!("{}/values/attributes/SHARED_SCOPE", tel(&mine)), None),
        ("GET", format!("{}/keys/timeseries", tel(&mine)), None),
        ("POST", format!("{}/attributes/SHARED_SCOPE", tel(&mine)), Some(attrs.clone())),
        ("POST", format!("{}/timeseries/ANY", tel(&mine)), Some(r#"{"t":1}"#.to_owned())),
        ("GET", format!("/api/customer/{a}"), None),
        ("GET", format!("/api/customer/{a}/devices?pageSize=10&page=0"), None),
        ("GET", format!("/api/customer/{a}/dashboards?pageSize=10&page=0"), None),
        ("GET", format!("/api/dashboard/{dash_a}"), None),
        ("GET", format!("/api/dashboard/info/{dash_a}"), None),
        ("GET", format!("/api/user/{ann}"), None),
        ("GET", format!("/api/apiKeys/{ann}?pageSize=10&page=0"), None),
        ("GET", format!("/api/asset/{mine_asset}"), None),
        ("GET", format!("/api/customer/{a}/assetInfos?pageSize=10&page=0"), None),
        ("GET", format!("/api/relations?fromId={mine_asset}&fromType=ASSET"), None),
        ("GET", format!("/api/relations/info/to/DEVICE/{mine}"), None),
        ("GET", format!("/api/alarm/info/{mine_alarm}"), None),
        ("GET", format!("/api/v2/alarm/DEVICE/{mine}?pageSize=10&page=0"), None),
        ("POST", format!("/api/alarm/{mine_alarm}/ack"), None),
        ("POST", format!("/api/alarm/{mine_alarm}/comment"), Some(r#"{"comment":{"text":"seen"}}"#.to_owned())),
    ];
    for (m, path, body) in &ok {
        let (st, out) = s.req(m, path, Some(&ann_jwt), body.as_deref());
        assert_eq!(st, 200, "{m} {path}: {out}");
        assert!(!out.contains("THEIRS") && !out.contains("TENANTTOKEN") && !out.contains("dash-B"), "{path}: {out}");
    }
    // Lists of what the caller may see: its own only.
    let (_, by_ids) = s.json("GET", &format!("/api/devices?deviceIds={mine},{theirs},{tenants}"), &ann_jwt, None);
    assert_eq!(by_ids.as_array().unwrap().iter().map(|d| d["name"].clone()).collect::<Vec<_>>(), ["mine-1"]);
    let (_, by_ids) = s.json("GET", &format!("/api/dashboards?dashboardIds={dash_a},{dash_b}"), &ann_jwt, None);
    assert_eq!(by_ids.as_array().unwrap().iter().map(|d| d["title"].clone()).collect::<Vec<_>>(), ["dash-A"]);
    assert_eq!(s.telemetry("TENANTTOKEN1", r#"{"tenant_only":1}"#), 200);
    let all = json!({"entityFilter": {"type": "entityType", "entityType": "DEVICE"}, "pageLink": {"pageSize": 10, "page": 0}});
    let (_, keys) = s.json("POST", "/api/entitiesQuery/find/keys?timeseries=true&attributes=true", &ann_jwt, Some(all));
    assert_eq!(
        keys,
        json!({"entityTypes": ["DEVICE"], "timeseries": ["secret", "t"], "attribute": ["attr"]}),
        "{keys}"
    );
    for list in ["/api/alarms?pageSize=10&page=0", "/api/v2/alarms?pageSize=10&page=0"] {
        let (_, page) = s.json("GET", list, &ann_jwt, None);
        assert_eq!(
            (page["totalElements"].as_u64(), page["data"][0]["originatorName"].as_str()),
            (Some(1), Some("mine-1"))
        );
    }
    let (_, page) = s.json("GET", &format!("/api/customer/{a}/devices?pageSize=10&page=0"), &ann_jwt, None);
    assert_eq!(page["data"][0]["name"], "mine-1");
    assert_eq!(page["totalElements"], 1);

    // Everything else: each route of the server, with another customer's and the tenant's
    // ids. `None` marks routes open to anyone or about the caller itself (tested above and
    // in the first test).
    let forbidden = |d: &str| -> Vec<(&str, &str, String, Option<String>)> {
        let name = if d == theirs { "theirs-1" } else { "tenant-1" };
        let x = if d == theirs { &their_asset } else { &tenant_asset };
        let query = json!({"parameters": {"rootId": x, "rootType": "ASSET", "direction": "FROM"}}).to_string();
        let relation = format!("fromId={x}&fromType=ASSET&relationType=Contains&toId={d}&toType=DEVICE");
        let al = if d == theirs { &their_alarm } else { &tenant_alarm };
        let alarms = [
            (
                "/api/alarm",
                "POST",
                "/api/alarm".into(),
                Some(
                    json!({"originator": {"entityType": "DEVICE", "id": d}, "type": "x", "severity": "MAJOR"})
                        .to_string(),
                ),
            ),
            ("/api/alarm/{id}", "GET", format!("/api/alarm/{al}"), None),
            ("/api/alarm/{id}", "DELETE", format!("/api/alarm/{al}"), None),
            ("/api/alarm/info/{id}", "GET", format!("/api/alarm/info/{al}"), None),
            ("/api/alarm/{id}/ack", "POST", format!("/api/alarm/{al}/ack"), None),
            ("/api/alarm/{id}/clear", "POST", format!("/api/alarm/{al}/clear"), None),
            ("/api/alarm/{id}/assign/{user}", "POST", format!("/api/alarm/{al}/assign/{ann}"), None),
            ("/api/alarm/{id}/assign", "DELETE", format!("/api/alarm/{al}/assign"), None),
            ("/api/alarm/{id}/comment", "GET", format!("/api/alarm/{al}/comment?pageSize=10&page=0"), None),
            (
                "/api/alarm/{id}/comment",
                "POST",
                format!("/api/alarm/{al}/comment"),
                Some(r#"{"comment":{"text":"evil"}}"#.into()),
            ),
            ("/api/alarm/{id}/comment/{comment}", "DELETE", format!("/api/alarm/{al}/comment/{al}"), None),
            ("/api/alarm/{id}/{entityId}", "GET", format!("/api/alarm/DEVICE/{d}?pageSize=10&page=0"), None),
            (
                "/api/v2/alarm/{entityType}/{entityId}",
                "GET",
                format!("/api/v2/alarm/DEVICE/{d}?pageSize=10&page=0"),
                None,
            ),
            (
                "/api/alarm/highestSeverity/{entityType}/{entityId}",
                "GET",
                format!("/api/alarm/highestSeverity/DEVICE/{d}"),
                None,
            ),
            ("/api/users/assign/{id}", "GET", format!("/api/users/assign/{al}?pageSize=10&page=0"), None),
            ("/api/notification/{kind}", "GET", "/api/notification/targets?pageSize=10&page=0".into(), None),
            (
                "/api/notification/{kind}",
                "POST",
                "/api/notification/target".into(),
                Some(
                    r#"{"name":"evil","configuration":{"type":"PLATFORM_USERS","usersFilter":{"type":"ALL_USERS"}}}"#
                        .into(),
                ),
            ),
            ("/api/notification/{kind}/{id}", "GET", format!("/api/notification/rule/{al}"), None),
            ("/api/notification/{kind}/{id}", "DELETE", format!("/api/notification/template/{al}"), None),
            ("/api/forwarding/sinks", "GET", "/api/forwarding/sinks?pageSize=10&page=0".into(), None),
            (
                "/api/forwarding/sink",
                "POST",
                "/api/forwarding/sink".into(),
                Some(r#"{"name":"evil","type":"HTTP","configuration":{"url":"http://example.com"}}"#.into()),
            ),
            ("/api/forwarding/sink/{id}", "GET", format!("/api/forwarding/sink/{al}"), None),
            ("/api/forwarding/sink/{id}", "DELETE", format!("/api/forwarding/sink/{al}"), None),
        ];
        let assets = [
            ("/api/asset", "POST", "/api/asset".into(), Some(r#"{"name":"evil"}"#.into())),
            ("/api/asset/{id}", "GET", format!("/api/asset/{x}"), None),
            ("/api/asset/{id}", "DELETE", format!("/api/asset/{mine_asset}"), None),
            ("/api/asset/info/{id}", "GET", format!("/api/asset/info/{x}"), None),
            ("/api/asset/types", "GET", "/api/asset/types".into(), None),
            ("/api/assets", "POST", "/api/assets".into(), Some(query.clone())),
            ("/api/tenant/assets", "GET", "/api/tenant/assets?pageSize=10&page=0".into(), None),
            ("/api/tenant/asset", "GET", "/api/tenant/asset?assetName=asset-B".into(), None),
            ("/api/tenant/assetInfos", "GET", "/api/tenant/assetInfos?pageSize=10&page=0".into(), None),
            ("/api/assetInfos/all", "GET", "/api/assetInfos/all?pageSize=10&page=0".into(), None),
            ("/api/customer/{customer}/assets", "GET", format!("/api/customer/{b}/assets?pageSize=10&page=0"), None),
            (
                "/api/customer/{customer}/assetInfos",
                "GET",
                format!("/api/customer/{b}/assetInfos?pageSize=10&page=0"),
                None,
            ),
            ("/api/customer/{customer}/asset/{asset}", "POST", format!("/api/customer/{a}/asset/{x}"), None),
            ("/api/customer/asset/{asset}", "DELETE", format!("/api/customer/asset/{mine_asset}"), None),
            ("/api/assetProfile", "POST", "/api/assetProfile".into(), Some(r#"{"name":"evil"}"#.into())),
            ("/api/assetProfile/names", "GET", "/api/assetProfile/names".into(), None),
            ("/api/assetProfile/{id}", "GET", format!("/api/assetProfile/{x}"), None),
            ("/api/assetProfile/{id}", "DELETE", format!("/api/assetProfile/{x}"), None),
            ("/api/assetProfile/{id}/default", "POST", format!("/api/assetProfile/{x}/default"), None),
            ("/api/assetProfileInfo/{id}", "GET", "/api/assetProfileInfo/default".into(), None),
            ("/api/assetProfiles", "GET", "/api/assetProfiles?pageSize=10&page=0".into(), None),
            ("/api/assetProfileInfos", "GET", "/api/assetProfileInfos?pageSize=10&page=0".into(), None),
            ("/api/assetProfileInfos/list", "GET", format!("/api/assetProfileInfos/list?assetProfileIds={x}"), None),
            ("/api/relation", "GET", format!("/api/relation?{relation}"), None),
            ("/api/v2/relation", "POST", "/api/v2/relation".into(), Some("{}".into())),
            ("/api/v2/relation", "DELETE", format!("/api/v2/relation?{relation}"), None),
            ("/api/relations", "DELETE", format!("/api/relations?entityId={mine_asset}&entityType=ASSET"), None),
            ("/api/relations", "POST", "/api/relations".into(), Some(query.clone())),
            ("/api/relations/info", "GET", format!("/api/relations/info?fromId={x}&fromType=ASSET"), None),
            ("/api/relations/info", "POST", "/api/relations/info".into(), Some(query)),
            ("/api/relations/from/{from_type}/{from_id}", "GET", format!("/api/relations/from/ASSET/{x}"), None),
            (
                "/api/relations/from/{from_type}/{from_id}/{relation_type}",
                "GET",
                format!("/api/relations/from/ASSET/{x}/Contains"),
                None,
            ),
            ("/api/relations/to/{to_type}/{to_id}", "GET", format!("/api/relations/to/DEVICE/{d}"), None),
            (
                "/api/relations/to/{to_type}/{to_id}/{relation_type}",
                "GET",
                format!("/api/relations/to/DEVICE/{d}/Contains"),
                None,
            ),
            (
                "/api/relations/info/from/{from_type}/{from_id}",
                "GET",
                format!("/api/relations/info/from/ASSET/{x}"),
                None,
            ),
            ("/api/relations/info/to/{to_type}/{to_id}", "GET", format!("/api/relations/info/to/DEVICE/{d}"), None),
            ("/api/customer/{customer}/deviceInfos", "GET", format!("/api/customer/{b}/deviceInfos?pageSize=10&page=0"), None),
            ("/api/customer/info/{id}", "GET", format!("/api/customer/info/{b}"), None),
            ("/api/customer/{id}/title", "GET", format!("/api/customer/{b}/title"), None),
            ("/api/customer/{id}/shortInfo", "GET", format!("/api/customer/{b}/shortInfo"), None),
            ("/api/customers/list", "GET", format!("/api/customers/list?customerIds={b}"), None),
            ("/api/device/info/{id}", "GET", format!("/api/device/info/{d}"), None),
            ("/api/devices", "POST", "/api/devices".into(), Some(json!({"parameters": {"rootId": x, "rootType": "ASSET", "direction": "FROM"}, "relationType": "Contains"}).to_string())),
            ("/api/devices/count/{ota_type}/{profile}", "GET", format!("/api/devices/count/FIRMWARE/{x}"), None),
            ("/api/deviceProfile/devices/keys/timeseries", "GET", "/api/deviceProfile/devices/keys/timeseries".into(), None),
            ("/api/deviceProfile/devices/keys/attributes", "GET", "/api/deviceProfile/devices/keys/attributes".into(), None),
            ("/api/deviceProfileInfos/list", "GET", format!("/api/deviceProfileInfos/list?deviceProfileIds={x}"), None),
            ("/api/users/list", "GET", format!("/api/users/list?userIds={bob}"), None),
        ];
        vec![
            // (Claiming, POST, needs the device's secret: tests/claiming.rs.)
            ("/api/customer/device/{device}/claim", "DELETE", format!("/api/customer/device/{name}/claim"), None),
            ("/api/device/{id}", "GET", format!("/api/device/{d}"), None),
            ("/api/device/{id}", "DELETE", format!("/api/device/{mine}"), None),
            ("/api/device/{id}/credentials", "GET", format!("/api/device/{d}/credentials"), None),
            ("/api/device", "POST", "/api/device".into(), Some(r#"{"name":"evil","type":"default"}"#.into())),
            (
                "/api/device/credentials",
                "POST",
                "/api/device/credentials".into(),
                Some(
                    json!({"deviceId": {"id": d}, "credentialsType": "ACCESS_TOKEN", "credentialsId": "STOLEN"})
                        .to_string(),
                ),
            ),
            ("/api/device/bulk_import", "POST", "/api/device/bulk_import".into(), Some("{}".into())),
            ("/api/device-with-credentials", "POST", "/api/device-with-credentials".into(), Some("{}".into())),
            ("/api/tenant/devices", "GET", "/api/tenant/devices?pageSize=10&page=0".into(), None),
            ("/api/tenant/device", "GET", format!("/api/tenant/device?deviceName={name}"), None),
            ("/api/tenant/deviceInfos", "GET", "/api/tenant/deviceInfos?pageSize=10&page=0".into(), None),
            ("/api/device/types", "GET", "/api/device/types".into(), None),
            ("/api/deviceInfos/all", "GET", "/api/deviceInfos/all?pageSize=10&page=0".into(), None),
            ("/api/otaPackage", "POST", "/api/otaPackage".into(), Some(r#"{"title":"evil"}"#.into())),
            ("/api/otaPackage/{id}", "GET", format!("/api/otaPackage/{d}"), None),
            ("/api/otaPackage/{id}", "POST", format!("/api/otaPackage/{d}"), Some("evil".into())),
            ("/api/otaPackage/{id}", "DELETE", format!("/api/otaPackage/{d}"), None),
            ("/api/otaPackage/info/{id}", "GET", format!("/api/otaPackage/info/{d}"), None),
            ("/api/otaPackage/{id}/download", "GET", format!("/api/otaPackage/{d}/download"), None),
            ("/api/otaPackages", "GET", "/api/otaPackages?pageSize=10&page=0".into(), None),
            (
                "/api/otaPackages/{profile}/{type}",
                "GET",
                format!("/api/otaPackages/{d}/FIRMWARE?pageSize=10&page=0"),
                None,
            ),
            ("/api/customer", "POST", "/api/customer".into(), Some(r#"{"title":"C"}"#.into())),
            ("/api/customer/{id}", "GET", format!("/api/customer/{b}"), None),
            ("/api/customer/{id}", "DELETE", format!("/api/customer/{a}"), None),
            ("/api/customers", "GET", "/api/customers?pageSize=10&page=0".into(), None),
            ("/api/tenant/customers", "GET", "/api/tenant/customers?customerTitle=B".into(), None),
            ("/api/customer/{customer}/device/{device}", "POST", format!("/api/customer/{a}/device/{d}"), None),
            ("/api/customer/device/{device}", "DELETE", format!("/api/customer/device/{mine}"), None),
            (
                "/api/owner/{kind}/{owner}/{entity_type}/{entity}",
                "POST",
                format!("/api/owner/CUSTOMER/{a}/DEVICE/{d}"),
                None,
            ),
            ("/api/customer/{customer}/devices", "GET", format!("/api/customer/{b}/devices?pageSize=10&page=0"), None),
            (
                "/api/customer/{customer}/dashboard/{dashboard}",
                "POST",
                format!("/api/customer/{a}/dashboard/{dash_b}"),
                None,
            ),
            (
                "/api/customer/{customer}/dashboard/{dashboard}",
                "DELETE",
                format!("/api/customer/{a}/dashboard/{dash_a}"),
                None,
            ),
            (
                "/api/customer/{customer}/dashboards",
                "GET",
                format!("/api/customer/{b}/dashboards?pageSize=10&page=0"),
                None,
            ),
            ("/api/customer/{customer}/users", "GET", format!("/api/customer/{a}/users?pageSize=10&page=0"), None),
            ("/api/dashboard", "POST", "/api/dashboard".into(), Some(r#"{"title":"evil"}"#.into())),
            ("/api/dashboard/{id}", "GET", format!("/api/dashboard/{dash_b}"), None),
            ("/api/dashboard/{id}", "DELETE", format!("/api/dashboard/{dash_a}"), None),
            ("/api/dashboard/info/{id}", "GET", format!("/api/dashboard/info/{dash_b}"), None),
            ("/api/tenant/dashboards", "GET", "/api/tenant/dashboards?pageSize=10&page=0".into(), None),
            ("/api/deviceProfiles", "GET", "/api/deviceProfiles?pageSize=10&page=0".into(), None),
            ("/api/deviceProfileInfos", "GET", "/api/deviceProfileInfos?pageSize=10&page=0".into(), None),
            ("/api/deviceProfile", "POST", "/api/deviceProfile".into(), Some(r#"{"name":"evil"}"#.into())),
            ("/api/deviceProfile/names", "GET", "/api/deviceProfile/names".into(), None),
            ("/api/deviceProfile/{id}", "GET", format!("/api/deviceProfile/{d}"), None),
            ("/api/deviceProfile/{id}", "DELETE", format!("/api/deviceProfile/{d}"), None),
            ("/api/deviceProfile/{id}/default", "POST", format!("/api/deviceProfile/{d}/default"), None),
            ("/api/deviceProfileInfo/default", "GET", "/api/deviceProfileInfo/default".into(), None),
            ("/api/deviceProfileInfo/{id}", "GET", format!("/api/deviceProfileInfo/{d}"), None),
            (
                "/api/user",
                "POST",
                "/api/user".into(),
                Some(r#"{"email":"evil@x.y","authority":"TENANT_ADMIN"}"#.into()),
            ),
            ("/api/user/{id}", "GET", format!("/api/user/{bob}"), None),
            ("/api/user/{id}", "DELETE", format!("/api/user/{bob}"), None),
            ("/api/user/{id}/activationLink", "GET", format!("/api/user/{bob}/activationLink"), None),
            ("/api/user/{id}/activationLinkInfo", "GET", format!("/api/user/{bob}/activationLinkInfo"), None),
            ("/api/users", "GET", "/api/users?pageSize=10&page=0".into(), None),
            ("/api/apiKey", "POST", "/api/apiKey".into(), Some(json!({"userId": {"id": admin_id}}).to_string())),
            ("/api/apiKeys/{user}", "GET", format!("/api/apiKeys/{admin_id}?pageSize=10&page=0"), None),
            ("/api/relation", "POST", "/api/relation".into(), Some("{}".into())),
            ("/api/relation", "DELETE", "/api/relation".into(), None),
            ("/api/relations", "GET", format!("/api/relations?fromId={d}&fromType=DEVICE"), None),
            (
                "/api/mqtt/clients",
                "POST",
                "/api/mqtt/clients".into(),
                Some(r#"{"username":"evil","password":"p"}"#.into()),
            ),
            ("/api/mqtt/clients", "GET", "/api/mqtt/clients".into(), None),
            ("/api/mqtt/clients/{username}", "GET", "/api/mqtt/clients/app".into(), None),
            ("/api/mqtt/clients/{username}", "DELETE", "/api/mqtt/clients/app".into(), None),
            ("/api/tenant", "POST", "/api/tenant".into(), Some(r#"{"title":"evil"}"#.into())),
            ("/api/tenant/{id}", "GET", format!("/api/tenant/{tenant}"), None),
            ("/api/tenant/{id}", "DELETE", format!("/api/tenant/{tenant}"), None),
            ("/api/tenant/{id}/users", "GET", format!("/api/tenant/{tenant}/users?pageSize=10&page=0"), None),
            ("/api/tenants", "GET", "/api/tenants?pageSize=10&page=0".into(), None),
            ("/api/tenantProfile", "POST", "/api/tenantProfile".into(), Some(r#"{"name":"evil"}"#.into())),
            ("/api/tenantProfile/{id}", "GET", format!("/api/tenantProfile/{tenant}"), None),
            ("/api/tenantProfile/{id}", "DELETE", format!("/api/tenantProfile/{tenant}"), None),
            ("/api/tenantProfile/{id}/default", "POST", format!("/api/tenantProfile/{tenant}/default"), None),
            ("/api/tenantProfileInfo/{id}", "GET", format!("/api/tenantProfileInfo/{tenant}"), None),
            ("/api/tenantProfileInfo/default", "GET", "/api/tenantProfileInfo/default".into(), None),
            ("/api/tenantProfiles", "GET", "/api/tenantProfiles?pageSize=10&page=0".into(), None),
            ("/api/tenantProfileInfos", "GET", "/api/tenantProfileInfos?pageSize=10&page=0".into(), None),
            ("/api/tenantProfiles/list", "GET", format!("/api/tenantProfiles/list?ids={tenant}"), None),
        ]
        .into_iter()
        .chain(device_data_routes(d))
        .chain(assets)
        .chain(alarms)
        .collect()
    };
    let per_key = [
        // A key of another user is 403 (below).
        "/api/apiKey/{id}",
        "/api/apiKey/{id}/enabled/{enabled}",
        "/api/apiKey/{id}/description",
        // Lists of the caller's own customer's alarms (above).
        "/api/alarms",
        "/api/v2/alarms",
        "/api/alarm/types",
        "/api/alarmsQuery/find",
        "/api/alarmsQuery/count",
        // The caller's own inbox.
        "/api/notifications",
        "/api/notifications/unread/count",
        "/api/notifications/read",
    ];
    let checked: std::collections::HashSet<&str> = forbidden(&theirs).iter().map(|r| r.0).collect();
    for route in server_routes() {
        assert!(
            checked.contains(route.as_str())
                || per_key.contains(&route.as_str())
                || OPEN_ROUTES.contains(&route.as_str()),
            "route {route} is not tried by this isolation test: add it to `forbidden` (or OPEN_ROUTES)"
        );
    }
    for target in [&theirs, &tenants] {
        for (_, m, path, body) in forbidden(target) {
            let (st, out) = s.req(m, &path, Some(&ann_jwt), body.as_deref());
            assert_eq!(st, 403, "{m} {path}: {out}");
            for secret in ["THEIRS", "TENANTTOKEN", "value-of", "shared-secret", "dash-B", "bob@", "asset-B", "asset-T"]
            {
                assert!(!out.contains(secret), "{m} {path} leaked {secret}: {out}");
            }
        }
    }
    // Nothing changed: the other devices' data and tokens are as they were.
    for d in [&theirs, &tenants] {
        let (_, v) = s.json("GET", &format!("{}/values/attributes/SHARED_SCOPE", tel(d)), &jwt, None);
        assert_eq!(v[0]["value"], "shared-secret", "{v}");
    }
    assert_eq!(s.telemetry("THEIRSTOKEN1", r#"{"still":1}"#), 200);
    assert_eq!(s.json("GET", &format!("/api/dashboard/{dash_a}"), &jwt, None).0, 200);

    // API keys act as their user: a customer user's key reaches what the user reaches.
    let (st, key) = s.json("POST", "/api/apiKey", &ann_jwt, Some(json!({"description": "ann's"})));
    assert_eq!(st, 200, "{key}");
    let value = key["value"].as_str().unwrap();
    let with_key = |path: &str| {
        let resp = ureq::get(&format!("{}{path}", s.base)).set("X-Authorization", &format!("ApiKey {value}")).call();
        match resp {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(with_key(&format!("/api/device/{mine}")), 200);
    assert_eq!(with_key(&format!("/api/device/{theirs}")), 403);
    assert_eq!(with_key("/api/tenant/devices?pageSize=10&page=0"), 403);
    let (_, admin_key) = s.json("POST", "/api/apiKey", &jwt, Some(json!({"description": "admin's"})));
    let admin_key_id = admin_key["id"]["id"].as_str().unwrap();
    // (A body only where the path reads one: the server closes a keep-alive connection
    // whose body it did not read, which the test's pooled client would then reuse.)
    for (m, path, body) in [
        ("DELETE", format!("/api/apiKey/{admin_key_id}"), None),
        ("PUT", format!("/api/apiKey/{admin_key_id}/enabled/false"), None),
        ("PUT", format!("/api/apiKey/{admin_key_id}/description"), Some("\"x\"")),
    ] {
        assert_eq!(s.req(m, &path, Some(&ann_jwt), body).0, 403, "{m} {path}");
    }

    // Taken from its customer, the device is out of reach at once.
    assert_eq!(s.json("DELETE", &format!("/api/customer/device/{mine}"), &jwt, None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/device/{mine}"), &ann_jwt, None).0, 403);
    assert_eq!(with_key(&format!("/api/device/{mine}")), 403);
}
