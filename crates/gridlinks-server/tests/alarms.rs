//! Alarms on the real binary: device-profile alarm rules raising, re-grading and clearing
//! alarms from committed telemetry (severities, REPEATING with a rule state that survives a
//! restart, DURATION raised by time alone, a dynamic threshold from a device attribute),
//! ThingsBoard's alarm REST API (create/update in place, ack, clear, assign, comments,
//! lists v1 and v2, highest severity, types, delete) and its boundaries (another tenant, a
//! customer user, bad rules refused on save).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::ws::{next, send};
use common::*;

fn filter(key: &str, op: &str, value: J) -> J {
    json!({"key": {"type": "TIME_SERIES", "key": key}, "valueType": "NUMERIC",
           "predicate": {"type": "NUMERIC", "operation": op, "value": value}})
}

/// A boiler profile: CRITICAL above 90; MAJOR above the device's `maxTemp` (70 without
/// it) in 2 messages in a row; cleared below 50. A door open for 2 s: WARNING.
fn boiler_profile() -> J {
    let dynamic =
        json!({"defaultValue": 70, "dynamicValue": {"sourceType": "CURRENT_DEVICE", "sourceAttribute": "maxTemp"}});
    json!({
        "name": "boiler",
        "profileData": {"configuration": {"type": "DEFAULT"}, "alarms": [
            {"id": "overheat", "alarmType": "Overheat",
             "createRules": {
                "CRITICAL": {"condition": {"condition": [filter("temperature", "GREATER", json!({"defaultValue": 90}))]},
                             "alarmDetails": "temperature ${temperature}"},
                "MAJOR": {"condition": {"condition": [filter("temperature", "GREATER", dynamic)],
                          "spec": {"type": "REPEATING", "predicate": {"defaultValue": 2}}}}},
             "clearRule": {"condition": {"condition": [filter("temperature", "LESS", json!({"defaultValue": 50}))]}}},
            {"id": "door", "alarmType": "Door open",
             "createRules": {"WARNING": {"condition": {
                "condition": [{"key": {"type": "TIME_SERIES", "key": "door"}, "valueType": "BOOLEAN",
                    "predicate": {"type": "BOOLEAN", "operation": "EQUAL", "value": {"defaultValue": true}}}],
                "spec": {"type": "DURATION", "unit": "SECONDS", "predicate": {"defaultValue": 2}}}}},
             "clearRule": {"condition": {"condition": [{"key": {"type": "TIME_SERIES", "key": "door"}, "valueType": "BOOLEAN",
                    "predicate": {"type": "BOOLEAN", "operation": "EQUAL", "value": {"defaultValue": false}}}]}}}
        ]}
    })
}

fn save_boiler_profile(s: &Server, jwt: &str) {
    let (st, p) = s.json("POST", "/api/deviceProfile", jwt, Some(boiler_profile()));
    assert_eq!(st, 200, "{p}");
}

/// Creates the device `body` with access token `token`; its id.
fn device(s: &Server, jwt: &str, token: &str, body: J) -> String {
    let (st, d) = s.json("POST", &format!("/api/device?accessToken={token}"), jwt, Some(body));
    assert_eq!(st, 200, "{d}");
    d["id"]["id"].as_str().unwrap().to_owned()
}

fn boiler(s: &Server, jwt: &str, name: &str, token: &str) -> String {
    device(s, jwt, token, json!({"name": name, "type": "boiler"}))
}

/// The device's alarms (v2 list, newest first), with the extra query.
fn alarms_of(s: &Server, jwt: &str, device: &str, query: &str) -> Vec<J> {
    let (st, page) = s.json("GET", &format!("/api/v2/alarm/DEVICE/{device}?pageSize=100&page=0{query}"), jwt, None);
    assert_eq!(st, 200, "{page}");
    page["data"].as_array().unwrap().clone()
}

fn post(s: &Server, token: &str, body: J) {
    assert_eq!(s.telemetry(token, &body.to_string()), 200);
}

/// Waits until the device's alarm of `alarm_type` satisfies `ok`; the alarm.
fn wait_alarm(s: &Server, jwt: &str, device: &str, alarm_type: &str, ok: impl Fn(&J) -> bool) -> J {
    let mut found = J::Null;
    wait_until(&format!("{alarm_type} alarm of {device}"), || {
        let list = alarms_of(s, jwt, device, &format!("&typeList={}", alarm_type.replace(' ', "%20")));
        match list.into_iter().find(|a| ok(a)) {
            Some(a) => {
                found = a;
                true
            }
            None => false,
        }
    });
    found
}

#[test]
fn profile_rules_raise_regrade_and_clear_alarms_on_committed_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    save_boiler_profile(&s, &jwt);
    let b1 = boiler(&s, &jwt, "boiler-1", "boiler-1-token");

    // One message above 70 is not yet MAJOR (2 in a row are needed); the second is.
    post(&s, "boiler-1-token", json!({"temperature": 75}));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(alarms_of(&s, &jwt, &b1, "").is_empty(), "one message is not a repeat");
    post(&s, "boiler-1-token", json!({"temperature": 76}));
    let major = wait_alarm(&s, &jwt, &b1, "Overheat", |a| a["severity"] == "MAJOR");
    assert_eq!(major["status"], "ACTIVE_UNACK");
    assert_eq!(major["originatorName"], "boiler-1");
    assert_eq!(major["name"], "Overheat");
    let id = major["id"]["id"].as_str().unwrap().to_owned();

    // Above 90: the same alarm, re-graded, with the rule's details; a system comment says so.
    post(&s, "boiler-1-token", json!({"temperature": 95.5}));
    let critical = wait_alarm(&s, &jwt, &b1, "Overheat", |a| a["severity"] == "CRITICAL");
    assert_eq!(critical["id"]["id"], id.as_str(), "one active alarm per originator and type");
    assert_eq!(critical["details"]["data"], "temperature 95.5");
    let (_, comments) = s.json("GET", &format!("/api/alarm/{id}/comment?pageSize=10&page=0"), &jwt, None);
    let texts: Vec<&str> =
        comments["data"].as_array().unwrap().iter().map(|c| c["comment"]["text"].as_str().unwrap()).collect();
    assert!(texts.contains(&"Alarm severity was updated from MAJOR to CRITICAL"), "{comments}");

    // A lower reading that still holds MAJOR does not downgrade an active alarm.
    post(&s, "boiler-1-token", json!({"temperature": 80}));
    post(&s, "boiler-1-token", json!({"temperature": 81}));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(alarms_of(&s, &jwt, &b1, "")[0]["severity"], "CRITICAL");

    // Acknowledged once (twice: 400), then the clear rule clears it.
    let (st, acked) = s.json("POST", &format!("/api/alarm/{id}/ack"), &jwt, None);
    assert_eq!((st, acked["status"].as_str()), (200, Some("ACTIVE_ACK")), "{acked}");
    let (st, again) = s.json("POST", &format!("/api/alarm/{id}/ack"), &jwt, None);
    assert_eq!((st, again["message"].as_str()), (400, Some("Alarm was already acknowledged!")));
    post(&s, "boiler-1-token", json!({"temperature": 40}));
    let cleared = wait_alarm(&s, &jwt, &b1, "Overheat", |a| a["status"] == "CLEARED_ACK");
    assert_eq!(cleared["id"]["id"], id.as_str());
    assert!(cleared["clearTs"].as_i64().unwrap() > 0);

    // After a clear, the condition raises a new alarm.
    post(&s, "boiler-1-token", json!({"temperature": 99}));
    let second = wait_alarm(&s, &jwt, &b1, "Overheat", |a| a["status"] == "ACTIVE_UNACK");
    assert_ne!(second["id"]["id"], id.as_str());

    // A dynamic threshold: with maxTemp 85 on the device, 80 twice raises nothing.
    let b2 = boiler(&s, &jwt, "boiler-2", "boiler-2-token");
    let (st, _) = s.json(
        "POST",
        &format!("/api/plugins/telemetry/DEVICE/{b2}/attributes/SERVER_SCOPE"),
        &jwt,
        Some(json!({"maxTemp": 85})),
    );
    assert_eq!(st, 200);
    std::thread::sleep(std::time::Duration::from_millis(300));
    for t in [80, 81] {
        post(&s, "boiler-2-token", json!({"temperature": t}));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(alarms_of(&s, &jwt, &b2, "").is_empty(), "80 is below the device's 85");
    for t in [86, 87] {
        post(&s, "boiler-2-token", json!({"temperature": t}));
    }
    wait_alarm(&s, &jwt, &b2, "Overheat", |a| a["severity"] == "MAJOR");

    // DURATION: a door left open raises its alarm by time alone, with no further message.
    post(&s, "boiler-2-token", json!({"door": true}));
    let door = wait_alarm(&s, &jwt, &b2, "Door open", |a| a["severity"] == "WARNING");
    assert_eq!(door["status"], "ACTIVE_UNACK");
    post(&s, "boiler-2-token", json!({"door": false}));
    wait_alarm(&s, &jwt, &b2, "Door open", |a| a["status"] == "CLEARED_UNACK");

    // REPEATING progress survives a restart: one message before, one after.
    let b3 = boiler(&s, &jwt, "boiler-3", "boiler-3-token");
    post(&s, "boiler-3-token", json!({"temperature": 75}));
    s.sigterm(); // a clean stop writes the rule state
    let s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    assert!(alarms_of(&s, &jwt, &b3, "").is_empty());
    post(&s, "boiler-3-token", json!({"temperature": 75}));
    wait_alarm(&s, &jwt, &b3, "Overheat", |a| a["severity"] == "MAJOR");

    // The REST alarm query (the WebSocket's ALARM_DATA / ALARM_COUNT).
    let q = json!({"entityFilter": {"type": "deviceType", "deviceTypes": ["boiler"]},
        "pageLink": {"pageSize": 10, "page": 0, "statusList": ["ACTIVE"], "severityList": ["MAJOR"],
            "sortOrder": {"key": {"type": "ALARM_FIELD", "key": "originator"}, "direction": "ASC"}},
        "entityFields": [{"type": "ENTITY_FIELD", "key": "name"}]});
    let (st, found) = s.json("POST", "/api/alarmsQuery/find", &jwt, Some(q));
    assert_eq!(st, 200, "{found}");
    let names: Vec<&str> = found["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["latest"]["ENTITY_FIELD"]["name"]["value"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["boiler-2", "boiler-3"], "{found}");
    let (_, n) = s.json(
        "POST",
        "/api/alarmsQuery/count",
        &jwt,
        Some(json!({"statusList": ["ACTIVE"], "typeList": ["Overheat"]})),
    );
    assert_eq!(n, 3);
    let (st, e) = s.json("GET", "/api/alarm/rules?pageSize=10&page=0", &jwt, None);
    assert_eq!(st, 501, "{e}");
    assert!(e["message"].as_str().unwrap().contains("docs/alarms.md"), "{e}");

    // Lists and counts by status, severity and type; the highest severity; types.
    let active = alarms_of(&s, &jwt, &b1, "&statusList=ACTIVE");
    assert_eq!(active.len(), 1);
    assert_eq!(alarms_of(&s, &jwt, &b1, "&statusList=CLEARED,ACK").len(), 1);
    let (_, all) =
        s.json("GET", "/api/v2/alarms?pageSize=100&page=0&severityList=MAJOR&severityList=WARNING", &jwt, None);
    assert_eq!(all["totalElements"], 3, "{all}");
    let (_, v1) = s.json(
        "GET",
        "/api/alarms?pageSize=2&page=0&searchStatus=ACTIVE&sortProperty=severity&sortOrder=DESC",
        &jwt,
        None,
    );
    assert_eq!((v1["totalElements"].as_u64(), v1["hasNext"].as_bool()), (Some(3), Some(true)), "{v1}");
    assert_eq!(v1["data"][0]["severity"], "CRITICAL");
    let (st, worst) = s.req("GET", &format!("/api/alarm/highestSeverity/DEVICE/{b2}"), Some(&jwt), None);
    assert_eq!((st, worst.as_str()), (200, "\"MAJOR\""));
    let (_, types) = s.json("GET", "/api/alarm/types?pageSize=10&page=0", &jwt, None);
    let types: Vec<&str> = types["data"].as_array().unwrap().iter().map(|t| t["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["Door open", "Overheat"]);
    let (st, e) = s.json("GET", "/api/alarms?pageSize=10&page=0&searchStatus=ACTIVE&status=ACTIVE_ACK", &jwt, None);
    assert_eq!(st, 400, "{e}");
}

#[test]
fn a_changed_rule_applies_from_the_next_message() {
    let s = Server::start();
    let jwt = s.login();
    let (st, mut profile) = s.json("POST", "/api/deviceProfile", &jwt, Some(boiler_profile()));
    assert_eq!(st, 200, "{profile}");
    let b = boiler(&s, &jwt, "boiler-1", "boiler-1-token");
    post(&s, "boiler-1-token", json!({"temperature": 95}));
    wait_alarm(&s, &jwt, &b, "Overheat", |a| a["status"] == "ACTIVE_UNACK");
    post(&s, "boiler-1-token", json!({"temperature": 40}));
    wait_alarm(&s, &jwt, &b, "Overheat", |a| a["status"] == "CLEARED_UNACK");

    // CRITICAL above 30 now: 35 raises it (it was below the clear rule's 50 before).
    let critical = &mut profile["profileData"]["alarms"][0]["createRules"]["CRITICAL"]["condition"]["condition"][0];
    critical["predicate"]["value"]["defaultValue"] = json!(30);
    let (st, saved) = s.json("POST", "/api/deviceProfile", &jwt, Some(profile.clone()));
    assert_eq!(st, 200, "{saved}");
    post(&s, "boiler-1-token", json!({"temperature": 35}));
    let a = wait_alarm(&s, &jwt, &b, "Overheat", |a| a["status"] == "ACTIVE_UNACK");
    assert_eq!(a["severity"], "CRITICAL");

    // No rules any more: nothing is evaluated.
    let id = a["id"]["id"].as_str().unwrap();
    assert_eq!(s.json("POST", &format!("/api/alarm/{id}/clear"), &jwt, None).0, 200);
    let mut profile = saved;
    profile["profileData"]["alarms"] = J::Null;
    assert_eq!(s.json("POST", "/api/deviceProfile", &jwt, Some(profile)).0, 200);
    post(&s, "boiler-1-token", json!({"temperature": 99}));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let active = alarms_of(&s, &jwt, &b, "&statusList=ACTIVE");
    assert!(active.is_empty(), "{active:?}");
}

#[test]
fn rule_progress_is_written_every_interval_and_survives_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let env = [("GRIDLINKS_ALARMS_RULE_STATE_INTERVAL", "1000")];
    let mut s = Server::start_on(&dir, &env);
    let jwt = s.login();
    save_boiler_profile(&s, &jwt);
    let b = boiler(&s, &jwt, "boiler-1", "boiler-1-token");
    // One of the two messages MAJOR needs, then kill -9 once the interval has passed.
    post(&s, "boiler-1-token", json!({"temperature": 75}));
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    s.kill9();
    let s = Server::start_on(&dir, &env);
    let jwt = s.login();
    post(&s, "boiler-1-token", json!({"temperature": 75}));
    wait_alarm(&s, &jwt, &b, "Overheat", |a| a["severity"] == "MAJOR");
}

#[test]
fn a_condition_over_two_keys_reads_the_stored_one_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    let both = json!({"condition": {"condition": [
        filter("temperature", "GREATER", json!({"defaultValue": 50})),
        filter("humidity", "GREATER", json!({"defaultValue": 80}))]}});
    let profile = json!({"name": "greenhouse", "profileData": {"configuration": {"type": "DEFAULT"},
        "alarms": [{"id": "muggy", "alarmType": "Muggy", "createRules": {"MAJOR": both}}]}});
    let (st, p) = s.json("POST", "/api/deviceProfile", &jwt, Some(profile));
    assert_eq!(st, 200, "{p}");
    let id = device(&s, &jwt, "gh-1", json!({"name": "gh-1", "type": "greenhouse", "deviceProfileId": p["id"]}));
    post(&s, "gh-1", json!({"humidity": 90}));
    s.sigterm();
    // The first message after the restart lacks humidity: the stored 90 is read.
    let s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    post(&s, "gh-1", json!({"temperature": 60}));
    wait_alarm(&s, &jwt, &id, "Muggy", |a| a["status"] == "ACTIVE_UNACK");
}

#[test]
fn a_raise_and_a_clear_in_one_message_are_written_in_order() {
    let s = Server::start();
    let jwt = s.login();
    save_boiler_profile(&s, &jwt);
    let b = boiler(&s, &jwt, "boiler-1", "boiler-1-token");
    // The clear is decided while the raise is not written yet: it must still clear it.
    let now = gridlinks_types::Ts::now().0;
    post(
        &s,
        "boiler-1-token",
        json!([{"ts": now - 2, "values": {"temperature": 99}}, {"ts": now - 1, "values": {"temperature": 40}}]),
    );
    let a = wait_alarm(&s, &jwt, &b, "Overheat", |a| a["status"] == "CLEARED_UNACK");
    assert_eq!(a["severity"], "CRITICAL");
    assert_eq!(a["startTs"], now - 2);
    assert_eq!(a["clearTs"], now - 1);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(alarms_of(&s, &jwt, &b, "").len(), 1, "one alarm, raised and cleared");
}

#[test]
fn the_alarm_api_creates_updates_in_place_and_keeps_tenants_apart() {
    let s = Server::start();
    let jwt = s.login();
    let dev = s.device(&jwt, "meter-1", "meter-1-token");
    let originator = json!({"entityType": "DEVICE", "id": dev});

    // Created; a second create of the same type while active updates it in place.
    let body = json!({"originator": originator, "type": "Leak", "severity": "MINOR", "details": {"where": "cellar"}});
    let (st, a) = s.json("POST", "/api/alarm", &jwt, Some(body.clone()));
    assert_eq!(st, 200, "{a}");
    for field in ["type", "originator", "severity", "acknowledged", "cleared", "name", "status"] {
        assert!(!a[field].is_null(), "{field} in {a}");
    }
    let id = a["id"]["id"].as_str().unwrap().to_owned();
    let mut bigger = body.clone();
    bigger["severity"] = json!("MAJOR");
    let (_, b) = s.json("POST", "/api/alarm", &jwt, Some(bigger));
    assert_eq!((b["id"]["id"].as_str(), b["severity"].as_str()), (Some(&*id), Some("MAJOR")));
    let (_, info) = s.json("GET", &format!("/api/alarm/info/{id}"), &jwt, None);
    assert_eq!((info["originatorName"].as_str(), info["details"]["where"].as_str()), (Some("meter-1"), Some("cellar")));

    // Comments: added, listed, deleted as ThingsBoard does (replaced by a system comment).
    let (st, c) =
        s.json("POST", &format!("/api/alarm/{id}/comment"), &jwt, Some(json!({"comment": {"text": "on my way"}})));
    assert_eq!((st, c["type"].as_str()), (200, Some("OTHER")), "{c}");
    let cid = c["id"]["id"].as_str().unwrap().to_owned();
    assert_eq!(s.req("DELETE", &format!("/api/alarm/{id}/comment/{cid}"), Some(&jwt), None).0, 200);
    let (_, list) = s.json("GET", &format!("/api/alarm/{id}/comment?pageSize=10&page=0"), &jwt, None);
    let deleted = list["data"].as_array().unwrap().iter().find(|x| x["id"]["id"] == cid.as_str()).unwrap().clone();
    assert_eq!(
        (deleted["type"].as_str(), deleted["comment"]["subtype"].as_str()),
        (Some("SYSTEM"), Some("COMMENT_DELETED"))
    );

    // Another tenant's administrator learns nothing of it; a customer user of another
    // customer is refused; their lists are empty.
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let (_, beta) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta"})));
    let beta_id = beta["id"]["id"].as_str().unwrap();
    let admin = json!({"email": "beta@example.com", "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": beta_id}});
    let (_, beta_jwt) = s.activated_user(&sys, admin, "beta-password-1");
    assert_eq!(s.json("GET", &format!("/api/alarm/{id}"), &beta_jwt, None).0, 404);
    assert_eq!(s.json("POST", &format!("/api/alarm/{id}/ack"), &beta_jwt, None).0, 404);
    assert_eq!(s.json("DELETE", &format!("/api/alarm/{id}"), &beta_jwt, None).0, 404);
    assert_eq!(s.json("POST", "/api/alarm", &beta_jwt, Some(body.clone())).0, 404, "not its device");
    assert_eq!(s.json("GET", "/api/v2/alarms?pageSize=10&page=0", &beta_jwt, None).1["totalElements"], 0);
    let acme = s.customer(&jwt, "Acme");
    let (_, acme_jwt) = s.user(&jwt, "ann@acme.example", Some(&acme), "acme-password-1");
    assert_eq!(s.json("GET", &format!("/api/alarm/{id}"), &acme_jwt, None).0, 403);
    assert_eq!(s.json("GET", "/api/alarms?pageSize=10&page=0", &acme_jwt, None).1["totalElements"], 0);
    // Once the device is the customer's, so is its alarm.
    assert_eq!(s.req("POST", &format!("/api/customer/{acme}/device/{dev}"), Some(&jwt), None).0, 200);
    let (_, mine) = s.json(
        "POST",
        "/api/alarm",
        &acme_jwt,
        Some(json!({"originator": originator, "type": "Tamper", "severity": "WARNING"})),
    );
    assert_eq!(mine["customerId"]["id"].as_str(), Some(&*acme), "{mine}");
    assert_eq!(s.json("GET", "/api/alarms?pageSize=10&page=0", &acme_jwt, None).1["totalElements"], 1);

    // Assign to a user who may see it (the candidates: the tenant's administrators, and the
    // alarm's customer's users: none here, it was raised before the device was Acme's);
    // clear; clear again is 400; delete; gone.
    let (admin2, _) = s.user(&jwt, "bob@example.com", None, "bob-password-1");
    let (_, candidates) = s.json("GET", &format!("/api/users/assign/{id}?pageSize=10&page=0"), &jwt, None);
    let emails: Vec<&str> =
        candidates["data"].as_array().unwrap().iter().map(|u| u["email"].as_str().unwrap()).collect();
    assert_eq!(emails, ["admin", "bob@example.com"], "{candidates}");
    let (st, assigned) = s.json("POST", &format!("/api/alarm/{id}/assign/{admin2}"), &jwt, None);
    assert_eq!((st, assigned["assigneeId"]["id"].as_str()), (200, Some(&*admin2)), "{assigned}");
    let (_, info) = s.json("GET", &format!("/api/alarm/info/{id}"), &jwt, None);
    assert_eq!(info["assignee"]["email"], "bob@example.com");
    assert_eq!(s.json("POST", &format!("/api/alarm/{id}/assign/{admin2}"), &jwt, None).0, 400);
    let (st, cleared) = s.json("POST", &format!("/api/alarm/{id}/clear"), &jwt, None);
    assert_eq!((st, cleared["status"].as_str()), (200, Some("CLEARED_UNACK")));
    assert_eq!(
        s.json("POST", &format!("/api/alarm/{id}/clear"), &jwt, None).1["message"],
        "Alarm was already cleared!"
    );
    let (_, fresh) = s.json("POST", "/api/alarm", &jwt, Some(body));
    assert_ne!(fresh["id"]["id"].as_str(), Some(&*id), "a cleared alarm is not updated: a new one starts");
    let (st, t) = s.req("DELETE", &format!("/api/alarm/{id}"), Some(&jwt), None);
    assert_eq!((st, t.as_str()), (200, "true"));
    assert_eq!(s.json("GET", &format!("/api/alarm/{id}"), &jwt, None).0, 404);

    // Deleting the device deletes its alarms.
    assert_eq!(s.req("DELETE", &format!("/api/device/{dev}"), Some(&jwt), None).0, 200);
    assert_eq!(s.json("GET", "/api/v2/alarms?pageSize=10&page=0", &jwt, None).1["totalElements"], 0);
}

#[test]
fn bad_alarm_rules_are_refused_on_save_naming_where() {
    let s = Server::start();
    let jwt = s.login();
    let wrong_predicate = json!({"key": {"type": "TIME_SERIES", "key": "t"}, "valueType": "NUMERIC",
        "predicate": {"type": "STRING", "operation": "EQUAL", "value": {"defaultValue": "x"}}});
    let cases = [
        (
            json!({"alarmType": "A", "createRules": {"MAJOR": {"condition": {"condition": [wrong_predicate]}}}}),
            "alarms[0].createRules.MAJOR.condition[0].predicate: a STRING predicate cannot test a NUMERIC value",
        ),
        (
            json!({"alarmType": "A", "createRules": {"MAJOR": {"condition": {"condition": [filter("", "GREATER", json!({"defaultValue": 1}))]}}}}),
            "'key' must be a non-empty string",
        ),
        (
            json!({"alarmType": "A", "createRules": {"MAJOR": {"condition": {"condition": [filter("t", "GREATER", json!({"defaultValue": 1}))]},
            "alarmDetails": "t=${t}, h=${humidity}"}}}),
            "'${humidity}' is not a key of this rule's condition",
        ),
        (json!({"createRules": {}}), "Alarm rule type should be specified!"),
    ];
    for (alarm, want) in cases {
        let body = json!({"name": "bad", "profileData": {"alarms": [alarm]}});
        let (st, e) = s.json("POST", "/api/deviceProfile", &jwt, Some(body));
        assert_eq!(st, 400, "{e}");
        assert!(e["message"].as_str().unwrap().contains(want), "{e} should say {want}");
    }
    assert_eq!(s.json("GET", "/api/deviceProfileInfo/default", &jwt, None).1["name"], "default", "nothing was saved");
}

/// `ALARM_DATA` and `ALARM_COUNT` as ThingsBoard's alarm widget sends them: the first page,
/// then the page again when an alarm is raised, acknowledged or cleared; counts follow; a
/// customer user sees its customer's alarms only.
#[test]
fn websocket_alarm_data_and_counts_follow_alarms_live() {
    let s = Server::start();
    let jwt = s.login();
    save_boiler_profile(&s, &jwt);
    let b1 = boiler(&s, &jwt, "ws-boiler-1", "ws-boiler-1-token");
    boiler(&s, &jwt, "ws-boiler-2", "ws-boiler-2-token");
    let mut ws = common::ws::open(&s, "/api/ws", std::time::Duration::from_secs(15));
    let data = json!({"cmdId": 1, "type": "ALARM_DATA", "query": {
        "entityFilter": {"type": "deviceType", "deviceTypes": ["boiler"]},
        "pageLink": {"page": 0, "pageSize": 10, "textSearch": null, "searchPropagatedAlarms": false,
            "sortOrder": {"key": {"type": "ALARM_FIELD", "key": "createdTime"}, "direction": "DESC"},
            "statusList": ["ACTIVE"], "severityList": [], "typeList": [], "timeWindow": 86_400_000},
        "alarmFields": [{"type": "ALARM_FIELD", "key": "type"}, {"type": "ALARM_FIELD", "key": "severity"}],
        "entityFields": [{"type": "ENTITY_FIELD", "key": "name"}],
        "latestValues": [{"type": "TIME_SERIES", "key": "temperature"}]}});
    let count = json!({"cmdId": 2, "type": "ALARM_COUNT", "query": {"statusList": ["ACTIVE", "UNACK"]}});
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [data, count]}));
    let first = next(&mut ws);
    assert_eq!(
        (first["cmdUpdateType"].as_str(), first["data"]["totalElements"].as_u64()),
        (Some("ALARM_DATA"), Some(0)),
        "{first}"
    );
    assert_eq!(first["totalEntities"], 2, "{first}");
    let counted = next(&mut ws);
    assert_eq!(
        (counted["cmdUpdateType"].as_str(), counted["count"].as_u64()),
        (Some("ALARM_COUNT_DATA"), Some(0)),
        "{counted}"
    );

    // Raised by a rule: both answers come again.
    post(&s, "ws-boiler-1-token", json!({"temperature": 99}));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(next(&mut ws));
    }
    let page = seen.iter().find(|m| m["cmdId"] == 1).unwrap();
    let alarm = &page["data"]["data"][0];
    assert_eq!((alarm["type"].as_str(), alarm["severity"].as_str()), (Some("Overheat"), Some("CRITICAL")), "{page}");
    assert_eq!(alarm["entityId"]["id"], b1.as_str());
    assert_eq!(alarm["latest"]["ENTITY_FIELD"]["name"]["value"], "ws-boiler-1", "{alarm}");
    assert_eq!(alarm["latest"]["TIME_SERIES"]["temperature"]["value"], "99", "{alarm}");
    assert_eq!(seen.iter().find(|m| m["cmdId"] == 2).unwrap()["count"], 1);

    // Acknowledged: the page changes (status), the count of unacknowledged drops.
    let id = alarm["id"]["id"].as_str().unwrap().to_owned();
    assert_eq!(s.json("POST", &format!("/api/alarm/{id}/ack"), &jwt, None).0, 200);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(next(&mut ws));
    }
    let page = seen.iter().find(|m| m["cmdId"] == 1).unwrap();
    assert_eq!(page["data"]["data"][0]["status"], "ACTIVE_ACK", "{page}");
    assert_eq!(seen.iter().find(|m| m["cmdId"] == 2).unwrap()["count"], 0);

    // Cleared by the rule: no longer ACTIVE, the page is empty again.
    post(&s, "ws-boiler-1-token", json!({"temperature": 20}));
    let page = next(&mut ws);
    assert_eq!((page["cmdId"].as_i64(), page["data"]["totalElements"].as_u64()), (Some(1), Some(0)), "{page}");

    // A customer user's session: its customer's alarms only.
    let acme = s.customer(&jwt, "Acme");
    let (_, acme_jwt) = s.user(&jwt, "cu@acme.example", Some(&acme), "acme-password-1");
    post(&s, "ws-boiler-2-token", json!({"temperature": 99}));
    let mut cu = common::ws::open(&s, "/api/ws", std::time::Duration::from_secs(15));
    let all = json!({"cmdId": 5, "type": "ALARM_COUNT", "query": {}});
    send(&mut cu, json!({"authCmd": {"cmdId": 0, "token": acme_jwt}, "cmds": [all]}));
    assert_eq!(next(&mut cu)["count"], 0);
    let bad = json!({"cmdId": 6, "type": "ALARM_DATA", "query": {"entityFilter": {"type": "entityType", "entityType": "DEVICE"},
        "pageLink": {"pageSize": 10, "sortOrder": {"key": {"type": "TIME_SERIES", "key": "t"}}}}});
    send(&mut cu, json!({"cmds": [bad]}));
    let e = next(&mut cu);
    assert_eq!(e["errorCode"], 2, "{e}");
}

/// An inactivity alarm, as ThingsBoard users write it: a rule on the device's `active`
/// server attribute, which device activity sets false after `inactivityTimeout` of
/// silence and true at the next message.
#[test]
fn an_inactivity_rule_raises_when_a_device_goes_silent_and_clears_when_it_is_back() {
    let env = [("GRIDLINKS_ACTIVITY_INACTIVITY_TIMEOUT", "1500"), ("GRIDLINKS_ACTIVITY_CHECK_INTERVAL", "200")];
    let s = Server::start_env(&env);
    let jwt = s.login();
    let active = |is: bool| {
        json!({"condition": {"condition": [{"key": {"type": "ATTRIBUTE", "key": "active"}, "valueType": "BOOLEAN",
            "predicate": {"type": "BOOLEAN", "operation": "EQUAL", "value": {"defaultValue": is}}}]}})
    };
    let profile = json!({"name": "watched", "profileData": {"alarms": [
        {"id": "silent", "alarmType": "Inactivity", "createRules": {"MAJOR": active(false)}, "clearRule": active(true)}]}});
    assert_eq!(s.json("POST", "/api/deviceProfile", &jwt, Some(profile)).0, 200);
    let id = device(&s, &jwt, "watched-1", json!({"name": "watched-1", "type": "watched"}));

    post(&s, "watched-1", json!({"t": 1}));
    let raised = wait_alarm(&s, &jwt, &id, "Inactivity", |a| a["status"] == "ACTIVE_UNACK");
    assert_eq!(raised["severity"], "MAJOR");
    post(&s, "watched-1", json!({"t": 2}));
    wait_alarm(&s, &jwt, &id, "Inactivity", |a| a["status"] == "CLEARED_UNACK");
}

/// Thresholds from the device's customer's and tenant's server attributes, set through the
/// REST telemetry API (`CUSTOMER` and `TENANT` entities): a change is used by the next
/// message; a customer user reads its customer's attributes but may not change them;
/// another tenant's customer is not found.
#[test]
fn customer_and_tenant_attributes_are_dynamic_thresholds() {
    let s = Server::start();
    let jwt = s.login();
    let numeric = |key: &str, source: &str, attr: &str, default: i64| {
        filter(
            key,
            "GREATER",
            json!({"defaultValue": default, "dynamicValue": {"sourceType": source, "sourceAttribute": attr}}),
        )
    };
    let profile = json!({"name": "kiln", "profileData": {"configuration": {"type": "DEFAULT"}, "alarms": [
        {"id": "hot", "alarmType": "Hot", "createRules": {"MAJOR": {"condition": {"condition":
            [numeric("temperature", "CURRENT_CUSTOMER", "maxTemp", 1000)]}}}},
        {"id": "loud", "alarmType": "Loud", "createRules": {"MINOR": {"condition": {"condition":
            [numeric("noise", "CURRENT_TENANT", "maxNoise", 1000)]}}}}]}});
    let (st, p) = s.json("POST", "/api/deviceProfile", &jwt, Some(profile));
    assert_eq!(st, 200, "{p}");
    let device = device(&s, &jwt, "tok-kiln", json!({"name": "kiln-1", "deviceProfileId": p["id"]}));
    let customer = s.customer(&jwt, "Potters");
    assert_eq!(s.json("POST", &format!("/api/customer/{customer}/device/{device}"), &jwt, None).0, 200);
    // Below the constant 1000: nothing.
    post(&s, "tok-kiln", json!({"temperature": 600, "noise": 70}));
    let set = |entity: &str, id: &str, body: J| {
        let path = format!("/api/plugins/telemetry/{entity}/{id}/attributes/SERVER_SCOPE");
        let (st, out) = s.req("POST", &path, Some(&jwt), Some(&body.to_string()));
        assert_eq!(st, 200, "{out}");
    };
    set("CUSTOMER", &customer, json!({"maxTemp": 500}));
    let (_, me) = s.json("GET", "/api/auth/user", &jwt, None);
    let tenant = me["tenantId"]["id"].as_str().unwrap().to_owned();
    set("TENANT", &tenant, json!({"maxNoise": 60}));
    post(&s, "tok-kiln", json!({"temperature": 600, "noise": 70}));
    wait_alarm(&s, &jwt, &device, "Hot", |a| a["severity"] == "MAJOR");
    wait_alarm(&s, &jwt, &device, "Loud", |a| a["severity"] == "MINOR");
    let (st, v) = s.json(
        "GET",
        &format!("/api/plugins/telemetry/CUSTOMER/{customer}/values/attributes/SERVER_SCOPE"),
        &jwt,
        None,
    );
    assert_eq!((st, v[0]["key"].as_str(), v[0]["value"].as_i64()), (200, Some("maxTemp"), Some(500)), "{v}");
    // A customer user reads its customer's attributes, and changes none.
    let (_, user_jwt) = s.user(&jwt, "potter@example.com", Some(&customer), "potter-password");
    let path = format!("/api/plugins/telemetry/CUSTOMER/{customer}/values/attributes/SERVER_SCOPE");
    assert_eq!(s.json("GET", &path, &user_jwt, None).0, 200);
    let path = format!("/api/plugins/telemetry/CUSTOMER/{customer}/attributes/SERVER_SCOPE");
    assert_eq!(s.req("POST", &path, Some(&user_jwt), Some(r#"{"maxTemp":1}"#)).0, 403);
    let path = format!("/api/plugins/telemetry/TENANT/{tenant}/values/attributes/SERVER_SCOPE");
    assert_eq!(s.json("GET", &path, &user_jwt, None).0, 403);
    // A customer that does not exist is not found (another tenant's: tenants.rs).
    let missing = "6d1c3e3a-0000-4000-8000-0000000000ff";
    let path = format!("/api/plugins/telemetry/CUSTOMER/{missing}/attributes/SERVER_SCOPE");
    assert_eq!(s.req("POST", &path, Some(&jwt), Some(r#"{"maxTemp":1}"#)).0, 404);
}
