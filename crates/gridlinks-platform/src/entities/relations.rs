//! Relations of any type between entities (devices, assets, customers, dashboards, the
//! tenant, profiles), stored as documents of the caller's tenant. The "Created" relation
//! from a gateway to a device is the device's gateway ([`super::devices::relate_gateway`]):
//! it is read and written through the same calls, so a gateway keeps writing only for its
//! own devices. A caller reads a relation when it may read both ends (as ThingsBoard
//! filters by read permission) and writes one when it may change both (a tenant
//! administrator, its tenant's entities).

use std::collections::{HashSet, VecDeque};

use gridlinks_storage::{DocKind, DocRecord, Store, StoreError, WriteOp};
use gridlinks_types::DeviceId;
use serde_json::{json, Value as J};
use sha2::Digest;
use uuid::Uuid;

use super::{blocking, hidden, ServiceError, ServiceResult};
use crate::auth::Caller;
use crate::core::Core;

/// The relation type of a gateway's devices.
pub const CREATED: &str = "Created";
/// The group of everyday relations.
pub const COMMON: &str = "COMMON";

/// The kinds of entity a relation may join.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntityKind {
    /// A device.
    Device,
    /// An asset.
    Asset,
    /// A customer.
    Customer,
    /// A dashboard.
    Dashboard,
    /// The tenant.
    Tenant,
    /// An asset profile.
    AssetProfile,
    /// A device profile.
    DeviceProfile,
}

impl EntityKind {
    /// ThingsBoard's name of it (`DEVICE`, `ASSET` …).
    pub fn name(self) -> &'static str {
        match self {
            EntityKind::Device => "DEVICE",
            EntityKind::Asset => "ASSET",
            EntityKind::Customer => "CUSTOMER",
            EntityKind::Dashboard => "DASHBOARD",
            EntityKind::Tenant => "TENANT",
            EntityKind::AssetProfile => "ASSET_PROFILE",
            EntityKind::DeviceProfile => "DEVICE_PROFILE",
        }
    }

    /// The kind ThingsBoard names `s`; an error naming it when GridLinks has none.
    pub fn parse(s: &str) -> ServiceResult<Self> {
        Ok(match s {
            "DEVICE" => EntityKind::Device,
            "ASSET" => EntityKind::Asset,
            "CUSTOMER" => EntityKind::Customer,
            "DASHBOARD" => EntityKind::Dashboard,
            "TENANT" => EntityKind::Tenant,
            "ASSET_PROFILE" => EntityKind::AssetProfile,
            "DEVICE_PROFILE" => EntityKind::DeviceProfile,
            other => {
                return Err(ServiceError::Invalid(format!(
                    "entity type '{other}' is not supported: GridLinks relates DEVICE, ASSET, CUSTOMER, DASHBOARD, TENANT, ASSET_PROFILE and DEVICE_PROFILE"
                )))
            }
        })
    }
}

/// One entity: its kind and id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntityRef {
    /// Which kind.
    pub kind: EntityKind,
    /// Its id.
    pub id: Uuid,
}

impl EntityRef {
    /// `{"entityType":…,"id":…}`.
    pub fn json(&self) -> J {
        json!({"entityType": self.kind.name(), "id": self.id})
    }

    /// The entity of a ThingsBoard `{"entityType","id"}` object.
    pub fn parse(j: &J) -> ServiceResult<Self> {
        let kind = j.get("entityType").and_then(J::as_str).ok_or_else(|| invalid("entityType is required"))?;
        let id = j.get("id").and_then(J::as_str).ok_or_else(|| invalid("id is required"))?;
        Self::of(kind, id)
    }

    /// The entity of kind `kind` (ThingsBoard's name) and id `id` (a UUID string).
    pub fn of(kind: &str, id: &str) -> ServiceResult<Self> {
        let id = id.parse().map_err(|_| invalid(&format!("Invalid UUID string: {id}")))?;
        Ok(Self { kind: EntityKind::parse(kind)?, id })
    }
}

fn invalid(m: &str) -> ServiceError {
    ServiceError::Invalid(m.to_owned())
}

/// Who an entity belongs to and what it is called.
#[derive(Clone, Debug)]
pub struct Owner {
    /// Its tenant.
    pub tenant: Uuid,
    /// Its customer (a customer: itself).
    pub customer: Option<Uuid>,
    /// Customers it is shared with besides (a dashboard's).
    pub shared_with: Vec<Uuid>,
    /// Its name (title).
    pub name: String,
}

impl Owner {
    /// Whether `me` may read it.
    pub fn readable_by(&self, me: &Caller) -> bool {
        me.may_use(self.tenant, self.customer)
            || me.customer.is_some_and(|c| self.shared_with.contains(&c)) && me.may_use(self.tenant, me.customer)
    }

    /// Whether `me` may change it (and relate it): a tenant administrator of its tenant.
    pub fn writable_by(&self, me: &Caller) -> bool {
        me.customer.is_none() && me.may_use(self.tenant, None)
    }
}

/// Who owns `e`, if it exists (blocking).
pub fn owner(core: &Core, store: &Store, e: EntityRef) -> Result<Option<Owner>, StoreError> {
    let from_doc = |kind: DocKind| -> Result<Option<(DocRecord, Uuid)>, StoreError> {
        Ok(store.doc(kind, e.id)?.map(|d| {
            let tenant = core.doc_tenant(&d);
            (d, tenant)
        }))
    };
    let plain = |tenant, name| Owner { tenant, customer: None, shared_with: Vec::new(), name };
    Ok(match e.kind {
        EntityKind::Device => store.device(DeviceId(e.id))?.map(|d| Owner {
            tenant: core.tenant_of(d.tenant),
            customer: d.customer,
            shared_with: Vec::new(),
            name: d.name,
        }),
        EntityKind::Asset => from_doc(DocKind::Asset)?.map(|(d, tenant)| Owner {
            tenant,
            customer: super::assets::customer(&d),
            shared_with: Vec::new(),
            name: d.title,
        }),
        EntityKind::Customer => from_doc(DocKind::Customer)?.map(|(d, tenant)| Owner {
            tenant,
            customer: Some(d.id),
            shared_with: Vec::new(),
            name: d.title,
        }),
        EntityKind::Dashboard => from_doc(DocKind::Dashboard)?.map(|(d, tenant)| {
            let shared_with = super::dashboards::assigned_customers(&d);
            Owner { tenant, customer: None, shared_with, name: d.title }
        }),
        EntityKind::Tenant => from_doc(DocKind::Tenant)?.map(|(d, _)| plain(e.id, d.title)),
        EntityKind::AssetProfile => from_doc(DocKind::AssetProfile)?.map(|(d, tenant)| plain(tenant, d.title)),
        EntityKind::DeviceProfile => {
            store.profile(gridlinks_types::ProfileId(e.id))?.map(|p| plain(core.tenant_of(p.tenant), p.name))
        }
    })
}

/// `e`'s owner if the caller may read it; "not found" (or "forbidden") when not.
pub async fn readable(core: &Core, me: &Caller, e: EntityRef) -> ServiceResult<Owner> {
    let store = core.store.clone();
    let missing = || ServiceError::NotFound(format!("{} with id [{}] is not found", e.kind.name(), e.id));
    let found = {
        let core = core.clone();
        blocking(move || owner(&core, &store, e)).await?
    };
    let o = found.ok_or_else(missing)?;
    if !o.readable_by(me) {
        return Err(hidden(me, o.tenant, missing));
    }
    Ok(o)
}

async fn writable(core: &Core, me: &Caller, e: EntityRef) -> ServiceResult<Owner> {
    let o = readable(core, me, e).await?;
    if !o.writable_by(me) {
        return Err(ServiceError::Forbidden);
    }
    Ok(o)
}

/// A relation.
#[derive(Clone, Debug, PartialEq)]
pub struct Relation {
    /// Where it starts.
    pub from: EntityRef,
    /// Where it ends.
    pub to: EntityRef,
    /// Its type (`Contains`, `Manages`, `Created` …).
    pub relation_type: String,
    /// Its group (`COMMON` unless said).
    pub group: String,
    /// Anything the client attached.
    pub additional_info: J,
}

impl Relation {
    /// ThingsBoard's `EntityRelation` JSON.
    pub fn json(&self) -> J {
        json!({
            "from": self.from.json(),
            "to": self.to.json(),
            "type": self.relation_type,
            "typeGroup": self.group,
            "additionalInfo": self.additional_info,
        })
    }

    /// ThingsBoard's `EntityRelationInfo` JSON: the relation and its ends' names.
    pub fn info_json(&self, from_name: &str, to_name: &str) -> J {
        let mut j = self.json();
        if let Some(o) = j.as_object_mut() {
            o.insert("fromName".into(), from_name.into());
            o.insert("toName".into(), to_name.into());
        }
        j
    }

    /// A relation from a client's `EntityRelation` JSON.
    pub fn parse(j: &J) -> ServiceResult<Self> {
        let end = |k: &str| {
            EntityRef::parse(j.get(k).ok_or_else(|| invalid(&format!("Relation '{k}' should be specified!")))?)
        };
        let relation_type = j.get("type").and_then(J::as_str).unwrap_or_default().to_owned();
        Ok(Self {
            from: end("from")?,
            to: end("to")?,
            relation_type,
            group: j.get("typeGroup").and_then(J::as_str).unwrap_or(COMMON).to_owned(),
            additional_info: j.get("additionalInfo").cloned().unwrap_or(J::Null),
        })
    }

    /// The end a walk in direction `dir` reaches over it.
    pub fn far(&self, dir: Direction) -> EntityRef {
        match dir {
            Direction::From => self.to,
            Direction::To => self.from,
        }
    }

    fn is_gateway_link(&self) -> bool {
        self.relation_type == CREATED
            && self.group == COMMON
            && self.from.kind == EntityKind::Device
            && self.to.kind == EntityKind::Device
    }

    /// Its id in storage: one per ends, type and group, so saving it again updates it.
    fn id(&self) -> Uuid {
        let mut h = sha2::Sha256::new();
        for part in [
            self.from.kind.name().as_bytes(),
            self.from.id.as_bytes(),
            self.to.kind.name().as_bytes(),
            self.to.id.as_bytes(),
            self.relation_type.as_bytes(),
            self.group.as_bytes(),
        ] {
            h.update((part.len() as u32).to_be_bytes());
            h.update(part);
        }
        let digest: [u8; 32] = h.finalize().into();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_custom_bytes(bytes).into_uuid()
    }

    fn from_doc(d: &DocRecord) -> Option<Self> {
        Self::parse(&d.doc).ok()
    }
}

fn gateway_link(gateway: Uuid, device: Uuid) -> Relation {
    Relation {
        from: EntityRef { kind: EntityKind::Device, id: gateway },
        to: EntityRef { kind: EntityKind::Device, id: device },
        relation_type: CREATED.into(),
        group: COMMON.into(),
        additional_info: J::Null,
    }
}

/// Creates or updates a relation between two entities the caller may change.
pub async fn save(core: &Core, me: &Caller, r: Relation) -> ServiceResult<Relation> {
    let t = &r.relation_type;
    if t.trim().is_empty() || t.chars().count() > 255 || t.chars().any(char::is_control) {
        return Err(invalid("Relation type should be specified (1 to 255 characters, no control characters)!"));
    }
    if r.group.is_empty() || r.group.len() > 64 {
        return Err(invalid("Relation type group should be specified (1 to 64 characters)!"));
    }
    writable(core, me, r.from).await?;
    let to = writable(core, me, r.to).await?;
    if r.is_gateway_link() && is_gateway(core, r.from.id).await? {
        super::devices::relate_gateway(core, me, DeviceId(r.from.id), DeviceId(r.to.id)).await?;
        return Ok(gateway_link(r.from.id, r.to.id));
    }
    let mut doc = r.json();
    core.set_doc_tenant(&mut doc, to.tenant);
    let id = r.id();
    let title = r.relation_type.clone();
    let exists = {
        let store = core.store.clone();
        blocking(move || store.doc(DocKind::Relation, id)).await?.is_some()
    };
    let update = |title, doc| WriteOp::SaveDoc { kind: DocKind::Relation, id: Some(id), title, doc };
    if exists {
        core.writer.submit(update(title, doc)).await?;
        return Ok(r);
    }
    match core
        .writer
        .submit(WriteOp::InsertDoc { kind: DocKind::Relation, id, title: title.clone(), doc: doc.clone() })
        .await
    {
        Ok(_) => Ok(r),
        // Inserted at the same moment by another request: this one updates it.
        Err(StoreError::Invalid(_)) => {
            core.writer.submit(update(title, doc)).await?;
            Ok(r)
        }
        Err(e) => Err(e.into()),
    }
}

async fn is_gateway(core: &Core, id: Uuid) -> ServiceResult<bool> {
    let store = core.store.clone();
    Ok(blocking(move || store.device(DeviceId(id))).await?.is_some_and(|d| d.is_gateway()))
}

/// The relation between `from` and `to` of `relation_type` in `group`, if the caller may
/// read both ends.
pub async fn get(
    core: &Core,
    me: &Caller,
    from: EntityRef,
    to: EntityRef,
    relation_type: &str,
    group: &str,
) -> ServiceResult<Relation> {
    readable(core, me, from).await?;
    readable(core, me, to).await?;
    let wanted =
        Relation { from, to, relation_type: relation_type.into(), group: group.into(), additional_info: J::Null };
    let missing = || ServiceError::NotFound("Requested item wasn't found!".into());
    if wanted.is_gateway_link() {
        let store = core.store.clone();
        let device = blocking(move || store.device(DeviceId(to.id))).await?;
        if device.and_then(|d| d.gateway) == Some(DeviceId(from.id)) {
            return Ok(gateway_link(from.id, to.id));
        }
    }
    let store = core.store.clone();
    let id = wanted.id();
    let d = blocking(move || store.doc(DocKind::Relation, id)).await?.ok_or_else(missing)?;
    Relation::from_doc(&d).ok_or_else(missing)
}

/// Deletes a relation between two entities the caller may change; the relation it was.
pub async fn delete(
    core: &Core,
    me: &Caller,
    from: EntityRef,
    to: EntityRef,
    relation_type: &str,
    group: &str,
) -> ServiceResult<Relation> {
    writable(core, me, from).await?;
    writable(core, me, to).await?;
    let r = get(core, me, from, to, relation_type, group).await?;
    match core.writer.submit(WriteOp::DeleteDoc(DocKind::Relation, r.id())).await {
        Ok(_) => {}
        // The one relation that is not a document: a device's gateway.
        Err(StoreError::DocNotFound(..)) => {
            super::devices::unrelate_gateway(core, me, DeviceId(from.id), DeviceId(to.id)).await?
        }
        Err(e) => return Err(e.into()),
    }
    Ok(r)
}

/// Which way to follow relations from an entity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Relations that start at it.
    From,
    /// Relations that end at it.
    To,
}

impl Direction {
    /// ThingsBoard's `FROM` / `TO`.
    pub fn parse(s: &str) -> ServiceResult<Self> {
        match s {
            "FROM" => Ok(Direction::From),
            "TO" => Ok(Direction::To),
            other => Err(invalid(&format!("Unsupported direction '{other}': FROM or TO"))),
        }
    }
}

/// Every relation of one tenant, read once (blocking): the stored ones and the gateways'.
pub struct Graph {
    relations: Vec<Relation>,
}

impl Graph {
    /// Reads `tenant`'s relations.
    pub fn load(core: &Core, store: &Store, tenant: Uuid) -> Result<Self, StoreError> {
        let mut relations = stored(core, store, tenant, |_| true)?;
        let stored_tenant = core.stored_tenant(tenant);
        for d in store.devices()? {
            if let (Some(g), true) = (d.gateway, d.tenant == stored_tenant) {
                relations.push(gateway_link(g.0, d.id.0));
            }
        }
        Ok(Self { relations })
    }

    /// Reads the relations of `tenant` from and to `e` only: its stored ones, and for a
    /// device its gateway's link and, for a gateway, its devices' (no scan of every device).
    pub fn around(core: &Core, store: &Store, tenant: Uuid, e: EntityRef) -> Result<Self, StoreError> {
        let mut relations = stored(core, store, tenant, |r| r.from == e || r.to == e)?;
        if e.kind == EntityKind::Device {
            let id = DeviceId(e.id);
            relations.extend(store.gateway_devices(id)?.into_iter().map(|d| gateway_link(e.id, d.0)));
            if let Some(g) = store.device(id)?.and_then(|d| d.gateway) {
                relations.push(gateway_link(g.0, e.id));
            }
        }
        Ok(Self { relations })
    }

    /// The relations at `e` in direction `dir`.
    pub fn at(&self, e: EntityRef, dir: Direction) -> impl Iterator<Item = &Relation> {
        self.relations.iter().filter(move |r| match dir {
            Direction::From => r.from == e,
            Direction::To => r.to == e,
        })
    }

    /// The relations ThingsBoard's relations query walks: from `root` in direction `dir`,
    /// over relations of `group` (`COMMON` when none), up to `max_level` steps (0: no
    /// bound), each entity entered once; with `last_level_only`, only the relations of the
    /// last level (or those into an entity with no further relations). Filters apply to
    /// what this returns, as in ThingsBoard, not to the walk.
    pub fn walk(
        &self,
        root: EntityRef,
        dir: Direction,
        group: Option<&str>,
        max_level: usize,
        last_level_only: bool,
    ) -> Vec<&Relation> {
        let group = group.unwrap_or(COMMON);
        let max = if max_level == 0 { usize::MAX } else { max_level };
        let mut seen = HashSet::new();
        let mut tasks: VecDeque<(EntityRef, usize, Vec<&Relation>)> = VecDeque::from([(root, 1, Vec::new())]);
        let mut out: Vec<&Relation> = Vec::new();
        while let Some((at, level, into)) = tasks.pop_front() {
            let found: Vec<&Relation> = self.at(at, dir).filter(|r| r.group == group).collect();
            let mut children: Vec<(EntityRef, Vec<&Relation>)> = Vec::new();
            for r in &found {
                let child = r.far(dir);
                if seen.insert(child) {
                    children.push((child, Vec::new()));
                }
                if let Some(c) = children.iter_mut().find(|c| c.0 == child) {
                    c.1.push(r);
                }
            }
            match (last_level_only, found.is_empty()) {
                (false, _) => out.extend(&found),
                (true, true) => out.extend(into),
                (true, false) if level == max => out.extend(&found),
                (true, false) => {}
            }
            if level < max {
                tasks.extend(children.into_iter().map(|(c, rs)| (c, level + 1, rs)));
            }
        }
        let mut unique = HashSet::new();
        out.retain(|r| unique.insert(std::ptr::from_ref(*r)));
        out
    }
}

/// The stored relations of `tenant` that `keep` accepts (blocking).
fn stored(
    core: &Core,
    store: &Store,
    tenant: Uuid,
    keep: impl Fn(&Relation) -> bool,
) -> Result<Vec<Relation>, StoreError> {
    Ok(store
        .docs(DocKind::Relation)?
        .iter()
        .filter(|d| core.doc_tenant(d) == tenant)
        .filter_map(Relation::from_doc)
        .filter(|r| keep(r))
        .collect())
}

/// What a relation list shows: relations whose ends the caller may read, with the ends'
/// names.
pub struct Listed {
    /// The relation.
    pub relation: Relation,
    /// Its start's name.
    pub from_name: String,
    /// Its end's name.
    pub to_name: String,
}

/// Keeps the relations whose both ends the caller may read, naming the ends (blocking).
fn readable_only(core: &Core, store: &Store, me: &Caller, rs: Vec<Relation>) -> Result<Vec<Listed>, StoreError> {
    let mut out = Vec::with_capacity(rs.len());
    for r in rs {
        let (Some(f), Some(t)) = (owner(core, store, r.from)?, owner(core, store, r.to)?) else { continue };
        if f.readable_by(me) && t.readable_by(me) {
            out.push(Listed { relation: r, from_name: f.name, to_name: t.name });
        }
    }
    Ok(out)
}

/// The relations at `e` (which the caller may read) in direction `dir`, of
/// `relation_type` when given, of `group` when given.
pub async fn at(
    core: &Core,
    me: &Caller,
    e: EntityRef,
    dir: Direction,
    relation_type: Option<String>,
    group: Option<String>,
) -> ServiceResult<Vec<Listed>> {
    let o = readable(core, me, e).await?;
    let (core2, store, me2) = (core.clone(), core.store.clone(), me.clone());
    Ok(blocking(move || {
        let g = Graph::around(&core2, &store, o.tenant, e)?;
        let rs = g
            .at(e, dir)
            .filter(|r| relation_type.as_ref().is_none_or(|t| &r.relation_type == t))
            .filter(|r| group.as_ref().is_none_or(|t| &r.group == t))
            .cloned()
            .collect();
        readable_only(&core2, &store, &me2, rs)
    })
    .await?)
}

/// A relations query (`POST /api/relations`).
pub struct RelationsQuery {
    /// Where to start.
    pub root: EntityRef,
    /// Which way.
    pub direction: Direction,
    /// Only this group.
    pub group: Option<String>,
    /// Most steps (0: no bound).
    pub max_level: usize,
    /// Only the last level's relations.
    pub last_level_only: bool,
    /// `(relation type, entity kinds)`: a relation passes one filter when its type is the
    /// filter's (or it names none) and its far end is of one of the kinds (or it names
    /// none). No filters: every relation passes.
    pub filters: Vec<(Option<String>, Vec<EntityKind>)>,
}

impl RelationsQuery {
    /// Whether relation `r` passes the filters, walking in `self.direction`.
    pub fn passes(&self, r: &Relation) -> bool {
        let far = r.far(self.direction);
        self.filters.is_empty()
            || self.filters.iter().any(|(t, kinds)| {
                t.as_ref().is_none_or(|t| t.is_empty() || t == &r.relation_type)
                    && (kinds.is_empty() || kinds.contains(&far.kind))
            })
    }
}

/// The relations a relations query finds that the caller may read.
pub async fn query(core: &Core, me: &Caller, q: RelationsQuery) -> ServiceResult<Vec<Listed>> {
    let o = readable(core, me, q.root).await?;
    let (core2, store, me2) = (core.clone(), core.store.clone(), me.clone());
    Ok(blocking(move || {
        let g = Graph::load(&core2, &store, o.tenant)?;
        let rs = g
            .walk(q.root, q.direction, q.group.as_deref(), q.max_level, q.last_level_only)
            .into_iter()
            .filter(|r| q.passes(r))
            .cloned()
            .collect();
        readable_only(&core2, &store, &me2, rs)
    })
    .await?)
}

/// The entities of `kind` a relations query reaches (its relations' far ends), each once, in
/// the order found: what ThingsBoard's asset and device search queries answer.
pub async fn reached(core: &Core, me: &Caller, q: RelationsQuery, kind: EntityKind) -> ServiceResult<Vec<Uuid>> {
    let dir = q.direction;
    let mut seen = HashSet::new();
    Ok(query(core, me, q)
        .await?
        .into_iter()
        .map(|l| l.relation.far(dir))
        .filter(|e| e.kind == kind && seen.insert(e.id))
        .map(|e| e.id)
        .collect())
}

/// Deletes every relation from and to an entity the caller may change (the gateway's
/// "Created" ones included).
pub async fn delete_all(core: &Core, me: &Caller, e: EntityRef) -> ServiceResult<()> {
    let o = writable(core, me, e).await?;
    let (core2, store) = (core.clone(), core.store.clone());
    let g = blocking(move || Graph::around(&core2, &store, o.tenant, e)).await?;
    for r in g.at(e, Direction::From).chain(g.at(e, Direction::To)) {
        delete(core, me, r.from, r.to, &r.relation_type, &r.group).await?;
    }
    Ok(())
}

/// Removes the stored relations from and to a deleted entity (its gateway links went with
/// it).
pub async fn forget(core: &Core, kind: EntityKind, id: Uuid) -> ServiceResult<()> {
    let store = core.store.clone();
    let docs = blocking(move || store.docs(DocKind::Relation)).await?;
    let e = EntityRef { kind, id };
    for d in docs {
        if Relation::from_doc(&d).is_some_and(|r| r.from == e || r.to == e) {
            match core.writer.submit(WriteOp::DeleteDoc(DocKind::Relation, d.id)).await {
                Ok(_) | Err(StoreError::DocNotFound(..)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}
