//! Shared subscriptions across nodes (`$share/{group}/{filter}`): each group has a Kafka
//! consumer group of its own over the broker topic (and the device-data topic when the
//! filter can match the canonical telemetry topics). Every node with a member of the group
//! runs one [`ShareConsumer`] for it, and Kafka gives each partition to one of them, so each
//! message reaches one node and, there, one member: never one per node.
//!
//! Offsets are committed after a message was handed to a member (its durable copy
//! committed), every second and when partitions move; a node that dies mid-way leaves its
//! uncommitted messages to the next owner (at least once). A partition starts at the
//! group's committed offset when the group was alive recently (a commit younger than
//! [`STALE`], carried in the commit's metadata); otherwise at the first message produced
//! since this node's consumer started, less [`START_MARGIN`]: a group that had no member
//! anywhere gets nothing from before it formed again, as MQTT has it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};

use crate::bus::{BrokerRecord, Event};
use crate::{record, KafkaError, KafkaSettings};

/// How often handed-over offsets are committed.
const COMMIT_EVERY: Duration = Duration::from_secs(1);
/// A group whose last commit is older than this had no member anywhere meanwhile (members
/// commit every [`COMMIT_EVERY`]; a node that died hands its partitions over after the
/// 10 s session timeout): its partitions start afresh.
const STALE: Duration = Duration::from_secs(60);
/// Messages produced this long before a node's consumer started still reach a fresh group
/// (a message published just before its first SUBACK; clocks of nodes differ a little).
const START_MARGIN: Duration = Duration::from_secs(1);
/// Bound on each call to Kafka made while partitions move.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the handler did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Handed to a member (or not for this group at all): its offset may be committed.
    Done,
    /// Not handled here (no member left on this node, or its copy could not be stored):
    /// the consumer leaves the group and another member's node takes it from the last
    /// commit.
    NotHere,
}

/// The Kafka consumer group of shared group `group`.
pub fn group_id(prefix: &str, group: &str) -> String {
    // FNV-1a: the same on every node and every build (the group id must be).
    let hash = group.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let readable: String =
        group.chars().take(40).map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    format!("{prefix}share-{readable}-{hash:016x}")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `call`, tried again (up to 3 times, a moment apart) while it fails.
fn retried<T>(mut call: impl FnMut() -> KafkaResult<T>) -> KafkaResult<T> {
    let mut tries = 0;
    loop {
        match call() {
            Err(e) if tries < 2 => {
                tracing::debug!(error = %e, "shared group: trying again");
                tries += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            done => return done,
        }
    }
}

/// The consumer's callbacks: where partitions start, and the offsets handed over.
struct ShareContext {
    /// Where a partition without a recent commit starts: messages produced since (ms).
    start_ms: i64,
    /// The next offset of each assigned partition: what to commit.
    next: Mutex<HashMap<(String, i32), i64>>,
}

impl ClientContext for ShareContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::Quiet.log(level, fac, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::Quiet.error(error, reason);
    }
}

impl ConsumerContext for ShareContext {
    fn rebalance(&self, c: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let done = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => c.assign(&self.starts(c, tpl)),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                tracing::debug!(next = ?*self.next.lock(), "shared group: partitions revoked");
                // What was handed over stays handed over: the next owner starts after it.
                if let Err(e) = self.commit(c, CommitMode::Sync) {
                    tracing::debug!(error = %e, "shared group: commit before giving partitions up");
                }
                self.next.lock().clear();
                c.unassign()
            }
            other => {
                tracing::debug!(error = ?other, "shared group: rebalance failed");
                self.next.lock().clear();
                c.unassign()
            }
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "shared group: partitions not taken");
        }
    }
}

impl ShareContext {
    /// Where each assigned partition starts: the group's commit when it is recent, else
    /// the first message since `start_ms` (the end when there is none). Kafka's answers are
    /// waited for (a partition must not start late: what it skipped would be lost to the
    /// group); a partition whose start stays unknown is not taken, and the group's next
    /// rebalance gives it out again.
    fn starts(&self, c: &BaseConsumer<Self>, tpl: &TopicPartitionList) -> TopicPartitionList {
        let now = now_ms();
        let stale = i64::try_from(STALE.as_millis()).unwrap_or(i64::MAX);
        let mut starts = Vec::new();
        let mut fresh = TopicPartitionList::new();
        match retried(|| c.committed_offsets(tpl.clone(), CALL_TIMEOUT)) {
            Ok(committed) => {
                for e in committed.elements() {
                    let recent = e.metadata().parse::<i64>().is_ok_and(|at| now - at < stale);
                    match e.offset() {
                        Offset::Offset(o) if recent => starts.push((e.topic().to_owned(), e.partition(), o)),
                        _ => {
                            let _ = fresh.add_partition_offset(e.topic(), e.partition(), Offset::Offset(self.start_ms));
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "shared group: committed offsets unknown; partitions not taken"),
        }
        if fresh.count() > 0 {
            // The ends first: a message produced after them is at or past them, so a
            // partition with no message since `start_ms` starts there (read after the
            // search, a message produced in between would be skipped).
            let mut ends = HashMap::new();
            for e in fresh.elements() {
                match retried(|| c.fetch_watermarks(e.topic(), e.partition(), CALL_TIMEOUT)) {
                    Ok((_, high)) => {
                        ends.insert((e.topic().to_owned(), e.partition()), high);
                    }
                    Err(err) => tracing::warn!(error = %err, "shared group: end offset unknown; partition not taken"),
                }
            }
            match retried(|| c.offsets_for_times(fresh.clone(), CALL_TIMEOUT)) {
                Ok(found) => {
                    for e in found.elements() {
                        let key = (e.topic().to_owned(), e.partition());
                        let at = match (e.offset(), ends.get(&key)) {
                            (Offset::Offset(o), Some(_)) if o >= 0 && e.error().is_ok() => o,
                            (_, Some(end)) => *end,
                            (_, None) => continue,
                        };
                        starts.push((key.0, key.1, at));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "shared group: offsets by time unknown; partitions not taken"),
            }
        }
        tracing::debug!(?starts, "shared group: partitions assigned");
        let mut out = TopicPartitionList::new();
        let mut next = self.next.lock();
        next.clear();
        for (topic, partition, at) in starts {
            let _ = out.add_partition_offset(&topic, partition, Offset::Offset(at));
            next.insert((topic, partition), at);
        }
        out
    }

    /// Commits the next offset of every assigned partition, with the time as metadata (so
    /// that the next owner knows the group was alive).
    fn commit(&self, c: &BaseConsumer<Self>, mode: CommitMode) -> KafkaResult<()> {
        let next = self.next.lock();
        if next.is_empty() {
            return Ok(());
        }
        let now = now_ms().to_string();
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), at) in next.iter() {
            let mut e = tpl.add_partition(topic, *partition);
            e.set_offset(Offset::Offset(*at))?;
            e.set_metadata(now.as_str());
        }
        drop(next);
        c.commit(&tpl, mode)
    }
}

/// One node's member of a shared group's consumer group, on a thread of its own (calls to
/// Kafka while partitions move block). Stopped (leaving the group, its offsets committed)
/// by [`ShareConsumer::stop`] or when dropped.
pub struct ShareConsumer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ShareConsumer {
    /// Joins the consumer group of shared group `group` and hands `handle` every client
    /// publish (and, with `data_too`, every device-data record) of its partitions, one at a
    /// time, including this node's own. [`Handled::NotHere`] ends it.
    pub fn start<F>(s: &KafkaSettings, group: &str, data_too: bool, mut handle: F) -> Result<Self, KafkaError>
    where
        F: FnMut(Event) -> Handled + Send + 'static,
    {
        let start = Duration::from_millis(u64::try_from(now_ms()).unwrap_or(0)).saturating_sub(START_MARGIN);
        let context = ShareContext { start_ms: i64::try_from(start.as_millis()).unwrap_or(0), next: Mutex::default() };
        let consumer: BaseConsumer<ShareContext> = s
            .client("share")
            .set("group.id", group_id(&s.topic_prefix, group))
            .set("session.timeout.ms", "10000")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create_with_context(context)?;
        let (data_topic, broker_topic) = (s.topic(), s.broker_topic());
        let topics: Vec<&str> = if data_too { vec![&data_topic, &broker_topic] } else { vec![&broker_topic] };
        consumer.subscribe(&topics)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let name = group.to_owned();
        let thread = std::thread::Builder::new()
            .name("gridlinks-share".into())
            .spawn(move || {
                let mut committed = Instant::now();
                while !stopping.load(Ordering::Acquire) {
                    if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                        match m {
                            Ok(m) => {
                                let handled = match event(&m, &data_topic) {
                                    Some(e) => handle(e),
                                    None => Handled::Done,
                                };
                                if handled == Handled::NotHere {
                                    tracing::debug!(group = %name, "shared group: no member here, leaving");
                                    break;
                                }
                                let key = (m.topic().to_owned(), m.partition());
                                consumer.context().next.lock().insert(key, m.offset() + 1);
                            }
                            Err(e) => tracing::debug!(error = %e, "shared group consumer"),
                        }
                    }
                    if committed.elapsed() >= COMMIT_EVERY {
                        if let Err(e) = consumer.context().commit(&consumer, CommitMode::Async) {
                            tracing::debug!(error = %e, "shared group: commit");
                        }
                        committed = Instant::now();
                    }
                }
                if let Err(e) = consumer.context().commit(&consumer, CommitMode::Sync) {
                    tracing::debug!(error = %e, "shared group: last commit");
                }
                // Dropping the consumer leaves the group: its partitions go to the others.
            })
            .map_err(|e| KafkaError::Thread(e.to_string()))?;
        Ok(Self { stop, thread: Some(thread) })
    }

    /// Whether it still runs (it ends by itself on [`Handled::NotHere`]).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Leaves the group, committing what was handed over; waits for the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ShareConsumer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// What a record of either topic is for a shared group: device data, or a client publish;
/// `None` for anything else (RPC records) or what does not decode.
fn event(m: &BorrowedMessage<'_>, data_topic: &str) -> Option<Event> {
    let payload = m.payload().unwrap_or_default();
    let decoded = if m.topic() == data_topic {
        record::decode(payload).map(|op| Some(Event::Data(op)))
    } else {
        BrokerRecord::decode(payload).map(|r| match r {
            BrokerRecord::Publish(p) => Some(Event::Publish(p)),
            _ => None,
        })
    };
    decoded.unwrap_or_else(|e| {
        tracing::warn!(topic = m.topic(), offset = m.offset(), error = %e, "record does not decode: skipped");
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_are_stable_and_readable() {
        let id = group_id("gl.", "$share/workers/jobs/+");
        assert_eq!(id, group_id("gl.", "$share/workers/jobs/+"));
        assert!(id.starts_with("gl.share-_share_workers_jobs__-"), "{id}");
        assert_ne!(id, group_id("gl.", "$share/workers/jobs/#"));
        let long = "$share/g/".to_owned() + &"x".repeat(500);
        assert!(group_id("", &long).len() < 80);
    }
}
