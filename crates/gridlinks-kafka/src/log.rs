//! The producer side: device data goes to Kafka, everything else to the embedded writer.

use std::sync::Arc;

use futures_util::future::join_all;
use gridlinks_ingest::{BoxFuture, CommitLog};
use gridlinks_storage::{StoreError, WriteOp, WriteOutcome, WriterHandle};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::{record, KafkaError, KafkaSettings};

/// The commit log on Kafka. Telemetry and attribute writes are produced to the telemetry
/// topic and answered once Kafka acknowledged them (`acks=all`); other writes (devices,
/// deletes, …) are this node's store's, committed by `entities`.
pub struct KafkaLog {
    producer: FutureProducer,
    topic: String,
    settings: KafkaSettings,
    entities: WriterHandle,
    check: Check,
}

/// What the stores behind the log can hold, checked before a record is produced: a write
/// they would refuse is refused to its sender, never acknowledged and then dropped.
pub type Check = fn(&WriteOp) -> Result<(), StoreError>;

impl KafkaLog {
    /// A producer for `s`; the topic must exist ([`crate::ensure_topic`]). Each write is
    /// checked by `check` before it is produced.
    pub fn new(s: &KafkaSettings, entities: WriterHandle, check: Check) -> Result<Arc<Self>, KafkaError> {
        let producer: FutureProducer = s
            .client("producer")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", s.produce_timeout.as_millis().to_string())
            // Records of concurrent requests share a produce request; a few ms of wait at
            // most, as the embedded group commit does.
            .set("linger.ms", "2")
            .set("compression.type", "lz4")
            .create()?;
        Ok(Arc::new(Self { producer, topic: s.topic(), settings: s.clone(), entities, check }))
    }

    async fn produce(&self, op: &WriteOp) -> Result<WriteOutcome, StoreError> {
        let (Some(device), Some(payload)) = (record::device_of(op), record::encode(op)) else {
            return Err(StoreError::Corrupt("not a device-data write"));
        };
        (self.check)(op)?;
        let key = record::key(device);
        let rec = FutureRecord::to(&self.topic).key(&key[..]).payload(&payload[..]);
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
