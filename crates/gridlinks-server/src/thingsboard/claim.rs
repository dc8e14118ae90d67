//! Device claiming, as ThingsBoard does it. A device opens a claim with a secret for a
//! while (MQTT `v1/devices/me/claim`, HTTP and CoAP `POST /api/v1/{token}/claim`, body
//! `{"secretKey","durationMs"}`); a customer user who knows the device's name and the secret
//! then claims it (`POST /api/customer/device/{deviceName}/claim` `{"secretKey"}`), which
//! assigns the device to the user's customer. `DELETE` on the same path gives it back.
//!
//! Open claims are kept in memory, as ThingsBoard keeps them in its cache: a restart
//! closes them, and the device claims again. A wrong secret closes the claim too, so a
//! secret cannot be guessed by trying.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gridlinks_storage::{StoreError, WriteOp, WriteOutcome};
use gridlinks_thingsboard::payload::{parse_claim, ClaimRequest};
use gridlinks_types::{DeviceId, Ts};
use parking_lot::Mutex;
use serde_json::{json, Value as J};

use super::api::{blocking, device_json};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use crate::app::Core;
use crate::auth::{Authority, Caller};

/// How long a claim stays open when the device does not say, ms (ThingsBoard: one day).
pub const DEFAULT_DURATION_MS: u64 = 24 * 3600 * 1000;

struct Open {
    secret: String,
    /// Ms since epoch.
    expires: i64,
}

/// The open claims, one per device at most.
#[derive(Default)]
pub struct Claims {
    open: Mutex<HashMap<DeviceId, Open>>,
}

/// What a claim attempt found.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// The claim was open and the secret right: it is closed now.
    Yes,
    /// The claim was open but expired, or the secret wrong: it is closed now.
    Refused,
    /// No claim was open.
    NotOpen,
}

impl Claims {
    /// Opens (or replaces) `device`'s claim at `now` (ms).
    pub fn open(&self, device: DeviceId, req: ClaimRequest, now: i64) {
        let duration = req.duration_ms.unwrap_or(DEFAULT_DURATION_MS);
        let expires = now.saturating_add(i64::try_from(duration).unwrap_or(i64::MAX));
        let mut open = self.open.lock();
        // Claims of deleted or silent devices go once expired.
        if open.len() >= 1024 && open.len().is_power_of_two() {
            open.retain(|_, o| o.expires > now);
        }
        open.insert(device, Open { secret: req.secret_key, expires });
    }

    /// Takes `device`'s claim with `secret` at `now`: whatever the outcome, it is closed.
    pub fn take(&self, device: DeviceId, secret: &str, now: i64) -> Taken {
        let Some(o) = self.open.lock().remove(&device) else { return Taken::NotOpen };
        let same = o.secret.len() == secret.len()
            && o.secret.bytes().zip(secret.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if same && now < o.expires {
            Taken::Yes
        } else {
            Taken::Refused
        }
    }
}

/// A device's claiming request from any transport: opens the claim.
pub fn open_from_device(
    core: &Core,
    device: DeviceId,
    body: &[u8],
) -> Result<(), gridlinks_thingsboard::payload::PayloadError> {
    core.claims.open(device, parse_claim(body)?, Ts::now().0);
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn req(secret: &str, duration_ms: Option<u64>) -> ClaimRequest {
        ClaimRequest { secret_key: secret.into(), duration_ms }
    }

    #[test]
    fn a_claim_is_taken_once_with_its_secret_before_it_expires() {
        let claims = Claims::default();
        let d = DeviceId(uuid::Uuid::new_v4());
        assert_eq!(claims.take(d, "", 0), Taken::NotOpen);
        claims.open(d, req("s3", Some(100)), 1_000);
        assert_eq!(claims.take(d, "s3", 1_050), Taken::Yes);
        assert_eq!(claims.take(d, "s3", 1_050), Taken::NotOpen, "taken once");
        claims.open(d, req("s3", Some(100)), 1_000);
        assert_eq!(claims.take(d, "s4", 1_050), Taken::Refused);
        assert_eq!(claims.take(d, "s3", 1_050), Taken::NotOpen, "a wrong secret closes it");
        claims.open(d, req("s3", Some(100)), 1_000);
        assert_eq!(claims.take(d, "s3", 1_100), Taken::Refused, "expired at its time");
        claims.open(d, req("", None), 1_000);
        assert_eq!(claims.take(d, "", 1_000 + DEFAULT_DURATION_MS as i64 - 1), Taken::Yes, "no secret: empty");
    }
}
