//! Customers, as ThingsBoard serves them to a tenant administrator: `POST /api/customer`,
//! `GET`/`DELETE /api/customer/{id}`, `GET /api/customers`, `GET /api/tenant/customers?
//! customerTitle=`; devices assigned (`POST /api/customer/{customerId}/device/{deviceId}`,
//! `DELETE /api/customer/device/{deviceId}`, `GET /api/customer/{id}/devices`) and dashboards
//! assigned (`POST`/`DELETE /api/customer/{customerId}/dashboard/{dashboardId}`,
//! `GET /api/customer/{id}/dashboards`). Customers are stored as documents. A customer user
//! may read its own customer, its devices and its dashboards; everything else here is the
//! tenant administrator's.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_storage::{DocKind, DocRecord};
use gridlinks_thingsboard::model;
use serde::Deserialize;
use serde_json::Value as J;
use uuid::Uuid;

use super::api::{blocking, body_id, device_id, device_json, parse_json, uuid};
use super::dashboards;
use super::error::{ApiError, ApiResult};
use super::extract::{lenient_bool, Admin, Body, User, Q};
use super::paging::{descending, doc_page, page_link, page_of, DocListParams};
use gridlinks_platform::auth::{Auth, Caller};
use gridlinks_platform::entities::{self, customers, devices};
use gridlinks_platform::Core;

type St = State<Arc<Core>>;

pub(crate) fn render(st: &Core, c: &DocRecord) -> J {
    model::customer(
        &model::Customer { id: c.id, created_time: c.created_time, title: &c.title, doc: &c.doc },
        st.doc_tenant(c),
    )
}

/// `POST /api/customer`: create, or update when the body has an id. Titles are unique in
/// a tenant.
pub async fn save(Admin(me): Admin, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let doc: J = parse_json(&body)?;
    let title = doc.get("title").and_then(J::as_str).unwrap_or_default().to_owned();
    let id = body_id(&doc, |s| uuid(s, "customer"))?;
    let c = customers::save(&st, &me, id, title, doc).await?;
    Ok(Json(render(&st, &c)))
}

/// `GET /api/customer/{id}`.
pub async fn get(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let c = customers::get(&st, &me, uuid(&id, "customer")?).await?;
    Ok(Json(render(&st, &c)))
}

/// `DELETE /api/customer/{id}`: its devices and dashboards are assigned to it no more, and
/// its users are deleted (their tokens and keys stop working at once).
pub async fn delete(
    Admin(me): Admin,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    customers::delete(&st, &auth, &me, uuid(&id, "customer")?).await?;
    Ok(StatusCode::OK)
}

/// `GET /api/customers?pageSize=&page=`: by title (or `createdTime`), `textSearch` on it.
pub async fn list(Admin(me): Admin, State(st): St, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    let mine = |c: &DocRecord| st.doc_tenant(c) == me.tenant;
    Ok(Json(doc_page(&st, DocKind::Customer, p, mine, |c| render(&st, c)).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TitleParams {
    customer_title: String,
}

/// `GET /api/tenant/customers?customerTitle=`: the customer of that title.
pub async fn by_title(Admin(me): Admin, State(st): St, Q(p): Q<TitleParams>) -> ApiResult<Json<J>> {
    let store = st.store.clone();
    let all = blocking(move || store.docs(DocKind::Customer)).await?;
    let c = all
        .iter()
        .find(|c| c.title == p.customer_title && st.doc_tenant(c) == me.tenant)
        .ok_or_else(|| ApiError::not_found("Requested item wasn't found!"))?;
    Ok(Json(render(&st, c)))
}

/// Assigns a device of the caller's tenant to one of its customers, or to none.
async fn assign_device(st: &Core, me: &Caller, device: &str, customer: Option<Uuid>) -> ApiResult<Json<J>> {
    let d = devices::assign_customer(st, me, device_id(device)?, customer).await?;
    Ok(Json(device_json(st, &d)))
}

/// `POST /api/customer/{customerId}/device/{deviceId}`: the device, assigned.
pub async fn assign(
    Admin(me): Admin,
    State(st): St,
    Path((customer, device)): Path<(String, String)>,
) -> ApiResult<Json<J>> {
    assign_device(&st, &me, &device, Some(uuid(&customer, "customer")?)).await
}

/// `POST /api/owner/{CUSTOMER|TENANT}/{ownerId}/{DEVICE|ASSET|DASHBOARD}/{id}` (ThingsBoard
/// 4.4, where a customer owns what it is given): the device or asset assigned to that
/// customer or to none; the dashboard shared with that customer too, or with none.
pub async fn change_owner(
    Admin(me): Admin,
    State(st): St,
    Path((kind, owner, entity_type, entity)): Path<(String, String, String, String)>,
) -> ApiResult<Json<J>> {
    if !matches!(entity_type.as_str(), "DEVICE" | "ASSET" | "DASHBOARD") {
        return Err(ApiError::bad_request(format!(
            "Changing the owner of {entity_type} is not supported: only DEVICE, ASSET and DASHBOARD"
        )));
    }
    let customer = match kind.as_str() {
        "CUSTOMER" => Some(uuid(&owner, "customer")?),
        "TENANT" if uuid(&owner, "tenant")? == me.tenant => None,
        "TENANT" => return Err(ApiError::forbidden()),
        other => return Err(ApiError::bad_request(format!("Unknown owner type {other}: CUSTOMER or TENANT"))),
    };
    match (entity_type.as_str(), customer) {
        ("ASSET", _) => super::assets::assign(&st, &me, &entity, customer).await,
        ("DASHBOARD", Some(c)) => assign_dashboard(&st, &me, &c.to_string(), &entity, true).await,
        // A dashboard given back to its tenant is shared with no customer any more.
        ("DASHBOARD", None) => {
            let mut d = entities::dashboards::get(&st, &me, uuid(&entity, "dashboard")?).await?;
            for c in entities::dashboards::assigned_customers(&d) {
                d = entities::dashboards::assign(&st, &me, c, d.id, false).await?;
            }
            Ok(Json(dashboards::render(&st, &d, &dashboards::customers(&st).await?, false)))
        }
        _ => assign_device(&st, &me, &entity, customer).await,
    }
}

/// `DELETE /api/customer/device/{deviceId}`: the device, assigned to no customer.
pub async fn unassign(Admin(me): Admin, State(st): St, Path(device): Path<String>) -> ApiResult<Json<J>> {
    assign_device(&st, &me, &device, None).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceListParams {
    page_size: i64,
    page: i64,
    #[serde(rename = "type")]
    device_type: Option<String>,
    text_search: Option<String>,
    sort_property: Option<String>,
    sort_order: Option<String>,
    device_profile_id: Option<String>,
    /// `deviceInfos`: only devices whose `active` attribute is this.
    #[serde(default, deserialize_with = "lenient_bool")]
    active: Option<bool>,
}

/// `GET /api/customer/{customerId}/devices?pageSize=&page=`: its devices, by name.
pub async fn devices(
    User(me): User,
    State(st): St,
    Path(customer): Path<String>,
    Q(p): Q<DeviceListParams>,
) -> ApiResult<Json<J>> {
    devices_page(&st, &me, &customer, p, false).await
}

/// `GET /api/customer/{customerId}/deviceInfos?pageSize=&page=`: the same as `DeviceInfo`s.
pub async fn device_infos(
    User(me): User,
    State(st): St,
    Path(customer): Path<String>,
    Q(p): Q<DeviceListParams>,
) -> ApiResult<Json<J>> {
    devices_page(&st, &me, &customer, p, true).await
}

async fn devices_page(st: &Core, me: &Caller, customer: &str, p: DeviceListParams, infos: bool) -> ApiResult<Json<J>> {
    let _ = p.sort_property;
    let id = uuid(customer, "customer")?;
    customers::get(st, me, id).await?;
    let link = page_link(st, p.page_size, p.page)?;
    let desc = descending(p.sort_order.as_deref())?;
    let store = st.store.clone();
    let mut all = blocking(move || store.devices()).await?;
    let tenant = st.stored_tenant(me.tenant);
    all.retain(|d| d.customer == Some(id) && d.tenant == tenant);
    if let Some(t) = p.device_type.filter(|t| !t.is_empty()) {
        all.retain(|d| d.device_type == t);
    }
    if let Some(q) = p.text_search.map(|q| q.to_lowercase()).filter(|q| !q.is_empty()) {
        all.retain(|d| d.name.to_lowercase().contains(&q));
    }
    if desc {
        all.reverse();
    }
    if let Some(profile) = p.device_profile_id {
        let profile = super::profiles::profile_id(&profile)?;
        all.retain(|d| d.profile_id() == profile);
    }
    if !infos {
        return Ok(Json(page_of(&all, link, |d| device_json(st, d))));
    }
    let store = st.store.clone();
    let ids: Vec<_> = all.iter().map(|d| d.id).collect();
    let active: Vec<bool> =
        blocking(move || ids.into_iter().map(|id| super::api::stored_active(&store, id)).collect()).await?;
    let mut all: Vec<_> = all.into_iter().zip(active).collect();
    if let Some(want) = p.active {
        all.retain(|(_, a)| *a == want);
    }
    let customers = super::dashboards::customers(st).await?;
    Ok(Json(page_of(&all, link, |(d, a)| super::api::device_info(st, d, *a, &customers))))
}

async fn assign_dashboard(st: &Core, me: &Caller, customer: &str, dashboard: &str, assign: bool) -> ApiResult<Json<J>> {
    let (customer, dashboard) = (uuid(customer, "customer")?, uuid(dashboard, "dashboard")?);
    let d = entities::dashboards::assign(st, me, customer, dashboard, assign).await?;
    Ok(Json(dashboards::render(st, &d, &dashboards::customers(st).await?, false)))
}

/// `POST /api/customer/{customerId}/dashboard/{dashboardId}`: the dashboard info, assigned.
pub async fn assign_dashboard_to(
    Admin(me): Admin,
    State(st): St,
    Path((customer, dashboard)): Path<(String, String)>,
) -> ApiResult<Json<J>> {
    assign_dashboard(&st, &me, &customer, &dashboard, true).await
}

/// `DELETE /api/customer/{customerId}/dashboard/{dashboardId}`.
pub async fn unassign_dashboard_from(
    Admin(me): Admin,
    State(st): St,
    Path((customer, dashboard)): Path<(String, String)>,
) -> ApiResult<Json<J>> {
    assign_dashboard(&st, &me, &customer, &dashboard, false).await
}

/// `GET /api/customer/{customerId}/dashboards?pageSize=&page=`: dashboard infos.
pub async fn dashboards_of(
    User(me): User,
    State(st): St,
    Path(customer): Path<String>,
    Q(p): Q<DocListParams>,
) -> ApiResult<Json<J>> {
    let id = uuid(&customer, "customer")?;
    customers::get(&st, &me, id).await?;
    let customers = dashboards::customers(&st).await?;
    let assigned = |d: &DocRecord| entities::dashboards::assigned(d, id);
    let page =
        doc_page(&st, DocKind::Dashboard, p, assigned, |d| dashboards::render(&st, d, &customers, false)).await?;
    Ok(Json(page))
}
