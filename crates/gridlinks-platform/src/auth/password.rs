//! Password hashing (argon2id) on its own small pool of threads.
//!
//! An argon2 verification costs ~25 ms of CPU by design. Run on the shared blocking pool,
//! ~100 wrong logins per second took both cores and cut device ingest 16-fold. Here every
//! hash and verification runs on `auth.password_threads` dedicated threads at idle priority
//! (SCHED_IDLE) behind a queue of [`QUEUE`]: device traffic never waits behind them, and
//! when the queue is full a login is refused at once as busy instead of queueing without
//! bound.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

use super::AuthError;

/// Password checks that may wait for a hashing thread; more are refused as busy.
pub const QUEUE: usize = 32;
/// Longest wait for a check's result before it is answered as busy.
const WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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

type Job = Box<dyn FnOnce() + Send>;

/// The hashing threads and their bounded queue.
pub struct PasswordPool {
    queue: SyncSender<Job>,
    /// A hash of a random password, verified against when a user name is unknown, so that
    /// an unknown name costs what a wrong password costs (no user-name enumeration).
    dummy: String,
}

impl PasswordPool {
    /// Starts `threads` hashing threads.
    pub fn start(threads: usize) -> Result<Self, AuthError> {
        let (queue, jobs) = sync_channel::<Job>(QUEUE);
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..threads.max(1) {
            let jobs = jobs.clone();
            std::thread::Builder::new()
                .name(format!("gridlinks-password-{i}"))
                .spawn(move || work(&jobs))
                .map_err(|e| AuthError::Hash(format!("cannot start a password thread: {e}")))?;
        }
        let dummy = hash_password(&gridlinks_storage::generate_token())?;
        Ok(Self { queue, dummy })
    }

    /// Runs `f` on a hashing thread; `Busy` when the queue is full.
    async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, AuthError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        match self.queue.try_send(job) {
            // A check that does not get CPU time in time (the data path takes it all) is
            // answered as busy; the client retries later.
            Ok(()) => match tokio::time::timeout(WAIT, rx).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(_)) | Err(_) => Err(AuthError::Busy),
            },
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(AuthError::Busy),
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

fn work(jobs: &Mutex<Receiver<Job>>) {
    // Idle priority: hashing runs only on CPU time the data path leaves over (Linux
    // schedules each thread on its own; SCHED_IDLE applies to the calling thread). A nice
    // value was not enough: with ingest waiting on fsyncs, a niced thread still took a
    // whole core and ingest fell by 43% under a flood of wrong logins.
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler only changes this thread's scheduling policy; `param` is valid.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        // SAFETY: setpriority only changes this thread's priority.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        }
    }
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        match job {
            Ok(job) => job(),
            Err(_) => return, // the pool was dropped
        }
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
}
