//! Alarms and their comments, as ThingsBoard's REST API serves them (`AlarmController`,
//! `AlarmCommentController`; tb-rest-client's alarm calls): save (create, or update the
//! active alarm of the originator and type), read, `info`, acknowledge, clear, assign,
//! delete; lists by originator and of the caller's tenant or customer (v1 and v2
//! parameters), the highest severity, alarm types; comments.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::Json;
use gridlinks_platform::alarms::{self, Alarm, AlarmSave, Comment, Filter, Originator, Propagation, Severity, Status};
use gridlinks_platform::auth::{Auth, Caller};
use gridlinks_platform::Core;
use gridlinks_storage::{DocKind, Store, StoreError};
use gridlinks_thingsboard::model::{self, entity_id};
use gridlinks_types::DeviceId;
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::api::{blocking, body_id, parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use super::paging::{descending, page_link, page_of};

type St = State<Arc<Core>>;

/// An originator's name and label.
fn names(store: &Store, o: &Originator) -> Result<(String, Option<String>), StoreError> {
    Ok(match o.kind.as_str() {
        "DEVICE" => store.device(DeviceId(o.id))?.map(|d| (d.name, d.label)),
        "ASSET" => store.doc(DocKind::Asset, o.id)?.map(|a| {
            let label = a.doc.get("label").and_then(J::as_str).map(str::to_owned);
            (a.title, label)
        }),
        _ => None,
    }
    .unwrap_or_default())
}

/// ThingsBoard's `Alarm` JSON.
fn alarm_json(a: &Alarm) -> J {
    a.to_json()
}

/// ThingsBoard's `AlarmInfo` JSON: the alarm with its originator's name and its assignee
/// (storage reads: call it off the async threads).
pub(crate) fn info_of(st: &Core, auth: &Auth, a: &Alarm) -> Result<J, StoreError> {
    let mut j = alarm_json(a);
    let (name, label) = names(&st.store, &a.originator)?;
    let assignee = a.assignee.map(|u| {
        let email = auth.users.by_id(u).map(|e| e.caller.email.clone());
        json!({"id": entity_id("USER", u), "firstName": null, "lastName": null, "email": email})
    });
    if let Some(o) = j.as_object_mut() {
        o.insert("originatorDisplayName".into(), label.clone().unwrap_or_else(|| name.clone()).into());
        o.insert("originatorName".into(), name.into());
        o.insert("originatorLabel".into(), label.into());
        o.insert("assignee".into(), assignee.unwrap_or(J::Null));
    }
    Ok(j)
}

/// [`info_of`] of each alarm, off the async threads.
async fn infos(st: &Arc<Core>, auth: &Arc<Auth>, alarms: Vec<Arc<Alarm>>) -> ApiResult<Vec<J>> {
    let (st, auth) = (st.clone(), auth.clone());
    blocking(move || alarms.iter().map(|a| info_of(&st, &auth, a)).collect()).await
}

async fn info_json(st: &Arc<Core>, auth: &Arc<Auth>, a: Arc<Alarm>) -> ApiResult<J> {
    Ok(infos(st, auth, vec![a]).await?.pop().unwrap_or_default())
}

fn alarm_id(s: &str) -> ApiResult<Uuid> {
    uuid(s, "alarm")
}

/// `POST /api/alarm`: create (or update the active alarm of the originator and type), or
/// update the alarm with the body's id.
pub async fn save(User(me): User, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let doc: J = parse_json(&body)?;
    let id = body_id(&doc, alarm_id)?;
    let str_field = |k: &str| doc.get(k).and_then(J::as_str);
    let originator = doc.get("originator").filter(|o| !o.is_null());
    let originator = originator.ok_or_else(|| ApiError::not_found("Requested item wasn't found!"))?;
    let (Some(kind), Some(oid)) =
        (originator.get("entityType").and_then(J::as_str), originator.get("id").and_then(J::as_str))
    else {
        return Err(ApiError::bad_request("Invalid request body: originator is {\"entityType\", \"id\"}"));
    };
    let originator = Originator { kind: kind.to_owned(), id: uuid(oid, "originator")? };
    let severity = match str_field("severity") {
        Some(s) => Severity::parse(s).ok_or_else(|| ApiError::bad_request(format!("Invalid alarm severity: {s}")))?,
        None => return Err(ApiError::bad_request("Alarm severity should be specified!")),
    };
    let ts = |k: &str| doc.get(k).and_then(J::as_i64).unwrap_or(0);
    let flag = |k: &str, at: &str| (doc.get(k).and_then(J::as_bool) == Some(true)).then(|| ts(at));
    let propagation: Propagation = serde_json::from_value(json!({
        "propagate": doc.get("propagate").and_then(J::as_bool).unwrap_or(false),
        "propagateToOwner": doc.get("propagateToOwner").and_then(J::as_bool).unwrap_or(false),
        "propagateToTenant": doc.get("propagateToTenant").and_then(J::as_bool).unwrap_or(false),
        "propagateRelationTypes": doc.get("propagateRelationTypes").filter(|v| v.is_array()),
    }))
    .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    let save = AlarmSave {
        id,
        originator,
        alarm_type: str_field("type").unwrap_or_default().to_owned(),
        severity,
        details: doc.get("details").cloned(),
        start_ts: ts("startTs"),
        end_ts: ts("endTs"),
        propagation,
        acknowledged: flag("acknowledged", "ackTs"),
        cleared: flag("cleared", "clearTs"),
    };
    let a = alarms::save(&st, &me, save).await?;
    Ok(Json(alarm_json(&a)))
}

/// `GET /api/alarm/{id}`.
pub async fn get(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let a = alarms::get(&st, &me, alarm_id(&id)?).await?;
    Ok(Json(alarm_json(&a)))
}

/// `GET /api/alarm/info/{id}`.
pub async fn info(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<Json<J>> {
    let a = alarms::get(&st, &me, alarm_id(&id)?).await?;
    Ok(Json(info_json(&st, &auth, a).await?))
}

/// `DELETE /api/alarm/{id}`: `true`.
pub async fn delete(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    alarms::delete(&st, &me, alarm_id(&id)?).await?;
    Ok(Json(J::Bool(true)))
}

/// `POST /api/alarm/{id}/ack`: the alarm's info (400 when it is acknowledged already).
pub async fn ack(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<Json<J>> {
    let a = alarms::ack(&st, &me, alarm_id(&id)?).await?;
    Ok(Json(info_json(&st, &auth, a).await?))
}

/// `POST /api/alarm/{id}/clear`: the alarm's info (400 when it is cleared already).
pub async fn clear(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<Json<J>> {
    let a = alarms::clear(&st, &me, alarm_id(&id)?).await?;
    Ok(Json(info_json(&st, &auth, a).await?))
}

/// `POST /api/alarm/{id}/assign/{user}`.
pub async fn assign(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path((id, user)): Path<(String, String)>,
) -> ApiResult<Json<J>> {
    let a = alarms::assign(&st, &auth, &me, alarm_id(&id)?, Some(uuid(&user, "user")?)).await?;
    Ok(Json(alarm_json(&a)))
}

/// `DELETE /api/alarm/{id}/assign`.
pub async fn unassign(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<Json<J>> {
    let a = alarms::assign(&st, &auth, &me, alarm_id(&id)?, None).await?;
    Ok(Json(alarm_json(&a)))
}

/// ThingsBoard 4.3's alarm rules as calculated fields (`/api/alarm/rule…`) are not built:
/// 501, naming what is.
pub async fn alarm_rules() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_IMPLEMENTED,
        gridlinks_thingsboard::error::ErrorCode::General,
        "Alarm rules as calculated fields (/api/alarm/rule) are not supported by GridLinks: it evaluates device \
         profile alarm rules (profileData.alarms); see docs/alarms.md",
    )
}

/// `GET /api/users/assign/{alarmId}`: the users the alarm may be assigned to (those of its
/// tenant who may see it), as `UserEmailInfo`, by email.
pub async fn users_for_assign(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<J>> {
    let a = alarms::get(&st, &me, alarm_id(&id)?).await?;
    let p = parse_list(q.as_deref(), false)?;
    let link =
        page_link(&st, p.page_size.ok_or_else(|| ApiError::bad_request("pageSize is required"))?, p.page.unwrap_or(0))?;
    let text = p.filter.text.map(|t| t.to_lowercase());
    let mut users: Vec<_> = auth
        .users
        .all()
        .into_iter()
        .filter(|u| u.caller.may_use(a.tenant, a.customer))
        .filter(|u| text.as_ref().is_none_or(|t| u.caller.email.to_lowercase().contains(t)))
        .collect();
    users.sort_by(|x, y| x.caller.email.cmp(&y.caller.email));
    if descending(p.sort_order.as_deref())? {
        users.reverse();
    }
    Ok(Json(page_of(
        &users,
        link,
        |u| json!({"id": entity_id("USER", u.caller.user), "email": u.caller.email, "firstName": null, "lastName": null}),
    )))
}

// ---- lists ----------------------------------------------------------------------

/// A list's query parameters, v1 (`searchStatus`, `status`) and v2 (`statusList`,
/// `severityList`, `typeList`: repeated or comma-separated).
#[derive(Default)]
struct ListParams {
    page_size: Option<i64>,
    page: Option<i64>,
    filter: Filter,
    sort_property: Option<String>,
    sort_order: Option<String>,
}

fn parse_list(q: Option<&str>, v2: bool) -> ApiResult<ListParams> {
    let mut p = ListParams::default();
    let mut search = Vec::new();
    let mut status = None;
    let int = |k: &str, v: &str| v.parse::<i64>().map_err(|_| ApiError::bad_request(format!("Invalid {k}: {v}")));
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        let items = || v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned);
        match (k.as_ref(), v2) {
            ("pageSize", _) => p.page_size = Some(int("pageSize", &v)?),
            ("page", _) => p.page = Some(int("page", &v)?),
            ("textSearch", _) => p.filter.text = Some(v.into_owned()),
            ("sortProperty", _) => p.sort_property = Some(v.into_owned()),
            ("sortOrder", _) => p.sort_order = Some(v.into_owned()),
            ("startTime", _) => p.filter.start = Some(int("startTime", &v)?),
            ("endTime", _) => p.filter.end = Some(int("endTime", &v)?),
            ("assigneeId", _) => p.filter.assignee = Some(uuid(&v, "assignee")?),
            ("fetchOriginator", false) => {}
            ("searchStatus", false) => search.push(v.into_owned()),
            ("status", false) => {
                status =
                    Some(Status::parse(&v).ok_or_else(|| ApiError::bad_request(format!("Invalid alarm status: {v}")))?)
            }
            ("statusList", true) => search.extend(items()),
            ("severityList", true) => {
                for s in items() {
                    let sev = Severity::parse(&s)
                        .ok_or_else(|| ApiError::bad_request(format!("Invalid alarm severity: {s}")))?;
                    p.filter.severities.push(sev);
                }
            }
            ("typeList", true) => p.filter.types.extend(items()),
            (other, _) => {
                return Err(ApiError::bad_request(format!("Invalid query parameters: unknown parameter '{other}'")))
            }
        }
    }
    if !search.is_empty() && status.is_some() {
        return Err(ApiError::bad_request(
            "Invalid alarms search query: Both parameters 'searchStatus' and 'status' can't be specified at the same time!",
        ));
    }
    p.filter.statuses = match status {
        Some(s) => vec![s],
        None => alarms::search_statuses(&search).map_err(ApiError::bad_request)?,
    };
    Ok(p)
}

/// A page of the alarms the caller may see that match `p` (and `originator`).
async fn list(
    st: &Arc<Core>,
    auth: &Arc<Auth>,
    me: &Caller,
    mut p: ListParams,
    originator: Option<Uuid>,
) -> ApiResult<J> {
    let link =
        page_link(st, p.page_size.ok_or_else(|| ApiError::bad_request("pageSize is required"))?, p.page.unwrap_or(0))?;
    let desc = match p.sort_property {
        Some(_) => descending(p.sort_order.as_deref())?,
        None => true,
    };
    p.filter.originator = originator;
    let mut all = alarms::query(st, me, &p.filter)?;
    match p.sort_property.as_deref().unwrap_or("createdTime") {
        "createdTime" => all.sort_by_key(|a| (a.created_time, a.id)),
        "startTs" => all.sort_by_key(|a| (a.start_ts, a.id)),
        "endTs" => all.sort_by_key(|a| (a.end_ts, a.id)),
        "ackTs" => all.sort_by_key(|a| (a.ack_ts, a.id)),
        "clearTs" => all.sort_by_key(|a| (a.clear_ts, a.id)),
        "assignTs" => all.sort_by_key(|a| (a.assign_ts, a.id)),
        "type" => all.sort_by(|a, b| (&a.alarm_type, a.id).cmp(&(&b.alarm_type, b.id))),
        "severity" => all.sort_by_key(|a| (a.severity, a.id)),
        "status" => all.sort_by_key(|a| (a.status().name(), a.id)),
        other => return Err(ApiError::bad_request(format!("Unsupported sort property: {other}"))),
    }
    if desc {
        all.reverse();
    }
    let (size, page) = link;
    let total = all.len();
    let shown = all.into_iter().skip(page.saturating_mul(size)).take(size).collect();
    Ok(model::page(infos(st, auth, shown).await?, total, size, page))
}

/// The originator an entity path names, if the caller may use it (404/403 as the entity's
/// own API answers).
async fn originator(st: &Core, me: &Caller, entity_type: &str, id: &str) -> ApiResult<Uuid> {
    let o = Originator { kind: entity_type.to_owned(), id: uuid(id, "entity")? };
    alarms::originator_owner(st, me, &o).await?;
    Ok(o.id)
}

/// `GET /api/alarm/{entityType}/{entityId}` (v1 parameters).
pub async fn by_originator(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path((et, id)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<J>> {
    let o = originator(&st, &me, &et, &id).await?;
    Ok(Json(list(&st, &auth, &me, parse_list(q.as_deref(), false)?, Some(o)).await?))
}

/// `GET /api/v2/alarm/{entityType}/{entityId}`.
pub async fn by_originator_v2(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path((et, id)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<J>> {
    let o = originator(&st, &me, &et, &id).await?;
    Ok(Json(list(&st, &auth, &me, parse_list(q.as_deref(), true)?, Some(o)).await?))
}

/// `GET /api/alarms`: the caller's tenant's (a customer user: its customer's).
pub async fn all(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<J>> {
    Ok(Json(list(&st, &auth, &me, parse_list(q.as_deref(), false)?, None).await?))
}

/// `GET /api/v2/alarms`.
pub async fn all_v2(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<J>> {
    Ok(Json(list(&st, &auth, &me, parse_list(q.as_deref(), true)?, None).await?))
}

/// `GET /api/alarm/highestSeverity/{entityType}/{entityId}`: `"CRITICAL"` …, or an empty
/// body when there is none.
pub async fn highest_severity(
    User(me): User,
    State(st): St,
    Path((et, id)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let o = originator(&st, &me, &et, &id).await?;
    let mut p = parse_list(q.as_deref(), false)?;
    if p.page_size.is_some() || p.page.is_some() || p.sort_property.is_some() || p.filter.text.is_some() {
        return Err(ApiError::bad_request("highestSeverity takes searchStatus, status and assigneeId only"));
    }
    p.filter.originator = Some(o);
    Ok(match alarms::highest_severity(&st, &me, &p.filter)? {
        Some(s) => Json(J::String(s.name().into())).into_response(),
        None => axum::http::StatusCode::OK.into_response(),
    })
}

/// `GET /api/alarm/types`: the types of the caller's alarms, by name.
pub async fn types(User(me): User, State(st): St, RawQuery(q): RawQuery) -> ApiResult<Json<J>> {
    let p = parse_list(q.as_deref(), false)?;
    let link =
        page_link(&st, p.page_size.ok_or_else(|| ApiError::bad_request("pageSize is required"))?, p.page.unwrap_or(0))?;
    let desc = descending(p.sort_order.as_deref())?;
    let text = p.filter.text.map(|t| t.to_lowercase());
    let all = alarms::query(&st, &me, &Filter::default())?;
    let mut names: Vec<String> = all
        .iter()
        .map(|a| a.alarm_type.clone())
        .filter(|t| text.as_ref().is_none_or(|q| t.to_lowercase().contains(q)))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if desc {
        names.reverse();
    }
    let owner = entity_id("TENANT", me.tenant);
    Ok(Json(page_of(&names, link, |t| json!({"tenantId": owner, "entityType": "ALARM", "type": t}))))
}

// ---- comments ---------------------------------------------------------------------

fn comment_json(c: &Comment) -> J {
    json!({
        "id": {"id": c.id},
        "createdTime": c.created_time,
        "alarmId": entity_id("ALARM", c.alarm_id),
        "userId": c.user_id.map(|u| entity_id("USER", u)),
        "type": c.kind,
        "comment": c.comment,
        "name": c.comment.to_string(),
    })
}

/// `POST /api/alarm/{id}/comment`: adds the caller's comment, or edits it (body `id`).
pub async fn save_comment(
    User(me): User,
    State(st): St,
    Path(id): Path<String>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let doc: J = parse_json(&body)?;
    let comment_id = match doc.get("id").and_then(|i| i.get("id")).and_then(J::as_str) {
        Some(c) => Some(uuid(c, "alarm comment")?),
        None => None,
    };
    let comment = doc.get("comment").filter(|c| !c.is_null()).cloned();
    let comment = comment.ok_or_else(|| ApiError::bad_request("Alarm comment should be specified!"))?;
    let c = alarms::save_comment(&st, &me, alarm_id(&id)?, comment_id, comment).await?;
    Ok(Json(comment_json(&c)))
}

/// `GET /api/alarm/{id}/comment`: a page of `AlarmCommentInfo`, by `createdTime`.
pub async fn comments(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<J>> {
    let p = parse_list(q.as_deref(), false)?;
    let link =
        page_link(&st, p.page_size.ok_or_else(|| ApiError::bad_request("pageSize is required"))?, p.page.unwrap_or(0))?;
    let mut all = alarms::comments(&st, &me, alarm_id(&id)?).await?;
    match p.sort_property.as_deref() {
        None | Some("createdTime") => {}
        Some("id") => all.sort_by_key(|c| c.id),
        Some(other) => return Err(ApiError::bad_request(format!("Unsupported sort property: {other}"))),
    }
    if descending(p.sort_order.as_deref())? {
        all.reverse();
    }
    Ok(Json(page_of(&all, link, |c| {
        let mut j = comment_json(c);
        let email = c.user_id.and_then(|u| auth.users.by_id(u)).map(|e| e.caller.email.clone());
        if let Some(o) = j.as_object_mut() {
            o.insert("firstName".into(), J::Null);
            o.insert("lastName".into(), J::Null);
            o.insert("email".into(), email.into());
        }
        j
    })))
}

/// `DELETE /api/alarm/{id}/comment/{commentId}`.
pub async fn delete_comment(
    User(me): User,
    State(st): St,
    Path((id, comment)): Path<(String, String)>,
) -> ApiResult<()> {
    alarms::delete_comment(&st, &me, alarm_id(&id)?, uuid(&comment, "alarm comment")?).await?;
    Ok(())
}
