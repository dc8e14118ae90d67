//! Device profiles, as ThingsBoard serves them: `GET /api/deviceProfiles`,
//! `/api/deviceProfileInfos`, `POST /api/deviceProfile`, `GET`/`DELETE
//! /api/deviceProfile/{id}`, `POST /api/deviceProfile/{id}/default`,
//! `GET /api/deviceProfileInfo/{id}` and `/api/deviceProfileInfo/default`. Profiles are
//! stored entities; a device references one by id and shows its name as `type`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_storage::ProfileRecord;
use gridlinks_thingsboard::model;
use gridlinks_types::ProfileId;
use serde::Deserialize;
use serde_json::Value as J;

use super::api::{blocking, body_id, parse_json};
use super::error::{ApiError, ApiResult};
use super::extract::{Admin, Body, Q};
use super::paging::{descending, page_link, page_of};
use gridlinks_platform::auth::Caller;
use gridlinks_platform::entities::{ota, profiles};
use gridlinks_platform::{Core, Platform};

type St = State<Arc<Core>>;

/// A profile id from a path or body.
pub fn profile_id(s: &str) -> ApiResult<ProfileId> {
    s.parse().map_err(|_| ApiError::bad_request(format!("Invalid device profile id: {s}")))
}

fn view(p: &ProfileRecord) -> model::Profile<'_> {
    model::Profile { id: p.id, created_time: p.created_time, name: &p.name, default: p.default, doc: &p.doc }
}

pub(crate) fn json(st: &Core, p: &ProfileRecord, render: fn(&model::Profile<'_>, uuid::Uuid) -> J) -> J {
    render(&view(p), st.tenant_of(p.tenant))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListParams {
    page_size: i64,
    page: i64,
    text_search: Option<String>,
    sort_property: Option<String>,
    sort_order: Option<String>,
    transport_type: Option<String>,
}

/// The page of profiles `p` asks for: name containing `textSearch` (any case), of
/// `transportType` if given, sorted by `sortProperty` (`name`, `createdTime`, `type`,
/// `transportType`, `description`, `isDefault`; `name` when absent) in `sortOrder`.
async fn page(
    st: &Core,
    me: &Caller,
    p: ListParams,
    render: fn(&model::Profile<'_>, uuid::Uuid) -> J,
) -> ApiResult<Json<J>> {
    let link = page_link(st, p.page_size, p.page)?;
    let desc = descending(p.sort_order.as_deref())?;
    let mut all = profiles::of_tenant(st, me).await?;
    if let Some(q) = p.text_search.map(|q| q.to_lowercase()).filter(|q| !q.is_empty()) {
        all.retain(|r| r.name.to_lowercase().contains(&q));
    }
    let field = |r: &ProfileRecord, f: &str| r.doc.get(f).and_then(J::as_str).unwrap_or("DEFAULT").to_owned();
    if let Some(t) = p.transport_type.filter(|t| !t.is_empty()) {
        all.retain(|r| field(r, "transportType") == t);
    }
    match p.sort_property.as_deref().unwrap_or("name") {
        "name" => {}
        "createdTime" => all.sort_by_key(|r| r.created_time),
        "isDefault" => all.sort_by_key(|r| r.default),
        f @ ("type" | "transportType" | "description") => all.sort_by_cached_key(|r| field(r, f)),
        other => return Err(ApiError::bad_request(format!("Unsupported sort property: {other}"))),
    }
    if desc {
        all.reverse();
    }
    Ok(Json(page_of(&all, link, |r| json(st, r, render))))
}

/// `GET /api/deviceProfiles?pageSize=&page=`: full profiles.
pub async fn list(Admin(me): Admin, State(st): St, Q(p): Q<ListParams>) -> ApiResult<Json<J>> {
    page(&st, &me, p, model::profile).await
}

/// `GET /api/deviceProfileInfos?pageSize=&page=`: profile infos.
pub async fn infos(Admin(me): Admin, State(st): St, Q(p): Q<ListParams>) -> ApiResult<Json<J>> {
    page(&st, &me, p, model::profile_info).await
}

/// `GET /api/deviceProfile/{id}`.
pub async fn get(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let p = profiles::get(&st, &me, profile_id(&id)?).await?;
    Ok(Json(json(&st, &p, model::profile)))
}

/// `GET /api/deviceProfileInfo/{id}`.
pub async fn info(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let p = profiles::get(&st, &me, profile_id(&id)?).await?;
    Ok(Json(json(&st, &p, model::profile_info)))
}

/// `GET /api/deviceProfileInfo/default`.
pub async fn default_info(Admin(me): Admin, State(st): St) -> ApiResult<Json<J>> {
    let all = profiles::of_tenant(&st, &me).await?;
    let p = all.iter().find(|p| p.default).ok_or_else(|| ApiError::not_found("No default device profile"))?;
    Ok(Json(json(&st, p, model::profile_info)))
}

/// `POST /api/deviceProfile`: create, or update when the body has an id. The body is kept
/// as given (alarm rules, transport and provisioning settings are data here); GridLinks reads
/// `gatewayAdoption` (`ALLOW`/`REFUSE`: whether gateways may adopt its devices) from it.
///
/// A provision key is unique across tenants: it alone names the profile a device provisions
/// into.
pub async fn save(Admin(me): Admin, State(pl): State<Arc<Platform>>, Body(body): Body) -> ApiResult<Json<J>> {
    let st = &pl.core;
    let doc: J = parse_json(&body)?;
    let name = doc.get("name").and_then(J::as_str).unwrap_or_default().to_owned();
    let id = body_id(&doc, profile_id)?;
    // Its OTA packages (`firmwareId`, `softwareId`): checked first, told to its devices after.
    ota::check_profile(st, &me, id, &doc).await?;
    let before = match id {
        Some(id) => Some(profiles::get(st, &me, id).await?.doc),
        None => None,
    };
    let p = profiles::save(st, &me, id, name, doc).await?;
    ota::profile_saved(&pl, p.id, before.as_ref(), &p.doc).await?;
    Ok(Json(json(st, &p, model::profile)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamesParams {
    active_only: Option<bool>,
}

/// `GET /api/deviceProfile/names[?activeOnly=true]`: `[{"id", "name"}]` of every profile,
/// or only of those devices use.
pub async fn names(Admin(me): Admin, State(st): St, Q(p): Q<NamesParams>) -> ApiResult<Json<J>> {
    let store = st.store.clone();
    let active = p.active_only.unwrap_or(false);
    let used = blocking(move || {
        let used: std::collections::HashSet<ProfileId> = match active {
            true => store.devices()?.iter().map(|d| d.profile_id()).collect(),
            false => Default::default(),
        };
        Ok(used)
    })
    .await?;
    let all = profiles::of_tenant(&st, &me).await?;
    let list = all
        .iter()
        .filter(|p| !active || used.contains(&p.id))
        .map(|p| serde_json::json!({"id": model::entity_id("DEVICE_PROFILE", p.id), "name": p.name}))
        .collect();
    Ok(Json(J::Array(list)))
}

/// `DELETE /api/deviceProfile/{id}`: refused (400) for the default profile and for one
/// that devices use.
pub async fn delete(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<StatusCode> {
    profiles::delete(&st, &me, profile_id(&id)?).await?;
    Ok(StatusCode::OK)
}

/// `POST /api/deviceProfile/{id}/default`: makes it the default profile.
pub async fn set_default(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let p = profiles::set_default(&st, &me, profile_id(&id)?).await?;
    Ok(Json(json(&st, &p, model::profile)))
}

/// Rule chains, rule nodes and the rule engine are outside GridLinks: 501, naming what
/// does their most common work instead.
pub async fn rule_engine() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        gridlinks_thingsboard::error::ErrorCode::General,
        "Rule chains are not supported by GridLinks. Alarms are raised and cleared by device profile alarm rules \
         (profileData.alarms) and served at /api/alarm and /api/alarms (docs/alarms.md); notifications are sent \
         by /api/notification/rule (docs/notifications.md); committed data and alarms are forwarded to HTTP, \
         Kafka and MQTT by /api/forwarding/sink (docs/forwarding.md)",
    )
}
