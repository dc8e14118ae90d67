//! Results of the scenarios: a human summary on stdout and a JSON document (`--json`).
//!
//! Latencies are kept in microseconds and printed in milliseconds; memory in KiB and
//! printed in MiB; JSON carries the raw units in its key names (`_us`, `_kib`).

pub mod json;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use serde_json::Value;

use crate::cli::OutputArgs;
use crate::html;
use crate::proc_stats::{ProcessStats, Sample as ProcSample};
use crate::storage_lag::StorageLag;
use crate::timeline::Timeline;

/// Percentiles of a latency histogram, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct LatencySummary {
    /// Recorded values.
    pub count: u64,
    /// Arithmetic mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: u64,
    /// 95th percentile.
    pub p95_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest value (to the histogram's resolution).
    pub max_us: u64,
}

impl LatencySummary {
    /// Summarises a histogram of microseconds; all zero when it is empty.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: h.len(),
            mean_us: h.mean(),
            p50_us: h.value_at_quantile(0.50),
            p95_us: h.value_at_quantile(0.95),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }

    /// One line: `p50 0.812 ms  p95 ...  max ...  (mean ..., n values)`.
    pub fn line(&self) -> String {
        if self.count == 0 {
            return "no samples".into();
        }
        format!(
            "p50 {}  p95 {}  p99 {}  p99.9 {}  max {}  (mean {}, {} samples)",
            ms(self.p50_us as f64),
            ms(self.p95_us as f64),
            ms(self.p99_us as f64),
            ms(self.p999_us as f64),
            ms(self.max_us as f64),
            ms(self.mean_us),
            thousands(self.count),
        )
    }

    /// The summary as a JSON object (mean rounded to three decimals).
    pub fn to_json(&self) -> Value {
        json::value(&LatencySummary { mean_us: round3(self.mean_us), ..*self })
    }
}

/// Failure counts by reason, e.g. `{"CONNACK 0x04 bad user name or password": 3}`.
pub type Reasons = BTreeMap<String, u64>;

/// What the server process cost during the telemetry window (`--server-pid`).
#[derive(Debug, Clone, Default)]
pub struct ServerCost {
    /// Observed pid.
    pub pid: u32,
    /// CPU seconds (user + system) the server used during the window.
    pub cpu_seconds: f64,
    /// Highest VmRSS sampled (once a second and at the ends) during the window, KiB.
    pub rss_peak_kib: u64,
    /// VmRSS at the end of the window, KiB.
    pub rss_end_kib: u64,
    /// VmHWM at the end: the process's lifetime peak, KiB (includes earlier phases).
    pub hwm_kib: u64,
}

impl ServerCost {
    /// The cost between two samples of the observed server.
    pub fn between(
        server: Option<&ProcessStats>,
        before: Option<ProcSample>,
        after: Option<ProcSample>,
        rss_peak_kib: Option<u64>,
    ) -> Option<Self> {
        let (before, after, stats) = (before?, after?, server?);
        Some(ServerCost {
            pid: stats.pid(),
            cpu_seconds: after.cpu_seconds - before.cpu_seconds,
            rss_peak_kib: rss_peak_kib.unwrap_or(after.memory.rss_kib),
            rss_end_kib: after.memory.rss_kib,
            hwm_kib: after.memory.hwm_kib,
        })
    }

    /// `count` per server CPU-second, or `None` when the server used less CPU than
    /// `/proc` can show (one clock tick, 10 ms): a light run on a quiet peer measures 0 s,
    /// and a ratio over it would be a number made up, not measured.
    pub fn per_cpu_second(&self, count: f64) -> Option<f64> {
        (self.cpu_seconds > 0.0).then(|| count / self.cpu_seconds)
    }

    /// The summary lines: CPU with `count` `what` per server CPU-second over a window of
    /// `seconds`, and memory.
    fn lines(&self, count: u64, what: &str, seconds: f64) -> String {
        let per_cpu = match self.per_cpu_second(count as f64) {
            Some(v) => format!("{} {what} per server CPU-second", thousands(v as u64)),
            None => "below one clock tick: too little CPU to measure, run longer".to_string(),
        };
        format!(
            "server pid {}  CPU {:.2} s ({:.0}% of one core) -> {per_cpu}\n\
             server memory  RSS peak {}  at end {}  (VmHWM, lifetime: {})\n",
            self.pid,
            self.cpu_seconds,
            100.0 * per_second(self.cpu_seconds, seconds),
            mib(self.rss_peak_kib),
            mib(self.rss_end_kib),
            mib(self.hwm_kib),
        )
    }
}

/// The generator's CPU over a window of `seconds`.
fn generator_line(cpu_seconds: f64, seconds: f64) -> String {
    format!("generator      CPU {cpu_seconds:.2} s ({:.0}% of one core)\n", 100.0 * per_second(cpu_seconds, seconds))
}

/// Result of `mqtt-telemetry` and `http-telemetry`.
#[derive(Debug, Clone, Default)]
pub struct TelemetryReport {
    /// `mqtt-telemetry` or `http-telemetry`.
    pub scenario: &'static str,
    /// `host:port` driven.
    pub server: String,
    /// Protocol spoken, e.g. `MQTT 3.1.1` or `HTTP/1.1`.
    pub protocol: String,
    /// Connections requested.
    pub devices: usize,
    /// QoS of the publishes.
    pub qos: u8,
    /// Unacknowledged publishes allowed per connection.
    pub inflight: u16,
    /// Offered publishes per second (`--rate`); 0: as fast as acks allow.
    pub offered_rate: f64,
    /// Payload size, bytes.
    pub payload_bytes: usize,
    /// Connections established.
    pub connected: u64,
    /// Failed connection attempts by reason.
    pub connect_failures: Reasons,
    /// Seconds from the first connect attempt to the last outcome.
    pub connect_seconds: f64,
    /// Seconds from the start signal to the last acknowledgement (QoS 0: last write).
    pub window_seconds: f64,
    /// PUBLISH packets sent.
    pub sent: u64,
    /// Publishes acknowledged with success (QoS 0: written).
    pub acked: u64,
    /// Publishes refused or never acknowledged.
    pub failed: u64,
    /// Connections lost during the window, by reason.
    pub dropped: Reasons,
    /// Acknowledgement latency: PUBACK (QoS 1 only) or HTTP response.
    pub puback: Option<LatencySummary>,
    /// Server cost, with `--server-pid`.
    pub server_cost: Option<ServerCost>,
    /// CPU seconds the generator itself used during the window.
    pub generator_cpu_seconds: f64,
    /// Result of the loss check, with `--verify`.
    pub loss_check: Option<crate::loss_check::LossReport>,
    /// Ack-to-queryable lag, with `--storage-lag`.
    pub storage_lag: Option<StorageLag>,
    /// The acknowledgement latencies behind `puback` (for merging `--workers` results).
    pub latency_histogram: Option<Histogram<u64>>,
    /// What a data sink received, with `--forward-*`.
    pub forwarding: Option<crate::forward::ForwardingReport>,
    /// One sample a second.
    pub timeline: Timeline,
}

impl TelemetryReport {
    /// Acknowledged messages per second of window.
    pub fn msgs_per_second(&self) -> f64 {
        per_second(self.acked as f64, self.window_seconds)
    }

    /// Acknowledged messages per server CPU-second, with `--server-pid`.
    pub fn msgs_per_server_cpu_second(&self) -> Option<f64> {
        self.server_cost.as_ref().and_then(|c| c.per_cpu_second(self.acked as f64))
    }

    /// What acknowledges a message: `PUBACK` or `HTTP 200`.
    pub fn ack_name(&self) -> &'static str {
        if self.scenario == "http-telemetry" {
            "HTTP 200"
        } else {
            "PUBACK"
        }
    }

    /// The human summary.
    pub fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "== {}: {} ({}), {} devices, QoS {}, inflight {}, payload {} B, {} ==",
            self.scenario,
            self.server,
            self.protocol,
            self.devices,
            self.qos,
            self.inflight,
            self.payload_bytes,
            if self.offered_rate > 0.0 {
                format!("offered {} msg/s", thousands(self.offered_rate as u64))
            } else {
                "as fast as acks allow".into()
            },
        );
        let _ = writeln!(
            s,
            "connections    {} ok, {} failed in {:.2} s ({}/s){}",
            thousands(self.connected),
            thousands(self.connect_failures.values().sum()),
            self.connect_seconds,
            thousands(per_second(self.connected as f64, self.connect_seconds) as u64),
            reasons_suffix(&self.connect_failures),
        );
        let _ = writeln!(
            s,
            "messages       sent {}  acked {}  failed {}  in {:.2} s{}",
            thousands(self.sent),
            thousands(self.acked),
            thousands(self.failed),
            self.window_seconds,
            if self.dropped.is_empty() {
                String::new()
            } else {
                format!("; connections lost:{}", reasons_suffix(&self.dropped))
            },
        );
        let _ = writeln!(
            s,
            "throughput     {} msg/s {}",
            thousands(self.msgs_per_second() as u64),
            if self.qos == 0 { "written (QoS 0)" } else { "acknowledged" },
        );
        if let Some(p) = &self.puback {
            let _ = writeln!(s, "{:<14} {}", self.ack_name(), p.line());
        }
        if let Some(c) = &self.server_cost {
            s.push_str(&c.lines(self.acked, "msgs", self.window_seconds));
        }
        s.push_str(&generator_line(self.generator_cpu_seconds, self.window_seconds));
        if let Some(lag) = &self.storage_lag {
            s.push_str(&lag.line());
        }
        if let Some(forwarding) = &self.forwarding {
            s.push_str(&forwarding.human());
        }
        if let Some(loss) = &self.loss_check {
            s.push_str(&loss.human());
        }
        s
    }

    /// False when the loss check or the forwarding check failed.
    pub fn passed(&self) -> bool {
        self.loss_check.as_ref().is_none_or(|l| l.passed())
            && self.forwarding.as_ref().is_none_or(crate::forward::ForwardingReport::passed)
    }

    /// The JSON result ([`json::TelemetryJson`]).
    pub fn to_json(&self) -> Value {
        json::value(&json::TelemetryJson::from(self))
    }
}

/// Result of `pubsub`.
#[derive(Debug, Clone, Default)]
pub struct PubsubReport {
    /// `host:port` driven.
    pub server: String,
    /// MQTT version spoken.
    pub mqtt_version: String,
    /// Groups.
    pub groups: usize,
    /// Publishers per group.
    pub publishers: usize,
    /// Subscribers per group.
    pub subscribers: usize,
    /// Subscribers of a group share one subscription.
    pub shared: bool,
    /// QoS of the publishes.
    pub pub_qos: u8,
    /// QoS of the subscriptions.
    pub sub_qos: u8,
    /// Unacknowledged publishes allowed per publisher.
    pub inflight: u16,
    /// Offered publishes per second in total; 0: as fast as acks allow.
    pub offered_rate: f64,
    /// Payload size, bytes.
    pub payload_bytes: usize,
    /// Connections established (publishers and subscribers).
    pub connected: u64,
    /// Failed connection or subscription attempts by reason.
    pub connect_failures: Reasons,
    /// Seconds to connect everybody.
    pub connect_seconds: f64,
    /// Seconds from the start signal to the last publish ack.
    pub publish_seconds: f64,
    /// Seconds from the start signal to the last delivery.
    pub delivery_seconds: f64,
    /// PUBLISH packets sent.
    pub sent: u64,
    /// Publishes acknowledged (QoS 0: written).
    pub acked: u64,
    /// Publishes refused or never acknowledged.
    pub failed: u64,
    /// Deliveries the acknowledged publishes call for.
    pub expected: u64,
    /// Deliveries received.
    pub received: u64,
    /// Connections lost, by reason.
    pub dropped: Reasons,
    /// PUBACK latency (publish QoS 1).
    pub puback: Option<LatencySummary>,
    /// End-to-end latency: publish written to PUBLISH decoded by a subscriber.
    pub e2e: LatencySummary,
    /// Server cost over publish and drain, with `--server-pid`.
    pub server_cost: Option<ServerCost>,
    /// Generator CPU seconds over publish and drain.
    pub generator_cpu_seconds: f64,
    /// One sample a second.
    pub timeline: Timeline,
}

impl PubsubReport {
    /// Expected deliveries that did not arrive.
    pub fn missing(&self) -> u64 {
        self.expected.saturating_sub(self.received)
    }

    /// False when QoS 1 on both sides lost deliveries.
    pub fn passed(&self) -> bool {
        !(self.pub_qos == 1 && self.sub_qos == 1 && self.missing() > 0)
    }

    /// Deliveries per second.
    pub fn delivered_per_second(&self) -> f64 {
        per_second(self.received as f64, self.delivery_seconds)
    }

    /// Deliveries per server CPU-second, with `--server-pid`.
    pub fn delivered_per_server_cpu_second(&self) -> Option<f64> {
        self.server_cost.as_ref().and_then(|c| c.per_cpu_second(self.received as f64))
    }

    /// The human summary.
    pub fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "== pubsub: {} (MQTT {}), {} groups x ({} publishers -> {} {}subscribers), QoS {} -> {}, payload {} B, {} ==",
            self.server,
            self.mqtt_version,
            self.groups,
            self.publishers,
            self.subscribers,
            if self.shared { "shared " } else { "" },
            self.pub_qos,
            self.sub_qos,
            self.payload_bytes,
            if self.offered_rate > 0.0 {
                format!("offered {} msg/s", thousands(self.offered_rate as u64))
            } else {
                format!("inflight {}, as fast as acks allow", self.inflight)
            },
        );
        let _ = writeln!(
            s,
            "connections    {} ok, {} failed in {:.2} s{}",
            thousands(self.connected),
            thousands(self.connect_failures.values().sum()),
            self.connect_seconds,
            reasons_suffix(&self.connect_failures),
        );
        let _ = writeln!(
            s,
            "published      sent {}  acked {}  failed {}  in {:.2} s -> {} msg/s{}",
            thousands(self.sent),
            thousands(self.acked),
            thousands(self.failed),
            self.publish_seconds,
            thousands(per_second(self.acked as f64, self.publish_seconds) as u64),
            if self.dropped.is_empty() {
                String::new()
            } else {
                format!("; connections lost:{}", reasons_suffix(&self.dropped))
            },
        );
        let _ = writeln!(
            s,
            "delivered      {} of {} expected ({} missing) in {:.2} s -> {} msg/s",
            thousands(self.received),
            thousands(self.expected),
            thousands(self.missing()),
            self.delivery_seconds,
            thousands(self.delivered_per_second() as u64),
        );
        if let Some(p) = &self.puback {
            let _ = writeln!(s, "PUBACK latency {}", p.line());
        }
        let _ = writeln!(s, "end-to-end     {}", self.e2e.line());
        if let Some(c) = &self.server_cost {
            s.push_str(&c.lines(self.received, "deliveries", self.delivery_seconds));
        }
        s.push_str(&generator_line(self.generator_cpu_seconds, self.delivery_seconds));
        if !self.passed() {
            let _ = writeln!(s, "DELIVERY CHECK FAILED: {} acknowledged QoS 1 deliveries missing", self.missing());
        } else if self.pub_qos == 1 && self.sub_qos == 1 {
            let _ = writeln!(s, "DELIVERY CHECK PASSED");
        }
        s
    }

    /// The JSON result ([`json::PubsubJson`]).
    pub fn to_json(&self) -> Value {
        json::value(&json::PubsubJson::from(self))
    }
}

/// Server memory through the `connect` scenario (`--server-pid`).
#[derive(Debug, Clone, Default)]
pub struct ServerMemory {
    /// Observed pid.
    pub pid: u32,
    /// VmRSS before the first connection, KiB.
    pub rss_before_kib: u64,
    /// VmRSS once every attempt had its outcome, KiB.
    pub rss_connected_kib: u64,
    /// Highest VmRSS sampled while holding, KiB.
    pub rss_hold_max_kib: u64,
    /// VmRSS at the end of the hold, KiB.
    pub rss_end_kib: u64,
    /// VmHWM at the end, KiB.
    pub hwm_kib: u64,
    /// Server CPU seconds during the connect phase.
    pub connect_cpu_seconds: f64,
    /// Server CPU seconds during the hold.
    pub hold_cpu_seconds: f64,
}

/// Result of `connect`.
#[derive(Debug, Clone, Default)]
pub struct ConnectReport {
    /// `host:port` driven.
    pub server: String,
    /// MQTT version spoken.
    pub mqtt_version: String,
    /// Connections requested.
    pub requested: usize,
    /// Requested rate, connections per second (0: unpaced).
    pub rate: f64,
    /// Connections established.
    pub connected: u64,
    /// Failed attempts by reason.
    pub failures: Reasons,
    /// Seconds from the first attempt to the last outcome.
    pub connect_seconds: f64,
    /// TCP connect + CONNECT/CONNACK latency of the successful attempts.
    pub connack: LatencySummary,
    /// The latencies behind `connack` (for merging `--workers` results).
    pub connack_histogram: Option<Histogram<u64>>,
    /// Seconds the connections were held.
    pub hold_seconds: f64,
    /// PINGREQs sent while holding.
    pub pings: u64,
    /// Connections lost while holding, by reason.
    pub dropped: Reasons,
    /// Server memory, with `--server-pid`.
    pub server_memory: Option<ServerMemory>,
    /// One sample a second.
    pub timeline: Timeline,
}

impl ConnectReport {
    /// Successful connections per second of the connect phase.
    pub fn connects_per_second(&self) -> f64 {
        per_second(self.connected as f64, self.connect_seconds)
    }

    /// Connected / requested.
    pub fn success_ratio(&self) -> f64 {
        if self.requested == 0 {
            return 0.0;
        }
        self.connected as f64 / self.requested as f64
    }

    /// Successful connections per server CPU-second of the connect phase.
    pub fn connects_per_server_cpu_second(&self) -> Option<f64> {
        let m = self.server_memory.as_ref()?;
        (m.connect_cpu_seconds > 0.0).then(|| self.connected as f64 / m.connect_cpu_seconds)
    }

    /// (RSS once connected − RSS before) / connections, KiB.
    pub fn kib_per_connection(&self) -> Option<f64> {
        let m = self.server_memory.as_ref()?;
        if self.connected == 0 {
            return None;
        }
        Some((m.rss_connected_kib as f64 - m.rss_before_kib as f64) / self.connected as f64)
    }

    /// The human summary.
    pub fn human(&self) -> String {
        let mut s = String::new();
        let rate = if self.rate > 0.0 { format!("{}/s", self.rate) } else { "unpaced".into() };
        let _ = writeln!(
            s,
            "== connect: {} (MQTT {}), {} connections, rate {rate} ==",
            self.server,
            self.mqtt_version,
            thousands(self.requested as u64)
        );
        let _ = writeln!(
            s,
            "connected      {} of {} ({:.2}%) in {:.2} s -> {} connects/s{}",
            thousands(self.connected),
            thousands(self.requested as u64),
            100.0 * self.success_ratio(),
            self.connect_seconds,
            thousands(self.connects_per_second() as u64),
            reasons_suffix(&self.failures),
        );
        let _ = writeln!(s, "CONNACK after  {}", self.connack.line());
        let _ = writeln!(
            s,
            "held           {:.1} s, {} PINGREQ, {} connections lost{}",
            self.hold_seconds,
            thousands(self.pings),
            thousands(self.dropped.values().sum()),
            reasons_suffix(&self.dropped),
        );
        if let Some(m) = &self.server_memory {
            let _ = writeln!(
                s,
                "server pid {}  RSS before {}  connected {}  hold max {}  end {}  (VmHWM {})",
                m.pid,
                mib(m.rss_before_kib),
                mib(m.rss_connected_kib),
                mib(m.rss_hold_max_kib),
                mib(m.rss_end_kib),
                mib(m.hwm_kib),
            );
            if let Some(per) = self.kib_per_connection() {
                let _ = writeln!(s, "server memory  {per:.2} KiB per connection");
            }
            let _ = writeln!(
                s,
                "server CPU     {:.2} s connecting ({} connects per server CPU-second), {:.2} s holding",
                m.connect_cpu_seconds,
                thousands(self.connects_per_server_cpu_second().unwrap_or(0.0) as u64),
                m.hold_cpu_seconds
            );
        }
        s
    }

    /// The JSON result ([`json::ConnectJson`]).
    pub fn to_json(&self) -> Value {
        json::value(&json::ConnectJson::from(self))
    }
}

/// Prints the human summary and writes the JSON (`--json`) and HTML (`--html`)
/// results the target asks for; `page` is only built when needed.
pub fn emit(output: &OutputArgs, human: &str, json: &Value, page: impl FnOnce() -> html::Page) -> anyhow::Result<()> {
    print!("{human}");
    if let Some(path) = &output.json {
        write_json(path, json)?;
    }
    if let Some(path) = &output.html {
        let mut page = page();
        page.raw_json = serde_json::to_string_pretty(json).ok();
        std::fs::write(path, html::render(&page)).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Writes `value` pretty-printed to `path`.
pub fn write_json(path: &Path, value: &Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// `count / seconds`, 0 for an empty interval.
pub fn per_second(count: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count / seconds
    } else {
        0.0
    }
}

/// Microseconds as milliseconds with three decimals, e.g. `0.812 ms`.
pub fn ms(micros: f64) -> String {
    format!("{:.3} ms", micros / 1000.0)
}

/// KiB as MiB with one decimal, e.g. `12.3 MiB`.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `x` rounded to three decimals (for JSON).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn reasons_suffix(reasons: &Reasons) -> String {
    if reasons.is_empty() {
        return String::new();
    }
    let list: Vec<String> = reasons.iter().map(|(r, n)| format!("{r}: {n}")).collect();
    format!(" [{}]", list.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::new_histogram;

    #[test]
    fn latency_summary_of_a_known_distribution() {
        let mut h = new_histogram();
        for us in 1..=10_000u64 {
            h.record(us).unwrap();
        }
        let s = LatencySummary::from_histogram(&h);
        assert_eq!(s.count, 10_000);
        // 3 significant digits: each percentile within 0.1% of the exact value.
        let close = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 0.001;
        assert!(close(s.p50_us, 5_000), "{s:?}");
        assert!(close(s.p95_us, 9_500), "{s:?}");
        assert!(close(s.p99_us, 9_900), "{s:?}");
        assert!(close(s.p999_us, 9_990), "{s:?}");
        assert!(close(s.max_us, 10_000), "{s:?}");
        assert!((s.mean_us - 5_000.5).abs() < 10.0, "{s:?}");
        assert!(s.line().starts_with("p50 5.0"), "{}", s.line());
        assert_eq!(s.to_json()["count"], 10_000);
    }

    #[test]
    fn empty_histogram_summarises_to_zero() {
        let s = LatencySummary::from_histogram(&new_histogram());
        assert_eq!(s, LatencySummary::default());
        assert_eq!(s.line(), "no samples");
    }

    #[test]
    fn numbers_format_for_people() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(ms(812.0), "0.812 ms");
        assert_eq!(mib(2048), "2.0 MiB");
    }

    #[test]
    fn telemetry_report_derives_rates() {
        let r = TelemetryReport {
            acked: 100_000,
            window_seconds: 10.0,
            server_cost: Some(ServerCost { cpu_seconds: 4.0, ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(r.msgs_per_second(), 10_000.0);
        assert_eq!(r.msgs_per_server_cpu_second(), Some(25_000.0));
        let j = r.to_json();
        assert_eq!(j["server"]["msgs_per_cpu_second"], 25_000.0);
        assert!(r.human().contains("25,000 msgs per server CPU-second"));
    }

    #[test]
    fn connect_report_memory_per_connection() {
        let r = ConnectReport {
            requested: 1000,
            connected: 1000,
            server_memory: Some(ServerMemory {
                rss_before_kib: 10_000,
                rss_connected_kib: 10_750,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(r.kib_per_connection(), Some(0.75));
        assert_eq!(r.success_ratio(), 1.0);
    }
}
