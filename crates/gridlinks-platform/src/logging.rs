//! Log lines that can repeat — per message, per connection, per failed write — go through
//! [`warn_limited!`] / [`error_limited!`]: each call site logs at most once per second and
//! says how many lines it held back meanwhile (`suppressed`). A flood of bad publishes or a
//! full disk then costs a few lines, not tens of thousands.
//!
//! A detached task that can fail goes through [`spawn_logged`]: its error is logged, never
//! dropped with the task's `JoinHandle`.

use std::fmt::Display;
use std::future::Future;
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
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMITER: $crate::logging::Limiter = $crate::logging::Limiter::new();
        if let Some(suppressed) = LIMITER.allow() {
            $crate::logging::__tracing::warn!(suppressed, $($arg)+);
        }
    }};
}

/// `tracing::error!`, at most once per second at this call site.
#[macro_export]
macro_rules! error_limited {
    ($($arg:tt)+) => {{
        static LIMITER: $crate::logging::Limiter = $crate::logging::Limiter::new();
        if let Some(suppressed) = LIMITER.allow() {
            $crate::logging::__tracing::error!(suppressed, $($arg)+);
        }
    }};
}

pub use crate::{error_limited, warn_limited};
#[doc(hidden)]
pub use tracing as __tracing;

/// Runs `task` detached (`tokio::spawn`); if it fails, its error is logged as a
/// rate-limited WARN naming `what` (e.g. "deleting acknowledged MQTT copies").
pub fn spawn_logged<T, E>(
    what: &'static str,
    task: impl Future<Output = Result<T, E>> + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    T: Send + 'static,
    E: Display + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = task.await {
            warn_limited!(task = what, error = %e, "background task failed");
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::{spawn_logged, Limiter};

    /// Log output captured in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_detached_task_that_fails_is_logged() {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        tracing::subscriber::with_default(subscriber, || {
            rt.block_on(async {
                spawn_logged("a task that works", async { Ok::<_, String>(()) }).await.unwrap();
                spawn_logged("storing something", async { Err::<(), _>("disk on fire") }).await.unwrap();
            })
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("WARN") && text.contains("background task failed"), "{text}");
        assert!(text.contains("storing something") && text.contains("disk on fire"), "{text}");
        assert!(!text.contains("a task that works"), "{text}");
    }

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
