//! The alarm rule engine: device-profile alarm rules run on committed data.
//!
//! [`Feed`] is where committed data comes in: the live fan-out with the embedded commit log
//! (one node), the Kafka storage writer with Kafka (the node that consumes a device's
//! partition, so one node evaluates a device at a time, in its partition's order). While no
//! profile has alarm rules, nothing enters; then a device whose profile has none costs a
//! cached lookup and nothing else. Others
//! go, by device, to one of [`SHARDS`] workers through bounded queues: a full queue makes
//! the caller wait (backpressure on ingest), nothing is dropped.
//!
//! A worker keeps, per device, the values its rules read (loaded from storage when it
//! first sees the device) and the `DURATION`/`REPEATING` progress, which it persists
//! ([`DocKind::AlarmRuleState`]) at most once per [`FLUSH`] per device, so a restart or a
//! partition moving to another node carries it over (losing at most that last second of
//! progress on a crash). Every [`FLUSH`] it also re-evaluates `DURATION` rules in progress,
//! so one held long enough raises its alarm without another message.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use gridlinks_storage::{DeviceRecord, DocKind, ProfileRecord, Store, StoreError, WriteOp};
use gridlinks_types::{AttributeScope, DeviceId, ProfileId, Ts, TsRecord, Value};
use parking_lot::RwLock;
use tokio::sync::mpsc;

use super::rules::{Action, AlarmState, DataKey, ProfileAlarms};
use super::{NewAlarm, Originator};
use crate::core::Core;

/// Workers (devices are spread over them by id).
pub const SHARDS: usize = 8;
/// Events queued per worker before callers wait.
const QUEUE: usize = 4096;
/// How often rule states are written and `DURATION` rules re-evaluated.
const FLUSH: Duration = Duration::from_secs(1);

/// Committed data of one device, with the device as it was looked up for it (so the
/// worker reads it from storage no second time).
enum Event {
    Telemetry(Box<DeviceRecord>, Vec<TsRecord>),
    Attributes(Box<DeviceRecord>, AttributeScope, Vec<(String, Value)>),
}

impl Event {
    fn device(&self) -> &DeviceRecord {
        match self {
            Event::Telemetry(d, _) | Event::Attributes(d, ..) => d,
        }
    }
}

/// Compiled alarm rules by profile, rebuilt when the store's profiles change.
pub struct RuleCache {
    store: Store,
    compiled: RwLock<Compiled>,
}

#[derive(Default)]
struct Compiled {
    of: Option<Arc<Vec<ProfileRecord>>>,
    rules: HashMap<ProfileId, Arc<ProfileAlarms>>,
}

impl RuleCache {
    /// The alarm rules of `profile` (none when it has none, or they do not compile: a
    /// profile is checked when saved, so that is one stored before rules were).
    pub fn rules(&self, profile: ProfileId) -> Option<Arc<ProfileAlarms>> {
        self.with(|rules| rules.get(&profile).cloned()).flatten()
    }

    /// Whether any profile has alarm rules (while none has, committed data is not looked at).
    pub fn any(&self) -> bool {
        self.with(|rules| !rules.is_empty()).unwrap_or(false)
    }

    /// `f` of the compiled rules of the profiles as stored now (compiled again when they
    /// changed); `None` when the profiles cannot be read.
    fn with<T>(&self, f: impl FnOnce(&HashMap<ProfileId, Arc<ProfileAlarms>>) -> T) -> Option<T> {
        let all = self.store.profiles().ok()?;
        {
            let c = self.compiled.read();
            if c.of.as_ref().is_some_and(|of| Arc::ptr_eq(of, &all)) {
                return Some(f(&c.rules));
            }
        }
        let mut rules = HashMap::new();
        for p in all.iter() {
            match ProfileAlarms::compile(p.doc.get("profileData").and_then(|d| d.get("alarms"))) {
                Ok(r) if !r.is_empty() => {
                    rules.insert(p.id, Arc::new(r));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(profile = %p.name, error = %e, "alarm rules do not compile: not evaluated"),
            }
        }
        let mut c = self.compiled.write();
        *c = Compiled { of: Some(all), rules };
        Some(f(&c.rules))
    }
}

/// Where committed data enters the engine; cheap to clone.
#[derive(Clone)]
pub struct Feed {
    rules: Arc<RuleCache>,
    queues: Arc<[mpsc::Sender<Event>]>,
}

/// Device data copied from a storage write ([`Feed::copy`]).
pub struct Copied(Event);

/// The queues' other ends, for [`start`].
pub struct Receivers(Arc<RuleCache>, Vec<mpsc::Receiver<Event>>);

impl Feed {
    /// A feed and the receivers [`start`] runs the workers on.
    pub fn new(store: Store) -> (Self, Receivers) {
        let (tx, rx): (Vec<_>, Vec<_>) = (0..SHARDS).map(|_| mpsc::channel(QUEUE)).unzip();
        let rules = Arc::new(RuleCache { store, compiled: RwLock::default() });
        (Self { rules: rules.clone(), queues: tx.into() }, Receivers(rules, rx))
    }

    fn queue(&self, device: DeviceId) -> &mpsc::Sender<Event> {
        let mut h = rustc_hash::FxHasher::default();
        device.hash(&mut h);
        &self.queues[h.finish() as usize % self.queues.len()]
    }

    /// Whether `device`'s profile has alarm rules.
    pub fn wants(&self, device: &DeviceRecord) -> bool {
        self.rules.rules(device.profile_id()).is_some()
    }

    /// Queues committed telemetry of a device that [`Feed::wants`]: at once when there is
    /// room, else the returned future waits for it.
    pub fn telemetry(
        &self,
        device: &DeviceRecord,
        records: Vec<TsRecord>,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        self.send(Event::Telemetry(Box::new(device.clone()), records))
    }

    /// Queues committed attributes, as [`Feed::telemetry`].
    pub fn attributes(
        &self,
        device: &DeviceRecord,
        scope: AttributeScope,
        values: Vec<(String, Value)>,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        self.send(Event::Attributes(Box::new(device.clone()), scope, values))
    }

    fn send(&self, e: Event) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let q = self.queue(e.device().id);
        match q.try_send(e) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => None,
            Err(mpsc::error::TrySendError::Full(e)) => {
                let q = q.clone();
                Some(async move {
                    let _ = q.send(e).await;
                })
            }
        }
    }

    /// A copy of a storage write that is device data the engine reads (of a device whose
    /// profile has alarm rules), to queue once it is written.
    pub fn copy(&self, op: &WriteOp) -> Option<Copied> {
        let device = match op {
            WriteOp::Telemetry { device, .. } | WriteOp::Attributes { device, .. } if self.rules.any() => *device,
            _ => return None,
        };
        let rec = Box::new(self.rules.store.device(device).ok()??);
        if !self.wants(&rec) {
            return None;
        }
        Some(Copied(match op {
            WriteOp::Attributes { scope, values, .. } => Event::Attributes(rec, *scope, values.clone()),
            WriteOp::Telemetry { records, .. } => Event::Telemetry(rec, records.clone()),
            _ => return None,
        }))
    }

    /// Queues what was written (the Kafka storage writer's batch), waiting for room.
    pub async fn written(&self, copies: Vec<Copied>) {
        for Copied(event) in copies {
            if let Some(p) = self.send(event) {
                p.await;
            }
        }
    }
}

/// Starts the workers; they end when every [`Feed`] is dropped.
pub fn start(core: Core, rx: Receivers) -> Vec<tokio::task::JoinHandle<()>> {
    let Receivers(rules, rx) = rx;
    rx.into_iter().map(|rx| tokio::spawn(Worker::new(core.clone(), rules.clone()).run(rx))).collect()
}

/// How long a customer's or tenant's attribute read for a device's rules is used before it
/// is read again (a change on this node is seen at once; one on another node after this).
const OWNER_TTL: Duration = Duration::from_secs(60);

/// One device as its worker knows it.
struct Device {
    tenant: uuid::Uuid,
    customer: Option<uuid::Uuid>,
    /// With rules that read its customer's or tenant's attributes: when they were read, and
    /// the generation of those attributes then ([`crate::alarms::Alarms::owner_generation`]).
    owners: Option<(u64, std::time::Instant)>,
    rules: Arc<ProfileAlarms>,
    data: HashMap<DataKey, Value>,
    /// Per alarm id.
    states: HashMap<String, AlarmState>,
}

struct Worker {
    core: Core,
    rules: Arc<RuleCache>,
    devices: HashMap<DeviceId, Device>,
    /// Devices whose rule state changed since the last flush.
    dirty: HashSet<DeviceId>,
}

impl Worker {
    fn new(core: Core, rules: Arc<RuleCache>) -> Self {
        Self { core, rules, devices: HashMap::new(), dirty: HashSet::new() }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Event>) {
        let mut tick = tokio::time::interval(FLUSH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                e = rx.recv() => match e {
                    Some(e) => self.event(e).await,
                    None => break,
                },
                _ = tick.tick() => {
                    // What was committed before this tick is evaluated first: a `DURATION`
                    // rule is judged at the wall clock only once the data that could have
                    // reset it is seen (else a lagging worker raises false alarms).
                    for _ in 0..QUEUE {
                        let Ok(e) = rx.try_recv() else { break };
                        self.event(e).await;
                    }
                    self.tick().await;
                    self.flush().await;
                }
            }
        }
        self.flush().await;
    }

    /// The device's state, loaded on first sight or when its profile changed; `None` when
    /// it has no rules now.
    async fn device(&mut self, rec: &DeviceRecord) -> Option<&mut Device> {
        let id = rec.id;
        let rules = self.rules.rules(rec.profile_id());
        let Some(rules) = rules else {
            self.devices.remove(&id);
            return None;
        };
        let fresh = self.devices.get(&id).is_none_or(|d| !Arc::ptr_eq(&d.rules, &rules));
        if fresh {
            match self.load(rec, rules).await {
                Ok(d) => {
                    self.devices.insert(id, d);
                }
                Err(e) => {
                    tracing::warn!(device = %id, error = %e, "alarm rules: loading the device's data failed");
                    return None;
                }
            }
        }
        let generation = self.core.alarms.owner_generation();
        let d = self.devices.get_mut(&id)?;
        let stale = d.owners.is_some_and(|(g, at)| g != generation || at.elapsed() > OWNER_TTL);
        if stale || d.customer != rec.customer {
            d.customer = rec.customer;
            let keys = owner_keys(&d.rules);
            let (store, customer, tenant) = (self.core.store.clone(), d.customer, d.tenant);
            match crate::entities::blocking(move || owner_values(&store, &keys, customer, tenant)).await {
                Ok(values) => {
                    let d = self.devices.get_mut(&id)?;
                    d.data.retain(|k, _| !matches!(k, DataKey::Customer(_) | DataKey::Tenant(_)));
                    d.data.extend(values);
                    d.owners = d.owners.map(|_| (generation, std::time::Instant::now()));
                }
                Err(e) => tracing::warn!(device = %id, error = %e, "alarm rules: reading owner attributes failed"),
            }
        }
        self.devices.get_mut(&id)
    }

    async fn load(&self, rec: &DeviceRecord, rules: Arc<ProfileAlarms>) -> Result<Device, StoreError> {
        let tenant = self.core.tenant_of(rec.tenant);
        let generation = self.core.alarms.owner_generation();
        let keys: Vec<DataKey> = rules.alarms.iter().flat_map(|a| a.keys.iter().cloned()).collect();
        let (store, ts, id, customer, rec2) =
            (self.core.store.clone(), self.core.ts.clone(), rec.id, rec.customer, rec.clone());
        let data = crate::entities::blocking(move || {
            let mut data = HashMap::new();
            let ts_keys: Vec<String> = keys
                .iter()
                .filter_map(|k| if let DataKey::Timeseries(n) = k { Some(n.clone()) } else { None })
                .collect();
            if !ts_keys.is_empty() {
                for (k, _, v) in ts.reads().latest(id, Some(&ts_keys))? {
                    data.insert(DataKey::Timeseries(k), v);
                }
            }
            for k in &keys {
                match k {
                    DataKey::Attribute(n) => {
                        if let Some(v) = attribute(&store, id, n, None)? {
                            data.insert(k.clone(), v);
                        }
                    }
                    DataKey::EntityField(f) => {
                        if let Some(v) = entity_field(&rec2, f) {
                            data.insert(k.clone(), v);
                        }
                    }
                    DataKey::Customer(_) | DataKey::Tenant(_) | DataKey::Timeseries(_) => {}
                }
            }
            data.extend(owner_values(&store, &keys, customer, tenant)?);
            Ok(data)
        })
        .await?;
        let (store, id) = (self.core.store.clone(), rec.id);
        let saved = crate::entities::blocking(move || store.doc(DocKind::AlarmRuleState, id.0)).await?;
        let mut states: HashMap<String, AlarmState> =
            saved.and_then(|d| serde_json::from_value(d.doc).ok()).unwrap_or_default();
        states.retain(|id, _| rules.alarms.iter().any(|a| &a.id == id));
        let owners = (!owner_keys(&rules).is_empty()).then(|| (generation, std::time::Instant::now()));
        Ok(Device { tenant, customer: rec.customer, owners, rules, data, states })
    }

    async fn event(&mut self, e: Event) {
        let id = e.device().id;
        let Some(d) = self.device(e.device()).await else { return };
        // (ts, the keys that changed) per evaluation.
        let mut steps: Vec<(i64, Vec<DataKey>)> = Vec::new();
        match e {
            Event::Telemetry(_, mut records) => {
                records.sort_by_key(|r| r.ts);
                for r in records {
                    let mut changed = Vec::new();
                    for (k, v) in r.values {
                        let key = DataKey::Timeseries(k);
                        if d.rules.alarms.iter().any(|a| a.reads(&key)) {
                            d.data.insert(key.clone(), v);
                            changed.push(key);
                        }
                    }
                    if !changed.is_empty() {
                        steps.push((r.ts.0, changed));
                    }
                }
            }
            Event::Attributes(_, scope, values) => {
                let mut changed = Vec::new();
                for (k, v) in values {
                    let key = DataKey::Attribute(k);
                    if !d.rules.alarms.iter().any(|a| a.reads(&key)) {
                        continue;
                    }
                    // A lower scope does not hide a higher one's value.
                    if scope == AttributeScope::Server || !d.data.contains_key(&key) {
                        d.data.insert(key.clone(), v);
                    }
                    changed.push(key);
                }
                if !changed.is_empty() {
                    steps.push((Ts::now().0, changed));
                }
            }
        }
        for (ts, changed) in steps {
            self.evaluate(id, ts, false, Some(&changed)).await;
        }
    }

    /// Evaluates the device's alarms that read any of `changed` (all on a tick).
    async fn evaluate(&mut self, id: DeviceId, ts: i64, tick: bool, changed: Option<&[DataKey]>) {
        let Some(d) = self.devices.get_mut(&id) else { return };
        let mut actions = Vec::new();
        let rules = d.rules.clone();
        for a in &rules.alarms {
            if changed.is_some_and(|c| !c.iter().any(|k| a.reads(k))) {
                continue;
            }
            let state = d.states.entry(a.id.clone()).or_default();
            if tick && !a.waits(state) {
                continue;
            }
            let active = matches!(self.core.alarms.active(id.0, &a.alarm_type), Ok(Some(_)));
            let (action, changed_state) = a.eval(state, &d.data, ts, tick, active);
            if changed_state {
                self.dirty.insert(id);
            }
            if action != Action::None {
                actions.push((a.alarm_type.clone(), a.propagation.clone(), action));
            }
        }
        d.states.retain(|_, s| *s != AlarmState::default());
        let (tenant, customer) = (d.tenant, d.customer);
        for (alarm_type, propagation, action) in actions {
            let originator = Originator { kind: "DEVICE".into(), id: id.0 };
            let result = match action {
                Action::Raise(severity, details) => {
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
                    self.core.alarms.raise(new, false).await.map(drop)
                }
                Action::Clear(details) => self.core.alarms.clear_active(id.0, &alarm_type, details, ts).await.map(drop),
                Action::None => Ok(()),
            };
            if let Err(e) = result {
                tracing::warn!(device = %id, error = %e, "alarm rules: the alarm could not be written");
            }
        }
    }

    /// Re-evaluates `DURATION` rules in progress.
    async fn tick(&mut self) {
        let now = Ts::now().0;
        let waiting: Vec<DeviceId> = self
            .devices
            .iter()
            .filter(|(_, d)| d.rules.alarms.iter().any(|a| d.states.get(&a.id).is_some_and(|s| a.waits(s))))
            .map(|(id, _)| *id)
            .collect();
        for id in waiting {
            self.evaluate(id, now, true, None).await;
        }
    }

    /// Writes the rule states that changed.
    async fn flush(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        let mut ops = Vec::new();
        for id in self.dirty.drain() {
            let Some(d) = self.devices.get(&id) else { continue };
            if let Ok(doc) = serde_json::to_value(&d.states) {
                ops.push(WriteOp::PutDoc { kind: DocKind::AlarmRuleState, id: id.0, title: id.to_string(), doc });
            }
        }
        match self.core.writer.submit_batch(ops).await {
            Ok(results) => {
                for e in results.into_iter().filter_map(Result::err) {
                    tracing::warn!(error = %e, "alarm rules: a rule state was not written");
                }
            }
            Err(e) => tracing::warn!(error = %e, "alarm rules: rule states were not written"),
        }
    }
}

/// The keys of `rules` that are its customer's or tenant's attributes.
fn owner_keys(rules: &ProfileAlarms) -> Vec<DataKey> {
    let keys = rules.alarms.iter().flat_map(|a| a.keys.iter());
    keys.filter(|k| matches!(k, DataKey::Customer(_) | DataKey::Tenant(_))).cloned().collect()
}

/// The values of a device's customer's and tenant's keys (their server attributes).
fn owner_values(
    store: &gridlinks_storage::Store,
    keys: &[DataKey],
    customer: Option<uuid::Uuid>,
    tenant: uuid::Uuid,
) -> Result<HashMap<DataKey, Value>, StoreError> {
    let mut out = HashMap::new();
    for k in keys {
        let (owner, name) = match k {
            DataKey::Customer(n) => (customer.map(DeviceId), n),
            DataKey::Tenant(n) => (Some(DeviceId(tenant)), n),
            _ => continue,
        };
        if let Some(v) = owner.map(|o| attribute(store, o, name, Some(AttributeScope::Server))).transpose()?.flatten() {
            out.insert(k.clone(), v);
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
        self.rules.any()
    }
    fn wants_attributes(&self) -> bool {
        self.rules.any()
    }
    fn telemetry<'a>(
        &'a self,
        device: &'a DeviceRecord,
        _tenant: uuid::Uuid,
        records: &'a [TsRecord],
    ) -> Option<gridlinks_ingest::BoxFuture<'a, Result<(), StoreError>>> {
        if !self.wants(device) {
            return None;
        }
        let pending = Feed::telemetry(self, device, records.to_vec())?;
        Some(Box::pin(async move {
            pending.await;
            Ok(())
        }))
    }
    fn attributes(
        &self,
        device: &DeviceRecord,
        _tenant: uuid::Uuid,
        scope: AttributeScope,
        values: &[(String, Value)],
        _now: Ts,
    ) {
        if !self.wants(device) {
            return;
        }
        // Attribute changes are never waited for on this path: a full queue hands the
        // change to a task that waits.
        if let Some(pending) = Feed::attributes(self, device, scope, values.to_vec()) {
            tokio::spawn(pending);
        }
    }
}
