//! The JSON shapes of the results (`--json`, the HTML report's raw data, the documents
//! `compare` and `preset` nest them in), one serde struct per JSON object: the field
//! names live here and nowhere else, and a result can be read back
//! (`serde_json::from_str::<TelemetryJson>`). Each report converts itself with `From`;
//! derived figures (rates, ratios) are computed then and rounded as the JSON shows them.

use serde::{Deserialize, Serialize};

use super::{per_second, round3, ConnectReport, LatencySummary, PubsubReport, Reasons, TelemetryReport};
use crate::crash_loop::{CrashLoopReport, CycleReport};
use crate::loss_check::{LossReport, SEQ_KEY};
use crate::storage_lag::StorageLag;
use crate::timeline::{Sample, Timeline};

/// A latency summary as the results show it: [`LatencySummary`] with its mean rounded.
fn latency(l: &LatencySummary) -> LatencySummary {
    LatencySummary { mean_us: round3(l.mean_us), ..*l }
}

/// Result of `mqtt-telemetry` and `http-telemetry`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelemetryJson {
    pub scenario: String,
    /// `host:port` driven.
    pub target: String,
    pub protocol: String,
    pub devices: usize,
    pub qos: u8,
    pub inflight: u16,
    pub offered_rate: f64,
    pub payload_bytes: usize,
    pub connected: u64,
    pub connect_failures: Reasons,
    pub connect_seconds: f64,
    pub window_seconds: f64,
    pub sent: u64,
    pub acked: u64,
    pub failed: u64,
    pub dropped_connections: Reasons,
    pub msgs_per_second: f64,
    /// PUBACK or HTTP response latency.
    pub ack_latency: Option<LatencySummary>,
    pub server: Option<TelemetryServerJson>,
    pub generator_cpu_seconds: f64,
    pub loss_check: Option<LossCheckJson>,
    pub storage_lag: Option<StorageLagJson>,
    /// With `--forward-*` only (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<ForwardingJson>,
    pub timeline: Vec<SampleJson>,
}

/// What a data sink received (`--forward-*`, `crash-loop --forward-http`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardingJson {
    /// `http`, `kafka` or `blackhole`.
    pub sink: String,
    pub target: String,
    /// Every event received, of any type, repeats included.
    pub events_received: u64,
    /// Distinct telemetry messages (device, ts) received.
    pub unique_received: u64,
    /// Messages acknowledged in the run.
    pub acked: u64,
    /// Acknowledged messages not received after the drain; null for the blackhole.
    pub missing: Option<u64>,
    pub missing_examples: Vec<MissingPointJson>,
    pub duplicates: u64,
    /// Distinct messages received that were not acknowledged.
    pub unacked_received: u64,
    pub malformed: u64,
    /// Distinct messages stamped after their arrival (devices faster than 1 msg/ms): the
    /// lag is then meaningless.
    pub stamped_ahead: u64,
    /// End of the load to the last acknowledged message's arrival; null if some never came.
    pub drain_seconds: Option<f64>,
    pub drain_timeout_seconds: f64,
    pub received_per_second: f64,
    /// Receive time - the message's ts, first arrivals, µs.
    pub lag: LatencySummary,
    pub outbox_entries_window_end: Option<u64>,
    pub outbox_entries_end: Option<u64>,
    pub sink_stats: Option<crate::forward::SinkStats>,
    pub receiver_outages: u32,
    pub outage_failed_attempts: u64,
    pub passed: bool,
}

impl From<&crate::forward::ForwardingReport> for ForwardingJson {
    fn from(r: &crate::forward::ForwardingReport) -> Self {
        ForwardingJson {
            sink: r.sink.clone(),
            target: r.target.clone(),
            events_received: r.events_received,
            unique_received: r.unique_received,
            acked: r.acked,
            missing: r.missing,
            missing_examples: r
                .missing_examples
                .iter()
                .map(|(device, ts)| MissingPointJson { device: device.clone(), ts: *ts })
                .collect(),
            duplicates: r.duplicates,
            unacked_received: r.unacked_received,
            malformed: r.malformed,
            stamped_ahead: r.stamped_ahead,
            drain_seconds: r.drain_seconds.map(round3),
            drain_timeout_seconds: round3(r.drain_timeout_seconds),
            received_per_second: round3(r.received_per_second),
            lag: latency(&r.lag),
            outbox_entries_window_end: r.outbox_entries_window_end,
            outbox_entries_end: r.outbox_entries_end,
            sink_stats: r.sink_stats.clone(),
            receiver_outages: r.receiver_outages,
            outage_failed_attempts: r.outage_failed_attempts,
            passed: r.passed(),
        }
    }
}

/// The server's cost during a telemetry run (`--server-pid`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelemetryServerJson {
    pub pid: u32,
    pub cpu_seconds: f64,
    pub msgs_per_cpu_second: Option<f64>,
    pub rss_peak_kib: u64,
    pub rss_end_kib: u64,
    pub hwm_kib: u64,
}

impl From<&TelemetryReport> for TelemetryJson {
    fn from(r: &TelemetryReport) -> Self {
        TelemetryJson {
            scenario: r.scenario.into(),
            target: r.server.clone(),
            protocol: r.protocol.clone(),
            devices: r.devices,
            qos: r.qos,
            inflight: r.inflight,
            offered_rate: r.offered_rate,
            payload_bytes: r.payload_bytes,
            connected: r.connected,
            connect_failures: r.connect_failures.clone(),
            connect_seconds: round3(r.connect_seconds),
            window_seconds: round3(r.window_seconds),
            sent: r.sent,
            acked: r.acked,
            failed: r.failed,
            dropped_connections: r.dropped.clone(),
            msgs_per_second: round3(r.msgs_per_second()),
            ack_latency: r.puback.as_ref().map(latency),
            server: r.server_cost.as_ref().map(|c| TelemetryServerJson {
                pid: c.pid,
                cpu_seconds: round3(c.cpu_seconds),
                msgs_per_cpu_second: r.msgs_per_server_cpu_second().map(round3),
                rss_peak_kib: c.rss_peak_kib,
                rss_end_kib: c.rss_end_kib,
                hwm_kib: c.hwm_kib,
            }),
            generator_cpu_seconds: round3(r.generator_cpu_seconds),
            loss_check: r.loss_check.as_ref().map(LossCheckJson::from),
            storage_lag: r.storage_lag.as_ref().map(StorageLagJson::from),
            forwarding: r.forwarding.as_ref().map(ForwardingJson::from),
            timeline: timeline(&r.timeline),
        }
    }
}

/// Result of `pubsub`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PubsubJson {
    /// Always `pubsub`.
    pub scenario: String,
    pub target: String,
    pub mqtt_version: String,
    pub groups: usize,
    pub publishers_per_group: usize,
    pub subscribers_per_group: usize,
    pub shared: bool,
    pub pub_qos: u8,
    pub sub_qos: u8,
    pub inflight: u16,
    pub offered_rate: f64,
    pub payload_bytes: usize,
    pub connected: u64,
    pub connect_failures: Reasons,
    pub connect_seconds: f64,
    pub publish_seconds: f64,
    pub delivery_seconds: f64,
    pub sent: u64,
    pub acked: u64,
    pub failed: u64,
    pub expected: u64,
    pub received: u64,
    pub missing: u64,
    pub passed: bool,
    pub dropped_connections: Reasons,
    pub delivered_per_second: f64,
    pub puback_latency: Option<LatencySummary>,
    pub e2e_latency: LatencySummary,
    pub server: Option<PubsubServerJson>,
    pub generator_cpu_seconds: f64,
    pub timeline: Vec<SampleJson>,
}

/// The server's cost during a pub/sub run (`--server-pid`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PubsubServerJson {
    pub pid: u32,
    pub cpu_seconds: f64,
    pub delivered_per_cpu_second: Option<f64>,
    pub rss_peak_kib: u64,
    pub rss_end_kib: u64,
    pub hwm_kib: u64,
}

impl From<&PubsubReport> for PubsubJson {
    fn from(r: &PubsubReport) -> Self {
        PubsubJson {
            scenario: "pubsub".into(),
            target: r.server.clone(),
            mqtt_version: r.mqtt_version.clone(),
            groups: r.groups,
            publishers_per_group: r.publishers,
            subscribers_per_group: r.subscribers,
            shared: r.shared,
            pub_qos: r.pub_qos,
            sub_qos: r.sub_qos,
            inflight: r.inflight,
            offered_rate: r.offered_rate,
            payload_bytes: r.payload_bytes,
            connected: r.connected,
            connect_failures: r.connect_failures.clone(),
            connect_seconds: round3(r.connect_seconds),
            publish_seconds: round3(r.publish_seconds),
            delivery_seconds: round3(r.delivery_seconds),
            sent: r.sent,
            acked: r.acked,
            failed: r.failed,
            expected: r.expected,
            received: r.received,
            missing: r.missing(),
            passed: r.passed(),
            dropped_connections: r.dropped.clone(),
            delivered_per_second: round3(r.delivered_per_second()),
            puback_latency: r.puback.as_ref().map(latency),
            e2e_latency: latency(&r.e2e),
            server: r.server_cost.as_ref().map(|c| PubsubServerJson {
                pid: c.pid,
                cpu_seconds: round3(c.cpu_seconds),
                delivered_per_cpu_second: r.delivered_per_server_cpu_second().map(round3),
                rss_peak_kib: c.rss_peak_kib,
                rss_end_kib: c.rss_end_kib,
                hwm_kib: c.hwm_kib,
            }),
            generator_cpu_seconds: round3(r.generator_cpu_seconds),
            timeline: timeline(&r.timeline),
        }
    }
}

/// Result of `connect`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectJson {
    /// Always `connect`.
    pub scenario: String,
    pub target: String,
    pub mqtt_version: String,
    pub requested: usize,
    pub rate: f64,
    pub connected: u64,
    pub failures: Reasons,
    pub success_ratio: f64,
    pub connect_seconds: f64,
    pub connects_per_second: f64,
    pub connack_latency: LatencySummary,
    pub hold_seconds: f64,
    pub pings: u64,
    pub dropped_connections: Reasons,
    pub server: Option<ConnectServerJson>,
    pub timeline: Vec<SampleJson>,
}

/// Server memory and CPU through a `connect` run (`--server-pid`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectServerJson {
    pub pid: u32,
    pub rss_before_kib: u64,
    pub rss_connected_kib: u64,
    pub rss_hold_max_kib: u64,
    pub rss_end_kib: u64,
    pub hwm_kib: u64,
    pub kib_per_connection: Option<f64>,
    pub connect_cpu_seconds: f64,
    pub connects_per_cpu_second: Option<f64>,
    pub hold_cpu_seconds: f64,
}

impl From<&ConnectReport> for ConnectJson {
    fn from(r: &ConnectReport) -> Self {
        ConnectJson {
            scenario: "connect".into(),
            target: r.server.clone(),
            mqtt_version: r.mqtt_version.clone(),
            requested: r.requested,
            rate: r.rate,
            connected: r.connected,
            failures: r.failures.clone(),
            success_ratio: round3(r.success_ratio()),
            connect_seconds: round3(r.connect_seconds),
            connects_per_second: round3(r.connects_per_second()),
            connack_latency: latency(&r.connack),
            hold_seconds: round3(r.hold_seconds),
            pings: r.pings,
            dropped_connections: r.dropped.clone(),
            server: r.server_memory.as_ref().map(|m| ConnectServerJson {
                pid: m.pid,
                rss_before_kib: m.rss_before_kib,
                rss_connected_kib: m.rss_connected_kib,
                rss_hold_max_kib: m.rss_hold_max_kib,
                rss_end_kib: m.rss_end_kib,
                hwm_kib: m.hwm_kib,
                kib_per_connection: r.kib_per_connection().map(round3),
                connect_cpu_seconds: round3(m.connect_cpu_seconds),
                connects_per_cpu_second: r.connects_per_server_cpu_second().map(round3),
                hold_cpu_seconds: round3(m.hold_cpu_seconds),
            }),
            timeline: timeline(&r.timeline),
        }
    }
}

/// One second of a run's timeline, compact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleJson {
    /// Seconds since the start, one decimal.
    pub t: f64,
    pub phase: String,
    pub connected: u64,
    pub connect_failed: u64,
    pub sent: u64,
    pub acked: u64,
    pub failed: u64,
    pub received: u64,
    pub acked_per_second: f64,
    pub received_per_second: f64,
    /// Absent (null) in a second without acknowledgements.
    pub ack_latency: Option<CompactLatencyJson>,
    pub e2e_latency: Option<CompactLatencyJson>,
    pub server_cpu_percent: Option<f64>,
    pub server_rss_kib: Option<u64>,
}

/// The percentiles a timeline sample keeps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CompactLatencyJson {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl From<&Sample> for SampleJson {
    fn from(s: &Sample) -> Self {
        let lat = |l: &Option<LatencySummary>| {
            l.filter(|l| l.count > 0).map(|l| CompactLatencyJson {
                count: l.count,
                p50_us: l.p50_us,
                p99_us: l.p99_us,
                max_us: l.max_us,
            })
        };
        SampleJson {
            t: (s.t * 10.0).round() / 10.0,
            phase: s.phase.to_string(),
            connected: s.connected,
            connect_failed: s.connect_failed,
            sent: s.sent,
            acked: s.acked,
            failed: s.failed,
            received: s.received,
            acked_per_second: s.acked_per_second.round(),
            received_per_second: s.received_per_second.round(),
            ack_latency: lat(&s.ack_latency),
            e2e_latency: lat(&s.e2e_latency),
            server_cpu_percent: s.server_cpu_percent.map(f64::round),
            server_rss_kib: s.server_rss_kib,
        }
    }
}

/// A timeline as the results show it.
pub fn timeline(t: &Timeline) -> Vec<SampleJson> {
    t.samples.iter().map(SampleJson::from).collect()
}

/// `--storage-lag`: acknowledged → queryable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StorageLagJson {
    pub ack_to_queryable: LatencySummary,
    pub query_round_trip: LatencySummary,
    pub timeouts: u64,
}

impl From<&StorageLag> for StorageLagJson {
    fn from(l: &StorageLag) -> Self {
        StorageLagJson { ack_to_queryable: latency(&l.lag), query_round_trip: latency(&l.query), timeouts: l.timeouts }
    }
}

/// The loss check (`--verify`, `verify`, `crash-loop`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossCheckJson {
    pub passed: bool,
    /// The telemetry key holding each point's sequence number.
    pub key: String,
    pub devices_checked: usize,
    pub devices_not_found: usize,
    pub devices_not_found_examples: Vec<String>,
    pub points_acked: u64,
    pub points_found: u64,
    pub missing: u64,
    pub missing_examples: Vec<MissingPointJson>,
    pub extra: u64,
    pub check_after_last_ack_ms: Option<u64>,
    pub check_seconds: f64,
}

/// An acknowledged point that is not stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MissingPointJson {
    pub device: String,
    pub ts: u64,
}

impl From<&LossReport> for LossCheckJson {
    fn from(l: &LossReport) -> Self {
        LossCheckJson {
            passed: l.passed(),
            key: SEQ_KEY.into(),
            devices_checked: l.devices_checked,
            devices_not_found: l.devices_not_found_count,
            devices_not_found_examples: l.devices_not_found.clone(),
            points_acked: l.points_acked,
            points_found: l.points_found,
            missing: l.missing,
            missing_examples: l
                .missing_examples
                .iter()
                .map(|(device, ts)| MissingPointJson { device: device.clone(), ts: *ts })
                .collect(),
            extra: l.extra,
            check_after_last_ack_ms: l.check_after_last_ack_ms,
            check_seconds: round3(l.check_seconds),
        }
    }
}

/// Result of `crash-loop`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrashLoopJson {
    /// Always `crash-loop`.
    pub scenario: String,
    /// `mqtt` or `http`.
    pub transport: String,
    pub protocol: String,
    pub server: String,
    pub devices: usize,
    pub payload_bytes: usize,
    pub kill_after_s: MinMaxJson,
    pub seed: u64,
    pub data_dir: String,
    pub cycles: Vec<CycleJson>,
    pub totals: CrashTotalsJson,
    pub cycles_without_acks: Vec<u32>,
    pub loss_check: LossCheckJson,
    /// With `--forward-http` only (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<ForwardingJson>,
    pub passed: bool,
}

/// A range, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MinMaxJson {
    pub min: f64,
    pub max: f64,
}

/// A spread, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MinMeanMaxJson {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

/// All cycles of a crash loop together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrashTotalsJson {
    pub cycles: usize,
    pub acked: u64,
    pub load_seconds: f64,
    pub acked_per_second: f64,
    pub restart_to_ready_s: MinMeanMaxJson,
    pub missing: u64,
}

/// One cycle of a crash loop: load, kill, restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CycleJson {
    pub cycle: u32,
    pub kill_after_s: f64,
    pub connected: u64,
    pub connect_failures: Reasons,
    pub connect_seconds: f64,
    pub load_seconds: f64,
    pub sent: u64,
    pub acked: u64,
    pub unacked: u64,
    pub acked_per_second: f64,
    pub ack_latency: LatencySummary,
    pub ended: Reasons,
    pub refused: Reasons,
    pub restart_to_ready_s: f64,
}

impl From<&CycleReport> for CycleJson {
    fn from(c: &CycleReport) -> Self {
        CycleJson {
            cycle: c.cycle,
            kill_after_s: round3(c.kill_after.as_secs_f64()),
            connected: c.connected,
            connect_failures: c.connect_failures.clone(),
            connect_seconds: round3(c.connect_seconds),
            load_seconds: round3(c.load_seconds),
            sent: c.sent,
            acked: c.acked,
            unacked: c.sent.saturating_sub(c.acked),
            acked_per_second: c.acked_per_second().round(),
            ack_latency: latency(&c.ack_latency),
            ended: c.ended.clone(),
            refused: c.refused.clone(),
            restart_to_ready_s: round3(c.restart_to_ready),
        }
    }
}

impl From<&CrashLoopReport> for CrashLoopJson {
    fn from(r: &CrashLoopReport) -> Self {
        let (min, mean, max) = r.restart_to_ready();
        CrashLoopJson {
            scenario: "crash-loop".into(),
            transport: r.transport.into(),
            protocol: r.protocol.clone(),
            server: r.server.clone(),
            devices: r.devices,
            payload_bytes: r.payload_bytes,
            kill_after_s: MinMaxJson {
                min: round3(r.kill_after.min.as_secs_f64()),
                max: round3(r.kill_after.max.as_secs_f64()),
            },
            seed: r.seed,
            data_dir: r.data_dir.display().to_string(),
            cycles: r.cycles.iter().map(CycleJson::from).collect(),
            totals: CrashTotalsJson {
                cycles: r.cycles.len(),
                acked: r.acked(),
                load_seconds: round3(r.load_seconds()),
                acked_per_second: per_second(r.acked() as f64, r.load_seconds()).round(),
                restart_to_ready_s: MinMeanMaxJson { min: round3(min), mean: round3(mean), max: round3(max) },
                missing: r.loss_check.missing,
            },
            cycles_without_acks: r.cycles_without_acks(),
            loss_check: LossCheckJson::from(&r.loss_check),
            forwarding: r.forwarding.as_ref().map(ForwardingJson::from),
            passed: r.passed(),
        }
    }
}

/// `compare` and `preset`: the runs of every step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparisonJson {
    pub title: String,
    pub steps: Vec<StepJson>,
}

/// One step of a comparison: the same scenario on each server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepJson {
    pub title: String,
    pub runs: Vec<RunJson>,
}

/// One server's run of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunJson {
    /// `gridlinks`, `mosquitto`, `rumqttd`.
    pub server: String,
    pub version: String,
    /// The scenario's result ([`TelemetryJson`], [`PubsubJson`] or [`ConnectJson`]);
    /// null when it did not run.
    pub result: Option<serde_json::Value>,
    /// Why it did not run.
    pub error: Option<String>,
}

/// `verify --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyJson {
    /// Always `verify`.
    pub scenario: String,
    pub loss_check: LossCheckJson,
}

/// A result as a JSON value; the shapes here have string keys only, so this cannot fail.
pub fn value<T: Serialize>(shape: &T) -> serde_json::Value {
    serde_json::to_value(shape).unwrap_or_else(|e| unreachable!("a result shape serializes: {e}"))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::cli::DurationRange;
    use crate::report::{ServerCost, ServerMemory};

    fn lat(base: u64) -> LatencySummary {
        LatencySummary {
            count: 1000 + base,
            mean_us: 812.345_67 + base as f64,
            p50_us: 700 + base,
            p95_us: 1500 + base,
            p99_us: 2500 + base,
            p999_us: 9000 + base,
            max_us: 12_000 + base,
        }
    }

    fn reasons(what: &str, n: u64) -> Reasons {
        [(what.to_owned(), n)].into_iter().collect()
    }

    fn timeline() -> Timeline {
        let sample = |t: f64, with_latency: bool| Sample {
            t,
            phase: "publishing".into(),
            connected: 100,
            connect_failed: 1,
            sent: 5000,
            acked: 4990,
            failed: 2,
            received: 4000,
            acked_per_second: 4990.4,
            received_per_second: 3999.6,
            ack_latency: with_latency.then(|| lat(1)),
            e2e_latency: Some(LatencySummary::default()),
            server_cpu_percent: Some(87.6),
            server_rss_kib: with_latency.then_some(40_960),
            ack_buckets: None,
            e2e_buckets: None,
        };
        Timeline { samples: vec![sample(1.04, true), sample(2.06, false)] }
    }

    fn loss() -> LossReport {
        LossReport {
            devices_checked: 10,
            devices_not_found: vec!["dev-9".into()],
            devices_not_found_count: 1,
            points_acked: 5000,
            points_found: 4997,
            missing: 3,
            missing_examples: vec![("dev-1".into(), 1_764_000_000_000)],
            extra: 4,
            check_after_last_ack_ms: Some(250),
            check_seconds: 1.234_56,
        }
    }

    fn cost() -> ServerCost {
        ServerCost { pid: 42, cpu_seconds: 3.251_49, rss_peak_kib: 50_000, rss_end_kib: 45_000, hwm_kib: 60_000 }
    }

    /// Every field set (and some optional ones absent), so every key of the shape shows.
    pub(crate) fn telemetry() -> TelemetryReport {
        TelemetryReport {
            scenario: "mqtt-telemetry",
            server: "127.0.0.1:1883".into(),
            protocol: "MQTT 3.1.1".into(),
            devices: 100,
            qos: 1,
            inflight: 10,
            offered_rate: 2000.0,
            payload_bytes: 120,
            connected: 99,
            connect_failures: reasons("CONNACK 0x05", 1),
            connect_seconds: 0.123_456,
            window_seconds: 10.000_4,
            sent: 20_000,
            acked: 19_990,
            failed: 10,
            dropped: reasons("connection reset", 2),
            puback: Some(lat(0)),
            server_cost: Some(cost()),
            generator_cpu_seconds: 1.111_11,
            loss_check: Some(loss()),
            storage_lag: Some(StorageLag { lag: lat(5), query: lat(6), timeouts: 1 }),
            latency_histogram: None,
            forwarding: None,
            timeline: timeline(),
        }
    }

    /// A telemetry run with an HTTP sink (`--forward-http`).
    pub(crate) fn forwarded() -> TelemetryReport {
        use crate::forward::{ForwardingReport, SinkStats};
        TelemetryReport {
            forwarding: Some(ForwardingReport {
                sink: "http".into(),
                target: "http://127.0.0.1:20001/gridlinks-bench/ingest (batchSize 100)".into(),
                events_received: 20_012,
                unique_received: 19_995,
                acked: 19_990,
                missing: Some(0),
                missing_examples: Vec::new(),
                duplicates: 17,
                unacked_received: 5,
                malformed: 0,
                stamped_ahead: 0,
                drain_seconds: Some(0.123_456),
                drain_timeout_seconds: 60.0,
                received_per_second: 1_998.765_4,
                lag: lat(7),
                outbox_entries_window_end: Some(1234),
                outbox_entries_end: Some(0),
                sink_stats: Some(SinkStats {
                    delivered_events: 20_012,
                    failed_attempts: 1,
                    dropped_entries: 0,
                    pending_entries: 0,
                    last_lag_ms: 4,
                    last_error: Some("connection refused".into()),
                }),
                receiver_outages: 0,
                outage_failed_attempts: 0,
            }),
            ..telemetry()
        }
    }

    pub(crate) fn pubsub() -> PubsubReport {
        PubsubReport {
            server: "127.0.0.1:1883".into(),
            mqtt_version: "5".into(),
            groups: 2,
            publishers: 10,
            subscribers: 3,
            shared: true,
            pub_qos: 1,
            sub_qos: 0,
            inflight: 16,
            offered_rate: 0.0,
            payload_bytes: 64,
            connected: 26,
            connect_failures: Reasons::new(),
            connect_seconds: 0.5,
            publish_seconds: 5.012_3,
            delivery_seconds: 5.1,
            sent: 1000,
            acked: 1000,
            failed: 0,
            expected: 3000,
            received: 2999,
            dropped: Reasons::new(),
            puback: None,
            e2e: lat(2),
            server_cost: Some(cost()),
            generator_cpu_seconds: 0.25,
            timeline: timeline(),
        }
    }

    pub(crate) fn connect() -> ConnectReport {
        ConnectReport {
            server: "127.0.0.1:1883".into(),
            mqtt_version: "3.1.1".into(),
            requested: 1000,
            rate: 500.0,
            connected: 998,
            failures: reasons("timeout", 2),
            connect_seconds: 2.001,
            connack: lat(3),
            connack_histogram: None,
            hold_seconds: 10.0,
            pings: 40,
            dropped: Reasons::new(),
            server_memory: Some(ServerMemory {
                pid: 7,
                rss_before_kib: 10_000,
                rss_connected_kib: 12_345,
                rss_hold_max_kib: 12_400,
                rss_end_kib: 12_300,
                hwm_kib: 13_000,
                connect_cpu_seconds: 0.777_77,
                hold_cpu_seconds: 0.01,
            }),
            timeline: timeline(),
        }
    }

    pub(crate) fn crash_loop() -> CrashLoopReport {
        let cycle = |n: u32, acked: u64| CycleReport {
            cycle: n,
            kill_after: Duration::from_millis(3456),
            connected: 100,
            connect_failures: Reasons::new(),
            connect_seconds: 0.25,
            load_seconds: 3.5,
            sent: 10_000,
            acked,
            ack_latency: lat(4),
            ended: reasons("connection reset", 100),
            refused: Reasons::new(),
            restart_to_ready: 0.42 * f64::from(n),
        };
        CrashLoopReport {
            transport: "mqtt",
            protocol: "MQTT 3.1.1 QoS 1, window 10".into(),
            server: "gridlinks 0.1.0".into(),
            devices: 100,
            payload_bytes: 90,
            kill_after: DurationRange { min: Duration::from_secs(3), max: Duration::from_secs(8) },
            seed: 20_261_123,
            data_dir: PathBuf::from("/tmp/data"),
            cycles: vec![cycle(1, 9_990), cycle(2, 0)],
            loss_check: loss(),
            forwarding: None,
        }
    }

    /// The documents the hand-built `json!` code wrote before these shapes replaced it,
    /// kept as files: the shapes must not change (docs/benchmarks.md and scripts read
    /// them). `GRIDLINKS_BLESS=1` rewrites the files after a deliberate change.
    fn fixture(name: &str, got: &serde_json::Value) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        if std::env::var_os("GRIDLINKS_BLESS").is_some() {
            std::fs::write(&path, serde_json::to_string_pretty(got).unwrap() + "\n").unwrap();
        }
        let want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(got, &want, "{name} changed shape");
    }

    #[test]
    fn results_keep_their_json_shape() {
        fixture("telemetry.json", &telemetry().to_json());
        fixture("pubsub.json", &pubsub().to_json());
        fixture("connect.json", &connect().to_json());
        fixture("crash-loop.json", &crash_loop().to_json());
        fixture("telemetry-forwarding.json", &forwarded().to_json());
    }

    #[test]
    fn a_result_reads_back_as_written() {
        let written = serde_json::to_string_pretty(&telemetry().to_json()).unwrap();
        let read: TelemetryJson = serde_json::from_str(&written).unwrap();
        assert_eq!(read, TelemetryJson::from(&telemetry()));
        assert_eq!(serde_json::to_string_pretty(&value(&read)).unwrap(), written);
        let read: PubsubJson = serde_json::from_value(pubsub().to_json()).unwrap();
        assert_eq!(value(&read), pubsub().to_json());
        let read: ConnectJson = serde_json::from_value(connect().to_json()).unwrap();
        assert_eq!(value(&read), connect().to_json());
        let read: CrashLoopJson = serde_json::from_value(crash_loop().to_json()).unwrap();
        assert_eq!(value(&read), crash_loop().to_json());
        let read: TelemetryJson = serde_json::from_value(forwarded().to_json()).unwrap();
        assert_eq!(read, TelemetryJson::from(&forwarded()));
        assert!(telemetry().to_json().get("forwarding").is_none(), "absent without --forward-*");
    }
}
