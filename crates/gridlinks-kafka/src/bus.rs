//! Live delivery across nodes, through Kafka as TBMQ does it (no node-to-node calls): MQTT
//! client publishes go to the broker topic, and every node follows that topic and the
//! device-data topic from their ends, handing what *other* nodes produced to its own
//! subscribers (MQTT sessions, WebSocket sessions). Each record names the node that
//! produced it in its `origin` header, so a node skips its own (it delivered them itself).
//!
//! ```text
//! broker record := FORMAT(1) KIND_PUBLISH(1) retain(1) from(text) message(the rest)
//! ```
//! `message` is the stored form of an MQTT message (`gridlinks_broker::persist`), opaque
//! here.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gridlinks_storage::codec::{Reader, Writer};
use gridlinks_storage::{StoreError, WriteOp};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use crate::{record, KafkaError, KafkaSettings};

const KIND_PUBLISH: u8 = 1;
/// The header naming the node that produced a record.
pub const ORIGIN: &str = "origin";

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

/// Encodes a publish record.
pub fn encode_publish(from: &str, retain: bool, message: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&[KIND_PUBLISH, u8::from(retain)]).text(from).bytes(message);
    w.finish()
}

/// Decodes a publish record.
pub fn decode_publish(buf: &[u8]) -> Result<Publish, StoreError> {
    let mut r = Reader::new(buf)?;
    if r.byte()? != KIND_PUBLISH {
        return Err(StoreError::Corrupt("broker record kind"));
    }
    let retain = match r.byte()? {
        0 => false,
        1 => true,
        _ => return Err(StoreError::Corrupt("retain flag")),
    };
    let from = r.text()?.to_owned();
    let message = r.bytes(r.remaining())?.to_vec();
    Ok(Publish { from, retain, message })
}

/// What another node produced.
#[derive(Debug)]
pub enum Event {
    /// Device data it acknowledged (telemetry or attributes).
    Data(WriteOp),
    /// A client's publish it took.
    Publish(Publish),
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
}

impl Bus {
    /// A producer to the broker topic (which must exist: [`crate::ensure_topic`]).
    pub fn new(s: &KafkaSettings) -> Result<Arc<Self>, KafkaError> {
        let producer = crate::producer(s, "bus")?;
        Ok(Arc::new(Self { producer, settings: s.clone() }))
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
        let payload = encode_publish(from, retain, message);
        let topic = self.settings.broker_topic();
        let rec = FutureRecord::to(&topic)
            .key(from.as_bytes())
            .payload(&payload[..])
            .headers(origin_headers(&self.settings.node_id));
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
    /// node produced to `handle`, one at a time, until the task is aborted. Blocks while it
    /// reads the end offsets (so that everything produced after it returns is seen).
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
        let timeout = Duration::from_secs(10);
        // A topic just made may show no partitions, or partitions without a leader, for a
        // moment: tried again until `timeout`.
        let deadline = std::time::Instant::now() + timeout;
        let retry = |e: rdkafka::error::KafkaError| -> Result<(), KafkaError> {
            if std::time::Instant::now() >= deadline {
                return Err(e.into());
            }
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        };
        for topic in [s.topic(), s.broker_topic()] {
            let partitions = loop {
                let md = consumer.fetch_metadata(Some(&topic), timeout)?;
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
            }
        }
        consumer.assign(&tpl)?;
        let (node, data_topic) = (s.node_id.clone(), s.topic());
        Ok(tokio::spawn(async move {
            loop {
                let event = {
                    let m = crate::next_message(&consumer).await;
                    if origin_of(&m) == Some(node.as_bytes()) {
                        continue;
                    }
                    let payload = m.payload().unwrap_or_default();
                    let event = if m.topic() == data_topic {
                        record::decode(payload).map(Event::Data)
                    } else {
                        decode_publish(payload).map(Event::Publish)
                    };
                    match event {
                        Ok(e) => e,
                        Err(e) => {
                            tracing::warn!(topic = m.topic(), offset = m.offset(), error = %e, "bus record does not decode: skipped");
                            continue;
                        }
                    }
                };
                handle(event).await;
            }
        }))
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
    fn publishes_round_trip_and_garbage_is_refused() {
        for (from, retain, message) in [("app-1", true, &b"\x01\x02stored"[..]), ("", false, &b""[..])] {
            let bytes = encode_publish(from, retain, message);
            let p = decode_publish(&bytes).unwrap();
            assert_eq!(p, Publish { from: from.into(), retain, message: message.to_vec() });
            for cut in 0..bytes.len().min(4 + from.len()) {
                assert!(decode_publish(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let mut bad = encode_publish("a", true, b"m");
        bad[2] = 7;
        assert!(decode_publish(&bad).is_err());
        assert!(decode_publish(&[]).is_err());
    }
}
