//! Alarms, as ThingsBoard keeps them: one per originator and type while active, with a
//! severity changed in place, acknowledged and cleared (`ACTIVE_UNACK`, `ACTIVE_ACK`,
//! `CLEARED_UNACK`, `CLEARED_ACK`), assigned to a user, commented on. Stored as documents
//! ([`DocKind::Alarm`]) and indexed in memory ([`Alarms`]) so lists, counts and the rule
//! engine's "is it active" cost no storage read. Every function that takes a [`Caller`]
//! checks it as the entity services do: an alarm is its originator's tenant's and
//! customer's.
//!
//! [`rules`] compiles and evaluates device-profile alarm rules; [`engine`] runs them on
//! committed data.

pub mod engine;
pub mod rules;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gridlinks_storage::{DocKind, DocRecord, Store, StoreError, WriteOp, WriterHandle};
use gridlinks_thingsboard::model::entity_id;
use gridlinks_types::{DeviceId, Ts};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as J};
use uuid::Uuid;

use crate::auth::{Authority, Caller};
use crate::entities::{blocking, hidden, ServiceError, ServiceResult};
pub use rules::{Propagation, Severity};

/// An alarm's originator: an entity type as ThingsBoard names it, and its id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Originator {
    /// `DEVICE` or `ASSET`.
    #[serde(rename = "entityType")]
    pub kind: String,
    /// Its id.
    pub id: Uuid,
}

/// An alarm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alarm {
    /// Its id.
    #[serde(skip)]
    pub id: Uuid,
    /// When it was created, ms.
    #[serde(skip)]
    pub created_time: i64,
    /// Its type (one active alarm per originator and type).
    #[serde(skip)]
    pub alarm_type: String,
    /// Its tenant.
    pub tenant: Uuid,
    /// Its originator's customer when it was raised.
    pub customer: Option<Uuid>,
    /// What raised it.
    pub originator: Originator,
    /// How bad.
    pub severity: Severity,
    /// Acknowledged by a user.
    pub acknowledged: bool,
    /// Cleared (by its rule or a user).
    pub cleared: bool,
    /// The user it is assigned to.
    pub assignee: Option<Uuid>,
    /// When it was raised, and last seen true, ms.
    pub start_ts: i64,
    /// The last time its condition held.
    pub end_ts: i64,
    /// When acknowledged, cleared, assigned (0: not).
    pub ack_ts: i64,
    /// When cleared.
    pub clear_ts: i64,
    /// When assigned.
    pub assign_ts: i64,
    /// Free JSON (the rule's rendered details).
    pub details: J,
    /// Where else it shows.
    #[serde(flatten)]
    pub propagation: Propagation,
}

/// ThingsBoard's alarm statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `ACTIVE_UNACK`.
    ActiveUnack,
    /// `ACTIVE_ACK`.
    ActiveAck,
    /// `CLEARED_UNACK`.
    ClearedUnack,
    /// `CLEARED_ACK`.
    ClearedAck,
}

impl Status {
    /// As ThingsBoard spells it.
    pub fn name(self) -> &'static str {
        match self {
            Status::ActiveUnack => "ACTIVE_UNACK",
            Status::ActiveAck => "ACTIVE_ACK",
            Status::ClearedUnack => "CLEARED_UNACK",
            Status::ClearedAck => "CLEARED_ACK",
        }
    }

    /// Parses ThingsBoard's name.
    pub fn parse(s: &str) -> Option<Self> {
        [Status::ActiveUnack, Status::ActiveAck, Status::ClearedUnack, Status::ClearedAck]
            .into_iter()
            .find(|v| v.name() == s)
    }
}

/// ThingsBoard's `AlarmSearchStatus` list (`ANY`, `ACTIVE`, `CLEARED`, `ACK`, `UNACK`) as
/// the statuses it accepts: `ACTIVE`/`CLEARED` and `ACK`/`UNACK` each narrow when one of
/// the pair is given; `ANY`, or nothing: all (an empty list).
pub fn search_statuses(names: &[String]) -> Result<Vec<Status>, String> {
    let mut given = std::collections::BTreeSet::new();
    for n in names {
        match n.as_str() {
            "ANY" | "ACTIVE" | "CLEARED" | "ACK" | "UNACK" => given.insert(n.as_str()),
            other => return Err(format!("Invalid alarm search status: {other}")),
        };
    }
    let one_of = |a: &str, b: &str| match (given.contains(a), given.contains(b)) {
        (true, false) => Some(true),
        (false, true) => Some(false),
        _ => None,
    };
    let (cleared, acked) = (one_of("CLEARED", "ACTIVE"), one_of("ACK", "UNACK"));
    if given.contains("ANY") || (cleared.is_none() && acked.is_none()) {
        return Ok(Vec::new());
    }
    Ok([Status::ActiveUnack, Status::ActiveAck, Status::ClearedUnack, Status::ClearedAck]
        .into_iter()
        .filter(|s| {
            let (c, a) = (
                matches!(s, Status::ClearedUnack | Status::ClearedAck),
                matches!(s, Status::ActiveAck | Status::ClearedAck),
            );
            cleared.is_none_or(|x| x == c) && acked.is_none_or(|x| x == a)
        })
        .collect())
}

impl Alarm {
    /// Its status.
    pub fn status(&self) -> Status {
        match (self.cleared, self.acknowledged) {
            (false, false) => Status::ActiveUnack,
            (false, true) => Status::ActiveAck,
            (true, false) => Status::ClearedUnack,
            (true, true) => Status::ClearedAck,
        }
    }

    /// ThingsBoard's `Alarm` JSON.
    pub fn to_json(&self) -> J {
        json!({
            "id": entity_id("ALARM", self.id),
            "createdTime": self.created_time,
            "tenantId": entity_id("TENANT", self.tenant),
            "customerId": self.customer.map(|c| entity_id("CUSTOMER", c)),
            "type": self.alarm_type,
            "originator": entity_id(&self.originator.kind, self.originator.id),
            "severity": self.severity.name(),
            "acknowledged": self.acknowledged,
            "cleared": self.cleared,
            "assigneeId": self.assignee.map(|u| entity_id("USER", u)),
            "startTs": self.start_ts,
            "endTs": self.end_ts,
            "ackTs": self.ack_ts,
            "clearTs": self.clear_ts,
            "assignTs": self.assign_ts,
            "details": self.details,
            "propagate": self.propagation.propagate,
            "propagateToOwner": self.propagation.propagate_to_owner,
            "propagateToTenant": self.propagation.propagate_to_tenant,
            "propagateRelationTypes": self.propagation.propagate_relation_types.clone().unwrap_or_default(),
            "name": self.alarm_type,
            "status": self.status().name(),
        })
    }

    /// An alarm as an outbox holds it (created at its start, which a rule's alarm is).
    pub fn from_written(id: Uuid, alarm_type: String, doc: J) -> Result<Self, StoreError> {
        let mut a = Self::from_doc(DocRecord { id, created_time: 0, title: alarm_type, doc })?;
        a.created_time = a.start_ts;
        Ok(a)
    }

    fn from_doc(d: DocRecord) -> Result<Self, StoreError> {
        let mut a: Alarm = serde_json::from_value(d.doc).map_err(|_| StoreError::Corrupt("alarm document"))?;
        a.id = d.id;
        a.created_time = d.created_time;
        a.alarm_type = d.title;
        Ok(a)
    }

    fn to_op(&self, first_tenant: Uuid) -> Result<WriteOp, ServiceError> {
        let mut doc = serde_json::to_value(self).map_err(|e| ServiceError::Internal(e.to_string()))?;
        // `tenantId` as every document has it, so deleting a tenant finds its alarms.
        if let (Some(o), true) = (doc.as_object_mut(), self.tenant != first_tenant) {
            o.insert("tenantId".into(), self.tenant.to_string().into());
        }
        Ok(WriteOp::PutDoc { kind: DocKind::Alarm, id: self.id, title: self.alarm_type.clone(), doc })
    }
}

/// What a list asks for (ThingsBoard's `AlarmQuery` / `AlarmQueryV2`).
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// One originator's only.
    pub originator: Option<Uuid>,
    /// Any of these statuses (empty: any).
    pub statuses: Vec<Status>,
    /// Any of these severities (empty: any).
    pub severities: Vec<Severity>,
    /// Any of these types (empty: any).
    pub types: Vec<String>,
    /// Assigned to this user.
    pub assignee: Option<Uuid>,
    /// Created at or after, ms.
    pub start: Option<i64>,
    /// Created at or before, ms.
    pub end: Option<i64>,
    /// In the type, severity or status (any case), as ThingsBoard searches.
    pub text: Option<String>,
}

/// Every alarm, indexed; writes go through the storage writer.
pub struct Alarms {
    store: Store,
    writer: WriterHandle,
    first_tenant: Uuid,
    index: RwLock<Index>,
    /// Other nodes' document changes seen when the index was last loaded.
    generation: AtomicU64,
    /// Serialises changes of one originator's alarms (so one is active per type).
    locks: Vec<tokio::sync::Mutex<()>>,
    /// Counts changes, for whoever follows alarms live (the WebSocket API).
    changes: tokio::sync::watch::Sender<u64>,
    /// Where alarm events go to notify.
    notify: crate::notify::Sender,
    /// Counts writes of customers' and tenants' attributes on this node (alarm rules'
    /// dynamic thresholds read them).
    owner_attributes: AtomicU64,
}

#[derive(Default)]
struct Index {
    by_id: HashMap<Uuid, Arc<Alarm>>,
    /// The active alarm of an originator, by type (looked up without allocating).
    active: HashMap<Uuid, HashMap<String, Uuid>>,
    /// Each alarm's comments.
    comments: HashMap<Uuid, Vec<Uuid>>,
}

impl Index {
    fn put(&mut self, a: Arc<Alarm>) {
        if !a.cleared {
            self.active.entry(a.originator.id).or_default().insert(a.alarm_type.clone(), a.id);
        } else {
            self.unset_active(&a);
        }
        self.by_id.insert(a.id, a);
    }

    fn remove(&mut self, id: Uuid) {
        self.comments.remove(&id);
        if let Some(a) = self.by_id.remove(&id) {
            self.unset_active(&a);
        }
    }

    /// `a` is no longer its originator's active alarm of its type (if it was).
    fn unset_active(&mut self, a: &Alarm) {
        let Some(types) = self.active.get_mut(&a.originator.id) else { return };
        if types.get(&a.alarm_type) == Some(&a.id) {
            types.remove(&a.alarm_type);
            if types.is_empty() {
                self.active.remove(&a.originator.id);
            }
        }
    }

    fn active(&self, originator: Uuid, alarm_type: &str) -> Option<&Arc<Alarm>> {
        self.active.get(&originator)?.get(alarm_type).and_then(|id| self.by_id.get(id))
    }
}

/// What [`Alarms::raise`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raised {
    /// A new alarm.
    Created,
    /// The active one changed severity.
    SeverityChanged(Severity),
    /// The active one, seen again.
    Updated,
}

impl Alarms {
    /// Says that a customer's or tenant's attributes changed on this node: alarm rules read
    /// them again before their next evaluation.
    pub fn owner_attributes_changed(&self) {
        self.owner_attributes.fetch_add(1, Ordering::Release);
    }

    /// How many times [`Alarms::owner_attributes_changed`] was called.
    pub fn owner_generation(&self) -> u64 {
        self.owner_attributes.load(Ordering::Acquire)
    }

    /// The alarms in `store`, indexed.
    pub fn load(
        store: Store,
        writer: WriterHandle,
        first_tenant: Uuid,
        notify: crate::notify::Sender,
    ) -> Result<Self, StoreError> {
        let me = Self {
            store,
            writer,
            first_tenant,
            index: RwLock::default(),
            generation: AtomicU64::new(0),
            locks: (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
            changes: tokio::sync::watch::Sender::new(0),
            notify,
            owner_attributes: AtomicU64::new(0),
        };
        me.reload()?;
        Ok(me)
    }

    fn reload(&self) -> Result<(), StoreError> {
        let generation = self.store.remote_generation("docs");
        let mut index = Index::default();
        for d in self.store.docs(DocKind::Alarm)? {
            index.put(Arc::new(Alarm::from_doc(d)?));
        }
        for c in self.store.docs(DocKind::AlarmComment)? {
            if let Ok(alarm) = c.title.parse() {
                index.comments.entry(alarm).or_default().push(c.id);
            }
        }
        *self.index.write() = index;
        self.generation.store(generation, Ordering::Release);
        self.changed();
        Ok(())
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// A receiver told of every change (a change made on another node: when this node
    /// next reads the alarms after catching up).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Reloads the index when other nodes changed documents since it was loaded.
    fn fresh(&self) -> Result<(), StoreError> {
        if self.store.remote_generation("docs") != self.generation.load(Ordering::Acquire) {
            self.reload()?;
        }
        Ok(())
    }

    fn lock(&self, originator: Uuid) -> &tokio::sync::Mutex<()> {
        &self.locks[originator.as_u128() as usize % self.locks.len()]
    }

    /// An alarm by id, unchecked.
    pub fn by_id(&self, id: Uuid) -> Result<Option<Arc<Alarm>>, StoreError> {
        self.fresh()?;
        Ok(self.index.read().by_id.get(&id).cloned())
    }

    /// The active alarm of an originator and type, unchecked.
    pub fn active(&self, originator: Uuid, alarm_type: &str) -> Result<Option<Arc<Alarm>>, StoreError> {
        self.fresh()?;
        Ok(self.index.read().active(originator, alarm_type).cloned())
    }

    /// Every alarm `keep` accepts.
    pub fn matching(&self, keep: impl Fn(&Alarm) -> bool) -> Result<Vec<Arc<Alarm>>, StoreError> {
        self.fresh()?;
        Ok(self.index.read().by_id.values().filter(|a| keep(a)).cloned().collect())
    }

    /// Writes an alarm, and notifies what changed of it.
    async fn write(&self, a: Alarm) -> ServiceResult<Arc<Alarm>> {
        use crate::notify::AlarmAction;
        let old = self.index.read().by_id.get(&a.id).cloned();
        self.writer.submit(a.to_op(self.first_tenant)?).await?;
        let action = match &old {
            None => Some(AlarmAction::Created),
            Some(o) if !o.cleared && a.cleared => Some(AlarmAction::Cleared),
            Some(o) if !o.acknowledged && a.acknowledged => Some(AlarmAction::Acknowledged),
            Some(o) if o.severity != a.severity => Some(AlarmAction::SeverityChanged),
            Some(_) => None,
        };
        let a = Arc::new(a);
        self.index.write().put(a.clone());
        self.changed();
        if let Some(action) = action {
            self.notify.send(crate::notify::Event::Alarm(a.clone(), action)).await;
        }
        Ok(a)
    }

    /// Raises `alarm_type` on `originator` at `severity`, or updates the active alarm of
    /// that type in place. From a rule (`client` false), the active alarm is never
    /// downgraded and its `endTs` becomes now; from a client, it takes the request's
    /// severity, `startTs` and `endTs`. A new alarm starts at `ts`.
    pub async fn raise(&self, new: NewAlarm, client: bool) -> ServiceResult<(Arc<Alarm>, Raised)> {
        let _one = self.lock(new.originator.id).lock().await;
        if let Some(cur) = self.active(new.originator.id, &new.alarm_type)? {
            let mut a = (*cur).clone();
            if !client && new.severity < a.severity {
                return Ok((cur, Raised::Updated));
            }
            let outcome = match a.severity == new.severity {
                true => Raised::Updated,
                false => Raised::SeverityChanged(a.severity),
            };
            a.severity = new.severity;
            if client {
                (a.start_ts, a.end_ts) = (new.ts, new.end_ts.max(new.ts));
                a.propagation = new.propagation;
            } else {
                a.end_ts = Ts::now().0;
            }
            if let Some(d) = new.details {
                a.details = d;
            }
            let a = self.write(a).await?;
            if let Raised::SeverityChanged(old) = outcome {
                let text = format!("Alarm severity was updated from {} to {}", old.name(), a.severity.name());
                let params = json!({"oldSeverity": old.name(), "newSeverity": a.severity.name()});
                self.system_comment(&a, None, "SEVERITY_CHANGED", text, params).await?;
            }
            return Ok((a, outcome));
        }
        let a = Alarm {
            id: Uuid::new_v4(),
            created_time: Ts::now().0,
            alarm_type: new.alarm_type,
            tenant: new.tenant,
            customer: new.customer,
            originator: new.originator,
            severity: new.severity,
            acknowledged: false,
            cleared: false,
            assignee: None,
            start_ts: new.ts,
            end_ts: new.end_ts.max(new.ts),
            ack_ts: 0,
            clear_ts: 0,
            assign_ts: 0,
            details: new.details.unwrap_or_else(|| json!({})),
            propagation: new.propagation,
        };
        Ok((self.write(a).await?, Raised::Created))
    }

    /// Clears the active alarm of `alarm_type` on `originator`, if any (the rule engine's).
    pub async fn clear_active(
        &self,
        originator: Uuid,
        alarm_type: &str,
        details: Option<J>,
        ts: i64,
    ) -> ServiceResult<Option<Arc<Alarm>>> {
        let _one = self.lock(originator).lock().await;
        let Some(cur) = self.active(originator, alarm_type)? else { return Ok(None) };
        let mut a = (*cur).clone();
        a.cleared = true;
        a.clear_ts = ts;
        if let Some(d) = details {
            a.details = d;
        }
        Ok(Some(self.write(a).await?))
    }

    /// Applies `change` to alarm `id` under its originator's lock; `None` from `change`:
    /// nothing to do (answered with the alarm as it is).
    async fn change(&self, id: Uuid, change: impl FnOnce(&Alarm) -> Option<Alarm>) -> ServiceResult<Arc<Alarm>> {
        let cur = self.by_id(id)?.ok_or_else(|| missing(id))?;
        let _one = self.lock(cur.originator.id).lock().await;
        let cur = self.by_id(id)?.ok_or_else(|| missing(id))?;
        match change(&cur) {
            Some(a) => self.write(a).await,
            None => Ok(cur),
        }
    }

    /// Deletes alarm `id` and its comments, unchecked.
    async fn delete(&self, id: Uuid) -> ServiceResult<()> {
        let cur = self.by_id(id)?.ok_or_else(|| missing(id))?;
        let _one = self.lock(cur.originator.id).lock().await;
        for c in self.comments_of(id).await? {
            self.writer.submit(WriteOp::DeleteDoc(DocKind::AlarmComment, c.id)).await?;
        }
        match self.writer.submit(WriteOp::DeleteDoc(DocKind::Alarm, id)).await {
            Ok(_) | Err(StoreError::DocNotFound(..)) => {}
            Err(e) => return Err(e.into()),
        }
        self.index.write().remove(id);
        self.changed();
        Ok(())
    }

    /// Deletes every alarm of `originator` (a deleted device or asset), unchecked.
    pub async fn delete_of(&self, originator: Uuid) -> ServiceResult<()> {
        for a in self.matching(|a| a.originator.id == originator)? {
            self.delete(a.id).await?;
        }
        Ok(())
    }
}

/// An alarm to raise.
#[derive(Clone, Debug)]
pub struct NewAlarm {
    /// Its tenant.
    pub tenant: Uuid,
    /// Its originator's customer.
    pub customer: Option<Uuid>,
    /// Its originator.
    pub originator: Originator,
    /// Its type.
    pub alarm_type: String,
    /// Its severity.
    pub severity: Severity,
    /// Its details (`None`: kept, or `{}` when new).
    pub details: Option<J>,
    /// When its condition held (`startTs`), ms.
    pub ts: i64,
    /// `endTs` (at most `ts`: the same).
    pub end_ts: i64,
    /// Where else it shows.
    pub propagation: Propagation,
}

fn missing(id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("Alarm with id [{id}] is not found"))
}

/// The tenant and customer of an originator the caller may use (a device or an asset).
pub async fn originator_owner(core: &crate::Core, me: &Caller, o: &Originator) -> ServiceResult<(Uuid, Option<Uuid>)> {
    match o.kind.as_str() {
        "DEVICE" => {
            let d = crate::entities::devices::get(core, me, DeviceId(o.id)).await?;
            Ok((core.tenant_of(d.tenant), d.customer))
        }
        "ASSET" => {
            let a = crate::entities::assets::get(core, me, o.id).await?;
            Ok((core.doc_tenant(&a), crate::entities::assets::customer(&a)))
        }
        other => Err(ServiceError::Invalid(format!("alarms of a {other} are not supported: DEVICE or ASSET"))),
    }
}

/// Alarm `id`, if the caller may see it.
pub async fn get(core: &crate::Core, me: &Caller, id: Uuid) -> ServiceResult<Arc<Alarm>> {
    let a = core.alarms.by_id(id)?.ok_or_else(|| missing(id))?;
    if !me.may_use(a.tenant, a.customer) {
        return Err(hidden(me, a.tenant, || missing(id)));
    }
    Ok(a)
}

/// The alarms the caller may see that `f` accepts.
pub fn query(core: &crate::Core, me: &Caller, f: &Filter) -> ServiceResult<Vec<Arc<Alarm>>> {
    if me.authority == Authority::SysAdmin {
        return Err(ServiceError::Forbidden);
    }
    let text = f.text.as_ref().map(|t| t.to_lowercase()).filter(|t| !t.is_empty());
    Ok(core.alarms.matching(|a| {
        me.may_use(a.tenant, a.customer)
            && f.originator.is_none_or(|o| o == a.originator.id)
            && (f.statuses.is_empty() || f.statuses.contains(&a.status()))
            && (f.severities.is_empty() || f.severities.contains(&a.severity))
            && (f.types.is_empty() || f.types.contains(&a.alarm_type))
            && f.assignee.is_none_or(|u| a.assignee == Some(u))
            && f.start.is_none_or(|s| a.created_time >= s)
            && f.end.is_none_or(|e| a.created_time <= e)
            && text.as_ref().is_none_or(|t| {
                a.alarm_type.to_lowercase().contains(t)
                    || a.severity.name().to_lowercase().contains(t)
                    || a.status().name().to_lowercase().contains(t)
            })
    })?)
}

/// What a client sends to create or update an alarm (`POST /api/alarm`).
#[derive(Clone, Debug)]
pub struct AlarmSave {
    /// Update this one; `None` creates (or updates the active alarm of the type).
    pub id: Option<Uuid>,
    /// Its originator.
    pub originator: Originator,
    /// Its type.
    pub alarm_type: String,
    /// Its severity.
    pub severity: Severity,
    /// Its details.
    pub details: Option<J>,
    /// `startTs` (0: now).
    pub start_ts: i64,
    /// `endTs` (0: the start).
    pub end_ts: i64,
    /// Where else it shows.
    pub propagation: Propagation,
    /// Acknowledge it (at `ack_ts`, 0: now) if it is not.
    pub acknowledged: Option<i64>,
    /// Clear it (at `clear_ts`, 0: now) if it is not.
    pub cleared: Option<i64>,
}

/// Creates or updates an alarm of an originator the caller may use, as ThingsBoard does:
/// without an id, the active alarm of the originator and type is updated in place if
/// there is one.
pub async fn save(core: &crate::Core, me: &Caller, s: AlarmSave) -> ServiceResult<Arc<Alarm>> {
    if s.alarm_type.trim().is_empty()
        || s.alarm_type.chars().count() > 255
        || s.alarm_type.chars().any(char::is_control)
    {
        return Err(ServiceError::Invalid("Alarm type should be specified: 1 to 255 characters".into()));
    }
    if s.details.as_ref().is_some_and(|d| !d.is_object() && !d.is_null()) {
        return Err(ServiceError::Invalid("Alarm details should be a JSON object".into()));
    }
    if s.end_ts > 0 && s.start_ts > s.end_ts {
        return Err(ServiceError::Invalid("Alarm start ts can't be greater then alarm end ts!".into()));
    }
    let (tenant, customer) = originator_owner(core, me, &s.originator).await?;
    let now = Ts::now().0;
    let start = if s.start_ts > 0 { s.start_ts } else { now };
    let details = s.details.filter(|d| !d.is_null());
    let a = match s.id {
        Some(id) => {
            let cur = get(core, me, id).await?;
            if cur.originator != s.originator {
                return Err(ServiceError::Invalid("An alarm's originator cannot be changed".into()));
            }
            let old = cur.severity;
            let a = core
                .alarms
                .change(id, |cur| {
                    let mut a = cur.clone();
                    (a.severity, a.start_ts, a.end_ts) = (s.severity, start, s.end_ts.max(start));
                    if let Some(d) = details {
                        a.details = d;
                    }
                    a.propagation = s.propagation;
                    Some(a)
                })
                .await?;
            if old != a.severity {
                let text = format!("Alarm severity was updated from {} to {}", old.name(), a.severity.name());
                let params = json!({"oldSeverity": old.name(), "newSeverity": a.severity.name()});
                core.alarms.system_comment(&a, Some(me), "SEVERITY_CHANGED", text, params).await?;
            }
            a
        }
        None => {
            let new = NewAlarm {
                tenant,
                customer,
                originator: s.originator,
                alarm_type: s.alarm_type,
                severity: s.severity,
                details,
                ts: start,
                end_ts: s.end_ts,
                propagation: s.propagation,
            };
            core.alarms.raise(new, true).await?.0
        }
    };
    let mut a = a;
    if let Some(at) = s.acknowledged.filter(|_| !a.acknowledged) {
        a = mark(core, me, a.id, if at > 0 { at } else { now }, true).await?;
    }
    if let Some(at) = s.cleared.filter(|_| !a.cleared) {
        a = mark(core, me, a.id, if at > 0 { at } else { now }, false).await?;
    }
    Ok(a)
}

/// A user's name in system comments: "first last", else the email.
fn title(me: &Caller) -> String {
    me.email.clone()
}

/// Acknowledges (`ack`) or clears an alarm at `at`, with ThingsBoard's system comment; 400
/// when it is already.
async fn mark(core: &crate::Core, me: &Caller, id: Uuid, at: i64, ack: bool) -> ServiceResult<Arc<Alarm>> {
    let mut already = false;
    let a = core
        .alarms
        .change(id, |cur| {
            already = if ack { cur.acknowledged } else { cur.cleared };
            (!already).then(|| match ack {
                true => Alarm { acknowledged: true, ack_ts: at, ..cur.clone() },
                false => Alarm { cleared: true, clear_ts: at, ..cur.clone() },
            })
        })
        .await?;
    let (what, subtype) = if ack { ("acknowledged", "ACKED_BY_USER") } else { ("cleared", "CLEARED_BY_USER") };
    if already {
        return Err(ServiceError::Invalid(format!("Alarm was already {what}!")));
    }
    let who = title(me);
    let text = format!("Alarm was {what} by user {who}");
    core.alarms.system_comment(&a, Some(me), subtype, text, json!({"userName": who})).await?;
    Ok(a)
}

/// Acknowledges an alarm (400 when it is already).
pub async fn ack(core: &crate::Core, me: &Caller, id: Uuid) -> ServiceResult<Arc<Alarm>> {
    get(core, me, id).await?;
    mark(core, me, id, Ts::now().0, true).await
}

/// Clears an alarm (400 when it is already).
pub async fn clear(core: &crate::Core, me: &Caller, id: Uuid) -> ServiceResult<Arc<Alarm>> {
    get(core, me, id).await?;
    mark(core, me, id, Ts::now().0, false).await
}

/// Assigns an alarm to a user who may see it (`None`: unassigns); 400 when nothing changes.
pub async fn assign(
    core: &crate::Core,
    auth: &crate::auth::Auth,
    me: &Caller,
    id: Uuid,
    user: Option<Uuid>,
) -> ServiceResult<Arc<Alarm>> {
    let a = get(core, me, id).await?;
    let assignee = match user {
        Some(u) => {
            let who = auth
                .users
                .by_id(u)
                .ok_or_else(|| ServiceError::NotFound(format!("User with id [{u}] is not found")))?;
            if !who.caller.may_use(a.tenant, a.customer) {
                return Err(ServiceError::Invalid("The user may not see this alarm".into()));
            }
            Some(who.caller.email.clone())
        }
        None => None,
    };
    let mut same = false;
    let a = core
        .alarms
        .change(id, |cur| {
            same = cur.assignee == user;
            (!same).then(|| Alarm { assignee: user, assign_ts: Ts::now().0, ..cur.clone() })
        })
        .await?;
    let who = title(me);
    match (same, assignee) {
        (true, Some(_)) => Err(ServiceError::Invalid("Alarm was already assigned to this user!".into())),
        (true, None) => Err(ServiceError::Invalid("Alarm was already unassigned!".into())),
        (false, Some(to)) => {
            let text = format!("Alarm was assigned by user {who} to user {to}");
            let params = json!({"userName": who, "assigneeName": to});
            core.alarms.system_comment(&a, Some(me), "ASSIGNED_TO_USER", text, params).await?;
            Ok(a)
        }
        (false, None) => {
            let text = format!("Alarm was unassigned by user {who}");
            core.alarms.system_comment(&a, Some(me), "UNASSIGNED_BY_USER", text, json!({"userName": who})).await?;
            Ok(a)
        }
    }
}

/// Deletes an alarm the caller may see, with its comments.
pub async fn delete(core: &crate::Core, me: &Caller, id: Uuid) -> ServiceResult<()> {
    get(core, me, id).await?;
    core.alarms.delete(id).await
}

/// The highest severity of the alarms the caller may see that `f` accepts.
pub fn highest_severity(core: &crate::Core, me: &Caller, f: &Filter) -> ServiceResult<Option<Severity>> {
    Ok(query(core, me, f)?.iter().map(|a| a.severity).max())
}

// ---- comments ----------------------------------------------------------------------

/// A comment on an alarm.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Comment {
    /// Its id.
    #[serde(skip)]
    pub id: Uuid,
    /// When, ms.
    #[serde(skip)]
    pub created_time: i64,
    /// The alarm.
    pub alarm_id: Uuid,
    /// Who wrote it (a system comment: who acted, if a user did).
    pub user_id: Option<Uuid>,
    /// `OTHER` (a user's) or `SYSTEM`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `{"text": …}`; a system comment's `subtype` and parameters; once edited,
    /// `edited`, `editedOn`.
    pub comment: J,
    /// The alarm's tenant (as every document has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
}

impl Alarms {
    async fn comments_of(&self, alarm: Uuid) -> ServiceResult<Vec<Comment>> {
        self.fresh()?;
        let ids = self.index.read().comments.get(&alarm).cloned().unwrap_or_default();
        let store = self.store.clone();
        let docs = blocking(move || {
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                out.extend(store.doc(DocKind::AlarmComment, id)?);
            }
            Ok(out)
        })
        .await?;
        Ok(docs
            .into_iter()
            .filter_map(|d| {
                let mut c: Comment = serde_json::from_value(d.doc).ok()?;
                (c.id, c.created_time) = (d.id, d.created_time);
                Some(c)
            })
            .collect())
    }

    async fn put_comment(&self, a: &Alarm, c: Comment) -> ServiceResult<Comment> {
        let tenant = (a.tenant != self.first_tenant).then(|| a.tenant.to_string());
        let mut c = Comment { tenant_id: tenant, ..c };
        let doc = serde_json::to_value(&c).map_err(|e| ServiceError::Internal(e.to_string()))?;
        let op = WriteOp::PutDoc { kind: DocKind::AlarmComment, id: c.id, title: a.id.to_string(), doc };
        if let gridlinks_storage::WriteOutcome::Doc(d) = self.writer.submit(op).await? {
            c.created_time = d.created_time;
        }
        let mut index = self.index.write();
        let list = index.comments.entry(a.id).or_default();
        if !list.contains(&c.id) {
            list.push(c.id);
        }
        Ok(c)
    }

    /// Records what happened to an alarm as ThingsBoard does (`subtype`, its parameters).
    async fn system_comment(
        &self,
        a: &Alarm,
        by: Option<&Caller>,
        subtype: &str,
        text: String,
        params: J,
    ) -> ServiceResult<()> {
        let mut comment = json!({"text": text, "subtype": subtype});
        if let (Some(o), J::Object(p)) = (comment.as_object_mut(), params) {
            o.extend(p);
        }
        let c = Comment {
            id: Uuid::new_v4(),
            created_time: 0,
            alarm_id: a.id,
            user_id: by.map(|c| c.user),
            kind: "SYSTEM".into(),
            comment,
            tenant_id: None,
        };
        self.put_comment(a, c).await.map(drop)
    }
}

fn missing_comment(id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("Alarm comment with id [{id}] is not found"))
}

/// Adds (`id` none) or edits the caller's comment (`{"text": …}`) on an alarm it may see.
pub async fn save_comment(
    core: &crate::Core,
    me: &Caller,
    alarm: Uuid,
    id: Option<Uuid>,
    comment: J,
) -> ServiceResult<Comment> {
    let a = get(core, me, alarm).await?;
    let text = comment.get("text").and_then(J::as_str).unwrap_or_default();
    if !comment.is_object() || text.trim().is_empty() || comment.to_string().len() > 10_000 {
        return Err(ServiceError::Invalid("Alarm comment should be specified: a text of at most 10000 bytes".into()));
    }
    let c = match id {
        Some(id) => {
            let old = core.alarms.comments_of(alarm).await?.into_iter().find(|c| c.id == id);
            let old = old.ok_or_else(|| ServiceError::Invalid("Can't update non existing alarm comment!".into()))?;
            if old.kind == "SYSTEM" {
                return Err(ServiceError::Invalid("System alarm comment can't be updated!".into()));
            }
            if old.user_id != Some(me.user) {
                return Err(ServiceError::Forbidden);
            }
            let mut comment = comment;
            if let Some(o) = comment.as_object_mut() {
                o.insert("edited".into(), "true".into());
                o.insert("editedOn".into(), Ts::now().0.into());
            }
            Comment { comment, ..old }
        }
        None => Comment {
            id: Uuid::new_v4(),
            created_time: 0,
            alarm_id: alarm,
            user_id: Some(me.user),
            kind: "OTHER".into(),
            comment,
            tenant_id: None,
        },
    };
    core.alarms.put_comment(&a, c).await
}

/// The comments on an alarm the caller may see, oldest first.
pub async fn comments(core: &crate::Core, me: &Caller, alarm: Uuid) -> ServiceResult<Vec<Comment>> {
    get(core, me, alarm).await?;
    let mut all = core.alarms.comments_of(alarm).await?;
    all.sort_by_key(|c| c.created_time);
    Ok(all)
}

/// Deletes a comment on an alarm the caller may see, as ThingsBoard does: it becomes a
/// system comment saying who deleted it. Only its author or a tenant administrator may.
pub async fn delete_comment(core: &crate::Core, me: &Caller, alarm: Uuid, id: Uuid) -> ServiceResult<()> {
    let a = get(core, me, alarm).await?;
    let c =
        core.alarms.comments_of(alarm).await?.into_iter().find(|c| c.id == id).ok_or_else(|| missing_comment(id))?;
    if c.kind == "SYSTEM" {
        return Err(ServiceError::Invalid("System comment could not be deleted".into()));
    }
    if c.user_id != Some(me.user) && me.authority != Authority::TenantAdmin {
        return Err(ServiceError::Forbidden);
    }
    let who = title(me);
    let comment =
        json!({"text": format!("Comment was deleted by user {who}"), "subtype": "COMMENT_DELETED", "userName": who});
    core.alarms.put_comment(&a, Comment { kind: "SYSTEM".into(), user_id: None, comment, ..c }).await.map(drop)
}
