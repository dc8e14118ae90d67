//! Retained messages on disk (and the stored form of a message, which durable session
//! queues use too): one row per topic in the broker's `Retained` table, written
//! through the group-commit writer before the publisher's acknowledgement, and loaded into
//! the router at start-up.
//!
//! A row is a message as `gridlinks_broker::persist` stores it (the time it was stored, then
//! the message as an MQTT 5 PUBLISH, so its properties survive too; the remaining expiry is
//! computed from the stored time when it is loaded).

use std::time::Instant;

use gridlinks_broker::persist;
use gridlinks_broker::router::Message;
use gridlinks_broker::sessions::Sessions;
use gridlinks_storage::{BrokerRow, BrokerTable, Store, StoreError};
use gridlinks_types::Ts;

/// The row that stores `msg` as its topic's retained message (an empty payload deletes it).
pub fn row(msg: &Message) -> BrokerRow {
    let value = (!msg.payload.is_empty()).then(|| encode_message(msg));
    BrokerRow { table: BrokerTable::Retained, key: msg.topic.as_bytes().to_vec(), value }
}

/// `msg` as stored (retained messages, durable session queues).
pub fn encode_message(msg: &Message) -> Vec<u8> {
    persist::encode_message(msg, Ts::now().0, Instant::now()).unwrap_or_else(|| {
        gridlinks_platform::logging::error_limited!(topic = %msg.topic, "cannot encode a stored message");
        Vec::new()
    })
}

pub use persist::remaining_secs;

/// A stored message; `None` when it expired meanwhile or does not decode.
pub fn decode_message(v: &[u8]) -> Option<Message> {
    persist::decode_message(v, Ts::now().0, Instant::now())
}

/// Loads the stored retained messages into the router; returns how many (expired ones
/// and rows that do not decode are skipped).
pub fn load(store: &Store, sessions: &Sessions) -> Result<usize, StoreError> {
    let mut n = 0;
    for (key, v) in store.broker_rows(BrokerTable::Retained)? {
        match decode_message(&v) {
            Some(msg) => {
                sessions.publish("", &msg, true);
                n += 1;
            }
            None => {
                tracing::debug!(topic = %String::from_utf8_lossy(&key), "skipping an expired or unreadable retained message")
            }
        }
    }
    Ok(n)
}
