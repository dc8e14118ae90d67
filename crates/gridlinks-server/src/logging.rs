//! Log lines that can repeat — per message, per connection, per failed write — go through
//! [`warn_limited!`] / [`error_limited!`]: each call site logs at most once per second and
//! says how many lines it held back meanwhile (`suppressed`). A flood of bad publishes or a
//! full disk then costs a few lines, not tens of thousands.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The rate limit of one call site.
pub struct Limiter {
    /// Second (since the epoch) of the last line logged, plus one (0: never).
    last: AtomicU64,
    /// Lines held back since then.
    suppressed: AtomicU64,
}

impl Limiter {
    /// A limiter that has logged nothing yet.
    pub const fn new() -> Self {
        Self { last: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(lines held back since the last one)` when this line may be logged now.
    pub fn allow(&self) -> Option<u64> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last == now || self.last.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new()
    }
}

/// `tracing::warn!`, at most once per second at this call site.
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMITER: $crate::logging::Limiter = $crate::logging::Limiter::new();
        if let Some(suppressed) = LIMITER.allow() {
            tracing::warn!(suppressed, $($arg)+);
        }
    }};
}

/// `tracing::error!`, at most once per second at this call site.
macro_rules! error_limited {
    ($($arg:tt)+) => {{
        static LIMITER: $crate::logging::Limiter = $crate::logging::Limiter::new();
        if let Some(suppressed) = LIMITER.allow() {
            tracing::error!(suppressed, $($arg)+);
        }
    }};
}

pub(crate) use {error_limited, warn_limited};

#[cfg(test)]
mod tests {
    use super::Limiter;

    #[test]
    fn one_line_per_second_and_a_count_of_the_rest() {
        let l = Limiter::new();
        assert_eq!(l.allow(), Some(0));
        // Within the same second everything else is held back (unless the second just turned).
        let held = (0..100).filter(|_| l.allow().is_none()).count();
        assert!(held >= 99, "{held}");
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(l.allow().is_some_and(|n| n >= 99));
    }
}
