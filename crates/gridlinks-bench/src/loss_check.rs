//! The loss check: every point whose PUBACK arrived must be stored. After a run (or
//! later, from a saved acks file) each device's acknowledged timestamps are compared
//! with the timestamps of key `seq` the server returns through its REST API.
//!
//! * **missing**: acknowledged but not stored: the run fails (exit code [`EXIT_LOSS`]).
//! * **extra**: stored but not acknowledged (e.g. a publish whose PUBACK was lost with
//!   its connection): allowed, QoS 1 is at-least-once.
//!
//! The check runs once, after the run, so it cannot measure how long a point took to
//! become queryable; it reports the bound it can: every found point was queryable by
//! the time of the check.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::report::thousands;
use crate::rest_api::{ApiTarget, RestClient};

/// Telemetry key whose timestamps are compared (every message carries `seq`).
pub const SEQ_KEY: &str = "seq";

/// Process exit code when acknowledged points are missing (1 stays "the tool failed").
pub const EXIT_LOSS: u8 = 2;

/// Missing points listed by name in the report.
const MAX_LISTED: usize = 10;

/// `format` field of an acks file.
const ACKS_FORMAT: &str = "gridlinks-bench-acks";

/// Version of the acks file layout.
const ACKS_VERSION: u64 = 1;

/// The acknowledged points of one device, in ack order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AckLog {
    /// The `ts` of each acknowledged publish, ms since the epoch.
    pub ts: Vec<u64>,
    /// When its PUBACK was decoded, ms since the epoch (same index as `ts`).
    pub ack_ms: Vec<u64>,
}

impl AckLog {
    /// Records one acknowledged publish.
    pub fn push(&mut self, ts: u64, ack_ms: u64) {
        self.ts.push(ts);
        self.ack_ms.push(ack_ms);
    }
}

/// One device's acknowledged points, with the name the REST API knows it by.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceAcks {
    /// Device name.
    pub name: String,
    /// Its acknowledged points.
    pub acks: AckLog,
}

/// An acks file: every device's acknowledged points.
#[derive(Serialize, Deserialize)]
struct AcksFile<D> {
    /// [`ACKS_FORMAT`].
    format: String,
    /// [`ACKS_VERSION`].
    version: u64,
    /// [`SEQ_KEY`].
    key: String,
    devices: Vec<D>,
}

/// One device of an acks file as written (borrowed from the run).
#[derive(Serialize)]
struct AcksOf<'a> {
    name: &'a str,
    acked_ts: &'a [u64],
    ack_ms: &'a [u64],
}

/// One device of an acks file as read.
#[derive(Deserialize)]
struct AcksRead {
    name: String,
    acked_ts: Vec<u64>,
    ack_ms: Vec<u64>,
}

/// Writes the acks file read by `gridlinks-bench verify --acks`.
pub fn save(path: &Path, devices: &[DeviceAcks]) -> anyhow::Result<()> {
    let doc = AcksFile {
        format: ACKS_FORMAT.into(),
        version: ACKS_VERSION,
        key: SEQ_KEY.into(),
        devices: devices
            .iter()
            .map(|d| AcksOf { name: &d.name, acked_ts: &d.acks.ts, ack_ms: &d.acks.ack_ms })
            .collect(),
    };
    let text = serde_json::to_string(&doc)?;
    std::fs::write(path, text).with_context(|| format!("writing acks file {}", path.display()))
}

/// Reads an acks file written by [`save`].
pub fn load(path: &Path) -> anyhow::Result<Vec<DeviceAcks>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading acks file {}", path.display()))?;
    let doc: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    if doc["format"] != ACKS_FORMAT || doc["version"] != ACKS_VERSION {
        bail!("{} is not a version {ACKS_VERSION} {ACKS_FORMAT} file", path.display());
    }
    let doc: AcksFile<AcksRead> =
        serde_json::from_value(doc).with_context(|| format!("{} is not a valid acks file", path.display()))?;
    doc.devices
        .into_iter()
        .map(|d| {
            if d.acked_ts.len() != d.ack_ms.len() {
                bail!("device {}: acked_ts and ack_ms differ in length", d.name);
            }
            Ok(DeviceAcks { name: d.name, acks: AckLog { ts: d.acked_ts, ack_ms: d.ack_ms } })
        })
        .collect()
}

/// What the loss check found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossReport {
    /// Devices compared.
    pub devices_checked: usize,
    /// Devices with acknowledged points that the REST API does not know (all their
    /// points count as missing); the first [`MAX_LISTED`] names.
    pub devices_not_found: Vec<String>,
    /// Number of such devices.
    pub devices_not_found_count: usize,
    /// Acknowledged points.
    pub points_acked: u64,
    /// Acknowledged points that are stored.
    pub points_found: u64,
    /// Acknowledged points that are not stored.
    pub missing: u64,
    /// The first [`MAX_LISTED`] missing points as (device, ts), by device order.
    pub missing_examples: Vec<(String, u64)>,
    /// Stored points in the acknowledged range that were never acknowledged.
    pub extra: u64,
    /// Milliseconds from the last PUBACK to the start of the check: every found point
    /// was queryable at most this long (plus its own query time) after its ack.
    pub check_after_last_ack_ms: Option<u64>,
    /// Seconds the check took.
    pub check_seconds: f64,
}

impl LossReport {
    /// True when no acknowledged point is missing.
    pub fn passed(&self) -> bool {
        self.missing == 0
    }

    /// The verdict line.
    pub fn verdict(&self) -> String {
        if self.passed() {
            "LOSS CHECK PASSED".into()
        } else {
            format!("LOSS CHECK FAILED: {} acknowledged points missing", self.missing)
        }
    }

    /// The human summary, ending with the verdict line.
    pub fn human(&self) -> String {
        let mut s = format!(
            "loss check     {} devices, {} points acked, {} found, {} missing, {} extra \
             (stored, not acked: allowed) in {:.2} s\n",
            thousands(self.devices_checked as u64),
            thousands(self.points_acked),
            thousands(self.points_found),
            thousands(self.missing),
            thousands(self.extra),
            self.check_seconds,
        );
        s.push_str(&match self.check_after_last_ack_ms {
            Some(ms) => format!(
                "queryable      every found point was queryable at check time, \
                 {:.2} s after the last ack\n",
                ms as f64 / 1000.0
            ),
            None => "queryable      nothing acknowledged\n".into(),
        });
        if self.devices_not_found_count > 0 {
            s.push_str(&format!(
                "not found      {} devices with acked points: {}\n",
                self.devices_not_found_count,
                self.devices_not_found.join(", ")
            ));
        }
        if !self.missing_examples.is_empty() {
            let listed: Vec<String> = self.missing_examples.iter().map(|(d, ts)| format!("{d}/{ts}")).collect();
            s.push_str(&format!(
                "missing        {}{}\n",
                listed.join(" "),
                if self.missing > listed.len() as u64 { " ..." } else { "" }
            ));
        }
        s.push_str(&self.verdict());
        s.push('\n');
        s
    }

    /// The JSON result ([`crate::report::json::LossCheckJson`]).
    pub fn to_json(&self) -> Value {
        crate::report::json::value(&crate::report::json::LossCheckJson::from(self))
    }
}

/// One device's comparison.
#[derive(Debug, Default)]
struct DeviceOutcome {
    /// The REST API has no device of that name.
    not_found: bool,
    /// Acknowledged points.
    acked: u64,
    /// Acknowledged and stored.
    found: u64,
    /// Acknowledged, not stored: the first few.
    missing_ts: Vec<u64>,
    /// Acknowledged, not stored.
    missing: u64,
    /// Stored, not acknowledged.
    extra: u64,
}

/// Compares sorted acknowledged and stored timestamps: (found, missing, extra) and the
/// first [`MAX_LISTED`] missing timestamps.
pub fn compare(acked: &[u64], stored: &[u64]) -> (u64, u64, u64, Vec<u64>) {
    let (mut i, mut j) = (0, 0);
    let (mut found, mut missing, mut extra) = (0u64, 0u64, 0u64);
    let mut examples = Vec::new();
    while i < acked.len() || j < stored.len() {
        match (acked.get(i), stored.get(j)) {
            (Some(a), Some(s)) if a == s => {
                found += 1;
                i += 1;
                j += 1;
            }
            (Some(a), Some(s)) if s < a => {
                extra += 1;
                j += 1;
            }
            (Some(a), _) => {
                missing += 1;
                if examples.len() < MAX_LISTED {
                    examples.push(*a);
                }
                i += 1;
            }
            (None, Some(_)) => {
                extra += 1;
                j += 1;
            }
            (None, None) => unreachable!("loop condition"),
        }
    }
    (found, missing, extra, examples)
}

/// What an acknowledged point is known by in the store.
#[derive(Debug, Clone, Copy)]
pub enum Acked {
    /// Its timestamp, which the client chose: the `ts` of the [`SEQ_KEY`] points.
    Timestamp,
    /// Its sequence number, the value of the [`SEQ_KEY`] points stored in `[start, end)`
    /// (protocols whose points the server timestamps).
    SeqValue {
        /// Earliest timestamp to look at, ms since the epoch.
        start: u64,
        /// Timestamp to look before.
        end: u64,
    },
}

/// Runs the check for `devices` with `threads` REST calls in flight. Blocking: call
/// it from a plain thread (or `spawn_blocking`). An error means the check could not
/// run (REST API unreachable, login refused), not that points are missing.
pub fn check(api: &ApiTarget, devices: &[DeviceAcks], threads: usize) -> anyhow::Result<LossReport> {
    check_by(api, devices, threads, Acked::Timestamp)
}

/// [`check`], with acknowledged points known by `by`.
pub fn check_by(api: &ApiTarget, devices: &[DeviceAcks], threads: usize, by: Acked) -> anyhow::Result<LossReport> {
    let started = Instant::now();
    let started_ms = unix_millis();
    let outcomes = per_device(api, devices.len(), threads, |client, i| check_device(client, &devices[i], by))?;
    let mut report = LossReport {
        devices_checked: devices.len(),
        check_after_last_ack_ms: devices
            .iter()
            .filter_map(|d| d.acks.ack_ms.iter().max())
            .max()
            .map(|last| started_ms.saturating_sub(*last)),
        ..Default::default()
    };
    for (device, o) in devices.iter().zip(outcomes) {
        let name = &device.name;
        if o.not_found {
            report.devices_not_found_count += 1;
            if report.devices_not_found.len() < MAX_LISTED {
                report.devices_not_found.push(name.clone());
            }
        }
        report.points_acked += o.acked;
        report.points_found += o.found;
        report.missing += o.missing;
        report.extra += o.extra;
        for ts in o.missing_ts {
            if report.missing_examples.len() < MAX_LISTED {
                report.missing_examples.push((name.clone(), ts));
            }
        }
    }
    report.check_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Runs `each(client, i)` for every `i` in `0..n`, on `threads` threads sharing one login
/// to `api`; the results in index order. The first error stops the other threads early
/// and is returned. Blocking.
pub fn per_device<T: Send>(
    api: &ApiTarget,
    n: usize,
    threads: usize,
    each: impl Fn(&RestClient, usize) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<Vec<T>> {
    let client = RestClient::login(api)?;
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        // An error stops the other workers early.
                        let result = each(&client, i).inspect_err(|_| next.store(n, Ordering::Relaxed))?;
                        results.lock().unwrap_or_else(PoisonError::into_inner).push((i, result));
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().map_err(|_| anyhow::anyhow!("a REST worker panicked"))??;
        }
        Ok(())
    })?;
    let mut results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results.sort_unstable_by_key(|(i, _)| *i);
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

/// Compares one device.
fn check_device(client: &RestClient, device: &DeviceAcks, by: Acked) -> anyhow::Result<DeviceOutcome> {
    let mut acked = device.acks.ts.clone();
    acked.sort_unstable();
    acked.dedup();
    let mut outcome = DeviceOutcome { acked: acked.len() as u64, ..Default::default() };
    let (Some(&first), Some(&last)) = (acked.first(), acked.last()) else {
        return Ok(outcome); // nothing acknowledged, nothing to look for
    };
    let stored = match client.device_id(&device.name)? {
        Some(id) => match by {
            Acked::Timestamp => client.timestamps(&id, SEQ_KEY, first, last + 1)?,
            Acked::SeqValue { start, end } => {
                let mut seqs = client.integer_values(&id, SEQ_KEY, start, end)?;
                seqs.sort_unstable();
                seqs.dedup();
                seqs.retain(|s| (first..=last).contains(s));
                seqs
            }
        },
        None => {
            outcome.not_found = true;
            Vec::new()
        }
    };
    let (found, missing, extra, examples) = compare(&acked, &stored);
    outcome.found = found;
    outcome.missing = missing;
    outcome.extra = extra;
    outcome.missing_ts = examples;
    Ok(outcome)
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis() -> u64 {
    unix_micros() / 1000
}

/// Microseconds since the Unix epoch.
pub fn unix_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_counts_found_missing_and_extra() {
        assert_eq!(compare(&[1, 2, 3], &[1, 2, 3]), (3, 0, 0, vec![]));
        assert_eq!(compare(&[1, 2, 3, 5], &[0, 2, 4, 5, 6]), (2, 2, 3, vec![1, 3]));
        assert_eq!(compare(&[1, 2], &[]), (0, 2, 0, vec![1, 2]));
        assert_eq!(compare(&[], &[7]), (0, 0, 1, vec![]));
        let many: Vec<u64> = (0..50).collect();
        let (_, missing, _, examples) = compare(&many, &[]);
        assert_eq!((missing, examples.len()), (50, MAX_LISTED));
    }

    #[test]
    fn acks_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("bench-acks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("acks.json");
        let devices = vec![
            DeviceAcks { name: "bench-0".into(), acks: AckLog { ts: vec![10, 11], ack_ms: vec![12, 13] } },
            DeviceAcks { name: "bench-1".into(), acks: AckLog::default() },
        ];
        save(&path, &devices).unwrap();
        assert_eq!(load(&path).unwrap(), devices);
        std::fs::write(&path, "{}").unwrap();
        assert!(load(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn verdict_names_the_missing_count() {
        let mut r = LossReport::default();
        assert!(r.human().ends_with("LOSS CHECK PASSED\n"));
        r.missing = 3;
        r.missing_examples = vec![("bench-0".into(), 5)];
        assert!(r.human().ends_with("LOSS CHECK FAILED: 3 acknowledged points missing\n"));
        assert_eq!(r.to_json()["passed"], false);
    }
}
