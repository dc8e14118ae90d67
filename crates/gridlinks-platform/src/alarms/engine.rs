//! The alarm rule engine: device-profile alarm rules run on committed data.
//!
//! [`Feed`] is where committed data comes in: the live fan-out with the embedded commit log
//! (one node), the Kafka storage writer with Kafka (the node that consumes a device's
//! partition, so one node evaluates a device at a time, in its partition's order). While no
//! profile has alarm rules, nothing enters; then a device whose profile has none costs a
//! cached lookup and nothing else.
//!
//! Rules are evaluated where the data arrives, on the caller's task, under the lock of the
//! device's shard of the engine's state: one device's data is evaluated in order, and no
//! message is handed to another thread (evaluating is a few comparisons; a hand-over cost
//! more than that, in copies and thread wake-ups). What an evaluation decides, raising or
//! clearing an alarm (a durable write), is queued in the device's state and written in that
//! order by one of [`SHARDS`] workers, which the caller wakes through a bounded queue: a full
//! queue makes the caller wait (backpressure on ingest), nothing is dropped. Until a
//! decision is written, the device's next evaluations see the alarm as it will be.
//!
//! Per device the engine keeps the values its rules read (loaded from storage when it first
//! sees the device) and the `DURATION`/`REPEATING` progress, which the workers persist
//! ([`DocKind::AlarmRuleState`]) once per `alarms.rule_state_interval` when it changed, so
//! a restart or a partition moving to another node carries it over (losing at most that
//! interval's progress on a crash; none on a clean stop, [`Feed::finish`]). Every [`TICK`]
//! the workers re-evaluate `DURATION` rules in progress, so one held long enough raises its
//! alarm without another message.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use gridlinks_ingest::BoxFuture;
use gridlinks_storage::{DeviceRecord, DocKind, Store, StoreError, WriteOp};
use gridlinks_types::{AttributeScope, DeviceId, ProfileId, Ts, TsRecord, Value};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, Notify};

use super::rules::{Action, AlarmState, DataKey, ProfileAlarms, Propagation, Reader};
use super::{Alarms, NewAlarm, Originator};
use crate::core::Core;

/// Workers that write the alarms rules decide and persist rule states.
pub const SHARDS: usize = 8;
/// Locks over the devices' rule states (each worker has `STATE_SHARDS / SHARDS`).
const STATE_SHARDS: usize = 8 * SHARDS;
/// Wake-ups queued per worker before callers wait.
const QUEUE: usize = 4096;
/// How often `DURATION` rules in progress are re-evaluated.
const TICK: Duration = Duration::from_secs(1);
/// Devices whose state is read from storage at once (first sight, changed rules): the
/// rest wait. Unbounded, 10,000 devices seen in their first second grew the blocking
/// pool to ~500 threads that stayed, costing every later message wake-ups and memory.
const LOADS: usize = 4;
/// How long a customer's or tenant's attribute read for a device's rules is used before it
/// is read again (a change on this node is seen at once; one on another node after this).
const OWNER_TTL: Duration = Duration::from_secs(60);

/// Committed data of one device, as it arrived.
#[derive(Clone, Copy)]
enum Input<'a> {
    Telemetry(&'a [TsRecord]),
    Attributes(AttributeScope, &'a [(String, Value)]),
}

/// Committed data of one device, owned.
enum Owned {
    Telemetry(Arc<[TsRecord]>),
    Attributes(AttributeScope, Vec<(String, Value)>),
}

impl Owned {
    fn input(&self) -> Input<'_> {
        match self {
            Owned::Telemetry(r) => Input::Telemetry(r),
            Owned::Attributes(scope, v) => Input::Attributes(*scope, v),
        }
    }
}

/// Device data copied from a storage write ([`Feed::copy`]).
pub struct Copied(Arc<DeviceRecord>, Owned);

/// Compiled alarm rules by profile, rebuilt when the store's profiles change.
pub struct RuleCache {
    store: Store,
    compiled: RwLock<Compiled>,
    /// `Compiled::at` and whether any profile has rules, read without a lock (set under
    /// `compiled`'s write lock).
    at: AtomicU64,
    any: AtomicBool,
}

#[derive(Default)]
struct Compiled {
    /// 1 + the profiles generation these rules are of (0: none yet).
    at: u64,
    rules: rustc_hash::FxHashMap<ProfileId, Arc<ProfileAlarms>>,
}

impl RuleCache {
    fn new(store: Store) -> Self {
        Self { store, compiled: RwLock::default(), at: AtomicU64::new(0), any: AtomicBool::new(false) }
    }

    /// The alarm rules of `profile` (none when it has none, or they do not compile: a
    /// profile is checked when saved, so that is one stored before rules were), and the
    /// profiles generation they are of ([`RuleCache::current`]).
    pub fn rules(&self, profile: ProfileId) -> Option<(Arc<ProfileAlarms>, u64)> {
        self.fresh()?;
        let c = self.compiled.read();
        Some((c.rules.get(&profile)?.clone(), c.at - 1))
    }

    /// Whether any profile has alarm rules (while none has, committed data is not looked at).
    pub fn any(&self) -> bool {
        self.fresh().is_some() && self.any.load(Ordering::Acquire)
    }

    /// Whether rules of generation `at` are still those of the profiles (one atomic read).
    fn current(&self, at: u64) -> bool {
        self.store.profiles_generation() == at
    }

    /// Compiles the rules again if the profiles changed; `None` when they cannot be read.
    fn fresh(&self) -> Option<()> {
        let at = self.store.profiles_generation() + 1;
        if self.at.load(Ordering::Acquire) == at {
            return Some(());
        }
        // Read after the generation: at least that new.
        let all = self.store.profiles().ok()?;
        let mut c = self.compiled.write();
        if c.at >= at {
            return Some(()); // compiled meanwhile, of these profiles or newer ones
        }
        let mut rules = rustc_hash::FxHashMap::default();
        for p in all.iter() {
            match ProfileAlarms::compile(p.doc.get("profileData").and_then(|d| d.get("alarms"))) {
                Ok(r) if !r.is_empty() => {
                    // Rules that did not change stay the same `Arc`: devices' states are
                    // reloaded only when their rules changed.
                    let same = c.rules.get(&p.id).filter(|o| ***o == r).cloned();
                    rules.insert(p.id, same.unwrap_or_else(|| Arc::new(r)));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(profile = %p.name, error = %e, "alarm rules do not compile: not evaluated"),
            }
        }
        self.any.store(!rules.is_empty(), Ordering::Release);
        *c = Compiled { at, rules };
        self.at.store(at, Ordering::Release);
        Some(())
    }
}

/// An alarm decided on and not written yet.
#[derive(Clone)]
struct Pending {
    /// Its number (the worker removes the decision it wrote, not a later one).
    seq: u64,
    alarm_type: String,
    propagation: Propagation,
    action: Action,
    ts: i64,
    tenant: uuid::Uuid,
    customer: Option<uuid::Uuid>,
}

/// One device as the engine knows it.
struct Device {
    /// Its profile, and the profiles generation its `rules` are known to be its profile's
    /// at ([`RuleCache::current`]).
    profile: ProfileId,
    at: u64,
    tenant: uuid::Uuid,
    customer: Option<uuid::Uuid>,
    /// With rules that read its customer's or tenant's attributes: when they were read, and
    /// the generation of those attributes then ([`Alarms::owner_generation`]).
    owners: Option<(u64, Instant)>,
    rules: Arc<ProfileAlarms>,
    /// The values its rules read, by slot ([`ProfileAlarms::keys`]).
    data: Vec<Option<Value>>,
    /// Per alarm of `rules`, in their order.
    states: Vec<AlarmState>,
    /// A state changed since the last flush.
    dirty: bool,
    /// `states` as last persisted (a state that changed and changed back within a flush
    /// is not written again).
    saved: Vec<AlarmState>,
    /// Decisions not written yet, in order.
    pending: VecDeque<Pending>,
    /// Per alarm of `rules`: whether the data at hand concerns it (kept here so that a
    /// message allocates nothing).
    touched: Vec<bool>,
}

impl Device {
    /// Takes committed data; evaluates the alarms it concerns. Whether a decision was queued.
    fn input(&mut self, alarms: &Alarms, id: DeviceId, input: Input<'_>, seq: &AtomicU64) -> bool {
        match input {
            Input::Telemetry(records) if records.is_sorted_by_key(|r| r.ts) => {
                records.iter().fold(false, |queued, r| self.record(alarms, id, r, seq) | queued)
            }
            Input::Telemetry(records) => {
                let mut sorted: Vec<&TsRecord> = records.iter().collect();
                sorted.sort_by_key(|r| r.ts);
                sorted.into_iter().fold(false, |queued, r| self.record(alarms, id, r, seq) | queued)
            }
            Input::Attributes(scope, values) => {
                let rules = self.rules.clone();
                let mut any = false;
                for (k, v) in values {
                    let Some(reader) = rules.attributes.get(k) else { continue };
                    // A lower scope does not hide a higher one's value.
                    if scope == AttributeScope::Server || self.data[reader.key.slot].is_none() {
                        self.set(reader, v);
                    }
                    self.touch(reader);
                    any = true;
                }
                any && self.evaluate(alarms, id, Ts::now().0, false, seq)
            }
        }
    }

    /// One time-series record: its keys the rules read, then the alarms reading them.
    fn record(&mut self, alarms: &Alarms, id: DeviceId, r: &TsRecord, seq: &AtomicU64) -> bool {
        let rules = self.rules.clone();
        let mut any = false;
        for (k, v) in &r.values {
            if let Some(reader) = rules.timeseries.get(k) {
                self.set(reader, v);
                self.touch(reader);
                any = true;
            }
        }
        any && self.evaluate(alarms, id, r.ts.0, false, seq)
    }

    fn set(&mut self, reader: &Reader, v: &Value) {
        match &mut self.data[reader.key.slot] {
            Some(old) => old.clone_from(v),
            empty => *empty = Some(v.clone()),
        }
    }

    fn touch(&mut self, reader: &Reader) {
        for &i in &reader.alarms {
            self.touched[i] = true;
        }
    }

    /// Evaluates the alarms touched (on a tick: those waiting on a `DURATION`) at `ts`, and
    /// queues what they decide. Whether a decision was queued.
    fn evaluate(&mut self, alarms: &Alarms, id: DeviceId, ts: i64, tick: bool, seq: &AtomicU64) -> bool {
        let rules = self.rules.clone();
        let mut queued = false;
        for (i, a) in rules.alarms.iter().enumerate() {
            let touched = std::mem::take(&mut self.touched[i]);
            if (tick && !a.waits(&self.states[i])) || (!tick && !touched) {
                continue;
            }
            // Whether the alarm is active matters to its clear rule only. A decision not
            // written yet says what the alarm will be.
            let active = a.clear.is_some()
                && match self.pending.iter().rev().find(|p| p.alarm_type == a.alarm_type) {
                    Some(p) => matches!(p.action, Action::Raise(..)),
                    None => matches!(alarms.active(id.0, &a.alarm_type), Ok(Some(_))),
                };
            let (action, changed) = a.eval(&mut self.states[i], &self.data, ts, tick, active);
            self.dirty |= changed;
            if action != Action::None {
                self.pending.push_back(Pending {
                    seq: seq.fetch_add(1, Ordering::Relaxed),
                    alarm_type: a.alarm_type.clone(),
                    propagation: a.propagation.clone(),
                    action,
                    ts,
                    tenant: self.tenant,
                    customer: self.customer,
                });
                queued = true;
            }
        }
        queued
    }

    /// Whether its customer's or tenant's attributes must be read again.
    fn owners_stale(&self, alarms: &Alarms, rec: &DeviceRecord) -> bool {
        self.customer != rec.customer
            || self.owners.is_some_and(|(g, at)| g != alarms.owner_generation() || at.elapsed() > OWNER_TTL)
    }

    /// Its rule states as persisted: by alarm id, those in progress.
    fn states_doc(&self) -> serde_json::Result<serde_json::Value> {
        let states: HashMap<&str, &AlarmState> = self
            .rules
            .alarms
            .iter()
            .zip(&self.states)
            .filter(|(_, s)| **s != AlarmState::default())
            .map(|(a, s)| (a.id.as_str(), s))
            .collect();
        serde_json::to_value(states)
    }
}

/// The devices of one shard.
type Shard = Mutex<rustc_hash::FxHashMap<DeviceId, Device>>;

struct Engine {
    rules: RuleCache,
    /// Set by [`start`] (data that comes before waits for it), taken by [`Feed::finish`]:
    /// the core holds the live fan-out, which holds the engine.
    core: RwLock<Option<Core>>,
    started: Notify,
    /// Set by [`Feed::finish`].
    finished: std::sync::atomic::AtomicBool,
    /// Bounds the storage reads of devices' states ([`LOADS`]).
    loads: tokio::sync::Semaphore,
    states: Box<[Shard]>,
    /// Per worker: devices with decisions to write.
    wake: Box<[mpsc::Sender<DeviceId>]>,
    seq: AtomicU64,
}

/// Where committed data enters the engine; cheap to clone.
#[derive(Clone)]
pub struct Feed(Arc<Engine>);

/// The workers' queues, for [`start`].
pub struct Receivers(Vec<mpsc::Receiver<DeviceId>>);

/// What the fast path did with a device's data.
enum Step {
    /// Evaluated (or nothing to evaluate).
    Done,
    /// Evaluated, and a decision was queued: its worker must be woken.
    Wake,
    /// The device's state must be loaded (or its owners' attributes read) first.
    Slow,
}

fn shard_of(device: DeviceId) -> usize {
    let mut h = rustc_hash::FxHasher::default();
    device.hash(&mut h);
    h.finish() as usize % STATE_SHARDS
}

impl Feed {
    /// A feed and the queues [`start`] runs the workers on.
    pub fn new(store: Store) -> (Self, Receivers) {
        let (tx, rx): (Vec<_>, Vec<_>) = (0..SHARDS).map(|_| mpsc::channel(QUEUE)).unzip();
        let engine = Engine {
            rules: RuleCache::new(store),
            core: RwLock::new(None),
            started: Notify::new(),
            finished: Default::default(),
            loads: tokio::sync::Semaphore::new(LOADS),
            states: (0..STATE_SHARDS).map(|_| Mutex::default()).collect(),
            wake: tx.into(),
            seq: AtomicU64::new(0),
        };
        (Self(Arc::new(engine)), Receivers(rx))
    }

    /// Whether `device`'s profile has alarm rules.
    pub fn wants(&self, device: &DeviceRecord) -> bool {
        self.0.rules.rules(device.profile_id()).is_some()
    }

    /// The core, once the engine is started; `None` after [`Feed::finish`].
    async fn core(&self) -> Option<Core> {
        loop {
            let started = self.0.started.notified();
            if let Some(core) = self.0.core.read().as_ref() {
                return Some(core.clone());
            }
            if self.0.finished.load(Ordering::Acquire) {
                return None;
            }
            started.await;
        }
    }

    /// Evaluates `input` if the device's state is at hand and current.
    fn try_eval(&self, rec: &DeviceRecord, input: Input<'_>) -> Step {
        let core = self.0.core.read();
        let Some(core) = core.as_ref() else { return Step::Slow };
        let profile = rec.profile_id();
        let mut shard = self.0.states[shard_of(rec.id)].lock();
        let d = match shard.get_mut(&rec.id) {
            // No profile changed since its rules were looked up: nothing to look up.
            Some(d) if d.profile == profile && self.0.rules.current(d.at) => d,
            found => match (self.0.rules.rules(profile), found) {
                (Some((rules, at)), Some(d)) if Arc::ptr_eq(&d.rules, &rules) => {
                    (d.profile, d.at) = (profile, at);
                    d
                }
                // Not loaded yet, and data its rules do not read (the attributes device
                // activity writes on every connect, say): nothing to load it for.
                (Some((rules, _)), None) if !reads_any(&rules, input) => return Step::Done,
                (Some(_), _) => return Step::Slow,
                // Its profile has no rules (now): its state goes, unless decisions of its
                // are still to be written.
                (None, found) => {
                    if found.is_some_and(|d| d.pending.is_empty()) {
                        shard.remove(&rec.id);
                    }
                    return Step::Done;
                }
            },
        };
        if d.owners_stale(&core.alarms, rec) {
            return Step::Slow;
        }
        if d.input(&core.alarms, rec.id, input, &self.0.seq) {
            Step::Wake
        } else {
            Step::Done
        }
    }

    /// Evaluates `input` after loading what the device's state lacks.
    async fn slow(&self, rec: &DeviceRecord, input: Input<'_>) {
        let Some(core) = self.core().await else { return };
        let Some((rules, at)) = self.0.rules.rules(rec.profile_id()) else { return };
        self.refresh(&core, rec, rules, at, input).await;
        let queued = {
            let mut shard = self.0.states[shard_of(rec.id)].lock();
            let Some(d) = shard.get_mut(&rec.id) else { return };
            d.input(&core.alarms, rec.id, input, &self.0.seq)
        };
        if queued {
            if let Some(wait) = self.wake(rec.id) {
                wait.await;
            }
        }
    }

    /// Evaluates `input`, waiting for what it needs.
    async fn data(&self, rec: &DeviceRecord, input: Input<'_>) {
        match self.try_eval(rec, input) {
            Step::Done => {}
            Step::Wake => {
                if let Some(wait) = self.wake(rec.id) {
                    wait.await;
                }
            }
            Step::Slow => self.slow(rec, input).await,
        }
    }

    /// Loads the device's state (first sight, or its profile's rules changed), or reads its
    /// owners' attributes again; `input` is what is evaluated next.
    async fn refresh(&self, core: &Core, rec: &DeviceRecord, rules: Arc<ProfileAlarms>, at: u64, input: Input<'_>) {
        let id = rec.id;
        let Ok(_permit) = self.0.loads.acquire().await else { return };
        let (load, owners) = match self.0.states[shard_of(id)].lock().get(&id) {
            Some(d) if Arc::ptr_eq(&d.rules, &rules) => (false, d.owners_stale(&core.alarms, rec)),
            _ => (true, false),
        };
        if load {
            match load_device(core, rec, rules, at, input).await {
                Ok(mut d) => {
                    let mut shard = self.0.states[shard_of(id)].lock();
                    if let Some(old) = shard.get_mut(&id) {
                        if Arc::ptr_eq(&old.rules, &d.rules) {
                            return; // another task loaded it meanwhile
                        }
                        d.pending = std::mem::take(&mut old.pending);
                    }
                    shard.insert(id, d);
                }
                Err(e) => tracing::warn!(device = %id, error = %e, "alarm rules: loading the device's data failed"),
            }
        } else if owners {
            let generation = core.alarms.owner_generation();
            let (store, customer, tenant) = (core.store.clone(), rec.customer, core.tenant_of(rec.tenant));
            let read = rules.clone();
            match crate::entities::blocking(move || owner_values(&store, &read.keys, customer, tenant)).await {
                Ok(values) => {
                    let mut shard = self.0.states[shard_of(id)].lock();
                    let Some(d) = shard.get_mut(&id) else { return };
                    d.customer = rec.customer;
                    for (slot, k) in rules.keys.iter().enumerate() {
                        if matches!(k, DataKey::Customer(_) | DataKey::Tenant(_)) {
                            d.data[slot] = None;
                        }
                    }
                    for (slot, v) in values {
                        d.data[slot] = Some(v);
                    }
                    d.owners = d.owners.map(|_| (generation, Instant::now()));
                }
                Err(e) => tracing::warn!(device = %id, error = %e, "alarm rules: reading owner attributes failed"),
            }
        }
    }

    /// Wakes the worker of `device` (decisions of it are queued): at once when its queue has
    /// room, else the returned future waits for it.
    fn wake(&self, device: DeviceId) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let q = &self.0.wake[shard_of(device) % SHARDS];
        match q.try_send(device) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => None,
            Err(mpsc::error::TrySendError::Full(id)) => {
                let q = q.clone();
                Some(async move {
                    let _ = q.send(id).await;
                })
            }
        }
    }

    /// A copy of a storage write that is device data the engine reads (of a device whose
    /// profile has alarm rules), to evaluate once it is written.
    pub fn copy(&self, op: &WriteOp) -> Option<Copied> {
        let device = match op {
            WriteOp::Telemetry { device, .. } | WriteOp::Attributes { device, .. } if self.0.rules.any() => *device,
            _ => return None,
        };
        let rec = self.0.rules.store.device_cached(device).ok()??;
        if !self.wants(&rec) {
            return None;
        }
        Some(Copied(
            rec,
            match op {
                WriteOp::Attributes { scope, values, .. } => Owned::Attributes(*scope, values.clone()),
                WriteOp::Telemetry { records, .. } => Owned::Telemetry(records.clone()),
                _ => return None,
            },
        ))
    }

    /// Evaluates what was written (the Kafka storage writer's batch), waiting for what it needs.
    pub async fn written(&self, copies: Vec<Copied>) {
        for Copied(rec, data) in copies {
            self.data(&rec, data.input()).await;
        }
    }

    /// On a clean stop: writes every decision not written yet and every rule state; the
    /// engine takes no data after this.
    pub async fn finish(&self) {
        for w in 0..SHARDS {
            self.0.tick(w, false, true).await;
        }
        self.0.finished.store(true, Ordering::Release);
        self.0.core.write().take();
        self.0.started.notify_waiters();
    }
}

/// Starts the workers; they end when every [`Feed`] is dropped.
pub fn start(core: Core, feed: &Feed, rx: Receivers) -> Vec<tokio::task::JoinHandle<()>> {
    let persist = core.cfg.alarms.rule_state_interval.duration();
    *feed.0.core.write() = Some(core);
    feed.0.started.notify_waiters();
    let engine = Arc::downgrade(&feed.0);
    rx.0.into_iter().enumerate().map(|(w, rx)| tokio::spawn(run(engine.clone(), w, rx, persist))).collect()
}

/// Worker `w`: writes the decisions of the devices it is woken for; every [`TICK`]
/// re-evaluates `DURATION` rules in progress, and every `persist` (at the next tick)
/// persists the rule states that changed.
async fn run(engine: Weak<Engine>, w: usize, mut rx: mpsc::Receiver<DeviceId>, persist: Duration) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut persisted = Instant::now();
    loop {
        tokio::select! {
            id = rx.recv() => {
                let (Some(id), Some(engine)) = (id, engine.upgrade()) else { break };
                engine.apply(id).await;
            }
            _ = tick.tick() => {
                let Some(engine) = engine.upgrade() else { break };
                let due = persisted.elapsed() >= persist;
                if due {
                    persisted = Instant::now();
                }
                engine.tick(w, true, due).await;
            }
        }
    }
}

impl Engine {
    /// Writes `device`'s queued decisions, in order.
    async fn apply(&self, device: DeviceId) {
        let Some(core) = self.core.read().clone() else { return };
        let shard = &self.states[shard_of(device)];
        loop {
            let Some(p) = shard.lock().get(&device).and_then(|d| d.pending.front().cloned()) else { return };
            let Pending { seq, alarm_type, propagation, action, ts, tenant, customer } = p;
            let result = match action {
                Action::Raise(severity, details) => {
                    let originator = Originator { kind: "DEVICE".into(), id: device.0 };
                    let new = NewAlarm {
                        tenant,
                        customer,
                        originator,
                        alarm_type,
                        severity,
                        details,
                        ts,
                        end_ts: ts,
                        propagation,
                    };
                    core.alarms.raise(new, false).await.map(drop)
                }
                Action::Clear(details) => core.alarms.clear_active(device.0, &alarm_type, details, ts).await.map(drop),
                Action::None => Ok(()),
            };
            if let Err(e) = result {
                tracing::warn!(device = %device, error = %e, "alarm rules: the alarm could not be written");
            }
            if let Some(d) = shard.lock().get_mut(&device) {
                if d.pending.front().is_some_and(|f| f.seq == seq) {
                    d.pending.pop_front();
                }
            }
        }
    }

    /// For worker `w`'s shards: re-evaluates `DURATION` rules in progress (when `durations`),
    /// writes the devices' queued decisions and (when `persist`) the rule states that changed.
    async fn tick(&self, w: usize, durations: bool, persist: bool) {
        let Some(core) = self.core.read().clone() else { return };
        let now = Ts::now().0;
        for s in (w..STATE_SHARDS).step_by(SHARDS) {
            let mut decided = Vec::new();
            let mut states = Vec::new();
            {
                let mut shard = self.states[s].lock();
                for (id, d) in shard.iter_mut() {
                    let waiting = durations && d.rules.alarms.iter().zip(&d.states).any(|(a, s)| a.waits(s));
                    if waiting {
                        d.evaluate(&core.alarms, *id, now, true, &self.seq);
                    }
                    if !d.pending.is_empty() {
                        decided.push(*id);
                    }
                    if persist && std::mem::take(&mut d.dirty) && d.states != d.saved {
                        d.saved.clone_from(&d.states);
                        match d.states_doc() {
                            Ok(doc) => states.push((id.0, id.to_string(), doc)),
                            Err(e) => {
                                tracing::warn!(device = %id, error = %e, "alarm rules: a rule state was not encoded")
                            }
                        }
                    }
                }
            }
            for id in decided {
                self.apply(id).await;
            }
            if states.is_empty() {
                continue;
            }
            // One write (one batch) for the shard's states.
            if let Err(e) = core.writer.submit(WriteOp::PutDocs { kind: DocKind::AlarmRuleState, docs: states }).await {
                tracing::warn!(error = %e, "alarm rules: rule states were not written");
            }
        }
    }
}

/// A device's state, read from storage: the values its rules read, its persisted rule states.
async fn load_device(
    core: &Core,
    rec: &DeviceRecord,
    rules: Arc<ProfileAlarms>,
    at: u64,
    input: Input<'_>,
) -> Result<Device, StoreError> {
    let tenant = core.tenant_of(rec.tenant);
    let generation = core.alarms.owner_generation();
    let (store, ts, id, customer, rec2) = (core.store.clone(), core.ts.clone(), rec.id, rec.customer, rec.clone());
    let read = rules.clone();
    // Stored latest values the input replaces anyway are not read (a device's first
    // message usually carries every key its rules read).
    let replaced = carries_every_timeseries_key(&rules, input);
    let (data, saved) = crate::entities::blocking(move || {
        let keys = &read.keys;
        let mut data = vec![None; keys.len()];
        let ts_keys: Vec<String> =
            keys.iter().filter_map(|k| if let DataKey::Timeseries(n) = k { Some(n.clone()) } else { None }).collect();
        if !ts_keys.is_empty() && !replaced {
            for (k, _, v) in ts.reads().latest(id, Some(&ts_keys))? {
                if let Some(reader) = read.timeseries.get(&k) {
                    data[reader.key.slot] = Some(v);
                }
            }
        }
        for (slot, k) in keys.iter().enumerate() {
            data[slot] = match k {
                DataKey::Attribute(n) => attribute(&store, id, n, None)?,
                DataKey::EntityField(f) => entity_field(&rec2, f),
                DataKey::Customer(_) | DataKey::Tenant(_) | DataKey::Timeseries(_) => continue,
            };
        }
        for (slot, v) in owner_values(&store, keys, customer, tenant)? {
            data[slot] = Some(v);
        }
        Ok((data, store.doc(DocKind::AlarmRuleState, id.0)?))
    })
    .await?;
    let mut saved: HashMap<String, AlarmState> =
        saved.and_then(|d| serde_json::from_value(d.doc).ok()).unwrap_or_default();
    let states: Vec<AlarmState> = rules.alarms.iter().map(|a| saved.remove(&a.id).unwrap_or_default()).collect();
    let owners = reads_owners(&rules).then(|| (generation, Instant::now()));
    let touched = vec![false; rules.alarms.len()];
    Ok(Device {
        profile: rec.profile_id(),
        at,
        tenant,
        customer: rec.customer,
        owners,
        rules,
        data,
        saved: states.clone(),
        states,
        dirty: false,
        pending: VecDeque::new(),
        touched,
    })
}

/// Whether `input` has a value of some key `rules` read.
fn reads_any(rules: &ProfileAlarms, input: Input<'_>) -> bool {
    match input {
        Input::Telemetry(records) => {
            records.iter().any(|r| r.values.iter().any(|(k, _)| rules.timeseries.contains_key(k)))
        }
        Input::Attributes(_, values) => values.iter().any(|(k, _)| rules.attributes.contains_key(k)),
    }
}

/// Whether `input` has a value of every time-series key `rules` read.
fn carries_every_timeseries_key(rules: &ProfileAlarms, input: Input<'_>) -> bool {
    let Input::Telemetry(records) = input else { return rules.timeseries.is_empty() };
    rules.timeseries.keys().all(|k| records.iter().any(|r| r.values.iter().any(|(n, _)| n == k)))
}

/// Whether `rules` read customer's or tenant's attributes.
fn reads_owners(rules: &ProfileAlarms) -> bool {
    rules.keys.iter().any(|k| matches!(k, DataKey::Customer(_) | DataKey::Tenant(_)))
}

/// The values of a device's customer's and tenant's keys among `keys` (their server
/// attributes), by slot.
fn owner_values(
    store: &gridlinks_storage::Store,
    keys: &[DataKey],
    customer: Option<uuid::Uuid>,
    tenant: uuid::Uuid,
) -> Result<Vec<(usize, Value)>, StoreError> {
    let mut out = Vec::new();
    for (slot, k) in keys.iter().enumerate() {
        let (owner, name) = match k {
            DataKey::Customer(n) => (customer.map(DeviceId), n),
            DataKey::Tenant(n) => (Some(DeviceId(tenant)), n),
            _ => continue,
        };
        if let Some(v) = owner.map(|o| attribute(store, o, name, Some(AttributeScope::Server))).transpose()?.flatten() {
            out.push((slot, v));
        }
    }
    Ok(out)
}

/// An attribute of `owner` in `scope` (any scope: server over shared over client, as the
/// rule engine reads them).
fn attribute(
    store: &gridlinks_storage::Store,
    owner: DeviceId,
    name: &str,
    scope: Option<AttributeScope>,
) -> Result<Option<Value>, StoreError> {
    let mut found = store.attributes(owner, scope, Some(&[name.to_owned()]))?;
    found.sort_by_key(|a| std::cmp::Reverse(a.scope as u8));
    Ok(found.into_iter().next().map(|a| a.value))
}

/// A device's entity field as an alarm rule reads it.
fn entity_field(d: &DeviceRecord, field: &str) -> Option<Value> {
    Some(match field {
        "name" | "deviceName" => Value::Str(d.name.clone()),
        "type" => Value::Str(d.device_type.clone()),
        "label" => Value::Str(d.label.clone()?),
        "createdTime" => Value::Long(d.created_time),
        _ => return None,
    })
}

impl crate::live::LiveSink for Feed {
    fn wants_telemetry(&self) -> bool {
        self.0.rules.any()
    }
    fn wants_attributes(&self) -> bool {
        self.0.rules.any()
    }
    fn telemetry<'a>(
        &'a self,
        device: &'a DeviceRecord,
        _tenant: uuid::Uuid,
        records: &'a [TsRecord],
    ) -> Option<BoxFuture<'a, Result<(), StoreError>>> {
        match self.try_eval(device, Input::Telemetry(records)) {
            Step::Done => None,
            Step::Wake => {
                let wait = self.wake(device.id)?;
                Some(Box::pin(async move {
                    wait.await;
                    Ok(())
                }))
            }
            Step::Slow => Some(Box::pin(async move {
                self.slow(device, Input::Telemetry(records)).await;
                Ok(())
            })),
        }
    }
    fn attributes(
        &self,
        device: &DeviceRecord,
        _tenant: uuid::Uuid,
        scope: AttributeScope,
        values: &[(String, Value)],
        _now: Ts,
    ) {
        // Attribute changes are never waited for on this path: what must wait is handed
        // to a task.
        match self.try_eval(device, Input::Attributes(scope, values)) {
            Step::Done => {}
            Step::Wake => {
                if let Some(wait) = self.wake(device.id) {
                    tokio::spawn(wait);
                }
            }
            Step::Slow => {
                let (feed, rec, values) = (self.clone(), device.clone(), values.to_vec());
                tokio::spawn(async move { feed.slow(&rec, Input::Attributes(scope, &values)).await });
            }
        }
    }
}
