//! Live measurements shared by all connection tasks: counters for the progress line
//! and the totals, and latency histograms.
//!
//! Latencies go into a few mutex-protected histograms (shards), each connection to
//! one shard and in batches, so thousands of connections share a few MiB of histogram
//! instead of one ~250 KiB histogram each, and lock traffic stays one lock per batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

/// Highest latency a histogram tracks, microseconds (larger values are clamped).
pub const MAX_TRACKED_MICROS: u64 = 60_000_000;

/// Significant decimal digits kept by the histograms (0.1% resolution).
const SIGNIFICANT_DIGITS: u8 = 3;

/// Latencies a connection collects before taking a shard's lock.
const RECORD_BATCH: usize = 64;

/// A histogram of microseconds from 1 µs to [`MAX_TRACKED_MICROS`].
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKED_MICROS, SIGNIFICANT_DIGITS)
        .expect("static histogram bounds are valid")
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
        Arc::new(LatencyShards {
            shards: (0..count.max(1))
                .map(|_| Mutex::new(new_histogram()))
                .collect(),
        })
    }

    /// A recorder for connection `index`.
    pub fn recorder(self: &Arc<Self>, index: usize) -> LatencyRecorder {
        LatencyRecorder {
            shards: Arc::clone(self),
            shard: index % self.shards.len(),
            pending: Vec::new(),
        }
    }

    /// All shards merged into one histogram.
    pub fn merged(&self) -> Histogram<u64> {
        let mut all = new_histogram();
        for shard in self.shards.iter() {
            let shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            all.add(&*shard).expect("histograms share their bounds");
        }
        all
    }
}

/// One connection's handle for recording latencies; buffers a batch, flushes on drop.
pub struct LatencyRecorder {
    shards: Arc<LatencyShards>,
    shard: usize,
    /// Microsecond values not yet in the shard; allocated on first use.
    pending: Vec<u64>,
}

impl LatencyRecorder {
    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        if self.pending.capacity() == 0 {
            self.pending.reserve_exact(RECORD_BATCH);
        }
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.pending.push(micros.clamp(1, MAX_TRACKED_MICROS));
        if self.pending.len() >= RECORD_BATCH {
            self.flush();
        }
    }

    /// Moves the buffered values into the shared shard.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut shard = self.shards.shards[self.shard]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
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
    }
}
