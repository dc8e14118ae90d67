//! Tenants on the real binary: the system administrator creates a tenant and its
//! administrator; the two tenants' administrators then try every REST path of the server on
//! each other's ids (403 or 404, never data), their lists show only their own, the same
//! device name lives in both, each tenant's MQTT clients live in their own broker namespace
//! (topics, client ids, retained messages, canonical device topics), and deleting the
//! tenant ends its users' tokens, its devices' tokens and its MQTT clients.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::mqtt::*;
use common::*;

const NULL_UUID: &str = "13814000-1dd2-11b2-8080-808080808080";

#[test]
fn tenants_see_nothing_of_each_other() {
    let s = Server::start();
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let alpha = s.login();

    // The system administrator manages tenants and sees no tenant's data; tenant
    // administrators do not manage tenants.
    let (st, beta_tenant) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta", "city": "Lviv"})));
    assert_eq!(st, 200, "{beta_tenant}");
    assert_eq!((beta_tenant["title"].as_str(), beta_tenant["city"].as_str()), (Some("Beta"), Some("Lviv")));
    let beta_id = beta_tenant["id"]["id"].as_str().unwrap().to_owned();
    let (_, me) = s.json("GET", "/api/auth/user", &alpha, None);
    let alpha_id = me["tenantId"]["id"].as_str().unwrap().to_owned();
    let (_, tenants) = s.json("GET", "/api/tenants?pageSize=10&page=0", &sys, None);
    assert_eq!(tenants["totalElements"], 2, "{tenants}");
    for (m, path) in [
        ("GET", "/api/tenant/devices?pageSize=10&page=0".to_owned()),
        ("POST", "/api/device".to_owned()),
        ("GET", "/api/customers?pageSize=10&page=0".to_owned()),
    ] {
        assert_eq!(s.req(m, &path, Some(&sys), Some("{}")).0, 403, "sysadmin {m} {path}");
    }
    assert_eq!(s.json("POST", "/api/tenant", &alpha, Some(json!({"title": "Evil"}))).0, 403);
    assert_eq!(s.json("GET", "/api/tenants?pageSize=10&page=0", &alpha, None).0, 403);
    assert_eq!(s.json("GET", &format!("/api/tenant/{beta_id}"), &alpha, None).0, 403);
    assert_eq!(s.json("GET", &format!("/api/tenant/{alpha_id}"), &alpha, None).0, 200, "its own");
    assert_eq!(s.json("DELETE", &format!("/api/tenant/{alpha_id}"), &sys, None).0, 400, "the first tenant stays");
    // A tenant administrator creates users in its own tenant only, whatever tenantId says.
    let evil = json!({"email": "evil@x.y", "authority": "TENANT_ADMIN", "tenantId": {"id": beta_id}});
    let (_, made) = s.json("POST", "/api/user", &alpha, Some(evil));
    assert_eq!(made["tenantId"]["id"].as_str(), Some(&*alpha_id), "{made}");

    // Beta's administrator, created by the system administrator.
    let body = json!({"email": "boss@beta.test", "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": beta_id}});
    let (boss_id, beta) = s.activated_user(&sys, body, "beta-secret");
    let (_, claims_user) = s.json("GET", "/api/auth/user", &beta, None);
    assert_eq!(claims_user["tenantId"]["id"].as_str(), Some(&*beta_id));
    let (_, admins) = s.json("GET", &format!("/api/tenant/{beta_id}/users?pageSize=10&page=0"), &sys, None);
    assert_eq!(admins["data"][0]["email"], "boss@beta.test");
    assert_eq!(s.json("GET", &format!("/api/tenant/{beta_id}/users?pageSize=10&page=0"), &alpha, None).0, 403);

    // Each tenant fills itself: the same device name in both, tokens unique everywhere.
    let a_pump = s.device(&alpha, "pump", "ALPHAPUMP");
    let b_pump = s.device(&beta, "pump", "BETAPUMP");
    assert_eq!(s.json("POST", "/api/device?accessToken=ALPHAPUMP", &beta, Some(json!({"name": "p2"}))).0, 400);
    let a_cust = s.customer(&alpha, "Acme");
    let b_cust = s.customer(&beta, "Acme");
    let (_, a_dash) = s.json("POST", "/api/dashboard", &alpha, Some(json!({"title": "alpha-dash"})));
    let a_dash = a_dash["id"]["id"].as_str().unwrap().to_owned();
    let (_, b_dash) = s.json("POST", "/api/dashboard", &beta, Some(json!({"title": "beta-dash"})));
    let b_dash = b_dash["id"]["id"].as_str().unwrap().to_owned();
    let (_, a_prof) = s.json("POST", "/api/deviceProfile", &alpha, Some(json!({"name": "alpha-profile"})));
    let a_prof = a_prof["id"]["id"].as_str().unwrap().to_owned();
    let (_, b_prof) = s.json("GET", "/api/deviceProfileInfo/default", &beta, None);
    assert_eq!(b_prof["name"], "default", "a new tenant starts with its default profile");
    let (a_user, _) = s.user(&alpha, "cu@alpha.test", Some(&a_cust), "alpha-cu-pw");
    let ota = json!({"title": "alpha-fw", "version": "1", "type": "FIRMWARE",
        "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": a_prof}});
    let (st, a_ota) = s.json("POST", "/api/otaPackage", &alpha, Some(ota));
    assert_eq!(st, 200, "{a_ota}");
    let a_ota = a_ota["id"]["id"].as_str().unwrap().to_owned();
    let asset = |jwt: &str, name: &str, t: &str| {
        let (st, a) = s.json("POST", "/api/asset", jwt, Some(json!({"name": name, "type": t})));
        assert_eq!(st, 200, "{a}");
        (a["id"]["id"].as_str().unwrap().to_owned(), a["assetProfileId"]["id"].as_str().unwrap().to_owned())
    };
    let (a_asset, a_aprof) = asset(&alpha, "alpha-asset", "alpha-type");
    let (b_asset, _) = asset(&beta, "beta-asset", "beta-type");
    let contains = json!({"from": {"entityType": "ASSET", "id": a_asset}, "to": {"entityType": "DEVICE", "id": a_pump},
        "type": "Contains"});
    assert_eq!(s.json("POST", "/api/v2/relation", &alpha, Some(contains)).0, 200);
    let leak = json!({"originator": {"entityType": "DEVICE", "id": a_pump}, "type": "alpha-leak", "severity": "MAJOR"});
    let (st, a_alarm) = s.json("POST", "/api/alarm", &alpha, Some(leak));
    assert_eq!(st, 200, "{a_alarm}");
    let a_alarm = a_alarm["id"]["id"].as_str().unwrap().to_owned();
    let (_, a_comment) = s.json(
        "POST",
        &format!("/api/alarm/{a_alarm}/comment"),
        &alpha,
        Some(json!({"comment": {"text": "alpha-note"}})),
    );
    let a_comment = a_comment["id"]["id"].as_str().unwrap().to_owned();
    let note = |what: &str, body: J| {
        let (st, v) = s.json("POST", &format!("/api/notification/{what}"), &alpha, Some(body));
        assert_eq!(st, 200, "{v}");
        v["id"]["id"].as_str().unwrap().to_owned()
    };
    let a_target = note(
        "target",
        json!({"name": "alpha-target", "configuration": {"type": "PLATFORM_USERS", "usersFilter": {"type": "TENANT_ADMINISTRATORS"}}}),
    );
    let a_template = note(
        "template",
        json!({"name": "alpha-template", "notificationType": "ALARM",
        "configuration": {"deliveryMethodsTemplates": {"WEB": {"enabled": true, "subject": "alpha-subject", "body": "${alarmType}"}}}}),
    );
    let a_rule = note(
        "rule",
        json!({"name": "alpha-rule", "templateId": {"id": a_template}, "triggerType": "ALARM",
        "triggerConfig": {"triggerType": "ALARM", "notifyOn": ["CREATED"]},
        "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"0": [a_target]}}}),
    );
    let note_leak =
        json!({"originator": {"entityType": "DEVICE", "id": a_pump}, "type": "alpha-notified", "severity": "MINOR"});
    assert_eq!(s.json("POST", "/api/alarm", &alpha, Some(note_leak)).0, 200);
    let mut a_request = String::new();
    wait_until("alpha's notification", || {
        let (_, r) = s.json("GET", "/api/notification/requests?pageSize=10&page=0", &alpha, None);
        a_request = r["data"][0]["id"]["id"].as_str().unwrap_or_default().to_owned();
        !a_request.is_empty()
    });
    let mut a_note = String::new();
    wait_until("alpha's inbox", || {
        let (_, n) = s.json("GET", "/api/notifications?pageSize=10&page=0", &alpha, None);
        a_note = n["data"][0]["id"]["id"].as_str().unwrap_or_default().to_owned();
        !a_note.is_empty()
    });
    let a_sink = {
        let body = json!({"name": "alpha-sink", "type": "HTTP", "enabled": false,
            "configuration": {"url": "http://192.0.2.1/alpha", "secret": "alpha-secret"}});
        let (st, v) = s.json("POST", "/api/forwarding/sink", &alpha, Some(body));
        assert_eq!(st, 200, "{v}");
        v["id"]["id"].as_str().unwrap().to_owned()
    };
    let (_, a_key) = s.json("POST", "/api/apiKey", &alpha, Some(json!({"description": "alpha-key"})));
    let a_key = a_key["id"]["id"].as_str().unwrap().to_owned();
    for (jwt, token) in [(&alpha, "ALPHAPUMP"), (&beta, "BETAPUMP")] {
        let _ = jwt;
        assert_eq!(s.telemetry(token, &json!({"secret": format!("value-of-{token}")}).to_string()), 200);
    }
    let attrs = json!({"attr": "alpha-secret"}).to_string();
    let tel = |d: &str| format!("/api/plugins/telemetry/DEVICE/{d}");
    assert_eq!(s.req("POST", &format!("{}/attributes/SHARED_SCOPE", tel(&a_pump)), Some(&alpha), Some(&attrs)).0, 200);
    let asset_tel = format!("/api/plugins/telemetry/ASSET/{a_asset}/timeseries/ANY");
    assert_eq!(s.req("POST", &asset_tel, Some(&alpha), Some(r#"{"secret":"value-of-alpha-asset"}"#)).0, 200);

    let app = json!({"username": "app", "password": "app-pw", "subscribe": ["#"], "publish": ["#"]});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &alpha, Some(app)).0, 200);

    // Lists show only the caller's tenant.
    let names = |jwt: &str, path: &str, field: &str| -> Vec<String> {
        let (st, p) = s.json("GET", path, jwt, None);
        assert_eq!(st, 200, "{path}: {p}");
        p["data"].as_array().unwrap().iter().map(|d| d[field].as_str().unwrap_or_default().to_owned()).collect()
    };
    let page = "pageSize=100&page=0";
    assert_eq!(names(&beta, &format!("/api/tenant/devices?{page}"), "name"), ["pump"]);
    assert_eq!(names(&beta, &format!("/api/tenant/deviceInfos?{page}"), "name"), ["pump"]);
    let (_, types) = s.json("GET", "/api/device/types", &beta, None);
    assert_eq!(
        types,
        json!([{"tenantId": {"entityType": "TENANT", "id": beta_id}, "entityType": "DEVICE", "type": "sensor"}])
    );
    assert_eq!(names(&beta, &format!("/api/customers?{page}"), "title"), ["Acme"]);
    assert_eq!(names(&beta, &format!("/api/tenant/dashboards?{page}"), "title"), ["beta-dash"]);
    assert_eq!(names(&beta, &format!("/api/deviceProfileInfos?{page}"), "name"), ["default", "sensor"]);
    assert_eq!(names(&beta, &format!("/api/users?{page}"), "email"), ["boss@beta.test"]);
    for list in ["/api/alarms", "/api/v2/alarms", "/api/alarm/types"] {
        assert_eq!(names(&beta, &format!("{list}?{page}"), "type"), Vec::<String>::new(), "{list}");
    }
    let every_device =
        json!({"entityFilter": {"type": "entityType", "entityType": "DEVICE"}, "pageLink": {"pageSize": 10}});
    let (_, found) = s.json("POST", "/api/alarmsQuery/find", &beta, Some(every_device));
    assert_eq!(found["totalElements"], 0, "{found}");
    assert_eq!(s.json("POST", "/api/alarmsQuery/count", &beta, Some(json!({}))).1, 0);
    let (_, found) = s.json("GET", "/api/tenant/devices?deviceName=pump", &beta, None);
    assert_eq!(found["id"]["id"].as_str(), Some(&*b_pump));
    let (_, found) = s.json("GET", "/api/tenant/customers?customerTitle=Acme", &beta, None);
    assert_eq!(found["id"]["id"].as_str(), Some(&*b_cust));

    // Every route, tried by Beta's administrator with Alpha's ids.
    let mut tried: Vec<Tried> = device_data_routes(&a_pump);
    tried.extend([
        ("/api/device/{id}", "GET", format!("/api/device/{a_pump}"), None),
        ("/api/device/{id}", "DELETE", format!("/api/device/{a_pump}"), None),
        ("/api/device/{id}/credentials", "GET", format!("/api/device/{a_pump}/credentials"), None),
        ("/api/device", "POST", "/api/device".into(), Some(json!({"id": {"id": a_pump}, "name": "stolen"}).to_string())),
        (
            "/api/device-with-credentials",
            "POST",
            "/api/device-with-credentials".into(),
            Some(json!({"device": {"id": {"id": a_pump}, "name": "stolen"}, "credentials": {"credentialsType": "ACCESS_TOKEN", "credentialsId": "STOLEN"}}).to_string()),
        ),
        (
            "/api/device/credentials",
            "POST",
            "/api/device/credentials".into(),
            Some(json!({"deviceId": {"id": a_pump}, "credentialsType": "ACCESS_TOKEN", "credentialsId": "STOLEN"}).to_string()),
        ),
        ("/api/customer", "POST", "/api/customer".into(), Some(json!({"id": {"id": a_cust}, "title": "stolen"}).to_string())),
        ("/api/customer/{id}", "GET", format!("/api/customer/{a_cust}"), None),
        ("/api/customer/{id}", "DELETE", format!("/api/customer/{a_cust}"), None),
        ("/api/customer/{customer}/device/{device}", "POST", format!("/api/customer/{b_cust}/device/{a_pump}"), None),
        ("/api/customer/{customer}/device/{device}", "POST", format!("/api/customer/{a_cust}/device/{b_pump}"), None),
        ("/api/customer/device/{device}", "DELETE", format!("/api/customer/device/{a_pump}"), None),
        ("/api/owner/{kind}/{owner}/{entity_type}/{entity}", "POST", format!("/api/owner/TENANT/{alpha_id}/DEVICE/{b_pump}"), None),
        ("/api/owner/{kind}/{owner}/{entity_type}/{entity}", "POST", format!("/api/owner/CUSTOMER/{a_cust}/DEVICE/{b_pump}"), None),
        ("/api/customer/{customer}/devices", "GET", format!("/api/customer/{a_cust}/devices?{page}"), None),
        ("/api/customer/{customer}/dashboard/{dashboard}", "POST", format!("/api/customer/{b_cust}/dashboard/{a_dash}"), None),
        ("/api/customer/{customer}/dashboard/{dashboard}", "DELETE", format!("/api/customer/{a_cust}/dashboard/{b_dash}"), None),
        ("/api/customer/{customer}/dashboards", "GET", format!("/api/customer/{a_cust}/dashboards?{page}"), None),
        ("/api/customer/{customer}/users", "GET", format!("/api/customer/{a_cust}/users?{page}"), None),
        ("/api/dashboard", "POST", "/api/dashboard".into(), Some(json!({"id": {"id": a_dash}, "title": "stolen"}).to_string())),
        ("/api/dashboard/{id}", "GET", format!("/api/dashboard/{a_dash}"), None),
        ("/api/dashboard/{id}", "DELETE", format!("/api/dashboard/{a_dash}"), None),
        ("/api/dashboard/info/{id}", "GET", format!("/api/dashboard/info/{a_dash}"), None),
        ("/api/deviceProfile", "POST", "/api/deviceProfile".into(), Some(json!({"id": {"id": a_prof}, "name": "stolen"}).to_string())),
        ("/api/deviceProfile/{id}", "GET", format!("/api/deviceProfile/{a_prof}"), None),
        ("/api/deviceProfile/{id}", "DELETE", format!("/api/deviceProfile/{a_prof}"), None),
        ("/api/deviceProfile/{id}/default", "POST", format!("/api/deviceProfile/{a_prof}/default"), None),
        ("/api/deviceProfileInfo/{id}", "GET", format!("/api/deviceProfileInfo/{a_prof}"), None),
        ("/api/user", "POST", "/api/user".into(), Some(json!({"id": {"id": a_user}, "email": "cu@alpha.test", "authority": "CUSTOMER_USER", "customerId": {"id": a_cust}}).to_string())),
        ("/api/user/{id}", "GET", format!("/api/user/{a_user}"), None),
        ("/api/user/{id}", "DELETE", format!("/api/user/{a_user}"), None),
        ("/api/user/{id}/activationLink", "GET", format!("/api/user/{a_user}/activationLink"), None),
        ("/api/user/{id}/activationLinkInfo", "GET", format!("/api/user/{a_user}/activationLinkInfo"), None),
        ("/api/apiKey", "POST", "/api/apiKey".into(), Some(json!({"userId": {"id": a_user}}).to_string())),
        ("/api/apiKeys/{user}", "GET", format!("/api/apiKeys/{a_user}?{page}"), None),
        ("/api/apiKey/{id}", "DELETE", format!("/api/apiKey/{a_key}"), None),
        ("/api/apiKey/{id}/enabled/{enabled}", "PUT", format!("/api/apiKey/{a_key}/enabled/false"), None),
        ("/api/apiKey/{id}/description", "PUT", format!("/api/apiKey/{a_key}/description"), Some("\"stolen\"".into())),
        ("/api/relation", "POST", "/api/relation".into(), Some(json!({"from": {"entityType": "DEVICE", "id": b_pump}, "to": {"entityType": "DEVICE", "id": a_pump}, "type": "Created"}).to_string())),
        ("/api/relation", "DELETE", format!("/api/relation?fromId={b_pump}&fromType=DEVICE&relationType=Created&toId={a_pump}&toType=DEVICE"), None),
        ("/api/relations", "GET", format!("/api/relations?toId={a_pump}&toType=DEVICE"), None),
        ("/api/tenant", "POST", "/api/tenant".into(), Some(json!({"id": {"id": alpha_id}, "title": "stolen"}).to_string())),
        ("/api/tenant/{id}", "GET", format!("/api/tenant/{alpha_id}"), None),
        ("/api/tenant/{id}", "DELETE", format!("/api/tenant/{alpha_id}"), None),
        ("/api/tenant/{id}/users", "GET", format!("/api/tenant/{alpha_id}/users?{page}"), None),
        ("/api/tenants", "GET", format!("/api/tenants?{page}"), None),
        ("/api/tenantProfile", "POST", "/api/tenantProfile".into(), Some(json!({"name": "stolen"}).to_string())),
        ("/api/tenantProfile/{id}", "GET", format!("/api/tenantProfile/{alpha_id}"), None),
        ("/api/tenantProfile/{id}", "DELETE", format!("/api/tenantProfile/{alpha_id}"), None),
        ("/api/tenantProfile/{id}/default", "POST", format!("/api/tenantProfile/{alpha_id}/default"), None),
        ("/api/tenantProfileInfo/{id}", "GET", format!("/api/tenantProfileInfo/{alpha_id}"), None),
        ("/api/tenantProfileInfo/default", "GET", "/api/tenantProfileInfo/default".into(), None),
        ("/api/tenantProfiles", "GET", format!("/api/tenantProfiles?{page}"), None),
        ("/api/tenantProfileInfos", "GET", format!("/api/tenantProfileInfos?{page}"), None),
        ("/api/tenantProfiles/list", "GET", format!("/api/tenantProfiles/list?ids={alpha_id}"), None),
        ("/api/otaPackage", "POST", "/api/otaPackage".into(), Some(json!({"id": {"id": a_ota}, "title": "stolen"}).to_string())),
        ("/api/otaPackage/{id}", "GET", format!("/api/otaPackage/{a_ota}"), None),
        ("/api/otaPackage/{id}", "POST", format!("/api/otaPackage/{a_ota}?checksumAlgorithm=SHA256"), Some("stolen".into())),
        ("/api/otaPackage/{id}", "DELETE", format!("/api/otaPackage/{a_ota}"), None),
        ("/api/otaPackage/info/{id}", "GET", format!("/api/otaPackage/info/{a_ota}"), None),
        ("/api/otaPackage/{id}/download", "GET", format!("/api/otaPackage/{a_ota}/download"), None),
        ("/api/otaPackages/{profile}/{type}", "GET", format!("/api/otaPackages/{a_prof}/FIRMWARE?{page}"), None),
        ("/api/mqtt/clients/{username}", "GET", "/api/mqtt/clients/app".into(), None),
        ("/api/mqtt/clients/{username}", "DELETE", "/api/mqtt/clients/app".into(), None),
        ("/api/asset", "POST", "/api/asset".into(), Some(json!({"id": {"id": a_asset}, "name": "stolen"}).to_string())),
        ("/api/asset", "POST", "/api/asset".into(), Some(json!({"name": "mine", "assetProfileId": {"id": a_aprof}}).to_string())),
        ("/api/asset/{id}", "GET", format!("/api/asset/{a_asset}"), None),
        ("/api/asset/{id}", "DELETE", format!("/api/asset/{a_asset}"), None),
        ("/api/asset/info/{id}", "GET", format!("/api/asset/info/{a_asset}"), None),
        ("/api/assets", "POST", "/api/assets".into(), Some(json!({"parameters": {"rootId": a_asset, "rootType": "ASSET", "direction": "FROM"}, "relationType": "Contains"}).to_string())),
        ("/api/customer/{customer}/assets", "GET", format!("/api/customer/{a_cust}/assets?{page}"), None),
        ("/api/customer/{customer}/assetInfos", "GET", format!("/api/customer/{a_cust}/assetInfos?{page}"), None),
        ("/api/customer/{customer}/asset/{asset}", "POST", format!("/api/customer/{b_cust}/asset/{a_asset}"), None),
        ("/api/customer/{customer}/asset/{asset}", "POST", format!("/api/customer/{a_cust}/asset/{b_asset}"), None),
        ("/api/customer/asset/{asset}", "DELETE", format!("/api/customer/asset/{a_asset}"), None),
        ("/api/owner/{kind}/{owner}/{entity_type}/{entity}", "POST", format!("/api/owner/CUSTOMER/{a_cust}/ASSET/{b_asset}"), None),
        ("/api/assetProfile", "POST", "/api/assetProfile".into(), Some(json!({"id": {"id": a_aprof}, "name": "stolen"}).to_string())),
        ("/api/assetProfile/{id}", "GET", format!("/api/assetProfile/{a_aprof}"), None),
        ("/api/assetProfile/{id}", "DELETE", format!("/api/assetProfile/{a_aprof}"), None),
        ("/api/assetProfile/{id}/default", "POST", format!("/api/assetProfile/{a_aprof}/default"), None),
        ("/api/assetProfileInfo/{id}", "GET", format!("/api/assetProfileInfo/{a_aprof}"), None),
        ("/api/relation", "GET", format!("/api/relation?fromId={a_asset}&fromType=ASSET&relationType=Contains&toId={a_pump}&toType=DEVICE"), None),
        ("/api/v2/relation", "POST", "/api/v2/relation".into(), Some(json!({"from": {"entityType": "ASSET", "id": b_asset}, "to": {"entityType": "DEVICE", "id": a_pump}, "type": "Contains"}).to_string())),
        ("/api/v2/relation", "DELETE", format!("/api/v2/relation?fromId={a_asset}&fromType=ASSET&relationType=Contains&toId={a_pump}&toType=DEVICE"), None),
        ("/api/relations", "DELETE", format!("/api/relations?entityId={a_asset}&entityType=ASSET"), None),
        ("/api/relations", "POST", "/api/relations".into(), Some(json!({"parameters": {"rootId": a_asset, "rootType": "ASSET", "direction": "FROM"}, "filters": []}).to_string())),
        ("/api/relations/info", "GET", format!("/api/relations/info?fromId={a_asset}&fromType=ASSET"), None),
        ("/api/relations/info", "POST", "/api/relations/info".into(), Some(json!({"parameters": {"rootId": a_pump, "rootType": "DEVICE", "direction": "TO"}}).to_string())),
        ("/api/relations/from/{from_type}/{from_id}", "GET", format!("/api/relations/from/ASSET/{a_asset}"), None),
        ("/api/relations/from/{from_type}/{from_id}/{relation_type}", "GET", format!("/api/relations/from/ASSET/{a_asset}/Contains"), None),
        ("/api/relations/to/{to_type}/{to_id}", "GET", format!("/api/relations/to/DEVICE/{a_pump}"), None),
        ("/api/relations/to/{to_type}/{to_id}/{relation_type}", "GET", format!("/api/relations/to/DEVICE/{a_pump}/Contains"), None),
        ("/api/relations/info/from/{from_type}/{from_id}", "GET", format!("/api/relations/info/from/ASSET/{a_asset}"), None),
        ("/api/relations/info/to/{to_type}/{to_id}", "GET", format!("/api/relations/info/to/DEVICE/{a_pump}"), None),
        ("/api/customer/{customer}/deviceInfos", "GET", format!("/api/customer/{a_cust}/deviceInfos?{page}"), None),
        ("/api/customer/info/{id}", "GET", format!("/api/customer/info/{a_cust}"), None),
        ("/api/customer/{id}/title", "GET", format!("/api/customer/{a_cust}/title"), None),
        ("/api/customer/{id}/shortInfo", "GET", format!("/api/customer/{a_cust}/shortInfo"), None),
        ("/api/device/info/{id}", "GET", format!("/api/device/info/{a_pump}"), None),
        ("/api/devices", "POST", "/api/devices".into(), Some(json!({"parameters": {"rootId": a_asset, "rootType": "ASSET", "direction": "FROM"}, "relationType": "Contains"}).to_string())),
        ("/api/devices/count/{ota_type}/{profile}", "GET", format!("/api/devices/count/FIRMWARE/{a_prof}"), None),
        ("/api/deviceProfile/devices/keys/timeseries", "GET", format!("/api/deviceProfile/devices/keys/timeseries?deviceProfileId={a_prof}"), None),
        ("/api/deviceProfile/devices/keys/attributes", "GET", format!("/api/deviceProfile/devices/keys/attributes?deviceProfileId={a_prof}"), None),
        ("/api/alarm", "POST", "/api/alarm".into(), Some(json!({"originator": {"entityType": "DEVICE", "id": a_pump}, "type": "x", "severity": "MAJOR"}).to_string())),
        ("/api/alarm", "POST", "/api/alarm".into(), Some(json!({"id": {"id": a_alarm}, "originator": {"entityType": "DEVICE", "id": b_pump}, "type": "x", "severity": "MAJOR"}).to_string())),
        ("/api/alarm/{id}", "GET", format!("/api/alarm/{a_alarm}"), None),
        ("/api/alarm/{id}", "DELETE", format!("/api/alarm/{a_alarm}"), None),
        ("/api/alarm/info/{id}", "GET", format!("/api/alarm/info/{a_alarm}"), None),
        ("/api/alarm/{id}/ack", "POST", format!("/api/alarm/{a_alarm}/ack"), None),
        ("/api/alarm/{id}/clear", "POST", format!("/api/alarm/{a_alarm}/clear"), None),
        ("/api/alarm/{id}/assign/{user}", "POST", format!("/api/alarm/{a_alarm}/assign/{a_user}"), None),
        ("/api/alarm/{id}/assign", "DELETE", format!("/api/alarm/{a_alarm}/assign"), None),
        ("/api/alarm/{id}/comment", "GET", format!("/api/alarm/{a_alarm}/comment?{page}"), None),
        ("/api/alarm/{id}/comment", "POST", format!("/api/alarm/{a_alarm}/comment"), Some(json!({"comment": {"text": "evil"}}).to_string())),
        ("/api/alarm/{id}/comment/{comment}", "DELETE", format!("/api/alarm/{a_alarm}/comment/{a_comment}"), None),
        ("/api/alarm/{id}/{entityId}", "GET", format!("/api/alarm/DEVICE/{a_pump}?{page}"), None),
        ("/api/v2/alarm/{entityType}/{entityId}", "GET", format!("/api/v2/alarm/DEVICE/{a_pump}?{page}"), None),
        ("/api/alarm/highestSeverity/{entityType}/{entityId}", "GET", format!("/api/alarm/highestSeverity/DEVICE/{a_pump}"), None),
        ("/api/users/assign/{id}", "GET", format!("/api/users/assign/{a_alarm}?{page}"), None),
        ("/api/notification/{kind}", "POST", "/api/notification/target".into(), Some(json!({"id": {"id": a_target}, "name": "stolen", "configuration": {"type": "PLATFORM_USERS", "usersFilter": {"type": "TENANT_ADMINISTRATORS"}}}).to_string())),
        ("/api/notification/{kind}", "POST", "/api/notification/rule".into(), Some(json!({"name": "r", "templateId": {"id": a_template}, "triggerType": "ALARM", "triggerConfig": {"triggerType": "ALARM", "notifyOn": ["CREATED"]}, "recipientsConfig": {"triggerType": "ALARM", "escalationTable": {"0": [a_target]}}}).to_string())),
        ("/api/notification/{kind}", "DELETE", format!("/api/notification/{a_note}"), None),
        ("/api/notification/{kind}/{id}", "GET", format!("/api/notification/target/{a_target}"), None),
        ("/api/notification/{kind}/{id}", "GET", format!("/api/notification/template/{a_template}"), None),
        ("/api/notification/{kind}/{id}", "GET", format!("/api/notification/rule/{a_rule}"), None),
        ("/api/notification/{kind}/{id}", "GET", format!("/api/notification/request/{a_request}"), None),
        ("/api/notification/{kind}/{id}", "DELETE", format!("/api/notification/rule/{a_rule}"), None),
        ("/api/notification/{kind}/{id}", "DELETE", format!("/api/notification/request/{a_request}"), None),
        ("/api/notification/{kind}/{id}", "PUT", format!("/api/notification/{a_note}/read"), None),
        ("/api/forwarding/sink", "POST", "/api/forwarding/sink".into(), Some(json!({"id": {"id": a_sink}, "name": "stolen", "type": "HTTP", "configuration": {"url": "http://192.0.2.1/beta"}}).to_string())),
        ("/api/forwarding/sink/{id}", "GET", format!("/api/forwarding/sink/{a_sink}"), None),
        ("/api/forwarding/sink/{id}", "DELETE", format!("/api/forwarding/sink/{a_sink}"), None),
    ]);
    // Lists by ids answer with those of the caller's own tenant only.
    for path in [
        format!("/api/devices?deviceIds={a_pump}"),
        format!("/api/customers/list?customerIds={a_cust}"),
        format!("/api/deviceProfileInfos/list?deviceProfileIds={a_prof}"),
        format!("/api/dashboards?dashboardIds={a_dash}"),
        format!("/api/users/list?userIds={a_user}"),
        format!("/api/assetProfileInfos/list?assetProfileIds={a_aprof}"),
    ] {
        assert_eq!(s.json("GET", &path, &beta, None), (200, json!([])), "{path}");
    }
    let single = json!({"entityFilter": {"type": "singleEntity", "singleEntity": {"entityType": "DEVICE", "id": a_pump}},
        "pageLink": {"pageSize": 10, "page": 0}});
    let (_, keys) =
        s.json("POST", "/api/entitiesQuery/find/keys?timeseries=true&attributes=true", &beta, Some(single.clone()));
    assert_eq!(keys, json!({"entityTypes": [], "timeseries": [], "attribute": []}));
    let (_, keys) = s.json("POST", "/api/v2/entitiesQuery/find/keys", &beta, Some(single));
    assert_eq!(keys["timeseries"], json!([]), "{keys}");
    // Asset data is the asset owner's, as a device's is.
    let asset_data = device_data_routes(&a_asset).into_iter().filter(|r| r.2.contains("/DEVICE/"));
    tried.extend(asset_data.map(|(r, m, path, body)| (r, m, path.replace("/DEVICE/", "/ASSET/"), body)));
    // So are a customer's and a tenant's (alarm rules' dynamic thresholds read them).
    for (kind, id) in [("CUSTOMER", &a_cust), ("TENANT", &alpha_id)] {
        let data = device_data_routes(id).into_iter().filter(|r| r.2.contains("/DEVICE/"));
        tried.extend(data.map(|(r, m, path, body)| (r, m, path.replace("/DEVICE/", &format!("/{kind}/")), body)));
    }
    // Queries and id lists answer with the caller's own only.
    let (_, found) = s.json("GET", &format!("/api/assets?assetIds={a_asset}"), &beta, None);
    assert_eq!(found, json!([]));
    for filter in [
        json!({"type": "singleEntity", "singleEntity": {"entityType": "ASSET", "id": a_asset}}),
        json!({"type": "entityList", "entityType": "DEVICE", "entityList": [a_pump]}),
        json!({"type": "assetType", "assetTypes": ["alpha-type"]}),
        json!({"type": "entityName", "entityType": "ASSET", "entityNameFilter": "alpha"}),
        json!({"type": "entityType", "entityType": "CUSTOMER"}),
    ] {
        let q = json!({"entityFilter": filter, "pageLink": {"pageSize": 10, "page": 0},
            "entityFields": [{"type": "ENTITY_FIELD", "key": "name"}], "latestValues": [{"type": "TIME_SERIES", "key": "secret"}]});
        let (st, page) = s.json("POST", "/api/entitiesQuery/find", &beta, Some(q.clone()));
        assert_eq!(st, 200, "{page}");
        assert!(!page.to_string().contains("alpha") && !page.to_string().contains(&*a_asset), "{q}: {page}");
        let (_, n) = s.json("POST", "/api/entitiesQuery/count", &beta, Some(q.clone()));
        assert_eq!(n, page["totalElements"], "{q}");
        if q["entityFilter"]["type"] != "entityType" {
            assert_eq!(n, 0, "{q}");
        }
    }
    let from_alpha = json!({"entityFilter": {"type": "relationsQuery", "rootEntity": {"entityType": "ASSET", "id": a_asset},
        "direction": "FROM", "maxLevel": 1}, "pageLink": {"pageSize": 10, "page": 0}});
    let (st, out) = s.json("POST", "/api/entitiesQuery/find", &beta, Some(from_alpha));
    assert_eq!((st, out["message"].as_str()), (400, Some(&*format!("ASSET {a_asset} is not found"))), "{out}");
    // Lists and lookups by name that answer with the caller's own tenant (checked above),
    // and OPEN_ROUTES.
    let own = [
        "/api/tenant/devices",
        "/api/tenant/device",
        "/api/tenant/deviceInfos",
        "/api/device/types",
        "/api/deviceInfos/all",
        "/api/otaPackages",
        "/api/tenant/customers",
        "/api/tenant/dashboards",
        "/api/customers",
        "/api/deviceProfiles",
        "/api/deviceProfileInfos",
        "/api/deviceProfile/names",
        "/api/deviceProfileInfo/default",
        "/api/users",
        "/api/mqtt/clients",
        "/api/device/bulk_import",
        // By name, in the caller's tenant: Beta's "pump" is its own.
        "/api/customer/device/{device}/claim",
        "/api/asset/types",
        "/api/tenant/assets",
        "/api/tenant/asset",
        "/api/tenant/assetInfos",
        "/api/assetInfos/all",
        "/api/assetProfiles",
        "/api/assetProfileInfos",
        "/api/assetProfileInfos/list",
        "/api/assetProfile/names",
        "/api/customers/list",
        "/api/deviceProfileInfos/list",
        "/api/users/list",
        "/api/alarms",
        "/api/v2/alarms",
        "/api/alarm/types",
        "/api/alarmsQuery/find",
        "/api/alarmsQuery/count",
        "/api/notifications",
        "/api/notifications/unread/count",
        "/api/notifications/read",
        "/api/forwarding/sinks",
    ];
    let checked: std::collections::HashSet<&str> =
        tried.iter().map(|r| r.0).chain(own).chain(OPEN_ROUTES.iter().copied()).collect();
    for route in server_routes() {
        assert!(checked.contains(route.as_str()), "route {route} is not tried across tenants: add it to this test");
    }
    // Each is answered exactly as the same request with ids that exist nowhere: Beta learns
    // nothing of which of Alpha's ids exist (only the id in the message differs).
    let me_id = me["id"]["id"].as_str().unwrap().to_owned();
    let ids = [
        &a_pump,
        &a_cust,
        &a_dash,
        &a_prof,
        &a_user,
        &a_key,
        &alpha_id,
        &me_id,
        &a_ota,
        &a_asset,
        &a_aprof,
        &a_alarm,
        &a_comment,
        &a_target,
        &a_template,
        &a_rule,
        &a_request,
        &a_note,
        &a_sink,
    ];
    let twins: Vec<(String, String)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| ((*id).clone(), format!("00000000-0000-4000-8000-{:012x}", i + 1)))
        .collect();
    let swap = |text: &str, back: bool| {
        twins
            .iter()
            .fold(text.to_owned(), |t, (real, twin)| if back { t.replace(twin, real) } else { t.replace(real, twin) })
    };
    let normal = |out: &str| -> J {
        let mut j: J = serde_json::from_str(out).unwrap_or_else(|_| J::String(out.to_owned()));
        if let Some(o) = j.as_object_mut() {
            o.remove("timestamp");
        }
        j
    };
    for (_, m, path, body) in &tried {
        let (twin_st, twin_out) =
            s.req(m, &swap(path, false), Some(&beta), body.as_deref().map(|b| swap(b, false)).as_deref());
        let (st, out) = s.req(m, path, Some(&beta), body.as_deref());
        assert!(st == 403 || st == 404, "{m} {path}: {st} {out}");
        assert_eq!(
            (st, normal(&out)),
            (twin_st, normal(&swap(&twin_out, true))),
            "{m} {path}: answered unlike the same request with ids that do not exist"
        );
        for secret in [
            "ALPHAPUMP",
            "value-of-ALPHA",
            "alpha-secret",
            "alpha-dash",
            "alpha-profile",
            "cu@alpha",
            "alpha-key",
            "alpha-fw",
            "alpha-asset",
            "alpha-type",
            "alpha-leak",
            "alpha-target",
            "alpha-template",
            "alpha-rule",
            "alpha-subject",
            "alpha-notified",
            "alpha-note",
            "alpha-sink",
        ] {
            assert!(!out.contains(secret), "{m} {path} leaked {secret}: {out}");
        }
    }
    // Nor over the WebSocket API: a subscription to Alpha's device is refused as one to a
    // device that does not exist (tests/websocket.rs compares the two answers).
    let url = format!("{}/api/ws", s.base.replacen("http://", "ws://", 1));
    let (mut ws, _) = tungstenite::connect(url).unwrap();
    let sub = json!({"authCmd": {"cmdId": 0, "token": beta}, "cmds": [{"cmdId": 1, "type": "TIMESERIES",
        "entityType": "DEVICE", "entityId": a_pump, "keys": "secret"}]});
    ws.send(tungstenite::Message::Text(sub.to_string().into())).unwrap();
    let answer: J = loop {
        if let tungstenite::Message::Text(t) = ws.read().unwrap() {
            break serde_json::from_str(&t).unwrap();
        }
    };
    assert_eq!((answer["errorCode"].as_i64(), answer["data"].clone()), (Some(2), json!({})), "{answer}");
    assert_eq!(answer["errorMsg"], "Device with requested id wasn't found!", "{answer}");

    // Nothing of Alpha's changed.
    let (_, v) = s.json("GET", &format!("{}/values/attributes/SHARED_SCOPE", tel(&a_pump)), &alpha, None);
    assert_eq!(v[0]["value"], "alpha-secret");
    let (_, d) = s.json("GET", &format!("/api/device/{a_pump}"), &alpha, None);
    assert_eq!((d["name"].as_str(), d["customerId"]["id"].as_str()), (Some("pump"), Some(NULL_UUID)));
    assert_eq!(s.json("GET", &format!("/api/dashboard/{a_dash}"), &alpha, None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/deviceProfile/{a_prof}"), &alpha, None).0, 200);
    let (_, rel) = s.json("GET", &format!("/api/relations?fromId={a_asset}&fromType=ASSET"), &alpha, None);
    assert_eq!(rel.as_array().map(Vec::len), Some(1), "{rel}");
    let (_, a) = s.json("GET", &format!("/api/asset/info/{a_asset}"), &alpha, None);
    assert_eq!(
        (a["name"].as_str(), a["type"].as_str(), a["customerTitle"].as_str()),
        (Some("alpha-asset"), Some("alpha-type"), None)
    );
    assert_eq!(s.telemetry("ALPHAPUMP", r#"{"still":1}"#), 200);
    let (_, keys) = s.json("GET", &format!("/api/apiKeys/{}?{page}", me["id"]["id"].as_str().unwrap()), &alpha, None);
    assert_eq!(keys["data"][0]["enabled"], true);

    // Broker namespaces. Beta's clients are its own: same user name refused, lists apart.
    let beta_app = json!({"username": "beta-app", "password": "beta-app-pw", "subscribe": ["#"], "publish": ["#"]});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &beta, Some(beta_app)).0, 200);
    let taken = json!({"username": "app", "password": "stolen-pw"});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &beta, Some(taken)).0, 400, "Alpha's user name");
    let (_, list) = s.json("GET", "/api/mqtt/clients", &beta, None);
    assert_eq!(list.as_array().unwrap().iter().map(|c| c["username"].clone()).collect::<Vec<_>>(), ["beta-app"]);
    // The same client id in both tenants is two sessions: neither takes the other over.
    let (mut a_sub, _) = Raw::login(s.mqtt_port, ProtocolVersion::V5, "same-id", "app", "app-pw");
    let (mut b_sub, _) = Raw::login(s.mqtt_port, ProtocolVersion::V5, "same-id", "beta-app", "beta-app-pw");
    for c in [&mut a_sub, &mut b_sub] {
        assert_eq!(c.subscribe(1, &["gridlinks/devices/+/telemetry", "apps/#"]).return_codes, [1, 1]);
    }
    // Nobody names a namespace itself, not even as a client id.
    let (_, refused) =
        Raw::login(s.mqtt_port, ProtocolVersion::V5, &format!("$tenant/{beta_id}/same-id"), "app", "app-pw");
    assert_eq!(refused.code, reason::CLIENT_IDENTIFIER_NOT_VALID);
    assert_eq!(b_sub.subscribe(2, &["$tenant/#"]).return_codes, [reason::NOT_AUTHORIZED]);
    let alpha_view = format!("$tenant/{beta_id}/#");
    assert_eq!(a_sub.subscribe(2, &[alpha_view.as_str()]).return_codes, [reason::NOT_AUTHORIZED]);
    b_sub.publish(&format!("$tenant/{alpha_id}/apps/x"), b"forged", QoS::AtLeastOnce, Some(3));
    assert!(matches!(b_sub.recv(), Some(Packet::PubAck(a)) if a.reason == reason::NOT_AUTHORIZED));
    // Each tenant's device telemetry reaches its own clients, under the device's name.
    let delivered = |c: &mut Raw| match c.recv() {
        Some(Packet::Publish(p)) => (p.topic.to_string(), String::from_utf8_lossy(&p.payload).into_owned()),
        other => panic!("expected a PUBLISH, got {other:?}"),
    };
    assert_eq!(s.telemetry("BETAPUMP", r#"{"beta":1}"#), 200);
    assert_eq!(s.telemetry("ALPHAPUMP", r#"{"alpha":2}"#), 200);
    let (topic, payload) = delivered(&mut a_sub);
    assert_eq!(topic, "gridlinks/devices/pump/telemetry");
    assert!(payload.contains("alpha") && !payload.contains("beta"), "{payload}");
    let (topic, payload) = delivered(&mut b_sub);
    assert_eq!(topic, "gridlinks/devices/pump/telemetry");
    assert!(payload.contains("beta") && !payload.contains("alpha"), "{payload}");
    // A client publish (retained too) stays in its tenant: Alpha's next message is its own
    // marker, not Beta's publish before it.
    let (mut b_pub, _) = Raw::login(s.mqtt_port, ProtocolVersion::V5, "b-pub", "beta-app", "beta-app-pw");
    for (id, retain) in [(4, false), (5, true)] {
        let mut p = publish_packet("apps/x", b"beta-message", QoS::AtLeastOnce, Some(id));
        if let Packet::Publish(p) = &mut p {
            p.retain = retain;
        }
        b_pub.send(&p);
        // Routed (and the retained message stored) once acknowledged.
        assert!(matches!(b_pub.recv(), Some(Packet::PubAck(a)) if a.reason == 0));
    }
    a_sub.publish("apps/x", b"alpha-marker", QoS::AtMostOnce, None);
    assert_eq!(delivered(&mut a_sub), ("apps/x".to_owned(), "alpha-marker".to_owned()));
    let (mut late, _) = Raw::login(s.mqtt_port, ProtocolVersion::V5, "late", "app", "app-pw");
    late.subscribe(1, &["apps/#"]);
    a_sub.publish("apps/y", b"alpha-marker-2", QoS::AtMostOnce, None);
    assert_eq!(delivered(&mut late), ("apps/y".to_owned(), "alpha-marker-2".to_owned()), "no Beta retained message");

    // Deleting Beta ends its users' tokens and its devices' tokens; Alpha is untouched.
    assert_eq!(s.json("DELETE", &format!("/api/tenant/{beta_id}"), &sys, None).0, 200);
    assert_eq!(s.json("GET", "/api/auth/user", &beta, None).0, 401);
    assert_eq!(s.telemetry("BETAPUMP", r#"{"x":1}"#), 401);
    assert_eq!(s.json("GET", &format!("/api/user/{boss_id}"), &sys, None).0, 404);
    assert_eq!(s.telemetry("ALPHAPUMP", r#"{"x":1}"#), 200);
    assert_ne!(Raw::login(s.mqtt_port, ProtocolVersion::V5, "c", "beta-app", "beta-app-pw").1.code, 0);
    assert_eq!(Raw::login(s.mqtt_port, ProtocolVersion::V5, "c", "app", "app-pw").1.code, 0);
    let (_, tenants) = s.json("GET", "/api/tenants?pageSize=10&page=0", &sys, None);
    assert_eq!(tenants["totalElements"], 1);
}

/// `auth.hide_other_tenants = false` gives ThingsBoard's answer to another tenant's id:
/// 403, where the default answers 404 as for an id that exists nowhere.
#[test]
fn thingsboards_403_for_other_tenants_ids_is_an_option() {
    for (hide, status) in [("true", 404), ("false", 403)] {
        let s = Server::start_env(&[("GRIDLINKS_AUTH_HIDE_OTHER_TENANTS", hide)]);
        let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
        let alpha = s.login();
        let pump = s.device(&alpha, "pump", "HIDEPUMP");
        let (_, beta) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta"})));
        let body = json!({"email": "boss@beta.hide", "authority": "TENANT_ADMIN",
            "tenantId": {"entityType": "TENANT", "id": beta["id"]["id"]}});
        let (_, beta) = s.activated_user(&sys, body, "beta-secret");
        assert_eq!(s.json("GET", &format!("/api/device/{pump}"), &beta, None).0, status, "hide_other_tenants = {hide}");
    }
}
