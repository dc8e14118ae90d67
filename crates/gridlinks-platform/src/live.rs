//! Committed data, live: [`Live`] is the ingest path's fan-out to every registered
//! [`LiveSink`] (the MQTT transport's canonical topics, the WebSocket API's subscriptions),
//! called only after the durable commit, with the device (or asset) looked up once for all
//! of them ([`Store::device_cached`]: from memory while no device changed).
//!
//! The canonical telemetry topics (`gridlinks/devices/{deviceName}/telemetry`, published by
//! the MQTT transport's sink) are named by [`FILTER`]: the broker's sessions watch it, so
//! nothing is built for them while no subscription overlaps it.

use std::sync::Arc;

use gridlinks_ingest::{AttributeChange, BoxFuture, LiveData};
use gridlinks_storage::{DeviceRecord, DocKind, Store, StoreError};
use gridlinks_types::{AttributeScope, DeviceId, Ts, TsRecord, Value};
use parking_lot::RwLock;

/// The filter matching every canonical telemetry topic.
pub const FILTER: &str = "gridlinks/devices/+/telemetry";

/// One receiver of committed data.
pub trait LiveSink: Send + Sync + 'static {
    /// Whether anyone listens to telemetry here (checked before anything is built for it).
    fn wants_telemetry(&self) -> bool;
    /// Whether anyone listens to attribute changes here.
    fn wants_attributes(&self) -> bool;
    /// Committed telemetry of `device` (of `tenant`); a future when the sink must be
    /// waited for (copies for persistent sessions committed, full queues).
    fn telemetry<'a>(
        &'a self,
        device: &'a DeviceRecord,
        tenant: uuid::Uuid,
        records: &'a [TsRecord],
    ) -> Option<BoxFuture<'a, Result<(), StoreError>>>;
    /// Committed attribute values of `device` (of `tenant`) in `scope`, at `now`; queued,
    /// never waited for.
    fn attributes(
        &self,
        device: &DeviceRecord,
        tenant: uuid::Uuid,
        scope: AttributeScope,
        values: &[(String, Value)],
        now: Ts,
    );
    /// Committed telemetry of an asset (kept under its id; of `tenant`, assigned to
    /// `customer`). Only a sink that follows assets (the WebSocket API) takes it.
    fn asset_telemetry(&self, _asset: &Owner, _records: &[TsRecord]) {}
    /// Committed attribute values of an asset, as [`LiveSink::attributes`].
    fn asset_attributes(&self, _asset: &Owner, _scope: AttributeScope, _values: &[(String, Value)], _now: Ts) {}
}

/// Whose data an asset's is: its id, tenant and customer.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    /// The id its data is kept under.
    pub id: DeviceId,
    /// Its tenant.
    pub tenant: uuid::Uuid,
    /// Its customer, if assigned.
    pub customer: Option<uuid::Uuid>,
}

/// The ingest path's live fan-out to every registered [`LiveSink`].
pub struct Live {
    /// For device records (names, tenants, customers).
    store: Store,
    /// The first tenant (devices stored without one are its).
    first_tenant: uuid::Uuid,
    sinks: RwLock<Vec<Arc<dyn LiveSink>>>,
}

impl Live {
    /// A fan-out with no sinks yet.
    pub fn new(store: Store, first_tenant: uuid::Uuid) -> Self {
        Self { store, first_tenant, sinks: RwLock::default() }
    }

    /// Adds `sink`: it receives everything committed from now on.
    pub fn register(&self, sink: Arc<dyn LiveSink>) {
        self.sinks.write().push(sink);
    }

    /// The asset `id` names, if it is one (data with no device under its id).
    fn asset(&self, id: DeviceId) -> Result<Option<Owner>, StoreError> {
        let Some(a) = self.store.doc(DocKind::Asset, id.0)? else { return Ok(None) };
        let tenant = a.doc.get("tenantId").and_then(serde_json::Value::as_str).and_then(|s| s.parse().ok());
        let customer = crate::entities::assets::customer(&a);
        Ok(Some(Owner { id, tenant: tenant.unwrap_or(self.first_tenant), customer }))
    }
}

impl LiveData for Live {
    fn wants_telemetry(&self) -> bool {
        self.sinks.read().iter().any(|s| s.wants_telemetry())
    }
    fn wants_attributes(&self) -> bool {
        self.sinks.read().iter().any(|s| s.wants_attributes())
    }
    fn attributes(&self, committed: &[AttributeChange]) {
        let now = Ts::now();
        let sinks = self.sinks.read().clone();
        for (device, scope, values) in committed {
            // A device deleted meanwhile has no subscriptions left to read it.
            match self.store.device_cached(*device) {
                Ok(Some(d)) => {
                    let tenant = d.tenant.unwrap_or(self.first_tenant);
                    for s in sinks.iter().filter(|s| s.wants_attributes()) {
                        s.attributes(&d, tenant, *scope, values, now);
                    }
                }
                Ok(None) => {
                    if let Ok(Some(a)) = self.asset(*device) {
                        for s in sinks.iter().filter(|s| s.wants_attributes()) {
                            s.asset_attributes(&a, *scope, values, now);
                        }
                    }
                }
                Err(_) => {}
            }
        }
    }
    fn telemetry(&self, committed: Vec<(DeviceId, Arc<[TsRecord]>)>) -> BoxFuture<'_, Result<(), StoreError>> {
        let sinks = self.sinks.read().clone();
        Box::pin(async move {
            for (device, records) in committed {
                // A device deleted meanwhile has no topic any more.
                let Some(d) = self.store.device_cached(device)? else {
                    if let Some(a) = self.asset(device)? {
                        for s in sinks.iter().filter(|s| s.wants_telemetry()) {
                            s.asset_telemetry(&a, &records);
                        }
                    }
                    continue;
                };
                let tenant = d.tenant.unwrap_or(self.first_tenant);
                for s in sinks.iter().filter(|s| s.wants_telemetry()) {
                    if let Some(pending) = s.telemetry(&d, tenant, &records) {
                        pending.await?;
                    }
                }
            }
            Ok(())
        })
    }
}
