//! Committed data, live: [`Live`] is the ingest path's fan-out to every registered
//! [`LiveSink`] (the MQTT transport's canonical topics, the WebSocket API's subscriptions),
//! called only after the durable commit, with the device looked up once for all of them.
//!
//! Canonical telemetry topics: device telemetry, once committed, is also published to
//! pub/sub clients on `gridlinks/devices/{deviceName}/telemetry`, so one subscription
//! `gridlinks/devices/+/telemetry` sees every device's data — never before it is durable.
//!
//! The payload is what was stored, in ThingsBoard's form with timestamps:
//! `[{"ts":1700000000000,"values":{"temperature":21.5}}]`. In the topic, the device name
//! is percent-encoded where it holds `/`, `+`, `#`, `%` or NUL, so it is always one level.
//!
//! Nothing is built while no client subscription overlaps the topics (one atomic read).
//!
//! A device of a tenant other than the first is published in its tenant's namespace
//! (`crate::sessions::mount`), where only that tenant's clients subscribe: device names are unique only
//! within a tenant.

use std::sync::Arc;

use bytes::Bytes;
use gridlinks_broker::router::Message;
use gridlinks_broker::topic::filters_overlap;
use gridlinks_codec::mqtt::QoS;
use gridlinks_ingest::{AttributeChange, BoxFuture, LiveData};
use gridlinks_storage::{DeviceRecord, Store, StoreError};
use gridlinks_types::{AttributeScope, DeviceId, Ts, TsRecord, Value};
use parking_lot::RwLock;
use serde_json::{json, Map};

/// The filter matching every canonical telemetry topic.
pub const FILTER: &str = "gridlinks/devices/+/telemetry";

/// The topic of device `name`.
pub fn topic(name: &str) -> String {
    let mut t = String::with_capacity(name.len() + 28);
    t.push_str("gridlinks/devices/");
    for c in name.chars() {
        match c {
            '/' | '+' | '#' | '%' | '\0' => t.push_str(&format!("%{:02X}", u32::from(c))),
            c => t.push(c),
        }
    }
    t.push_str("/telemetry");
    t
}

fn payload(records: &[TsRecord]) -> Bytes {
    let list: Vec<_> = records
        .iter()
        .map(|r| {
            let values: Map<String, serde_json::Value> =
                r.values.iter().map(|(k, v)| (k.clone(), v.to_json())).collect();
            json!({"ts": r.ts.0, "values": values})
        })
        .collect();
    Bytes::from(serde_json::Value::Array(list).to_string())
}

/// Device `d`'s committed `records` as the canonical topic's message (in its tenant's
/// namespace for a tenant other than the first).
pub fn message(d: &DeviceRecord, records: &[TsRecord]) -> Message {
    let topic = match d.tenant {
        Some(t) => format!("{}{}", crate::sessions::mount(t), topic(&d.name)),
        None => topic(&d.name),
    };
    Message::new(&topic, QoS::AtLeastOnce, payload(records))
}

/// Whether shared subscription filter `filter` (without `$share/{group}/`, perhaps in a
/// tenant's namespace) can match a canonical topic.
pub fn may_match(filter: &str) -> bool {
    filters_overlap(filter, FILTER) || filters_overlap(filter, &format!("{}+/{FILTER}", crate::sessions::MOUNT_ROOT))
}

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
            if let Ok(Some(d)) = self.store.device(*device) {
                let tenant = d.tenant.unwrap_or(self.first_tenant);
                for s in sinks.iter().filter(|s| s.wants_attributes()) {
                    s.attributes(&d, tenant, *scope, values, now);
                }
            }
        }
    }
    fn telemetry(&self, committed: Vec<(DeviceId, Vec<TsRecord>)>) -> BoxFuture<'_, Result<(), StoreError>> {
        let sinks = self.sinks.read().clone();
        Box::pin(async move {
            for (device, records) in committed {
                // A device deleted meanwhile has no topic any more.
                let Some(d) = self.store.device(device)? else { continue };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_filters_that_can_match_canonical_topics() {
        for f in ["gridlinks/devices/+/telemetry", "gridlinks/#", "#", "+/devices/pump/telemetry"] {
            assert!(may_match(f), "{f}");
        }
        let mounted = "$tenant/0b6c8a4e-7d3f-4c2a-9a47-3f0e8a1b2c3d/gridlinks/devices/+/telemetry";
        assert!(may_match(mounted));
        for f in ["apps/#", "gridlinks/devices/+/attributes", "$tenant/x/apps/#"] {
            assert!(!may_match(f), "{f}");
        }
    }

    #[test]
    fn names_become_one_topic_level() {
        assert_eq!(topic("pump 7"), "gridlinks/devices/pump 7/telemetry");
        assert_eq!(topic("a/b+#%"), "gridlinks/devices/a%2Fb%2B%23%25/telemetry");
    }
}
