//! The broker's stored rows, encoded and decoded in one place: the keys of durable queues
//! and unreleased QoS 2 ids, the value of a queued copy, a persistent session's record, and
//! a stored message (retained messages and queued copies hold one).
//! The storage layer keeps these rows as opaque bytes (`broker` keyspace); the server only
//! calls this module, never builds or splits a key itself.
//!
//! Versions. Layout 1 (today's): a queue value starts with the copy's QoS (1 or 2) or with
//! [`RELEASED`]; a session record is JSON with an optional `"version"` (1 when absent). A
//! later layout marks its queue values with a first byte from 0xF0 up (never a valid first
//! byte of layout 1) and its session records with a higher `"version"`; decoders refuse
//! layouts they do not know ([`RowError::Version`]) instead of misreading them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use gridlinks_codec::mqtt::{decode, encode, Packet, ProtocolVersion, Publish, QoS};

use crate::router::Message;
use serde::{Deserialize, Serialize};

/// The newest row layout this build writes and reads.
pub const ROW_VERSION: u32 = 1;

/// Why a stored row did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    /// Not a key or value of this table.
    #[error("malformed broker row: {0}")]
    Malformed(&'static str),
    /// Written by a newer layout.
    #[error("broker row of layout {0}; this build reads up to {ROW_VERSION}")]
    Version(u32),
}

/// Client ids are UTF-8 without U+0000 (MQTT 1.5.4), so 0 ends one in a key.
const END: u8 = 0;

/// The key prefix of everything keyed by `client` in the queue and incoming tables.
pub fn client_prefix(client: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(client.len() + 9);
    k.extend_from_slice(client.as_bytes());
    k.push(END);
    k
}

/// The key of copy `seq` in `client`'s durable queue: client ‖ 0 ‖ seq (8 bytes, BE).
pub fn queue_key(client: &str, seq: u64) -> Vec<u8> {
    let mut k = client_prefix(client);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The key of `client`'s unreleased QoS 2 id `packet_id`: client ‖ 0 ‖ id (2 bytes, BE).
pub fn incoming_key(client: &str, packet_id: u16) -> Vec<u8> {
    let mut k = client_prefix(client);
    k.extend_from_slice(&packet_id.to_be_bytes());
    k
}

/// Splits a key of `N` trailing bytes after the client id and its end marker.
fn split_key<const N: usize>(key: &[u8]) -> Result<(&str, [u8; N]), RowError> {
    let at = key.len().checked_sub(N + 1).filter(|&i| key[i] == END).ok_or(RowError::Malformed("key"))?;
    let client = std::str::from_utf8(&key[..at]).map_err(|_| RowError::Malformed("client id"))?;
    let tail = <[u8; N]>::try_from(&key[at + 1..]).map_err(|_| RowError::Malformed("key"))?;
    Ok((client, tail))
}

/// (client, seq) of a queue key.
pub fn parse_queue_key(key: &[u8]) -> Result<(&str, u64), RowError> {
    split_key::<8>(key).map(|(c, s)| (c, u64::from_be_bytes(s)))
}

/// (client, packet id) of an incoming key.
pub fn parse_incoming_key(key: &[u8]) -> Result<(&str, u16), RowError> {
    split_key::<2>(key).map(|(c, s)| (c, u16::from_be_bytes(s)))
}

/// The value of a durable QoS 2 copy once the client received it (PUBREC): only its PUBREL
/// is owed.
pub const RELEASED: u8 = 0x82;

/// A queued copy as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueValue<'a> {
    /// Waiting for delivery (or for its PUBACK/PUBREC): its QoS and the message as encoded
    /// by the server (an MQTT 5 PUBLISH).
    Copy(QoS, &'a [u8]),
    /// Received (PUBREC): only the PUBREL is owed.
    Released,
}

impl QueueValue<'_> {
    /// The stored bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Copy(qos, message) => {
                let mut v = Vec::with_capacity(message.len() + 1);
                v.push(u8::from(*qos));
                v.extend_from_slice(message);
                v
            }
            Self::Released => vec![RELEASED],
        }
    }

    /// Reads stored bytes back.
    pub fn decode(v: &[u8]) -> Result<QueueValue<'_>, RowError> {
        match v.split_first() {
            Some((&RELEASED, [])) => Ok(QueueValue::Released),
            // A queued copy is QoS 1 or 2 (0, never written, counts as 1, as it always did).
            Some((&q @ 0..=2, message)) => Ok(QueueValue::Copy(stored_qos(q.max(1)), message)),
            Some((&marker, _)) if marker >= 0xF0 => Err(RowError::Version(u32::from(marker - 0xF0) + 2)),
            _ => Err(RowError::Malformed("queue value")),
        }
    }
}

/// A QoS read back from a stored byte: 0 to 2 (a larger byte, never written, counts as 2).
pub fn stored_qos(byte: u8) -> QoS {
    match byte {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

/// A persistent session as stored (table `Sessions`, keyed by client id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    /// Row layout (absent in rows written before it was recorded: 1).
    #[serde(default = "layout_1")]
    pub version: u32,
    /// The application user owning the session ("" for anonymous).
    pub owner: String,
    /// Session expiry interval, seconds.
    pub expiry: u32,
    /// Its subscriptions.
    pub subscriptions: Vec<SubscriptionRecord>,
    /// When its last connection ended (ms since epoch); absent while connected.
    pub disconnected_at: Option<i64>,
    /// With several nodes: the node that holds it (only that node loads it at start; a
    /// client connecting elsewhere takes it over). Absent with one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
}

fn layout_1() -> u32 {
    1
}

/// One subscription of a stored session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionRecord {
    /// Topic filter.
    pub filter: String,
    /// Maximum QoS, 0 to 2.
    pub qos: u8,
    /// MQTT 5 No Local.
    pub no_local: bool,
    /// MQTT 5 Retain As Published.
    pub retain_as_published: bool,
    /// MQTT 5 Retain Handling.
    pub retain_handling: u8,
    /// MQTT 5 subscription identifier.
    pub subscription_id: Option<u32>,
}

impl SessionRecord {
    /// The stored bytes (JSON).
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain data cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads stored bytes back; a newer layout is refused.
    pub fn decode(v: &[u8]) -> Result<Self, RowError> {
        let rec: Self = serde_json::from_slice(v).map_err(|_| RowError::Malformed("session record"))?;
        if rec.version > ROW_VERSION {
            return Err(RowError::Version(rec.version));
        }
        Ok(rec)
    }
}

/// `msg` as stored (retained messages, queued copies) at `now_ms` (ms since epoch) /
/// `now`: the time, then the message as an MQTT 5 PUBLISH (its remaining expiry as the
/// Message Expiry Interval). `None` if it cannot be encoded (it was decoded from a valid
/// PUBLISH, so it can).
pub fn encode_message(msg: &Message, now_ms: i64, now: Instant) -> Option<Vec<u8>> {
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
    encode(&publish, ProtocolVersion::V5, &mut out).ok()?;
    Some(out.to_vec())
}

/// Seconds until `expires`, rounded up (MQTT 5 sends whole seconds).
pub fn remaining_secs(expires: Instant, now: Instant) -> u32 {
    let left = expires.saturating_duration_since(now);
    u32::try_from(left.as_secs() + u64::from(left.subsec_nanos() > 0)).unwrap_or(u32::MAX)
}

/// A message stored by [`encode_message`], read back at `now_ms` / `now`; `None` when it
/// expired meanwhile or does not decode.
pub fn decode_message(v: &[u8], now_ms: i64, now: Instant) -> Option<Message> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_foreign_keys_are_refused() {
        for client in ["", "c", "ünïcode/+#"] {
            assert_eq!(parse_queue_key(&queue_key(client, 42)), Ok((client, 42)));
            assert_eq!(parse_incoming_key(&incoming_key(client, 7)), Ok((client, 7)));
            assert!(queue_key(client, 1).starts_with(&client_prefix(client)));
        }
        assert!(parse_queue_key(&incoming_key("c", 7)).is_err());
        assert!(parse_incoming_key(b"no-marker").is_err());
        assert!(parse_queue_key(&[0xff, 0, 0, 0, 0, 0, 0, 0, 0, 1]).is_err(), "client id not UTF-8");
    }

    #[test]
    fn queue_values_round_trip_and_newer_layouts_are_refused() {
        let copy = QueueValue::Copy(QoS::ExactlyOnce, b"msg");
        assert_eq!(QueueValue::decode(&copy.encode()), Ok(copy));
        assert_eq!(QueueValue::decode(&QueueValue::Released.encode()), Ok(QueueValue::Released));
        // Rows written before: a QoS byte then the message.
        assert_eq!(QueueValue::decode(&[1, b'x']), Ok(QueueValue::Copy(QoS::AtLeastOnce, b"x")));
        assert_eq!(QueueValue::decode(&[0xF0, 1]), Err(RowError::Version(2)));
        assert!(QueueValue::decode(&[]).is_err());
    }

    #[test]
    fn session_records_read_rows_without_a_version_and_refuse_newer_ones() {
        let old = br#"{"owner":"app","expiry":60,"subscriptions":[],"disconnectedAt":null}"#;
        let rec = SessionRecord::decode(old).unwrap();
        assert_eq!((rec.version, rec.owner.as_str(), rec.expiry), (1, "app", 60));
        assert_eq!(SessionRecord::decode(&rec.encode()), Ok(rec));
        let newer = br#"{"version":2,"owner":"app","expiry":60,"subscriptions":[],"disconnectedAt":null}"#;
        assert_eq!(SessionRecord::decode(newer), Err(RowError::Version(2)));
    }
}

#[cfg(test)]
mod message_tests {
    use super::*;
    use gridlinks_codec::mqtt::PublishProperties;
    use std::sync::Arc;
    use std::time::Duration;

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
        let v = encode_message(&msg, 1_000_000, now).unwrap();
        // Loaded 30 s later: 70 s left.
        let back = decode_message(&v, 1_030_000, now).unwrap();
        assert_eq!((&*back.topic, &back.payload[..], back.qos), ("a/b", &b"on"[..], QoS::AtLeastOnce));
        assert_eq!(back.props, msg.props);
        assert_eq!(back.expires, Some(now + Duration::from_secs(70)));
        // Loaded after it expired: gone.
        assert!(decode_message(&v, 1_101_000, now).is_none());
        assert!(decode_message(b"short", 0, now).is_none());
    }
}
