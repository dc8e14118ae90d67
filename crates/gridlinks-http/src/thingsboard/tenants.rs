//! Tenants, as ThingsBoard serves them to the system administrator: `POST /api/tenant`,
//! `GET`/`DELETE /api/tenant/{id}`, `GET /api/tenants`; a tenant administrator may read its
//! own tenant. Tenants are stored as documents; the first tenant (whose id the data
//! directory keeps, and to which everything stored without a tenant belongs) is written at
//! start-up and cannot be deleted. Deleting another deletes everything of it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_storage::{DocKind, DocRecord, SaveProfile, WriteOp, WriteOutcome, DEFAULT_PROFILE};
use gridlinks_thingsboard::model::entity_id;
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::api::{blocking, body_id, parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, SysAdmin, User, Q};
use super::paging::{doc_page, DocListParams};
use super::tenant_profiles;
use gridlinks_platform::auth::{Auth, Authority};
use gridlinks_platform::limits;
use gridlinks_platform::Core;
use gridlinks_platform::Platform;

type St = State<Arc<Core>>;

/// ThingsBoard's `Tenant` JSON (with no `tenantProfileId` stored: the default profile's,
/// `default`).
fn render_with(d: &DocRecord, default: Uuid) -> J {
    let mut out = d.doc.clone();
    if let Some(o) = out.as_object_mut() {
        o.insert("id".into(), entity_id("TENANT", d.id));
        o.insert("createdTime".into(), d.created_time.into());
        o.insert("title".into(), d.title.clone().into());
        o.insert("name".into(), d.title.clone().into());
        let profile = limits::profile_of(&d.doc).unwrap_or(default);
        o.insert("tenantProfileId".into(), entity_id("TENANT_PROFILE", profile));
        o.entry("additionalInfo").or_insert_with(|| json!({}));
    }
    out
}

/// A tenant (404 when there is none).
pub(crate) async fn load(st: &Core, id: Uuid) -> ApiResult<DocRecord> {
    let store = st.store.clone();
    blocking(move || store.doc(DocKind::Tenant, id))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("Tenant with id [{id}] is not found")))
}

/// `POST /api/tenant`: create, or update when the body has an id.
pub async fn save(_: SysAdmin, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let mut doc: J = parse_json(&body)?;
    let title = doc.get("title").and_then(J::as_str).unwrap_or_default().to_owned();
    if title.trim().is_empty() {
        return Err(ApiError::bad_request("Tenant title should be specified!"));
    }
    let id = body_id(&doc, |s| uuid(s, "tenant"))?;
    let profile = tenant_profiles::chosen(&st, &doc).await?;
    if let Some(o) = doc.as_object_mut() {
        for k in ["id", "createdTime", "title", "name", "tenantId"] {
            o.remove(k);
        }
        o.insert("tenantProfileId".into(), entity_id("TENANT_PROFILE", profile));
    }
    let d = match st.writer.submit(WriteOp::SaveDoc { kind: DocKind::Tenant, id, title, doc }).await? {
        WriteOutcome::Doc(d) => d,
        _ => return Err(ApiError::internal("unexpected write outcome")),
    };
    if id.is_none() {
        // A new tenant starts with its default device profile, as in ThingsBoard.
        let doc = json!({"type": "DEFAULT", "transportType": "DEFAULT", "provisionType": "DISABLED"});
        let profile = SaveProfile { id: None, tenant: Some(d.id), name: DEFAULT_PROFILE.into(), doc };
        st.writer.submit(WriteOp::SaveProfile(profile)).await?;
    }
    tenant_profiles::reload(&st).await?;
    Ok(Json(render_with(&d, profile)))
}

/// `GET /api/tenant/{id}`: the system administrator any; a tenant administrator its own.
pub async fn get(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let id = uuid(&id, "tenant")?;
    match me.authority {
        Authority::SysAdmin => {}
        Authority::TenantAdmin if me.tenant == id => {}
        _ => return Err(ApiError::forbidden()),
    }
    Ok(Json(render_with(&load(&st, id).await?, tenant_profiles::chosen(&st, &J::Null).await?)))
}

/// `GET /api/tenants?pageSize=&page=`: by title.
pub async fn list(_: SysAdmin, State(st): St, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    let default = tenant_profiles::chosen(&st, &J::Null).await?;
    Ok(Json(doc_page(&st, DocKind::Tenant, p, |_| true, |d| render_with(d, default)).await?))
}

/// `DELETE /api/tenant/{id}`: the tenant with its devices (and their data), profiles,
/// customers, dashboards, users, API keys and MQTT clients. Its users' tokens, its devices'
/// and MQTT clients' connections end at once. The first tenant cannot be deleted.
pub async fn delete(
    _: SysAdmin,
    State(p): State<Arc<Platform>>,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let st = &p.core;
    let id = load(st, uuid(&id, "tenant")?).await?.id;
    if id == st.tenant_id {
        return Err(ApiError::bad_request(
            "The first tenant, which has everything stored before tenants, cannot be deleted",
        ));
    }
    let store = st.store.clone();
    let devices: Vec<_> =
        blocking(move || store.devices()).await?.into_iter().filter(|d| d.tenant == Some(id)).map(|d| d.id).collect();
    let usernames = p.clients.of_tenant(Some(id))?.into_iter().map(|c| c.username).collect();
    p.clients.delete(&p.core.writer, usernames).await?;
    st.writer.submit(WriteOp::DeleteTenant(id)).await?;
    auth.users.remove_tenant(id);
    tenant_profiles::reload(st).await?;
    for d in devices {
        p.devices.close(d);
    }
    Ok(StatusCode::OK)
}
