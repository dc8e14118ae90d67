//! Address verification against amplification (RFC 7252 §11.3, RFC 9175 §2.4), sans-IO.
//!
//! A UDP request's source address can be forged, so a server that answers a small request
//! with a large response to an address it has never heard back from can be made to flood a
//! victim. The server therefore keeps an answer to an endpoint it has not verified within a
//! factor of the request's size; a larger answer is replaced by 4.01 Unauthorized with an
//! Echo option. A client that receives at that address repeats its request with the Echo
//! value, which proves it, and the endpoint is remembered as verified for a while
//! ([`Verified`], bounded in count and time).
//!
//! Echo values are stateless ([`Echo`]): 4 bytes of issue time (seconds since the [`Echo`]
//! was made) and 8 bytes of a keyed hash (SipHash with random keys, made once per process)
//! over the endpoint and that time. So challenges cost no memory, a value is good only for
//! the endpoint it was sent to, and only for [`Echo::fresh`].

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::time::{Duration, Instant};

/// Length of an Echo value this server issues.
pub const ECHO_LEN: usize = 12;

/// Issues and checks Echo values.
pub struct Echo {
    /// The hash keys (random per process).
    keys: RandomState,
    /// Time zero of the values' clock.
    epoch: Instant,
    /// How long after its issue a value is taken.
    fresh: Duration,
}

impl Echo {
    /// Values taken for `fresh` after their issue; the clock starts at `now`.
    pub fn new(fresh: Duration, now: Instant) -> Self {
        Self { keys: RandomState::new(), epoch: now, fresh }
    }

    /// How long a value is taken.
    pub fn fresh(&self) -> Duration {
        self.fresh
    }

    fn mac(&self, peer: &impl Hash, secs: u32) -> u64 {
        let mut h = self.keys.build_hasher();
        peer.hash(&mut h);
        h.write_u32(secs);
        h.finish()
    }

    /// An Echo value for `peer`, issued at `now`.
    pub fn challenge(&self, peer: &impl Hash, now: Instant) -> [u8; ECHO_LEN] {
        let secs = u32::try_from(now.saturating_duration_since(self.epoch).as_secs()).unwrap_or(u32::MAX);
        let mut v = [0u8; ECHO_LEN];
        v[..4].copy_from_slice(&secs.to_be_bytes());
        v[4..].copy_from_slice(&self.mac(peer, secs).to_be_bytes());
        v
    }

    /// True if `value` is a value this server issued to `peer`, at most [`Echo::fresh`]
    /// before `now`.
    pub fn verify(&self, peer: &impl Hash, value: &[u8], now: Instant) -> bool {
        let Ok(v) = <[u8; ECHO_LEN]>::try_from(value) else { return false };
        let secs = u32::from_be_bytes([v[0], v[1], v[2], v[3]]);
        let issued = self.epoch + Duration::from_secs(u64::from(secs));
        let age = now.checked_duration_since(issued);
        // One second of slack: the clock is counted in whole seconds.
        let fresh = age.is_some_and(|a| a <= self.fresh + Duration::from_secs(1));
        fresh && v[4..] == self.mac(peer, secs).to_be_bytes()
    }
}

/// Endpoints verified lately: at most `max`, each for `lifetime` after its verification
/// (the oldest is forgotten first when full; a forgotten endpoint is asked again).
pub struct Verified<K> {
    map: HashMap<K, Instant>,
    order: VecDeque<(Instant, K)>,
    max: usize,
    lifetime: Duration,
}

impl<K: Hash + Eq + Copy> Verified<K> {
    /// None verified yet.
    pub fn new(max: usize, lifetime: Duration) -> Self {
        Self { map: HashMap::new(), order: VecDeque::new(), max: max.max(1), lifetime }
    }

    /// Endpoints remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when none is remembered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `peer` is verified at `now`.
    pub fn contains(&self, peer: &K, now: Instant) -> bool {
        self.map.get(peer).is_some_and(|at| now.saturating_duration_since(*at) < self.lifetime)
    }

    /// Remembers `peer` as verified at `now` (an endpoint already remembered keeps its
    /// first time: it is asked again when that expires).
    pub fn insert(&mut self, peer: K, now: Instant) {
        self.expire(now);
        if self.map.contains_key(&peer) {
            return;
        }
        while self.map.len() >= self.max {
            let Some((_, k)) = self.order.pop_front() else { break };
            self.map.remove(&k);
        }
        self.map.insert(peer, now);
        self.order.push_back((now, peer));
    }

    /// Forgets endpoints verified `lifetime` or longer before `now`.
    pub fn expire(&mut self, now: Instant) {
        while let Some((at, k)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.lifetime {
                break;
            }
            self.map.remove(k);
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_verifies_its_own_endpoint_while_fresh() {
        let t = Instant::now();
        let echo = Echo::new(Duration::from_secs(60), t);
        let v = echo.challenge(&"10.0.0.1:5683", t + Duration::from_secs(5));
        assert!(echo.verify(&"10.0.0.1:5683", &v, t + Duration::from_secs(5)));
        assert!(echo.verify(&"10.0.0.1:5683", &v, t + Duration::from_secs(65)));
        assert!(!echo.verify(&"10.0.0.1:5683", &v, t + Duration::from_secs(70)), "stale");
        assert!(!echo.verify(&"10.0.0.2:5683", &v, t + Duration::from_secs(5)), "another endpoint");
        assert!(!echo.verify(&"10.0.0.1:5683", &v[..11], t + Duration::from_secs(5)));
        let mut forged = v;
        forged[11] ^= 1;
        assert!(!echo.verify(&"10.0.0.1:5683", &forged, t + Duration::from_secs(5)));
        // A later issue time in the value does not make it fresh.
        let mut future = v;
        future[3] = 200;
        assert!(!echo.verify(&"10.0.0.1:5683", &future, t + Duration::from_secs(5)));
        // Another process (other keys) does not take it.
        assert!(!Echo::new(Duration::from_secs(60), t).verify(&"10.0.0.1:5683", &v, t));
    }

    #[test]
    fn verified_endpoints_are_bounded_and_expire() {
        let t = Instant::now();
        let mut v = Verified::new(2, Duration::from_secs(10));
        v.insert(1, t);
        v.insert(2, t + Duration::from_secs(1));
        v.insert(1, t + Duration::from_secs(2));
        assert!(v.contains(&1, t) && v.contains(&2, t));
        v.insert(3, t + Duration::from_secs(3));
        assert_eq!(v.len(), 2);
        assert!(!v.contains(&1, t + Duration::from_secs(3)), "the oldest went first");
        assert!(!v.contains(&2, t + Duration::from_secs(11)), "past its lifetime");
        v.expire(t + Duration::from_secs(11));
        assert_eq!(v.len(), 1);
        v.expire(t + Duration::from_secs(13));
        assert!(v.is_empty());
    }
}
