//! `ENTITY_DATA`: a query over the caller's devices (a filter, a page, entity fields and
//! latest values), answered with a page, then, for its `latestCmd` and `tsCmd`, the
//! committed changes of the page's devices from the same fan-out as every other
//! subscription ([`super::Hub`]).

use gridlinks_storage::{DeviceRecord, Store, Timeseries};
use gridlinks_thingsboard::keyfilter::KeyFilter;
use gridlinks_thingsboard::ws::{self as proto, code, EntityFilter, EntityKey, EntityQuery, EntitySeriesCmd, KeyType};
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

/// The devices `q` selects that `caller` may see, sorted as it asks: how many in all, and
/// those of its page.
pub(super) fn select(core: &Core, caller: &Caller, q: &EntityQuery) -> Result<(usize, Vec<DeviceRecord>), Refusal> {
    let mut devices = match &q.filter {
        EntityFilter::Single(id) => one_or_none(&core.store, id)?,
        EntityFilter::List(ids) => {
            let mut all = Vec::new();
            for id in ids.iter().take(proto::MAX_PAGE) {
                all.extend(one_or_none(&core.store, id)?);
            }
            all
        }
        // In name order.
        EntityFilter::AllDevices | EntityFilter::DeviceType { .. } => core.store.devices().map_err(internal)?,
    };
    devices.retain(|d| caller.may_use(core.tenant_of(d.tenant), d.customer));
    if let EntityFilter::DeviceType { types, name_filter } = &q.filter {
        let prefix = name_filter.as_ref().map(|n| n.to_lowercase());
        devices.retain(|d| {
            (types.is_empty() || types.contains(&d.device_type))
                && prefix.as_ref().is_none_or(|p| d.name.to_lowercase().starts_with(p))
        });
    }
    if let Some(t) = q.text_search.as_ref().map(|t| t.to_lowercase()) {
        devices.retain(|d| d.name.to_lowercase().contains(&t));
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
        let mut kept = Vec::with_capacity(devices.len());
        for d in devices {
            if passes(core, &d, &q.key_filters)? {
                kept.push(d);
            }
        }
        devices = kept;
    }
    if let Some((key, desc)) = &q.sort {
        // Ascending: numbers before text, each in order; a device without the key last.
        // Descending is the reverse; ties keep their order.
        let mut keyed = Vec::with_capacity(devices.len());
        for d in devices {
            keyed.push((value(core, &d, key)?.map(|v| v.1), d));
        }
        if *desc {
            keyed.sort_by(|(a, _), (b, _)| order(b.as_ref(), a.as_ref()));
        } else {
            keyed.sort_by(|(a, _), (b, _)| order(a.as_ref(), b.as_ref()));
        }
        devices = keyed.into_iter().map(|(_, d)| d).collect();
    }
    let total = devices.len();
    let page = devices.into_iter().skip(q.page.saturating_mul(q.page_size)).take(q.page_size).collect();
    Ok((total, page))
}

/// Whether device `d` passes every key filter.
fn passes(core: &Core, d: &DeviceRecord, filters: &[KeyFilter]) -> Result<bool, Refusal> {
    for f in filters {
        if !f.predicate.matches(value(core, d, &f.key)?.map(|v| v.1).as_ref()) {
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

fn one_or_none(store: &Store, id: &str) -> Result<Vec<DeviceRecord>, Refusal> {
    let id = gridlinks_thingsboard::model::device_id(id).map_err(|e| (code::BAD_REQUEST, e.to_string()))?;
    Ok(store.device(id).map_err(internal)?.into_iter().collect())
}

/// The entity fields of a device ([`field`]).
const ENTITY_FIELDS: [&str; 7] =
    ["name", "type", "deviceProfileName", "label", "createdTime", "entityType", "additionalInfo"];

/// An entity field of `d`, if `key` names one.
fn field(d: &DeviceRecord, key: &str) -> Option<Value> {
    Some(match key {
        "name" => Value::Str(d.name.clone()),
        "type" | "deviceProfileName" => Value::Str(d.device_type.clone()),
        "label" => Value::Str(d.label.clone().unwrap_or_default()),
        "createdTime" => Value::Long(d.created_time),
        "entityType" => Value::Str("DEVICE".to_owned()),
        "additionalInfo" => Value::Str(d.additional_info.as_ref().map(J::to_string).unwrap_or_default()),
        _ => return None,
    })
}

/// The value `key` names of device `d` and its timestamp (an entity field's is 0), if it
/// has one: an entity field, its latest time-series value, or its attribute (of any scope:
/// the newest).
fn value(core: &Core, d: &DeviceRecord, key: &EntityKey) -> Result<Option<(i64, Value)>, Refusal> {
    Ok(match key.key_type {
        KeyType::EntityField => field(d, &key.key).map(|v| (0, v)),
        KeyType::TimeSeries => {
            let found = core.ts.reads().latest(d.id, Some(std::slice::from_ref(&key.key))).map_err(internal)?;
            found.into_iter().next().map(|(_, ts, v)| (ts.0, v))
        }
        t => {
            let scope = attribute_scope(t).flatten();
            let found = core.store.attributes(d.id, scope, Some(std::slice::from_ref(&key.key))).map_err(internal)?;
            found.into_iter().max_by_key(|a| a.last_update_ts).map(|a| (a.last_update_ts.0, a.value))
        }
    })
}

/// One device of a page: the entity fields and latest values `keys` name (a value never
/// written is left out).
pub(super) fn row(core: &Core, d: &DeviceRecord, keys: &[EntityKey]) -> Result<J, Refusal> {
    let mut latest = Vec::new();
    let ts_keys: Vec<String> =
        keys.iter().filter(|k| k.key_type == KeyType::TimeSeries).map(|k| k.key.clone()).collect();
    if !ts_keys.is_empty() {
        for (k, ts, v) in core.ts.reads().latest(d.id, Some(&ts_keys)).map_err(internal)? {
            latest.push((KeyType::TimeSeries, k, ts.0, v.to_display_string()));
        }
    }
    for k in keys.iter().filter(|k| k.key_type != KeyType::TimeSeries) {
        if let Some((ts, v)) = value(core, d, k)? {
            latest.push((k.key_type, k.key.clone(), ts, v.to_display_string()));
        }
    }
    Ok(proto::entity_data(&d.id.to_string(), latest, []))
}

/// The points of `cmd`'s window of `devices`, newest first: one entity per device.
pub(super) fn series(store: &dyn Timeseries, devices: &[DeviceId], cmd: &EntitySeriesCmd) -> Result<Vec<J>, Refusal> {
    let mut out = Vec::with_capacity(devices.len());
    for &d in devices {
        let q = super::raw_query(cmd.keys.clone(), cmd.start_ts, cmd.end_ts, cmd.limit);
        let found = store.history(d, &q).map_err(internal)?;
        out.push(proto::entity_data(&d.to_string(), [], super::texts(&found)));
    }
    Ok(out)
}

/// Committed telemetry as an entity update for `keys`, if any key matches.
pub(super) fn telemetry_update(device: DeviceId, keys: &EntityKeys, records: &[TsRecord]) -> Option<J> {
    // Each key's newest point (of equal timestamps, the last one).
    let latest: Vec<_> = super::points_by_key(records, |k| keys.latest_ts.iter().any(|x| x == k))
        .into_iter()
        .filter_map(|(k, points)| {
            let (ts, v) = points.into_iter().max_by_key(|p| p.0)?;
            Some((KeyType::TimeSeries, k.to_owned(), ts, v))
        })
        .collect();
    let series = super::points_by_key(records, |k| keys.series.iter().any(|x| x == k));
    (!latest.is_empty() || !series.is_empty()).then(|| proto::entity_data(&device.to_string(), latest, series))
}

/// A committed attribute change as an entity update for `keys`' attributes, if any match.
pub(super) fn attribute_update(
    device: DeviceId,
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
    (!latest.is_empty()).then(|| proto::entity_data(&device.to_string(), latest, []))
}
