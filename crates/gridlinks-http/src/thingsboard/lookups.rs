//! The smaller reads tb-rest-client makes besides each entity's main calls: entities by a
//! list of ids (those of them the caller may see), one entity's info, title or short info,
//! devices found through relations, the keys the entities of a query or a profile have,
//! the server's time. Each checks its caller as the main calls do.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use gridlinks_platform::auth::Auth;
use gridlinks_platform::entities::relations::{self, EntityKind};
use gridlinks_platform::entities::{customers, dashboards, devices, profiles, users};
use gridlinks_platform::Core;
use gridlinks_thingsboard::{model, ws as proto};
use gridlinks_types::{AttributeScope, DeviceId, ProfileId, Ts};
use serde::Deserialize;
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::api::{blocking, parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{lenient_bool, Admin, Body, User, Q};
use crate::ws::entity;

type St = State<Arc<Core>>;

/// A comma-separated list of ids.
pub(crate) fn ids(list: &str, what: &str) -> ApiResult<Vec<Uuid>> {
    list.split(',').filter(|s| !s.trim().is_empty()).map(|s| uuid(s.trim(), what)).collect()
}

// ---- customers --------------------------------------------------------------------

/// `GET /api/customer/info/{id}`.
pub async fn customer_info(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let c = customers::get(&st, &me, uuid(&id, "customer")?).await?;
    Ok(Json(super::customers::render(&st, &c)))
}

/// `GET /api/customer/{id}/title`: its title, as text.
pub async fn customer_title(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<String> {
    Ok(customers::get(&st, &me, uuid(&id, "customer")?).await?.title)
}

/// `GET /api/customer/{id}/shortInfo`: `{"title", "isPublic"}`.
pub async fn customer_short_info(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let c = customers::get(&st, &me, uuid(&id, "customer")?).await?;
    Ok(Json(json!({"title": c.title, "isPublic": false})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CustomerIds {
    customer_ids: String,
}

/// `GET /api/customers/list?customerIds=`: those of the caller's tenant.
pub async fn customers_by_ids(Admin(me): Admin, State(st): St, Q(p): Q<CustomerIds>) -> ApiResult<Json<J>> {
    let mut out = Vec::new();
    for id in ids(&p.customer_ids, "customer")? {
        if let Ok(c) = customers::get(&st, &me, id).await {
            out.push(super::customers::render(&st, &c));
        }
    }
    Ok(Json(J::Array(out)))
}

// ---- devices ----------------------------------------------------------------------

/// `GET /api/device/info/{id}`: ThingsBoard's `DeviceInfo`.
pub async fn device_info(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let d = devices::get(&st, &me, model::device_id(&id).map_err(|e| ApiError::bad_request(e.to_string()))?).await?;
    let store = st.store.clone();
    let active = blocking(move || super::api::stored_active(&store, d.id).map(|a| (a, d))).await?;
    let customers = super::dashboards::customers(&st).await?;
    Ok(Json(super::api::device_info(&st, &active.1, active.0, &customers)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceIds {
    device_ids: String,
}

/// `GET /api/devices?deviceIds=`: those the caller may see.
pub async fn devices_by_ids(User(me): User, State(st): St, Q(p): Q<DeviceIds>) -> ApiResult<Json<J>> {
    let mut out = Vec::new();
    for id in ids(&p.device_ids, "device")? {
        if let Ok(d) = devices::get(&st, &me, DeviceId(id)).await {
            out.push(super::api::device_json(&st, &d));
        }
    }
    Ok(Json(J::Array(out)))
}

/// `POST /api/devices` (`DeviceSearchQuery`): the devices related to a root entity by
/// `relationType`, of `deviceTypes` (any when empty).
pub async fn devices_by_query(User(me): User, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let (query, types) = super::relations::search_query(&parse_json(&body)?, EntityKind::Device, "deviceTypes")?;
    let mut out = Vec::new();
    for id in relations::reached(&st, &me, query, EntityKind::Device).await? {
        if let Ok(d) = devices::get(&st, &me, DeviceId(id)).await {
            if types.is_empty() || types.contains(&d.device_type) {
                out.push(super::api::device_json(&st, &d));
            }
        }
    }
    Ok(Json(J::Array(out)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfileKeyParams {
    device_profile_id: Option<String>,
}

/// The caller's tenant's devices, of profile `profile` when given.
async fn tenant_devices(st: &Core, tenant: Uuid, profile: Option<ProfileId>) -> ApiResult<Vec<DeviceId>> {
    let store = st.store.clone();
    let tenant = st.stored_tenant(tenant);
    blocking(move || {
        Ok(store
            .devices()?
            .into_iter()
            .filter(|d| d.tenant == tenant && profile.is_none_or(|p| d.profile_id() == p))
            .map(|d| d.id)
            .collect())
    })
    .await
}

async fn profile_devices(
    st: &Core,
    me: &gridlinks_platform::auth::Caller,
    p: ProfileKeyParams,
) -> ApiResult<Vec<DeviceId>> {
    let profile = match p.device_profile_id {
        Some(id) => Some(profiles::get(st, me, super::profiles::profile_id(&id)?).await?.id),
        None => None,
    };
    tenant_devices(st, me.tenant, profile).await
}

/// `GET /api/deviceProfile/devices/keys/timeseries[?deviceProfileId=]`: the time-series
/// keys of the tenant's devices (of that profile), by name.
pub async fn profile_ts_keys(Admin(me): Admin, State(st): St, Q(p): Q<ProfileKeyParams>) -> ApiResult<Json<J>> {
    let devices = profile_devices(&st, &me, p).await?;
    let ts = st.ts.clone();
    let keys: BTreeSet<String> = blocking(move || {
        let mut all = BTreeSet::new();
        for d in devices {
            all.extend(ts.reads().ts_keys(d)?);
        }
        Ok(all)
    })
    .await?;
    Ok(Json(json!(keys)))
}

/// `GET /api/deviceProfile/devices/keys/attributes[?deviceProfileId=]`: their attribute keys.
pub async fn profile_attr_keys(Admin(me): Admin, State(st): St, Q(p): Q<ProfileKeyParams>) -> ApiResult<Json<J>> {
    let devices = profile_devices(&st, &me, p).await?;
    let store = st.store.clone();
    let keys: BTreeSet<String> = blocking(move || {
        let mut all = BTreeSet::new();
        for d in devices {
            all.extend(store.attributes(d, None, None)?.into_iter().map(|a| a.key));
        }
        Ok(all)
    })
    .await?;
    Ok(Json(json!(keys)))
}

/// `GET /api/devices/count/{FIRMWARE|SOFTWARE}/{deviceProfileId}`: how many devices of the
/// profile have no package of that type of their own (they follow the profile's).
pub async fn count_without_ota(
    Admin(me): Admin,
    State(st): St,
    Path((ota_type, profile)): Path<(String, String)>,
) -> ApiResult<Json<J>> {
    let firmware = match ota_type.as_str() {
        "FIRMWARE" => true,
        "SOFTWARE" => false,
        other => return Err(ApiError::bad_request(format!("Unknown OTA package type {other}: FIRMWARE or SOFTWARE"))),
    };
    let profile = profiles::get(&st, &me, super::profiles::profile_id(&profile)?).await?.id;
    let store = st.store.clone();
    let tenant = st.stored_tenant(me.tenant);
    let n = blocking(move || {
        Ok(store
            .devices()?
            .iter()
            .filter(|d| d.tenant == tenant && d.profile_id() == profile)
            .filter(|d| if firmware { d.firmware.is_none() } else { d.software.is_none() })
            .count())
    })
    .await?;
    Ok(Json(json!(n)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProfileIds {
    device_profile_ids: String,
}

/// `GET /api/deviceProfileInfos/list?deviceProfileIds=`: those of the caller's tenant.
pub async fn profile_infos_by_ids(Admin(me): Admin, State(st): St, Q(p): Q<ProfileIds>) -> ApiResult<Json<J>> {
    let mut out = Vec::new();
    for id in ids(&p.device_profile_ids, "device profile")? {
        if let Ok(p) = profiles::get(&st, &me, ProfileId(id)).await {
            out.push(super::profiles::json(&st, &p, model::profile_info));
        }
    }
    Ok(Json(J::Array(out)))
}

// ---- dashboards, users ------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DashboardIds {
    dashboard_ids: String,
}

/// `GET /api/dashboards?dashboardIds=`: infos of those the caller may see.
pub async fn dashboards_by_ids(User(me): User, State(st): St, Q(p): Q<DashboardIds>) -> ApiResult<Json<J>> {
    let customers = super::dashboards::customers(&st).await?;
    let mut out = Vec::new();
    for id in ids(&p.dashboard_ids, "dashboard")? {
        if let Ok(d) = dashboards::get(&st, &me, id).await {
            out.push(super::dashboards::render(&st, &d, &customers, false));
        }
    }
    Ok(Json(J::Array(out)))
}

/// `GET /api/dashboard/serverTime`: the server's clock, ms since the epoch.
pub async fn server_time(User(_): User) -> Json<J> {
    Json(json!(Ts::now().0))
}

/// `GET /api/dashboard/maxDatapointsLimit`: the most points one time-series read returns
/// (its `limit`), which ThingsBoard's widgets ask before reading.
pub async fn max_datapoints_limit(User(_): User) -> Json<J> {
    Json(json!(super::api::MAX_LIMIT))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UserIds {
    user_ids: String,
}

/// `GET /api/users/list?userIds=`: those the caller manages.
pub async fn users_by_ids(
    Admin(me): Admin,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Q(p): Q<UserIds>,
) -> ApiResult<Json<J>> {
    let mut out = Vec::new();
    for id in ids(&p.user_ids, "user")? {
        if let Ok(e) = users::managed(&auth, &me, id) {
            out.push(super::users::render_entry(&st, &e).await?);
        }
    }
    Ok(Json(J::Array(out)))
}

// ---- keys of a query's entities ---------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeysParams {
    #[serde(default, deserialize_with = "lenient_bool")]
    timeseries: Option<bool>,
    #[serde(default, deserialize_with = "lenient_bool")]
    attributes: Option<bool>,
    scope: Option<String>,
    #[serde(default, deserialize_with = "lenient_bool")]
    include_timeseries: Option<bool>,
    #[serde(default, deserialize_with = "lenient_bool")]
    include_attributes: Option<bool>,
    scopes: Option<String>,
    #[serde(default, deserialize_with = "lenient_bool")]
    include_samples: Option<bool>,
}

/// The keys of the entities of one page of a query: their types, time-series keys, and
/// attribute keys by scope.
struct FoundKeys {
    total: usize,
    entity_types: BTreeSet<&'static str>,
    timeseries: BTreeSet<String>,
    attributes: Vec<(AttributeScope, BTreeSet<String>)>,
}

async fn keys_of(
    st: &Core,
    me: gridlinks_platform::auth::Caller,
    body: &[u8],
    scopes: Vec<AttributeScope>,
) -> ApiResult<FoundKeys> {
    let q = proto::parse_query(parse_json(body)?).map_err(ApiError::bad_request)?;
    let core = st.clone();
    let found = blocking(move || {
        Ok(entity::select(&core, &me, &q).and_then(|(total, page)| {
            let attributes = scopes.iter().map(|s| (*s, BTreeSet::new())).collect();
            let mut k = FoundKeys { total, entity_types: BTreeSet::new(), timeseries: BTreeSet::new(), attributes };
            for e in &page {
                k.entity_types.insert(e.entity_type());
                k.timeseries.extend(core.ts.reads().ts_keys(e.id()).map_err(crate::ws::internal)?);
                for (scope, keys) in &mut k.attributes {
                    let found = core.store.attributes(e.id(), Some(*scope), None).map_err(crate::ws::internal)?;
                    keys.extend(found.into_iter().map(|a| a.key));
                }
            }
            Ok(k)
        }))
    })
    .await?;
    found.map_err(|(_, why)| ApiError::bad_request(why))
}

fn scope_list(s: Option<&str>) -> ApiResult<Vec<AttributeScope>> {
    match s.filter(|s| !s.is_empty()) {
        None => Ok(vec![AttributeScope::Client, AttributeScope::Shared, AttributeScope::Server]),
        Some(list) => list.split(',').map(|s| super::api::scope(s.trim())).collect(),
    }
}

/// `POST /api/entitiesQuery/find/keys?timeseries=&attributes=[&scope=]`: the time-series
/// and attribute keys of the entities of the query's page.
pub async fn entity_keys(User(me): User, State(st): St, Q(p): Q<KeysParams>, Body(body): Body) -> ApiResult<Json<J>> {
    let k = keys_of(&st, me, &body, scope_list(p.scope.as_deref())?).await?;
    let attribute: BTreeSet<&String> = k.attributes.iter().flat_map(|(_, keys)| keys).collect();
    Ok(Json(json!({
        "entityTypes": k.entity_types,
        "timeseries": if p.timeseries.unwrap_or(false) { json!(k.timeseries) } else { json!([]) },
        "attribute": if p.attributes.unwrap_or(false) { json!(attribute) } else { json!([]) },
    })))
}

/// `POST /api/v2/entitiesQuery/find/keys?includeTimeseries=&includeAttributes=&scopes=`: the
/// same, attribute keys by scope (`{"key"}` each; GridLinks sends no samples).
pub async fn entity_keys_v2(
    User(me): User,
    State(st): St,
    Q(p): Q<KeysParams>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let _ = p.include_samples;
    let k = keys_of(&st, me, &body, scope_list(p.scopes.as_deref())?).await?;
    let listed = |keys: &BTreeSet<String>| J::Array(keys.iter().map(|k| json!({"key": k})).collect());
    let mut out = json!({"totalEntities": k.total, "entityTypes": k.entity_types});
    if p.include_timeseries.unwrap_or(true) {
        out["timeseries"] = listed(&k.timeseries);
    }
    if p.include_attributes.unwrap_or(true) {
        out["attributes"] = k.attributes.iter().map(|(s, keys)| (s.as_str().to_owned(), listed(keys))).collect();
    }
    Ok(Json(out))
}
