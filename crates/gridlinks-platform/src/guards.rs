//! Bounds on what a caller can learn or make in bulk through the ThingsBoard API:
//!
//! - [`Guards::conflicts`]: access tokens, MQTT_BASIC user names and client ids, X.509
//!   certificates, protocol identities and MQTT application user names are unique across
//!   all tenants, so refusing a taken one tells the caller that it exists somewhere. Such
//!   answers are throttled per tenant as failed logins are per user name
//!   (`auth.login_free_attempts` free, then doubling waits up to `auth.login_max_delay`), so
//!   guessing other tenants' credentials this way is slow. It is the login throttle's table
//!   ([`Strikes`]) keyed by tenant (the login throttle itself does not fit: it also counts
//!   per source address, which would hold up every tenant whose administrators share an
//!   address).
//! - [`Guards::provisions`]: devices provisioned per device profile (its provision key and
//!   secret ship in firmware, so anyone may hold them), a bucket of
//!   `limits.max_provisions_per_minute` refilled evenly over the minute.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gridlinks_storage::StoreError;
use gridlinks_types::ProfileId;
use parking_lot::Mutex;

use crate::auth::throttle::Strikes;
use crate::auth::Caller;
use crate::config::Config;

/// Most profiles whose provisioning bucket is remembered; past it, full buckets go.
const MAX_BUCKETS: usize = 16_384;

/// The guards' state, one per server.
pub struct Guards {
    /// Answers that a unique credential is taken, per tenant (`auth.login_free_attempts`
    /// without delay, then doubling waits up to `auth.login_max_delay`).
    conflicts: Strikes<uuid::Uuid>,
    /// Provisioning allowance per device profile.
    provisions: Mutex<HashMap<ProfileId, Bucket>>,
    /// `limits.max_provisions_per_minute` (0: no bound).
    provisions_per_minute: u32,
}

/// A token bucket: `tokens` as of `at`.
#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Guards {
    /// Guards configured by `cfg`.
    pub fn new(cfg: &Config) -> Self {
        Self {
            conflicts: Strikes::new(cfg.auth.login_free_attempts, cfg.auth.login_max_delay.duration()),
            provisions: Mutex::default(),
            provisions_per_minute: cfg.limits.max_provisions_per_minute,
        }
    }

    /// `Err(wait)` while `me`'s tenant must wait after too many "taken" answers before
    /// naming a unique credential again (the REST API answers 429 with `Retry-After`).
    pub fn check_conflicts(&self, me: &Caller) -> Result<(), Duration> {
        let wait = self.conflicts.wait(&me.tenant);
        if wait.is_zero() {
            Ok(())
        } else {
            Err(wait)
        }
    }
    /// Counts a "taken" answer against `me`'s tenant: past the free ones, each doubles the
    /// wait before its next request naming a credential (1 s, 2 s, 4 s … up to the maximum).
    pub fn conflict(&self, me: &Caller) {
        self.conflicts.strike(me.tenant);
    }

    /// Counts `e` when it says a unique credential is taken; returns it unchanged.
    pub fn note(&self, me: &Caller, e: StoreError) -> StoreError {
        if is_conflict(&e) {
            self.conflict(me);
        }
        e
    }

    /// Takes one provisioning from `profile`'s allowance; `Err(wait)` when it is spent.
    pub fn provision(&self, profile: ProfileId) -> Result<(), Duration> {
        let per_minute = self.provisions_per_minute;
        if per_minute == 0 {
            return Ok(());
        }
        let (cap, rate) = (f64::from(per_minute), f64::from(per_minute) / 60.0);
        let now = Instant::now();
        let mut buckets = self.provisions.lock();
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&profile) {
            // Full buckets hold nothing worth keeping: a new one starts full.
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < cap);
            if buckets.len() >= MAX_BUCKETS {
                buckets.clear();
            }
        }
        let b = buckets.entry(profile).or_insert(Bucket { tokens: cap, at: now });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(cap);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / rate))
        }
    }
}

/// Whether `e` says that a credential unique across tenants is taken.
pub fn is_conflict(e: &StoreError) -> bool {
    matches!(e, StoreError::TokenTaken | StoreError::CredentialClash(_) | StoreError::IdentityTaken(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guards(per_minute: u32) -> Guards {
        let mut cfg = Config::default();
        cfg.limits.max_provisions_per_minute = per_minute;
        Guards::new(&cfg)
    }

    #[test]
    fn provisioning_allowance_is_per_profile_and_bounded() {
        let g = guards(3);
        let (a, b) = (ProfileId::for_name("a"), ProfileId::for_name("b"));
        for _ in 0..3 {
            assert!(g.provision(a).is_ok());
        }
        let wait = g.provision(a).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(20), "{wait:?}");
        assert!(g.provision(b).is_ok(), "another profile has its own allowance");
        let unbounded = guards(0);
        for _ in 0..1000 {
            assert!(unbounded.provision(a).is_ok());
        }
    }

    #[test]
    fn conflicts_are_throttled_per_tenant_with_growing_waits() {
        let mut cfg = Config::default();
        cfg.auth.login_free_attempts = 1;
        let g = Guards::new(&cfg);
        let caller = |tenant| Caller {
            user: uuid::Uuid::new_v4(),
            email: String::new(),
            authority: crate::auth::Authority::TenantAdmin,
            tenant,
            customer: None,
        };
        let (a, b) = (caller(uuid::Uuid::new_v4()), caller(uuid::Uuid::new_v4()));
        g.conflict(&a);
        assert!(g.check_conflicts(&a).is_ok(), "the free one");
        // Then 1 s, 2 s, 4 s, 8 s, 16 s (long enough that no pause of the test outlasts it).
        for _ in 0..5 {
            g.conflict(&a);
        }
        let wait = g.check_conflicts(&a).unwrap_err();
        assert!(wait.as_secs_f64() > 8.0 && wait.as_secs_f64() <= 16.0, "{wait:?}");
        assert!(g.check_conflicts(&b).is_ok(), "another tenant is not held up");
    }

    #[test]
    fn only_taken_credentials_are_conflicts() {
        assert!(is_conflict(&StoreError::TokenTaken));
        assert!(is_conflict(&StoreError::CredentialClash("x".into())));
        assert!(!is_conflict(&StoreError::NameTaken("x".into())));
        assert!(!is_conflict(&StoreError::DeviceNotFound));
    }
}
