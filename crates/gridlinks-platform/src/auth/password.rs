//! Password hashing (argon2id) on its own small pool of threads.
//!
//! An argon2 verification costs ~25 ms of CPU by design. Run on the shared blocking pool,
//! ~100 wrong logins per second took both cores and cut device ingest 16-fold. Here every
//! hash and verification runs on `auth.password_threads` dedicated threads at idle priority
//! (SCHED_IDLE) behind a queue of [`QUEUE`]: device traffic never waits behind them, and
//! when the queue is full a login is refused at once as busy instead of queueing without
//! bound.
//!
//! Idle priority alone can starve: on a machine whose cores are kept busy (by the data path
//! or by anything else) a check may not run for minutes, and the administrator cannot log
//! in. So one more thread, at normal priority, takes the oldest check that has waited
//! [`AGED`], and rests nine times as long as the check ran: logins always progress, and a
//! flood of them costs the data path at most a tenth of one core. (At nice 19 it still
//! starved: beside two busy normal-priority processes it got under 1% of a core, and every
//! check waited past [`WAIT`].) A check whose caller has gone (it was answered as busy) is
//! dropped unrun.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

use super::AuthError;

/// Password checks that may wait for a hashing thread; more are refused as busy.
pub const QUEUE: usize = 32;
/// Longest wait for a check's result before it is answered as busy.
const WAIT: Duration = Duration::from_secs(10);
/// How long a check waits for an idle-priority thread before the aged-check thread takes it.
pub const AGED: Duration = Duration::from_secs(1);
/// The aged-check thread rests this many times a check's run time after it: it takes at
/// most a tenth of a core whatever the scheduler gives it.
const AGED_REST: u32 = 9;

/// Hashes a password with argon2id and a random salt (PHC string).
pub fn hash_password(password: &str) -> Result<String, AuthError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

/// Checks a password against a PHC hash.
pub fn verify_password(password: &[u8], phc: &str) -> Result<(), AuthError> {
    let parsed = PasswordHash::new(phc).map_err(|e| AuthError::Hash(e.to_string()))?;
    Argon2::default().verify_password(password, &parsed).map_err(|_| AuthError::BadCredentials)
}

/// A queued check: when it was queued, and the work (which does nothing when its caller
/// has gone).
struct Job {
    queued: Instant,
    run: Box<dyn FnOnce() + Send>,
}

/// The queue the hashing threads share.
#[derive(Default)]
struct Jobs {
    queue: Mutex<Queue>,
    ready: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// The pool was dropped: the threads end.
    closed: bool,
}

/// The hashing threads and their bounded queue.
pub struct PasswordPool {
    jobs: Arc<Jobs>,
    /// A hash of a random password, verified against when a user name is unknown, so that
    /// an unknown name costs what a wrong password costs (no user-name enumeration).
    dummy: String,
}

impl PasswordPool {
    /// Starts `threads` idle-priority hashing threads and the aged-check thread.
    pub fn start(threads: usize) -> Result<Self, AuthError> {
        let jobs = Arc::new(Jobs::default());
        for i in 0..=threads.max(1) {
            let (jobs, aged) = (jobs.clone(), i == 0);
            let name = if aged { "gridlinks-password-aged".to_owned() } else { format!("gridlinks-password-{i}") };
            std::thread::Builder::new()
                .name(name)
                .spawn(move || work(&jobs, aged))
                .map_err(|e| AuthError::Hash(format!("cannot start a password thread: {e}")))?;
        }
        let dummy = hash_password(&gridlinks_storage::generate_token())?;
        Ok(Self { jobs, dummy })
    }

    /// Runs `f` on a hashing thread; `Busy` when the queue is full.
    async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, AuthError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let run = Box::new(move || {
            if !tx.is_closed() {
                let _ = tx.send(f());
            }
        });
        {
            let mut queue = self.jobs.queue.lock().map_err(|_| AuthError::Busy)?;
            if queue.jobs.len() >= QUEUE {
                return Err(AuthError::Busy);
            }
            queue.jobs.push_back(Job { queued: Instant::now(), run });
        }
        self.jobs.ready.notify_all();
        // A check that does not get CPU time in time is answered as busy; the client
        // retries later (and the check is dropped unrun).
        match tokio::time::timeout(WAIT, rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) | Err(_) => Err(AuthError::Busy),
        }
    }

    /// Whether `password` matches `phc`; with `None` (unknown user) it is checked against a
    /// random hash, at the same cost, and never matches.
    pub async fn verify(&self, password: &[u8], phc: Option<&str>) -> Result<bool, AuthError> {
        let known = phc.is_some();
        let (password, phc) = (password.to_vec(), phc.unwrap_or(&self.dummy).to_owned());
        let ok = self.run(move || verify_password(&password, &phc).is_ok()).await?;
        Ok(ok && known)
    }

    /// Hashes `password` on a hashing thread.
    pub async fn hash(&self, password: String) -> Result<String, AuthError> {
        self.run(move || hash_password(&password)).await?
    }
}

impl Drop for PasswordPool {
    fn drop(&mut self) {
        if let Ok(mut queue) = self.jobs.queue.lock() {
            queue.closed = true;
        }
        self.jobs.ready.notify_all();
    }
}

/// One hashing thread: an idle-priority one takes any queued check; the `aged` one (normal
/// priority) only a check that has waited [`AGED`], looking again each [`AGED`] / 4 and
/// resting [`AGED_REST`] times each check's run time after it.
fn work(jobs: &Jobs, aged: bool) {
    if !aged {
        // Idle priority: hashing runs only on CPU time the data path leaves over (Linux
        // schedules each thread on its own; SCHED_IDLE applies to the calling thread). A
        // nice value was not enough: with ingest waiting on fsyncs, a niced thread still
        // took a whole core and ingest fell by 43% under a flood of wrong logins.
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler only changes this thread's scheduling policy; `param` is valid.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            // SAFETY: setpriority only changes this thread's priority.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 19);
            }
        }
    }
    let Ok(mut queue) = jobs.queue.lock() else { return };
    while !queue.closed {
        let take = match queue.jobs.front() {
            Some(job) => !aged || job.queued.elapsed() >= AGED,
            None => false,
        };
        if let Some(job) = take.then(|| queue.jobs.pop_front()).flatten() {
            drop(queue);
            let began = Instant::now();
            (job.run)();
            if aged {
                std::thread::sleep(began.elapsed() * AGED_REST);
            }
            queue = match jobs.queue.lock() {
                Ok(q) => q,
                Err(_) => return,
            };
            continue;
        }
        queue = if aged {
            match jobs.ready.wait_timeout(queue, AGED / 4) {
                Ok((q, _)) => q,
                Err(_) => return,
            }
        } else {
            match jobs.ready.wait(queue) {
                Ok(q) => q,
                Err(_) => return,
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_and_verify() {
        let h = hash_password("s3cret").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert_eq!(verify_password(b"s3cret", &h), Ok(()));
        assert_eq!(verify_password(b"wrong", &h), Err(AuthError::BadCredentials));
    }

    #[tokio::test]
    async fn unknown_users_never_match_and_a_full_queue_is_busy() {
        let pool = PasswordPool::start(1).unwrap();
        let h = pool.hash("pw".into()).await.unwrap();
        assert!(pool.verify(b"pw", Some(&h)).await.unwrap());
        assert!(!pool.verify(b"nope", Some(&h)).await.unwrap());
        assert!(!pool.verify(b"pw", None).await.unwrap());
        // Far more checks at once than the queue holds: some are refused as busy.
        let pool = Arc::new(pool);
        let checks: Vec<_> = (0..QUEUE * 3)
            .map(|_| {
                let (pool, h) = (pool.clone(), h.clone());
                tokio::spawn(async move { pool.verify(b"x", Some(&h)).await })
            })
            .collect();
        let mut busy = 0;
        for c in checks {
            if matches!(c.await.unwrap(), Err(AuthError::Busy)) {
                busy += 1;
            }
        }
        assert!(busy > 0);
    }

    /// With the only idle-priority thread held (as a starved one would be), a check still
    /// runs: the aged-check thread takes it. (On a busy machine the holder itself may wait a
    /// second and land on the aged thread; then the check runs on the idle one.)
    #[tokio::test]
    async fn a_check_that_waits_too_long_runs_on_the_aged_thread() {
        let pool = Arc::new(PasswordPool::start(1).unwrap());
        let (hold, held) = std::sync::mpsc::channel::<()>();
        let (started, start) = tokio::sync::oneshot::channel();
        let holder = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.run(move || {
                    let _ = started.send(std::thread::current().name().map(str::to_owned));
                    let _ = held.recv();
                })
                .await
            })
        };
        let holder_thread = start.await.unwrap();
        let name = pool.run(|| std::thread::current().name().map(str::to_owned)).await.unwrap();
        let mut both = [holder_thread.unwrap(), name.unwrap()];
        both.sort();
        assert_eq!(both, ["gridlinks-password-1", "gridlinks-password-aged"]);
        hold.send(()).unwrap();
        holder.await.unwrap().unwrap();
    }
}
