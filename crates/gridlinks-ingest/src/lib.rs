//! The ingest boundary: the one way device data enters GridLinks. It authenticates a device
//! credential, submits telemetry and attributes in batches, returns once they are durable,
//! and hands what was committed to live fan-out. Every transport (MQTT, HTTP, gateway API,
//! REST telemetry posts, bulk import; later CoAP and custom TCP) decodes into an [`Item`]
//! batch and maps [`IngestError`] to its own status codes in one place.
//!
//! ```text
//! transport ──Vec<Item>──▶ Ingest::submit ──▶ CommitLog::commit (one request, one reply)
//!                                              │ embedded: the storage writer's group commit
//!                                              │ later:    Kafka, acks=all
//!            ◀── one Result per item ──────────┤
//!                                              └─▶ LiveData::telemetry (committed data only)
//! ```
//!
//! The commit log is a seam ([`CommitLog`]): the embedded journal ([`Embedded`]) sits
//! behind it today; a Kafka-backed log (acknowledge after `acks=all`, partitioned by device)
//! implements the same trait.

mod error;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use gridlinks_storage::{ImportOutcome, ImportRow, Store, StoreError, WriteOp, WriteOutcome, WriterHandle};
use gridlinks_types::{AttributeScope, DeviceId, ProtocolIdentity, TsRecord, Value};

pub use error::IngestError;

/// A boxed future, for the object-safe seams.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One piece of device data to commit.
#[derive(Debug)]
pub enum Item {
    /// Time-series records of one device.
    Telemetry {
        /// Whose.
        device: DeviceId,
        /// What.
        records: Vec<TsRecord>,
    },
    /// Attribute values of one device in one scope (last write wins).
    Attributes {
        /// Whose.
        device: DeviceId,
        /// Which scope.
        scope: AttributeScope,
        /// What.
        values: Vec<(String, Value)>,
    },
    /// Attribute keys of one device in one scope removed. Through the commit log, so that
    /// it is ordered after the device's earlier writes (on Kafka: on the same partition)
    /// and other nodes hear of it.
    DeleteAttributes {
        /// Whose.
        device: DeviceId,
        /// Which scope.
        scope: AttributeScope,
        /// Which keys.
        keys: Vec<String>,
    },
}

impl Item {
    /// The device it is about.
    pub fn device(&self) -> DeviceId {
        match self {
            Item::Telemetry { device, .. }
            | Item::Attributes { device, .. }
            | Item::DeleteAttributes { device, .. } => *device,
        }
    }
}

/// Where submitted data becomes durable. Answers one result per op, in order, only once
/// the ops are committed (or failed); `Err` when the request could not be taken at all.
pub trait CommitLog: Send + Sync + 'static {
    /// Commits `ops` as one request.
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'_, Result<Vec<Result<WriteOutcome, StoreError>>, StoreError>>;
}

/// The embedded commit log: the storage writer's journal and group commit.
pub struct Embedded(pub WriterHandle);

impl CommitLog for Embedded {
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'_, Result<Vec<Result<WriteOutcome, StoreError>>, StoreError>> {
        Box::pin(self.0.submit_batch(ops))
    }
}

/// Committed attribute values of one device in one scope.
pub type AttributeChange = (DeviceId, AttributeScope, Vec<(String, Value)>);

/// Receives committed telemetry: the canonical MQTT topics and the WebSocket API.
pub trait LiveData: Send + Sync + 'static {
    /// Whether anyone listens at all (checked before records are copied for it).
    fn wants_telemetry(&self) -> bool;
    /// Publishes committed telemetry; resolves once it is queued (and durable where a
    /// listener's session is). An error fails the items it carried.
    fn telemetry(&self, committed: Vec<(DeviceId, Arc<[TsRecord]>)>) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Whether anyone listens to attribute changes.
    fn wants_attributes(&self) -> bool {
        false
    }
    /// Committed attribute changes: queued for listeners that hold nothing durable, so
    /// this neither waits nor fails.
    fn attributes(&self, _committed: &[AttributeChange]) {}
}

/// No live listeners (tests, tools).
pub struct NoLiveData;

impl LiveData for NoLiveData {
    fn wants_telemetry(&self) -> bool {
        false
    }
    fn telemetry(&self, _: Vec<(DeviceId, Arc<[TsRecord]>)>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The ingest boundary's handle; cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    store: Store,
    log: Arc<dyn CommitLog>,
    live: Arc<dyn LiveData>,
    max_devices_per_gateway: usize,
    /// Whether a gateway may adopt a device of its tenant that no gateway owns, unless the
    /// device's profile says otherwise.
    gateway_adopts: bool,
}

impl Ingest {
    /// An ingest path committing to `log`, reading credentials from `store`, handing
    /// committed telemetry to `live`; a gateway may own at most `max_devices_per_gateway`.
    /// Gateways adopt devices of no gateway (as ThingsBoard's do); see
    /// [`Ingest::gateways_adopt`].
    pub fn new(store: Store, log: Arc<dyn CommitLog>, live: Arc<dyn LiveData>, max_devices_per_gateway: usize) -> Self {
        Self { store, log, live, max_devices_per_gateway, gateway_adopts: true }
    }

    /// Whether a gateway may adopt (bind on first use) a device of its tenant that no gateway
    /// owns, where the device's profile does not say (`gatewayAdoption`).
    pub fn gateways_adopt(self, adopt: bool) -> Self {
        Self { gateway_adopts: adopt, ..self }
    }

    /// The device whose access token is `token` (an in-memory cache in front of the store).
    pub fn authenticate(&self, token: &str) -> Result<DeviceId, IngestError> {
        self.store.device_id_by_token(token)?.ok_or(IngestError::BadCredential)
    }

    /// Whether `device` is a gateway (`additionalInfo.gateway: true`), read each time so a
    /// change over REST applies at once.
    pub fn is_gateway(&self, device: DeviceId) -> Result<bool, IngestError> {
        Ok(self.store.device(device)?.is_some_and(|d| d.is_gateway()))
    }

    /// Commits a batch: one request to the commit log, one result per item, in order. An
    /// item is `Ok` only once it is durable (and, for telemetry, handed to live fan-out).
    pub async fn submit(&self, items: Vec<Item>) -> Vec<Result<(), IngestError>> {
        let live = self.live.wants_telemetry();
        let live_attrs = self.live.wants_attributes();
        // Telemetry for live fan-out: (item index, device, records), shared with the write.
        let mut copies = Vec::new();
        let mut attr_copies = Vec::new();
        let ops: Vec<WriteOp> = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Item::Telemetry { device, records } => {
                    let records: Arc<[TsRecord]> = records.into();
                    if live {
                        copies.push((i, device, records.clone()));
                    }
                    WriteOp::Telemetry { device, records }
                }
                Item::Attributes { device, scope, values } => {
                    if live_attrs {
                        attr_copies.push((i, (device, scope, values.clone())));
                    }
                    WriteOp::Attributes { device, scope, values }
                }
                Item::DeleteAttributes { device, scope, keys } => WriteOp::DeleteAttributes { device, scope, keys },
            })
            .collect();
        let n = ops.len();
        let mut results: Vec<Result<(), IngestError>> = match self.log.commit(ops).await {
            Ok(results) => results.into_iter().map(|r| r.map(drop).map_err(IngestError::from)).collect(),
            Err(e) => {
                let e = IngestError::from(e);
                return (0..n).map(|_| Err(e.clone())).collect();
            }
        };
        // Only what was committed goes live.
        if !attr_copies.is_empty() {
            let committed: Vec<_> =
                attr_copies.into_iter().filter(|(i, _)| results[*i].is_ok()).map(|(_, c)| c).collect();
            self.live.attributes(&committed);
        }
        copies.retain(|(i, _, _)| results[*i].is_ok());
        if copies.is_empty() {
            return results;
        }
        let carried: Vec<usize> = copies.iter().map(|(i, _, _)| *i).collect();
        let committed = copies.into_iter().map(|(_, device, records)| (device, records)).collect();
        if let Err(e) = self.live.telemetry(committed).await {
            let e = IngestError::from(e);
            for i in carried {
                results[i] = Err(e.clone());
            }
        }
        results
    }

    /// Commits one item.
    pub async fn submit_one(&self, item: Item) -> Result<(), IngestError> {
        self.submit(vec![item]).await.pop().unwrap_or(Err(IngestError::Unavailable("no result".into())))
    }

    /// The id of gateway `gateway`'s sub-device `name`, looked up in the gateway's tenant
    /// only: one it owns; one of no gateway, which it adopts (binds) when adoption is allowed
    /// (`gateways_adopt`, or the device profile's `gatewayAdoption`); or one created for it on
    /// first use (type `default` unless given). Owned devices are bounded per gateway.
    /// Another gateway's device, a gateway, or a device that may not be adopted is refused.
    /// With the id: whether it became the gateway's just now (created or adopted).
    pub async fn gateway_device(
        &self,
        gateway: DeviceId,
        name: &str,
        device_type: Option<String>,
    ) -> Result<(DeviceId, bool), IngestError> {
        let store = self.store.clone();
        let owned = name.to_owned();
        // A gateway's devices are of its tenant.
        let found = tokio::task::spawn_blocking(move || {
            let tenant = store.device(gateway)?.and_then(|g| g.tenant);
            store.device_by_name(tenant, &owned)
        })
        .await
        .map_err(|_| IngestError::Unavailable("lookup task failed".into()))??;
        match found {
            Some(d) if d.gateway == Some(gateway) => return Ok((d.id, false)),
            // Another gateway's: refused without a write. One of no gateway goes to the
            // writer, which adopts it if allowed, under the same lock as creations.
            Some(d) if d.gateway.is_some() => return Err(IngestError::ForeignDevice(name.to_owned())),
            _ => {}
        }
        let op = WriteOp::GatewayDevice {
            gateway,
            name: name.to_owned(),
            device_type,
            max_devices: self.max_devices_per_gateway,
            adopt: self.gateway_adopts,
        };
        match self.commit_one(op).await? {
            WriteOutcome::Device(d) => Ok((d.id, true)),
            _ => Err(IngestError::Failed("unexpected write outcome".into())),
        }
    }

    /// The device a protocol knows by `identity`: the one registered with it, or — when
    /// `provision` gives a device type and a bound — one created for it on first use,
    /// named `{protocol}-{id}`, while fewer than the bound hold an identity of the protocol.
    /// An unknown identity without `provision` is a bad credential.
    pub async fn protocol_device(
        &self,
        identity: &ProtocolIdentity,
        provision: Option<(&str, usize)>,
    ) -> Result<DeviceId, IngestError> {
        if let Some(id) = self.store.device_id_by_identity(identity)? {
            return Ok(id);
        }
        let Some((device_type, max_devices)) = provision else { return Err(IngestError::BadCredential) };
        let op =
            WriteOp::ProtocolDevice { identity: identity.clone(), device_type: device_type.to_owned(), max_devices };
        match self.commit_one(op).await? {
            WriteOutcome::Device(d) => Ok(d.id),
            _ => Err(IngestError::Failed("unexpected write outcome".into())),
        }
    }

    /// The device `name` gateway `gateway` may say disconnected: one it owns, or one of its
    /// tenant that no gateway owns (nothing to undo; ThingsBoard accepts it too).
    pub fn owns(&self, gateway: DeviceId, name: &str) -> Result<DeviceId, IngestError> {
        let tenant = self.store.device(gateway)?.and_then(|g| g.tenant);
        match self.store.device_by_name(tenant, name)? {
            Some(d) if d.gateway == Some(gateway) || (d.gateway.is_none() && !d.is_gateway()) => Ok(d.id),
            _ => Err(IngestError::ForeignDevice(name.to_owned())),
        }
    }

    /// The id of gateway `gateway`'s own sub-device `name` (created by or assigned to it);
    /// any other name is refused as another's.
    pub fn owned(&self, gateway: DeviceId, name: &str) -> Result<DeviceId, IngestError> {
        let tenant = self.store.device(gateway)?.and_then(|g| g.tenant);
        match self.store.device_by_name(tenant, name)? {
            Some(d) if d.gateway == Some(gateway) => Ok(d.id),
            _ => Err(IngestError::ForeignDevice(name.to_owned())),
        }
    }

    /// Creates or updates devices of `tenant` from a bulk import, with their attributes, in
    /// one commit.
    pub async fn import(
        &self,
        tenant: Option<uuid::Uuid>,
        rows: Vec<ImportRow>,
        update: bool,
    ) -> Result<ImportOutcome, IngestError> {
        match self.commit_one(WriteOp::Import { tenant, rows, update }).await? {
            WriteOutcome::Import(o) => Ok(o),
            _ => Err(IngestError::Failed("unexpected write outcome".into())),
        }
    }

    async fn commit_one(&self, op: WriteOp) -> Result<WriteOutcome, IngestError> {
        let mut results = self.log.commit(vec![op]).await?;
        Ok(results.pop().ok_or_else(|| IngestError::Unavailable("no result".into()))??)
    }
}
