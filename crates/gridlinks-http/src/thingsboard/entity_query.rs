//! ThingsBoard's entity data query over REST: `POST /api/entitiesQuery/find` answers a
//! page of entities (devices, assets, customers) with the entity fields and latest values
//! asked for, `POST /api/entitiesQuery/count` how many a query selects. The query is the
//! WebSocket API's `ENTITY_DATA` query ([`gridlinks_thingsboard::ws::parse_query`]) and is
//! answered by the same selection, so both see the same entities. `POST
//! /api/alarmsQuery/find` and `…/count` are the same for alarms (`ALARM_DATA`,
//! `ALARM_COUNT`).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use gridlinks_platform::auth::Auth;
use gridlinks_platform::Core;
use gridlinks_thingsboard::{model, ws as proto};
use gridlinks_types::Ts;
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

/// `POST /api/alarmsQuery/find`: ThingsBoard's `PageData<AlarmData>` for an
/// `AlarmDataQuery`.
pub async fn find_alarms(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let q = proto::parse_alarm_query(parse_json(&body)?, false).map_err(ApiError::bad_request)?;
    let core = (*st).clone();
    let found = blocking(move || {
        Ok(crate::ws::alarm::rows(&core, &auth, &me, &q, Ts::now().0)
            .map(|(rows, total, _)| model::page(rows, total, q.page_size, q.page)))
    })
    .await?;
    found.map(Json).map_err(refused)
}

/// `POST /api/alarmsQuery/count`: how many alarms an `AlarmCountQuery` selects.
pub async fn count_alarms(User(me): User, State(st): St, Body(body): Body) -> ApiResult<Json<J>> {
    let q = proto::parse_alarm_query(parse_json(&body)?, true).map_err(ApiError::bad_request)?;
    let core = (*st).clone();
    let n = blocking(move || Ok(crate::ws::alarm::count(&core, &me, &q, Ts::now().0))).await?;
    n.map(|n| Json(J::from(n))).map_err(refused)
}
