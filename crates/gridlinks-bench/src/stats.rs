//! Live measurements shared by all connection tasks: counters for the progress line
//! and the totals, and latency histograms.
//!
//! Latencies go into a few mutex-protected histograms (shards), each connection to
//! one shard and in batches, so thousands of connections share a few MiB of histogram
//! instead of one ~250 KiB histogram each, and lock traffic stays one lock per batch.
//! A batch is also flushed once it is [`FLUSH_EVERY`] old, so the progress task, which
//! reads the shards once a second for the per-second latency of the timeline, sees a
//! value within a fraction of a second of its measurement, however slowly a
//! connection records (a device publishing once a second never fills a batch).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Highest latency a histogram tracks, microseconds (larger values are clamped).
pub const MAX_TRACKED_MICROS: u64 = 60_000_000;

/// Significant decimal digits kept by the histograms (0.1% resolution).
const SIGNIFICANT_DIGITS: u8 = 3;

/// Latencies a connection collects before taking a shard's lock.
const RECORD_BATCH: usize = 64;

/// Longest a connection keeps recorded latencies before moving them into its shard:
/// a tenth of the progress task's one-second sampling, so a value lands in the
/// timeline second it was measured in (or, near the boundary, the next).
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// A histogram of microseconds from 1 µs to [`MAX_TRACKED_MICROS`].
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKED_MICROS, SIGNIFICANT_DIGITS).expect("static histogram bounds are valid")
}

/// A histogram as (µs, count) pairs: compact enough to keep one a second and to send
/// from a worker process to its parent.
pub type Buckets = Vec<(u64, u64)>;

/// The recorded values of `h` as [`Buckets`].
pub fn buckets(h: &Histogram<u64>) -> Buckets {
    h.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect()
}

/// A histogram of [`new_histogram`]'s bounds holding `buckets` (values out of range
/// are clamped, as when recorded).
pub fn from_buckets(buckets: &[(u64, u64)]) -> Histogram<u64> {
    let mut h = new_histogram();
    for &(value, count) in buckets {
        h.saturating_record_n(value.clamp(1, MAX_TRACKED_MICROS), count);
    }
    h
}

/// Counters every scenario updates; read once a second for the progress line.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections that got an accepting CONNACK.
    pub connected: AtomicU64,
    /// Connection attempts that failed (TCP, timeout or refusing CONNACK).
    pub connect_failed: AtomicU64,
    /// Established connections that were lost before the scenario ended.
    pub dropped: AtomicU64,
    /// PUBLISH packets written to sockets.
    pub sent: AtomicU64,
    /// Publishes acknowledged with a success PUBACK (at QoS 0: written).
    pub acked: AtomicU64,
    /// Publishes that will not be acknowledged: refused, or lost with their connection.
    pub failed: AtomicU64,
    /// Messages delivered to subscribers (pubsub).
    pub received: AtomicU64,
}

impl Counters {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Latency histograms shared by many connections.
pub struct LatencyShards {
    /// Each behind its own lock; connection `i` records into shard `i % len`.
    shards: Box<[Mutex<Histogram<u64>>]>,
}

impl LatencyShards {
    /// `count` empty shards (at least one).
    pub fn new(count: usize) -> Arc<Self> {
        Arc::new(LatencyShards { shards: (0..count.max(1)).map(|_| Mutex::new(new_histogram())).collect() })
    }

    /// A recorder for connection `index`.
    pub fn recorder(self: &Arc<Self>, index: usize) -> LatencyRecorder {
        LatencyRecorder {
            shards: Arc::clone(self),
            shard: index % self.shards.len(),
            pending: Vec::new(),
            flushed: None,
        }
    }

    /// Records one latency straight into shard `index % shards`, for callers that
    /// record rarely (one CONNACK per connection) and need no batching.
    pub fn record(&self, index: usize, latency: Duration) {
        let mut shard = self.shards[index % self.shards.len()].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        shard.saturating_record(micros(latency));
    }

    /// All shards merged into one histogram.
    pub fn merged(&self) -> Histogram<u64> {
        let mut all = new_histogram();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            all.add(&*shard).expect("histograms share their bounds");
        }
        all
    }
}

/// A latency as histogram microseconds, clamped to the tracked range.
fn micros(latency: Duration) -> u64 {
    u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).clamp(1, MAX_TRACKED_MICROS)
}

/// One connection's handle for recording latencies; buffers a batch (at most
/// [`RECORD_BATCH`] values, at most [`FLUSH_EVERY`] old), flushes on drop.
pub struct LatencyRecorder {
    shards: Arc<LatencyShards>,
    shard: usize,
    /// Microsecond values not yet in the shard; allocated on first use.
    pending: Vec<u64>,
    /// When the shard last received this recorder's values: the batch is flushed once
    /// this is [`FLUSH_EVERY`] ago. `None` before the first value, which goes straight
    /// to the shard.
    flushed: Option<Instant>,
}

impl LatencyRecorder {
    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        self.record_at(latency, Instant::now());
    }

    /// Records one latency measured at `now` (the clock is a parameter so the batching
    /// can be tested without sleeping).
    fn record_at(&mut self, latency: Duration, now: Instant) {
        if self.pending.capacity() == 0 {
            self.pending.reserve_exact(RECORD_BATCH);
        }
        self.pending.push(micros(latency));
        if self.pending.len() >= RECORD_BATCH
            || self.flushed.is_none_or(|t| now.saturating_duration_since(t) >= FLUSH_EVERY)
        {
            self.flush_at(now);
        }
    }

    /// Moves the buffered values into the shared shard.
    pub fn flush(&mut self) {
        self.flush_at(Instant::now());
    }

    fn flush_at(&mut self, now: Instant) {
        self.flushed = Some(now);
        if self.pending.is_empty() {
            return;
        }
        let mut shard = self.shards.shards[self.shard].lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for &v in &self.pending {
            shard.saturating_record(v);
        }
        self.pending.clear();
    }
}

impl Drop for LatencyRecorder {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorders_batch_into_shards_and_flush_on_drop() {
        let shards = LatencyShards::new(4);
        for conn in 0..10 {
            let mut rec = shards.recorder(conn);
            for ms in 1..=100u64 {
                rec.record(Duration::from_millis(ms));
            }
        }
        let all = shards.merged();
        assert_eq!(all.len(), 1000);
        assert_eq!(all.max(), all.highest_equivalent(100_000));
        // Out-of-range values are clamped, not lost.
        let mut rec = shards.recorder(0);
        rec.record(Duration::from_secs(3600));
        rec.record(Duration::ZERO);
        drop(rec);
        assert_eq!(shards.merged().len(), 1002);
        shards.record(5, Duration::from_millis(3));
        assert_eq!(shards.merged().len(), 1003);
    }

    #[test]
    fn buckets_round_trip() {
        let mut h = new_histogram();
        for v in [1u64, 20, 20, 3000, 3_000_000] {
            h.record(v).unwrap();
        }
        let back = from_buckets(&buckets(&h));
        assert_eq!(back.len(), h.len());
        assert_eq!(back.max(), h.max());
        assert_eq!(back.value_at_quantile(0.5), h.value_at_quantile(0.5));
    }

    #[test]
    fn a_slow_recorder_reaches_its_shard_without_filling_a_batch() {
        // A device publishing every 150 ms: far fewer than a batch in a second, but
        // each value must be readable from the shard (the per-second timeline) while
        // the recorder is still alive.
        // The clock is given, not slept on: a busy machine cannot stretch "quick".
        let shards = LatencyShards::new(2);
        let mut rec = shards.recorder(1);
        let mut now = Instant::now();
        rec.record_at(Duration::from_millis(1), now);
        assert_eq!(shards.merged().len(), 1, "the first value goes straight in");
        for i in 2..=4u64 {
            now += FLUSH_EVERY + Duration::from_millis(50);
            rec.record_at(Duration::from_millis(i), now);
            assert_eq!(shards.merged().len(), i, "value {i} still pending");
        }
        // Quick successive values are batched, and in the shard within FLUSH_EVERY.
        rec.record_at(Duration::from_millis(5), now + Duration::from_millis(1));
        rec.record_at(Duration::from_millis(6), now + Duration::from_millis(2));
        assert_eq!(shards.merged().len(), 4, "batched");
        rec.record_at(Duration::from_millis(7), now + FLUSH_EVERY);
        assert_eq!(shards.merged().len(), 7);
        drop(rec);
    }
}
