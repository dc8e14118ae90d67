//! Server-side RPC, as ThingsBoard serves it: `POST /api/plugins/rpc/{oneway|twoway}/{deviceId}`
//! (v1: timeout → 408, device not connected → 409) and `POST /api/rpc/{oneway|twoway}/{deviceId}`
//! (v2: timeout → 504, not connected → 409). The request is published to the device's
//! sessions subscribed to `v1/devices/me/rpc/request/+`; a two-way call waits for the device's
//! answer on `v1/devices/me/rpc/response/{id}`.
//!
//! With several nodes, a device may be connected to a node other than the one that took
//! the call. The call then goes on the Kafka bus (`gridlinks_kafka::bus`); the node holding
//! the device delivers it under an id of its own, says so, and sends the device's answer
//! back. A device connected to no node is answered 409 after `rpc.remote_wait`.
//!
//! ThingsBoard answers these failures with a bare status; here each also carries its
//! error body (`{"status","message","errorCode","timestamp"}`, errorCode 2) saying why:
//! no session takes the device's RPC requests (409), no answer within the timeout (408 /
//! 504), an answer that is not JSON (406). Clients that read only the status are unaffected.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use gridlinks_platform::rpc::Outcome;
use gridlinks_platform::Platform;
use gridlinks_thingsboard::error::{self as tb_error, ErrorCode};
use gridlinks_types::Ts;
use serde_json::{json, Value as J};

use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use gridlinks_platform::auth::Caller;

/// Which controller generation answers (they differ in the timeout status only).
#[derive(Clone, Copy, Debug)]
enum Version {
    V1,
    V2,
}

/// Why a call was not delivered or not answered; its status and message.
#[derive(Debug)]
enum Failure {
    /// No session of the device (on any node, with several) takes RPC requests.
    NotConnected { nodes: bool },
    /// The device did not answer within the timeout.
    NoReply { timeout: Duration, version: Version },
    /// The device answered with something that is not JSON.
    NotJson,
}

impl Failure {
    fn status(&self) -> StatusCode {
        match self {
            Self::NotConnected { .. } => StatusCode::CONFLICT,
            Self::NoReply { version: Version::V1, .. } => StatusCode::REQUEST_TIMEOUT,
            Self::NoReply { version: Version::V2, .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::NotJson => StatusCode::NOT_ACCEPTABLE,
        }
    }

    fn message(&self) -> String {
        match self {
            Self::NotConnected { nodes } => format!(
                "Device is not connected{}: no session of it is subscribed to RPC requests \
                 (v1/devices/me/rpc/request/+; for a gateway's sub-device, no session of the gateway to \
                 v1/gateway/rpc), or its session was just closed because its queue was full (it was not \
                 reading what it was sent)",
                if *nodes { " to any node" } else { "" }
            ),
            Self::NoReply { timeout, .. } => {
                format!(
                    "Device did not answer within the timeout ({} ms); the request was delivered",
                    timeout.as_millis()
                )
            }
            Self::NotJson => "Device answered with a response that is not JSON".to_owned(),
        }
    }
}

/// ThingsBoard's status with its error body. (Not through `ApiError`: that closes the
/// connection after a 408, which is right for an unread request body, not here.)
impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = tb_error::body(status.as_u16(), ErrorCode::General, &self.message(), Ts::now());
        (status, axum::Json(body)).into_response()
    }
}

async fn call(
    st: Arc<Platform>,
    me: &Caller,
    version: Version,
    kind: &str,
    id: &str,
    body: &[u8],
) -> ApiResult<Response> {
    let two_way = match kind {
        "oneway" => false,
        "twoway" => true,
        other => return Err(ApiError::not_found(format!("No such RPC kind '{other}': use oneway or twoway"))),
    };
    let device = super::api::device_id(id)?;
    let req: J =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    let method = req
        .get("method")
        .and_then(J::as_str)
        .ok_or_else(|| ApiError::bad_request("Invalid request body: \"method\" is required"))?;
    let params = req.get("params").cloned().unwrap_or(J::Null);
    let requested = req.get("timeout").and_then(J::as_u64).map(Duration::from_millis);
    let timeout =
        requested.unwrap_or(st.core.cfg.rpc.default_timeout.duration()).max(st.core.cfg.rpc.min_timeout.duration());
    gridlinks_platform::entities::devices::get(&st.core, me, device).await?;
    let payload = Bytes::from(json!({"method": method, "params": params}).to_string());
    Ok(match st.devices.call(&st.core, device, payload, timeout, two_way).await? {
        Outcome::Sent => StatusCode::OK.into_response(),
        Outcome::Answered(answer) if answer.is_empty() => StatusCode::OK.into_response(),
        Outcome::Answered(answer) => match serde_json::from_slice::<J>(&answer) {
            Ok(_) => ([(header::CONTENT_TYPE, "application/json")], answer).into_response(),
            Err(_) => Failure::NotJson.into_response(),
        },
        Outcome::NotConnected { nodes } => Failure::NotConnected { nodes }.into_response(),
        Outcome::NoReply => Failure::NoReply { timeout, version }.into_response(),
    })
}

/// `POST /api/plugins/rpc/{kind}/{deviceId}`.
pub async fn rpc_v1(
    User(me): User,
    State(st): State<Arc<Platform>>,
    Path((kind, id)): Path<(String, String)>,
    Body(body): Body,
) -> ApiResult<Response> {
    call(st, &me, Version::V1, &kind, &id, &body).await
}

/// `POST /api/rpc/{kind}/{deviceId}`.
pub async fn rpc_v2(
    User(me): User,
    State(st): State<Arc<Platform>>,
    Path((kind, id)): Path<(String, String)>,
    Body(body): Body,
) -> ApiResult<Response> {
    call(st, &me, Version::V2, &kind, &id, &body).await
}
