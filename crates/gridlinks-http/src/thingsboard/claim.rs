//! Device claiming, as ThingsBoard does it. A device opens a claim with a secret for a
//! while (MQTT `v1/devices/me/claim`, HTTP and CoAP `POST /api/v1/{token}/claim`, body
//! `{"secretKey","durationMs"}`); a customer user who knows the device's name and the secret
//! then claims it (`POST /api/customer/device/{deviceName}/claim` `{"secretKey"}`), which
//! assigns the device to the user's customer. `DELETE` on the same path gives it back.
//!
//! Open claims are kept in memory, as ThingsBoard keeps them in its cache: a restart
//! closes them, and the device claims again. A wrong secret closes the claim too, so a
//! secret cannot be guessed by trying.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value as J};

use super::api::device_json;
use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use gridlinks_platform::entities::devices::{self, Claimed};
use gridlinks_platform::Core;
use gridlinks_thingsboard::payload::parse_claim;

fn result(status: StatusCode, device: J, response: &str) -> Response {
    (status, Json(json!({"device": device, "response": response}))).into_response()
}

/// `POST /api/customer/device/{deviceName}/claim` `{"secretKey"}` (a customer user): 200
/// `{"device", "response": "SUCCESS"}` and the device is the customer's; 400 `FAILURE` (no
/// open claim, expired, or a wrong secret) or `CLAIMED` (it has a customer already).
pub async fn claim(
    User(me): User,
    State(st): State<Arc<Core>>,
    Path(name): Path<String>,
    Body(body): Body,
) -> ApiResult<Response> {
    let secret = parse_claim(&body).map_err(|e| ApiError::bad_request(e.to_string()))?.secret_key;
    Ok(match devices::claim(&st, &me, name, &secret).await? {
        Claimed::Yes(d) => result(StatusCode::OK, device_json(&st, &d), "SUCCESS"),
        Claimed::Already => result(StatusCode::BAD_REQUEST, J::Null, "CLAIMED"),
        Claimed::Refused => result(StatusCode::BAD_REQUEST, J::Null, "FAILURE"),
    })
}

/// `DELETE /api/customer/device/{deviceName}/claim` (a customer user: its customer's device;
/// a tenant administrator: any of its tenant's): the device goes back to the tenant.
pub async fn reclaim(User(me): User, State(st): State<Arc<Core>>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    devices::reclaim(&st, &me, name).await?;
    Ok(StatusCode::OK)
}
