//! What a run looked like over time: one [`Sample`] a second (taken by the progress
//! task), kept for the JSON result (`timeline`) and the charts of the HTML report.
//!
//! Every scenario samples its acknowledgement latency per second (PUBACK, CONNACK or
//! HTTP response) and pub/sub its end-to-end latency too. A run spread over worker
//! processes (`--workers`) gets one timeline: each worker keeps its per-second latency
//! histograms ([`Sample::ack_buckets`]) and the parent adds them up second by second
//! ([`Timeline::merge`]), so the merged percentiles are those of all workers' values.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::report::LatencySummary;
use crate::stats::{from_buckets, Buckets};

/// The state of a run at one second.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub t: f64,
    /// Phase of the run (connecting, publishing, ...).
    pub phase: Cow<'static, str>,
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
    /// Acknowledgement latency of the last interval (PUBACK, CONNACK, HTTP response).
    pub ack_latency: Option<LatencySummary>,
    /// End-to-end latency of the last interval.
    pub e2e_latency: Option<LatencySummary>,
    /// Server CPU over the last interval, percent of one core.
    pub server_cpu_percent: Option<f64>,
    /// Server VmRSS, KiB.
    pub server_rss_kib: Option<u64>,
    /// The values behind `ack_latency`, kept only in worker processes: percentiles do
    /// not add up, histograms do.
    pub ack_buckets: Option<Buckets>,
    /// The values behind `e2e_latency`, kept only in worker processes.
    pub e2e_buckets: Option<Buckets>,
}

/// The samples of one run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Timeline {
    /// One a second, in order.
    pub samples: Vec<Sample>,
}

impl Timeline {
    /// The samples as a JSON array of compact objects ([`crate::report::json::SampleJson`]).
    pub fn to_json(&self) -> Value {
        crate::report::json::value(&crate::report::json::timeline(self))
    }

    /// (t, value) points of one figure, skipping samples where it is absent.
    pub fn points(&self, figure: impl Fn(&Sample) -> Option<f64>) -> Vec<(f64, f64)> {
        self.samples.iter().filter_map(|s| figure(s).map(|v| (s.t, v))).collect()
    }

    /// The timelines of the worker processes of one run as one: sample `i` of each
    /// (the workers start within milliseconds of each other and sample once a second)
    /// adds up to sample `i` of the run. Counts so far of a worker whose timeline is
    /// shorter stay at its last value; its rates count as zero. Latencies are merged
    /// from the workers' buckets; time and phase are the first worker's.
    pub fn merge(parts: &[Timeline]) -> Timeline {
        let len = parts.iter().map(|p| p.samples.len()).max().unwrap_or(0);
        let samples = (0..len)
            .map(|i| {
                let mut m = Sample::default();
                let (mut ack, mut e2e) = (Vec::new(), Vec::new());
                let (mut any_ack, mut any_e2e) = (false, false);
                let mut timed = false;
                for part in parts {
                    let Some(last) = part.samples.get(i.min(part.samples.len().saturating_sub(1))) else {
                        continue;
                    };
                    m.connected += last.connected;
                    m.connect_failed += last.connect_failed;
                    m.sent += last.sent;
                    m.acked += last.acked;
                    m.failed += last.failed;
                    m.received += last.received;
                    let Some(s) = part.samples.get(i) else {
                        continue;
                    };
                    if !timed {
                        (m.t, m.phase) = (s.t, s.phase.clone());
                        timed = true;
                    }
                    m.acked_per_second += s.acked_per_second;
                    m.received_per_second += s.received_per_second;
                    if let Some(b) = &s.ack_buckets {
                        any_ack = true;
                        ack.extend_from_slice(b);
                    }
                    if let Some(b) = &s.e2e_buckets {
                        any_e2e = true;
                        e2e.extend_from_slice(b);
                    }
                }
                let summary =
                    |any: bool, b: &[(u64, u64)]| any.then(|| LatencySummary::from_histogram(&from_buckets(b)));
                m.ack_latency = summary(any_ack, &ack);
                m.e2e_latency = summary(any_e2e, &e2e);
                m
            })
            .collect();
        Timeline { samples }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(seconds: usize, acked_per_second: u64, latency_us: u64) -> Timeline {
        Timeline {
            samples: (0..seconds)
                .map(|i| Sample {
                    t: (i + 1) as f64,
                    phase: "publishing".into(),
                    connected: 10,
                    acked: acked_per_second * (i as u64 + 1),
                    acked_per_second: acked_per_second as f64,
                    ack_buckets: Some(vec![(latency_us, acked_per_second)]),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn merged_workers_add_counts_and_latency_histograms_per_second() {
        let merged = Timeline::merge(&[worker(3, 100, 1000), worker(2, 300, 3000)]);
        assert_eq!(merged.samples.len(), 3);
        let s = &merged.samples[1];
        assert_eq!((s.t, s.connected, s.acked), (2.0, 20, 200 + 600));
        assert_eq!(s.acked_per_second, 400.0);
        let l = s.ack_latency.expect("per-second latency survives the merge");
        assert_eq!(l.count, 400);
        assert!((2990..=3010).contains(&l.p50_us), "{l:?}");
        // The second worker ended: its total stays, its rate and latency are gone.
        let s = &merged.samples[2];
        assert_eq!((s.connected, s.acked), (20, 300 + 600));
        assert_eq!(s.acked_per_second, 100.0);
        assert_eq!(s.ack_latency.map(|l| l.count), Some(100));
        assert!(s.e2e_latency.is_none(), "no worker measured it");
    }

    #[test]
    fn json_latency_objects_carry_their_count() {
        let mut t = worker(1, 5, 700);
        t.samples[0].ack_latency = Some(LatencySummary { count: 5, p50_us: 700, ..Default::default() });
        let json = t.to_json();
        assert_eq!(json[0]["ack_latency"]["count"], 5);
        assert!(json[0]["e2e_latency"].is_null());
        assert!(json[0].get("ack_buckets").is_none(), "buckets stay internal");
    }
}
