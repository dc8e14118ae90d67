//! Live delivery across nodes, through Kafka as TBMQ does it (no node-to-node calls): MQTT
//! client publishes go to the broker topic, and every node follows that topic and the
//! device-data topic from their ends, handing what *other* nodes produced to its own
//! subscribers (MQTT sessions, WebSocket sessions). Each record names the node that
//! produced it in its `origin` header, so a node skips its own (it delivered them itself).
//! Server-side RPC crosses nodes the same way: the node that took the REST call puts the
//! request on the broker topic, the node holding the device delivers it and answers (that
//! it delivered it, then the device's reply) with records addressed to the caller's node.
//! A client connecting to a node says so on the topic: any other node holding a session
//! of that client id ends it there, and the node that held its persistent session answers
//! once everything it stored for it is committed.
//!
//! ```text
//! broker record  := FORMAT(1) kind(1) body
//! publish        := KIND_PUBLISH retain(1) from(text) message(the rest)
//! rpc request    := KIND_RPC_REQUEST reply_to(text) request(varint) device(16) timeout_ms(varint) body(the rest)
//! rpc delivered  := KIND_RPC_DELIVERED to(text) request(varint)
//! rpc reply      := KIND_RPC_REPLY to(text) request(varint) payload(the rest)
//! session taken  := KIND_SESSION_TAKEN client(text) by(text) home(text) request(varint)
//! session released := KIND_SESSION_RELEASED to(text) request(varint)
//! ```
//! `message` is the stored form of an MQTT message (`gridlinks_broker::persist`), opaque
//! here; an RPC `body` is the request's JSON (`{"method":…,"params":…}`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gridlinks_storage::codec::{Reader, Writer};
use gridlinks_storage::{StoreError, WriteOp};
use gridlinks_types::DeviceId;
use parking_lot::Mutex;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use crate::{record, KafkaError, KafkaSettings};

const KIND_PUBLISH: u8 = 1;
const KIND_RPC_REQUEST: u8 = 2;
const KIND_RPC_DELIVERED: u8 = 3;
const KIND_RPC_REPLY: u8 = 4;
const KIND_SESSION_TAKEN: u8 = 5;
const KIND_SESSION_RELEASED: u8 = 6;
/// The header naming the node that produced a record.
pub const ORIGIN: &str = "origin";
/// How long [`Bus::follow`] tries to read where the followed partitions end.
const FOLLOW_PATIENCE: Duration = Duration::from_secs(20);

/// A client's publish as the broker topic carries it.
#[derive(Debug, PartialEq, Eq)]
pub struct Publish {
    /// The publishing client's id (MQTT 5 "no local" compares it).
    pub from: String,
    /// Whether it replaces its topic's retained message.
    pub retain: bool,
    /// The message, in its stored form.
    pub message: Vec<u8>,
}

/// A server-side RPC request for a device that is not connected to the calling node.
#[derive(Debug, PartialEq, Eq)]
pub struct RpcRequest {
    /// The calling node, to which the answers are addressed.
    pub reply_to: String,
    /// The call's number on the calling node.
    pub request: u64,
    /// The device to call.
    pub device: DeviceId,
    /// How long the caller waits for the reply, in milliseconds.
    pub timeout_ms: u64,
    /// `{"method":…,"params":…}`.
    pub body: Vec<u8>,
}

/// Client `client` connected to node `by`: every other node ends its session of that
/// client id; node `home` (the holder of its persistent session, "" if none) answers
/// [`BrokerRecord::SessionReleased`] once what it stored for it is committed.
#[derive(Debug, PartialEq, Eq)]
pub struct Takeover {
    /// The MQTT client id (in its tenant's namespace).
    pub client: String,
    /// The node it connected to.
    pub by: String,
    /// The node holding its persistent session, or "".
    pub home: String,
    /// The takeover's number on `by`.
    pub request: u64,
}

/// What the broker topic carries.
#[derive(Debug, PartialEq, Eq)]
pub enum BrokerRecord {
    /// A client's publish.
    Publish(Publish),
    /// A server-side RPC request for whichever node holds the device.
    RpcRequest(RpcRequest),
    /// Node `to`'s RPC request `request` reached a session of the device.
    RpcDelivered {
        /// The calling node.
        to: String,
        /// The call's number there.
        request: u64,
    },
    /// The device's answer to node `to`'s RPC request `request`.
    RpcReply {
        /// The calling node.
        to: String,
        /// The call's number there.
        request: u64,
        /// What the device answered.
        payload: Vec<u8>,
    },
    /// A client connected to another node ([`Takeover`]).
    SessionTaken(Takeover),
    /// Node `to`'s takeover `request`: the session is let go here, its rows committed.
    SessionReleased {
        /// The node taking it over.
        to: String,
        /// The takeover's number there.
        request: u64,
    },
}

/// A publish record, from its parts.
fn encode_publish(from: &str, retain: bool, message: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&[KIND_PUBLISH, u8::from(retain)]).text(from).bytes(message);
    w.finish()
}

impl BrokerRecord {
    /// Encodes the record.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            BrokerRecord::Publish(p) => return encode_publish(&p.from, p.retain, &p.message),
            BrokerRecord::RpcRequest(r) => {
                w.bytes(&[KIND_RPC_REQUEST])
                    .text(&r.reply_to)
                    .varint(r.request)
                    .bytes(r.device.as_bytes())
                    .varint(r.timeout_ms)
                    .bytes(&r.body);
            }
            BrokerRecord::RpcDelivered { to, request } => {
                w.bytes(&[KIND_RPC_DELIVERED]).text(to).varint(*request);
            }
            BrokerRecord::RpcReply { to, request, payload } => {
                w.bytes(&[KIND_RPC_REPLY]).text(to).varint(*request).bytes(payload);
            }
            BrokerRecord::SessionTaken(t) => {
                w.bytes(&[KIND_SESSION_TAKEN]).text(&t.client).text(&t.by).text(&t.home).varint(t.request);
            }
            BrokerRecord::SessionReleased { to, request } => {
                w.bytes(&[KIND_SESSION_RELEASED]).text(to).varint(*request);
            }
        }
        w.finish()
    }

    /// Decodes a record.
    pub fn decode(buf: &[u8]) -> Result<Self, StoreError> {
        let mut r = Reader::new(buf)?;
        let rest = |r: &mut Reader<'_>| -> Result<Vec<u8>, StoreError> { Ok(r.bytes(r.remaining())?.to_vec()) };
        let kind = r.byte()?;
        // Kinds without an opaque tail end where their last field does.
        let fixed = matches!(kind, KIND_RPC_DELIVERED | KIND_SESSION_TAKEN | KIND_SESSION_RELEASED);
        let record = match kind {
            KIND_PUBLISH => {
                let retain = match r.byte()? {
                    0 => false,
                    1 => true,
                    _ => return Err(StoreError::Corrupt("retain flag")),
                };
                let from = r.text()?.to_owned();
                BrokerRecord::Publish(Publish { from, retain, message: rest(&mut r)? })
            }
            KIND_RPC_REQUEST => {
                let reply_to = r.text()?.to_owned();
                let request = r.varint()?;
                let device =
                    DeviceId::from_bytes(r.bytes(16)?.try_into().map_err(|_| StoreError::Corrupt("device id"))?);
                let timeout_ms = r.varint()?;
                BrokerRecord::RpcRequest(RpcRequest { reply_to, request, device, timeout_ms, body: rest(&mut r)? })
            }
            KIND_RPC_DELIVERED => {
                let to = r.text()?.to_owned();
                BrokerRecord::RpcDelivered { to, request: r.varint()? }
            }
            KIND_SESSION_TAKEN => {
                let (client, by, home) = (r.text()?.to_owned(), r.text()?.to_owned(), r.text()?.to_owned());
                BrokerRecord::SessionTaken(Takeover { client, by, home, request: r.varint()? })
            }
            KIND_SESSION_RELEASED => {
                let to = r.text()?.to_owned();
                BrokerRecord::SessionReleased { to, request: r.varint()? }
            }
            KIND_RPC_REPLY => {
                let to = r.text()?.to_owned();
                let request = r.varint()?;
                BrokerRecord::RpcReply { to, request, payload: rest(&mut r)? }
            }
            _ => return Err(StoreError::Corrupt("broker record kind")),
        };
        if fixed && !r.is_empty() {
            return Err(StoreError::Corrupt("trailing bytes"));
        }
        Ok(record)
    }
}

/// Where the bus stood at one moment: each followed partition's end offset
/// ([`Bus::ends`]).
pub type Ends = Vec<(String, i32, i64)>;

/// What another node produced.
#[derive(Debug)]
pub enum Event {
    /// Device data it acknowledged (telemetry or attributes).
    Data(WriteOp),
    /// A client's publish it took.
    Publish(Publish),
    /// A server-side RPC request it took, for whichever node holds the device.
    RpcRequest(RpcRequest),
    /// This node's RPC request `request` reached a session of the device there.
    RpcDelivered(u64),
    /// The device's answer to this node's RPC request `request`.
    RpcReply(u64, Vec<u8>),
    /// A client connected to another node.
    SessionTaken(Takeover),
    /// Another node let go of the session this node's takeover `request` asked for.
    SessionReleased(u64),
}

impl Event {
    /// What broker record `r` is for node `node`: nothing when it is an answer to another
    /// node.
    fn for_node(r: BrokerRecord, node: &str) -> Option<Self> {
        match r {
            BrokerRecord::Publish(p) => Some(Event::Publish(p)),
            BrokerRecord::RpcRequest(r) => Some(Event::RpcRequest(r)),
            BrokerRecord::RpcDelivered { to, request } => (to == node).then_some(Event::RpcDelivered(request)),
            BrokerRecord::RpcReply { to, request, payload } => {
                (to == node).then_some(Event::RpcReply(request, payload))
            }
            BrokerRecord::SessionTaken(t) => Some(Event::SessionTaken(t)),
            BrokerRecord::SessionReleased { to, request } => (to == node).then_some(Event::SessionReleased(request)),
        }
    }
}

/// The origin header of this node's records.
pub(crate) fn origin_headers(node_id: &str) -> OwnedHeaders {
    OwnedHeaders::new().insert(Header { key: ORIGIN, value: Some(node_id) })
}

fn origin_of<'a>(m: &'a BorrowedMessage<'_>) -> Option<&'a [u8]> {
    m.headers()?.iter().find(|h| h.key == ORIGIN).and_then(|h| h.value)
}

/// This node's side of the bus: it produces client publishes and follows other nodes'.
pub struct Bus {
    producer: FutureProducer<crate::Quiet>,
    settings: KafkaSettings,
    /// The follower's position: by topic and partition, the next offset it has not handled
    /// yet.
    followed: Arc<Mutex<HashMap<String, HashMap<i32, i64>>>>,
}

impl Bus {
    /// A producer to the broker topic (which must exist: [`crate::ensure_topic`]).
    pub fn new(s: &KafkaSettings) -> Result<Arc<Self>, KafkaError> {
        let producer = crate::producer(s, "bus")?;
        Ok(Arc::new(Self { producer, settings: s.clone(), followed: Arc::default() }))
    }

    /// The Kafka settings it was made with.
    pub fn settings(&self) -> &KafkaSettings {
        &self.settings
    }

    /// This node's id (the `reply_to` of its RPC requests).
    pub fn node_id(&self) -> &str {
        &self.settings.node_id
    }

    /// Puts client `from`'s publish on the bus now (keyed by the client, so its messages
    /// keep their order); the future resolves once Kafka acknowledged it. `Err` at once when
    /// the producer's queue is full.
    pub fn publish(
        &self,
        from: &str,
        retain: bool,
        message: &[u8],
    ) -> Result<impl Future<Output = Result<(), StoreError>> + Send + 'static, StoreError> {
        self.send_encoded(from.as_bytes(), &encode_publish(from, retain, message))
    }

    /// Puts `record` on the broker topic now, under `key` (records of one key keep their
    /// order); the future resolves once Kafka acknowledged it. RPC requests are keyed by
    /// device, answers by the node they are for.
    pub fn send(
        &self,
        key: &[u8],
        record: &BrokerRecord,
    ) -> Result<impl Future<Output = Result<(), StoreError>> + Send + 'static, StoreError> {
        self.send_encoded(key, &record.encode())
    }

    fn send_encoded(
        &self,
        key: &[u8],
        payload: &[u8],
    ) -> Result<impl Future<Output = Result<(), StoreError>> + Send + 'static, StoreError> {
        let topic = self.settings.broker_topic();
        let rec = FutureRecord::to(&topic).key(key).payload(payload).headers(origin_headers(&self.settings.node_id));
        let delivery = self
            .producer
            .send_result(rec)
            .map_err(|(e, _)| StoreError::Queue(format!("kafka did not take the message: {e}")))?;
        Ok(async move {
            match delivery.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((e, _))) => Err(StoreError::Queue(format!("kafka did not acknowledge the message: {e}"))),
                Err(_) => Err(StoreError::Queue("kafka producer closed".into())),
            }
        })
    }

    /// Follows both topics from their ends as they are now, handing every record another
    /// node produced (and answers addressed to this node) to `handle`, one at a time, until
    /// the task is aborted. Blocks while it reads the end offsets (so that everything
    /// produced after it returns is seen): through a partition leader's failover, but no
    /// longer than [`FOLLOW_PATIENCE`].
    pub fn follow<F, Fut>(&self, handle: F) -> Result<JoinHandle<()>, KafkaError>
    where
        F: Fn(Event) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let s = &self.settings;
        let consumer: StreamConsumer<crate::Quiet> = s
            .client("follow")
            .set("group.id", format!("{}live-{}", s.topic_prefix, s.node_id))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create_with_context(crate::Quiet)?;
        let mut tpl = TopicPartitionList::new();
        // Each call is bounded by `timeout` and tried again until FOLLOW_PATIENCE has passed:
        // a topic just made may show no partitions, or partitions without a leader, for a
        // moment; and the end offset of a partition whose leader just died is asked of that
        // broker (each call waits for it to its timeout) until Kafka has fenced it and moved
        // the leadership (after `broker.session.timeout.ms`, 9 s by default). With one 10 s
        // call and a 10 s deadline, a node started in that window failed to start.
        let timeout = Duration::from_secs(2);
        let deadline = std::time::Instant::now() + FOLLOW_PATIENCE;
        let retry = |e: rdkafka::error::KafkaError| -> Result<(), KafkaError> {
            if std::time::Instant::now() >= deadline {
                return Err(e.into());
            }
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        };
        for topic in [s.topic(), s.broker_topic()] {
            let partitions = loop {
                let md = match consumer.fetch_metadata(Some(&topic), timeout) {
                    Ok(md) => md,
                    Err(e) => {
                        retry(e)?;
                        continue;
                    }
                };
                let found: Vec<i32> = md
                    .topics()
                    .iter()
                    .filter(|t| t.name() == topic)
                    .flat_map(|t| t.partitions())
                    .map(|p| p.id())
                    .collect();
                if !found.is_empty() {
                    break found;
                }
                retry(rdkafka::error::KafkaError::MetadataFetch(
                    rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition,
                ))?;
            };
            for p in partitions {
                let high = loop {
                    match consumer.fetch_watermarks(&topic, p, timeout) {
                        Ok((_, high)) => break high,
                        Err(e) => retry(e)?,
                    }
                };
                tpl.add_partition_offset(&topic, p, Offset::Offset(high))?;
                self.followed.lock().entry(topic.clone()).or_default().insert(p, high);
            }
        }
        consumer.assign(&tpl)?;
        let (node, data_topic, broker_topic) = (s.node_id.clone(), s.topic(), s.broker_topic());
        let followed = self.followed.clone();
        Ok(tokio::spawn(async move {
            loop {
                let (event, data, partition, next) = {
                    let m = crate::next_message(&consumer).await;
                    let data = m.topic() == data_topic;
                    let event = if origin_of(&m) == Some(node.as_bytes()) {
                        None
                    } else {
                        let payload = m.payload().unwrap_or_default();
                        let event = if data {
                            record::decode(payload).map(|op| Some(Event::Data(op)))
                        } else {
                            BrokerRecord::decode(payload).map(|r| Event::for_node(r, &node))
                        };
                        event.unwrap_or_else(|e| {
                            tracing::warn!(topic = m.topic(), offset = m.offset(), error = %e, "bus record does not decode: skipped");
                            None
                        })
                    };
                    (event, data, m.partition(), m.offset() + 1)
                };
                if let Some(event) = event {
                    handle(event).await;
                }
                let topic = if data { &data_topic } else { &broker_topic };
                if let Some(at) = followed.lock().get_mut(topic).and_then(|t| t.get_mut(&partition)) {
                    *at = next;
                }
            }
        }))
    }

    /// The end offsets of both followed topics, as they are now (blocks).
    pub fn ends(&self) -> Result<Ends, KafkaError> {
        let timeout = Duration::from_secs(5);
        let client = self.producer.client();
        let mut ends = Vec::new();
        for topic in [self.settings.topic(), self.settings.broker_topic()] {
            let md = client.fetch_metadata(Some(&topic), timeout)?;
            for p in md.topics().iter().filter(|t| t.name() == topic).flat_map(|t| t.partitions()) {
                let (_, high) = client.fetch_watermarks(&topic, p.id(), timeout)?;
                ends.push((topic.clone(), p.id(), high));
            }
        }
        Ok(ends)
    }

    /// Whether the follower has handled every record before `ends` ([`Bus::ends`]).
    pub fn followed_past(&self, ends: &Ends) -> bool {
        let followed = self.followed.lock();
        ends.iter().all(|(topic, p, end)| followed.get(topic).and_then(|t| t.get(p)).is_some_and(|at| at >= end))
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.producer.flush(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let device = DeviceId::from_bytes([7; 16]);
        let records = [
            BrokerRecord::Publish(Publish { from: "app-1".into(), retain: true, message: b"\x01\x02stored".to_vec() }),
            BrokerRecord::Publish(Publish { from: String::new(), retain: false, message: Vec::new() }),
            BrokerRecord::RpcRequest(RpcRequest {
                reply_to: "node-b".into(),
                request: 300,
                device,
                timeout_ms: 10_000,
                body: br#"{"method":"reboot","params":{}}"#.to_vec(),
            }),
            BrokerRecord::RpcDelivered { to: "node-b".into(), request: 1 << 40 },
            BrokerRecord::RpcReply { to: "node-b".into(), request: 300, payload: b"{}".to_vec() },
            BrokerRecord::SessionTaken(Takeover {
                client: "app-1".into(),
                by: "node-b".into(),
                home: "node-a".into(),
                request: 9,
            }),
            BrokerRecord::SessionReleased { to: "node-b".into(), request: 9 },
        ];
        for rec in records {
            let bytes = rec.encode();
            assert_eq!(BrokerRecord::decode(&bytes).unwrap(), rec);
            // Every cut before the opaque tail fails (the tails are the rest of the record).
            let fixed = match &rec {
                BrokerRecord::Publish(p) => 4 + p.from.len(),
                BrokerRecord::RpcRequest(_) => 2 + 1 + 6 + 2 + 16 + 2,
                BrokerRecord::RpcReply { .. } => 2 + 1 + 6 + 2,
                _ => bytes.len(),
            };
            for cut in 0..fixed.min(bytes.len()) {
                assert!(BrokerRecord::decode(&bytes[..cut]).is_err(), "{rec:?} cut at {cut}");
            }
        }
        let mut bad =
            BrokerRecord::Publish(Publish { from: "a".into(), retain: true, message: b"m".to_vec() }).encode();
        bad[2] = 7;
        assert!(BrokerRecord::decode(&bad).is_err(), "retain flag 7");
        bad[1] = 9;
        assert!(BrokerRecord::decode(&bad).is_err(), "kind 9");
        assert!(BrokerRecord::decode(&[]).is_err());
    }

    #[test]
    fn answers_reach_only_the_node_they_are_for() {
        let delivered = || BrokerRecord::RpcDelivered { to: "node-b".into(), request: 5 };
        assert!(matches!(Event::for_node(delivered(), "node-b"), Some(Event::RpcDelivered(5))));
        assert!(Event::for_node(delivered(), "node-a").is_none());
        let reply = || BrokerRecord::RpcReply { to: "node-b".into(), request: 5, payload: b"ok".to_vec() };
        assert!(matches!(Event::for_node(reply(), "node-b"), Some(Event::RpcReply(5, p)) if p == b"ok"));
        assert!(Event::for_node(reply(), "node-c").is_none());
    }
}
