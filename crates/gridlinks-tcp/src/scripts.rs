//! The threads decoder scripts run on. A script call may take up to its time limit, and a
//! script's work is the device's to choose (a frame can be made to make a regular
//! expression backtrack): none of it may run on the runtime's threads, which serve every
//! other connection (HTTP, MQTT, CoAP, other TCP devices). Each custom TCP connection sends
//! the script work of one read here as one job and waits for it; a job is bounded by the
//! script time limit (`tcp.script_timeout`), and a connection has at most one job queued or
//! running, so the queue is bounded by the connection limit.

use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads running script jobs in arrival order.
pub struct ScriptPool {
    jobs: mpsc::Sender<Job>,
}

/// The pool's threads have stopped (the server is shutting down).
#[derive(Debug)]
pub struct PoolGone;

impl ScriptPool {
    /// Starts `threads` script threads (at least one).
    pub fn start(threads: usize) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads.max(1) {
            let queue = queue.clone();
            std::thread::Builder::new().name(format!("gridlinks-script-{i}")).spawn(move || loop {
                // The lock is held only while waiting, not while the job runs.
                let job = queue.lock().recv();
                match job {
                    Ok(job) => job(),
                    Err(_) => return,
                }
            })?;
        }
        Ok(Self { jobs })
    }

    /// Runs `f` on a script thread and waits for its result without holding the caller's
    /// thread.
    pub async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, PoolGone> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The connection may have gone meanwhile: nobody to tell.
            let _ = tx.send(f());
        });
        self.jobs.send(job).map_err(|_| PoolGone)?;
        rx.await.map_err(|_| PoolGone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn jobs_run_off_the_callers_thread_and_a_busy_job_does_not_hold_the_caller() {
        let pool = Arc::new(ScriptPool::start(2).unwrap());
        let caller = std::thread::current().id();
        let (release, held) = std::sync::mpsc::channel::<()>();
        // One job blocks its script thread until told; the single-threaded runtime still
        // runs other tasks, and the other script thread another job, meanwhile.
        let p = pool.clone();
        let blocked = tokio::spawn(async move { p.run(move || held.recv().is_ok()).await.unwrap() });
        let other = pool.run(move || std::thread::current().id()).await.unwrap();
        assert_ne!(other, caller);
        release.send(()).unwrap();
        assert!(blocked.await.unwrap());
    }
}
