//! ThingsBoard's entity data query over REST: `POST /api/entitiesQuery/find` answers a
//! page of entities (devices, assets, customers) with the entity fields and latest values
//! asked for, `POST /api/entitiesQuery/count` how many a query selects. The query is the
//! WebSocket API's `ENTITY_DATA` query ([`gridlinks_thingsboard::ws::parse_query`]) and is
//! answered by the same selection, so both see the same entities.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use gridlinks_platform::Core;
use gridlinks_thingsboard::{model, ws as proto};
use serde_json::Value as J;

use super::api::{blocking, parse_json};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use crate::ws::entity;

type St = State<Arc<Core>>;

fn refused((code, why): crate::ws::Refusal) -> ApiError {
    match code {
        proto::code::BAD_REQUEST => ApiError::bad_request(why),
        _ => ApiError::internal(why),
    }
}

/// `POST /api/entitiesQuery/find`: ThingsBoard's `PageData<EntityData>`.
pub async fn find(User(me): User, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let q = proto::parse_query(parse_json(&body)?).map_err(ApiError::bad_request)?;
    let core = (*st).clone();
    let found = blocking(move || {
        Ok(entity::select(&core, &me, &q).and_then(|(total, page)| {
            let mut keys = q.entity_fields.clone();
            keys.extend(q.latest_values.iter().cloned());
            let rows = page.iter().map(|e| entity::row(&core, e, &keys)).collect::<Result<Vec<_>, _>>()?;
            Ok(model::page(rows, total, q.page_size, q.page))
        }))
    })
    .await?;
    found.map(Json).map_err(refused)
}

/// `POST /api/entitiesQuery/count`: how many entities the query selects.
pub async fn count(User(me): User, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let mut q: J = parse_json(&body)?;
    // A count query has no page: count them all.
    if let Some(o) = q.as_object_mut() {
        o.insert("pageLink".into(), serde_json::json!({"pageSize": 1, "page": 0}));
    }
    let q = proto::parse_query(q).map_err(ApiError::bad_request)?;
    let core = (*st).clone();
    let total = blocking(move || Ok(entity::select(&core, &me, &q).map(|(total, _)| total))).await?;
    total.map(|n| Json(J::from(n))).map_err(refused)
}
