//! `ALARM_DATA` and `ALARM_COUNT`: the alarms of the entities a query selects (or, for a
//! count without an entity filter, every alarm the caller may see), filtered by status,
//! severity, type, assignee and a `createdTime` window, answered with a page (each alarm's
//! info, its entity and the entity's latest values) or a count; then again whenever an
//! alarm change alters the answer ([`super::Session::refresh_alarms`]).

use std::collections::HashMap;
use std::sync::Arc;

use gridlinks_platform::alarms::{self, Alarm, Filter, Severity};
use gridlinks_platform::auth::{Auth, Caller};
use gridlinks_platform::Core;
use gridlinks_thingsboard::model::entity_id;
use gridlinks_thingsboard::ws::{self as proto, code, AlarmQuery, EntityQuery};
use serde_json::Value as J;

use super::entity::{self, Entity};
use super::{internal, Refusal};

/// Most entities one alarm query looks at (ThingsBoard's `maxEntitiesPerAlarmSubscription`).
pub(super) const MAX_ENTITIES: usize = 10_000;

/// What an alarm query selects.
struct Selected {
    /// The alarms, sorted.
    alarms: Vec<Arc<Alarm>>,
    /// Their entities (none when the query has no entity filter).
    entities: HashMap<uuid::Uuid, Entity>,
    /// How many entities the query selected.
    total_entities: usize,
}

/// The alarms `q` selects for `caller` at `now`.
fn selected(core: &Core, caller: &Caller, q: &AlarmQuery, now: i64) -> Result<Selected, Refusal> {
    let bad = |why: String| (code::BAD_REQUEST, why);
    let mut severities = Vec::new();
    for s in &q.severities {
        severities.push(Severity::parse(s).ok_or_else(|| bad(format!("severity {s:?} is not an alarm severity")))?);
    }
    let assignee = match &q.assignee {
        Some(a) => Some(a.parse().map_err(|_| bad(format!("assigneeId {a:?} is not a user id")))?),
        None => None,
    };
    let (start, end) = q.window(now);
    let f = Filter {
        statuses: alarms::search_statuses(&q.statuses).map_err(bad)?,
        severities,
        types: q.types.clone(),
        assignee,
        start,
        end,
        ..Filter::default()
    };
    let mut found = alarms::query(core, caller, &f).map_err(|e| bad(e.to_string()))?;
    let (entities, total_entities) = match &q.filter {
        Some(filter) => {
            let eq = EntityQuery {
                filter: filter.clone(),
                page_size: MAX_ENTITIES,
                page: 0,
                text_search: None,
                sort: None,
                key_filters: q.key_filters.clone(),
                entity_fields: Vec::new(),
                latest_values: Vec::new(),
            };
            let (total, page) = entity::select(core, caller, &eq)?;
            let by_id: HashMap<uuid::Uuid, Entity> = page.into_iter().map(|e| (e.id().0, e)).collect();
            found.retain(|a| by_id.contains_key(&a.originator.id));
            (by_id, total)
        }
        None => (HashMap::new(), 0),
    };
    if let Some(t) = q.text_search.as_ref().map(|t| t.to_lowercase()) {
        found.retain(|a| {
            a.alarm_type.to_lowercase().contains(&t)
                || a.severity.name().to_lowercase().contains(&t)
                || a.status().name().to_lowercase().contains(&t)
                || entities.get(&a.originator.id).is_some_and(|e| e.name().to_lowercase().contains(&t))
        });
    }
    let (field, desc) = q.sort.clone().unwrap_or_else(|| ("createdTime".into(), true));
    let name = |a: &Alarm| entities.get(&a.originator.id).map(|e| e.name().to_owned()).unwrap_or_default();
    match field.as_str() {
        "createdTime" => found.sort_by_key(|a| (a.created_time, a.id)),
        "startTs" | "startTime" => found.sort_by_key(|a| (a.start_ts, a.id)),
        "endTs" | "endTime" => found.sort_by_key(|a| (a.end_ts, a.id)),
        "ackTs" | "ackTime" => found.sort_by_key(|a| (a.ack_ts, a.id)),
        "clearTs" | "clearTime" => found.sort_by_key(|a| (a.clear_ts, a.id)),
        "assignTime" => found.sort_by_key(|a| (a.assign_ts, a.id)),
        "type" => found.sort_by(|a, b| (&a.alarm_type, a.id).cmp(&(&b.alarm_type, b.id))),
        "severity" => found.sort_by_key(|a| (a.severity, a.id)),
        "status" => found.sort_by_key(|a| (a.status().name(), a.id)),
        "originator" => found.sort_by_cached_key(|a| (name(a), a.id)),
        other => return Err(bad(format!("alarms cannot be sorted by ALARM_FIELD {other:?}"))),
    }
    if desc {
        found.reverse();
    }
    Ok(Selected { alarms: found, entities, total_entities })
}

/// A page of `AlarmData` (an alarm's info with its `entityId` and the entity's `latest`
/// values) for `q` at `now`: the rows, how many alarms and how many entities it selected.
pub(crate) fn rows(
    core: &Core,
    auth: &Auth,
    caller: &Caller,
    q: &AlarmQuery,
    now: i64,
) -> Result<(Vec<J>, usize, usize), Refusal> {
    let Selected { alarms: found, entities, total_entities } = selected(core, caller, q, now)?;
    let keys: Vec<_> = q.entity_fields.iter().chain(&q.latest_values).cloned().collect();
    let mut rows = Vec::new();
    for a in found.iter().skip(q.page.saturating_mul(q.page_size)).take(q.page_size) {
        let mut row = crate::thingsboard::alarms::info_of(core, auth, a).map_err(internal)?;
        let latest = match entities.get(&a.originator.id) {
            Some(e) if !keys.is_empty() => entity::row(core, e, &keys)?.get("latest").cloned().unwrap_or_default(),
            _ => J::Object(Default::default()),
        };
        if let Some(o) = row.as_object_mut() {
            o.insert("entityId".into(), entity_id(&a.originator.kind, a.originator.id));
            o.insert("latest".into(), latest);
        }
        rows.push(row);
    }
    Ok((rows, found.len(), total_entities))
}

/// The answer to `ALARM_DATA` command `cmd_id` at `now`.
pub(super) fn page(
    core: &Core,
    auth: &Auth,
    caller: &Caller,
    cmd_id: i64,
    q: &AlarmQuery,
    now: i64,
) -> Result<J, Refusal> {
    let (rows, total, entities) = rows(core, auth, caller, q, now)?;
    Ok(proto::alarm_page(cmd_id, rows, total, q.page_size, q.page, (entities, MAX_ENTITIES)))
}

/// The answer to `ALARM_COUNT` at `now`.
pub(crate) fn count(core: &Core, caller: &Caller, q: &AlarmQuery, now: i64) -> Result<usize, Refusal> {
    Ok(selected(core, caller, q, now)?.alarms.len())
}
