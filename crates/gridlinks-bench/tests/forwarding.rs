//! The data-forwarding options against the real server, at tiny scale: `--forward-http`
//! gets every acknowledged message at the tool's own receiver (also inside `compare`,
//! which starts GridLinks allowing loopback sinks), `--forward-blackhole` runs with a sink
//! that never answers and sees the outbox hold what was not sent, `crash-loop
//! --forward-http` kills the server and stops the receiver in every cycle and still finds
//! every acknowledged point at the sink, and `--forward-kafka` reads every message back
//! from a real Kafka (`scripts/services/kafka.sh`; skipped, saying so, without `java`).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{read_json, run_bench, scratch, server_bin, stdout, Server};
use serde_json::Value;

/// What the server needs for a sink on loopback; retries every 100 ms (not 1 s) so the
/// tests do not wait on back-off.
const ENV: [(&str, &str); 2] =
    [("GRIDLINKS_FORWARDING_ALLOW_PRIVATE_ADDRESSES", "true"), ("GRIDLINKS_FORWARDING_RETRY_DELAY", "100")];

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

/// Runs `mqtt-telemetry` with `extra` against `server`: 5 devices, 4 messages each,
/// checked; its exit code and report.
fn telemetry(server: &Server, name: &str, extra: &[&str]) -> (Option<i32>, Value) {
    let json = server.dir.join(format!("{name}.json"));
    let mut args = vec![
        "mqtt-telemetry",
        "--devices",
        "5",
        "--messages-per-device",
        "4",
        "--provision",
        "--verify",
        "--forward-drain",
        "30s",
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = server.bench(&args);
    (out.status.code(), read_json(&json))
}

/// The forwarding report's invariants for a sink that got everything (and perhaps points
/// committed but never acknowledged, in flight at a kill).
fn assert_all_arrived(f: &Value) {
    assert_eq!(f["missing"], 0, "{f}");
    assert_eq!(f["passed"], true, "{f}");
    assert_eq!(n(&f["unique_received"]) - n(&f["unacked_received"]), n(&f["acked"]), "{f}");
    assert!(n(&f["events_received"]) >= n(&f["unique_received"]), "{f}");
    assert_eq!(n(&f["events_received"]) - n(&f["unique_received"]), n(&f["duplicates"]), "{f}");
    assert!(f["drain_seconds"].as_f64().is_some(), "{f}");
    let lag = &f["lag"];
    assert_eq!(n(&lag["count"]), n(&f["unique_received"]), "{f}");
    assert!(n(&lag["p50_us"]) > 0 && n(&lag["max_us"]) < 30_000_000, "{f}");
}

/// [`assert_all_arrived`] for a run without kills: nothing unacknowledged, no event
/// stamped after its arrival (one message per device per ms at most), and the server's
/// statistics count every event delivered.
fn assert_all_arrived_once(f: &Value) {
    assert_all_arrived(f);
    assert_eq!((n(&f["unacked_received"]), n(&f["stamped_ahead"])), (0, 0), "{f}");
    assert!(n(&f["sink_stats"]["delivered_events"]) >= n(&f["acked"]), "{f}");
}

#[test]
fn forward_http_gets_every_acknowledged_message_at_the_receiver() {
    let server = Server::start_with("forward-http", &ENV);
    let (code, report) = telemetry(&server, "http", &["--forward-http", "--forward-batch-size", "3"]);
    assert_eq!(code, Some(0));
    assert_eq!(n(&report["acked"]), 20, "{report}");
    let f = &report["forwarding"];
    assert_eq!(f["sink"], "http", "{f}");
    assert_eq!(n(&f["acked"]), 20, "{f}");
    assert_all_arrived_once(f);
    // The sink was deleted after the run: a server that keeps running sends nowhere.
    let sinks = server.client().get_json("/api/forwarding/sinks?pageSize=10&page=0").unwrap();
    assert_eq!(n(&sinks["totalElements"]), 0, "{sinks}");
}

#[test]
fn forward_blackhole_runs_while_the_outbox_holds_what_was_not_sent() {
    let server = Server::start_with("forward-blackhole", &ENV);
    let (code, report) = telemetry(&server, "blackhole", &["--forward-blackhole"]);
    assert_eq!(code, Some(0), "the loss check passes: ingest went on");
    assert_eq!(n(&report["acked"]), 20, "{report}");
    let f = &report["forwarding"];
    assert_eq!(f["sink"], "blackhole", "{f}");
    assert!(f["missing"].is_null(), "nothing can arrive: {f}");
    assert_eq!(n(&f["unique_received"]), 0, "{f}");
    assert!(n(&f["outbox_entries_window_end"]) > 0, "the outbox keeps the unsent entries: {f}");
    assert_eq!(n(&f["sink_stats"]["delivered_events"]), 0, "{f}");
}

#[test]
fn forward_options_are_checked_before_a_run() {
    let server = Server::start_with("forward-options", &ENV);
    let refused = |extra: &[&str], code: i32, says: &str| {
        let mut args = vec!["mqtt-telemetry", "--devices", "2", "--messages-per-device", "1", "--provision"];
        args.extend(extra);
        let out = server.bench(&args);
        assert_eq!(out.status.code(), Some(code), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{extra:?}: {err}");
    };
    refused(&["--forward-http", "--workers", "2"], 1, "leave out --workers");
    refused(&["--forward-http", "--qos", "0"], 1, "need --qos 1");
    // One sink kind at a time (a usage error: clap's exit code).
    refused(&["--forward-http", "--forward-blackhole"], 2, "cannot be used with");
    // A server that does not allow loopback sinks refuses the sink, and the tool says why.
    let strict = Server::start("forward-strict");
    let out = strict.bench(&[
        "mqtt-telemetry",
        "--devices",
        "2",
        "--messages-per-device",
        "1",
        "--provision",
        "--forward-http",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GRIDLINKS_FORWARDING_ALLOW_PRIVATE_ADDRESSES=true"), "{err}");
}

#[test]
fn compare_starts_gridlinks_allowing_the_loopback_sink() {
    let json = scratch("forward-compare").join("c.json");
    let out = run_bench(&[
        "compare",
        "--servers",
        "gridlinks",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "mqtt-telemetry",
        "--devices",
        "5",
        "--messages-per-device",
        "3",
        "--verify",
        "--forward-http",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = &read_json(&json)["steps"][0]["runs"][0]["result"];
    assert_eq!(n(&result["acked"]), 15, "{result}");
    assert_all_arrived_once(&result["forwarding"]);
    let text = stdout(&out);
    assert!(text.contains("FORWARDING CHECK PASSED"), "{text}");
    assert!(text.contains("forwarded msgs missing"), "the comparison table has the forwarding rows: {text}");
}

#[test]
fn crash_loop_with_an_http_sink_finds_every_acknowledged_point_there() {
    let tmp = scratch("forward-crash-loop");
    let json = tmp.join("crash.json");
    let mut cmd = Command::new(common::BENCH);
    cmd.args([
        "crash-loop",
        "--transport",
        "mqtt",
        "--cycles",
        "2",
        "--devices",
        "4",
        "--kill-after",
        "2s",
        "--receiver-down",
        "500ms",
        "--forward-drain",
        "60s",
        "--forward-http",
        "--seed",
        "7",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ])
    // The server the tool starts inherits this: retries every 100 ms.
    .env("GRIDLINKS_FORWARDING_RETRY_DELAY", "100")
    .env("TMPDIR", &tmp);
    let out = cmd.output().unwrap();
    eprintln!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    let report = read_json(&json);
    assert_eq!(report["passed"], true, "{report}");
    let acked = n(&report["totals"]["acked"]);
    assert!(acked > 0, "{report}");
    let f = &report["forwarding"];
    assert_eq!(n(&f["acked"]), acked, "{f}");
    assert_eq!(n(&f["receiver_outages"]), 2, "{f}");
    assert!(n(&f["outage_failed_attempts"]) > 0, "the server felt the outages: {f}");
    assert_all_arrived(f);
    assert!(stdout(&out).contains("FORWARDING CHECK PASSED"));
}

/// One Kafka broker under a temporary directory, stopped when dropped.
struct Kafka {
    dir: PathBuf,
    bootstrap: String,
}

fn kafka_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/kafka.sh")
}

impl Kafka {
    fn start() -> Self {
        let dir = scratch("forward-kafka-broker");
        let out = Command::new(kafka_script()).arg("start").arg(&dir).arg("1").output().unwrap();
        assert!(out.status.success(), "kafka.sh start: {}", String::from_utf8_lossy(&out.stderr));
        let bootstrap = String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim().to_owned();
        Kafka { dir, bootstrap }
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        let _ = Command::new(kafka_script()).arg("stop").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn forward_kafka_reads_every_acknowledged_message_back_from_the_topic() {
    if Command::new("java").arg("-version").output().is_err() {
        eprintln!("SKIPPED: no java on PATH for scripts/services/kafka.sh");
        return;
    }
    let kafka = Kafka::start();
    let server = Server::start_with("forward-kafka", &ENV);
    let (code, report) =
        telemetry(&server, "kafka", &["--forward-kafka", &kafka.bootstrap, "--forward-partitions", "2"]);
    assert_eq!(code, Some(0));
    let f = &report["forwarding"];
    assert_eq!(f["sink"], "kafka", "{f}");
    assert!(f["target"].as_str().unwrap().contains("gridlinks-bench-forward-"), "{f}");
    assert_eq!(n(&f["acked"]), 20, "{f}");
    assert_all_arrived_once(f);
}
