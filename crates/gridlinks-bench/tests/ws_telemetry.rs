//! `ws-telemetry` against the real `gridlinks` binary: every acknowledged post reaches its
//! WebSocket subscription, with one session per device and with one session for all, and
//! its canonical-topic MQTT subscriber; without receivers, posting alone is measured.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::run_scenario;

fn ws_telemetry(extra: &[&str]) -> serde_json::Value {
    // 40 devices: more sessions of one user than ws.max_sessions_per_user allows by default
    // (the scenario raises the bound for its run).
    let mut args = vec!["ws-telemetry", "--devices", "40", "--rate", "5", "--duration", "2s", "--connections", "4"];
    args.extend_from_slice(extra);
    let run = run_scenario(&format!("ws-telemetry{}", extra.join("")), &args).1["run"].clone();
    assert!(run["posted"].as_u64().unwrap() > 0, "{run}");
    assert_eq!(run["received"], run["posted"], "{run}");
    assert_eq!(run["missing"], 0, "{run}");
    assert!(run["latency"]["p50_us"].as_u64().unwrap() > 0, "{run}");
    run
}

#[test]
fn every_post_reaches_its_session() {
    assert_eq!(ws_telemetry(&[])["sessions"], 40);
}

#[test]
fn every_post_reaches_the_one_session() {
    assert_eq!(ws_telemetry(&["--one-session"])["sessions"], 1);
}

#[test]
fn every_post_reaches_its_mqtt_subscriber() {
    let run = ws_telemetry(&["--via", "mqtt"]);
    assert_eq!((run["via"].as_str(), run["sessions"].as_u64()), (Some("mqtt"), Some(40)));
    assert_eq!(ws_telemetry(&["--via", "mqtt", "--one-session"])["sessions"], 1);
}

#[test]
fn posting_alone_has_no_receivers_and_misses_nothing() {
    let args =
        ["ws-telemetry", "--devices", "20", "--rate", "5", "--duration", "2s", "--connections", "4", "--via", "none"];
    let run = run_scenario("ws-telemetry-none", &args).1["run"].clone();
    assert!(run["posted"].as_u64().unwrap() > 0, "{run}");
    assert_eq!(
        (run["sessions"].as_u64(), run["received"].as_u64(), run["missing"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{run}"
    );
    assert!(run["server_cpu_us_per_post"].as_f64().unwrap() > 0.0, "{run}");
}
