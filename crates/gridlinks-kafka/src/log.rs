//! The producer side: device data goes to Kafka, everything else to the embedded writer.

use std::sync::Arc;

use futures_util::future::join_all;
use gridlinks_ingest::{BoxFuture, CommitLog};
use gridlinks_storage::{StoreError, WriteOp, WriteOutcome, WriterHandle};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::{record, KafkaError, KafkaSettings};

/// The commit log on Kafka. Telemetry and attribute writes and attribute deletes are
/// produced to the telemetry topic and answered once Kafka acknowledged them (`acks=all`);
/// other writes (devices, telemetry deletes, …) are this node's store's, committed by
/// `entities`.
pub struct KafkaLog {
    producer: FutureProducer<crate::Quiet>,
    /// Reads the storage writers' committed offsets (it joins no group).
    offsets: BaseConsumer<crate::Quiet>,
    topic: String,
    settings: KafkaSettings,
    entities: WriterHandle,
    check: Box<dyn Check>,
}

/// What the stores behind the log can hold, checked (and made room for) before a record
/// is produced: a write they would refuse is refused to its sender, never acknowledged
/// and then dropped by the storage writer.
pub trait Check: Send + Sync + 'static {
    /// `Err` refuses `op` before it reaches Kafka.
    fn check<'a>(&'a self, op: &'a WriteOp) -> BoxFuture<'a, Result<(), StoreError>>;
}

impl KafkaLog {
    /// A producer for `s`; the topic must exist ([`crate::ensure_topic`]). Each write is
    /// checked by `check` before it is produced.
    pub fn new(s: &KafkaSettings, entities: WriterHandle, check: Box<dyn Check>) -> Result<Arc<Self>, KafkaError> {
        let producer = crate::producer(s, "producer")?;
        let offsets: BaseConsumer<crate::Quiet> = s
            .client("lag")
            .set("group.id", s.group())
            .set("enable.auto.commit", "false")
            .create_with_context(crate::Quiet)?;
        Ok(Arc::new(Self { producer, offsets, topic: s.topic(), settings: s.clone(), entities, check }))
    }

    /// Whether Kafka can take writes now: the topic's metadata answers within `timeout`,
    /// and every partition has a leader and at least `min.insync.replicas` replicas in
    /// sync (fewer, and `acks=all` produces fail). Blocks; the reason when it cannot.
    pub fn probe(&self, timeout: std::time::Duration) -> Result<(), String> {
        let md = self.producer.client().fetch_metadata(Some(&self.topic), timeout).map_err(|e| e.to_string())?;
        let topic = md.topics().iter().find(|t| t.name() == self.topic).ok_or("the topic is missing")?;
        if let Some(e) = topic.error() {
            return Err(format!("topic {}: {}", self.topic, rdkafka::error::RDKafkaErrorCode::from(e)));
        }
        if topic.partitions().is_empty() {
            return Err(format!("topic {} has no partitions", self.topic));
        }
        let min_isr = usize::from(self.settings.min_insync_replicas);
        for p in topic.partitions() {
            if p.leader() < 0 {
                return Err(format!("partition {} of {} has no leader", p.id(), self.topic));
            }
            if p.isr().len() < min_isr {
                return Err(format!(
                    "partition {} of {} has {} replicas in sync, fewer than min.insync.replicas ({min_isr})",
                    p.id(),
                    self.topic,
                    p.isr().len()
                ));
            }
        }
        Ok(())
    }

    /// Records in the topic that the storage writers have not stored yet (the consumer
    /// group's lag: each partition's end offset less its committed offset). Blocks.
    pub fn lag(&self, timeout: std::time::Duration) -> Result<u64, String> {
        let md = self.offsets.fetch_metadata(Some(&self.topic), timeout).map_err(|e| e.to_string())?;
        let topic = md.topics().iter().find(|t| t.name() == self.topic).ok_or("the topic is missing")?;
        let mut tpl = TopicPartitionList::new();
        for p in topic.partitions() {
            tpl.add_partition(&self.topic, p.id());
        }
        let committed = self.offsets.committed_offsets(tpl, timeout).map_err(|e| e.to_string())?;
        let mut lag = 0u64;
        for e in committed.elements() {
            let (low, high) =
                self.offsets.fetch_watermarks(&self.topic, e.partition(), timeout).map_err(|e| e.to_string())?;
            let done = match e.offset() {
                Offset::Offset(o) => o.max(low),
                _ => low,
            };
            lag += u64::try_from(high - done).unwrap_or(0);
        }
        Ok(lag)
    }

    async fn produce(&self, op: &WriteOp) -> Result<WriteOutcome, StoreError> {
        let (Some(device), Some(payload)) = (record::device_of(op), record::encode(op)) else {
            return Err(StoreError::Corrupt("not a device-data write"));
        };
        self.check.check(op).await?;
        let key = record::key(device);
        let rec = FutureRecord::to(&self.topic)
            .key(&key[..])
            .payload(&payload[..])
            .headers(crate::bus::origin_headers(&self.settings.node_id));
        // Waits for queue space up to the produce timeout: backpressure, not a drop.
        match self.producer.send(rec, self.settings.produce_timeout).await {
            Ok(_) => Ok(WriteOutcome::Done),
            Err((e, _)) => Err(StoreError::Queue(format!("kafka did not acknowledge the write: {e}"))),
        }
    }
}

impl CommitLog for KafkaLog {
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'_, Result<Vec<Result<WriteOutcome, StoreError>>, StoreError>> {
        Box::pin(async move {
            if ops.iter().all(|op| record::device_of(op).is_none()) {
                return self.entities.submit_batch(ops).await;
            }
            if ops.iter().any(|op| record::device_of(op).is_none()) {
                // Not made by the ingest path today; answered one by one if it ever is.
                let mut out = Vec::with_capacity(ops.len());
                for op in ops {
                    out.push(match record::device_of(&op) {
                        Some(_) => self.produce(&op).await,
                        None => self.entities.submit(op).await,
                    });
                }
                return Ok(out);
            }
            Ok(join_all(ops.iter().map(|op| self.produce(op))).await)
        })
    }
}

impl Drop for KafkaLog {
    fn drop(&mut self) {
        // Whatever is in flight was not acknowledged to anyone yet; give it a moment.
        let _ = self.producer.flush(std::time::Duration::from_secs(5));
    }
}
