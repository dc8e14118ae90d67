//! Storage lag (`--storage-lag`): how long after its acknowledgement a point becomes
//! queryable through the REST API, sampled while the run is going.
//!
//! Devices record their latest acknowledged point (its `ts` and when the ack arrived) in
//! a shared slot. A sampler thread visits the devices in turn, about ten a second: it
//! watches the device's slot until a new ack lands (so it starts within a millisecond
//! of that ack, not whenever it happened to look), then asks the server for the device's
//! latest `seq` until the answer reaches that point; the lag is the time from the ack to
//! that answer. It is an upper bound: it includes the query's own round trip, reported
//! beside it, and up to a millisecond of watching. A server
//! that acknowledges only committed data (GridLinks) shows about one round trip; one
//! that acknowledges first and writes later (a queue in front of the database) shows
//! its queue delay here.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

use crate::loss_check::SEQ_KEY;
use crate::report::{thousands, LatencySummary};
use crate::rest_api::{ApiTarget, RestClient};
use crate::stats::{new_histogram, MAX_TRACKED_MICROS};

/// Time between two samples.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Pause between two queries for a point that is not yet visible.
const POLL_EVERY: Duration = Duration::from_millis(1);

/// A point not visible this long after its ack counts as a timeout.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// How long to wait for a device's next ack before moving on to another device.
const NEXT_ACK_WAIT: Duration = Duration::from_secs(3);

/// Devices skipped between two samples (coprime with most device counts, so every
/// device gets its turn).
const STRIDE: usize = 7919;

/// The latest acknowledged point of each device.
#[derive(Debug)]
pub struct LagSlots {
    /// Per device: `ts` (ms) of the latest acknowledged point, 0 before the first.
    ts: Box<[AtomicU64]>,
    /// Per device: when that ack arrived, µs since the Unix epoch.
    ack_us: Box<[AtomicU64]>,
}

impl LagSlots {
    /// Empty slots for `devices` devices.
    pub fn new(devices: usize) -> Arc<Self> {
        Arc::new(LagSlots {
            ts: (0..devices).map(|_| AtomicU64::new(0)).collect(),
            ack_us: (0..devices).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Device `index` got the ack of point `ts` at `ack_us`.
    pub fn set(&self, index: usize, ts: u64, ack_us: u64) {
        // Release/acquire on ts: a reader that sees this ts sees this ack time (or a
        // later one).
        self.ack_us[index].store(ack_us, Ordering::Relaxed);
        self.ts[index].store(ts, Ordering::Release);
    }

    fn get(&self, index: usize) -> (u64, u64) {
        let ts = self.ts[index].load(Ordering::Acquire);
        (ts, self.ack_us[index].load(Ordering::Relaxed))
    }

    fn len(&self) -> usize {
        self.ts.len()
    }
}

/// What the sampler measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StorageLag {
    /// Ack → queryable, per sample.
    pub lag: LatencySummary,
    /// Round trip of the query that found the point (the floor of `lag`).
    pub query: LatencySummary,
    /// Points not queryable within 30 s of their ack.
    pub timeouts: u64,
}

impl StorageLag {
    /// The report line.
    pub fn line(&self) -> String {
        format!(
            "storage lag    ack -> queryable: {}; the query itself: p50 {:.3} ms; {} not visible within {} s\n",
            self.lag.line(),
            self.query.p50_us as f64 / 1000.0,
            thousands(self.timeouts),
            GIVE_UP_AFTER.as_secs()
        )
    }

    /// The JSON object ([`crate::report::json::StorageLagJson`]).
    pub fn to_json(&self) -> Value {
        crate::report::json::value(&crate::report::json::StorageLagJson::from(self))
    }
}

/// The sampler thread, until [`LagSampler::finish`].
pub struct LagSampler {
    stop: Arc<AtomicBool>,
    thread: tokio::task::JoinHandle<anyhow::Result<StorageLag>>,
}

impl LagSampler {
    /// Starts sampling the devices named `names` (index as in `slots`).
    pub fn start(api: ApiTarget, names: Vec<String>, slots: Arc<LagSlots>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = tokio::task::spawn_blocking(move || sample(&api, &names, &slots, &flag));
        LagSampler { stop, thread }
    }

    /// Stops sampling; what was measured.
    pub async fn finish(self) -> anyhow::Result<StorageLag> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.await.context("storage-lag sampler panicked")?
    }
}

/// The sampler loop.
fn sample(api: &ApiTarget, names: &[String], slots: &LagSlots, stop: &AtomicBool) -> anyhow::Result<StorageLag> {
    let client = RestClient::login(api)?;
    let mut ids: Vec<Option<String>> = vec![None; slots.len()];
    let (mut lag, mut query) = (new_histogram(), new_histogram());
    let mut timeouts = 0;
    let mut index = 0;
    if slots.len() == 0 {
        return Ok(StorageLag::default());
    }
    while !stop.load(Ordering::Relaxed) {
        index = (index + STRIDE) % slots.len();
        // Wait for this device's next ack, so the lag starts at a fresh one.
        let (before, _) = slots.get(index);
        let watching = Instant::now();
        let (ts, ack_us) = loop {
            let (ts, ack_us) = slots.get(index);
            if ts > before || stop.load(Ordering::Relaxed) || watching.elapsed() > NEXT_ACK_WAIT {
                break (ts, ack_us);
            }
            std::thread::sleep(POLL_EVERY);
        };
        if ts <= before {
            continue; // no new ack (device done or idle): try another device
        }
        let id = match &ids[index] {
            Some(id) => id.clone(),
            None => {
                let id =
                    client.device_id(&names[index])?.with_context(|| format!("device {} not found", names[index]))?;
                ids[index] = Some(id.clone());
                id
            }
        };
        loop {
            let asked = Instant::now();
            let latest = client.latest_ts(&id, SEQ_KEY)?;
            let answered_us = crate::loss_check::unix_micros();
            if latest.is_some_and(|l| l >= ts) {
                lag.saturating_record(answered_us.saturating_sub(ack_us).clamp(1, MAX_TRACKED_MICROS));
                query.saturating_record((asked.elapsed().as_micros() as u64).clamp(1, MAX_TRACKED_MICROS));
                break;
            }
            if answered_us.saturating_sub(ack_us) > GIVE_UP_AFTER.as_micros() as u64 {
                timeouts += 1;
                break;
            }
            std::thread::sleep(POLL_EVERY);
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
    Ok(StorageLag {
        lag: LatencySummary::from_histogram(&lag),
        query: LatencySummary::from_histogram(&query),
        timeouts,
    })
}
