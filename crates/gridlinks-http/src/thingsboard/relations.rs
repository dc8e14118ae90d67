//! ThingsBoard's relation API, for the one relation GridLinks keeps: "Created", from a
//! gateway to the devices it may write to over the gateway API. A gateway gets it when it
//! creates a device; an administrator adds or removes it here.
//!
//! | call | meaning |
//! |---|---|
//! | `POST /api/relation` `{"from":{gateway},"to":{device},"type":"Created"}` | assign the device to the gateway |
//! | `DELETE /api/relation?fromId=&fromType=DEVICE&relationType=Created&toId=&toType=DEVICE` | unassign it |
//! | `GET /api/relations?fromId=&fromType=DEVICE` / `?toId=&toType=DEVICE` | a gateway's devices / a device's gateway |

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gridlinks_types::DeviceId;
use serde::Deserialize;
use serde_json::{json, Value as J};
use std::sync::Arc;

use super::api::parse_json;
use super::error::{ApiError, ApiResult};
use super::extract::{Admin, Body, Q};
use gridlinks_platform::entities::devices;
use gridlinks_platform::Core;
use gridlinks_thingsboard::model::{relation, EntityId, CREATED};

type St = State<Arc<Core>>;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RelationBody {
    from: EntityId,
    to: EntityId,
    #[serde(rename = "type")]
    relation_type: String,
}

fn device_ref(e: &EntityId) -> ApiResult<DeviceId> {
    super::api::entity(&e.entity_type, &e.id)
}

fn created_only(relation_type: &str) -> ApiResult<()> {
    if relation_type == CREATED {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "relation type '{relation_type}' is not supported: GridLinks keeps one relation, 'Created' from a gateway to its devices"
        )))
    }
}

/// `POST /api/relation`: assigns `to` to gateway `from`.
pub async fn save(Admin(me): Admin, State(st): St, Body(body): Body) -> ApiResult<StatusCode> {
    let r: RelationBody = parse_json(&body)?;
    created_only(&r.relation_type)?;
    devices::relate_gateway(&st, &me, device_ref(&r.from)?, device_ref(&r.to)?).await?;
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelationParams {
    from_id: Option<String>,
    from_type: Option<String>,
    relation_type: Option<String>,
    relation_type_group: Option<String>,
    to_id: Option<String>,
    to_type: Option<String>,
}

fn param_ref(id: Option<String>, entity_type: Option<String>) -> ApiResult<Option<DeviceId>> {
    id.map(|id| super::api::entity(entity_type.as_deref().unwrap_or("DEVICE"), &id)).transpose()
}

/// `DELETE /api/relation?fromId=&fromType=&relationType=Created&toId=&toType=`.
pub async fn delete(Admin(me): Admin, State(st): St, Q(p): Q<RelationParams>) -> ApiResult<StatusCode> {
    created_only(p.relation_type.as_deref().unwrap_or_default())?;
    let (Some(gateway), Some(device)) = (param_ref(p.from_id, p.from_type)?, param_ref(p.to_id, p.to_type)?) else {
        return Err(ApiError::bad_request("fromId and toId are required"));
    };
    devices::unrelate_gateway(&st, &me, gateway, device).await?;
    Ok(StatusCode::OK)
}

/// `GET /api/relations?fromId=&fromType=` (a gateway's devices) or `?toId=&toType=` (a
/// device's gateway).
pub async fn list(Admin(me): Admin, State(st): St, Q(p): Q<RelationParams>) -> ApiResult<Json<J>> {
    let _ = p.relation_type_group;
    if p.relation_type.as_deref().is_some_and(|t| t != CREATED) {
        return Ok(Json(json!([])));
    }
    match (param_ref(p.from_id, p.from_type)?, param_ref(p.to_id, p.to_type)?) {
        (Some(gateway), None) => {
            let of = devices::of_gateway(&st, &me, gateway).await?;
            Ok(Json(J::Array(of.into_iter().map(|d| relation(gateway, d)).collect())))
        }
        (None, Some(device)) => {
            let gateway = devices::get(&st, &me, device).await?.gateway;
            Ok(Json(J::Array(gateway.map(|g| relation(g, device)).into_iter().collect())))
        }
        _ => Err(ApiError::bad_request("give either fromId and fromType, or toId and toType")),
    }
}
