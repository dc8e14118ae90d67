//! The outbox: committed device data and alarm changes that data forwarding sends on.
//!
//! When an [`OutboxFilter`] is set, the writer copies each write the filter wants into the
//! `outbox` keyspace, **in the batch that commits it**: what was acknowledged is in the
//! outbox, what was not is not. Entries are keyed by a sequence number that only grows
//! (across restarts too), so readers ([`Store::outbox_read`]) see the commit order, which
//! is each device's order. After every group commit's sync the writer publishes the last
//! durable sequence number ([`Store::outbox_durable`]): a reader never sends on what a
//! crash could still take back.
//!
//! Readers keep their own cursors ([`Store::outbox_cursor`]); the owner of the outbox trims
//! what every reader has passed ([`Store::outbox_trim`]), and trims more when it holds more
//! entries than it may (readers that had not passed those then count them as dropped).
//! Trimming only ever removes from the front, and readers seek to their cursor, so the
//! removed keys are never scanned again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gridlinks_types::{AttributeScope, DeviceId, Ts, TsRecord};
use parking_lot::RwLock;
use tokio::sync::watch;

use crate::codec::{Reader, Writer};
use crate::{DocKind, Engine, Store, StoreError, WriteOp};

/// `meta` key of the first sequence number not trimmed (u64 BE).
const TAIL_KEY: &str = "outbox_tail";
/// `meta` key prefix of a reader's cursor (the last sequence number it is done with).
const CURSOR_PREFIX: &str = "outbox_cursor/";

/// Which committed writes go into the outbox (set by whoever forwards them).
pub trait OutboxFilter: Send + Sync + 'static {
    /// Whether `op`, once committed, is copied into the outbox. Called on the writer
    /// thread for every telemetry, attribute and alarm write: keep it cheap.
    fn wants(&self, op: &WriteOp) -> bool;
}

/// One outbox entry.
#[derive(Clone, Debug, PartialEq)]
pub enum OutboxEvent {
    /// Time series of one device.
    Telemetry {
        /// Whose.
        device: DeviceId,
        /// What.
        records: Vec<TsRecord>,
    },
    /// Attribute values of one device in one scope.
    Attributes {
        /// Whose.
        device: DeviceId,
        /// Which scope.
        scope: AttributeScope,
        /// What.
        values: Vec<(String, gridlinks_types::Value)>,
    },
    /// An alarm as written (created, or changed).
    Alarm {
        /// Its id.
        id: uuid::Uuid,
        /// Its type.
        title: String,
        /// The alarm document as written.
        doc: serde_json::Value,
    },
}

const TAG_TELEMETRY: u8 = 1;
const TAG_ATTRIBUTES: u8 = 2;
const TAG_ALARM: u8 = 3;

impl OutboxEvent {
    /// The event a write becomes in the outbox, if it is one the outbox carries.
    pub(crate) fn of(op: &WriteOp) -> Option<Self> {
        Some(match op {
            WriteOp::Telemetry { device, records } => Self::Telemetry { device: *device, records: records.to_vec() },
            WriteOp::Attributes { device, scope, values } => {
                Self::Attributes { device: *device, scope: *scope, values: values.clone() }
            }
            WriteOp::PutDoc { kind: DocKind::Alarm, id, title, doc } => {
                Self::Alarm { id: *id, title: title.clone(), doc: doc.clone() }
            }
            _ => return None,
        })
    }

    /// The stored form of this event written at `at`.
    pub fn encode(&self, at: Ts) -> Vec<u8> {
        let mut w = Writer::new();
        w.ts(at);
        match self {
            Self::Telemetry { device, records } => {
                w.bytes(&[TAG_TELEMETRY]).bytes(device.as_bytes()).varint(records.len() as u64);
                for r in records {
                    w.ts(r.ts).varint(r.values.len() as u64);
                    for (k, v) in &r.values {
                        w.text(k).value(v);
                    }
                }
            }
            Self::Attributes { device, scope, values } => {
                w.bytes(&[TAG_ATTRIBUTES, scope.tag()]).bytes(device.as_bytes()).varint(values.len() as u64);
                for (k, v) in values {
                    w.text(k).value(v);
                }
            }
            Self::Alarm { id, title, doc } => {
                w.bytes(&[TAG_ALARM]).bytes(id.as_bytes()).text(title).text(&doc.to_string());
            }
        }
        w.finish()
    }

    /// (written at, event) of a stored entry.
    pub fn decode(buf: &[u8]) -> Result<(Ts, Self), StoreError> {
        let mut r = Reader::new(buf)?;
        let at = r.ts()?;
        let uuid = |r: &mut Reader<'_>| -> Result<uuid::Uuid, StoreError> {
            uuid::Uuid::from_slice(r.bytes(16)?).map_err(|_| StoreError::Corrupt("outbox uuid"))
        };
        let event = match r.byte()? {
            TAG_TELEMETRY => {
                let device = DeviceId(uuid(&mut r)?);
                let n = r.varint()?;
                let mut records = Vec::new();
                for _ in 0..n {
                    let ts = r.ts()?;
                    let m = r.varint()?;
                    let mut values = Vec::new();
                    for _ in 0..m {
                        values.push((r.text()?.to_owned(), r.value()?));
                    }
                    records.push(TsRecord { ts, values });
                }
                Self::Telemetry { device, records }
            }
            TAG_ATTRIBUTES => {
                let scope = AttributeScope::from_tag(r.byte()?).ok_or(StoreError::Corrupt("outbox scope"))?;
                let device = DeviceId(uuid(&mut r)?);
                let n = r.varint()?;
                let mut values = Vec::new();
                for _ in 0..n {
                    values.push((r.text()?.to_owned(), r.value()?));
                }
                Self::Attributes { device, scope, values }
            }
            TAG_ALARM => {
                let id = uuid(&mut r)?;
                let title = r.text()?.to_owned();
                let doc = serde_json::from_str(r.text()?).map_err(|_| StoreError::Corrupt("outbox alarm"))?;
                Self::Alarm { id, title, doc }
            }
            _ => return Err(StoreError::Corrupt("outbox event tag")),
        };
        if !r.is_empty() {
            return Err(StoreError::Corrupt("outbox event length"));
        }
        Ok((at, event))
    }
}

/// One entry as read.
#[derive(Clone, Debug, PartialEq)]
pub struct OutboxEntry {
    /// Its sequence number.
    pub seq: u64,
    /// When it was committed (the writer's clock).
    pub at: Ts,
    /// What.
    pub event: OutboxEvent,
}

/// The outbox's state in memory (it outlives a reopened engine).
pub(crate) struct OutboxState {
    /// The sequence number the next entry gets.
    pub next: AtomicU64,
    /// The first sequence number not trimmed.
    tail: AtomicU64,
    /// The last sequence number made durable.
    durable: watch::Sender<u64>,
    pub filter: RwLock<Option<Arc<dyn OutboxFilter>>>,
}

impl OutboxState {
    /// Reads where the outbox of `engine` stands.
    pub(crate) fn load(engine: &Engine) -> Result<Self, StoreError> {
        let (tail, next) = bounds(engine)?;
        Ok(Self {
            next: AtomicU64::new(next),
            tail: AtomicU64::new(tail),
            durable: watch::Sender::new(next - 1),
            filter: RwLock::new(None),
        })
    }

    /// After the engine was opened again: sequence numbers go on from the larger of what
    /// this process gave out and what the disk holds.
    pub(crate) fn reload(&self, engine: &Engine) -> Result<(), StoreError> {
        let (_, next) = bounds(engine)?;
        self.next.fetch_max(next, Ordering::AcqRel);
        Ok(())
    }

    /// Called by the writer after a sync: everything given a number so far is durable.
    pub(crate) fn synced(&self) {
        let last = self.next.load(Ordering::Acquire) - 1;
        self.durable.send_if_modified(|d| {
            let moved = *d < last;
            *d = (*d).max(last);
            moved
        });
    }
}

/// (tail, next) of the outbox on disk.
fn bounds(engine: &Engine) -> Result<(u64, u64), StoreError> {
    let tail = match engine.ks.meta.get(TAIL_KEY)? {
        Some(v) => u64_of(&v)?,
        None => 1,
    };
    let next = match engine.ks.outbox.last_key_value() {
        Some(kv) => u64_of(&kv.key()?)? + 1,
        None => 1,
    };
    Ok((tail.max(1), next.max(tail).max(1)))
}

fn u64_of(b: &[u8]) -> Result<u64, StoreError> {
    <[u8; 8]>::try_from(b).map(u64::from_be_bytes).map_err(|_| StoreError::Corrupt("outbox sequence number"))
}

/// How an [`Store::outbox_trim`] went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// The first sequence number kept.
    pub tail: u64,
    /// Entries removed.
    pub removed: u64,
}

impl Store {
    /// Sets (or, with `None`, clears) what the writer copies into the outbox.
    pub fn set_outbox_filter(&self, filter: Option<Arc<dyn OutboxFilter>>) {
        *self.inner.outbox.filter.write() = filter;
    }

    /// Whether the outbox takes `op` once it is committed (what the writer asks for each
    /// write; for a write committed elsewhere, which then goes as [`WriteOp::Outbox`]).
    pub fn outbox_wants(&self, op: &WriteOp) -> bool {
        self.inner.outbox.filter.read().as_ref().is_some_and(|f| f.wants(op))
    }

    /// The last durable sequence number, changing after each sync that added entries.
    pub fn outbox_durable(&self) -> watch::Receiver<u64> {
        self.inner.outbox.durable.subscribe()
    }

    /// (first kept, next to be given) sequence numbers: the outbox holds at most
    /// `next - first` entries.
    pub fn outbox_bounds(&self) -> (u64, u64) {
        let o = &self.inner.outbox;
        (o.tail.load(Ordering::Acquire), o.next.load(Ordering::Acquire))
    }

    /// Up to `limit` entries after `after`, up to and including `upto`, in order.
    pub fn outbox_read(&self, after: u64, upto: u64, limit: usize) -> Result<Vec<OutboxEntry>, StoreError> {
        if upto <= after {
            return Ok(Vec::new());
        }
        let engine = self.engine()?;
        let mut out = Vec::new();
        for kv in engine.ks.outbox.range((after + 1).to_be_bytes()..=upto.to_be_bytes()).take(limit) {
            let (k, v) = kv.into_inner()?;
            let (at, event) = OutboxEvent::decode(&v)?;
            out.push(OutboxEntry { seq: u64_of(&k)?, at, event });
        }
        Ok(out)
    }

    /// Removes the entries before `below` (never past what was given out).
    pub fn outbox_trim(&self, below: u64) -> Result<Trimmed, StoreError> {
        let o = &self.inner.outbox;
        let below = below.min(o.next.load(Ordering::Acquire));
        let tail = o.tail.load(Ordering::Acquire);
        if below <= tail {
            return Ok(Trimmed { tail, removed: 0 });
        }
        let engine = self.engine()?;
        let mut batch = engine.db.batch();
        let mut removed = 0;
        for kv in engine.ks.outbox.range(tail.to_be_bytes()..below.to_be_bytes()) {
            batch.remove(&engine.ks.outbox, kv.key()?);
            removed += 1;
        }
        batch.insert(&engine.ks.meta, TAIL_KEY, below.to_be_bytes().to_vec());
        batch.commit()?;
        o.tail.store(below, Ordering::Release);
        Ok(Trimmed { tail: below, removed })
    }

    /// A reader's cursor: the last sequence number it is done with (`None` for a new one).
    pub fn outbox_cursor(&self, reader: &str) -> Result<Option<u64>, StoreError> {
        self.engine()?.ks.meta.get(format!("{CURSOR_PREFIX}{reader}"))?.map(|v| u64_of(&v)).transpose()
    }

    /// Saves a reader's cursor (made durable with the writer's next sync).
    pub fn set_outbox_cursor(&self, reader: &str, seq: u64) -> Result<(), StoreError> {
        Ok(self.engine()?.ks.meta.insert(format!("{CURSOR_PREFIX}{reader}"), seq.to_be_bytes().to_vec())?)
    }

    /// Forgets a reader's cursor.
    pub fn remove_outbox_cursor(&self, reader: &str) -> Result<(), StoreError> {
        Ok(self.engine()?.ks.meta.remove(format!("{CURSOR_PREFIX}{reader}"))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlinks_types::Value;

    #[test]
    fn the_fuzz_seeds_are_valid_entries() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/outbox");
        for name in ["telemetry", "attributes", "alarm"] {
            let bytes = std::fs::read(dir.join(name)).unwrap();
            let (at, e) = OutboxEvent::decode(&bytes).unwrap();
            assert_eq!(e.encode(at), bytes, "{name}");
        }
        // Found by the fuzz target: an alarm whose JSON holds 6.6666e53, which serde_json
        // read back one ulp off until the workspace enabled `float_roundtrip`.
        let (at, e) = OutboxEvent::decode(&std::fs::read(dir.join("float-roundtrip")).unwrap()).unwrap();
        let (at2, e2) = OutboxEvent::decode(&e.encode(at)).unwrap();
        assert_eq!((at2, format!("{e2:?}")), (at, format!("{e:?}")));
    }

    #[test]
    fn events_survive_encoding() {
        let device = DeviceId(uuid::Uuid::new_v4());
        for e in [
            OutboxEvent::Telemetry {
                device,
                records: vec![
                    TsRecord {
                        ts: Ts(5),
                        values: vec![("t".into(), Value::Double(1.5)), ("s".into(), Value::Str("x".into()))],
                    },
                    TsRecord { ts: Ts(-1), values: vec![] },
                ],
            },
            OutboxEvent::Attributes {
                device,
                scope: AttributeScope::Shared,
                values: vec![("on".into(), Value::Bool(true)), ("n".into(), Value::Long(-3))],
            },
            OutboxEvent::Alarm { id: device.0, title: "Hot".into(), doc: serde_json::json!({"severity": "MAJOR"}) },
        ] {
            let bytes = e.encode(Ts(9));
            assert_eq!(OutboxEvent::decode(&bytes).unwrap(), (Ts(9), e.clone()));
            // Every truncation is an error, never a panic or a different event.
            for n in 0..bytes.len() {
                assert!(OutboxEvent::decode(&bytes[..n]).is_err(), "{e:?} cut at {n}");
            }
        }
    }
}
