//! Throttling of password guesses, per source address and per user name.
//!
//! The first `free` failures cost nothing; each one after that doubles the wait before the
//! next attempt is even checked (1 s, 2 s, 4 s … up to `max_delay`). An attempt inside the
//! wait is refused at once, without a password check, and the caller learns how long to
//! wait. A success clears the address's and the name's record. IPv6 addresses count per
//! /64, since one host owns a whole /64. Both tables are bounded; records of quiet
//! addresses and names are forgotten.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Most records per table; past it, quiet records go (and if none is quiet, all).
const MAX_RECORDS: usize = 16_384;

#[derive(Clone, Copy)]
struct Record {
    failures: u32,
    /// No attempt is checked before this.
    blocked_until: Instant,
    last: Instant,
}

/// Failures per key, with growing waits: the first `free` cost nothing, each one after
/// doubles the wait (1 s, 2 s, 4 s … up to `max_delay`). Bounded: records of quiet keys are
/// forgotten.
pub struct Strikes<K> {
    free: u32,
    max_delay: Duration,
    table: Mutex<HashMap<K, Record>>,
}

impl<K: Eq + Hash> Strikes<K> {
    /// `free` failures without delay, then doubling waits up to `max_delay`.
    pub fn new(free: u32, max_delay: Duration) -> Self {
        Self { free, max_delay, table: Mutex::default() }
    }

    /// How long `key` must wait now (zero: not at all).
    pub fn wait<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Duration
    where
        K: std::borrow::Borrow<Q>,
    {
        let now = Instant::now();
        self.table.lock().get(key).map_or(Duration::ZERO, |r| r.blocked_until.saturating_duration_since(now))
    }

    /// Records a failure of `key`.
    pub fn strike(&self, key: K) {
        let now = Instant::now();
        let mut table = self.table.lock();
        if table.len() >= MAX_RECORDS {
            let forget = self.max_delay * 2;
            table.retain(|_, r| now.duration_since(r.last) < forget || r.blocked_until > now);
            if table.len() >= MAX_RECORDS {
                table.clear();
            }
        }
        let r = table.entry(key).or_insert(Record { failures: 0, blocked_until: now, last: now });
        // A record quiet for longer than the longest delay starts afresh.
        if now.duration_since(r.last) > self.max_delay * 2 {
            r.failures = 0;
        }
        r.failures = r.failures.saturating_add(1);
        r.last = now;
        if r.failures > self.free {
            let exp = (r.failures - self.free - 1).min(30);
            r.blocked_until = now + Duration::from_secs(1u64 << exp).min(self.max_delay);
        }
    }

    /// `key` starts afresh.
    pub fn clear<Q: Eq + Hash + ?Sized>(&self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
    {
        self.table.lock().remove(key);
    }
}

/// The throttle's tables.
pub struct Throttle {
    by_addr: Strikes<IpAddr>,
    by_user: Strikes<String>,
}

/// The key of an address: itself (IPv4), or its /64 (IPv6).
fn addr_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

impl Throttle {
    /// `free` failures without delay, then doubling delays up to `max_delay`.
    pub fn new(free: u32, max_delay: Duration) -> Self {
        Self { by_addr: Strikes::new(free, max_delay), by_user: Strikes::new(free, max_delay) }
    }

    /// `Err(wait)` when an attempt from `addr` for `user` must not be checked now.
    pub fn check(&self, addr: IpAddr, user: &str) -> Result<(), Duration> {
        let w = self.by_addr.wait(&addr_key(addr)).max(self.by_user.wait(user));
        if w.is_zero() {
            Ok(())
        } else {
            Err(w)
        }
    }

    /// Records a failed attempt.
    pub fn failed(&self, addr: IpAddr, user: &str) {
        self.by_addr.strike(addr_key(addr));
        self.by_user.strike(user.to_owned());
    }

    /// Records a successful attempt: the address and the name start afresh.
    pub fn succeeded(&self, addr: IpAddr, user: &str) {
        self.by_addr.clear(&addr_key(addr));
        self.by_user.clear(user);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_per_address_and_per_name_and_success_clears_them() {
        let t = Throttle::new(2, Duration::from_secs(8));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        t.failed(a, "admin");
        t.failed(a, "admin");
        assert_eq!(t.check(a, "admin"), Ok(()), "the free attempts");
        t.failed(a, "admin");
        let w = t.check(a, "admin").unwrap_err();
        assert!(w > Duration::from_millis(900) && w <= Duration::from_secs(1), "{w:?}");
        // The name is throttled from another address too, and the address for another name.
        assert!(t.check(b, "admin").is_err());
        assert!(t.check(a, "other").is_err());
        t.failed(a, "admin");
        assert!(t.check(a, "admin").unwrap_err() > Duration::from_millis(1900));
        for _ in 0..10 {
            t.failed(a, "admin");
        }
        assert!(t.check(a, "admin").unwrap_err() <= Duration::from_secs(8), "capped at max_delay");
        t.succeeded(a, "admin");
        assert_eq!(t.check(a, "admin"), Ok(()));
        assert_eq!(t.check(b, "admin"), Ok(()));
    }

    #[test]
    fn ipv6_hosts_count_per_64() {
        let t = Throttle::new(0, Duration::from_secs(8));
        t.failed("2001:db8::1".parse().unwrap(), "u");
        assert!(t.check("2001:db8::ffff:1".parse().unwrap(), "v").is_err());
        assert!(t.check("2001:db8:0:1::1".parse().unwrap(), "v").is_ok());
    }
}
