//! Block-wise transfer (RFC 7959), sans-IO: the Block1/Block2 option value ([`Block`]),
//! request bodies that arrive in blocks ([`Uploads`], bounded in count, size and age), and
//! the block of a response body a client asks for ([`slice`]).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Largest block size exponent served: 1,024-byte blocks (szx 7 is reserved; RFC 8323
/// gives it to BERT over TCP).
pub const MAX_SZX: u8 = 6;

/// A Block1 or Block2 option value: block number, more-flag, size exponent (size 2^(szx+4)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// The block's number (up to 20 bits).
    pub num: u32,
    /// More blocks follow.
    pub more: bool,
    /// Size exponent, 0..=6.
    pub szx: u8,
}

/// Largest block number an option can carry (20 bits).
const MAX_NUM: u32 = (1 << 20) - 1;

impl Block {
    /// The block size in bytes.
    pub fn size(self) -> usize {
        16 << self.szx
    }

    /// The byte offset the block starts at.
    pub fn offset(self) -> usize {
        self.num as usize * self.size()
    }

    /// Decodes an option value (0–3 bytes, big-endian); `None` for a longer value or the
    /// reserved size exponent 7.
    pub fn decode(bytes: &[u8]) -> Option<Block> {
        if bytes.len() > 3 {
            return None;
        }
        let v = bytes.iter().fold(0u32, |v, b| v << 8 | u32::from(*b));
        let szx = (v & 7) as u8;
        (szx <= MAX_SZX).then_some(Block { num: v >> 4, more: v & 8 != 0, szx })
    }

    /// The option value, in as few bytes as it needs (none for block 0 of 16 bytes, last).
    pub fn encode(self) -> Vec<u8> {
        let v = (self.num.min(MAX_NUM) << 4) | (u32::from(self.more) << 3) | u32::from(self.szx & 7);
        let bytes = v.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        bytes[skip..].to_vec()
    }
}

/// What a request block leads to.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// Stored; more blocks are expected: answer 2.31 Continue with this Block1 value.
    Continue(Block),
    /// The last block: the whole body, and the Block1 value the final response carries.
    Complete(Vec<u8>, Block),
    /// Not the block expected next (or the transfer was forgotten): 4.08.
    Incomplete,
    /// The body would exceed the limit: 4.13 (the transfer is dropped).
    TooLarge,
    /// A block whose size does not match its option: 4.00.
    Malformed(&'static str),
}

struct Upload {
    body: Vec<u8>,
    started: Instant,
}

/// Request bodies being received in blocks, keyed by what identifies the request (peer
/// and resource). At most `max_uploads` at once (the oldest is dropped first), each at
/// most `max_body` bytes and forgotten `lifetime` after its first block: memory is bounded
/// by `max_uploads × max_body` whatever clients send.
pub struct Uploads<K> {
    map: HashMap<K, Upload>,
    order: VecDeque<(Instant, K)>,
    max_uploads: usize,
    max_body: usize,
    lifetime: Duration,
}

impl<K: Hash + Eq + Clone> Uploads<K> {
    /// No uploads yet; bounds as described on the type.
    pub fn new(max_uploads: usize, max_body: usize, lifetime: Duration) -> Self {
        Self { map: HashMap::new(), order: VecDeque::new(), max_uploads, max_body, lifetime }
    }

    /// Uploads in progress.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no upload is in progress.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Takes block `block` of the request `key`, carrying `payload`, at `now`.
    pub fn offer(&mut self, key: K, block: Block, payload: &[u8], now: Instant) -> Offer {
        self.expire(now);
        if block.more && payload.len() != block.size() {
            return Offer::Malformed("a block followed by more must be exactly the block size");
        }
        if payload.len() > block.size() {
            return Offer::Malformed("a block is larger than its block size");
        }
        if block.offset() + payload.len() > self.max_body {
            self.map.remove(&key);
            return Offer::TooLarge;
        }
        if block.num == 0 && !block.more {
            self.map.remove(&key);
            return Offer::Complete(payload.to_vec(), block);
        }
        if block.num == 0 {
            match self.map.get_mut(&key) {
                // Started again: the same entry, still aged from the first attempt.
                Some(u) => u.body.clear(),
                None => {
                    while self.map.len() >= self.max_uploads.max(1) && self.evict_oldest() {}
                    self.map.insert(key.clone(), Upload { body: Vec::new(), started: now });
                    self.order.push_back((now, key.clone()));
                    if self.order.len() > 2 * self.max_uploads + 16 {
                        let map = &self.map;
                        self.order.retain(|(at, k)| map.get(k).is_some_and(|u| u.started == *at));
                    }
                }
            }
        }
        let Some(upload) = self.map.get_mut(&key) else { return Offer::Incomplete };
        if block.offset() != upload.body.len() {
            return Offer::Incomplete;
        }
        upload.body.extend_from_slice(payload);
        if block.more {
            return Offer::Continue(block);
        }
        match self.map.remove(&key) {
            Some(u) => Offer::Complete(u.body, block),
            None => Offer::Incomplete,
        }
    }

    /// Forgets uploads older than the lifetime (also done by every [`Uploads::offer`]).
    pub fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.duration_since(*at) < self.lifetime || !self.evict_oldest() {
                break;
            }
        }
    }

    /// Drops the oldest entry of the age queue, and its upload if the entry is the
    /// upload's (finished uploads leave stale entries); false when the queue is empty.
    fn evict_oldest(&mut self) -> bool {
        let Some((at, key)) = self.order.pop_front() else { return false };
        if self.map.get(&key).is_some_and(|u| u.started == at) {
            self.map.remove(&key);
        }
        true
    }
}

/// Why a requested block cannot be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("block {num} of {size} bytes starts past the end of the {len}-byte representation")]
pub struct PastTheEnd {
    /// The block number asked for.
    pub num: u32,
    /// Its size.
    pub size: usize,
    /// The representation's length.
    pub len: usize,
}

/// The part of a response body of `len` bytes to send, and the Block2 value that goes with
/// it: the block `asked` names (its size capped at [`MAX_SZX`]), or, when the client asked
/// for none, the first block if the body is larger than one block of the largest size.
/// `Ok(None)`: send the body whole.
pub fn slice(len: usize, asked: Option<Block>) -> Result<Option<(Block, Range<usize>)>, PastTheEnd> {
    let max = Block { num: 0, more: false, szx: MAX_SZX };
    let (offset, szx) = match asked {
        None if len <= max.size() => return Ok(None),
        None => (0, MAX_SZX),
        Some(b) => (b.offset(), b.szx.min(MAX_SZX)),
    };
    let size = 16usize << szx;
    if offset >= len && offset > 0 {
        return Err(PastTheEnd { num: asked.map_or(0, |b| b.num), size, len });
    }
    let end = (offset + size).min(len);
    let num = u32::try_from(offset / size).unwrap_or(MAX_NUM);
    Ok(Some((Block { num, more: end < len, szx }, offset..end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(num: u32, more: bool, szx: u8) -> Block {
        Block { num, more, szx }
    }

    #[test]
    fn option_values_round_trip_in_the_fewest_bytes() {
        assert_eq!(b(0, false, 0).encode(), Vec::<u8>::new());
        assert_eq!(b(0, true, 6).encode(), vec![0x0e]);
        assert_eq!(b(1, false, 6).encode(), vec![0x16]);
        assert_eq!(b(300, true, 2).encode(), vec![0x12, 0xca]);
        assert_eq!(b(MAX_NUM, true, 6).encode(), vec![0xff, 0xff, 0xfe]);
        for blk in [b(0, false, 0), b(0, true, 6), b(17, false, 4), b(MAX_NUM, true, 6), b(4096, false, 1)] {
            assert_eq!(Block::decode(&blk.encode()), Some(blk));
        }
        assert_eq!(Block::decode(&[0x07]), None, "szx 7 is reserved");
        assert_eq!(Block::decode(&[1, 2, 3, 4]), None, "at most 3 bytes");
        assert_eq!(b(2, false, 6).size(), 1024);
        assert_eq!(b(2, false, 6).offset(), 2048);
    }

    #[test]
    fn a_body_in_blocks_is_put_together() {
        let t = Instant::now();
        let mut up = Uploads::new(4, 4096, Duration::from_secs(60));
        assert_eq!(up.offer("a", b(0, true, 0), &[1; 16], t), Offer::Continue(b(0, true, 0)));
        assert_eq!(up.offer("a", b(1, true, 0), &[2; 16], t), Offer::Continue(b(1, true, 0)));
        assert_eq!(up.len(), 1);
        let Offer::Complete(body, last) = up.offer("a", b(2, false, 0), &[3; 5], t) else { panic!() };
        assert_eq!(body.len(), 37);
        assert_eq!(&body[30..], &[2, 2, 3, 3, 3, 3, 3]);
        assert_eq!(last, b(2, false, 0));
        assert!(up.is_empty(), "a finished upload is forgotten");
        // A single block that is also the last.
        assert_eq!(up.offer("b", b(0, false, 6), b"{}", t), Offer::Complete(b"{}".to_vec(), b(0, false, 6)));
    }

    #[test]
    fn blocks_out_of_order_or_of_the_wrong_size_are_refused() {
        let t = Instant::now();
        let mut up = Uploads::new(4, 4096, Duration::from_secs(60));
        assert_eq!(up.offer("a", b(1, true, 0), &[0; 16], t), Offer::Incomplete, "no block 0 first");
        up.offer("a", b(0, true, 0), &[0; 16], t);
        assert_eq!(up.offer("a", b(2, true, 0), &[0; 16], t), Offer::Incomplete, "block 1 skipped");
        assert_eq!(
            up.offer("a", b(0, true, 6), &[0; 16], t),
            Offer::Malformed("a block followed by more must be exactly the block size")
        );
        assert_eq!(
            up.offer("a", b(0, false, 0), &[0; 17], t),
            Offer::Malformed("a block is larger than its block size")
        );
        assert_eq!(
            up.offer("a", b(1, false, 0), &[9], t),
            Offer::Complete([vec![0; 16], vec![9]].concat(), b(1, false, 0))
        );
        // A client may go on in smaller blocks (after the server asked for them): what
        // counts is the offset.
        up.offer("s", b(0, true, 1), &[1; 32], t);
        assert_eq!(up.offer("s", b(2, true, 0), &[2; 16], t), Offer::Continue(b(2, true, 0)));
        assert_eq!(
            up.offer("s", b(3, false, 0), &[3], t),
            Offer::Complete([vec![1; 32], vec![2; 16], vec![3]].concat(), b(3, false, 0))
        );
    }

    #[test]
    fn bodies_count_and_age_are_bounded() {
        let t = Instant::now();
        let mut up = Uploads::new(2, 64, Duration::from_secs(60));
        assert_eq!(up.offer("a", b(0, true, 1), &[0; 32], t), Offer::Continue(b(0, true, 1)));
        assert_eq!(up.offer("a", b(1, true, 1), &[0; 32], t), Offer::Continue(b(1, true, 1)));
        assert_eq!(up.offer("a", b(2, false, 1), &[0; 1], t), Offer::TooLarge, "past max_body");
        assert!(up.is_empty(), "a refused upload is dropped");
        assert_eq!(
            up.offer("big", b(5000, false, 6), &[0; 1], t),
            Offer::TooLarge,
            "an absurd offset reserves nothing"
        );
        // The oldest upload makes room for a new one.
        for k in ["x", "y", "z"] {
            up.offer(k, b(0, true, 0), &[0; 16], t);
        }
        assert_eq!(up.len(), 2);
        assert_eq!(up.offer("x", b(1, false, 0), &[0], t), Offer::Incomplete, "x was dropped for z");
        // Past the lifetime an upload is forgotten.
        let later = t + Duration::from_secs(61);
        assert_eq!(up.offer("y", b(1, false, 0), &[0], later), Offer::Incomplete);
        assert!(up.is_empty());
        // Restarting a transfer under the same key keeps one entry, which still expires.
        up.offer("r", b(0, true, 0), &[0; 16], later);
        up.offer("r", b(0, true, 0), &[0; 16], later + Duration::from_secs(30));
        assert_eq!(up.len(), 1);
        up.offer("q", b(0, true, 0), &[0; 16], later + Duration::from_secs(95));
        assert_eq!(up.offer("r", b(1, false, 0), &[0], later + Duration::from_secs(95)), Offer::Incomplete);
    }

    #[test]
    fn responses_are_cut_into_the_blocks_asked_for() {
        assert_eq!(slice(1024, None), Ok(None), "one block's worth goes whole");
        assert_eq!(slice(1025, None), Ok(Some((b(0, true, 6), 0..1024))));
        assert_eq!(slice(1025, Some(b(1, false, 6))), Ok(Some((b(1, false, 6), 1024..1025))));
        assert_eq!(slice(100, Some(b(0, false, 2))), Ok(Some((b(0, true, 2), 0..64))));
        assert_eq!(slice(100, Some(b(1, false, 2))), Ok(Some((b(1, false, 2), 64..100))));
        assert_eq!(slice(0, Some(b(0, false, 2))), Ok(Some((b(0, false, 2), 0..0))));
        assert_eq!(slice(100, Some(b(2, false, 2))), Err(PastTheEnd { num: 2, size: 64, len: 100 }));
    }
}
