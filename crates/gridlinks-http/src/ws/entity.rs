//! `ENTITY_DATA`: a query over the caller's devices, assets and customers (a filter, a page, entity fields and
//! latest values), answered with a page, then, for its `latestCmd` and `tsCmd`, the
//! committed changes of the page's devices from the same fan-out as every other
//! subscription ([`super::Hub`]).

use gridlinks_platform::entities::assets;
use gridlinks_platform::entities::relations::{self, Direction, EntityKind, EntityRef, RelationsQuery};
use gridlinks_platform::entities::ServiceError;
use gridlinks_storage::{DeviceRecord, DocKind, DocRecord, Timeseries};
use gridlinks_thingsboard::keyfilter::KeyFilter;
use gridlinks_thingsboard::ws::{
    self as proto, code, EntityFilter, EntityKey, EntityQuery, EntitySeriesCmd, KeyType, RelationFilter,
};
use gridlinks_types::{AttributeScope, DeviceId, TsRecord, Value};
use serde_json::Value as J;

use super::{internal, Refusal};
use gridlinks_platform::auth::Caller;
use gridlinks_platform::Core;

/// What an `ENTITY_DATA` subscription follows of each device of its page.
#[derive(Default)]
pub(super) struct EntityKeys {
    /// Time series whose latest value goes to `latest.TIME_SERIES` (`latestCmd`).
    pub latest_ts: Vec<String>,
    /// Attributes whose value goes to `latest.{scope}` (`latestCmd`).
    pub attrs: Vec<EntityKey>,
    /// Time series whose every point goes to `timeseries` (`tsCmd`).
    pub series: Vec<String>,
}

impl EntityKeys {
    pub(super) fn new(latest: &[EntityKey], ts: Option<&EntitySeriesCmd>) -> Self {
        let latest_ts = latest.iter().filter(|k| k.key_type == KeyType::TimeSeries).map(|k| k.key.clone()).collect();
        let attrs = latest.iter().filter(|k| attribute_scope(k.key_type).is_some()).cloned().collect();
        Self { latest_ts, attrs, series: ts.map(|t| t.keys.clone()).unwrap_or_default() }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.latest_ts.is_empty() && self.attrs.is_empty() && self.series.is_empty()
    }
}

/// The scope an attribute key type reads: `Some(None)` for any scope, `None` for a key
/// type that is not an attribute.
pub(super) fn attribute_scope(t: KeyType) -> Option<Option<AttributeScope>> {
    match t {
        KeyType::Attribute => Some(None),
        KeyType::ClientAttribute => Some(Some(AttributeScope::Client)),
        KeyType::SharedAttribute => Some(Some(AttributeScope::Shared)),
        KeyType::ServerAttribute => Some(Some(AttributeScope::Server)),
        KeyType::EntityField | KeyType::TimeSeries => None,
    }
}

/// The key type a change of `scope` shows under for a subscriber who asked for `asked`.
pub(super) fn attribute_matches(asked: KeyType, scope: AttributeScope) -> bool {
    attribute_scope(asked).is_some_and(|s| s.is_none_or(|s| s == scope))
}

/// An entity a query selects.
pub(crate) enum Entity {
    /// A device.
    Device(Box<DeviceRecord>),
    /// An asset, with its type (its profile's name).
    Asset(DocRecord, String),
    /// A customer.
    Customer(DocRecord),
}

impl Entity {
    /// The id its data is kept under.
    pub(crate) fn id(&self) -> DeviceId {
        match self {
            Entity::Device(d) => d.id,
            Entity::Asset(a, _) | Entity::Customer(a) => DeviceId(a.id),
        }
    }

    /// ThingsBoard's name of its type.
    pub(crate) fn entity_type(&self) -> &'static str {
        match self {
            Entity::Device(_) => "DEVICE",
            Entity::Asset(..) => "ASSET",
            Entity::Customer(_) => "CUSTOMER",
        }
    }

    pub(crate) fn name(&self) -> &str {
        match self {
            Entity::Device(d) => &d.name,
            Entity::Asset(a, _) | Entity::Customer(a) => &a.title,
        }
    }

    fn readable_by(&self, core: &Core, caller: &Caller) -> bool {
        match self {
            Entity::Device(d) => caller.may_use(core.tenant_of(d.tenant), d.customer),
            Entity::Asset(a, _) => caller.may_use(core.doc_tenant(a), assets::customer(a)),
            Entity::Customer(c) => caller.may_use(core.doc_tenant(c), Some(c.id)),
        }
    }

    /// Its type as the `deviceType` and `assetType` filters see it.
    fn subtype(&self) -> &str {
        match self {
            Entity::Device(d) => &d.device_type,
            Entity::Asset(_, t) => t,
            Entity::Customer(_) => "",
        }
    }

    /// An entity field of it, if `key` names one it has.
    fn field(&self, key: &str) -> Option<Value> {
        let text = |s: &str| Some(Value::Str(s.to_owned()));
        let doc_text = |d: &DocRecord, k: &str| match d.doc.get(k) {
            Some(J::String(s)) => text(s),
            Some(J::Null) | None => text(""),
            Some(other) => text(&other.to_string()),
        };
        match (self, key) {
            (_, "name") => text(self.name()),
            (_, "entityType") => text(self.entity_type()),
            (Entity::Device(d), "createdTime") => Some(Value::Long(d.created_time)),
            (Entity::Asset(a, _) | Entity::Customer(a), "createdTime") => Some(Value::Long(a.created_time)),
            (Entity::Device(d), "type" | "deviceProfileName") => text(&d.device_type),
            (Entity::Device(d), "label") => text(d.label.as_deref().unwrap_or_default()),
            (Entity::Device(d), "additionalInfo") => {
                text(&d.additional_info.as_ref().map(J::to_string).unwrap_or_default())
            }
            (Entity::Asset(_, t), "type" | "assetProfileName") => text(t),
            (Entity::Asset(a, _), "label" | "additionalInfo") => doc_text(a, key),
            (Entity::Customer(c), "title") => text(&c.title),
            (Entity::Customer(c), k) if CUSTOMER_FIELDS.contains(&k) => doc_text(c, k),
            _ => None,
        }
    }
}

/// The entity fields of customers besides `name`, `title`, `createdTime`, `entityType`.
const CUSTOMER_FIELDS: [&str; 10] =
    ["email", "phone", "country", "state", "city", "address", "address2", "zip", "additionalInfo", "label"];

/// Finds the entities a query names (blocking); the asset profiles, which name the assets'
/// types, are read once, when an asset is first found.
struct Finder<'a> {
    core: &'a Core,
    profiles: Option<Vec<DocRecord>>,
}

impl<'a> Finder<'a> {
    fn new(core: &'a Core) -> Self {
        Self { core, profiles: None }
    }

    /// Asset `a` with its type (its profile's name).
    fn asset(&mut self, a: DocRecord) -> Result<Entity, Refusal> {
        if self.profiles.is_none() {
            self.profiles = Some(self.core.store.docs(DocKind::AssetProfile).map_err(internal)?);
        }
        let p = assets::profile_id(&a);
        let t = self
            .profiles
            .iter()
            .flatten()
            .find(|x| Some(x.id) == p)
            .map_or(assets::DEFAULT_PROFILE, |x| x.title.as_str())
            .to_owned();
        Ok(Entity::Asset(a, t))
    }

    /// Every entity of `entity_type`.
    fn every(&mut self, entity_type: &str) -> Result<Vec<Entity>, Refusal> {
        let store = &self.core.store;
        Ok(match entity_type {
            "DEVICE" => store.devices().map_err(internal)?.into_iter().map(|d| Entity::Device(Box::new(d))).collect(),
            "ASSET" => {
                let docs = store.docs(DocKind::Asset).map_err(internal)?;
                docs.into_iter().map(|a| self.asset(a)).collect::<Result<_, _>>()?
            }
            _ => store.docs(DocKind::Customer).map_err(internal)?.into_iter().map(Entity::Customer).collect(),
        })
    }

    /// The entity of `entity_type` and `id`, if there is one.
    fn one(&mut self, entity_type: &str, id: uuid::Uuid) -> Result<Option<Entity>, Refusal> {
        let store = &self.core.store;
        Ok(match entity_type {
            "DEVICE" => store.device(DeviceId(id)).map_err(internal)?.map(|d| Entity::Device(Box::new(d))),
            "ASSET" => match store.doc(DocKind::Asset, id).map_err(internal)? {
                Some(a) => Some(self.asset(a)?),
                None => None,
            },
            "CUSTOMER" => store.doc(DocKind::Customer, id).map_err(internal)?.map(Entity::Customer),
            _ => None,
        })
    }
}

fn uuid_of(id: &str) -> Result<uuid::Uuid, Refusal> {
    id.parse().map_err(|_| (code::BAD_REQUEST, format!("Invalid UUID string: {id}")))
}

fn bad(e: ServiceError) -> Refusal {
    (code::BAD_REQUEST, e.to_string())
}

/// The entities a relations filter reaches from its root, which the caller must be able
/// to read (blocking).
fn related(finder: &mut Finder, caller: &Caller, r: &RelationFilter) -> Result<Vec<Entity>, Refusal> {
    let core = finder.core;
    let root = EntityRef::of(&r.root.0, &r.root.1).map_err(bad)?;
    let owner = relations::owner(core, &core.store, root).map_err(internal)?;
    let Some(owner) = owner.filter(|o| o.readable_by(caller)) else {
        return Err((code::BAD_REQUEST, format!("{} {} is not found", r.root.0, r.root.1)));
    };
    let mut filters = Vec::with_capacity(r.filters.len());
    for (t, kinds) in &r.filters {
        let kinds = kinds.iter().map(|k| EntityKind::parse(k)).collect::<Result<Vec<_>, _>>().map_err(bad)?;
        filters.push((t.clone(), kinds));
    }
    let direction = if r.direction == "TO" { Direction::To } else { Direction::From };
    let query = RelationsQuery {
        root,
        direction,
        group: None,
        max_level: r.max_level,
        last_level_only: r.last_level_only,
        filters,
    };
    let graph = relations::Graph::load(core, &core.store, owner.tenant).map_err(internal)?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for rel in graph.walk(root, direction, None, r.max_level, r.last_level_only).into_iter().filter(|x| query.passes(x))
    {
        let far = rel.far(direction);
        if seen.insert(far) {
            out.extend(finder.one(far.kind.name(), far.id)?);
        }
    }
    if let Some((t, types)) = &r.subtypes {
        out.retain(|e| e.entity_type() == *t && (types.is_empty() || types.iter().any(|x| x == e.subtype())));
    }
    Ok(out)
}

/// The entities `q` selects that `caller` may see, sorted as it asks: how many in all, and
/// those of its page.
pub(crate) fn select(core: &Core, caller: &Caller, q: &EntityQuery) -> Result<(usize, Vec<Entity>), Refusal> {
    let mut finder = Finder::new(core);
    let mut entities = match &q.filter {
        EntityFilter::Single { entity_type, id } => finder.one(entity_type, uuid_of(id)?)?.into_iter().collect(),
        EntityFilter::List { entity_type, ids } => {
            let mut all = Vec::new();
            for id in ids.iter().take(proto::MAX_PAGE) {
                all.extend(finder.one(entity_type, uuid_of(id)?)?);
            }
            all
        }
        EntityFilter::OfType { entity_type, name_filter } => {
            let mut all = finder.every(entity_type)?;
            if let Some(n) = name_filter {
                all.retain(|e| proto::name_matches(e.name(), n));
            }
            all
        }
        EntityFilter::Subtype { entity_type, types, name_filter } => {
            let mut all = finder.every(entity_type)?;
            all.retain(|e| {
                (types.is_empty() || types.iter().any(|t| t == e.subtype()))
                    && name_filter.as_ref().is_none_or(|n| proto::name_matches(e.name(), n))
            });
            all
        }
        EntityFilter::Relations(r) => related(&mut finder, caller, r)?,
    };
    entities.retain(|e| e.readable_by(core, caller));
    if let Some(t) = q.text_search.as_ref().map(|t| t.to_lowercase()) {
        entities.retain(|e| e.name().to_lowercase().contains(&t));
    }
    for key in q.key_filters.iter().map(|f| &f.key).chain(q.sort.iter().map(|s| &s.0)) {
        if key.key_type == KeyType::EntityField && !ENTITY_FIELDS.contains(&key.key.as_str()) {
            return Err((
                code::BAD_REQUEST,
                format!("ENTITY_FIELD {:?}: one of {}", key.key, ENTITY_FIELDS.join(", ")),
            ));
        }
    }
    if !q.key_filters.is_empty() {
        let mut kept = Vec::with_capacity(entities.len());
        for e in entities {
            if passes(core, &e, &q.key_filters)? {
                kept.push(e);
            }
        }
        entities = kept;
    }
    if let Some((key, desc)) = &q.sort {
        // Ascending: numbers before text, each in order; an entity without the key last.
        // Descending is the reverse; ties keep their order.
        let mut keyed = Vec::with_capacity(entities.len());
        for e in entities {
            keyed.push((value(core, &e, key)?.map(|v| v.1), e));
        }
        if *desc {
            keyed.sort_by(|(a, _), (b, _)| order(b.as_ref(), a.as_ref()));
        } else {
            keyed.sort_by(|(a, _), (b, _)| order(a.as_ref(), b.as_ref()));
        }
        entities = keyed.into_iter().map(|(_, e)| e).collect();
    }
    let total = entities.len();
    let page = entities.into_iter().skip(q.page.saturating_mul(q.page_size)).take(q.page_size).collect();
    Ok((total, page))
}

/// Whether entity `e` passes every key filter.
fn passes(core: &Core, e: &Entity, filters: &[KeyFilter]) -> Result<bool, Refusal> {
    for f in filters {
        if !f.predicate.matches(value(core, e, &f.key)?.map(|v| v.1).as_ref()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// How two sort values compare: numbers by value before the rest, the rest by its text
/// (a name "10" sorts before "9", as text), no value last.
fn order(a: Option<&Value>, b: Option<&Value>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let number = |v: &Value| match v {
        Value::Long(l) => Some(*l as f64),
        Value::Double(d) => Some(*d),
        Value::Str(_) | Value::Bool(_) | Value::Json(_) => None,
    };
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(a), Some(b)) => match (number(a), number(b)) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => a.to_display_string().cmp(&b.to_display_string()),
        },
    }
}

/// Every entity field a query may name (an entity without it has no value).
const ENTITY_FIELDS: [&str; 19] = [
    "name",
    "title",
    "type",
    "deviceProfileName",
    "assetProfileName",
    "label",
    "createdTime",
    "entityType",
    "additionalInfo",
    "email",
    "phone",
    "country",
    "state",
    "city",
    "address",
    "address2",
    "zip",
    "ownerName",
    "ownerType",
];

/// The value `key` names of entity `e` and its timestamp (an entity field's is 0), if it
/// has one: an entity field, its latest time-series value, or its attribute (of any scope:
/// the newest).
fn value(core: &Core, e: &Entity, key: &EntityKey) -> Result<Option<(i64, Value)>, Refusal> {
    Ok(match key.key_type {
        KeyType::EntityField => e.field(&key.key).map(|v| (0, v)),
        KeyType::TimeSeries => {
            let found = core.ts.reads().latest(e.id(), Some(std::slice::from_ref(&key.key))).map_err(internal)?;
            found.into_iter().next().map(|(_, ts, v)| (ts.0, v))
        }
        t => {
            let scope = attribute_scope(t).flatten();
            let found = core.store.attributes(e.id(), scope, Some(std::slice::from_ref(&key.key))).map_err(internal)?;
            found.into_iter().max_by_key(|a| a.last_update_ts).map(|a| (a.last_update_ts.0, a.value))
        }
    })
}

/// One entity of a page: the entity fields and latest values `keys` name (a value never
/// written is left out).
pub(crate) fn row(core: &Core, e: &Entity, keys: &[EntityKey]) -> Result<J, Refusal> {
    let mut latest = Vec::new();
    let ts_keys: Vec<String> =
        keys.iter().filter(|k| k.key_type == KeyType::TimeSeries).map(|k| k.key.clone()).collect();
    if !ts_keys.is_empty() {
        for (k, ts, v) in core.ts.reads().latest(e.id(), Some(&ts_keys)).map_err(internal)? {
            latest.push((KeyType::TimeSeries, k, ts.0, v.to_display_string()));
        }
    }
    for k in keys.iter().filter(|k| k.key_type != KeyType::TimeSeries) {
        if let Some((ts, v)) = value(core, e, k)? {
            latest.push((k.key_type, k.key.clone(), ts, v.to_display_string()));
        }
    }
    Ok(proto::entity_data(e.entity_type(), &e.id().to_string(), latest, []))
}

/// The points of `cmd`'s window of each entity (its id and type), newest first: one entity each.
pub(super) fn series(
    store: &dyn Timeseries,
    entities: &[(DeviceId, &str)],
    cmd: &EntitySeriesCmd,
) -> Result<Vec<J>, Refusal> {
    let mut out = Vec::with_capacity(entities.len());
    for &(d, entity_type) in entities {
        let q = super::raw_query(cmd.keys.clone(), cmd.start_ts, cmd.end_ts, cmd.limit);
        let found = store.history(d, &q).map_err(internal)?;
        out.push(proto::entity_data(entity_type, &d.to_string(), [], super::texts(&found)));
    }
    Ok(out)
}

/// Committed telemetry as an entity update for `keys`, if any key matches.
pub(super) fn telemetry_update(
    device: DeviceId,
    entity_type: &str,
    keys: &EntityKeys,
    records: &[TsRecord],
) -> Option<J> {
    // Each key's newest point (of equal timestamps, the last one).
    let latest: Vec<_> = super::points_by_key(records, |k| keys.latest_ts.iter().any(|x| x == k))
        .into_iter()
        .filter_map(|(k, points)| {
            let (ts, v) = points.into_iter().max_by_key(|p| p.0)?;
            Some((KeyType::TimeSeries, k.to_owned(), ts, v))
        })
        .collect();
    let series = super::points_by_key(records, |k| keys.series.iter().any(|x| x == k));
    (!latest.is_empty() || !series.is_empty())
        .then(|| proto::entity_data(entity_type, &device.to_string(), latest, series))
}

/// A committed attribute change as an entity update for `keys`' attributes, if any match.
pub(super) fn attribute_update(
    device: DeviceId,
    entity_type: &str,
    keys: &EntityKeys,
    scope: AttributeScope,
    values: &[(String, Value)],
    now: i64,
) -> Option<J> {
    let latest: Vec<_> = keys
        .attrs
        .iter()
        .filter(|k| attribute_matches(k.key_type, scope))
        .filter_map(|k| {
            let (_, v) = values.iter().find(|(key, _)| *key == k.key)?;
            Some((k.key_type, k.key.clone(), now, v.to_display_string()))
        })
        .collect();
    (!latest.is_empty()).then(|| proto::entity_data(entity_type, &device.to_string(), latest, []))
}
