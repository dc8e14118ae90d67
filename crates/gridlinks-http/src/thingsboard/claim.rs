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
use gridlinks_storage::{StoreError, WriteOp, WriteOutcome};
use gridlinks_types::Ts;
use serde_json::{json, Value as J};

use super::api::{blocking, device_json};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use gridlinks_platform::auth::{Authority, Caller};
use gridlinks_platform::claims::Taken;
use gridlinks_platform::Core;
use gridlinks_thingsboard::payload::parse_claim;

fn customer_of(me: &Caller) -> ApiResult<uuid::Uuid> {
    match (me.authority, me.customer) {
        (Authority::CustomerUser, Some(c)) => Ok(c),
        _ => Err(ApiError::forbidden()),
    }
}

/// The device of the caller's tenant named `name`.
async fn device_named(st: &Core, me: &Caller, name: String) -> ApiResult<gridlinks_storage::DeviceRecord> {
    let store = st.store.clone();
    let tenant = st.stored_tenant(me.tenant);
    blocking(move || store.device_by_name(tenant, &name))
        .await?
        .ok_or_else(|| ApiError::not_found("Requested item wasn't found!"))
}

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
    let customer = customer_of(&me)?;
    let secret = parse_claim(&body).map_err(|e| ApiError::bad_request(e.to_string()))?.secret_key;
    let d = device_named(&st, &me, name).await?;
    let taken = st.claims.take(d.id, &secret, Ts::now().0);
    match (taken, d.customer) {
        (Taken::Yes, None) => {}
        (Taken::Yes | Taken::NotOpen, Some(_)) => return Ok(result(StatusCode::BAD_REQUEST, J::Null, "CLAIMED")),
        _ => return Ok(result(StatusCode::BAD_REQUEST, J::Null, "FAILURE")),
    }
    match st.writer.submit(WriteOp::AssignCustomer { device: d.id, customer: Some(customer) }).await {
        Ok(WriteOutcome::Device(d)) => Ok(result(StatusCode::OK, device_json(&st, &d), "SUCCESS")),
        Ok(_) => Err(ApiError::internal("unexpected write outcome")),
        Err(StoreError::DeviceNotFound) => Err(ApiError::not_found("Requested item wasn't found!")),
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /api/customer/device/{deviceName}/claim` (a customer user): its customer's
/// device goes back to the tenant.
pub async fn reclaim(User(me): User, State(st): State<Arc<Core>>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let customer = customer_of(&me)?;
    let d = device_named(&st, &me, name).await?;
    if d.customer != Some(customer) {
        return Err(ApiError::forbidden());
    }
    st.writer.submit(WriteOp::AssignCustomer { device: d.id, customer: None }).await?;
    Ok(StatusCode::OK)
}
