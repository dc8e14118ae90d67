//! What a run looked like over time: one [`Sample`] a second (taken by the progress
//! task), kept for the JSON result (`timeline`) and the charts of the HTML report.

use serde_json::{json, Value};

use crate::report::LatencySummary;

/// The state of a run at one second.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// Phase of the run (connecting, publishing, ...).
    pub phase: &'static str,
    /// Connections established so far.
    pub connected: u64,
    /// Failed connection attempts so far.
    pub connect_failed: u64,
    /// Messages sent so far.
    pub sent: u64,
    /// Messages acknowledged so far.
    pub acked: u64,
    /// Messages failed so far.
    pub failed: u64,
    /// Messages delivered to subscribers so far.
    pub received: u64,
    /// Acknowledgements per second over the last interval.
    pub acked_per_second: f64,
    /// Deliveries per second over the last interval.
    pub received_per_second: f64,
    /// Acknowledgement latency of the last interval.
    pub ack_latency: Option<LatencySummary>,
    /// End-to-end latency of the last interval.
    pub e2e_latency: Option<LatencySummary>,
    /// Server CPU over the last interval, percent of one core.
    pub server_cpu_percent: Option<f64>,
    /// Server VmRSS, KiB.
    pub server_rss_kib: Option<u64>,
}

/// The samples of one run.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// One a second, in order.
    pub samples: Vec<Sample>,
}

impl Timeline {
    /// The samples as a JSON array of compact objects.
    pub fn to_json(&self) -> Value {
        let lat = |l: &Option<LatencySummary>| {
            l.filter(|l| l.count > 0)
                .map(|l| json!({"p50_us": l.p50_us, "p99_us": l.p99_us, "max_us": l.max_us}))
        };
        Value::Array(
            self.samples
                .iter()
                .map(|s| {
                    json!({
                        "t": (s.t * 10.0).round() / 10.0,
                        "phase": s.phase,
                        "connected": s.connected,
                        "connect_failed": s.connect_failed,
                        "sent": s.sent,
                        "acked": s.acked,
                        "failed": s.failed,
                        "received": s.received,
                        "acked_per_second": s.acked_per_second.round(),
                        "received_per_second": s.received_per_second.round(),
                        "ack_latency": lat(&s.ack_latency),
                        "e2e_latency": lat(&s.e2e_latency),
                        "server_cpu_percent": s.server_cpu_percent.map(|c| c.round()),
                        "server_rss_kib": s.server_rss_kib,
                    })
                })
                .collect(),
        )
    }

    /// (t, value) points of one figure, skipping samples where it is absent.
    pub fn points(&self, figure: impl Fn(&Sample) -> Option<f64>) -> Vec<(f64, f64)> {
        self.samples
            .iter()
            .filter_map(|s| figure(s).map(|v| (s.t, v)))
            .collect()
    }
}
