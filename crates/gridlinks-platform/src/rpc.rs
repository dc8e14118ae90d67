//! Server-side RPC to devices: the calls waiting for a device's answer, on this node and
//! across nodes. A request goes to the device's sessions subscribed to
//! `v1/devices/me/rpc/request/+` (any transport), or for a gateway's sub-device to the
//! gateway's on `v1/gateway/rpc`; a two-way call waits for the device's answer on
//! `v1/devices/me/rpc/response/{id}` (or the gateway's on `v1/gateway/rpc`). The REST API
//! (`POST /api/rpc/…`) serves [`DeviceSessions::call`] with ThingsBoard's statuses.
//!
//! With several nodes, a device may be connected to a node other than the one that took
//! the call. The call then goes on the Kafka bus (`gridlinks_kafka::bus`); the node holding
//! the device delivers it under an id of its own, says so, and sends the device's answer
//! back. A device connected to no node is answered "not connected" after `rpc.remote_wait`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gridlinks_kafka::bus::{BrokerRecord, RpcRequest};
use gridlinks_kafka::Bus;
use gridlinks_storage::StoreError;
use gridlinks_types::DeviceId;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::core::{Core, Platform};
use crate::sessions::DeviceSessions;

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
pub fn deliver_remote(st: &Arc<Platform>, r: RpcRequest) {
    let waiter = Waiter::Remote { node: r.reply_to.clone(), request: r.request };
    let id = st.devices.rpc.wait(r.device, waiter);
    if st.devices.deliver_rpc(r.device, id, Bytes::from(r.body)) == 0 {
        st.devices.rpc.cancel(r.device, id);
        return;
    }
    st.devices.rpc.answer(BrokerRecord::RpcDelivered { to: r.reply_to, request: r.request });
    let (st, device) = (Arc::downgrade(st), r.device);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(r.timeout_ms)).await;
        if let Some(st) = st.upgrade() {
            st.devices.rpc.cancel(device, id);
        }
    });
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
    rpc: &RpcRegistry,
    core: &Core,
    bus: &Bus,
    device: DeviceId,
    body: Bytes,
    timeout: Duration,
) -> Result<Option<(u64, oneshot::Receiver<Bytes>)>, StoreError> {
    let (request, delivered, reply) = rpc.start_remote();
    let record = BrokerRecord::RpcRequest(RpcRequest {
        reply_to: bus.node_id().to_owned(),
        request,
        device,
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        body: body.to_vec(),
    });
    if let Err(e) = async { bus.send(device.as_bytes(), &record)?.await }.await {
        rpc.end_remote(request);
        return Err(e);
    }
    match tokio::time::timeout(core.cfg.rpc.remote_wait.duration(), delivered).await {
        Ok(Ok(())) => Ok(Some((request, reply))),
        _ => {
            rpc.end_remote(request);
            Ok(None)
        }
    }
}

/// How a call ended.
#[derive(Debug)]
pub enum Outcome {
    /// A one-way call was delivered.
    Sent,
    /// The device's answer to a two-way call (perhaps empty).
    Answered(Bytes),
    /// No session of the device (on any node, with several: `nodes`) takes RPC requests.
    NotConnected {
        /// Whether other nodes were asked too.
        nodes: bool,
    },
    /// The device did not answer within the timeout; the request was delivered.
    NoReply,
}

impl DeviceSessions {
    /// Calls `device` with `payload` (`{"method","params"}`): delivered to its sessions on
    /// this node, or through the bus to the node holding it; a two-way call waits up to
    /// `timeout` for the answer. The caller has checked that it may use the device.
    pub async fn call(
        &self,
        core: &Core,
        device: DeviceId,
        payload: Bytes,
        timeout: Duration,
        two_way: bool,
    ) -> Result<Outcome, StoreError> {
        let rpc = &self.rpc;
        let (rpc_id, rx) = rpc.start(device);
        let (at, rx) = if self.deliver_rpc(device, rpc_id, payload.clone()) > 0 {
            (Delivered::Here(rpc_id), rx)
        } else {
            rpc.cancel(device, rpc_id);
            let Some(bus) = &core.bus else { return Ok(Outcome::NotConnected { nodes: false }) };
            match call_elsewhere(rpc, core, bus, device, payload, timeout).await? {
                Some((request, rx)) => (Delivered::Elsewhere(request), rx),
                None => return Ok(Outcome::NotConnected { nodes: true }),
            }
        };
        let forget = || match at {
            Delivered::Here(id) => rpc.cancel(device, id),
            Delivered::Elsewhere(request) => rpc.end_remote(request),
        };
        if !two_way {
            forget();
            return Ok(Outcome::Sent);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => Ok(Outcome::Answered(answer)),
            _ => {
                forget();
                Ok(Outcome::NoReply)
            }
        }
    }
}
