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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use gridlinks_kafka::bus::{BrokerRecord, RpcRequest};
use gridlinks_kafka::Bus;
use gridlinks_thingsboard::error::{self as tb_error, ErrorCode};
use gridlinks_thingsboard::topic;
use gridlinks_types::{DeviceId, Ts};
use parking_lot::Mutex;
use serde_json::{json, Value as J};
use tokio::sync::oneshot;

use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use crate::auth::Caller;
use crate::mqtt::Mqtt;

/// Who waits for a device's answer to a request delivered by this node.
enum Waiter {
    /// A call this node took.
    Local(oneshot::Sender<Bytes>),
    /// Call `request` of node `node`, answered through the bus.
    Remote { node: String, request: u64 },
}

/// A call this node took for a device connected to another node.
struct RemoteCall {
    /// Told when a node delivered the request.
    delivered: Option<oneshot::Sender<()>>,
    /// Given the device's answer.
    reply: oneshot::Sender<Bytes>,
}

/// Calls waiting for devices: this node's (by device and request id), and other nodes'
/// that this node delivered; and this node's calls out on the bus (by number).
#[derive(Default)]
pub struct RpcRegistry {
    pending: Mutex<HashMap<(DeviceId, u32), Waiter>>,
    next: AtomicU32,
    remote: Mutex<HashMap<u64, RemoteCall>>,
    next_remote: AtomicU64,
    /// With several nodes: where requests for devices connected elsewhere, and answers to
    /// other nodes' requests, go.
    bus: Option<Arc<Bus>>,
}

impl RpcRegistry {
    /// A registry sending across nodes on `bus` (several nodes) or not at all.
    pub fn new(bus: Option<Arc<Bus>>) -> Self {
        Self { bus, ..Self::default() }
    }

    fn wait(&self, device: DeviceId, waiter: Waiter) -> u32 {
        let id = self.next.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        self.pending.lock().insert((device, id), waiter);
        id
    }

    fn start(&self, device: DeviceId) -> (u32, oneshot::Receiver<Bytes>) {
        let (tx, rx) = oneshot::channel();
        (self.wait(device, Waiter::Local(tx)), rx)
    }

    fn cancel(&self, device: DeviceId, id: u32) {
        self.pending.lock().remove(&(device, id));
    }

    /// The device answered request `id`; returns false if nobody waits for it. The
    /// answer to another node's call goes back on the bus.
    pub fn complete(&self, device: DeviceId, id: u32, payload: Bytes) -> bool {
        match self.pending.lock().remove(&(device, id)) {
            Some(Waiter::Local(tx)) => tx.send(payload).is_ok(),
            Some(Waiter::Remote { node, request }) => {
                self.answer(BrokerRecord::RpcReply { to: node, request, payload: payload.to_vec() });
                true
            }
            None => false,
        }
    }

    /// Sends an answer to another node's call (keyed by that node) in the background.
    fn answer(&self, record: BrokerRecord) {
        let Some(bus) = &self.bus else { return };
        let (BrokerRecord::RpcDelivered { to, .. } | BrokerRecord::RpcReply { to, .. }) = &record else { return };
        match bus.send(to.as_bytes(), &record) {
            Ok(sent) => {
                tokio::spawn(async move {
                    if let Err(e) = sent.await {
                        crate::logging::warn_limited!(error = %e, "an RPC answer for another node was not sent");
                    }
                });
            }
            Err(e) => crate::logging::warn_limited!(error = %e, "an RPC answer for another node was not sent"),
        }
    }

    fn start_remote(&self) -> (u64, oneshot::Receiver<()>, oneshot::Receiver<Bytes>) {
        let request = self.next_remote.fetch_add(1, Ordering::Relaxed);
        let (delivered, delivered_rx) = oneshot::channel();
        let (reply, reply_rx) = oneshot::channel();
        self.remote.lock().insert(request, RemoteCall { delivered: Some(delivered), reply });
        (request, delivered_rx, reply_rx)
    }

    fn end_remote(&self, request: u64) {
        self.remote.lock().remove(&request);
    }

    /// Another node delivered this node's call `request`.
    pub fn remote_delivered(&self, request: u64) {
        if let Some(tx) = self.remote.lock().get_mut(&request).and_then(|c| c.delivered.take()) {
            let _ = tx.send(());
        }
    }

    /// The device's answer to this node's call `request`, from the node holding it.
    pub fn remote_reply(&self, request: u64, payload: Vec<u8>) {
        if let Some(c) = self.remote.lock().remove(&request) {
            let _ = c.reply.send(Bytes::from(payload));
        }
    }
}

/// Another node's call for a device: delivered to the device's sessions on this node, if
/// it has any, under an id of this node; the caller is told, and gets the device's answer
/// (`RpcRegistry::complete`). Forgotten when the caller stops waiting.
pub fn deliver_remote(st: &Arc<Mqtt>, r: RpcRequest) {
    let waiter = Waiter::Remote { node: r.reply_to.clone(), request: r.request };
    let id = st.rpc.wait(r.device, waiter);
    if st.sessions.deliver(r.device, &topic::rpc_request(id), Bytes::from(r.body)) == 0 {
        st.rpc.cancel(r.device, id);
        return;
    }
    st.rpc.answer(BrokerRecord::RpcDelivered { to: r.reply_to, request: r.request });
    let (st, device) = (Arc::downgrade(st), r.device);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(r.timeout_ms)).await;
        if let Some(st) = st.upgrade() {
            st.rpc.cancel(device, id);
        }
    });
}

/// Which controller generation answers (they differ in the timeout status only).
#[derive(Clone, Copy, Debug)]
enum Version {
    V1,
    V2,
}

/// Where a delivered call's answer comes from.
enum Delivered {
    /// This node's session of the device (request `id`).
    Here(u32),
    /// Another node's (call `request` on the bus).
    Elsewhere(u64),
}

/// Puts a call for a device connected to no session here on the bus; `None` when no node
/// says it delivered it within `rpc.remote_wait`.
async fn call_elsewhere(
    st: &Mqtt,
    bus: &Bus,
    device: DeviceId,
    body: Bytes,
    timeout: Duration,
) -> ApiResult<Option<(u64, oneshot::Receiver<Bytes>)>> {
    let (request, delivered, reply) = st.rpc.start_remote();
    let record = BrokerRecord::RpcRequest(RpcRequest {
        reply_to: bus.node_id().to_owned(),
        request,
        device,
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        body: body.to_vec(),
    });
    if let Err(e) = async { bus.send(device.as_bytes(), &record)?.await }.await {
        st.rpc.end_remote(request);
        return Err(e.into());
    }
    match tokio::time::timeout(st.core.cfg.rpc.remote_wait.duration(), delivered).await {
        Ok(Ok(())) => Ok(Some((request, reply))),
        _ => {
            st.rpc.end_remote(request);
            Ok(None)
        }
    }
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
                 (v1/devices/me/rpc/request/+), or its session was just closed because its queue was full \
                 (it was not reading what it was sent)",
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
    let (at, rx) = if st.sessions.deliver(device, &topic::rpc_request(rpc_id), payload.clone()) > 0 {
        (Delivered::Here(rpc_id), rx)
    } else {
        st.rpc.cancel(device, rpc_id);
        let Some(bus) = &st.core.bus else { return Ok(Failure::NotConnected { nodes: false }.into_response()) };
        match call_elsewhere(&st, bus, device, payload, timeout).await? {
            Some((request, rx)) => (Delivered::Elsewhere(request), rx),
            None => return Ok(Failure::NotConnected { nodes: true }.into_response()),
        }
    };
    let forget = || match at {
        Delivered::Here(id) => st.rpc.cancel(device, id),
        Delivered::Elsewhere(request) => st.rpc.end_remote(request),
    };
    if !two_way {
        forget();
        return Ok(StatusCode::OK.into_response());
    }
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(answer)) if answer.is_empty() => Ok(StatusCode::OK.into_response()),
        Ok(Ok(answer)) => match serde_json::from_slice::<J>(&answer) {
            Ok(_) => Ok(([(header::CONTENT_TYPE, "application/json")], answer).into_response()),
            Err(_) => Ok(Failure::NotJson.into_response()),
        },
        _ => {
            forget();
            Ok(Failure::NoReply { timeout, version }.into_response())
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
