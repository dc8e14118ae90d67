//! New device connections per source address: a token bucket per address, one for the
//! whole process (MQTT, MQTT over TLS and every custom TCP listener draw from it), so that
//! one address cannot open connections (and TLS handshakes, and logins) faster than
//! `mqtt.max_connects_per_address`, while an address that connects now and then never
//! notices.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

use parking_lot::Mutex;

/// Addresses tracked at most; past it, addresses whose bucket has refilled are forgotten.
const MAX_ADDRESSES: usize = 65_536;

/// The buckets.
pub struct ConnectRate {
    per_second: f64,
    burst: f64,
    exempt_loopback: bool,
    buckets: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl ConnectRate {
    /// `per_second` connections per address (0: no bound, `None`), up to `burst` at once;
    /// loopback addresses are exempt with `exempt_loopback` (a proxy or a test on the host).
    pub fn new(per_second: u32, burst: u32, exempt_loopback: bool) -> Option<Self> {
        (per_second > 0).then(|| Self {
            per_second: f64::from(per_second),
            burst: f64::from(burst.max(1)),
            exempt_loopback,
            buckets: Mutex::default(),
        })
    }

    /// Whether a new connection from `ip` is within its rate (and takes its token).
    pub fn admit(&self, ip: IpAddr) -> bool {
        self.admit_at(ip, Instant::now())
    }

    fn admit_at(&self, ip: IpAddr, now: Instant) -> bool {
        if self.exempt_loopback && ip.is_loopback() {
            return true;
        }
        let mut buckets = self.buckets.lock();
        if buckets.len() >= MAX_ADDRESSES && !buckets.contains_key(&ip) {
            let (rate, burst) = (self.per_second, self.burst);
            buckets.retain(|_, (tokens, at)| *tokens + now.duration_since(*at).as_secs_f64() * rate < burst);
            if buckets.len() >= MAX_ADDRESSES {
                // Every tracked address is busy: a new one waits for room.
                return false;
            }
        }
        let (tokens, at) = buckets.entry(ip).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.per_second).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate_per_address() {
        let r = ConnectRate::new(10, 3, true).unwrap();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        assert_eq!((0..5).map(|_| r.admit_at(a, t0)).collect::<Vec<_>>(), [true, true, true, false, false]);
        assert!(r.admit_at(b, t0), "another address has its own bucket");
        // 100 ms later one more token (10/s).
        let t1 = t0 + Duration::from_millis(100);
        assert!(r.admit_at(a, t1) && !r.admit_at(a, t1));
        // Loopback is exempt; without the exemption it is counted too.
        let lo: IpAddr = "127.0.0.2".parse().unwrap();
        assert!((0..100).all(|_| r.admit_at(lo, t0)));
        let strict = ConnectRate::new(1, 1, false).unwrap();
        assert!(strict.admit_at(lo, t0) && !strict.admit_at(lo, t0));
        assert!(ConnectRate::new(0, 5, true).is_none());
    }
}
