//! The deduplication store of CoAP exchanges (RFC 7252 §4.5), sans-IO: which requests a
//! client endpoint sent lately, by message id, and the response each got, so that a
//! retransmission is answered again instead of processed twice.
//!
//! Bounded three ways, whatever clients send:
//! - **in time**: an exchange is forgotten `lifetime` after it began ([`Exchanges::expire`],
//!   which the server calls on a timer, not only when requests arrive);
//! - **per endpoint**: at most `per_peer`. A new exchange past it forgets the endpoint's
//!   oldest *answered* one. A client sends a request again only while it waits for its
//!   answer, so an answered exchange with `per_peer` newer ones after it will not come back
//!   (and if it did, it would be processed again: stored twice, never lost). When all of
//!   the endpoint's exchanges are still being processed, the new one is refused
//!   ([`Begin::Busy`]: answer 5.03; nothing was acknowledged, so nothing is lost);
//! - **in total**: at most `total`; past it the oldest exchange of anyone is forgotten.
//!
//! Evictions are counted ([`Exchanges::evicted`]) so that an operator sees when the bounds,
//! rather than the lifetime, decide what is remembered.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The bounds of an [`Exchanges`] store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long an exchange is remembered (RFC 7252's EXCHANGE_LIFETIME is 247 s).
    pub lifetime: Duration,
    /// Most exchanges remembered per client endpoint (at least 1).
    pub per_peer: usize,
    /// Most exchanges remembered in total (at least 1).
    pub total: usize,
}

/// What [`Exchanges::begin`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Begin {
    /// A new exchange: process the request, then [`Exchanges::finish`] it.
    New,
    /// A retransmission: send the stored response again, or nothing (`None`) while the
    /// first copy is still being processed.
    Duplicate(Option<Vec<u8>>),
    /// Every exchange this endpoint may have is still being processed: refuse the request
    /// (5.03) without remembering it.
    Busy,
}

/// One remembered exchange.
struct Exchange {
    /// When it began.
    at: Instant,
    /// The response sent; `None` while the request is being processed.
    response: Option<Vec<u8>>,
}

/// Exchanges by (client endpoint `P`, message id). See the module documentation.
pub struct Exchanges<P> {
    map: HashMap<(P, u16), Exchange>,
    /// Every exchange in the order it began (`seq` grows by one per exchange).
    by_age: BTreeMap<u64, (P, u16)>,
    /// Each endpoint's exchanges (seq, message id), oldest first.
    peers: HashMap<P, VecDeque<(u64, u16)>>,
    next_seq: u64,
    limits: Limits,
    /// Exchanges forgotten before their lifetime because a bound was reached.
    evicted: u64,
}

impl<P: Hash + Eq + Copy> Exchanges<P> {
    /// An empty store with these bounds (a bound of 0 counts as 1).
    pub fn new(limits: Limits) -> Self {
        let limits = Limits { per_peer: limits.per_peer.max(1), total: limits.total.max(1), ..limits };
        Self { map: HashMap::new(), by_age: BTreeMap::new(), peers: HashMap::new(), next_seq: 0, limits, evicted: 0 }
    }

    /// Exchanges remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Exchanges remembered for `peer`.
    pub fn len_of(&self, peer: &P) -> usize {
        self.peers.get(peer).map_or(0, VecDeque::len)
    }

    /// Exchanges forgotten before their lifetime, since the store was made.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Starts the exchange of `peer`'s message `mid` at `now`, unless it is a
    /// retransmission or the endpoint has its share in progress ([`Begin`]).
    pub fn begin(&mut self, peer: P, mid: u16, now: Instant) -> Begin {
        self.expire(now);
        if let Some(e) = self.map.get(&(peer, mid)) {
            return Begin::Duplicate(e.response.clone());
        }
        if self.len_of(&peer) >= self.limits.per_peer && !self.evict_answered_of(peer) {
            return Begin::Busy;
        }
        while self.map.len() >= self.limits.total {
            let Some((_, (p, m))) = self.by_age.pop_first() else { break };
            self.remove_front_of(p, m);
            self.evicted += 1;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.map.insert((peer, mid), Exchange { at: now, response: None });
        self.by_age.insert(seq, (peer, mid));
        self.peers.entry(peer).or_default().push_back((seq, mid));
        Begin::New
    }

    /// Records the response sent for `peer`'s message `mid` (if the exchange is still
    /// remembered).
    pub fn finish(&mut self, peer: P, mid: u16, response: Vec<u8>) {
        if let Some(e) = self.map.get_mut(&(peer, mid)) {
            e.response = Some(response);
        }
    }

    /// Forgets every exchange that began `lifetime` or longer before `now`.
    pub fn expire(&mut self, now: Instant) {
        while let Some((_, &(p, m))) = self.by_age.first_key_value() {
            let old = self.map.get(&(p, m)).is_none_or(|e| now.saturating_duration_since(e.at) >= self.limits.lifetime);
            if !old {
                break;
            }
            self.by_age.pop_first();
            self.remove_front_of(p, m);
        }
    }

    /// Forgets `peer`'s oldest answered exchange; false if all of them are in progress.
    fn evict_answered_of(&mut self, peer: P) -> bool {
        let Some(queue) = self.peers.get_mut(&peer) else { return false };
        let map = &self.map;
        let Some(i) = queue.iter().position(|(_, m)| map.get(&(peer, *m)).is_some_and(|e| e.response.is_some())) else {
            return false;
        };
        let Some((seq, mid)) = queue.remove(i) else { return false };
        if queue.is_empty() {
            self.peers.remove(&peer);
        }
        self.by_age.remove(&seq);
        self.map.remove(&(peer, mid));
        self.evicted += 1;
        true
    }

    /// Removes the exchange (`peer`, `mid`), which is the oldest of `peer`'s (it was the
    /// oldest of all), from the map and from `peer`'s queue (`by_age` is done by the caller).
    fn remove_front_of(&mut self, peer: P, mid: u16) {
        self.map.remove(&(peer, mid));
        if let Some(queue) = self.peers.get_mut(&peer) {
            if queue.front().is_some_and(|(_, m)| *m == mid) {
                queue.pop_front();
            }
            if queue.is_empty() {
                self.peers.remove(&peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { lifetime: Duration::from_secs(10), per_peer: 3, total: 5 };

    #[test]
    fn a_retransmission_gets_the_stored_response() {
        let mut x = Exchanges::new(LIMITS);
        let t = Instant::now();
        assert_eq!(x.begin('a', 1, t), Begin::New);
        assert_eq!(x.begin('a', 1, t), Begin::Duplicate(None), "still in progress");
        x.finish('a', 1, b"ack".to_vec());
        assert_eq!(x.begin('a', 1, t), Begin::Duplicate(Some(b"ack".to_vec())));
        // Another endpoint's same message id is another exchange.
        assert_eq!(x.begin('b', 1, t), Begin::New);
        assert_eq!(x.len(), 2);
    }

    #[test]
    fn exchanges_expire_after_their_lifetime_without_new_requests() {
        let mut x = Exchanges::new(LIMITS);
        let t = Instant::now();
        for m in 0..3 {
            assert_eq!(x.begin('a', m, t + Duration::from_secs(u64::from(m))), Begin::New);
            x.finish('a', m, vec![]);
        }
        x.expire(t + Duration::from_secs(10));
        assert_eq!(x.len(), 2);
        x.expire(t + Duration::from_secs(12));
        assert!(x.is_empty());
        assert_eq!(x.len_of(&'a'), 0);
        assert!(x.peers.is_empty() && x.by_age.is_empty());
        assert_eq!(x.evicted(), 0);
        // Forgotten: the same message id is new again.
        assert_eq!(x.begin('a', 0, t + Duration::from_secs(13)), Begin::New);
    }

    #[test]
    fn one_endpoint_keeps_at_most_its_share_and_in_progress_ones_are_never_forgotten_for_it() {
        let mut x = Exchanges::new(LIMITS);
        let t = Instant::now();
        for m in 0..3 {
            assert_eq!(x.begin('a', m, t), Begin::New);
        }
        // All three in progress: a fourth is refused, not remembered.
        assert_eq!(x.begin('a', 3, t), Begin::Busy);
        assert_eq!(x.len_of(&'a'), 3);
        // Message 1 answered: it is the one forgotten for the next.
        x.finish('a', 1, vec![1]);
        assert_eq!(x.begin('a', 3, t), Begin::New);
        assert_eq!(x.evicted(), 1);
        assert_eq!(x.begin('a', 0, t), Begin::Duplicate(None));
        assert_eq!(x.begin('a', 1, t), Begin::Busy, "1 was forgotten; 0, 2, 3 still in progress");
        for m in [0, 2, 3] {
            x.finish('a', m, vec![]);
        }
        for m in 10..100 {
            assert_eq!(x.begin('a', m, t), Begin::New);
            x.finish('a', m, vec![]);
            assert_eq!(x.len_of(&'a'), 3);
        }
        // The others still have room.
        assert_eq!(x.begin('b', 0, t), Begin::New);
        assert_eq!(x.len(), 4);
    }

    #[test]
    fn the_total_bound_forgets_the_oldest_of_anyone() {
        let mut x = Exchanges::new(LIMITS);
        let t = Instant::now();
        for (i, p) in ['a', 'b', 'c', 'd', 'e', 'f', 'g'].into_iter().enumerate() {
            assert_eq!(x.begin(p, 1, t + Duration::from_millis(i as u64)), Begin::New);
            assert!(x.len() <= 5);
        }
        assert_eq!(x.len(), 5);
        assert_eq!(x.evicted(), 2);
        assert_eq!(x.len_of(&'a'), 0);
        assert_eq!(x.begin('g', 1, t), Begin::Duplicate(None));
        assert_eq!(x.begin('a', 1, t), Begin::New, "forgotten");
        x.expire(t + Duration::from_secs(60));
        assert!(x.is_empty() && x.peers.is_empty() && x.by_age.is_empty());
    }

    #[test]
    fn random_use_keeps_the_indexes_consistent_and_bounded() {
        let mut x = Exchanges::new(Limits { lifetime: Duration::from_millis(500), per_peer: 4, total: 20 });
        let t = Instant::now();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for step in 0..20_000u64 {
            let now = t + Duration::from_millis(step / 4);
            let (peer, mid) = ((next() % 9) as u8, (next() % 16) as u16);
            match next() % 4 {
                0 => x.finish(peer, mid, vec![0]),
                1 => x.expire(now),
                _ => {
                    x.begin(peer, mid, now);
                }
            }
            assert!(x.len() <= 20 && x.by_age.len() == x.len());
            assert_eq!(x.peers.values().map(VecDeque::len).sum::<usize>(), x.len());
            assert!(x.peers.values().all(|q| !q.is_empty() && q.len() <= 4));
        }
    }
}
