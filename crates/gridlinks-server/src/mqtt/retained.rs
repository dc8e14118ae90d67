//! Retained messages on disk (and the stored form of a message, which durable session
//! queues use too): one row per topic in the broker's `Retained` table, written
//! through the group-commit writer before the publisher's acknowledgement, and loaded into
//! the router at start-up.
//!
//! A row is the time it was stored (ms since epoch, 8 bytes big-endian) followed by the
//! message encoded as an MQTT 5 PUBLISH, so its properties survive too; the remaining
//! message expiry is computed from the stored time when it is loaded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use gridlinks_broker::router::Message;
use gridlinks_broker::sessions::Sessions;
use gridlinks_codec::mqtt::{decode, encode, Packet, ProtocolVersion, Publish, QoS};
use gridlinks_storage::{BrokerRow, BrokerTable, Store, StoreError};
use gridlinks_types::Ts;

/// The row that stores `msg` as its topic's retained message (an empty payload deletes it).
pub fn row(msg: &Message) -> BrokerRow {
    let value = (!msg.payload.is_empty()).then(|| encode_message(msg));
    BrokerRow { table: BrokerTable::Retained, key: msg.topic.as_bytes().to_vec(), value }
}

/// `msg` as stored (retained messages, durable session queues).
pub fn encode_message(msg: &Message) -> Vec<u8> {
    encode_row(msg, Ts::now().0, Instant::now())
}

fn encode_row(msg: &Message, now_ms: i64, now: Instant) -> Vec<u8> {
    let mut properties = msg.props.as_deref().cloned().unwrap_or_default();
    properties.message_expiry_interval = msg.expires.map(|e| remaining_secs(e, now));
    let publish = Packet::Publish(Publish {
        dup: false,
        qos: msg.qos,
        retain: true,
        topic: msg.topic.to_string(),
        packet_id: (msg.qos > QoS::AtMostOnce).then_some(1),
        payload: msg.payload.clone(),
        properties,
    });
    let mut out = BytesMut::from(&now_ms.to_be_bytes()[..]);
    // Cannot fail: the message was decoded from a valid PUBLISH.
    if encode(&publish, ProtocolVersion::V5, &mut out).is_err() {
        crate::logging::error_limited!(topic = %msg.topic, "cannot encode a retained message");
    }
    out.to_vec()
}

/// Seconds until `expires`, rounded up (MQTT 5 sends whole seconds).
pub fn remaining_secs(expires: Instant, now: Instant) -> u32 {
    let left = expires.saturating_duration_since(now);
    u32::try_from(left.as_secs() + u64::from(left.subsec_nanos() > 0)).unwrap_or(u32::MAX)
}

/// A stored message; `None` when it expired meanwhile or does not decode.
pub fn decode_message(v: &[u8]) -> Option<Message> {
    decode_row(v, Ts::now().0, Instant::now())
}

fn decode_row(v: &[u8], now_ms: i64, now: Instant) -> Option<Message> {
    let stored_ms = i64::from_be_bytes(v.get(..8)?.try_into().ok()?);
    let mut buf = BytesMut::from(&v[8..]);
    let Ok(Some(Packet::Publish(p))) = decode(&mut buf, ProtocolVersion::V5, usize::MAX) else {
        return None;
    };
    let mut props = p.properties;
    let expires = match props.message_expiry_interval.take() {
        Some(secs) => {
            let left = i64::from(secs) * 1000 - (now_ms - stored_ms);
            if left <= 0 {
                return None;
            }
            Some(now + Duration::from_millis(left.unsigned_abs()))
        }
        None => None,
    };
    let has_props = !props.is_empty();
    Some(Message {
        topic: p.topic.into(),
        payload: p.payload,
        qos: p.qos,
        props: has_props.then(|| Arc::new(props)),
        expires,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use gridlinks_codec::mqtt::PublishProperties;

    #[test]
    fn rows_round_trip_with_properties_and_the_remaining_expiry() {
        let now = Instant::now();
        let props = PublishProperties {
            content_type: Some("text/plain".into()),
            user_properties: vec![("k".into(), "v".into())],
            ..Default::default()
        };
        let msg = Message {
            topic: "a/b".into(),
            payload: bytes::Bytes::from_static(b"on"),
            qos: QoS::AtLeastOnce,
            props: Some(Arc::new(props)),
            expires: Some(now + Duration::from_secs(100)),
        };
        let v = encode_row(&msg, 1_000_000, now);
        // Loaded 30 s later: 70 s left.
        let back = decode_row(&v, 1_030_000, now).unwrap();
        assert_eq!((&*back.topic, &back.payload[..], back.qos), ("a/b", &b"on"[..], QoS::AtLeastOnce));
        assert_eq!(back.props, msg.props);
        assert_eq!(back.expires, Some(now + Duration::from_secs(70)));
        // Loaded after it expired: gone.
        assert!(decode_row(&v, 1_101_000, now).is_none());
        assert!(decode_row(b"short", 0, now).is_none());
    }
}
