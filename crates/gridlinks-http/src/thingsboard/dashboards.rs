//! Dashboards, stored as documents: `POST /api/dashboard`, `GET /api/dashboard/{id}`,
//! `GET /api/dashboard/info/{id}`, `DELETE /api/dashboard/{id}` and
//! `GET /api/tenant/dashboards`. GridLinks keeps a dashboard's configuration as given and
//! serves it back; it renders none.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_storage::{DocKind, DocRecord};
use gridlinks_thingsboard::model;
use serde_json::Value as J;
use uuid::Uuid;

use super::api::{blocking, body_id, parse_json, uuid};
use super::error::ApiResult;
use super::extract::{Admin, Body, User, Q};
use super::paging::{doc_page, DocListParams};

use gridlinks_platform::entities::dashboards;
use gridlinks_platform::Core;

type St = State<Arc<Core>>;

/// A dashboard's JSON: with its configuration (`full`) or its info; the customers it is
/// assigned to named from `customers`.
pub(crate) fn render(st: &Core, d: &DocRecord, customers: &[DocRecord], full: bool) -> J {
    let named: Vec<(Uuid, &str)> = dashboards::assigned_customers(d)
        .into_iter()
        .filter_map(|id| customers.iter().find(|c| c.id == id).map(|c| (c.id, c.title.as_str())))
        .collect();
    let view =
        model::Dashboard { id: d.id, created_time: d.created_time, title: &d.title, doc: &d.doc, customers: &named };
    match full {
        true => model::dashboard(&view, st.doc_tenant(d)),
        false => model::dashboard_info(&view, st.doc_tenant(d)),
    }
}

pub(crate) async fn customers(st: &Core) -> ApiResult<Vec<DocRecord>> {
    let store = st.store.clone();
    blocking(move || store.docs(DocKind::Customer)).await
}

/// `POST /api/dashboard`: create, or update when the body has an id.
pub async fn save(Admin(me): Admin, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let doc: J = parse_json(&body)?;
    let title = doc.get("title").and_then(J::as_str).unwrap_or_default().to_owned();
    let id = body_id(&doc, |s| uuid(s, "dashboard"))?;
    let d = dashboards::save(&st, &me, id, title, doc).await?;
    Ok(Json(render(&st, &d, &customers(&st).await?, true)))
}

/// `GET /api/dashboard/{id}`: with its configuration.
pub async fn get(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let d = dashboards::get(&st, &me, uuid(&id, "dashboard")?).await?;
    Ok(Json(render(&st, &d, &customers(&st).await?, true)))
}

/// `GET /api/dashboard/info/{id}`: without it.
pub async fn info(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let d = dashboards::get(&st, &me, uuid(&id, "dashboard")?).await?;
    Ok(Json(render(&st, &d, &customers(&st).await?, false)))
}

/// `DELETE /api/dashboard/{id}`.
pub async fn delete(Admin(me): Admin, State(st): St, Path(id): Path<String>) -> ApiResult<StatusCode> {
    dashboards::delete(&st, &me, uuid(&id, "dashboard")?).await?;
    Ok(StatusCode::OK)
}

/// `GET /api/tenant/dashboards?pageSize=&page=[&textSearch=&sortProperty=&sortOrder=&mobile=]`:
/// dashboard infos; `textSearch` matches the title; sort by `title` (default) or `createdTime`.
pub async fn list(Admin(me): Admin, State(st): St, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    let customers = customers(&st).await?;
    let mine = |d: &DocRecord| st.doc_tenant(d) == me.tenant;
    Ok(Json(doc_page(&st, DocKind::Dashboard, p, mine, |d| render(&st, d, &customers, false)).await?))
}
