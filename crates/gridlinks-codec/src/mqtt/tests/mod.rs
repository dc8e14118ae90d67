//! Codec unit tests on byte literals.
//!
//! - `roundtrip`: every packet type, 3.1.1 and 5, encode then decode equals; partial
//!   input; 3.x layouts dropping MQTT 5 fields.
//! - `vectors`: hand-written byte vectors following the specifications' examples.
//! - `malformed`: invalid input yields the right error and never panics.
//! - `random`: xorshift-driven random and mutated input never panics, and whatever
//!   decodes re-encodes to something that decodes equal (the fuzz target's property).

mod malformed;
mod random;
mod roundtrip;
mod vectors;

use bytes::{Bytes, BytesMut};

use super::*;

/// Generous limit for tests that are not about the size limit.
pub(super) const MAX: usize = 1 << 20;

pub(super) fn encode_to_vec(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(packet, version, &mut out).expect("encodes");
    out.to_vec()
}

/// Decodes exactly one packet that spans all of `bytes`.
pub(super) fn decode_one(bytes: &[u8], version: ProtocolVersion) -> Result<Packet, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    let packet = decode(&mut buf, version, MAX)?.expect("complete packet");
    assert!(buf.is_empty(), "decoder left {} bytes", buf.len());
    Ok(packet)
}

pub(super) fn decode_err(bytes: &[u8], version: ProtocolVersion) -> DecodeError {
    let mut buf = BytesMut::from(bytes);
    match decode(&mut buf, version, MAX) {
        Err(e) => e,
        Ok(other) => panic!("expected an error, got {other:?}"),
    }
}

pub(super) fn s(v: &str) -> String {
    v.to_owned()
}

pub(super) fn user_props() -> Vec<(String, String)> {
    vec![(s("region"), s("eu")), (s("region"), s("us")), (s("k"), s(""))]
}

/// A tiny xorshift64 PRNG, so random tests need no extra dependency and are
/// reproducible from their seed.
pub(super) struct XorShift(u64);

impl XorShift {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub(super) fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
}

/// One packet of every type with every 3.x field set (MQTT 5 fields left empty).
pub(super) fn v3_samples() -> Vec<Packet> {
    vec![
        Packet::Connect(Box::new(Connect {
            protocol: ProtocolVersion::V3_1_1,
            client_id: s("meter-17"),
            keep_alive: 60,
            clean_start: true,
            username: Some(s("device-token")),
            password: Some(Bytes::from_static(b"secret\x00\xff")),
            will: Some(LastWill {
                topic: s("v1/devices/me/status"),
                payload: Bytes::from_static(b"offline"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: PublishProperties::default(),
                delay_interval: None,
            }),
            properties: ConnectProperties::default(),
        })),
        Packet::ConnAck(ConnAck { session_present: true, code: 0, properties: ConnAckProperties::default() }),
        Packet::ConnAck(ConnAck {
            session_present: false,
            code: reason::V3_NOT_AUTHORIZED,
            properties: ConnAckProperties::default(),
        }),
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: s("v1/devices/me/telemetry"),
            packet_id: None,
            payload: Bytes::from_static(br#"{"temp":21.5}"#),
            properties: PublishProperties::default(),
        }),
        Packet::Publish(Publish {
            dup: true,
            qos: QoS::ExactlyOnce,
            retain: true,
            topic: s("a/b"),
            packet_id: Some(0xFFFF),
            payload: Bytes::new(),
            properties: PublishProperties::default(),
        }),
        Packet::PubAck(pub_resp_v3(1)),
        Packet::PubRec(pub_resp_v3(2)),
        Packet::PubRel(pub_resp_v3(3)),
        Packet::PubComp(pub_resp_v3(4)),
        Packet::Subscribe(Subscribe {
            packet_id: 10,
            filters: vec![
                SubscriptionRequest {
                    filter: s("v1/devices/me/rpc/request/+"),
                    qos: QoS::AtLeastOnce,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                },
                SubscriptionRequest {
                    filter: s("#"),
                    qos: QoS::ExactlyOnce,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                },
            ],
            subscription_identifier: None,
            user_properties: Vec::new(),
        }),
        Packet::SubAck(SubAck { packet_id: 10, return_codes: vec![1, 0x80, 0, 2], reason_string: None }),
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 11,
            filters: vec![s("a/#"), s("b")],
            user_properties: Vec::new(),
        }),
        Packet::UnsubAck(UnsubAck { packet_id: 11, reason_codes: Vec::new(), reason_string: None }),
        Packet::PingReq,
        Packet::PingResp,
        Packet::Disconnect(Disconnect {
            reason: 0,
            session_expiry_interval: None,
            reason_string: None,
            server_reference: None,
        }),
    ]
}

fn pub_resp_v3(packet_id: u16) -> PubResp {
    PubResp { packet_id, reason: 0, reason_string: None, user_properties: Vec::new() }
}

/// One or more packets of every type with MQTT 5 fields and properties set.
pub(super) fn v5_samples() -> Vec<Packet> {
    let publish_props = PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(3600),
        topic_alias: Some(7),
        response_topic: Some(s("reply/here")),
        correlation_data: Some(Bytes::from_static(&[0, 1, 2, 0xFF])),
        user_properties: user_props(),
        subscription_identifiers: vec![1, 127, 128, 268_435_455],
        content_type: Some(s("application/json")),
    };
    vec![
        Packet::Connect(Box::new(Connect {
            protocol: ProtocolVersion::V5,
            client_id: s(""),
            keep_alive: 0,
            clean_start: false,
            username: None,
            password: Some(Bytes::from_static(b"token-only")),
            will: Some(LastWill {
                topic: s("status/ünïcode"),
                payload: Bytes::from_static(b"gone"),
                qos: QoS::ExactlyOnce,
                retain: false,
                properties: PublishProperties {
                    topic_alias: None,
                    subscription_identifiers: Vec::new(),
                    ..publish_props.clone()
                },
                delay_interval: Some(30),
            }),
            properties: ConnectProperties {
                session_expiry_interval: Some(u32::MAX),
                receive_maximum: Some(100),
                maximum_packet_size: Some(65_536),
                topic_alias_maximum: Some(10),
                request_response_information: Some(1),
                request_problem_information: Some(0),
                user_properties: user_props(),
                authentication_method: Some(s("SCRAM-SHA-256")),
                authentication_data: Some(Bytes::from_static(b"client-first")),
            },
        })),
        Packet::Connect(Box::new(Connect {
            protocol: ProtocolVersion::V5,
            client_id: s("plain"),
            keep_alive: 30,
            clean_start: true,
            username: None,
            password: None,
            will: None,
            properties: ConnectProperties::default(),
        })),
        Packet::ConnAck(ConnAck {
            session_present: true,
            code: 0,
            properties: ConnAckProperties {
                session_expiry_interval: Some(0),
                receive_maximum: Some(1),
                maximum_qos: Some(1),
                retain_available: Some(0),
                maximum_packet_size: Some(1024),
                assigned_client_identifier: Some(s("auto-1234")),
                topic_alias_maximum: Some(0),
                reason_string: Some(s("welcome")),
                user_properties: user_props(),
                wildcard_subscription_available: Some(1),
                subscription_identifiers_available: Some(1),
                shared_subscription_available: Some(0),
                server_keep_alive: Some(45),
                response_information: Some(s("resp/")),
                server_reference: Some(s("other:1883")),
                authentication_method: Some(s("SCRAM-SHA-256")),
                authentication_data: Some(Bytes::from_static(b"server-final")),
            },
        }),
        Packet::ConnAck(ConnAck {
            session_present: false,
            code: reason::BAD_USER_NAME_OR_PASSWORD,
            properties: ConnAckProperties::default(),
        }),
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: true,
            topic: s("t"),
            packet_id: None,
            payload: Bytes::from_static(b"x"),
            properties: PublishProperties::default(),
        }),
        Packet::Publish(Publish {
            dup: true,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: s(""),
            packet_id: Some(42),
            payload: Bytes::from(vec![0xAB; 300]),
            properties: publish_props,
        }),
        Packet::PubAck(PubResp { packet_id: 42, reason: 0, reason_string: None, user_properties: Vec::new() }),
        Packet::PubAck(PubResp {
            packet_id: 43,
            reason: reason::NO_MATCHING_SUBSCRIBERS,
            reason_string: None,
            user_properties: Vec::new(),
        }),
        Packet::PubRec(PubResp {
            packet_id: 44,
            reason: reason::QUOTA_EXCEEDED,
            reason_string: Some(s("slow down")),
            user_properties: user_props(),
        }),
        Packet::PubRel(PubResp { packet_id: 45, reason: 0, reason_string: Some(s("ok")), user_properties: Vec::new() }),
        Packet::PubComp(PubResp {
            packet_id: 46,
            reason: reason::PACKET_IDENTIFIER_NOT_FOUND,
            reason_string: None,
            user_properties: Vec::new(),
        }),
        Packet::Subscribe(Subscribe {
            packet_id: 7,
            filters: vec![
                SubscriptionRequest {
                    filter: s("$share/g/sensors/+/temp"),
                    qos: QoS::AtLeastOnce,
                    no_local: false,
                    retain_as_published: true,
                    retain_handling: 2,
                },
                SubscriptionRequest {
                    filter: s("cmd/#"),
                    qos: QoS::AtMostOnce,
                    no_local: true,
                    retain_as_published: false,
                    retain_handling: 1,
                },
            ],
            subscription_identifier: Some(99_999),
            user_properties: user_props(),
        }),
        Packet::SubAck(SubAck {
            packet_id: 7,
            return_codes: vec![1, reason::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED],
            reason_string: Some(s("partly")),
        }),
        Packet::Unsubscribe(Unsubscribe { packet_id: 8, filters: vec![s("cmd/#")], user_properties: user_props() }),
        Packet::UnsubAck(UnsubAck {
            packet_id: 8,
            reason_codes: vec![0, reason::NO_SUBSCRIPTION_EXISTED],
            reason_string: Some(s("done")),
        }),
        Packet::PingReq,
        Packet::PingResp,
        Packet::Disconnect(Disconnect {
            reason: 0,
            session_expiry_interval: None,
            reason_string: None,
            server_reference: None,
        }),
        Packet::Disconnect(Disconnect {
            reason: reason::DISCONNECT_WITH_WILL_MESSAGE,
            session_expiry_interval: None,
            reason_string: None,
            server_reference: None,
        }),
        Packet::Disconnect(Disconnect {
            reason: reason::USE_ANOTHER_SERVER,
            session_expiry_interval: Some(60),
            reason_string: Some(s("maintenance")),
            server_reference: Some(s("b.example:1883")),
        }),
        Packet::Auth(Auth { reason: 0, method: None, data: None, reason_string: None }),
        Packet::Auth(Auth {
            reason: reason::CONTINUE_AUTHENTICATION,
            method: Some(s("SCRAM-SHA-256")),
            data: Some(Bytes::from_static(b"server-first")),
            reason_string: Some(s("step 2")),
        }),
    ]
}
