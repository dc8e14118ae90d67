//! ThingsBoard's admin REST API: login, devices, bulk import, telemetry and attributes.

use std::sync::Arc;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gridlinks_storage::query::{Agg, HistoryQuery, Order};
use gridlinks_storage::{DeleteTelemetry, DeviceRecord, DocRecord, ImportRow, SaveDevice};
use gridlinks_types::{AttributeScope, DeviceId, Ts, TsRecord, Value};
use serde::Deserialize;
use serde_json::{json, Value as J};

use super::error::{ApiError, ApiResult};
use super::extract::{lenient_bool, Admin, Body, User, Q};
use super::paging::{descending, page_link, page_of};
use gridlinks_ingest::{IngestError, Item};
use gridlinks_platform::activity;
use gridlinks_platform::attributes;
use gridlinks_platform::auth;
use gridlinks_platform::auth::{Auth, Authority, Caller};
use gridlinks_platform::entities::devices::{self, Credentials};
use gridlinks_platform::entities::ota;
use gridlinks_platform::Core;
use gridlinks_platform::Platform;
use gridlinks_thingsboard::error::ErrorCode;
use gridlinks_thingsboard::model::{self, EntityError};
use gridlinks_thingsboard::payload::{self, PayloadError};
use gridlinks_thingsboard::{csv, keys};

type St = State<Arc<Core>>;

/// Runs a storage read off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, gridlinks_storage::StoreError> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("query task failed: {e}")))?
        .map_err(ApiError::from)
}

/// The id an entity body carries (`"id": {"entityType", "id"}`), if any, read by `parse`.
pub(crate) fn body_id<T>(body: &J, parse: impl FnOnce(&str) -> ApiResult<T>) -> ApiResult<Option<T>> {
    let Some(e) = body.get("id").filter(|v| !v.is_null()) else { return Ok(None) };
    let e: model::Id = serde_json::from_value(e.clone())
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: id: {e}")))?;
    parse(&e.id).map(Some)
}

/// An id from a path or body; 400 `Invalid {what} id: …` when it is not a UUID.
pub(crate) fn uuid(s: &str, what: &str) -> ApiResult<uuid::Uuid> {
    s.parse().map_err(|_| ApiError::bad_request(format!("Invalid {what} id: {s}")))
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}

fn payload_error(e: PayloadError) -> ApiError {
    ApiError::bad_request(e.to_string())
}

// ---- authentication -------------------------------------------------------------

#[derive(Deserialize)]
struct LoginRequest {
    username: String,
    password: String,
}

/// `POST /api/auth/login`: throttled per source address and user name (429 with
/// Retry-After while a wait is running), 503 when password checking is saturated.
pub async fn login(
    State(auth): State<Arc<Auth>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let req: LoginRequest =
        serde_json::from_slice(&body).map_err(|_| ApiError::unauthorized("Authentication failed"))?;
    let pair = auth.login(peer.ip(), &req.username, &req.password).await.map_err(auth_error)?;
    Ok(Json(pair_json(&pair)))
}

/// ThingsBoard's `JwtPair`.
pub(crate) fn pair_json(pair: &auth::TokenPair) -> J {
    json!({"token": pair.token, "refreshToken": pair.refresh_token, "scope": pair.scope.as_str()})
}

/// The REST answer to an authentication failure.
pub(crate) fn auth_error(e: auth::AuthError) -> ApiError {
    match e {
        auth::AuthError::Expired => ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::JwtExpired, "Token has expired"),
        auth::AuthError::BadCredentials => ApiError::unauthorized("Invalid username or password"),
        e @ auth::AuthError::NotActive => ApiError::unauthorized(e.to_string()),
        auth::AuthError::BadToken => ApiError::unauthorized("Invalid JWT token"),
        e @ auth::AuthError::Throttled(wait) => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, ErrorCode::TooManyRequests, e.to_string())
                .retry_after(wait.as_secs().max(1))
        }
        e @ auth::AuthError::Busy => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::TooManyRequests, e.to_string())
        }
        e @ (auth::AuthError::Hash(_) | auth::AuthError::Store(_) | auth::AuthError::Sign(_)) => {
            ApiError::internal(e.to_string())
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RefreshRequest {
    refresh_token: String,
}

/// `POST /api/auth/token`: a new pair; the refresh token used stops working, and using it
/// again ends its login.
pub async fn refresh(State(auth): State<Arc<Auth>>, Body(body): Body) -> ApiResult<Json<J>> {
    let req: RefreshRequest =
        serde_json::from_slice(&body).map_err(|_| ApiError::unauthorized("Authentication failed"))?;
    let pair = auth.refresh(&req.refresh_token).await.map_err(auth_error)?;
    Ok(Json(pair_json(&pair)))
}

/// `POST /api/auth/logout`: ends the login of the access token (its refresh token too).
pub async fn logout(_: Admin, State(auth): State<Arc<Auth>>, headers: axum::http::HeaderMap) -> ApiResult<StatusCode> {
    let token = super::extract::bearer(&headers).ok_or_else(|| ApiError::unauthorized("Authentication failed"))?;
    auth.logout(token).await.map_err(auth_error)?;
    Ok(StatusCode::OK)
}

// ---- devices --------------------------------------------------------------------

/// A device id from a path or a body; 400 when it is not a UUID.
pub(crate) fn device_id(s: &str) -> ApiResult<DeviceId> {
    model::device_id(s).map_err(entity_error)
}

fn entity_error(e: EntityError) -> ApiError {
    ApiError::bad_request(e.to_string())
}

/// The device JSON's view of a stored device.
pub(crate) fn device_view(d: &gridlinks_storage::DeviceRecord) -> model::Device<'_> {
    model::Device {
        id: d.id,
        created_time: d.created_time,
        name: &d.name,
        device_type: &d.device_type,
        profile: d.profile_id(),
        label: d.label.as_deref(),
        token: &d.token,
        additional_info: d.additional_info.as_ref(),
        identity: d.identity.as_ref().map(|i| (i.protocol.as_str(), i.id.as_str())),
        basic: d.basic.as_ref().map(|b| (b.client_id.as_deref(), b.user_name.as_deref())),
        x509: d.x509.as_ref().map(|x| (x.fingerprint.as_str(), x.cert.as_str())),
        customer: d.customer,
    }
}

/// ThingsBoard's device JSON of a stored device.
pub(crate) fn device_json(st: &Core, d: &gridlinks_storage::DeviceRecord) -> J {
    let mut j = model::device(&device_view(d), st.tenant_of(d.tenant));
    if let Some(o) = j.as_object_mut() {
        for (field, id) in [("firmwareId", d.firmware), ("softwareId", d.software)] {
            if let Some(id) = id {
                o.insert(field.into(), model::entity_id("OTA_PACKAGE", id));
            }
        }
    }
    j
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SaveDeviceParams {
    access_token: Option<String>,
    name_conflict_policy: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceBody {
    id: Option<model::Id>,
    name: Option<String>,
    #[serde(rename = "type")]
    device_type: Option<String>,
    label: Option<String>,
    additional_info: Option<J>,
    device_profile_id: Option<model::Id>,
    firmware_id: Option<J>,
    software_id: Option<J>,
}

/// `POST /api/device[?accessToken=]`: create, or update when the body has an id. A token
/// taken by any device (of any tenant) is refused, and such refusals are throttled
/// ([`super::guards`]).
pub async fn save_device(
    Admin(me): Admin,
    State(p): State<Arc<Platform>>,
    Q(q): Q<SaveDeviceParams>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    if q.name_conflict_policy.as_deref().is_some_and(|v| v != "FAIL") {
        return Err(ApiError::bad_request("only nameConflictPolicy=FAIL is supported"));
    }
    let b: DeviceBody = parse_json(&body)?;
    // Empty or absent: a new device gets a random 20-character token, as in ThingsBoard.
    let d = store_device(&p, &me, b, q.access_token.filter(|t| !t.is_empty())).await?;
    Ok(Json(device_json(&p.core, &d)))
}

/// Creates or updates a device as `POST /api/device` does; its profile's OTA packages are
/// given to a new device, or to one moved to another profile.
async fn store_device(p: &Platform, me: &Caller, b: DeviceBody, token: Option<String>) -> ApiResult<DeviceRecord> {
    // A profile id wins over a type; a type names a profile, created if it does not exist.
    let fields = devices::DeviceFields {
        name: b.name.unwrap_or_default(),
        device_type: b.device_type.unwrap_or_default(),
        profile: b.device_profile_id.map(|p| super::profiles::profile_id(&p.id)).transpose()?,
        label: b.label,
        additional_info: b.additional_info,
    };
    let id = b.id.map(|e| device_id(&e.id)).transpose()?;
    let profile_before = match id {
        Some(id) => Some(devices::get(&p.core, me, id).await?.profile_id()),
        None => None,
    };
    let d = devices::save(&p.core, me, id, fields, token).await?;
    let moved = profile_before != Some(d.profile_id());
    Ok(ota::assign_device(p, me, d, b.firmware_id.as_ref(), b.software_id.as_ref(), moved).await?)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceWithCredentials {
    device: DeviceBody,
    credentials: CredentialsFields,
}

/// `POST /api/device-with-credentials` `{"device", "credentials"}`: a device saved with its
/// credentials. An access token is saved with the device in one write; other credentials
/// are checked first, then set on the saved device, and a device this call created is
/// deleted again if they are refused (taken by another device).
pub async fn save_device_with_credentials(
    Admin(me): Admin,
    State(p): State<Arc<Platform>>,
    Q(q): Q<SaveDeviceParams>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    if q.name_conflict_policy.as_deref().is_some_and(|v| v != "FAIL") || q.access_token.is_some() {
        return Err(ApiError::bad_request("only nameConflictPolicy=FAIL is supported; the token goes in credentials"));
    }
    let b: DeviceWithCredentials = parse_json(&body)?;
    let created = b.device.id.is_none();
    let credentials = credentials(b.credentials)?;
    let (token, rest) = match credentials {
        Credentials::AccessToken(t) => (Some(t), None),
        other => (None, Some(other)),
    };
    let d = store_device(&p, &me, b.device, token).await?;
    let Some(credentials) = rest else { return Ok(Json(device_json(&p.core, &d))) };
    match devices::set_credentials(&p, &me, d.id, credentials).await {
        Ok(d) => Ok(Json(device_json(&p.core, &d))),
        Err(e) => {
            if created {
                devices::delete(&p, &me, d.id).await?;
            }
            Err(e.into())
        }
    }
}

/// `GET /api/device/{id}`.
pub async fn get_device(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let d = devices::get(&st, &me, device_id(&id)?).await?;
    Ok(Json(device_json(&st, &d)))
}

/// `DELETE /api/device/{id}`: the device, its data and its token go at once.
pub async fn delete_device(
    Admin(me): Admin,
    State(p): State<Arc<Platform>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    // Its token no longer works; its live connections go too, on every transport.
    devices::delete(&p, &me, device_id(&id)?).await?;
    Ok(StatusCode::OK)
}

/// `GET /api/device/{id}/credentials`.
pub async fn get_credentials(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let d = devices::get(&st, &me, device_id(&id)?).await?;
    Ok(Json(model::credentials(&device_view(&d))))
}

/// MQTT_BASIC's `credentialsValue`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BasicValue {
    client_id: Option<String>,
    user_name: Option<String>,
    password: Option<String>,
}

/// What `POST /api/device/credentials` reads of ThingsBoard's credentials object (the rest
/// of what a client sends back, ids and versions, is ignored).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CredentialsBody {
    device_id: model::Id,
    #[serde(flatten)]
    fields: CredentialsFields,
}

/// What a client says of credentials (ThingsBoard's `DeviceCredentials` without the device).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CredentialsFields {
    credentials_type: String,
    credentials_id: Option<String>,
    credentials_value: Option<String>,
}

/// `POST /api/device/credentials`: `ACCESS_TOKEN` sets the device's token (as in
/// ThingsBoard); `PROTOCOL_IDENTITY` gives it the identity a custom TCP protocol knows it by
/// (`credentialsId` the identity, `credentialsValue` the protocol, e.g. `lamp`), beside its
/// token; `MQTT_BASIC` (`credentialsValue` `{"clientId","userName","password"}` as a JSON
/// string) replaces its token, the password kept as an argon2 hash. Each is unique across
/// tenants: a taken one is refused, and such refusals are throttled ([`super::guards`]).
pub async fn save_credentials(
    Admin(me): Admin,
    State(p): State<Arc<Platform>>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let b: CredentialsBody = parse_json(&body)?;
    let id = device_id(&b.device_id.id)?;
    let credentials = credentials(b.fields)?;
    let identity = matches!(credentials, Credentials::ProtocolIdentity(_));
    let d = devices::set_credentials(&p, &me, id, credentials).await?;
    Ok(Json(if identity {
        model::identity_credentials(&device_view(&d))
    } else {
        model::credentials(&device_view(&d))
    }))
}

/// The credentials a client's fields describe, checked.
fn credentials(b: CredentialsFields) -> ApiResult<Credentials> {
    let cred_id = b.credentials_id.filter(|c| !c.is_empty());
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
    Ok(match b.credentials_type.as_str() {
        "ACCESS_TOKEN" => Credentials::AccessToken(
            cred_id.ok_or_else(|| ApiError::bad_request("credentialsId (the access token) is required"))?,
        ),
        "PROTOCOL_IDENTITY" => Credentials::ProtocolIdentity(gridlinks_types::ProtocolIdentity {
            protocol: nonempty(b.credentials_value)
                .ok_or_else(|| ApiError::bad_request("credentialsValue (the protocol, e.g. lamp) is required"))?,
            id: cred_id.ok_or_else(|| ApiError::bad_request("credentialsId (the identity) is required"))?,
        }),
        "MQTT_BASIC" => {
            let v: BasicValue = parse_json(b.credentials_value.unwrap_or_default().as_bytes())?;
            Credentials::Basic {
                client_id: nonempty(v.client_id),
                user_name: nonempty(v.user_name),
                password: nonempty(v.password),
            }
        }
        "X509_CERTIFICATE" => Credentials::X509(b.credentials_value.unwrap_or_default()),
        other => {
            return Err(ApiError::bad_request(format!(
                "credentials type {other} is not supported: use ACCESS_TOKEN, MQTT_BASIC, X509_CERTIFICATE or PROTOCOL_IDENTITY"
            )))
        }
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListParams {
    page_size: Option<i64>,
    page: Option<i64>,
    #[serde(rename = "type")]
    device_type: Option<String>,
    text_search: Option<String>,
    sort_property: Option<String>,
    sort_order: Option<String>,
    device_name: Option<String>,
    /// `deviceInfos`: only devices whose `active` attribute is this.
    active: Option<bool>,
    /// `deviceInfos`: only devices of this profile.
    device_profile_id: Option<String>,
    /// `deviceInfos/all` (tb-rest-client 4.4): devices assigned to customers are the
    /// tenant's too, so this changes nothing.
    #[serde(rename = "includeCustomers")]
    _include_customers: Option<bool>,
}

/// `GET /api/tenant/deviceInfos?pageSize=&page=[&active=&deviceProfileId=&type=&textSearch=…]`
/// (and `/api/deviceInfos/all`, where tb-rest-client 4.4 asks):
/// devices with their `active` state (the stored server attribute), profile name and
/// customer, as ThingsBoard's `DeviceInfo`.
pub async fn list_device_infos(Admin(me): Admin, State(st): St, Q(p): Q<ListParams>) -> ApiResult<Json<J>> {
    list(&st, &me, p, true).await
}

/// `GET /api/device/types`: the device types (profile names) the caller's tenant's devices
/// have, as ThingsBoard's `EntitySubtype` list, by name.
pub async fn device_types(Admin(me): Admin, State(st): St) -> ApiResult<Json<J>> {
    let store = st.store.clone();
    let tenant = st.stored_tenant(me.tenant);
    let mut types: Vec<String> = blocking(move || {
        Ok(store.devices()?.into_iter().filter(|d| d.tenant == tenant).map(|d| d.device_type).collect())
    })
    .await?;
    types.sort();
    types.dedup();
    let owner = model::entity_id("TENANT", me.tenant);
    Ok(Json(J::Array(
        types.into_iter().map(|t| serde_json::json!({"tenantId": owner, "entityType": "DEVICE", "type": t})).collect(),
    )))
}

/// `GET /api/tenant/devices?pageSize=&page=…` or `?deviceName=`; `GET /api/tenant/device?deviceName=`.
pub async fn list_devices(Admin(me): Admin, State(st): St, Q(p): Q<ListParams>) -> ApiResult<Json<J>> {
    list(&st, &me, p, false).await
}

async fn list(st: &Core, me: &Caller, p: ListParams, infos: bool) -> ApiResult<Json<J>> {
    let tenant = st.stored_tenant(me.tenant);
    if let Some(name) = p.device_name {
        let store = st.store.clone();
        let d = blocking(move || store.device_by_name(tenant, &name))
            .await?
            .ok_or_else(|| ApiError::not_found("Requested item wasn't found!"))?;
        return Ok(Json(device_json(st, &d)));
    }
    let (Some(page_size), Some(page)) = (p.page_size, p.page) else {
        return Err(ApiError::bad_request(
            "Required request parameters 'pageSize' and 'page' are missing (or give 'deviceName')",
        ));
    };
    let link = page_link(st, page_size, page)?;
    let desc = descending(p.sort_order.as_deref())?;
    let sort = p.sort_property.unwrap_or_else(|| "name".into());
    if !matches!(sort.as_str(), "name" | "createdTime" | "type" | "label" | "deviceProfileName") {
        return Err(ApiError::bad_request(format!(
            "Invalid sort property '{sort}': use name, createdTime, type, label or deviceProfileName"
        )));
    }
    let store = st.store.clone();
    let mut devices = blocking(move || store.devices()).await?;
    devices.retain(|d| d.tenant == tenant);
    if let Some(t) = p.device_type.filter(|t| !t.is_empty()) {
        devices.retain(|d| d.device_type == t);
    }
    if let Some(q) = p.text_search.map(|q| q.to_lowercase()).filter(|q| !q.is_empty()) {
        devices.retain(|d| {
            d.name.to_lowercase().contains(&q) || d.label.as_ref().is_some_and(|l| l.to_lowercase().contains(&q))
        });
    }
    if let Some(profile) = p.device_profile_id {
        let profile = super::profiles::profile_id(&profile)?;
        devices.retain(|d| d.profile_id() == profile);
    }
    // Each device's stored `active` (another node may hold it: the attribute is the truth).
    let store = st.store.clone();
    let ids: Vec<_> = devices.iter().map(|d| d.id).collect();
    let active: std::collections::HashMap<_, bool> = if infos {
        blocking(move || ids.into_iter().map(|id| Ok((id, stored_active(&store, id)?))).collect()).await?
    } else {
        Default::default()
    };
    if let Some(want) = p.active {
        devices.retain(|d| active.get(&d.id) == Some(&want));
    }
    match sort.as_str() {
        "createdTime" => devices.sort_by_key(|d| d.created_time),
        "type" | "deviceProfileName" => devices.sort_by(|a, b| a.device_type.cmp(&b.device_type)),
        "label" => devices.sort_by(|a, b| a.label.cmp(&b.label)),
        _ => {} // already in name order
    }
    if desc {
        devices.reverse();
    }
    if !infos {
        return Ok(Json(page_of(&devices, link, |d| device_json(st, d))));
    }
    let customers = super::dashboards::customers(st).await?;
    Ok(Json(page_of(&devices, link, |d| device_info(st, d, active.get(&d.id).copied().unwrap_or(false), &customers))))
}

/// ThingsBoard's `DeviceInfo`: the device with its `active` state, profile name and
/// customer (named from `customers`).
pub(crate) fn device_info(st: &Core, d: &gridlinks_storage::DeviceRecord, active: bool, customers: &[DocRecord]) -> J {
    let mut j = device_json(st, d);
    if let Some(o) = j.as_object_mut() {
        let customer = d.customer.and_then(|c| customers.iter().find(|x| x.id == c));
        o.insert("active".into(), active.into());
        o.insert("deviceProfileName".into(), d.device_type.clone().into());
        o.insert("customerTitle".into(), customer.map(|c| c.title.clone()).into());
        o.insert("ownerName".into(), customer.map(|c| c.title.clone()).into());
        o.insert("customerIsPublic".into(), false.into());
    }
    j
}

/// Whether device `id`'s stored `active` server attribute is true (blocking).
pub(crate) fn stored_active(
    store: &gridlinks_storage::Store,
    id: DeviceId,
) -> Result<bool, gridlinks_storage::StoreError> {
    let key = [activity::ACTIVE.to_owned()];
    let a = store.attributes(id, Some(AttributeScope::Server), Some(&key))?;
    Ok(a.first().is_some_and(|a| a.value == Value::Bool(true)))
}

// ---- bulk import ----------------------------------------------------------------

#[derive(Deserialize)]
struct ImportRequest {
    file: String,
    mapping: ImportMapping,
}

#[derive(Deserialize)]
struct ImportMapping {
    columns: Vec<ImportColumn>,
    delimiter: Option<String>,
    #[serde(default)]
    update: bool,
    #[serde(default)]
    header: bool,
}

#[derive(Deserialize)]
struct ImportColumn {
    #[serde(rename = "type")]
    column_type: String,
    key: Option<String>,
}

/// `POST /api/device/bulk_import`: ThingsBoard's CSV import, one commit for all rows. A row
/// whose access token is taken (by any tenant's device) is refused, and each such row counts
/// as a credential conflict ([`super::guards`]). Imported devices whose profile assigns an
/// OTA package are told it, as a saved device is.
pub async fn bulk_import(Admin(me): Admin, State(p): State<Arc<Platform>>, Body(body): Body) -> ApiResult<Json<J>> {
    let st = &p.core;
    let req: ImportRequest = parse_json(&body)?;
    if req.mapping.columns.iter().any(|c| c.column_type == "ACCESS_TOKEN") {
        st.guards.check_conflicts(&me).map_err(ApiError::credential_conflicts)?;
    }
    let delimiter = match req.mapping.delimiter.as_deref() {
        None | Some("") => b',',
        Some(d) if d.len() == 1 => d.as_bytes()[0],
        Some(d) => return Err(ApiError::bad_request(format!("delimiter must be one ASCII character, got {d:?}"))),
    };
    let max_key = st.cfg.limits.max_key_len;
    for c in &req.mapping.columns {
        match c.column_type.as_str() {
            "NAME" | "TYPE" | "LABEL" | "ACCESS_TOKEN" | "DESCRIPTION" | "IS_GATEWAY" => {}
            "SHARED_ATTRIBUTE" | "SERVER_ATTRIBUTE" | "TIMESERIES" => {
                if c.key.as_ref().is_some_and(|k| k.len() > max_key) {
                    return Err(ApiError::bad_request(format!("column key longer than {max_key} bytes")));
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "column type {other} is not supported; supported: NAME, TYPE, LABEL, ACCESS_TOKEN, \
                     SHARED_ATTRIBUTE, SERVER_ATTRIBUTE, TIMESERIES, DESCRIPTION, IS_GATEWAY"
                )))
            }
        }
    }
    let delimiter = char::from(delimiter);
    let mut rows = Vec::new();
    let mut telemetry: Vec<(String, Vec<(String, Value)>)> = Vec::new();
    let mut errors = Vec::new();
    for (i, (line, record)) in csv::records(&req.file, delimiter).into_iter().enumerate() {
        if i == 0 && req.mapping.header {
            continue;
        }
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                errors.push(format!("Line {line}: malformed CSV: {e}"));
                continue;
            }
        };
        // Every mapped column needs its cell (empty is fine, missing is not), and no cell may
        // go unmapped: a row of the wrong width is a shifted or truncated line.
        if record.len() != req.mapping.columns.len() {
            let (cells, columns) = (record.len(), req.mapping.columns.len());
            let which = if cells > columns { "but only" } else { "but" };
            errors.push(format!("Line {line}: {cells} cells {which} {columns} columns are mapped"));
            continue;
        }
        let mut row = ImportRow {
            line,
            name: String::new(),
            device_type: None,
            label: None,
            token: None,
            description: None,
            gateway: None,
            shared: Vec::new(),
            server: Vec::new(),
        };
        let mut ts_values = Vec::new();
        for (cell, col) in record.iter().zip(&req.mapping.columns) {
            let cell = cell.trim();
            if cell.is_empty() {
                continue;
            }
            let key = || col.key.clone().filter(|k| !k.is_empty());
            match col.column_type.as_str() {
                "NAME" => row.name = cell.to_owned(),
                "TYPE" => row.device_type = Some(cell.to_owned()),
                "LABEL" => row.label = Some(cell.to_owned()),
                "ACCESS_TOKEN" => row.token = Some(cell.to_owned()),
                "DESCRIPTION" => row.description = Some(cell.to_owned()),
                "IS_GATEWAY" => row.gateway = Some(cell.eq_ignore_ascii_case("true")),
                "SHARED_ATTRIBUTE" => row.shared.extend(key().map(|k| (k, csv::cell_value(cell)))),
                "SERVER_ATTRIBUTE" => row.server.extend(key().map(|k| (k, csv::cell_value(cell)))),
                _ => ts_values.extend(key().map(|k| (k, csv::cell_value(cell)))),
            }
        }
        if row.name.is_empty() {
            errors.push(format!("Line {line}: Device name should be specified!"));
            continue;
        }
        let checked = SaveDevice {
            tenant: None,
            profile: None,
            id: None,
            name: row.name.clone(),
            device_type: row.device_type.clone().unwrap_or_default(),
            label: row.label.clone(),
            token: row.token.clone(),
            additional_info: None,
        }
        .validate();
        if let Err(e) = checked {
            errors.push(format!("Line {line}: {e}"));
            continue;
        }
        if !ts_values.is_empty() {
            telemetry.push((row.name.clone(), ts_values));
        }
        rows.push(row);
    }
    let update = req.mapping.update;
    let tenant = st.stored_tenant(me.tenant);
    // The devices to tell their profile's OTA packages, if any profile has one.
    let names: Vec<String> = match gridlinks_platform::entities::ota::any_assigned(st)? {
        true => rows.iter().map(|r| r.name.clone()).collect(),
        false => Vec::new(),
    };
    let mut out = st.ingest.import(tenant, rows, update).await?;
    // A row's token taken by a device, or equal to a credential of another kind (the
    // writer's CredentialClash texts for a token begin so).
    let taken = gridlinks_storage::StoreError::TokenTaken.to_string();
    for _ in out.errors.iter().filter(|e| e.contains(&taken) || e.contains(": access token is ")) {
        st.guards.conflict(&me);
    }
    // TIMESERIES columns: one record per device at import time, submitted together so they
    // share group commits instead of paying one commit each.
    let now = Ts::now();
    let store = st.store.clone();
    let (batches, imported) = blocking(move || {
        let mut batches = Vec::with_capacity(telemetry.len());
        let mut imported = Vec::with_capacity(names.len());
        for name in names {
            imported.extend(store.device_by_name(tenant, &name)?.map(|d| d.id));
        }
        for (name, values) in telemetry {
            if let Some(d) = store.device_by_name(tenant, &name)? {
                batches.push((d.id, vec![TsRecord { ts: now, values }]));
            }
        }
        Ok((batches, imported))
    })
    .await?;
    gridlinks_platform::entities::ota::created(&p, imported).await?;
    let items = batches.into_iter().map(|(device, records)| Item::Telemetry { device, records }).collect();
    // A device deleted meanwhile has nothing to write to; any other failure fails the import.
    for r in st.ingest.submit(items).await {
        match r {
            Ok(()) | Err(IngestError::DeviceGone) => {}
            Err(e) => return Err(e.into()),
        }
    }
    out.errors.splice(0..0, errors);
    Ok(Json(json!({
        "created": out.created,
        "updated": out.updated,
        "errors": out.errors.len(),
        "errorsList": out.errors,
    })))
}

// ---- telemetry and attributes ---------------------------------------------------

/// The device named by an entity reference (type and id); other entity types are refused.
pub(crate) fn entity(entity_type: &str, id: &str) -> ApiResult<DeviceId> {
    model::entity_device_id(entity_type, id).map_err(entity_error)
}

/// The id the data of an entity reference (a device, an asset, a customer or a tenant) is
/// kept under, if the caller may see it and, for a `write`, change it (404 when there is
/// none or it is another tenant's, 403 as [`device_for`]). A customer's data is its tenant
/// administrators' to change and its users' to read; a tenant's, its administrators'.
async fn existing_device(st: &Core, me: &Caller, entity_type: &str, id: &str, write: bool) -> ApiResult<DeviceId> {
    match entity_type {
        "ASSET" => {
            let a = gridlinks_platform::entities::assets::get(st, me, uuid(id, "asset")?).await?;
            return Ok(DeviceId(a.id));
        }
        "CUSTOMER" => {
            let c = gridlinks_platform::entities::customers::get(st, me, uuid(id, "customer")?).await?;
            if write && me.authority != Authority::TenantAdmin {
                return Err(ApiError::forbidden());
            }
            return Ok(DeviceId(c.id));
        }
        "TENANT" => {
            let t = uuid(id, "tenant")?;
            if me.authority != Authority::TenantAdmin || t != me.tenant {
                let missing = || ApiError::not_found(format!("Tenant with id [{t}] is not found"));
                return Err(ApiError::hidden(me, t, missing));
            }
            return Ok(DeviceId(t));
        }
        _ => {}
    }
    let id = entity(entity_type, id)?;
    let store = st.store.clone();
    let missing = || ApiError::not_found("Device with requested id wasn't found!");
    let d = blocking(move || store.device(id)).await?.ok_or_else(missing)?;
    if !me.may_use(st.tenant_of(d.tenant), d.customer) {
        return Err(ApiError::hidden(me, st.tenant_of(d.tenant), missing));
    }
    Ok(id)
}

fn key_list(keys: Option<&str>) -> Option<Vec<String>> {
    keys.map(keys::parse)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TsParams {
    keys: Option<String>,
    start_ts: Option<i64>,
    end_ts: Option<i64>,
    interval: Option<i64>,
    interval_type: Option<String>,
    time_zone: Option<String>,
    limit: Option<i64>,
    agg: Option<String>,
    order_by: Option<String>,
    #[serde(default, deserialize_with = "lenient_bool")]
    use_strict_data_types: Option<bool>,
}

/// Most points per key one raw history query returns.
pub(crate) const MAX_LIMIT: i64 = 100_000;

/// `GET /api/plugins/telemetry/{entityType}/{id}/values/timeseries`: latest values, or
/// history when `startTs`/`endTs` are given.
pub async fn get_timeseries(
    User(me): User,
    State(st): St,
    Path((et, id)): Path<(String, String)>,
    Q(p): Q<TsParams>,
) -> ApiResult<Json<J>> {
    timeseries(st, &me, &et, &id, p).await
}

/// `GET …/values/timeseries/history` (ThingsBoard 4.x): history only, startTs/endTs required.
pub async fn get_timeseries_history(
    User(me): User,
    State(st): St,
    Path((et, id)): Path<(String, String)>,
    Q(p): Q<TsParams>,
) -> ApiResult<Json<J>> {
    if p.start_ts.is_none() || p.end_ts.is_none() {
        return Err(ApiError::bad_request("startTs and endTs are required"));
    }
    timeseries(st, &me, &et, &id, p).await
}

async fn timeseries(st: Arc<Core>, me: &Caller, et: &str, id: &str, p: TsParams) -> ApiResult<Json<J>> {
    let device = existing_device(&st, me, et, id, false).await?;
    let strict = p.use_strict_data_types.unwrap_or(false);
    let keys = key_list(p.keys.as_deref());
    let store = st.ts.clone();
    let (start, end) = match (p.start_ts, p.end_ts) {
        (None, None) => {
            let wanted = keys.clone();
            let latest = blocking(move || store.reads().latest(device, wanted.as_deref())).await?;
            let mut out = serde_json::Map::new();
            for (k, ts, v) in &latest {
                out.insert(k.clone(), json!([{"ts": ts.0, "value": model::ts_value(v, strict)}]));
            }
            // ThingsBoard answers a requested key without data with a null value at "now".
            for k in keys.iter().flatten() {
                out.entry(k.clone()).or_insert_with(|| json!([{"ts": Ts::now().0, "value": null}]));
            }
            return Ok(Json(J::Object(out)));
        }
        (Some(s), Some(e)) => (s, e),
        _ => return Err(ApiError::bad_request("startTs and endTs must be given together")),
    };
    let keys =
        keys.filter(|k| !k.is_empty()).ok_or_else(|| ApiError::bad_request("keys is required with startTs/endTs"))?;
    if end < start {
        return Err(ApiError::bad_request("endTs must not be before startTs"));
    }
    if let Some(t) = p.interval_type.as_deref().filter(|t| *t != "MILLISECONDS") {
        return Err(ApiError::bad_request(format!("intervalType {t} is not supported; use MILLISECONDS")));
    }
    let _ = p.time_zone; // only meaningful for calendar intervals, which are refused above
    let agg = match p.agg.as_deref().unwrap_or("NONE") {
        "NONE" => Agg::None,
        "MIN" => Agg::Min,
        "MAX" => Agg::Max,
        "AVG" => Agg::Avg,
        "SUM" => Agg::Sum,
        "COUNT" => Agg::Count,
        other => {
            return Err(ApiError::bad_request(format!("Invalid agg '{other}': use NONE, MIN, MAX, AVG, SUM or COUNT")))
        }
    };
    let interval = p.interval.unwrap_or(0);
    if interval < 0 {
        return Err(ApiError::bad_request("interval must not be negative"));
    }
    // As in ThingsBoard, interval 0 means raw data whatever `agg` says.
    let agg = if interval == 0 { Agg::None } else { agg };
    let order = match p.order_by.as_deref().unwrap_or("DESC") {
        "DESC" => Order::Desc,
        "ASC" => Order::Asc,
        other => return Err(ApiError::bad_request(format!("Invalid orderBy '{other}': use ASC or DESC"))),
    };
    let limit = p.limit.unwrap_or(100);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit must be between 1 and {MAX_LIMIT}")));
    }
    let q = HistoryQuery {
        keys,
        start: Ts(start),
        end: Ts(end),
        interval,
        agg,
        // ThingsBoard applies limit and order to raw queries only; intervals come oldest first.
        limit: if agg == Agg::None { limit as usize } else { usize::MAX },
        order: if agg == Agg::None { order } else { Order::Asc },
    };
    let series = blocking(move || store.reads().history(device, &q)).await?;
    Ok(Json(model::ts_map(series, strict)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// `GET …/keys/timeseries`.
pub async fn ts_keys(
    User(me): User,
    State(st): St,
    Path((et, id)): Path<(String, String)>,
    Q(_): Q<NoParams>,
) -> ApiResult<Json<J>> {
    let device = existing_device(&st, &me, &et, &id, false).await?;
    let store = st.ts.clone();
    Ok(Json(json!(blocking(move || store.reads().ts_keys(device)).await?)))
}

pub(crate) fn scope(s: &str) -> ApiResult<AttributeScope> {
    s.parse().map_err(ApiError::bad_request)
}

async fn attribute_keys(st: Arc<Core>, device: DeviceId, scope: Option<AttributeScope>) -> ApiResult<Json<J>> {
    let attrs = attributes::read(&st.store, device, scope, None).await?;
    Ok(Json(json!(attrs.into_iter().map(|a| a.key).collect::<Vec<_>>())))
}

/// `GET …/keys/attributes`.
pub async fn attr_keys(
    User(me): User,
    State(st): St,
    Path((et, id)): Path<(String, String)>,
    Q(_): Q<NoParams>,
) -> ApiResult<Json<J>> {
    let device = existing_device(&st, &me, &et, &id, false).await?;
    attribute_keys(st, device, None).await
}

/// `GET …/keys/attributes/{scope}`.
pub async fn attr_keys_scope(
    User(me): User,
    State(st): St,
    Path((et, id, sc)): Path<(String, String, String)>,
    Q(_): Q<NoParams>,
) -> ApiResult<Json<J>> {
    let sc = scope(&sc)?;
    let device = existing_device(&st, &me, &et, &id, false).await?;
    attribute_keys(st, device, Some(sc)).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysParam {
    keys: Option<String>,
}

async fn attribute_values(
    st: Arc<Core>,
    device: DeviceId,
    scope: Option<AttributeScope>,
    keys: Option<Vec<String>>,
) -> ApiResult<Json<J>> {
    let attrs = attributes::read(&st.store, device, scope, keys).await?;
    Ok(Json(model::attributes(attrs.iter().map(|a| (a.key.as_str(), a.last_update_ts, &a.value)))))
}

/// `GET …/values/attributes?keys=`.
pub async fn get_attributes(
    User(me): User,
    State(st): St,
    Path((et, id)): Path<(String, String)>,
    Q(p): Q<KeysParam>,
) -> ApiResult<Json<J>> {
    let device = existing_device(&st, &me, &et, &id, false).await?;
    attribute_values(st, device, None, key_list(p.keys.as_deref())).await
}

/// `GET …/values/attributes/{scope}?keys=`.
pub async fn get_attributes_scope(
    User(me): User,
    State(st): St,
    Path((et, id, sc)): Path<(String, String, String)>,
    Q(p): Q<KeysParam>,
) -> ApiResult<Json<J>> {
    let sc = scope(&sc)?;
    let device = existing_device(&st, &me, &et, &id, false).await?;
    attribute_values(st, device, Some(sc), key_list(p.keys.as_deref())).await
}

/// `POST …/attributes/{scope}` (SERVER_SCOPE or SHARED_SCOPE).
pub async fn post_attributes(
    User(me): User,
    State(p): State<Arc<Platform>>,
    Path((et, id, sc)): Path<(String, String, String)>,
    Q(_): Q<NoParams>,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    save_attributes(&p, &me, &et, &id, &sc, &body).await
}

/// `POST /api/plugins/telemetry/{deviceId}/{scope}`: ThingsBoard's older device-only form.
pub async fn post_device_attributes(
    User(me): User,
    State(p): State<Arc<Platform>>,
    Path((id, sc)): Path<(String, String)>,
    Q(_): Q<NoParams>,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    save_attributes(&p, &me, "DEVICE", &id, &sc, &body).await
}

/// Stores server or shared attributes; devices connected over MQTT and subscribed to
/// `v1/devices/me/attributes` get a shared change at once.
async fn save_attributes(
    p: &Platform,
    me: &Caller,
    et: &str,
    id: &str,
    sc: &str,
    body: &[u8],
) -> ApiResult<StatusCode> {
    let st = &p.core;
    let sc = scope(sc)?;
    if sc == AttributeScope::Client {
        return Err(ApiError::bad_request("Invalid scope: CLIENT_SCOPE"));
    }
    let device = existing_device(st, me, et, id, true).await?;
    let values = payload::parse_attributes(body, st.payload_limits(), false).map_err(payload_error)?;
    let pushed = (sc == AttributeScope::Shared).then(|| values.clone());
    let timeout = values.iter().find(|(k, _)| k == activity::INACTIVITY_TIMEOUT).map(|(_, v)| v.clone());
    let timeout = timeout.filter(|_| sc == AttributeScope::Server && et == "DEVICE");
    st.ingest.submit_one(Item::Attributes { device, scope: sc, values }).await?;
    if et == "CUSTOMER" || et == "TENANT" {
        st.alarms.owner_attributes_changed();
    }
    if let Some(t) = timeout {
        st.activity.timeout_changed(device, Some(&t));
    }
    if let Some(values) = pushed {
        p.devices.push_shared(device, &values);
    }
    Ok(StatusCode::OK)
}

/// `DELETE …/{scope}?keys=`: attribute delete; a device (or its gateway) following its
/// shared attributes is told `{"deleted":[…]}`.
pub async fn delete_attributes(
    User(me): User,
    State(p): State<Arc<Platform>>,
    Path((et, id, sc)): Path<(String, String, String)>,
    Q(q): Q<KeysParam>,
) -> ApiResult<StatusCode> {
    remove_attributes(&p, &me, &et, &id, &sc, q).await
}

/// `DELETE /api/plugins/telemetry/{deviceId}/{scope}?keys=`: ThingsBoard's older device-only form.
pub async fn delete_device_attributes(
    User(me): User,
    State(p): State<Arc<Platform>>,
    Path((id, sc)): Path<(String, String)>,
    Q(q): Q<KeysParam>,
) -> ApiResult<StatusCode> {
    remove_attributes(&p, &me, "DEVICE", &id, &sc, q).await
}

async fn remove_attributes(
    p: &Platform,
    me: &Caller,
    et: &str,
    id: &str,
    sc: &str,
    q: KeysParam,
) -> ApiResult<StatusCode> {
    let sc = scope(sc)?;
    let device = existing_device(&p.core, me, et, id, true).await?;
    let keys =
        key_list(q.keys.as_deref()).filter(|k| !k.is_empty()).ok_or_else(|| ApiError::bad_request("Empty keys: []"))?;
    let pushed = (sc == AttributeScope::Shared).then(|| keys.clone());
    let timeout =
        sc == AttributeScope::Server && et == "DEVICE" && keys.iter().any(|k| k == activity::INACTIVITY_TIMEOUT);
    p.core.ingest.submit_one(Item::DeleteAttributes { device, scope: sc, keys }).await?;
    if et == "CUSTOMER" || et == "TENANT" {
        p.core.alarms.owner_attributes_changed();
    }
    if timeout {
        p.core.activity.timeout_changed(device, None);
    }
    if let Some(keys) = pushed {
        p.devices.push_deleted(device, &keys);
    }
    Ok(StatusCode::OK)
}

/// `POST …/timeseries/{scope}`: telemetry through the REST API (scope is ignored, as in ThingsBoard).
pub async fn post_timeseries(
    User(me): User,
    State(st): St,
    Path((et, id, _scope)): Path<(String, String, String)>,
    Q(_): Q<NoParams>,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let device = existing_device(&st, &me, &et, &id, true).await?;
    let records = payload::parse_telemetry(&body, Ts::now(), st.payload_limits()).map_err(payload_error)?;
    st.ingest.submit_one(Item::Telemetry { device, records }).await?;
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeleteParams {
    keys: Option<String>,
    #[serde(default, deserialize_with = "lenient_bool")]
    delete_all_data_for_keys: Option<bool>,
    start_ts: Option<i64>,
    end_ts: Option<i64>,
    #[serde(default, deserialize_with = "lenient_bool")]
    delete_latest: Option<bool>,
    #[serde(default, deserialize_with = "lenient_bool")]
    rewrite_latest_if_deleted: Option<bool>,
}

/// `DELETE …/timeseries/delete`.
pub async fn delete_timeseries(
    User(me): User,
    State(st): St,
    Path((et, id)): Path<(String, String)>,
    Q(p): Q<DeleteParams>,
) -> ApiResult<StatusCode> {
    let device = existing_device(&st, &me, &et, &id, true).await?;
    let keys =
        key_list(p.keys.as_deref()).filter(|k| !k.is_empty()).ok_or_else(|| ApiError::bad_request("Empty keys: []"))?;
    let range = if p.delete_all_data_for_keys.unwrap_or(false) {
        None
    } else {
        match (p.start_ts, p.end_ts) {
            (Some(s), Some(e)) if s <= e => Some((Ts(s), Ts(e))),
            (Some(_), Some(_)) => return Err(ApiError::bad_request("endTs must not be before startTs")),
            _ => {
                return Err(ApiError::bad_request(
                    "When deleteAllDataForKeys is false, start and end timestamp values shouldn't be empty",
                ))
            }
        }
    };
    st.ts
        .delete(DeleteTelemetry {
            device,
            keys,
            range,
            delete_latest: p.delete_latest.unwrap_or(true),
            rewrite_latest: p.rewrite_latest_if_deleted.unwrap_or(false),
        })
        .await?;
    Ok(StatusCode::OK)
}

/// Fallback for unknown paths: a ThingsBoard-shaped 404.
pub async fn not_found() -> Response {
    ApiError::not_found("No such API path").into_response()
}
