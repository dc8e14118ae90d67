//! Server-side RPC, as ThingsBoard serves it: `POST /api/plugins/rpc/{oneway|twoway}/{deviceId}`
//! (v1: timeout → 408, device not connected → 409) and `POST /api/rpc/{oneway|twoway}/{deviceId}`
//! (v2: timeout → 504, not connected → 409). The request is published to the device's
//! sessions subscribed to `v1/devices/me/rpc/request/+`; a two-way call waits for the device's
//! answer on `v1/devices/me/rpc/response/{id}`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use gridlinks_thingsboard::topic;
use gridlinks_types::DeviceId;
use parking_lot::Mutex;
use serde_json::{json, Value as J};
use tokio::sync::oneshot;

use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use crate::auth::Caller;
use crate::mqtt::Mqtt;

/// Two-way calls waiting for the device's answer.
#[derive(Default)]
pub struct RpcRegistry {
    pending: Mutex<HashMap<(DeviceId, u32), oneshot::Sender<Bytes>>>,
    next: AtomicU32,
}

impl RpcRegistry {
    fn start(&self, device: DeviceId) -> (u32, oneshot::Receiver<Bytes>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert((device, id), tx);
        (id, rx)
    }

    fn cancel(&self, device: DeviceId, id: u32) {
        self.pending.lock().remove(&(device, id));
    }

    /// The device answered request `id`; returns false if nobody waits for it.
    pub fn complete(&self, device: DeviceId, id: u32, payload: Bytes) -> bool {
        match self.pending.lock().remove(&(device, id)) {
            Some(tx) => tx.send(payload).is_ok(),
            None => false,
        }
    }
}

/// Which controller generation answers (they differ in the timeout status only).
#[derive(Clone, Copy)]
enum Version {
    V1,
    V2,
}

async fn call(st: Arc<Mqtt>, me: &Caller, version: Version, kind: &str, id: &str, body: &[u8]) -> ApiResult<Response> {
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
    super::api::device_for(&st.core, me, device).await?;
    let payload = Bytes::from(json!({"method": method, "params": params}).to_string());
    let (rpc_id, rx) = st.rpc.start(device);
    let delivered = st.sessions.deliver(device, &topic::rpc_request(rpc_id), payload);
    if delivered == 0 {
        st.rpc.cancel(device, rpc_id);
        return Ok(StatusCode::CONFLICT.into_response());
    }
    if !two_way {
        st.rpc.cancel(device, rpc_id);
        return Ok(StatusCode::OK.into_response());
    }
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(answer)) if answer.is_empty() => Ok(StatusCode::OK.into_response()),
        Ok(Ok(answer)) => match serde_json::from_slice::<J>(&answer) {
            Ok(_) => Ok(([(header::CONTENT_TYPE, "application/json")], answer).into_response()),
            Err(_) => Ok(StatusCode::NOT_ACCEPTABLE.into_response()),
        },
        _ => {
            st.rpc.cancel(device, rpc_id);
            Ok(match version {
                Version::V1 => StatusCode::REQUEST_TIMEOUT,
                Version::V2 => StatusCode::GATEWAY_TIMEOUT,
            }
            .into_response())
        }
    }
}

/// `POST /api/plugins/rpc/{kind}/{deviceId}`.
pub async fn rpc_v1(
    User(me): User,
    State(st): State<Arc<Mqtt>>,
    Path((kind, id)): Path<(String, String)>,
    Body(body): Body,
) -> ApiResult<Response> {
    call(st, &me, Version::V1, &kind, &id, &body).await
}

/// `POST /api/rpc/{kind}/{deviceId}`.
pub async fn rpc_v2(
    User(me): User,
    State(st): State<Arc<Mqtt>>,
    Path((kind, id)): Path<(String, String)>,
    Body(body): Body,
) -> ApiResult<Response> {
    call(st, &me, Version::V2, &kind, &id, &body).await
}
