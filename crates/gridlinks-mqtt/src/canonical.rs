//! Canonical telemetry topics: device telemetry, once committed, is also published to
//! pub/sub clients on `gridlinks/devices/{deviceName}/telemetry`, so one subscription
//! `gridlinks/devices/+/telemetry` sees every device's data — never before it is durable.
//! [`CanonicalTopics`] is the live sink (`gridlinks_platform::live`) that routes it, copies
//! for persistent sessions committed and full queues waited for, as for client publishes.
//!
//! The payload is what was stored, in ThingsBoard's form with timestamps:
//! `[{"ts":1700000000000,"values":{"temperature":21.5}}]`. In the topic, the device name
//! is percent-encoded where it holds `/`, `+`, `#`, `%` or NUL, so it is always one level.
//!
//! A device of a tenant other than the first is published in its tenant's namespace
//! (`gridlinks_platform::sessions::mount`), where only that tenant's clients subscribe:
//! device names are unique only within a tenant.

use std::sync::Arc;

use bytes::Bytes;
use gridlinks_broker::router::Message;
use gridlinks_broker::sessions::Sessions;
use gridlinks_broker::topic::filters_overlap;
use gridlinks_codec::mqtt::QoS;
use gridlinks_ingest::BoxFuture;
use gridlinks_platform::live::{LiveSink, FILTER};
use gridlinks_storage::{DeviceRecord, StoreError, WriterHandle};
use gridlinks_types::{AttributeScope, Ts, TsRecord, Value};
use serde_json::{json, Map};

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
        Some(t) => format!("{}{}", gridlinks_platform::sessions::mount(t), topic(&d.name)),
        None => topic(&d.name),
    };
    Message::new(&topic, QoS::AtLeastOnce, payload(records))
}

/// Whether shared subscription filter `filter` (without `$share/{group}/`, perhaps in a
/// tenant's namespace) can match a canonical topic.
pub fn may_match(filter: &str) -> bool {
    filters_overlap(filter, FILTER)
        || filters_overlap(filter, &format!("{}+/{FILTER}", gridlinks_platform::sessions::MOUNT_ROOT))
}

/// Routes committed telemetry onto the canonical topics.
pub struct CanonicalTopics {
    /// Live sessions and their subscriptions.
    pub sessions: Arc<Sessions>,
    /// For the durable copies of persistent sessions.
    pub writer: WriterHandle,
}

impl LiveSink for CanonicalTopics {
    fn wants_telemetry(&self) -> bool {
        self.sessions.interested()
    }
    fn wants_attributes(&self) -> bool {
        false
    }
    fn telemetry<'a>(
        &'a self,
        device: &'a DeviceRecord,
        _tenant: uuid::Uuid,
        records: &'a [TsRecord],
    ) -> Option<BoxFuture<'a, Result<(), StoreError>>> {
        // Another tenant's device is published in that tenant's namespace.
        let msg = message(device, records);
        let routing = super::pubsub::route_with(
            &self.sessions,
            &self.writer,
            "",
            &msg,
            false,
            None,
            super::pubsub::Retained::Store,
        );
        routing.pending.map(|p| p as BoxFuture<'a, _>)
    }
    fn attributes(&self, _: &DeviceRecord, _: uuid::Uuid, _: AttributeScope, _: &[(String, Value)], _: Ts) {}
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
