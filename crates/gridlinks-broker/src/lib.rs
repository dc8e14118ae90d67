//! GridLinks' MQTT broker core. It owns no sockets: the transport (in
//! `gridlinks-server`) feeds it and drains it.
//!
//! * [`acl`] — which topics a pub/sub client may publish to and subscribe with.
//! * [`topic`] — topic-name and topic-filter validation and matching (`+`, `#`, `$`-topics).
//! * [`trie`] — a subscription trie mapping filters to subscribers, the routing table the
//!   general pub/sub of a later issue builds on.
//! * [`router`] — the routing table of general pub/sub (sans-IO): subscriptions with
//!   their options, shared groups taking turns, retained messages; one PUBLISH in, the
//!   deliveries per client out.
//! * [`sessions`] — the live sessions of each device, with their subscriptions and a bounded
//!   outbound queue, so server-originated messages (shared-attribute updates, RPC requests,
//!   attribute responses) reach the connections of one device, and a deleted device's
//!   connections can be closed.

pub mod acl;
pub mod router;
pub mod sessions;
pub mod topic;
pub mod trie;
