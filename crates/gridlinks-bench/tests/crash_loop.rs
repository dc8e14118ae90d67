//! `crash-loop` against the real `gridlinks` binary: two kill -9 cycles under MQTT load
//! and under HTTP load; every cycle acknowledges points, the server comes back each time,
//! and after the last restart every acknowledged point of both cycles is stored.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::{read_json, run_bench, run_bench_in, run_scenario, scratch, server_bin, stdout};
use serde_json::Value;

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Runs a two-cycle crash loop over `transport` (with `extra` options) and checks its JSON.
fn two_cycles(transport: &str, extra: &[&str]) -> Value {
    let mut args = vec!["crash-loop", "--transport", transport, "--cycles", "2", "--devices", "4"];
    args.extend(["--kill-after", "1s..1500ms", "--seed", "5"]);
    args.extend(extra);
    let (out, r) = run_scenario(&format!("crash-loop-{transport}"), &args);
    assert!(out.contains("LOSS CHECK PASSED"));
    assert_eq!(r["transport"], transport);
    assert_eq!(r["passed"], true);
    assert_eq!(r["cycles_without_acks"], serde_json::json!([]));
    let cycles = r["cycles"].as_array().unwrap();
    assert_eq!(cycles.len(), 2);
    let mut acked = 0;
    for c in cycles {
        assert_eq!(n(&c["connected"]), 4, "{c}");
        assert!(n(&c["acked"]) > 0, "{c}");
        assert!(n(&c["sent"]) >= n(&c["acked"]), "{c}");
        let kill_after = f(&c["kill_after_s"]);
        assert!((1.0..=1.5).contains(&kill_after), "{c}");
        // The load ran until the kill, which ended every device's connection.
        assert!(f(&c["load_seconds"]) >= kill_after - 0.01, "{c}");
        assert_eq!(c["ended"].as_object().unwrap().values().map(n).sum::<u64>(), 4, "{c}");
        assert!(f(&c["restart_to_ready_s"]) > 0.0, "{c}");
        acked += n(&c["acked"]);
    }
    let check = &r["loss_check"];
    assert_eq!(n(&r["totals"]["acked"]), acked);
    assert_eq!(n(&check["points_acked"]), acked, "every ack is a distinct point");
    assert_eq!(n(&check["points_found"]), acked);
    assert_eq!(n(&check["missing"]), 0);
    assert_eq!(n(&check["devices_not_found"]), 0);
    r
}

#[test]
fn mqtt_points_acknowledged_before_each_kill_survive_it() {
    let dir = scratch("crash-loop-mqtt-data");
    let data = dir.join("data");
    let r = two_cycles("mqtt", &["--window", "5", "--data-dir", data.to_str().unwrap()]);
    assert!(r["protocol"].as_str().unwrap().contains("window 5"));
    // A given data directory is the one used, and kept.
    assert_eq!(r["data_dir"], data.to_str().unwrap());
    assert!(std::fs::read_dir(&data).unwrap().next().is_some());
    // It must be empty for the next run.
    let out = run_bench(&[
        "crash-loop",
        "--data-dir",
        data.to_str().unwrap(),
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn http_points_answered_before_each_kill_survive_it() {
    let r = two_cycles("http", &[]);
    assert_eq!(r["protocol"], "HTTP/1.1 keep-alive");
    // The default data directory is temporary and removed after a passed run.
    let data = std::path::PathBuf::from(r["data_dir"].as_str().unwrap());
    assert!(!data.exists(), "{} left behind", data.display());
}

/// The proof can fail: a "server" whose store loses everything on its second start (a
/// wrapper that empties the data directory, then runs gridlinks) must fail the run with
/// exit code 2 and every point of the first cycle missing.
#[test]
fn a_store_that_loses_acknowledged_points_fails_the_run() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("crash-loop-lossy");
    let (data, json, wrapper) = (dir.join("data"), dir.join("r.json"), dir.join("lossy"));
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             if [ \"$1\" = serve ]; then\n\
             \x20 n=$(($(cat '{count}' 2>/dev/null || echo 0) + 1)); echo $n > '{count}'\n\
             \x20 [ $n = 2 ] && rm -rf '{data}'/*\n\
             fi\n\
             exec '{bin}' \"$@\"\n",
            count = dir.join("starts").display(),
            data = data.display(),
            bin = server_bin().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The failed run keeps the server's directory: in `dir`, removed with it.
    let out = run_bench_in(
        &dir,
        &[
            "crash-loop",
            "--cycles",
            "2",
            "--devices",
            "2",
            "--kill-after",
            "1s",
            "--gridlinks-bin",
            wrapper.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).contains("LOSS CHECK FAILED"));
    let r = read_json(&json);
    let first = n(&r["cycles"][0]["acked"]);
    assert!(first > 0);
    // The devices went with the data: the second cycle could not even connect.
    assert_eq!(n(&r["cycles"][1]["acked"]), 0);
    assert_eq!(r["cycles_without_acks"], serde_json::json!([2]));
    assert_eq!(n(&r["loss_check"]["missing"]), first);
    assert_eq!(n(&r["loss_check"]["devices_not_found"]), 2);
    assert_eq!(r["passed"], false);
    let _ = std::fs::remove_dir_all(&dir);
}
