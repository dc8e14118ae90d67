//! The canonical telemetry topics as a live sink: committed device telemetry is routed to
//! the pub/sub clients subscribed to `gridlinks/devices/{deviceName}/telemetry` (names and
//! payload in `gridlinks_platform::live`), copies for persistent sessions committed and
//! full queues waited for, as for client publishes.

use std::sync::Arc;

use gridlinks_broker::sessions::Sessions;
use gridlinks_ingest::BoxFuture;
use gridlinks_platform::live::{self, LiveSink};
use gridlinks_storage::{DeviceRecord, StoreError, WriterHandle};
use gridlinks_types::{AttributeScope, Ts, TsRecord, Value};

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
        let msg = live::message(device, records);
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
