//! The consumer side: a member of the storage writers' consumer group. It takes what is
//! ready (up to a batch), writes it to the store in one group commit, and only then commits
//! the offsets. A write that fails for a passing reason (overload, disk full, a reopen) is
//! retried until it succeeds: consumption stops meanwhile, nothing is skipped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use gridlinks_storage::{StoreError, WriteOp, WriterHandle};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use crate::{record, KafkaError, KafkaSettings};

/// Most records written in one group commit.
const MAX_BATCH: usize = 4096;

/// Where the storage writer puts what it consumes: the embedded store's writer, or a
/// shared database for the time series (and the embedded writer for the rest).
pub trait Sink: Send + Sync + 'static {
    /// Writes the operations, durably: each one's result, or one error for all of them.
    fn write(&self, ops: Vec<WriteOp>) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send;
}

impl Sink for WriterHandle {
    async fn write(&self, ops: Vec<WriteOp>) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        Ok(self.submit_batch(ops).await?.into_iter().map(|r| r.map(drop)).collect())
    }
}

/// The storage writer of this node.
pub struct StorageWriter;

impl StorageWriter {
    /// Joins the storage writers' group and writes what it consumes through `store`,
    /// until the task is aborted (offsets of an unfinished batch are not committed, so the
    /// next member writes it again).
    pub fn spawn(s: &KafkaSettings, store: impl Sink) -> Result<JoinHandle<()>, KafkaError> {
        let consumer: StreamConsumer<crate::Quiet> = s
            .client("storage")
            .set("group.id", s.group())
            // Static membership: a node that restarts takes its partitions back at once
            // instead of waiting for its old self's session to time out.
            .set("group.instance.id", format!("gridlinks-{}", s.node_id))
            // A node that is gone for good hands its partitions over after this long.
            .set("session.timeout.ms", "10000")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .create_with_context(crate::Quiet)?;
        let topic = s.topic();
        consumer.subscribe(&[&topic])?;
        let consumer = Arc::new(consumer);
        Ok(tokio::spawn(async move {
            loop {
                let batch = next_batch(&consumer).await;
                write(&store, &batch).await;
                commit(&consumer, &topic, &batch);
            }
        }))
    }
}

/// The next message (waiting for it), then whatever else is ready, up to [`MAX_BATCH`].
async fn next_batch(consumer: &StreamConsumer<crate::Quiet>) -> Vec<OwnedMessage> {
    let mut batch = vec![crate::next_message(consumer).await.detach()];
    while batch.len() < MAX_BATCH {
        match tokio::time::timeout(Duration::ZERO, consumer.recv()).await {
            Ok(Ok(m)) => batch.push(m.detach()),
            _ => break,
        }
    }
    batch
}

/// Whether a failed write may succeed later (and so must be retried, not skipped).
fn passing(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Overloaded
            | StoreError::Unavailable
            | StoreError::Closed
            | StoreError::DiskFull(_)
            | StoreError::Db(_)
            | StoreError::CommitFailed(_)
            | StoreError::Queue(_)
            | StoreError::Database(_)
    )
}

/// Writes the batch's records, retrying (with backoff) while the store fails for a passing
/// reason. A record that cannot be decoded, or that the store refuses for good (its device
/// deleted since, a key limit), is logged and left out.
async fn write(store: &impl Sink, batch: &[OwnedMessage]) {
    let mut delay = Duration::from_millis(50);
    loop {
        let ops: Vec<WriteOp> = batch
            .iter()
            .filter_map(|m| match m.payload().map(record::decode) {
                Some(Ok(op)) => Some(op),
                other => {
                    tracing::error!(partition = m.partition(), offset = m.offset(), error = ?other.map(|r| r.err()),
                        "kafka record does not decode: skipped");
                    None
                }
            })
            .collect();
        let failure = match store.write(ops).await {
            Ok(results) => {
                let mut retry = None;
                for e in results.into_iter().filter_map(Result::err) {
                    if passing(&e) {
                        retry = Some(e);
                    } else {
                        tracing::warn!(error = %e, "kafka record refused by the store: skipped");
                    }
                }
                match retry {
                    None => return,
                    Some(e) => e,
                }
            }
            Err(e) => e,
        };
        tracing::warn!(error = %failure, retry_in_ms = delay.as_millis() as u64, "storage writer: write failed");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Commits the offsets after the batch (asynchronously: a lost commit only means the
/// batch is written again).
fn commit(consumer: &StreamConsumer<crate::Quiet>, topic: &str, batch: &[OwnedMessage]) {
    let mut next: HashMap<i32, i64> = HashMap::new();
    for m in batch {
        let e = next.entry(m.partition()).or_insert(0);
        *e = (*e).max(m.offset() + 1);
    }
    let mut tpl = TopicPartitionList::new();
    for (p, o) in next {
        if let Err(e) = tpl.add_partition_offset(topic, p, Offset::Offset(o)) {
            tracing::warn!(error = %e, "kafka: offset list");
        }
    }
    if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
        tracing::warn!(error = %e, "kafka: offset commit failed; the batch will be written again");
    }
}
