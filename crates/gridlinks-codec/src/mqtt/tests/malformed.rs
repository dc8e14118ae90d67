//! Invalid input: each case must be the expected error, never a panic.

use bytes::{Bytes, BytesMut};

use super::*;

const V3_1: ProtocolVersion = ProtocolVersion::V3_1;
const V311: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

fn malformed(bytes: &[u8], version: ProtocolVersion) {
    match decode_err(bytes, version) {
        DecodeError::Malformed(_) => {}
        other => panic!("{bytes:02x?}: expected Malformed, got {other:?}"),
    }
}

fn protocol(bytes: &[u8], version: ProtocolVersion) {
    match decode_err(bytes, version) {
        DecodeError::Protocol(_) => {}
        other => panic!("{bytes:02x?}: expected Protocol, got {other:?}"),
    }
}

#[test]
fn oversize_remaining_length_is_rejected_from_the_first_five_bytes() {
    // Only the fixed header is present; the body is never waited for.
    let mut buf = BytesMut::from(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F][..]);
    assert_eq!(decode(&mut buf, V311, 1024), Err(DecodeError::PacketTooLarge { size: 268_435_455 + 5, max: 1024 }));
    assert_eq!(buf.len(), 5, "nothing consumed");
    // Two bytes suffice for a small limit.
    let mut buf = BytesMut::from(&[0x30, 0x7F][..]);
    assert_eq!(decode(&mut buf, V5, 100), Err(DecodeError::PacketTooLarge { size: 129, max: 100 }));
}

#[test]
fn remaining_length_longer_than_four_bytes() {
    malformed(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], V311);
    // Known to be too long as soon as the fourth length byte has its continuation bit.
    malformed(&[0x30, 0x80, 0x80, 0x80, 0x80], V5);
    let mut buf = BytesMut::from(&[0x30, 0x80, 0x80, 0x80][..]);
    assert_eq!(decode(&mut buf, V5, MAX), Ok(None));
}

#[test]
fn non_minimal_varints_are_malformed_in_v5_only() {
    malformed(&[0xC0, 0x80, 0x00], V5);
    assert_eq!(decode_one(&[0xC0, 0x80, 0x00], V311), Ok(Packet::PingReq));
    // Subscription identifier 5 encoded in two bytes.
    malformed(&[0x82, 0x0A, 0x00, 0x01, 0x03, 0x0B, 0x85, 0x00, 0x00, 0x01, b'a', 0x00], V5);
}

#[test]
fn bad_fixed_header_flags() {
    malformed(&[0x80, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x00], V311); // SUBSCRIBE flags 0
    malformed(&[0xA0, 0x05, 0x00, 0x01, 0x00, 0x01, b'a'], V311); // UNSUBSCRIBE flags 0
    malformed(&[0x60, 0x02, 0x00, 0x01], V311); // PUBREL flags 0
    malformed(&[0x63, 0x02, 0x00, 0x01], V5); // PUBREL flags 3
    malformed(&[0x41, 0x02, 0x00, 0x01], V311); // PUBACK flags 1
    malformed(&[0x12, 0x00], V311); // CONNECT flags 2
    malformed(&[0xC1, 0x00], V311); // PINGREQ flags 1
    malformed(&[0xE8, 0x00], V5); // DISCONNECT flags 8
    malformed(&[0x36, 0x03, 0x00, 0x01, b'a'], V311); // PUBLISH QoS 3
    malformed(&[0x38, 0x03, 0x00, 0x01, b'a'], V311); // PUBLISH QoS 0 with DUP
    malformed(&[0x00, 0x00], V5); // reserved type 0
    malformed(&[0xF0, 0x00], V311); // AUTH before MQTT 5
                                    // Rejected on the first byte, before the length is known.
    malformed(&[0x80], V311);
    // MQTT 3.1 allowed DUP on SUBSCRIBE retransmissions.
    assert!(decode_one(&[0x8A, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x00], V3_1).is_ok());
    malformed(&[0x8A, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x00], V311);
}

#[test]
fn invalid_strings() {
    malformed(&[0x30, 0x05, 0x00, 0x02, 0xC3, 0x28, b'x'], V311); // invalid UTF-8
    malformed(&[0x30, 0x04, 0x00, 0x02, 0xED, 0xA0], V311); // truncated sequence
    malformed(&[0x30, 0x05, 0x00, 0x03, 0xED, 0xA0, 0x80], V311); // UTF-16 surrogate
    malformed(&[0x30, 0x04, 0x00, 0x02, b'a', 0x00], V311); // U+0000
    malformed(&[0x30, 0x04, 0x00, 0x05, b'a', b'b'], V311); // length past the end
                                                            // Invalid UTF-8 in a SUBSCRIBE filter and in a user property.
    malformed(&[0x82, 0x06, 0x00, 0x01, 0x00, 0x01, 0xFF, 0x00], V311);
    #[rustfmt::skip]
    malformed(
        &[0x40, 0x0B, 0x00, 0x01, 0x00, 0x07, 0x26, 0x00, 0x01, 0xFF, 0x00, 0x01, b'v'],
        V5,
    );
    // Client id with U+0000.
    #[rustfmt::skip]
    malformed(
        &[0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, 0x02, 0x00, 0x00, 0x00, 0x01, 0x00],
        V311,
    );
}

#[test]
fn wildcards_and_empty_topic_names() {
    protocol(&[0x30, 0x05, 0x00, 0x03, b'a', b'/', b'+'], V311);
    protocol(&[0x30, 0x06, 0x00, 0x03, b'a', b'/', b'#', 0x00], V5);
    protocol(&[0x30, 0x02, 0x00, 0x00], V311);
    protocol(&[0x30, 0x03, 0x00, 0x00, 0x00], V5); // empty topic, no alias
                                                   // Empty topic with an alias is fine in v5.
    assert!(decode_one(&[0x30, 0x06, 0x00, 0x00, 0x03, 0x23, 0x00, 0x01], V5).is_ok());
    protocol(&[0x30, 0x06, 0x00, 0x00, 0x03, 0x23, 0x00, 0x00], V5); // alias 0
                                                                     // Will topic with a wildcard.
    #[rustfmt::skip]
    protocol(
        &[
            0x10, 0x12, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, 0x06, 0x00, 0x00,
            0x00, 0x01, b'c', 0x00, 0x01, b'#', 0x00, 0x00,
        ],
        V311,
    );
}

#[test]
fn packet_id_zero() {
    protocol(&[0x32, 0x05, 0x00, 0x01, b'a', 0x00, 0x00], V311);
    protocol(&[0x40, 0x02, 0x00, 0x00], V311);
    protocol(&[0x62, 0x02, 0x00, 0x00], V5);
    protocol(&[0x82, 0x06, 0x00, 0x00, 0x00, 0x01, b'a', 0x00], V311);
    protocol(&[0x90, 0x03, 0x00, 0x00, 0x00], V311);
    protocol(&[0xA2, 0x05, 0x00, 0x00, 0x00, 0x01, b'a'], V311);
    protocol(&[0xB0, 0x02, 0x00, 0x00], V311);
}

#[test]
fn v5_properties() {
    // Unknown identifier 0x05, and a multi-byte identifier.
    malformed(&[0x30, 0x06, 0x00, 0x01, b'a', 0x02, 0x05, 0x00], V5);
    malformed(&[0x30, 0x06, 0x00, 0x01, b'a', 0x02, 0x80, 0x01], V5);
    // Session Expiry Interval is not a PUBLISH property.
    malformed(&[0x30, 0x09, 0x00, 0x01, b'a', 0x05, 0x11, 0, 0, 0, 1], V5);
    // Will Delay Interval is a will property, not a CONNECT property.
    #[rustfmt::skip]
    malformed(
        &[0x10, 0x12, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x00,
          0x05, 0x18, 0, 0, 0, 1, 0x00, 0x00],
        V5,
    );
    // Topic alias twice.
    protocol(&[0x30, 0x0A, 0x00, 0x01, b'a', 0x06, 0x23, 0, 1, 0x23, 0, 2], V5);
    // Subscription identifier twice is fine in PUBLISH, not in SUBSCRIBE.
    assert!(decode_one(&[0x30, 0x08, 0x00, 0x01, b'a', 0x04, 0x0B, 1, 0x0B, 2], V5).is_ok());
    protocol(&[0x82, 0x0B, 0x00, 0x01, 0x04, 0x0B, 1, 0x0B, 2, 0x00, 0x01, b'a', 0x00], V5);
    // Subscription identifier 0.
    protocol(&[0x30, 0x06, 0x00, 0x01, b'a', 0x02, 0x0B, 0x00], V5);
    // Payload format indicator 2, receive maximum 0, maximum packet size 0.
    protocol(&[0x30, 0x06, 0x00, 0x01, b'a', 0x02, 0x01, 0x02], V5);
    protocol(&[0x20, 0x06, 0x00, 0x00, 0x03, 0x21, 0x00, 0x00], V5);
    protocol(&[0x20, 0x08, 0x00, 0x00, 0x05, 0x27, 0, 0, 0, 0], V5);
    // Authentication data without a method.
    protocol(&[0xF0, 0x06, 0x18, 0x04, 0x16, 0x00, 0x01, b'x'], V5);
    // Property length past the end of the packet, and a property cut short.
    malformed(&[0x30, 0x05, 0x00, 0x01, b'a', 0x09, 0x01], V5);
    malformed(&[0x30, 0x06, 0x00, 0x01, b'a', 0x02, 0x23, 0x00], V5);
    // Response topic with a wildcard.
    protocol(&[0x30, 0x09, 0x00, 0x01, b'a', 0x05, 0x08, 0x00, 0x02, b'a', b'+'], V5);
}

#[test]
fn connect_rules() {
    let connect = |flags: u8, tail: &[u8]| {
        let mut v = vec![0x10, 0];
        v.extend_from_slice(&[0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, flags, 0x00, 0x3C]);
        v.extend_from_slice(&[0x00, 0x01, b'c']);
        v.extend_from_slice(tail);
        v[1] = (v.len() - 2) as u8;
        v
    };
    assert!(decode_one(&connect(0x02, &[]), V311).is_ok());
    malformed(&connect(0x03, &[]), V311); // reserved flag
    malformed(&connect(0x08, &[]), V311); // will QoS without will flag
    malformed(&connect(0x20, &[]), V311); // will retain without will flag
    malformed(&connect(0x1C, &[0, 1, b't', 0, 0]), V311); // will QoS 3
    protocol(&connect(0x42, &[0x00, 0x01, b'p']), V311); // password without user name
    malformed(&connect(0x82, &[]), V311); // user name flag, no user name
    malformed(&connect(0x02, &[0xFF]), V311); // trailing byte
                                              // Password without user name is allowed in v5.
    let mut v5 = connect(0x42, &[0x00, 0x01, b'p']);
    v5[8] = 5;
    v5.insert(12, 0); // empty property block
    v5[1] += 1;
    assert!(decode_one(&v5, V5).is_ok());
}

#[test]
fn unsupported_protocols() {
    let connect = |name: &[u8], level: u8| {
        let mut v = vec![0x10, 0, 0x00, name.len() as u8];
        v.extend_from_slice(name);
        v.extend_from_slice(&[level, 0x02, 0x00, 0x3C, 0x00, 0x01, b'c']);
        v[1] = (v.len() - 2) as u8;
        v
    };
    for (name, level) in [(&b"MQTT"[..], 6u8), (b"MQTT", 3), (b"MQIsdp", 4), (b"HTTP", 4), (b"\xFF", 4)] {
        match decode_err(&connect(name, level), V311) {
            DecodeError::UnsupportedProtocol { name: got, level: l } => {
                assert_eq!(got, String::from_utf8_lossy(name));
                assert_eq!(l, level);
            }
            other => panic!("expected UnsupportedProtocol, got {other:?}"),
        }
    }
}

#[test]
fn subscribe_rules() {
    protocol(&[0x82, 0x02, 0x00, 0x01], V311); // no filters
    protocol(&[0x82, 0x03, 0x00, 0x01, 0x00], V5); // no filters
    malformed(&[0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x04], V311); // reserved bit (no local in 3.x)
    malformed(&[0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x03], V311); // QoS 3
    malformed(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x40], V5); // reserved bit 6
    malformed(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x80], V5); // reserved bit 7
    protocol(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x30], V5); // retain handling 3
    malformed(&[0x82, 0x05, 0x00, 0x01, 0x00, 0x01, b'a'], V311); // missing options byte
    protocol(&[0xA2, 0x02, 0x00, 0x01], V311); // UNSUBSCRIBE without filters
}

#[test]
fn reason_and_return_codes() {
    protocol(&[0x20, 0x02, 0x00, 0x06], V311); // CONNACK return code 6
    protocol(&[0x20, 0x03, 0x00, 0x01, 0x00], V5); // 0x01 is not a v5 CONNACK reason
    malformed(&[0x20, 0x02, 0x02, 0x00], V311); // CONNACK reserved flag
    malformed(&[0x20, 0x02, 0x00, 0x00], V5); // v5 CONNACK without property length
    protocol(&[0x40, 0x03, 0x00, 0x01, 0x05], V5); // PUBACK reason 0x05
    protocol(&[0x70, 0x03, 0x00, 0x01, 0x10], V5); // 0x10 not valid in PUBCOMP
    protocol(&[0x90, 0x03, 0x00, 0x01, 0x03], V311); // SUBACK code 3
    protocol(&[0x90, 0x04, 0x00, 0x01, 0x00, 0x9E], V311); // v5-only SUBACK code in 3.1.1
    protocol(&[0x90, 0x02, 0x00, 0x01], V311); // SUBACK without codes
    protocol(&[0xB0, 0x03, 0x00, 0x01, 0x00], V5); // UNSUBACK without codes
    protocol(&[0xE0, 0x01, 0x01], V5); // DISCONNECT reason 0x01
    protocol(&[0xF0, 0x01, 0x01], V5); // AUTH reason 0x01
}

#[test]
fn wrong_lengths() {
    malformed(&[0xC0, 0x01, 0x00], V311); // PINGREQ with a body
    malformed(&[0xD0, 0x01, 0x00], V5);
    malformed(&[0x40, 0x03, 0x00, 0x01, 0x00], V311); // v3 PUBACK is exactly 2 bytes
    malformed(&[0x40, 0x01, 0x00], V5); // shorter than a packet id
    malformed(&[0xB0, 0x03, 0x00, 0x01, 0x00], V311); // v3 UNSUBACK is exactly 2 bytes
    malformed(&[0xE0, 0x01, 0x00], V311); // v3 DISCONNECT has no body
    malformed(&[0x20, 0x03, 0x00, 0x00, 0x00], V311); // v3 CONNACK is exactly 2 bytes
    malformed(&[0x10, 0x00], V311); // empty CONNECT
}

#[test]
fn encode_refuses_invalid_packets() {
    let publish = |qos, packet_id, topic: &str| {
        Packet::Publish(Publish {
            dup: false,
            qos,
            retain: false,
            topic: s(topic),
            packet_id,
            payload: Bytes::new(),
            properties: PublishProperties::default(),
        })
    };
    let cases: Vec<(Packet, ProtocolVersion, EncodeError)> = vec![
        (publish(QoS::AtLeastOnce, None, "a"), V311, EncodeError::InvalidPacket("QoS > 0 PUBLISH without packet id")),
        (publish(QoS::AtMostOnce, Some(1), "a"), V5, EncodeError::InvalidPacket("QoS 0 PUBLISH with packet id")),
        (publish(QoS::ExactlyOnce, Some(0), "a"), V5, EncodeError::InvalidPacket("packet identifier 0")),
        (publish(QoS::AtMostOnce, None, "a/#"), V311, EncodeError::InvalidPacket("wildcard in PUBLISH topic name")),
        (publish(QoS::AtMostOnce, None, ""), V5, EncodeError::InvalidPacket("empty topic name without topic alias")),
        (publish(QoS::AtMostOnce, None, &"x".repeat(65_536)), V311, EncodeError::StringTooLong),
        (
            Packet::Auth(Auth { reason: 0, method: None, data: None, reason_string: None }),
            V311,
            EncodeError::InvalidPacketForVersion("AUTH exists only in MQTT 5"),
        ),
        (
            Packet::PubAck(PubResp { packet_id: 1, reason: 0x92, reason_string: None, user_properties: Vec::new() }),
            V5,
            EncodeError::InvalidReasonCode { packet: "PUBACK/PUBREC", code: 0x92 },
        ),
        (
            Packet::SubAck(SubAck { packet_id: 1, return_codes: vec![0x9E], reason_string: None }),
            V311,
            EncodeError::InvalidReasonCode { packet: "SUBACK", code: 0x9E },
        ),
        (
            Packet::Subscribe(Subscribe {
                packet_id: 1,
                filters: Vec::new(),
                subscription_identifier: None,
                user_properties: Vec::new(),
            }),
            V5,
            EncodeError::InvalidPacket("SUBSCRIBE without topic filters"),
        ),
        (
            Packet::Connect(Box::new(Connect {
                protocol: V311,
                client_id: s("c"),
                keep_alive: 0,
                clean_start: true,
                username: None,
                password: Some(Bytes::from_static(b"p")),
                will: None,
                properties: ConnectProperties::default(),
            })),
            V311,
            EncodeError::InvalidPacketForVersion("password without user name needs MQTT 5"),
        ),
        (
            Packet::Connect(Box::new(Connect {
                protocol: V5,
                client_id: s("c"),
                keep_alive: 0,
                clean_start: true,
                username: None,
                password: Some(Bytes::from(vec![0; 65_536])),
                will: None,
                properties: ConnectProperties::default(),
            })),
            V5,
            EncodeError::BinaryTooLong,
        ),
        (
            Packet::ConnAck(ConnAck {
                session_present: false,
                code: 0,
                properties: ConnAckProperties {
                    authentication_data: Some(Bytes::from_static(b"x")),
                    ..Default::default()
                },
            }),
            V5,
            EncodeError::InvalidPacket("authentication data without authentication method"),
        ),
    ];
    for (packet, version, expected) in cases {
        let mut out = BytesMut::from(&b"keep"[..]);
        assert_eq!(encode(&packet, version, &mut out), Err(expected), "{}", packet.name());
        assert_eq!(&out[..], b"keep", "output touched on error");
    }
}

#[test]
fn debug_redacts_secrets_and_payloads() {
    let text = format!("{:?}", v5_samples());
    for secret in ["token-only", "client-first", "server-final", "server-first", "gone"] {
        assert!(!text.contains(secret), "{secret} leaked");
    }
    assert!(text.contains("<REDACTED"));
}
