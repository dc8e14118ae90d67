//! GridLinks' MQTT broker core. It owns no sockets: the transports (`gridlinks-mqtt`, and
//! CoAP and custom TCP for their device sessions, through `gridlinks-platform`'s
//! device-session registry) feed it and drain it.
//!
//! * [`acl`] — which topics a pub/sub client may publish to and subscribe with.
//! * [`topic`] — topic-name and topic-filter validation and matching (`+`, `#`, `$`-topics).
//! * [`trie`] — the subscription trie: filters to subscribers, walking only the branches
//!   a topic can reach.
//! * [`router`] — the routing table of pub/sub (sans-IO): subscriptions with their
//!   options, shared groups taking turns, retained messages; one PUBLISH in, one delivery
//!   per receiving client out.
//! * [`sessions`] — live sessions: per device (server-originated messages: attribute
//!   updates, RPC) and per pub/sub client (clean or persistent, with takeover, expiry, the
//!   client's unreleased QoS 2 ids), each with a bounded outbound queue whose overflow
//!   policy is backpressure for QoS 1/2 (publishers wait, released in order as the client
//!   reads), drops for QoS 0, and a hard limit.
//! * [`persist`] — the broker's stored rows (durable queues, unreleased QoS 2 ids,
//!   persistent sessions): keys and values encoded and decoded in one place, versioned.

pub mod acl;
pub mod persist;
pub mod router;
pub mod sessions;
pub mod topic;
pub mod trie;

/// A deterministic pseudo-random `n -> 0..n` (xorshift) for the randomized tests.
#[cfg(test)]
fn test_rng(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    }
}
