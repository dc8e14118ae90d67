//! Device profiles as stored entities, through ThingsBoard's REST paths on the real binary:
//! the default profile, create/read/list/rename/delete with ThingsBoard's refusals, devices
//! referencing a profile by id (or by type, creating it), and the rule engine's 501.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

fn profiles(s: &Server, jwt: &str, query: &str) -> Vec<J> {
    let (st, v) = s.json("GET", &format!("/api/deviceProfiles?pageSize=100&page=0{query}"), jwt, None);
    assert_eq!(st, 200, "{v}");
    v["data"].as_array().unwrap().clone()
}

fn names(list: &[J]) -> Vec<&str> {
    list.iter().map(|p| p["name"].as_str().unwrap()).collect()
}

#[test]
fn profiles_are_entities_devices_point_at() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();

    // A fresh installation has its default profile.
    let list = profiles(&s, &jwt, "");
    assert_eq!(names(&list), ["default"]);
    assert_eq!(list[0]["default"], true);
    let (_, info) = s.json("GET", "/api/deviceProfileInfo/default", &jwt, None);
    assert_eq!(info["id"], list[0]["id"]);

    // Created with ThingsBoard's full body; what the client gave comes back.
    let alarms = json!([{"id": "highTemp", "alarmType": "High temperature", "createRules": {}}]);
    let body = json!({
        "name": "thermostat", "description": "room units", "type": "DEFAULT", "transportType": "MQTT",
        "provisionType": "ALLOW_CREATE_NEW_DEVICES", "provisionDeviceKey": "k1",
        "profileData": {"configuration": {"type": "DEFAULT"}, "alarms": alarms},
    });
    let (st, thermo) = s.json("POST", "/api/deviceProfile", &jwt, Some(body));
    assert_eq!(st, 200, "{thermo}");
    let thermo_id = thermo["id"]["id"].as_str().unwrap().to_owned();
    assert_eq!(thermo["id"]["entityType"], "DEVICE_PROFILE");
    let (st, back) = s.json("GET", &format!("/api/deviceProfile/{thermo_id}"), &jwt, None);
    assert_eq!(st, 200);
    assert_eq!(back["profileData"]["alarms"], alarms);
    assert_eq!((back["description"].as_str(), back["transportType"].as_str()), (Some("room units"), Some("MQTT")));
    assert_eq!(back["default"], false);
    let (_, info) = s.json("GET", &format!("/api/deviceProfileInfo/{thermo_id}"), &jwt, None);
    assert_eq!((info["name"].as_str(), info["transportType"].as_str()), (Some("thermostat"), Some("MQTT")));

    // The same name twice: refused.
    let (st, err) = s.json("POST", "/api/deviceProfile", &jwt, Some(json!({"name": "thermostat"})));
    assert_eq!(st, 400, "{err}");
    assert!(err["message"].as_str().unwrap().contains("already exists"), "{err}");

    // A device by profile id takes the profile's name as its type; one by an unknown type
    // creates that profile; one with neither gets the default.
    let by_id = json!({"name": "t-1", "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": thermo_id}});
    let (st, t1) = s.json("POST", "/api/device", &jwt, Some(by_id));
    assert_eq!(st, 200, "{t1}");
    assert_eq!((t1["type"].as_str(), t1["deviceProfileId"]["id"].as_str()), (Some("thermostat"), Some(&*thermo_id)));
    let (_, pump1) = s.json("POST", "/api/device", &jwt, Some(json!({"name": "p-1", "type": "pump"})));
    assert_eq!(pump1["type"], "pump");
    let list = profiles(&s, &jwt, "");
    assert_eq!(names(&list), ["default", "pump", "thermostat"]);
    let pump = list.iter().find(|p| p["name"] == "pump").unwrap();
    assert_eq!(pump1["deviceProfileId"], pump["id"]);
    let (_, plain) = s.json("POST", "/api/device", &jwt, Some(json!({"name": "d-1"})));
    assert_eq!(plain["type"], "default");
    let unknown = json!({"name": "x-1", "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": "00000000-0000-0000-0000-000000000042"}});
    assert_eq!(s.json("POST", "/api/device", &jwt, Some(unknown)).0, 404);

    // Search, sort and infos.
    assert_eq!(names(&profiles(&s, &jwt, "&textSearch=THERM")), ["thermostat"]);
    assert_eq!(names(&profiles(&s, &jwt, "&sortProperty=name&sortOrder=DESC")), ["thermostat", "pump", "default"]);
    assert_eq!(names(&profiles(&s, &jwt, "&transportType=MQTT")), ["thermostat"]);
    let (_, all) = s.json("GET", "/api/deviceProfile/names", &jwt, None);
    assert_eq!(all.as_array().unwrap().len(), 3);
    let (_, active) = s.json("GET", "/api/deviceProfile/names?activeOnly=true", &jwt, None);
    let mut active: Vec<&str> = active.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    active.sort_unstable();
    assert_eq!(active, ["default", "pump", "thermostat"], "each has a device");
    let (_, infos) = s.json("GET", "/api/deviceProfileInfos?pageSize=2&page=1", &jwt, None);
    assert_eq!((infos["totalElements"].as_u64(), infos["data"][0]["name"].as_str()), (Some(3), Some("thermostat")));

    // Renaming a profile renames its devices' type; the device keeps pointing at it.
    let mut renamed = back.clone();
    renamed["name"] = json!("room-thermostat");
    let (st, r) = s.json("POST", "/api/deviceProfile", &jwt, Some(renamed));
    assert_eq!((st, r["id"]["id"].as_str()), (200, Some(&*thermo_id)));
    let t1_id = t1["id"]["id"].as_str().unwrap();
    let (_, t1_again) = s.json("GET", &format!("/api/device/{t1_id}"), &jwt, None);
    assert_eq!(t1_again["type"], "room-thermostat");
    assert_eq!(t1_again["deviceProfileId"]["id"].as_str(), Some(&*thermo_id));

    // Deleting: the default and a profile in use are refused with ThingsBoard's messages.
    let default_id = list.iter().find(|p| p["name"] == "default").unwrap()["id"]["id"].as_str().unwrap().to_owned();
    let (st, err) = s.json("DELETE", &format!("/api/deviceProfile/{default_id}"), &jwt, None);
    assert_eq!((st, err["message"].as_str()), (400, Some("Deletion of Default Device Profile is prohibited!")));
    let (st, err) = s.json("DELETE", &format!("/api/deviceProfile/{thermo_id}"), &jwt, None);
    assert_eq!(st, 400);
    assert_eq!(err["message"], "The device profile referenced by the devices cannot be deleted!");
    assert_eq!(s.req("DELETE", &format!("/api/device/{t1_id}"), Some(&jwt), None).0, 200);
    assert_eq!(s.req("DELETE", &format!("/api/deviceProfile/{thermo_id}"), Some(&jwt), None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/deviceProfile/{thermo_id}"), &jwt, None).0, 404);

    // Another default: devices created without a profile get it; the old default can go.
    let pump_id = pump["id"]["id"].as_str().unwrap();
    let (st, d) = s.json("POST", &format!("/api/deviceProfile/{pump_id}/default"), &jwt, None);
    assert_eq!((st, d["default"].as_bool()), (200, Some(true)));
    let (_, info) = s.json("GET", "/api/deviceProfileInfo/default", &jwt, None);
    assert_eq!(info["name"], "pump");
    let (_, d2) = s.json("POST", "/api/device", &jwt, Some(json!({"name": "d-2"})));
    assert_eq!(d2["type"], "pump");
    assert_eq!(s.json("DELETE", &format!("/api/deviceProfile/{default_id}"), &jwt, None).0, 400, "d-1 uses it");

    // Profiles, the default and what devices point at survive a restart.
    s.sigterm();
    let s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    let list = profiles(&s, &jwt, "");
    assert_eq!(names(&list), ["default", "pump"]);
    assert_eq!(list.iter().find(|p| p["default"] == true).unwrap()["name"], "pump");
    let (_, d2_again) = s.json("GET", &format!("/api/device/{}", d2["id"]["id"].as_str().unwrap()), &jwt, None);
    assert_eq!(d2_again["deviceProfileId"]["id"].as_str(), Some(pump_id));
}

#[test]
fn tokens_are_generated_and_the_rule_engine_answers_501() {
    let s = Server::start();
    let jwt = s.login();
    for (name, query) in [("g-1", ""), ("g-2", "?accessToken=")] {
        let (st, d) = s.json("POST", &format!("/api/device{query}"), &jwt, Some(json!({"name": name})));
        assert_eq!(st, 200, "{d}");
        let id = d["id"]["id"].as_str().unwrap();
        let (_, cred) = s.json("GET", &format!("/api/device/{id}/credentials"), &jwt, None);
        let token = cred["credentialsId"].as_str().unwrap();
        assert_eq!(token.len(), 20, "{token}");
        assert!(token.chars().all(|c| c.is_ascii_alphanumeric()), "{token}");
        assert_eq!(s.telemetry(token, r#"{"t":1}"#), 200);
    }
    for path in [
        "/api/ruleChains?pageSize=10&page=0",
        "/api/ruleChain/0e4e0e0e-0000-0000-0000-000000000000",
        "/api/ruleNode/x/debugIn",
    ] {
        let (st, body) = s.req("GET", path, Some(&jwt), None);
        assert_eq!(st, 501, "{path}: {body}");
        assert!(body.contains("Rule chains are not supported"), "{body}");
    }
}
