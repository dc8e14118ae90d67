//! Bounds on making devices and on probing credentials, on the real binary: provisioning per
//! device profile (`limits.max_provisions_per_minute`; its key and secret ship in firmware),
//! devices per tenant however made (`limits.max_devices_per_tenant`), and the throttle on
//! answers that say a credential unique across tenants is taken.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::mqtt::*;
use common::*;

fn provision_profile(s: &Server, jwt: &str, key: &str) {
    let strategy = "ALLOW_CREATE_NEW_DEVICES";
    let body = json!({
        "name": key, "provisionType": strategy, "provisionDeviceKey": key,
        "profileData": {"provisionConfiguration": {"type": strategy, "provisionDeviceSecret": "s3cret"}},
    });
    let (st, p) = s.json("POST", "/api/deviceProfile", jwt, Some(body));
    assert_eq!(st, 200, "{p}");
}

fn provision(s: &Server, key: &str, name: &str) -> J {
    let body = json!({"deviceName": name, "provisionDeviceKey": key, "provisionDeviceSecret": "s3cret"});
    let (st, text) = s.req("POST", "/api/v1/provision", None, Some(&body.to_string()));
    assert_eq!(st, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn device_count(s: &Server, jwt: &str) -> i64 {
    s.json("GET", "/api/tenant/devices?pageSize=1&page=0", jwt, None).1["totalElements"].as_i64().unwrap()
}

/// A flood of provisioning requests with a valid key and secret creates at most the
/// profile's allowance (2 a minute here), each refusal a ThingsBoard FAILURE saying why; another
/// profile has its own allowance.
#[test]
fn provisioning_is_throttled_per_profile() {
    let s = Server::start_env(&[("GRIDLINKS_LIMITS_MAX_PROVISIONS_PER_MINUTE", "2")]);
    let jwt = s.login();
    provision_profile(&s, &jwt, "fleet-a");
    provision_profile(&s, &jwt, "fleet-b");
    let mut created = 0;
    let mut refusal = None;
    for i in 0..20 {
        let r = provision(&s, "fleet-a", &format!("a-{i}"));
        match r["status"].as_str() {
            Some("SUCCESS") => created += 1,
            _ => refusal = Some(r),
        }
    }
    // Two at once, then one per 30 s: 20 requests cannot all pass however slow the machine.
    assert!(created < 20, "{created} devices provisioned");
    let refusal = refusal.unwrap();
    assert_eq!(refusal["status"], "FAILURE", "{refusal}");
    assert!(refusal["errorMsg"].as_str().unwrap().contains("max_provisions_per_minute"), "{refusal}");
    assert_eq!(device_count(&s, &jwt), created);
    assert_eq!(provision(&s, "fleet-b", "b-0")["status"], "SUCCESS");
}

/// `limits.max_devices_per_tenant` holds for REST, bulk import, provisioning and gateways
/// alike, counts per tenant, and a deleted device frees its place.
#[test]
fn devices_per_tenant_are_bounded_however_they_are_made() {
    let s = Server::start_env(&[("GRIDLINKS_LIMITS_MAX_DEVICES_PER_TENANT", "3")]);
    let jwt = s.login();
    provision_profile(&s, &jwt, "fleet");
    s.gateway(&jwt, "gw", "GW");
    let first = s.device(&jwt, "d1", "D1");
    assert_eq!(provision(&s, "fleet", "p1")["status"], "SUCCESS");
    // Full: every way of making a device is refused, saying which limit.
    let (st, e) = s.json("POST", "/api/device", &jwt, Some(json!({"name": "d2"})));
    assert_eq!((st, &e["errorCode"]), (403, &json!(41)), "ThingsBoard's ENTITIES_LIMIT_EXCEEDED: {e}");
    assert!(e["message"].as_str().unwrap().contains("max_devices_per_tenant"), "{e}");
    let refusal = provision(&s, "fleet", "p2");
    assert_eq!(refusal["status"], "FAILURE", "{refusal}");
    assert!(refusal["errorMsg"].as_str().unwrap().contains("max_devices_per_tenant"), "{refusal}");
    let import = json!({"file": "i1\n", "mapping": {"columns": [{"type": "NAME"}], "delimiter": ",", "update": false, "header": false}});
    let (_, r) = s.json("POST", "/api/device/bulk_import", &jwt, Some(import.clone()));
    assert_eq!((r["created"].as_i64(), r["errors"].as_i64()), (Some(0), Some(1)), "{r}");
    let (mut g, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("GW"), 60);
    g.publish("v1/gateway/telemetry", br#"{"sub":{"x":1}}"#, QoS::AtLeastOnce, Some(1));
    match g.recv() {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason, reason::QUOTA_EXCEEDED),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    assert_eq!(device_count(&s, &jwt), 3);
    // Updates are not new devices.
    let (_, mut d) = s.json("GET", &format!("/api/device/{first}"), &jwt, None);
    d["label"] = json!("still fits");
    assert_eq!(s.json("POST", "/api/device", &jwt, Some(d)).0, 200);
    // A deleted device frees its place.
    assert_eq!(s.json("DELETE", &format!("/api/device/{first}"), &jwt, None).0, 200);
    let (_, r) = s.json("POST", "/api/device/bulk_import", &jwt, Some(import));
    assert_eq!(r["created"].as_i64(), Some(1), "{r}");
    // Another tenant has its own bound.
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let (_, t) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta"})));
    let body = json!({"email": "admin@beta.test", "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": t["id"]["id"]}});
    let beta = s.activated_user(&sys, body, "beta-secret").1;
    s.device(&beta, "beta-1", "BETA1");
}

/// Access tokens and MQTT user names are unique across tenants, so "taken" tells another
/// tenant that one exists; such answers are throttled (2 free here), after which the tenant's
/// requests naming credentials get 429 whether the credential exists or not.
#[test]
fn answers_that_a_credential_is_taken_are_throttled() {
    let s = Server::start_env(&[("GRIDLINKS_AUTH_LOGIN_FREE_ATTEMPTS", "2")]);
    let alpha = s.login();
    s.device(&alpha, "pump", "ALPHA-SECRET-TOKEN");
    let app = json!({"username": "alpha-app", "password": "pw", "publish": ["#"], "subscribe": ["#"]});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &alpha, Some(app)).0, 200);
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let (_, t) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta"})));
    let body = json!({"email": "admin@beta.test", "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": t["id"]["id"]}});
    let beta = s.activated_user(&sys, body, "beta-secret").1;

    let taken =
        |name: &str| s.json("POST", "/api/device?accessToken=ALPHA-SECRET-TOKEN", &beta, Some(json!({"name": name}))).0;
    assert_eq!(taken("probe-0"), 400, "the first answers say it is taken");
    let stolen_name = json!({"username": "alpha-app", "password": "x"});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &beta, Some(stolen_name.clone())).0, 400);
    // Each further "taken" makes the next wait longer (1 s, 2 s, 4 s …): a 429 comes.
    let mut statuses = Vec::new();
    for i in 1..12 {
        let st = taken(&format!("probe-{i}"));
        statuses.push(st);
        if st == 429 {
            break;
        }
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    // While it waits, naming any credential is refused alike: taken or not, nothing is learnt.
    let (st, fresh) = s.json("POST", "/api/device?accessToken=NOBODY-HAS-THIS", &beta, Some(json!({"name": "honest"})));
    assert_eq!(st, 429, "{fresh}");
    assert_eq!(s.json("POST", "/api/mqtt/clients", &beta, Some(stolen_name)).0, 429);
    // Other tenants are not held up (from the same address too), nor requests that name no
    // credential.
    assert_eq!(s.json("POST", "/api/device", &beta, Some(json!({"name": "no-token"}))).0, 200);
    s.device(&alpha, "valve", "ALPHA-VALVE");
}
