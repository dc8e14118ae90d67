//! A lock-free histogram with fixed buckets, for the writer's per-commit figures (round
//! duration, requests per commit). Recording is three relaxed atomic adds, so the writer
//! thread never waits on a reader; the server turns a [`Snapshot`] into Prometheus text.
//! This crate does not depend on a metrics library: the buckets are the whole interface.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of [`CommitNanos`]: 100 µs to 10 s, nanoseconds.
pub const COMMIT_NANOS_BOUNDS: &[u64] = &[
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    10_000_000_000,
];

/// Upper bounds of [`BatchOps`]: powers of two up to 16384 (`max_batch_ops` is 4096 by default).
pub const BATCH_OPS_BOUNDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];

/// Duration of the writer's group commit rounds (taking the batch, applying it, fsync), ns.
#[derive(Debug)]
pub struct CommitNanos(Histogram);

impl Default for CommitNanos {
    fn default() -> Self {
        Self(Histogram::new(COMMIT_NANOS_BOUNDS))
    }
}

impl Deref for CommitNanos {
    type Target = Histogram;
    fn deref(&self) -> &Histogram {
        &self.0
    }
}

/// Write requests per group commit.
#[derive(Debug)]
pub struct BatchOps(Histogram);

impl Default for BatchOps {
    fn default() -> Self {
        Self(Histogram::new(BATCH_OPS_BOUNDS))
    }
}

impl Deref for BatchOps {
    type Target = Histogram;
    fn deref(&self) -> &Histogram {
        &self.0
    }
}

/// Counts of values by upper bound, with their sum.
#[derive(Debug)]
pub struct Histogram {
    /// Inclusive upper bounds, ascending; values above the last go to the overflow bucket.
    bounds: &'static [u64],
    /// One count per bound, plus the overflow bucket (not cumulative).
    counts: Box<[AtomicU64]>,
    /// Sum of the recorded values (wraps only after 584 years of nanoseconds).
    sum: AtomicU64,
}

/// The state of a [`Histogram`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// (inclusive upper bound, values in this bucket and not in a lower one); the last
    /// entry's bound is `None`: the overflow bucket.
    pub buckets: Vec<(Option<u64>, u64)>,
    /// Sum of the recorded values.
    pub sum: u64,
    /// Values recorded (the sum of the buckets' counts, so the two always agree).
    pub count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (inclusive upper bounds, ascending).
    pub fn new(bounds: &'static [u64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds must ascend");
        Self { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum: AtomicU64::new(0) }
    }

    /// Records one value.
    pub fn record(&self, value: u64) {
        let i = self.bounds.partition_point(|&b| b < value);
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> Snapshot {
        let buckets: Vec<(Option<u64>, u64)> = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| (self.bounds.get(i).copied(), c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        Snapshot { buckets, sum: self.sum.load(Ordering::Relaxed), count }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        let h = Histogram::new(&[1, 10, 100]);
        for v in [0, 1, 2, 10, 11, 100, 101, 5_000] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(Some(1), 2), (Some(10), 2), (Some(100), 2), (None, 2)]);
        assert_eq!(s.count, 8);
        assert_eq!(s.sum, 5_225);
    }

    #[test]
    fn an_empty_histogram_has_zero_counts() {
        let s = Histogram::new(&[5]).snapshot();
        assert_eq!(s, Snapshot { buckets: vec![(Some(5), 0), (None, 0)], sum: 0, count: 0 });
    }
}
