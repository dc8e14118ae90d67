//! Pub/sub between clients, where it meets storage: routing a message and committing
//! what must be durable before the publisher hears back (the retained message, the
//! copies queued for persistent sessions), persistent sessions on disk (subscriptions and
//! expiry in the broker's `Sessions` table, queued QoS 1/2 copies in `Queue` — a QoS 2
//! copy the client received stays there as a marker until its PUBCOMP —, the
//! client's unreleased QoS 2 packet ids in `Incoming`), their expiry, and last wills.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gridlinks_broker::persist::{self, stored_qos, QueueValue, SessionRecord, SubscriptionRecord};
use gridlinks_broker::router::{Message, SubOptions};
use gridlinks_broker::sessions::{Outbound, Routed, SessionId, Sessions, StoredSession};
use gridlinks_codec::mqtt::{LastWill, Publish, QoS};
use gridlinks_platform::activity;
use gridlinks_storage::{BrokerRow, BrokerTable, Store, StoreError, WriteOp, WriterHandle};
use gridlinks_types::{AttributeScope, Ts};

use super::retained;
use crate::Mqtt;

/// How long a publisher's QoS 1 message may wait for room in a full subscriber queue
/// before that subscriber is disconnected as too slow.
pub const SLOW_SUBSCRIBER_PATIENCE: Duration = Duration::from_secs(10);

/// Session expiry interval meaning "never" (MQTT 5).
pub const NEVER: u32 = u32::MAX;

/// What routing a message found.
pub struct Routing {
    /// At least one subscriber got a copy (or will, after backpressure).
    pub matched: bool,
    /// A QoS 0 copy was dropped: a subscriber's queue is full.
    pub congested: bool,
    /// Work left before the publisher may be acknowledged: commit durable rows, wait for
    /// room in full queues. `None` when there is nothing to wait for.
    pub pending: Option<Work>,
}

/// Work to finish before a publisher is acknowledged.
pub type Work = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// Routes `msg` from client `from` of this node (keeping it as the retained message with
/// `retain`); `also` is committed with the copies. With other nodes, it also goes on the
/// bus, and the publisher is answered once Kafka has it too.
pub fn route(st: &Arc<Mqtt>, from: &str, msg: &Message, retain: bool, also: Option<BrokerRow>) -> Routing {
    let mut routing = route_with(&st.devices.sessions, &st.core.writer, from, msg, retain, also, Retained::Store);
    let Some(bus) = &st.core.bus else { return routing };
    // Other nodes' subscribers are not known here: never "no matching subscribers".
    routing.matched = true;
    let sent = bus.publish(from, retain, &retained::encode_message(msg));
    let local = routing.pending.take();
    routing.pending = Some(Box::pin(async move {
        let sent = sent?;
        match local {
            Some(local) => futures_util::future::try_join(local, sent).await.map(drop),
            None => sent.await,
        }
    }));
    routing
}

/// Whether routing a retained message stores it (a message of this node) or only keeps it
/// in memory (another node's, which that node stored).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Retained {
    /// Commit the retained row.
    Store,
    /// Memory only.
    Memory,
}

/// [`route`] with the session table and the writer given apart (for the ingest path's live
/// fan-out, which holds no server state), and without the bus.
pub fn route_with(
    sessions: &Sessions,
    writer: &WriterHandle,
    from: &str,
    msg: &Message,
    retain: bool,
    also: Option<BrokerRow>,
    retained: Retained,
) -> Routing {
    let routed = sessions.publish(from, msg, retain);
    let mut rows: Vec<BrokerRow> = also.into_iter().collect();
    if retain && retained == Retained::Store {
        rows.push(retained::row(msg));
    }
    settle(routed, writer, msg, rows)
}

/// What is left to do once `routed` is queued: commit its durable copies (and `rows`),
/// wait for room in full queues.
fn settle(routed: Routed, writer: &WriterHandle, msg: &Message, mut rows: Vec<BrokerRow>) -> Routing {
    let matched = routed.queued > 0 || !routed.blocked.is_empty();
    let congested = routed.dropped_qos0 > 0;
    if !routed.durable.is_empty() {
        let stored = retained::encode_message(msg);
        // A row is the copy's QoS (it may be lower than the message's) and the message.
        rows.extend(routed.durable.iter().map(|(client, seq, qos)| BrokerRow {
            table: BrokerTable::Queue,
            key: persist::queue_key(client, *seq),
            value: Some(QueueValue::Copy(*qos, &stored).encode()),
        }));
    }
    rows.extend(routed.dropped.iter().map(|(client, seq)| BrokerRow {
        table: BrokerTable::Queue,
        key: persist::queue_key(client, *seq),
        value: None,
    }));
    if rows.is_empty() && routed.blocked.is_empty() {
        return Routing { matched, congested, pending: None };
    }
    let writer = writer.clone();
    let pending = Box::pin(async move {
        if !rows.is_empty() {
            writer.submit(WriteOp::Broker(rows)).await?;
        }
        for blocked in routed.blocked {
            blocked.wait(SLOW_SUBSCRIBER_PATIENCE).await;
        }
        Ok(())
    });
    Routing { matched, congested, pending: Some(pending) }
}

/// Routes `msg` of client `from` to one member of shared group `full` on this node (with
/// several nodes, Kafka gave this node the message for the group); `None` when the group
/// has no member here.
pub fn route_group(st: &Mqtt, full: &str, from: &str, msg: &Message, retain: bool) -> Option<Routing> {
    let routed = st.devices.sessions.publish_group(full, from, msg, retain)?;
    Some(settle(routed, &st.core.writer, msg, Vec::new()))
}

/// Routes `msg` and waits until it is durable where it must be and queued everywhere.
pub async fn deliver(st: &Arc<Mqtt>, from: &str, msg: &Message, retain: bool) -> Result<(), StoreError> {
    match route(st, from, msg, retain, None).pending {
        Some(p) => p.await,
        None => Ok(()),
    }
}

/// Follows the bus: other nodes' client publishes are routed to this node's sessions (their
/// retained messages kept in memory: the node that took one stored it), device data other
/// nodes acknowledged goes to this node's live listeners (canonical topics, WebSocket
/// sessions; shared attributes to the device's own sessions), as the node that took it did
/// for its own, server-side RPC calls reach devices connected here (and their answers
/// the node that took the call), and clients connecting elsewhere take their sessions over
/// (`super::handoff`).
pub fn follow_bus(
    bus: &gridlinks_kafka::Bus,
    st: &Arc<Mqtt>,
) -> Result<tokio::task::JoinHandle<()>, gridlinks_kafka::KafkaError> {
    use gridlinks_ingest::LiveData;
    use gridlinks_kafka::bus::Event;
    let st = st.clone();
    let handle = move |event: Event| {
        let (st, live) = (st.clone(), st.live.clone());
        async move {
            let done = match event {
                Event::Publish(p) => {
                    let Some(msg) = retained::decode_message(&p.message) else { return };
                    let routing = route_with(
                        &st.devices.sessions,
                        &st.core.writer,
                        &p.from,
                        &msg,
                        p.retain,
                        None,
                        Retained::Memory,
                    );
                    match routing.pending {
                        Some(pending) => pending.await,
                        None => Ok(()),
                    }
                }
                Event::Data(WriteOp::Telemetry { device, records }) if live.wants_telemetry() => {
                    live.telemetry(vec![(device, records)]).await
                }
                Event::Data(WriteOp::Attributes { device, scope, values }) => {
                    if scope == AttributeScope::Shared {
                        st.devices.push_shared(device, &values);
                    }
                    if scope == AttributeScope::Server {
                        if let Some((_, t)) = values.iter().find(|(k, _)| k == activity::INACTIVITY_TIMEOUT) {
                            st.core.activity.timeout_changed(device, Some(t));
                        }
                    }
                    if live.wants_attributes() {
                        live.attributes(&[(device, scope, values)]);
                    }
                    Ok(())
                }
                Event::Data(WriteOp::DeleteAttributes { device, scope, keys }) => {
                    match scope {
                        AttributeScope::Shared => st.devices.push_deleted(device, &keys),
                        AttributeScope::Server if keys.iter().any(|k| k == activity::INACTIVITY_TIMEOUT) => {
                            st.core.activity.timeout_changed(device, None)
                        }
                        _ => {}
                    }
                    Ok(())
                }
                Event::Data(_) => Ok(()),
                Event::RpcRequest(r) => {
                    gridlinks_platform::rpc::deliver_remote(&st.platform, r);
                    Ok(())
                }
                Event::RpcDelivered(request) => {
                    st.devices.rpc.remote_delivered(request);
                    Ok(())
                }
                Event::RpcReply(request, payload) => {
                    st.devices.rpc.remote_reply(request, payload);
                    Ok(())
                }
                Event::SessionTaken(t) => {
                    super::handoff::release(&st, t);
                    Ok(())
                }
                Event::SessionReleased(request) => {
                    st.handoffs.released(request);
                    Ok(())
                }
            };
            if let Err(e) = done {
                gridlinks_platform::logging::warn_limited!(error = %e, "a message from another node was not delivered here");
            }
        }
    };
    tokio::task::block_in_place(|| bus.follow(handle))
}

/// The row remembering (`present`) or forgetting that `client` published QoS 2 message
/// `packet_id` and has not released it yet.
pub fn incoming_row(client: &str, packet_id: u16, present: bool) -> BrokerRow {
    BrokerRow {
        table: BrokerTable::Incoming,
        key: persist::incoming_key(client, packet_id),
        value: present.then(Vec::new),
    }
}

/// The row deleting copy `out` from `client`'s durable queue, if it has one.
pub fn acked_row(client: &str, out: &Outbound) -> Option<BrokerRow> {
    out.seq.map(|seq| BrokerRow { table: BrokerTable::Queue, key: persist::queue_key(client, seq), value: None })
}

/// The row recording that the client received QoS 2 copy `out` (PUBREC), if it is durable.
pub fn released_row(client: &str, out: &Outbound) -> Option<BrokerRow> {
    out.seq.map(|seq| BrokerRow {
        table: BrokerTable::Queue,
        key: persist::queue_key(client, seq),
        value: Some(QueueValue::Released.encode()),
    })
}

/// The row storing `client`'s persistent session as it is now (held by this node).
pub fn session_row(st: &Mqtt, client: &str, owner: &str, expiry: u32, disconnected_at: Option<i64>) -> BrokerRow {
    let subscriptions = st
        .devices
        .sessions
        .client_subscriptions(client)
        .into_iter()
        .map(|(filter, o)| SubscriptionRecord {
            filter,
            qos: u8::from(o.qos),
            no_local: o.no_local,
            retain_as_published: o.retain_as_published,
            retain_handling: o.retain_handling,
            subscription_id: o.subscription_id,
        })
        .collect();
    let rec = SessionRecord {
        version: persist::ROW_VERSION,
        owner: owner.to_owned(),
        expiry,
        subscriptions,
        disconnected_at,
        home: st.core.bus.as_ref().map(|b| b.node_id().to_owned()),
    };
    BrokerRow { table: BrokerTable::Sessions, key: client.as_bytes().to_vec(), value: Some(rec.encode()) }
}

/// Rows deleting everything stored for `client`'s session (record, queue, QoS 2 ids).
pub fn forget_rows(store: &Store, client: &str) -> Result<Vec<BrokerRow>, StoreError> {
    let mut rows = vec![BrokerRow { table: BrokerTable::Sessions, key: client.as_bytes().to_vec(), value: None }];
    let prefix = persist::client_prefix(client);
    for table in [BrokerTable::Queue, BrokerTable::Incoming] {
        for (key, _) in store.broker_prefix(table, &prefix)? {
            rows.push(BrokerRow { table, key, value: None });
        }
    }
    Ok(rows)
}

/// Deletes everything stored for `client`'s session.
pub async fn forget(st: &Mqtt, client: &str) -> Result<(), StoreError> {
    let rows = forget_rows(&st.core.store, client)?;
    st.core.writer.submit(WriteOp::Broker(rows)).await.map(drop)
}

/// Ends `client`'s offline session `epoch` when its expiry runs out (unless it resumed
/// meanwhile), deleting its stored state. The timer does not keep the server alive.
pub fn expire_later(st: Arc<Mqtt>, client: Arc<str>, epoch: SessionId, expiry: u32) {
    if expiry == NEVER {
        return;
    }
    let st = Arc::downgrade(&st);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(u64::from(expiry))).await;
        let Some(st) = st.upgrade() else { return };
        if st.devices.sessions.expire_client(&client, epoch) {
            if let Err(e) = forget(&st, &client).await {
                gridlinks_platform::logging::warn_limited!(client = %client, error = %e, "cannot delete an expired session's stored state");
            }
        }
    });
}

/// What a stored queue row holds.
enum StoredCopy {
    /// A copy (or a QoS 2 copy's PUBREL marker) to send.
    Copy(Outbound),
    /// Expired or unreadable: its row goes.
    Stale,
    /// Written by a newer build: kept, not misread.
    Newer,
}

/// Queue row `v` of copy `seq`.
fn stored_copy(seq: u64, v: &[u8]) -> StoredCopy {
    let mut out = match QueueValue::decode(v) {
        Ok(QueueValue::Released) => {
            // Only the PUBREL is owed, with the copy's fixed packet id.
            let mut out = Outbound::plain(Message::new("", QoS::ExactlyOnce, bytes::Bytes::new()), QoS::ExactlyOnce);
            out.released = true;
            out
        }
        Ok(QueueValue::Copy(qos, m)) => match retained::decode_message(m) {
            Some(msg) => Outbound::plain(msg, qos),
            None => return StoredCopy::Stale,
        },
        Err(e @ persist::RowError::Version(_)) => {
            gridlinks_platform::logging::warn_limited!(error = %e, "skipping a durable queue row");
            return StoredCopy::Newer;
        }
        Err(_) => return StoredCopy::Stale,
    };
    out.seq = Some(seq);
    if out.released {
        out.packet_id = out.fixed_packet_id();
    }
    StoredCopy::Copy(out)
}

/// Seconds left of a stored session's expiry at `now` (ms); a session connected at a crash
/// counts as disconnected now.
fn expiry_left(rec: &SessionRecord, now: i64) -> u32 {
    if rec.expiry == NEVER {
        return NEVER;
    }
    let offline_ms = now - rec.disconnected_at.unwrap_or(now);
    u32::try_from((i64::from(rec.expiry) - offline_ms / 1000).max(0)).unwrap_or(0)
}

/// The session `rec` describes, with its copies and QoS 2 ids.
fn stored_session(rec: SessionRecord, queued: Vec<Outbound>, incoming: Vec<u16>) -> StoredSession {
    let subscriptions = rec
        .subscriptions
        .into_iter()
        .map(|s| {
            let opts = SubOptions {
                qos: stored_qos(s.qos),
                no_local: s.no_local,
                retain_as_published: s.retain_as_published,
                retain_handling: s.retain_handling,
                subscription_id: s.subscription_id,
            };
            (s.filter, opts)
        })
        .collect();
    StoredSession { owner: rec.owner.into(), expiry: rec.expiry, subscriptions, queued, incoming, numbered_from: None }
}

/// `client`'s stored session as the store holds it now, unless it has none or it expired:
/// the node holding it (several nodes), and the session.
pub fn read_session(store: &Store, client: &str) -> Result<Option<(Option<String>, StoredSession)>, StoreError> {
    let Some(v) = store.broker_row(BrokerTable::Sessions, client.as_bytes())? else { return Ok(None) };
    let Ok(rec) = SessionRecord::decode(&v) else { return Ok(None) };
    if expiry_left(&rec, Ts::now().0) == 0 {
        return Ok(None);
    }
    let prefix = persist::client_prefix(client);
    let mut queued = Vec::new();
    for (key, v) in store.broker_prefix(BrokerTable::Queue, &prefix)? {
        let Ok((_, seq)) = persist::parse_queue_key(&key) else { continue };
        if let StoredCopy::Copy(out) = stored_copy(seq, &v) {
            queued.push(out);
        }
    }
    let incoming = store
        .broker_prefix(BrokerTable::Incoming, &prefix)?
        .iter()
        .filter_map(|(key, _)| persist::parse_incoming_key(key).ok().map(|(_, id)| id))
        .collect();
    let home = rec.home.clone();
    Ok(Some((home, stored_session(rec, queued, incoming))))
}

/// Loads the stored persistent sessions this node holds (offline, with their subscriptions
/// and queued copies) and schedules their expiry; returns how many. With several nodes,
/// sessions another node holds, and their rows, are that node's.
pub fn load(st: &Arc<Mqtt>) -> Result<usize, StoreError> {
    let now = Ts::now().0;
    let me = st.core.bus.as_ref().map(|b| b.node_id().to_owned());
    let mut elsewhere = std::collections::HashSet::new();
    let mut records = Vec::new();
    for (key, v) in st.core.store.broker_rows(BrokerTable::Sessions)? {
        let (Ok(client), Ok(rec)) = (String::from_utf8(key), SessionRecord::decode(&v)) else {
            continue;
        };
        if rec.home.is_some() && rec.home != me {
            elsewhere.insert(client);
        } else {
            records.push((client, rec));
        }
    }
    let mut queues: std::collections::HashMap<String, Vec<Outbound>> = std::collections::HashMap::new();
    let mut next_seq = 0;
    let mut expired_rows = Vec::new();
    for (key, v) in st.core.store.broker_rows(BrokerTable::Queue)? {
        let Ok((client, seq)) = persist::parse_queue_key(&key) else { continue };
        if elsewhere.contains(client) {
            continue;
        }
        let client = client.to_owned();
        next_seq = next_seq.max(seq + 1);
        match stored_copy(seq, &v) {
            StoredCopy::Copy(out) => queues.entry(client).or_default().push(out),
            StoredCopy::Stale => expired_rows.push(BrokerRow { table: BrokerTable::Queue, key, value: None }),
            StoredCopy::Newer => {}
        }
    }
    st.devices.sessions.seq_floor(next_seq);
    let mut incoming: std::collections::HashMap<String, Vec<u16>> = std::collections::HashMap::new();
    for (key, _) in st.core.store.broker_rows(BrokerTable::Incoming)? {
        if let Ok((client, packet_id)) = persist::parse_incoming_key(&key) {
            if !elsewhere.contains(client) {
                incoming.entry(client.to_owned()).or_default().push(packet_id);
            }
        }
    }
    let mut n = 0;
    for (client, rec) in records {
        let left = expiry_left(&rec, now);
        let queued = queues.remove(&client).unwrap_or_default();
        let released = incoming.remove(&client).unwrap_or_default();
        if left == 0 {
            expired_rows.extend(queued.iter().filter_map(|o| acked_row(&client, o)));
            expired_rows.extend(released.iter().map(|&id| incoming_row(&client, id, false)));
            expired_rows.push(BrokerRow { table: BrokerTable::Sessions, key: client.into_bytes(), value: None });
            continue;
        }
        let stored = stored_session(rec, queued, released);
        let epoch = st.devices.sessions.restore_client(&client, stored, st.core.cfg.mqtt.client_outbound_queue);
        expire_later(st.clone(), client.into(), epoch, left);
        n += 1;
    }
    // Rows of sessions that no longer exist.
    for (client, queued) in queues {
        expired_rows.extend(queued.iter().filter_map(|o| acked_row(&client, o)));
    }
    for (client, ids) in incoming {
        expired_rows.extend(ids.iter().map(|&id| incoming_row(&client, id, false)));
    }
    if !expired_rows.is_empty() {
        let st = st.clone();
        tokio::spawn(async move {
            if let Err(e) = st.core.writer.submit(WriteOp::Broker(expired_rows)).await {
                gridlinks_platform::logging::warn_limited!(error = %e, "cannot delete expired session rows");
            }
        });
    }
    Ok(n)
}

/// Publishes a client's will as if the client had published it, after `delay` seconds
/// unless the session resumed meanwhile (`epoch` is then no longer offline). A delayed
/// will does not keep the server alive.
pub fn will_later(st: Arc<Mqtt>, client: Arc<str>, will: LastWill, delay: u32, epoch: Option<SessionId>) {
    let weak = Arc::downgrade(&st);
    drop(st);
    tokio::spawn(async move {
        if delay > 0 {
            tokio::time::sleep(Duration::from_secs(u64::from(delay))).await;
        }
        let Some(st) = weak.upgrade() else { return };
        if epoch.is_some_and(|e| st.devices.sessions.resumed_since(&client, e)) {
            return;
        }
        let retain = will.retain;
        let msg = super::connection::message(Publish {
            dup: false,
            qos: will.qos,
            retain,
            topic: will.topic,
            packet_id: None,
            payload: will.payload,
            properties: will.properties,
        });
        if let Err(e) = deliver(&st, &client, &msg, retain).await {
            gridlinks_platform::logging::warn_limited!(client = %client, error = %e, "will not delivered");
        }
    });
}
