//! The device-session registry: the one seam through which the REST API, other nodes and
//! (later) the rule layer reach a connected device — server-side RPC, shared-attribute
//! pushes, closing a revoked device's sessions — whatever transport it uses, and through
//! its gateway for a gateway's sub-device. Every
//! transport registers its live sessions in the broker's [`Sessions`] (a device session
//! follows `v1/devices/me/…` topics, whatever its wire protocol); nothing else knows which
//! transport a device is on.
//!
//! Also here: the broker namespaces of tenants ([`mount`]) and the per-credential
//! connection counts every transport applies (`mqtt.max_connections_per_credential`).

use std::sync::Arc;

use bytes::Bytes;
use gridlinks_broker::sessions::Sessions;
use gridlinks_storage::Store;
use gridlinks_thingsboard::{gateway, topic};
use gridlinks_types::{DeviceId, Value};
use serde_json::Value as J;

use crate::rpc::RpcRegistry;

/// Live device (and pub/sub) sessions of every transport on this node, and the RPC calls
/// waiting for them.
pub struct DeviceSessions {
    /// Live sessions, their subscriptions and the routing table.
    pub sessions: Arc<Sessions>,
    /// Server-side RPC calls waiting for devices.
    pub rpc: RpcRegistry,
    /// Live connections per credential.
    pub counts: Arc<CredentialCounts>,
    /// Which gateway a sub-device is reached through (its `gateway`), and its name.
    store: Store,
}

impl DeviceSessions {
    /// A registry over `sessions`, finding sub-devices' gateways in `store`, sending RPC
    /// across nodes on `bus` (several nodes).
    pub fn new(sessions: Arc<Sessions>, store: Store, bus: Option<Arc<gridlinks_kafka::Bus>>) -> Self {
        Self { sessions, rpc: RpcRegistry::new(bus), counts: Arc::default(), store }
    }

    /// Pushes committed shared attribute values to `device`'s sessions on this node that
    /// follow `v1/devices/me/attributes` (MQTT, CoAP observations, custom TCP), as
    /// `{"key":value,…}`, and, for a gateway's sub-device, to the gateway's sessions on
    /// `v1/gateway/attributes` as `{"device":name,"data":{…}}`. The node that took the write
    /// pushes them; with several nodes, the others push what they read from the bus.
    pub fn push_shared(&self, device: DeviceId, values: &[(String, Value)]) {
        self.push_attributes(device, J::Object(values.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()));
    }

    /// Tells `device` (or its gateway) that shared attributes `keys` were deleted:
    /// `{"deleted":["k",…]}`, as ThingsBoard does.
    pub fn push_deleted(&self, device: DeviceId, keys: &[String]) {
        self.push_attributes(device, serde_json::json!({ "deleted": keys }));
    }

    fn push_attributes(&self, device: DeviceId, update: J) {
        if let Some((name, gateway)) = self.gateway_of(device) {
            let wrapped = gateway::for_device(&name, update.clone()).to_string();
            self.sessions.deliver(gateway, topic::GATEWAY_ATTRIBUTES, wrapped.into());
        }
        self.sessions.deliver(device, topic::ATTRIBUTES, update.to_string().into());
    }

    /// Delivers server-side RPC request `id` (`{"method","params"}`) to `device`'s sessions
    /// on this node, or through its gateway's (`v1/gateway/rpc`); how many sessions got it.
    pub(crate) fn deliver_rpc(&self, device: DeviceId, id: u32, call: Bytes) -> usize {
        let direct = self.sessions.deliver(device, &topic::rpc_request(id), call.clone());
        if direct > 0 {
            return direct;
        }
        let Some((name, gateway)) = self.gateway_of(device) else { return 0 };
        match gateway::rpc_request(&name, id, &call) {
            Some(wrapped) => self.sessions.deliver(gateway, topic::GATEWAY_RPC, wrapped.to_string().into()),
            None => 0,
        }
    }

    /// A sub-device's name and gateway; `None` for a device of no gateway (or unreadable:
    /// the push then reaches only the device's own sessions).
    fn gateway_of(&self, device: DeviceId) -> Option<(String, DeviceId)> {
        let d = self.store.device(device).ok().flatten()?;
        Some((d.name, d.gateway?))
    }

    /// Closes every session of `device` on this node (deleted, or its credentials changed).
    pub fn close(&self, device: DeviceId) {
        self.sessions.close_device(device);
    }
}

/// Where every tenant but the first has its broker namespace: `$tenant/{id}/`. A client of
/// such a tenant publishes and subscribes in its own terms; the broker prefixes its topics,
/// filters and client id with its namespace, and takes the prefix off what it delivers. No
/// client may name a topic or filter under this root itself, and first-level wildcards never
/// match `$` topics, so no tenant reaches another's namespace, nor the first tenant's into
/// theirs.
pub const MOUNT_ROOT: &str = "$tenant/";

/// The namespace of `tenant` (not the first).
pub fn mount(tenant: uuid::Uuid) -> Arc<str> {
    format!("{MOUNT_ROOT}{tenant}/").into()
}

/// The namespace a pub/sub client's session id is in (its id is the namespace and the
/// client id the client gave; a client id may not start with [`MOUNT_ROOT`]).
pub fn mount_of(session_id: &str) -> Option<&str> {
    let rest = session_id.strip_prefix(MOUNT_ROOT)?;
    rest.find('/').map(|end| &session_id[..MOUNT_ROOT.len() + end + 1])
}

/// Connections per credential (device token or application user name), for
/// `mqtt.max_connections_per_credential`.
#[derive(Default)]
pub struct CredentialCounts {
    map: parking_lot::Mutex<rustc_hash::FxHashMap<Box<str>, u32>>,
}

/// One connection counted against a credential until dropped.
pub struct CredentialSlot {
    counts: Arc<CredentialCounts>,
    key: Box<str>,
}

impl CredentialCounts {
    /// Counts a connection of `key`; `None` when it has `max` already.
    pub fn acquire(self: &Arc<Self>, key: &str, max: usize) -> Option<CredentialSlot> {
        let mut map = self.map.lock();
        let n = map.entry(key.into()).or_insert(0);
        if usize::try_from(*n).unwrap_or(usize::MAX) >= max {
            return None;
        }
        *n += 1;
        Some(CredentialSlot { counts: self.clone(), key: key.into() })
    }
}

impl Drop for CredentialSlot {
    fn drop(&mut self) {
        let mut map = self.counts.map.lock();
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}
