//! Tenant profiles, as ThingsBoard serves them to the system administrator:
//! `POST /api/tenantProfile`, `GET`/`DELETE /api/tenantProfile/{id}`,
//! `POST /api/tenantProfile/{id}/default`, `GET /api/tenantProfileInfo/{id}`,
//! `GET /api/tenantProfileInfo/default`, `GET /api/tenantProfiles`, `GET /api/tenantProfileInfos`,
//! `GET /api/tenantProfiles/list?ids=`.
//! A profile's `profileData.configuration` holds the limits of the tenants that have it
//! (`gridlinks_platform::limits`); a tenant without `tenantProfileId` has the default
//! profile. The default profile, and a profile a tenant has, cannot be deleted.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_platform::limits::{self, TenantLimits};
use gridlinks_platform::Core;
use gridlinks_storage::{DocKind, DocRecord, WriteOp, WriteOutcome};
use gridlinks_thingsboard::model::entity_id;
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::api::{blocking, body_id, parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, SysAdmin, Q};
use super::paging::{doc_page, DocListParams};

type St = State<Arc<Core>>;

/// ThingsBoard's `TenantProfile` JSON.
fn render(d: &DocRecord) -> J {
    let mut out = d.doc.clone();
    if let Some(o) = out.as_object_mut() {
        o.insert("id".into(), entity_id("TENANT_PROFILE", d.id));
        o.insert("createdTime".into(), d.created_time.into());
        o.insert("name".into(), d.title.clone().into());
        o.entry("default").or_insert(false.into());
        o.entry("isolatedTbRuleEngine").or_insert(false.into());
        o.entry("description").or_insert(J::Null);
    }
    out
}

/// ThingsBoard's `EntityInfo` of a profile.
fn info(d: &DocRecord) -> J {
    json!({"id": entity_id("TENANT_PROFILE", d.id), "name": d.title})
}

fn is_default(d: &DocRecord) -> bool {
    d.doc.get("default").and_then(J::as_bool) == Some(true)
}

/// A tenant profile (404 when there is none).
pub(crate) async fn load(st: &Core, id: Uuid) -> ApiResult<DocRecord> {
    let store = st.store.clone();
    blocking(move || store.doc(DocKind::TenantProfile, id))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("Tenant profile with id [{id}] is not found")))
}

/// The profile a tenant's `tenantProfileId` names, checked to exist; none: the default.
pub(crate) async fn chosen(st: &Core, body: &J) -> ApiResult<Uuid> {
    match body.get("tenantProfileId").filter(|v| !v.is_null()) {
        Some(v) => {
            let id = v.get("id").and_then(J::as_str).ok_or_else(|| {
                ApiError::bad_request("tenantProfileId must be {\"entityType\":\"TENANT_PROFILE\",\"id\":\"…\"}")
            })?;
            Ok(load(st, uuid(id, "tenant profile")?).await?.id)
        }
        None => default_profile(st).await.map(|d| d.id),
    }
}

async fn default_profile(st: &Core) -> ApiResult<DocRecord> {
    let store = st.store.clone();
    blocking(move || store.docs(DocKind::TenantProfile))
        .await?
        .into_iter()
        .find(is_default)
        .ok_or_else(|| ApiError::not_found("There is no default tenant profile"))
}

/// Reads every tenant's limits again after a change.
pub(crate) async fn reload(st: &Core) -> ApiResult<()> {
    let limits = st.limits.clone();
    blocking(move || limits.reload()).await
}

async fn save_doc(st: &Core, id: Option<Uuid>, title: String, doc: J) -> ApiResult<DocRecord> {
    match st.writer.submit(WriteOp::SaveDoc { kind: DocKind::TenantProfile, id, title, doc }).await? {
        WriteOutcome::Doc(d) => Ok(d),
        _ => Err(ApiError::internal("unexpected write outcome")),
    }
}

/// `POST /api/tenantProfile`: create, or update when the body has an id. Every limit is
/// checked (a rate limit must read `"count:seconds,…"`); the `default` flag is changed
/// only by `POST /api/tenantProfile/{id}/default`.
pub async fn save(_: SysAdmin, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let mut doc: J = parse_json(&body)?;
    let name = doc.get("name").and_then(J::as_str).unwrap_or_default().trim().to_owned();
    if name.is_empty() {
        return Err(ApiError::bad_request("Tenant profile name should be specified!"));
    }
    TenantLimits::from_profile(&name, &doc).map_err(|e| ApiError::bad_request(format!("Invalid limit {e}")))?;
    let id = body_id(&doc, |s| uuid(s, "tenant profile"))?;
    let was_default = match id {
        Some(id) => is_default(&load(&st, id).await?),
        None => false,
    };
    if let Some(o) = doc.as_object_mut() {
        for k in ["id", "createdTime", "name", "tenantId"] {
            o.remove(k);
        }
        o.insert("default".into(), was_default.into());
        let data = o.entry("profileData").or_insert_with(|| json!({}));
        if let Some(data) = data.as_object_mut() {
            let cfg = data.entry("configuration").or_insert_with(|| json!({}));
            if let Some(cfg) = cfg.as_object_mut() {
                cfg.entry("type").or_insert_with(|| "DEFAULT".into());
            }
        }
    }
    let d = save_doc(&st, id, name, doc).await?;
    reload(&st).await?;
    Ok(Json(render(&d)))
}

/// `GET /api/tenantProfile/{id}`.
pub async fn get(_: SysAdmin, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    Ok(Json(render(&load(&st, uuid(&id, "tenant profile")?).await?)))
}

/// `GET /api/tenantProfileInfo/{id}`: its id and name.
pub async fn get_info(_: SysAdmin, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    Ok(Json(info(&load(&st, uuid(&id, "tenant profile")?).await?)))
}

/// `GET /api/tenantProfileInfo/default`.
pub async fn default_info(_: SysAdmin, State(st): St) -> ApiResult<Json<J>> {
    Ok(Json(info(&default_profile(&st).await?)))
}

/// `GET /api/tenantProfiles?pageSize=&page=`.
pub async fn list(_: SysAdmin, State(st): St, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    Ok(Json(doc_page(&st, DocKind::TenantProfile, p, |_| true, render).await?))
}

/// `GET /api/tenantProfileInfos?pageSize=&page=`.
pub async fn list_infos(_: SysAdmin, State(st): St, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    Ok(Json(doc_page(&st, DocKind::TenantProfile, p, |_| true, info).await?))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ids {
    ids: String,
}

/// `GET /api/tenantProfiles/list?ids=a,b`: those that exist, in the order asked.
pub async fn by_ids(_: SysAdmin, State(st): St, Q(p): Q<Ids>) -> ApiResult<Json<J>> {
    let mut out = Vec::new();
    for id in super::lookups::ids(&p.ids, "tenant profile")? {
        if let Ok(d) = load(&st, id).await {
            out.push(render(&d));
        }
    }
    Ok(Json(J::Array(out)))
}

/// `POST /api/tenantProfile/{id}/default`: this profile becomes the default (of every
/// tenant that names none), the previous default stops being it.
pub async fn set_default(_: SysAdmin, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let mut d = load(&st, uuid(&id, "tenant profile")?).await?;
    if !is_default(&d) {
        let old = default_profile(&st).await.ok();
        d.doc["default"] = true.into();
        d = save_doc(&st, Some(d.id), d.title.clone(), d.doc.clone()).await?;
        if let Some(mut old) = old {
            old.doc["default"] = false.into();
            save_doc(&st, Some(old.id), old.title.clone(), old.doc.clone()).await?;
        }
        reload(&st).await?;
    }
    Ok(Json(render(&d)))
}

/// `DELETE /api/tenantProfile/{id}`: not the default, nor one a tenant has.
pub async fn delete(_: SysAdmin, State(st): St, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let d = load(&st, uuid(&id, "tenant profile")?).await?;
    if is_default(&d) {
        return Err(ApiError::bad_request("Deletion of Default Tenant Profile is prohibited!"));
    }
    let store = st.store.clone();
    let tenants = blocking(move || store.docs(DocKind::Tenant)).await?;
    if tenants.iter().any(|t| limits::profile_of(&t.doc) == Some(d.id)) {
        return Err(ApiError::bad_request("The tenant profile referenced by the tenants cannot be deleted!"));
    }
    st.writer.submit(WriteOp::DeleteDoc(DocKind::TenantProfile, d.id)).await?;
    reload(&st).await?;
    Ok(StatusCode::OK)
}
