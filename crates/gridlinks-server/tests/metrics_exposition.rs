//! `/metrics` on the real binary: every metric has `# HELP` and `# TYPE`, the names that
//! docs and dashboards use are all there, and the histograms (storage commit time and
//! batch size, PUBACK latency) count what a few MQTT publishes did.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::mqtt::*;
use common::*;

/// Names docs and dashboards use (docs/operations.md); they must stay.
const NAMES: &[&str] = &[
    "gridlinks_storage_commits_total",
    "gridlinks_storage_write_ops_total",
    "gridlinks_storage_records_total",
    "gridlinks_storage_sync_seconds_total",
    "gridlinks_storage_overloaded_total",
    "gridlinks_storage_queue_depth",
    "gridlinks_storage_refused_unhealthy_total",
    "gridlinks_storage_reopens_total",
    "gridlinks_storage_health",
    "gridlinks_payload_rejected_total",
    "gridlinks_http_over_limit_total",
    "gridlinks_mqtt_sessions",
    "gridlinks_mqtt_dropped_qos0_total",
    "gridlinks_mqtt_dropped_offline_total",
    "gridlinks_mqtt_connections",
    "gridlinks_mqtt_connects_total",
    "gridlinks_mqtt_connects_refused_total",
    "gridlinks_mqtt_publishes_total",
    "gridlinks_mqtt_bad_publishes_total",
    "gridlinks_mqtt_protocol_errors_total",
    "gridlinks_mqtt_keepalive_timeouts_total",
    "gridlinks_mqtt_over_limit_total",
    "gridlinks_mqtt_over_credential_limit_total",
    "gridlinks_mqtt_too_large_discarded_total",
    "gridlinks_mqtt_closed_too_slow_total",
    // Custom TCP protocols and CoAP (issue 14).
    "gridlinks_tcp_connections",
    "gridlinks_tcp_logins_total",
    "gridlinks_tcp_logins_refused_total",
    "gridlinks_tcp_frames_total",
    "gridlinks_tcp_bad_frames_total",
    "gridlinks_tcp_decode_errors_total",
    "gridlinks_tcp_rejected_total",
    "gridlinks_tcp_not_committed_total",
    "gridlinks_tcp_timeouts_total",
    "gridlinks_tcp_downlinks_total",
    "gridlinks_tcp_downlink_errors_total",
    "gridlinks_coap_requests_total",
    "gridlinks_coap_duplicates_total",
    "gridlinks_coap_malformed_total",
    "gridlinks_coap_errors_total",
    // The WebSocket API and the console's system page (issue 16).
    "gridlinks_storage_bytes",
    "gridlinks_ws_sessions",
    "gridlinks_ws_subscriptions",
];

/// The histograms and what their `_count` counts.
const HISTOGRAMS: &[&str] =
    &["gridlinks_storage_commit_seconds", "gridlinks_storage_commit_batch_ops", "gridlinks_mqtt_puback_seconds"];

/// The value of the sample `name` (a full sample name, labels included).
fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn metrics_have_help_lines_and_histograms_count_mqtt_publishes() {
    let s = Server::start();
    let jwt = s.login();
    s.device(&jwt, "metrics-dev", "METRICS_TOKEN");
    let (_, before) = s.req("GET", "/metrics", None, None);

    const PUBLISHES: u16 = 20;
    for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
        let (mut c, ack) = Raw::connect(s.mqtt_port, version, Some("METRICS_TOKEN"), 60);
        assert_eq!(ack.code, 0);
        for i in 1..=PUBLISHES / 2 {
            c.publish("v1/devices/me/telemetry", format!(r#"{{"n":{i}}}"#).as_bytes(), QoS::AtLeastOnce, Some(i));
            assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.packet_id == i && a.reason == 0));
        }
        c.disconnect();
    }
    let (status, after) = s.req("GET", "/metrics", None, None);
    assert_eq!(status, 200);

    // OpenMetrics: every family described, the document closed by `# EOF`.
    assert!(after.ends_with("# EOF\n"), "{after}");
    let families: Vec<&str> = after.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
    assert!(families.len() >= NAMES.len() + HISTOGRAMS.len(), "{after}");
    for family in &families {
        let name = family.split(' ').next().unwrap();
        assert!(
            after.lines().any(|l| l.starts_with(&format!("# HELP {name} ")) && l.len() > name.len() + 12),
            "{name}"
        );
    }
    for name in NAMES {
        assert!(after.lines().any(|l| l.starts_with(&format!("{name} "))), "{name} missing:\n{after}");
    }
    assert_eq!(value(&after, "gridlinks_mqtt_publishes_total"), f64::from(PUBLISHES));

    for h in HISTOGRAMS {
        let count = value(&after, &format!("{h}_count"));
        assert!(count > value(&before, &format!("{h}_count")), "{h} did not grow:\n{after}");
        assert_eq!(value(&after, &format!("{h}_bucket{{le=\"+Inf\"}}")), count, "{h}");
        assert!(value(&after, &format!("{h}_sum")) > 0.0, "{h}");
    }
    // One observation per acknowledged publish; one per commit round; every request of
    // every round counted (the publishes, the device's creation, the login).
    assert_eq!(
        value(&after, "gridlinks_mqtt_puback_seconds_count") - value(&before, "gridlinks_mqtt_puback_seconds_count"),
        f64::from(PUBLISHES)
    );
    assert_eq!(
        value(&after, "gridlinks_storage_commit_seconds_count"),
        value(&after, "gridlinks_storage_commits_total")
    );
    assert_eq!(
        value(&after, "gridlinks_storage_commit_batch_ops_sum"),
        value(&after, "gridlinks_storage_write_ops_total")
    );
    assert!(value(&after, "gridlinks_storage_commit_seconds_bucket{le=\"10.0\"}") > 0.0, "{after}");
    // The store holds what was committed: its files take some room.
    assert!(value(&after, "gridlinks_storage_bytes") > 0.0, "{after}");
    assert_eq!(value(&after, "gridlinks_ws_sessions"), 0.0);
}

/// The Grafana dashboard shipped in docs/grafana: every metric a panel queries is one the
/// server exposes (a renamed metric would leave a panel empty without a word).
#[test]
fn the_grafana_dashboard_names_only_metrics_that_exist() {
    let s = Server::start();
    let (_, text) = s.req("GET", "/metrics", None, None);
    let families: std::collections::HashSet<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../../docs/grafana/gridlinks.json")).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut named = 0;
    for panel in panels {
        assert!(panel["title"].as_str().is_some_and(|t| !t.is_empty()), "{panel}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{panel}");
        for expr in targets.iter().map(|t| t["expr"].as_str().unwrap()) {
            for (at, _) in expr.match_indices("gridlinks_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let family = ["_bucket", "_sum", "_count", "_total"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(&name);
                assert!(families.contains(family), "{name} (in {expr:?}) is not a metric of the server");
                named += 1;
            }
        }
    }
    assert!(named >= 30, "{named} metric references");
}
