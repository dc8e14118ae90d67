//! The alarm options and scenarios against the real server: `--device-profile` creates
//! the devices in a profile whose rules then raise alarms, `alarm-latency` sees every
//! probe's alarm, `alarm-list` counts what it created.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use std::path::Path;

use common::{read_json, Server};
use serde_json::{json, Value};

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

#[test]
fn device_profile_puts_the_provisioned_devices_in_it_and_its_rules_raise_alarms() {
    let server = Server::start("alarm-profile");
    // The shipped five rules are accepted as they are.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/alarm-rules-5.json");
    let client = server.client();
    let profile: Value = serde_json::from_str(&std::fs::read_to_string(&shipped).unwrap()).unwrap();
    assert_eq!(client.save_device_profile(&profile).unwrap(), "bench-alarm-rules-5");

    // A rule every message of the bench's default payload meets (temperature 20.0..29.9).
    let always = server.dir.join("always.json");
    let rule = json!({"condition": {"condition": [{"key": {"type": "TIME_SERIES", "key": "temperature"},
        "valueType": "NUMERIC", "predicate": {"type": "NUMERIC", "operation": "GREATER",
        "value": {"defaultValue": 10}}}], "spec": {"type": "SIMPLE"}}});
    let doc = json!({"name": "bench-always", "profileData": {"alarms": [
        {"id": "warm", "alarmType": "Warm", "createRules": {"MINOR": rule}}]}});
    std::fs::write(&always, doc.to_string()).unwrap();
    let run = |profile: &Path| {
        let out = server.bench(&[
            "mqtt-telemetry",
            "--devices",
            "3",
            "--messages-per-device",
            "5",
            "--provision",
            "--device-profile",
            profile.to_str().unwrap(),
            "--verify",
        ]);
        assert_eq!(out.status.code(), Some(0));
    };
    run(&always);
    // Saved twice (the second time it replaces the first): still one profile of that name.
    run(&always);
    let names = client.get_json("/api/deviceProfile/names").unwrap();
    let named = names.as_array().unwrap().iter().filter(|p| p["name"] == "bench-always").count();
    assert_eq!(named, 1, "{names}");
    for i in 0..3 {
        let id = client.device_id(&format!("bench-{i}")).unwrap().unwrap();
        let device = client.get_json(&format!("/api/device/{id}")).unwrap();
        assert_eq!(device["type"], "bench-always", "{device}");
        // Rules run on committed data, shortly after the ack: wait for the alarm.
        let path = format!("/api/v2/alarm/DEVICE/{id}?pageSize=10&page=0&statusList=ACTIVE");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let page = client.get_json(&path).unwrap();
            if n(&page["totalElements"]) == 1 {
                assert_eq!(page["data"][0]["type"], "Warm", "{page}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no alarm on bench-{i}: {page}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

#[test]
fn device_profile_needs_provision() {
    let server = Server::start("alarm-profile-alone");
    let out = server.bench(&["mqtt-telemetry", "--devices", "1", "--device-profile", "x.json", "--username", "u"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--device-profile needs --provision"));
}

#[test]
fn alarm_latency_sees_every_probe_alarm_and_its_clear() {
    let server = Server::start("alarm-latency");
    let json = server.dir.join("latency.json");
    let args = ["alarm-latency", "--probes", "6", "--devices", "3", "--interval", "10ms", "--json"];
    let mut all = args.to_vec();
    all.push(json.to_str().unwrap());
    assert_eq!(server.bench(&all).status.code(), Some(0));
    let run = &read_json(&json)["run"];
    assert_eq!((n(&run["raised"]), n(&run["timed_out"])), (6, 0), "{run}");
    assert_eq!(n(&run["ack_to_cleared_ms"]["count"]), 6, "{run}");
    assert!(run["ack_to_visible_ms"]["p50"].as_f64().unwrap() > 0.0, "{run}");
    // Again on the same devices: the earlier alarms were cleared, new ones are raised.
    assert_eq!(server.bench(&all).status.code(), Some(0));
    assert_eq!(n(&read_json(&json)["run"]["raised"]), 6);
    let id = server.client().device_id("alarm-probe-0").unwrap().unwrap();
    let all_alarms = server.client().get_json(&format!("/api/v2/alarm/DEVICE/{id}?pageSize=100&page=0")).unwrap();
    // Two probes a run on device 0 (6 probes over 3 devices), two runs.
    assert_eq!(n(&all_alarms["totalElements"]), 4, "{all_alarms}");
}

#[test]
fn alarm_list_creates_the_alarms_and_counts_them_by_status() {
    let server = Server::start("alarm-list");
    let json = server.dir.join("list.json");
    let out = server.bench(&[
        "alarm-list",
        "--alarms",
        "200",
        "--devices",
        "10",
        "--threads",
        "4",
        "--requests",
        "3",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let run = &read_json(&json)["run"];
    assert_eq!(n(&run["created"]), 200, "{run}");
    let totals: Vec<(u64, u64)> =
        run["queries"].as_array().unwrap().iter().map(|q| (n(&q["total_elements"]), n(&q["rows"]))).collect();
    // ACTIVE page of 100, ACTIVE count, CLEARED count, one device's 20.
    assert_eq!(totals, vec![(150, 100), (150, 1), (50, 1), (20, 20)], "{run}");
}
