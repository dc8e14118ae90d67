//! Data forwarding's sinks (docs/forwarding.md). ThingsBoard forwards data with rule-chain
//! nodes (REST API call, Kafka, MQTT); GridLinks has sinks instead, a tenant
//! administrator's entities at `/api/forwarding/sink`. A sink's secrets (an HTTP sink's
//! signing `secret`, an MQTT sink's `password`) are write-only: shown as `secretSet` /
//! `passwordSet`, kept when an update leaves them out.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::Json;
use gridlinks_platform::Platform;
use serde_json::Value as J;

use super::api::{parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use super::paging::{page_link, page_of};

type St = State<Arc<Platform>>;

/// `POST /api/forwarding/sink`: create, or update the body's id.
pub async fn save(User(me): User, State(p): St, Body(body): Body) -> ApiResult<Json<J>> {
    let doc: J = parse_json(&body)?;
    Ok(Json(p.forwarding.save(&me, doc).await?))
}

/// `GET /api/forwarding/sink/{id}`: the sink and its delivery statistics.
pub async fn get(User(me): User, State(p): St, Path(id): Path<String>) -> ApiResult<Json<J>> {
    Ok(Json(p.forwarding.get(&me, uuid(&id, "DATA_SINK")?).await?))
}

/// `DELETE /api/forwarding/sink/{id}`.
pub async fn delete(User(me): User, State(p): St, Path(id): Path<String>) -> ApiResult<()> {
    p.forwarding.delete(&me, uuid(&id, "DATA_SINK")?).await?;
    Ok(())
}

/// `GET /api/forwarding/sinks?pageSize=&page=`: the tenant's sinks by name, as `PageData`.
pub async fn list(User(me): User, State(p): St, RawQuery(q): RawQuery) -> ApiResult<Json<J>> {
    let (mut size, mut page) = (None, 0);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        let n = || v.parse::<i64>().map_err(|_| ApiError::bad_request(format!("Invalid {k}: {v}")));
        match k.as_ref() {
            "pageSize" => size = Some(n()?),
            "page" => page = n()?,
            other => {
                return Err(ApiError::bad_request(format!("Invalid query parameters: unknown parameter '{other}'")))
            }
        }
    }
    let link = page_link(&p.core, size.ok_or_else(|| ApiError::bad_request("pageSize is required"))?, page)?;
    let all = p.forwarding.list(&me).await?;
    Ok(Json(page_of(&all, link, Clone::clone)))
}
