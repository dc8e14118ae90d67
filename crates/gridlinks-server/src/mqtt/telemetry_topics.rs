//! Canonical telemetry topics: device telemetry, once committed, is also published to
//! pub/sub clients on `gridlinks/devices/{deviceName}/telemetry`, so one subscription
//! `gridlinks/devices/+/telemetry` sees every device's data — never before it is durable.
//!
//! The payload is what was stored, in ThingsBoard's form with timestamps:
//! `[{"ts":1700000000000,"values":{"temperature":21.5}}]`. In the topic, the device name
//! is percent-encoded where it holds `/`, `+`, `#`, `%` or NUL, so it is always one level.
//!
//! Nothing is built while no client subscription overlaps the topics (one atomic read).

use std::sync::Arc;

use bytes::Bytes;
use gridlinks_broker::router::Message;
use gridlinks_storage::{StoreError, WriteOp};
use gridlinks_types::{DeviceId, TsRecord};
use serde_json::{json, Map};

use crate::app::AppState;

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

/// Commits the telemetry of each device (sharing group commits), then publishes it on the
/// canonical topics. Fails when any commit failed; nothing is published then.
pub async fn commit(st: &Arc<AppState>, batches: Vec<(DeviceId, Vec<TsRecord>)>) -> Result<(), StoreError> {
    let mut messages = Vec::new();
    if st.sessions.interested() {
        for (device, records) in &batches {
            if let Some(d) = st.store.device(*device)? {
                messages.push(Message::new(&topic(&d.name), 1, payload(records)));
            }
        }
    }
    let ops = batches.into_iter().map(|(device, records)| WriteOp::Telemetry { device, records }).collect();
    st.writer.submit_all(ops).await?;
    for msg in messages {
        // Copies for persistent sessions are committed too; full queues are waited for
        // as for client publishes.
        super::pubsub::deliver(st, "", &msg, false).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_one_topic_level() {
        assert_eq!(topic("pump 7"), "gridlinks/devices/pump 7/telemetry");
        assert_eq!(topic("a/b+#%"), "gridlinks/devices/a%2Fb%2B%23%25/telemetry");
    }
}
