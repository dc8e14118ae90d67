//! Every scenario of the tool, run briefly against real servers, with the counts checked
//! to add up: GridLinks (started by the test or by `compare`) and Mosquitto (started by
//! `compare` on a free loopback port; `apt-get install mosquitto`).
//!
//! Devices send a fixed number of messages (`--messages-per-device`), not for a fixed
//! time, so the counts checked are exact and do not depend on the machine's speed.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::{read_json, run_bench, scratch, server_bin, stdout, Server};
use serde_json::Value;

/// The runs of the first step of a compare/preset JSON, by server name.
fn runs(doc: &Value, step: usize) -> Vec<(String, Value)> {
    doc["steps"][step]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["server"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// sent = acked + failed, and nothing failed on a healthy server.
fn assert_publish_counts(result: &Value, connections: u64) {
    assert_eq!(n(&result["connected"]), connections, "{result}");
    assert!(n(&result["acked"]) > 0, "{result}");
    assert_eq!(n(&result["sent"]), n(&result["acked"]) + n(&result["failed"]));
    assert_eq!(n(&result["failed"]), 0, "{result}");
}

/// With `--tenant` GridLinks' devices live in a tenant of their own: the tool makes it as
/// the system administrator, and the loss check reads through the tenant's administrator.
#[test]
fn compare_with_devices_in_a_tenant_of_their_own_checks_every_point() {
    let dir = scratch("compare-tenant");
    let json = dir.join("c.json");
    let out = run_bench(&[
        "compare",
        "--servers",
        "gridlinks",
        "--tenant",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "mqtt-telemetry",
        "--devices",
        "10",
        "--messages-per-device",
        "20",
        "--ramp-up",
        "500ms",
        "--verify",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let runs = runs(&read_json(&json), 0);
    let gl = &runs[0].1["result"];
    assert_publish_counts(gl, 10);
    assert_eq!(n(&gl["acked"]), 200, "{gl}");
    assert_eq!(gl["loss_check"]["passed"], true, "{gl}");
    assert_eq!(gl["loss_check"]["points_found"], gl["acked"]);
}

#[test]
fn compare_runs_telemetry_on_gridlinks_and_mosquitto_with_counts_that_add_up() {
    let dir = scratch("compare-telemetry");
    let (json, html) = (dir.join("c.json"), dir.join("c.html"));
    let out = run_bench(&[
        "compare",
        "--against",
        "mosquitto",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "mqtt-telemetry",
        "--devices",
        "10",
        "--interval",
        "100ms",
        "--messages-per-device",
        "20",
        "--ramp-up",
        "500ms",
        "--verify",
        "--storage-lag",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let doc = read_json(&json);
    let runs = runs(&doc, 0);
    assert_eq!(runs.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(), ["gridlinks", "mosquitto"]);
    for (server, run) in &runs {
        let result = &run["result"];
        assert_publish_counts(result, 10);
        assert_eq!(n(&result["acked"]), 200, "{server}: {result}");
        // CPU is sampled for both; a quiet Mosquitto can use less than one 10 ms tick, so
        // only presence is asserted (gridlinks also provisions and stores: always > 0).
        assert!(result["server"]["cpu_seconds"].as_f64().unwrap() >= 0.0, "{server}: {result}");
        let acked = n(&result["acked"]);
        assert_eq!(n(&result["ack_latency"]["count"]), acked, "{server}");
    }
    // GridLinks: every acked point stored, lag sampled; Mosquitto stores nothing to check.
    let gl = &runs[0].1["result"];
    assert!(gl["server"]["cpu_seconds"].as_f64().unwrap() > 0.0, "{gl}");
    assert_eq!(gl["loss_check"]["passed"], true);
    assert_eq!(gl["loss_check"]["points_found"], gl["acked"]);
    assert!(n(&gl["storage_lag"]["ack_to_queryable"]["count"]) > 0, "{gl}");
    assert!(runs[1].1["result"]["loss_check"].is_null());
    // The side-by-side table names both servers and the ratio.
    let text = stdout(&out);
    assert!(text.contains("gridlinks / mosquitto"), "{text}");
    assert!(text.contains("msgs per server CPU-second"), "{text}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("mosquitto"), "charts in the report");
}

#[test]
fn pubsub_on_gridlinks_and_mosquitto_delivers_every_message_to_every_subscriber() {
    let dir = scratch("pubsub");
    let json = dir.join("p.json");
    let out = run_bench(&[
        "compare",
        "--servers",
        "gridlinks,mosquitto",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "pubsub",
        "--groups",
        "2",
        "--publishers",
        "3",
        "--subscribers",
        "2",
        "--messages-per-publisher",
        "20",
        // A hang guard for the last deliveries: the run ends when all are in.
        "--drain-timeout",
        "30s",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let runs = runs(&read_json(&json), 0);
    assert_eq!(runs.len(), 2);
    for (server, run) in &runs {
        let result = &run["result"];
        assert_publish_counts(result, 2 * 3 + 2 * 2);
        assert_eq!(n(&result["acked"]), 2 * 3 * 20, "{server}: {result}");
        let acked = n(&result["acked"]);
        assert_eq!(n(&result["expected"]), 2 * acked, "{server}: each group's 2 subscribers get all");
        assert_eq!(n(&result["received"]), n(&result["expected"]), "{server}");
        assert_eq!(n(&result["e2e_latency"]["count"]), n(&result["received"]));
        assert_eq!(result["passed"], true, "{server}");
    }
}

#[test]
fn http_telemetry_with_a_payload_template_stores_every_answered_point() {
    let server = Server::start("http");
    let json = server.dir.join("h.json");
    let out = server.bench(&[
        "http-telemetry",
        "--devices",
        "5",
        "--interval",
        "100ms",
        "--messages-per-device",
        "20",
        "--provision",
        "--verify",
        "--storage-lag",
        "--payload-template",
        r#"{"ts":{ts},"values":{"temperature":{randf:20:30},"id":"{str:6}","seq":{seq}}}"#,
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    assert_eq!(result["scenario"], "http-telemetry");
    assert_publish_counts(&result, 5);
    assert_eq!(n(&result["acked"]), 100, "{result}");
    assert_eq!(result["loss_check"]["points_found"], result["acked"]);
    assert_eq!(result["loss_check"]["missing"], 0);
    assert!(n(&result["storage_lag"]["ack_to_queryable"]["count"]) > 0);
}

#[test]
fn connect_from_two_worker_processes_holds_every_connection_on_gridlinks_and_mosquitto() {
    let dir = scratch("connect");
    let json = dir.join("c.json");
    let out = run_bench(&[
        "compare",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "connect",
        "--connections",
        "200",
        "--hold",
        "1s",
        "--workers",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(0));
    for (server, run) in runs(&read_json(&json), 0) {
        let result = &run["result"];
        assert_eq!(n(&result["connected"]), 200, "{server}: {result}");
        assert_eq!(result["success_ratio"], 1.0, "{server}");
        assert!(result["dropped_connections"].as_object().unwrap().is_empty());
    }
}

#[test]
fn presets_run_scaled_down() {
    let dir = scratch("preset");
    let json = dir.join("p.json");
    let out = run_bench(&[
        "preset",
        "tb-2021",
        "--scale",
        "0.001",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let doc = read_json(&json);
    assert_eq!(doc["steps"].as_array().unwrap().len(), 2);
    for step in 0..2 {
        for (server, run) in runs(&doc, step) {
            let result = &run["result"];
            // 19 devices (19,000 scaled by 0.001) x 10 messages each.
            assert_eq!(n(&result["acked"]), 190, "{server}: {result}");
            assert_publish_counts(result, 19);
        }
    }
}

#[test]
fn workers_split_one_run_and_the_loss_check_covers_all_of_them() {
    let server = Server::start("workers");
    let json = server.dir.join("w.json");
    let out = server.bench(&[
        "mqtt-telemetry",
        "--workers",
        "3",
        "--devices",
        "10",
        "--messages-per-device",
        "20",
        "--provision",
        "--verify",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    // 10 devices over 3 processes (3 + 3 + 4), each with its own token.
    assert_publish_counts(&result, 10);
    assert_eq!(n(&result["acked"]), 200, "{result}");
    assert_eq!(n(&result["ack_latency"]["count"]), n(&result["acked"]));
    let check = &result["loss_check"];
    assert_eq!(check["devices_checked"], 10);
    assert_eq!(check["points_acked"], result["acked"]);
    assert_eq!(check["points_found"], result["acked"]);
    assert_eq!(check["passed"], true);
}

#[test]
fn devices_from_a_name_token_csv_are_driven_and_checked_by_name() {
    let server = Server::start("csv");
    let names: Vec<String> = (0..4).map(|i| format!("meter-{i}")).collect();
    let tokens: Vec<String> = (0..4).map(|i| format!("csv-token-{i}")).collect();
    server.client().bulk_import(&names, &tokens).unwrap();
    let csv = server.dir.join("devices.csv");
    let rows: Vec<String> = names.iter().zip(&tokens).map(|(n, t)| format!("{n},{t}")).collect();
    std::fs::write(&csv, format!("name,token\n{}\n", rows.join("\n"))).unwrap();
    let json = server.dir.join("csv.json");
    let out = server.bench(&[
        "mqtt-telemetry",
        "--tokens-file",
        csv.to_str().unwrap(),
        "--devices",
        "4",
        "--messages-per-device",
        "10",
        "--verify",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    assert_publish_counts(&result, 4);
    assert_eq!(n(&result["acked"]), 40, "{result}");
    assert_eq!(result["loss_check"]["devices_checked"], 4);
    assert_eq!(result["loss_check"]["devices_not_found"], 0);
    assert_eq!(result["loss_check"]["points_found"], result["acked"]);
}
