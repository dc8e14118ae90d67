//! The routing table of general pub/sub (sans-IO): who is subscribed to what, with which
//! options, and the retained messages. [`Router::publish`] turns one PUBLISH into the
//! list of deliveries the transport then queues per client; [`Router::subscribe`]
//! returns the retained messages a new subscription receives.
//!
//! Rules (MQTT 3.1.1 and 5.0, §4.7–4.8 and §3.3):
//! * a client with several matching subscriptions gets **one** copy, at the highest
//!   granted QoS of those subscriptions, carrying all their subscription identifiers;
//! * delivered QoS is the lower of the publish QoS and the subscription QoS;
//! * no-local: a client's own publishes are not sent back to that subscription;
//! * retain-as-published keeps the RETAIN flag on forwarded messages, otherwise it is
//!   cleared (retained messages sent on subscribe always carry it);
//! * retain handling: 0 send retained messages on subscribe, 1 only for a new
//!   subscription, 2 never; shared subscriptions never receive retained messages;
//! * `$share/{group}/{filter}`: each message goes to one member of the group, in turn;
//! * wildcards at the first level never match `$` topics (e.g. `$SYS/...`);
//! * a retained PUBLISH with an empty payload clears the topic's retained message;
//! * an expired message (MQTT 5 Message Expiry Interval) is not sent to new subscribers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use gridlinks_codec::mqtt::{PublishProperties, QoS};
use rustc_hash::FxHashMap as HashMap;

use crate::topic::{filters_overlap, matches, validate_filter, FilterError};
use crate::trie::SubscriptionTrie;

/// The options of one subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubOptions {
    /// Granted maximum QoS.
    pub qos: QoS,
    /// MQTT 5 No Local.
    pub no_local: bool,
    /// MQTT 5 Retain As Published.
    pub retain_as_published: bool,
    /// MQTT 5 Retain Handling (0..=2).
    pub retain_handling: u8,
    /// MQTT 5 Subscription Identifier.
    pub subscription_id: Option<u32>,
}

/// Why a subscription was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubscribeError {
    /// The filter is not a valid topic filter.
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// `$share/` without a valid group name and filter.
    #[error("shared subscription must be $share/{{group}}/{{filter}} with a group free of '+', '#' and '/'")]
    Share,
    /// The client has as many subscriptions as it may.
    #[error("too many subscriptions: at most {0} per client")]
    TooMany(usize),
}

/// A message as published: what every copy (and a retained copy) shares. Cloning it
/// allocates nothing (a fan-out to thousands of clients clones it thousands of times).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Topic it was published to.
    pub topic: Arc<str>,
    /// Payload (for a retained message never empty: an empty one clears).
    pub payload: Bytes,
    /// QoS it was published with.
    pub qos: QoS,
    /// MQTT 5 properties passed on to subscribers (payload format, content type, response
    /// topic, correlation data, user properties; never a topic alias or subscription
    /// identifiers); `None` when there are none.
    pub props: Option<Arc<PublishProperties>>,
    /// When it expires (MQTT 5 Message Expiry Interval); `None` never.
    pub expires: Option<Instant>,
}

impl Message {
    /// A message without properties or expiry.
    pub fn new(topic: &str, qos: QoS, payload: Bytes) -> Self {
        Self { topic: topic.into(), payload, qos, props: None, expires: None }
    }

    /// Whether it has expired by `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|e| e <= now)
    }
}

/// One copy of a message for one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Receiving client.
    pub client: Arc<str>,
    /// QoS of this copy.
    pub qos: QoS,
    /// RETAIN flag of this copy.
    pub retain: bool,
    /// Identifiers of the subscriptions that matched (MQTT 5).
    pub subscription_ids: Vec<u32>,
}

/// What a subscribe did.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscribed {
    /// The client already had this subscription (its options were replaced).
    pub existed: bool,
    /// Retained messages to send now, each with the QoS to send it at.
    pub retained: Vec<(Message, QoS)>,
}

/// A subscriber in the trie: the client, for a shared subscription its group, and the
/// subscription's options (so a publish needs no second lookup; equality ignores them).
/// Cloning it allocates nothing: every subscription of a client holds the same `Arc` (the
/// key of [`Router::subs`]), so members are grouped by pointer.
#[derive(Debug, Clone)]
struct Member {
    client: Arc<str>,
    group: Option<Arc<str>>,
    opts: SubOptions,
}

impl PartialEq for Member {
    fn eq(&self, other: &Self) -> bool {
        self.client == other.client && self.group == other.group
    }
}

/// Which shared subscriptions a publish reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Groups<'a> {
    /// Every matching group, one member each: one node holds every member.
    All,
    /// None: with several nodes, a group's messages reach it through its own Kafka
    /// consumer group, one node per message.
    None,
    /// Only group `$share/{group}/{filter}` (one member), and no plain subscriber; the
    /// retained store is left as it is.
    Only(&'a str),
}

/// The routing table.
#[derive(Debug, Default)]
pub struct Router {
    trie: SubscriptionTrie<Member>,
    /// Per client: full filter as subscribed (with any `$share/g/`) -> options.
    subs: HashMap<Arc<str>, HashMap<String, SubOptions>>,
    /// Next member of each shared group, by (group, filter).
    turn: HashMap<(String, String), usize>,
    retained: BTreeMap<String, Message>,
    /// A filter some publisher wants to know it has subscribers for, and how many
    /// subscriptions overlap it (see [`Router::with_interest`]).
    interest: Option<(String, usize)>,
    /// The root of namespaces (`{root}{name}/{filter}`) whose subscriptions count for the
    /// interest as their `{filter}` would.
    namespaces: Option<String>,
}

/// Splits `$share/{group}/{filter}`; `None` for a plain filter.
fn split_share(full: &str) -> Result<Option<(&str, &str)>, SubscribeError> {
    let Some(rest) = full.strip_prefix("$share/") else {
        return Ok(None);
    };
    let (group, filter) = rest.split_once('/').ok_or(SubscribeError::Share)?;
    if group.is_empty() || group.contains(['+', '#']) || filter.is_empty() {
        return Err(SubscribeError::Share);
    }
    Ok(Some((group, filter)))
}

impl Router {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table that counts the subscriptions overlapping `filter`, so a publisher
    /// can skip building messages nobody would receive ([`Router::interested`]). A
    /// subscription `{namespaces}{name}/{f}` counts as `{f}` would: the publisher publishes
    /// in namespaces too.
    pub fn with_interest(filter: &str, namespaces: Option<&str>) -> Self {
        Self { interest: Some((filter.to_owned(), 0)), namespaces: namespaces.map(str::to_owned), ..Self::default() }
    }

    /// Subscriptions overlapping the filter given to [`Router::with_interest`].
    pub fn interested(&self) -> usize {
        self.interest.as_ref().map_or(0, |(_, n)| *n)
    }

    fn count_interest(&mut self, filter: &str, delta: isize) {
        let in_namespace = self.namespaces.as_deref().and_then(|root| filter.strip_prefix(root));
        let filter = in_namespace.and_then(|r| r.split_once('/')).map_or(filter, |(_, f)| f);
        if let Some((f, n)) = &mut self.interest {
            if filters_overlap(f, filter) {
                *n = n.saturating_add_signed(delta);
            }
        }
    }

    /// Subscribes `client` to `full` (a filter or `$share/{group}/{filter}`).
    pub fn subscribe(&mut self, client: &str, full: &str, opts: SubOptions) -> Result<Subscribed, SubscribeError> {
        self.subscribe_at_most(client, full, opts, usize::MAX)
    }

    /// [`Router::subscribe`], refusing a new filter when the client has `max` already.
    pub fn subscribe_at_most(
        &mut self,
        client: &str,
        full: &str,
        opts: SubOptions,
        max: usize,
    ) -> Result<Subscribed, SubscribeError> {
        let share = split_share(full)?;
        let filter = share.map_or(full, |(_, f)| f);
        validate_filter(filter)?;
        if self.subs.get(client).is_some_and(|s| s.len() >= max && !s.contains_key(full)) {
            return Err(SubscribeError::TooMany(max));
        }
        // One `Arc` per client, shared by all its subscriptions.
        let client: Arc<str> = match self.subs.get_key_value(client) {
            Some((k, _)) => k.clone(),
            None => client.into(),
        };
        let member = Member { client: client.clone(), group: share.map(|(g, _)| g.into()), opts };
        let existed = self.subs.entry(client).or_default().insert(full.to_owned(), opts).is_some();
        self.trie.insert(filter, member);
        if !existed {
            self.count_interest(filter, 1);
        }
        let send_retained = share.is_none()
            && match opts.retain_handling {
                0 => true,
                1 => !existed,
                _ => false,
            };
        let retained = if send_retained {
            let now = Instant::now();
            self.retained
                .values()
                .filter(|r| matches(filter, &r.topic) && !r.expired(now))
                .map(|r| (r.clone(), r.qos.min(opts.qos)))
                .collect()
        } else {
            Vec::new()
        };
        Ok(Subscribed { existed, retained })
    }

    /// Removes `client`'s subscription `full`; whether it existed.
    pub fn unsubscribe(&mut self, client: &str, full: &str) -> bool {
        let Some(subs) = self.subs.get_mut(client) else {
            return false;
        };
        if subs.remove(full).is_none() {
            return false;
        }
        if subs.is_empty() {
            self.subs.remove(client);
            crate::trie::shrink(&mut self.subs);
        } else {
            crate::trie::shrink(subs);
        }
        let (group, filter) = match split_share(full) {
            Ok(Some((g, f))) => (Some(g), f),
            _ => (None, full),
        };
        let last_of_group = group.is_some() && !self.subs.values().any(|s| s.contains_key(full));
        if last_of_group {
            if let Some(g) = group {
                self.turn.remove(&(g.to_owned(), filter.to_owned()));
            }
        }
        self.count_interest(filter, -1);
        self.trie.remove(
            filter,
            &Member { client: client.into(), group: group.map(Arc::from), opts: SubOptions::default() },
        );
        true
    }

    /// Removes every subscription of `client` (its session ended).
    pub fn remove_client(&mut self, client: &str) {
        let filters: Vec<String> = self.subs.get(client).map(|s| s.keys().cloned().collect()).unwrap_or_default();
        for full in filters {
            self.unsubscribe(client, &full);
        }
    }

    /// `client`'s subscriptions, for persisting a session.
    pub fn subscriptions(&self, client: &str) -> Vec<(String, SubOptions)> {
        self.subs.get(client).map(|s| s.iter().map(|(f, o)| (f.clone(), *o)).collect()).unwrap_or_default()
    }

    /// The retained message of `topic`, if any.
    pub fn retained(&self, topic: &str) -> Option<&Message> {
        self.retained.get(topic)
    }

    /// Routes `msg` published by `from`: updates the retained store (for `retain`) and
    /// returns one delivery per receiving client.
    pub fn publish(&mut self, from: &str, msg: &Message, retain: bool) -> Vec<Delivery> {
        self.publish_to(from, msg, retain, Groups::All)
    }

    /// The shared groups with members here (`$share/{group}/{filter}`), each once.
    pub fn groups(&self) -> Vec<String> {
        let mut groups: Vec<String> =
            self.subs.values().flat_map(|s| s.keys()).filter(|f| f.starts_with("$share/")).cloned().collect();
        groups.sort_unstable();
        groups.dedup();
        groups
    }

    /// [`Router::publish`], reaching the shared groups `groups` names.
    pub fn publish_to(&mut self, from: &str, msg: &Message, retain: bool, groups: Groups<'_>) -> Vec<Delivery> {
        let (topic, qos) = (&*msg.topic, msg.qos);
        let only = match groups {
            Groups::Only(full) => match split_share(full) {
                Ok(Some(gf)) => Some(gf),
                _ => return Vec::new(),
            },
            _ => None,
        };
        if retain && only.is_none() {
            if msg.payload.is_empty() {
                self.retained.remove(topic);
            } else {
                self.retained.insert(topic.to_owned(), msg.clone());
            }
        }
        // Trie hits: plain subscribers (once per client, whatever the number of its
        // matching filters) and shared groups with their members.
        let mut plain: Vec<(Arc<str>, SubOptions)> = Vec::new();
        let mut shared: BTreeMap<(String, String), Vec<Arc<str>>> = BTreeMap::new();
        for member in self.trie.matches(topic) {
            match &member.group {
                None if only.is_none() => plain.push((member.client, member.opts)),
                None => {}
                Some(_) if groups == Groups::None => {}
                Some(group) if only.is_some_and(|(g, _)| g != &**group) => {}
                Some(group) => {
                    let Some(subs) = self.subs.get(&member.client) else {
                        continue;
                    };
                    for full in subs.keys() {
                        if let Ok(Some((g, f))) = split_share(full) {
                            if g == &**group && matches(f, topic) && only.is_none_or(|(_, of)| of == f) {
                                let members = shared.entry((g.to_owned(), f.to_owned())).or_default();
                                if !members.iter().any(|m| Arc::ptr_eq(m, &member.client)) {
                                    members.push(member.client.clone());
                                }
                            }
                        }
                    }
                }
            }
        }
        // A client with several matching filters appears once per filter: one copy, at
        // the highest QoS, with every subscription identifier.
        if plain.len() > 1 {
            plain.sort_unstable_by_key(|(c, _)| Arc::as_ptr(c).cast::<u8>() as usize);
        }
        let mut direct: Vec<Delivery> = Vec::with_capacity(plain.len());
        for (client, opts) in plain {
            if opts.no_local && &*client == from {
                continue;
            }
            let copy_qos = qos.min(opts.qos);
            let copy_retain = retain && opts.retain_as_published;
            match direct.last_mut() {
                Some(d) if Arc::ptr_eq(&d.client, &client) => {
                    d.qos = d.qos.max(copy_qos);
                    d.retain |= copy_retain;
                    d.subscription_ids.extend(opts.subscription_id);
                }
                _ => direct.push(Delivery {
                    client,
                    qos: copy_qos,
                    retain: copy_retain,
                    subscription_ids: opts.subscription_id.into_iter().collect(),
                }),
            }
        }
        for ((group, filter), mut members) in shared {
            members.sort();
            let turn = self.turn.entry((group.clone(), filter.clone())).or_insert(0);
            let client = members[*turn % members.len()].clone();
            *turn = turn.wrapping_add(1);
            let full = format!("$share/{group}/{filter}");
            let Some(opts) = self.subs.get(&client).and_then(|s| s.get(&full)) else {
                continue;
            };
            direct.push(Delivery {
                client,
                qos: qos.min(opts.qos),
                retain: retain && opts.retain_as_published,
                subscription_ids: opts.subscription_id.into_iter().collect(),
            });
        }
        direct
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlinks_codec::mqtt::QoS::{AtLeastOnce as Q1, AtMostOnce as Q0, ExactlyOnce as Q2};

    /// QoS `n` (0..=2).
    fn q(n: usize) -> QoS {
        QoS::try_from(n as u8).unwrap()
    }

    fn opts(qos: QoS) -> SubOptions {
        SubOptions { qos, ..Default::default() }
    }

    fn to(deliveries: &[Delivery]) -> Vec<(&str, u8)> {
        let mut v: Vec<(&str, u8)> = deliveries.iter().map(|d| (&*d.client, u8::from(d.qos))).collect();
        v.sort();
        v
    }

    #[test]
    fn one_copy_per_client_at_the_highest_granted_qos() {
        let mut r = Router::new();
        r.subscribe("app", "sensors/+/t", opts(Q0)).unwrap();
        r.subscribe("app", "sensors/#", opts(Q1)).unwrap();
        r.subscribe("other", "sensors/a/t", opts(Q2)).unwrap();
        let d = r.publish("dev", &Message::new("sensors/a/t", Q1, Bytes::from_static(b"1")), false);
        assert_eq!(to(&d), [("app", 1), ("other", 1)], "delivered QoS = min(publish, granted)");
        let d = r.publish("dev", &Message::new("sensors/a/t", Q0, Bytes::from_static(b"1")), false);
        assert_eq!(to(&d), [("app", 0), ("other", 0)]);
        assert!(r.publish("dev", &Message::new("elsewhere", Q1, Bytes::new()), false).is_empty());
    }

    #[test]
    fn dollar_topics_are_not_matched_by_leading_wildcards() {
        let mut r = Router::new();
        r.subscribe("all", "#", opts(Q1)).unwrap();
        r.subscribe("sys", "$SYS/#", opts(Q1)).unwrap();
        let d = r.publish("x", &Message::new("$SYS/broker/load", Q1, Bytes::from_static(b"1")), false);
        assert_eq!(to(&d), [("sys", 1)]);
    }

    #[test]
    fn no_local_and_subscription_ids() {
        let mut r = Router::new();
        let mut o = opts(Q1);
        o.no_local = true;
        o.subscription_id = Some(7);
        r.subscribe("me", "chat/#", o).unwrap();
        r.subscribe("me", "chat/room", SubOptions { subscription_id: Some(9), ..opts(Q0) }).unwrap();
        let d = r.publish("me", &Message::new("chat/room", Q1, Bytes::from_static(b"hi")), false);
        // The no-local subscription is skipped; the other one still matches.
        assert_eq!(to(&d), [("me", 0)]);
        assert_eq!(d[0].subscription_ids, [9]);
        let d = r.publish("you", &Message::new("chat/room", Q1, Bytes::from_static(b"hi")), false);
        let mut ids = d[0].subscription_ids.clone();
        ids.sort();
        assert_eq!((d.len(), d[0].qos, ids), (1, Q1, vec![7, 9]));
    }

    #[test]
    fn retained_messages_are_stored_cleared_and_sent_by_retain_handling() {
        let mut r = Router::new();
        r.publish("d", &Message::new("lamp/1", Q1, Bytes::from_static(b"on")), true);
        r.publish("d", &Message::new("lamp/2", Q0, Bytes::from_static(b"off")), true);
        let s = r.subscribe("a", "lamp/+", opts(Q1)).unwrap();
        assert!(!s.existed);
        let mut got: Vec<(String, u8)> = s.retained.iter().map(|(m, q)| (m.topic.to_string(), u8::from(*q))).collect();
        got.sort();
        assert_eq!(got, [("lamp/1".to_string(), 1), ("lamp/2".to_string(), 0)]);
        // Handling 1: only for a new subscription; 2: never.
        let again = r.subscribe("a", "lamp/+", SubOptions { retain_handling: 1, ..opts(Q1) }).unwrap();
        assert!(again.existed && again.retained.is_empty());
        let never = r.subscribe("b", "lamp/+", SubOptions { retain_handling: 2, ..opts(Q1) }).unwrap();
        assert!(never.retained.is_empty());
        // An empty retained payload clears; it is still forwarded to subscribers.
        let d = r.publish("d", &Message::new("lamp/1", Q0, Bytes::new()), true);
        assert_eq!(d.len(), 2);
        assert!(r.retained("lamp/1").is_none());
        assert_eq!(r.subscribe("c", "lamp/#", opts(Q1)).unwrap().retained.len(), 1);
    }

    #[test]
    fn retain_flag_is_kept_only_with_retain_as_published() {
        let mut r = Router::new();
        r.subscribe("keep", "t", SubOptions { retain_as_published: true, ..opts(Q1) }).unwrap();
        r.subscribe("clear", "t", opts(Q1)).unwrap();
        let d = r.publish("p", &Message::new("t", Q1, Bytes::from_static(b"x")), true);
        let flag = |c: &str| d.iter().find(|x| &*x.client == c).unwrap().retain;
        assert!(flag("keep"));
        assert!(!flag("clear"));
    }

    #[test]
    fn groups_are_reached_as_asked() {
        let mut r = Router::new();
        r.subscribe("plain", "jobs/#", opts(Q1)).unwrap();
        r.subscribe("w1", "$share/workers/jobs/+", opts(Q1)).unwrap();
        r.subscribe("w2", "$share/workers/jobs/+", opts(Q1)).unwrap();
        r.subscribe("x1", "$share/other/jobs/#", opts(Q0)).unwrap();
        r.subscribe("w1", "$share/workers/jobs/#", opts(Q1)).unwrap();
        assert_eq!(r.groups(), ["$share/other/jobs/#", "$share/workers/jobs/#", "$share/workers/jobs/+"]);
        let m = Message::new("jobs/1", Q1, Bytes::from_static(b"j"));
        // None: plain subscribers only.
        let d = r.publish_to("p", &m, false, Groups::None);
        assert_eq!(to(&d), [("plain", 1)]);
        // Only one group: one of its members, nobody else; the group with the same name
        // and another filter is another group.
        let mut got = Vec::new();
        for _ in 0..4 {
            let d = r.publish_to("p", &m, true, Groups::Only("$share/workers/jobs/+"));
            assert_eq!(d.len(), 1);
            got.push(d[0].client.to_string());
        }
        got.sort();
        assert_eq!(got, ["w1", "w1", "w2", "w2"]);
        assert_eq!(to(&r.publish_to("p", &m, false, Groups::Only("$share/other/jobs/#"))), [("x1", 0)]);
        assert!(r.publish_to("p", &m, false, Groups::Only("$share/none/jobs/#")).is_empty());
        assert!(r.publish_to("p", &m, false, Groups::Only("not-a-group")).is_empty());
        // Only leaves the retained store alone.
        assert!(r.retained("jobs/1").is_none());
        // All: plain and one member of each group.
        assert_eq!(r.publish("p", &m, false).len(), 4);
    }

    #[test]
    fn shared_subscriptions_take_turns_and_get_no_retained() {
        let mut r = Router::new();
        r.publish("d", &Message::new("jobs/1", Q1, Bytes::from_static(b"r")), true);
        for w in ["w1", "w2", "w3"] {
            let s = r.subscribe(w, "$share/workers/jobs/+", opts(Q1)).unwrap();
            assert!(s.retained.is_empty());
        }
        r.subscribe("audit", "jobs/#", opts(Q0)).unwrap();
        let mut counts: HashMap<String, usize> = HashMap::default();
        for i in 0..30 {
            let d = r.publish("d", &Message::new(&format!("jobs/{i}"), Q1, Bytes::from_static(b"j")), false);
            assert_eq!(d.len(), 2, "one worker and the audit subscriber");
            for x in d {
                *counts.entry(x.client.to_string()).or_default() += 1;
            }
        }
        assert_eq!(counts["audit"], 30);
        for w in ["w1", "w2", "w3"] {
            assert_eq!(counts[w], 10, "round robin");
        }
        assert_eq!(r.subscribe("x", "$share/bad+/t", opts(Q0)), Err(SubscribeError::Share));
        assert_eq!(r.subscribe("x", "$share/g", opts(Q0)), Err(SubscribeError::Share));
        assert!(matches!(r.subscribe("x", "$share/g/a/#/b", opts(Q0)), Err(SubscribeError::Filter(_))));
    }

    #[test]
    fn unsubscribe_and_session_end_remove_routes() {
        let mut r = Router::new();
        r.subscribe("a", "x/#", opts(Q1)).unwrap();
        r.subscribe("a", "$share/g/x/+", opts(Q1)).unwrap();
        r.subscribe("b", "x/y", opts(Q1)).unwrap();
        assert!(r.unsubscribe("a", "x/#"));
        assert!(!r.unsubscribe("a", "x/#"));
        assert_eq!(to(&r.publish("p", &Message::new("x/y", Q1, Bytes::new()), false)), [("a", 1), ("b", 1)]);
        r.remove_client("a");
        assert!(r.subscriptions("a").is_empty());
        assert_eq!(to(&r.publish("p", &Message::new("x/y", Q1, Bytes::new()), false)), [("b", 1)]);
    }

    /// Random operations from several clients: no panic, and every delivery goes to a
    /// client holding a matching subscription, never twice per publish.
    #[test]
    fn random_operations_keep_deliveries_consistent() {
        let topics = ["a", "a/b", "a/b/c", "$SYS/x", "b/b", "/"];
        let filters = ["a/#", "+/b", "#", "a/+/c", "$SYS/#", "$share/g/a/#", "$share/h/+/b", "/", "b/+"];
        let clients = ["c0", "c1", "c2", "c3"];
        let mut r = Router::new();
        let mut next = crate::test_rng(0x2545_F491_4F6C_DD1D);
        for _ in 0..5_000 {
            let client = clients[next(clients.len())];
            match next(4) {
                0 => {
                    let f = filters[next(filters.len())];
                    r.subscribe(client, f, SubOptions { no_local: next(2) == 0, ..opts(q(next(3))) }).unwrap();
                }
                1 => {
                    r.unsubscribe(client, filters[next(filters.len())]);
                }
                2 if next(10) == 0 => r.remove_client(client),
                _ => {
                    let topic = topics[next(topics.len())];
                    let qos = q(next(3));
                    let d = r.publish(client, &Message::new(topic, qos, Bytes::from_static(b"p")), next(5) == 0);
                    let mut copies: HashMap<&str, usize> = HashMap::default();
                    for x in &d {
                        assert!(x.qos <= qos);
                        let subs = r.subscriptions(&x.client);
                        let holds = subs.iter().any(|(f, _)| {
                            let plain = split_share(f).ok().flatten().map_or(f.as_str(), |(_, p)| p);
                            matches(plain, topic)
                        });
                        assert!(holds, "{} got {topic} without a matching subscription", x.client);
                        *copies.entry(&*x.client).or_default() += 1;
                    }
                    // At most one plain copy per client plus one per matching shared group.
                    for (client, n) in copies {
                        let groups = r
                            .subscriptions(client)
                            .iter()
                            .filter(|(f, _)| split_share(f).ok().flatten().is_some_and(|(_, p)| matches(p, topic)))
                            .count();
                        assert!(n <= 1 + groups, "{client} got {n} copies of {topic}");
                    }
                }
            }
        }
    }
}
