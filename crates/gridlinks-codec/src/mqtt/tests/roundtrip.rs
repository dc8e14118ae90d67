use std::collections::BTreeSet;

use bytes::{Bytes, BytesMut};

use super::*;

fn assert_roundtrip(samples: &[Packet], version: ProtocolVersion) {
    for packet in samples {
        let bytes = encode_to_vec(packet, version);
        let decoded = decode_one(&bytes, version).unwrap_or_else(|e| panic!("{} in {version:?}: {e}", packet.name()));
        assert_eq!(&decoded, packet, "{version:?}");
    }
}

fn names(samples: &[Packet]) -> BTreeSet<&'static str> {
    samples.iter().map(Packet::name).collect()
}

#[test]
fn every_packet_type_roundtrips_in_v3_1_1() {
    let samples = v3_samples();
    assert_eq!(names(&samples).len(), 14, "all types but AUTH");
    assert_roundtrip(&samples, ProtocolVersion::V3_1_1);
}

#[test]
fn every_packet_type_roundtrips_in_v5() {
    let samples = v5_samples();
    assert_eq!(names(&samples).len(), 15, "all types");
    assert_roundtrip(&samples, ProtocolVersion::V5);
}

#[test]
fn every_packet_type_roundtrips_in_v3_1() {
    let samples: Vec<Packet> = v3_samples()
        .into_iter()
        .map(|p| match p {
            Packet::Connect(mut c) => {
                c.protocol = ProtocolVersion::V3_1;
                Packet::Connect(c)
            }
            other => other,
        })
        .collect();
    assert_roundtrip(&samples, ProtocolVersion::V3_1);
    let connect = encode_to_vec(&samples[0], ProtocolVersion::V3_1);
    assert_eq!(&connect[2..11], b"\x00\x06MQIsdp\x03");
}

#[test]
fn consecutive_packets_decode_in_order() {
    for (version, samples) in [(ProtocolVersion::V3_1_1, v3_samples()), (ProtocolVersion::V5, v5_samples())] {
        let mut buf = BytesMut::new();
        for p in &samples {
            encode(p, version, &mut buf).expect("encodes");
        }
        for expected in &samples {
            let got = decode(&mut buf, version, MAX).expect("valid").expect("complete");
            assert_eq!(&got, expected);
        }
        assert!(buf.is_empty());
        assert_eq!(decode(&mut buf, version, MAX), Ok(None));
    }
}

#[test]
fn every_prefix_needs_more_bytes_and_leaves_buf_untouched() {
    for (version, samples) in [(ProtocolVersion::V3_1_1, v3_samples()), (ProtocolVersion::V5, v5_samples())] {
        for packet in &samples {
            let bytes = encode_to_vec(packet, version);
            for cut in 0..bytes.len() {
                let mut buf = BytesMut::from(&bytes[..cut]);
                assert_eq!(decode(&mut buf, version, MAX), Ok(None), "{} cut at {cut}", packet.name());
                assert_eq!(&buf[..], &bytes[..cut], "buffer changed");
            }
        }
    }
}

#[test]
fn connect_carries_its_own_version() {
    // A v5 CONNECT decodes as v5 even when the connection is assumed 3.1.1, and a
    // 3.1.1 CONNECT as 3.1.1 when v5 is assumed.
    for packet in [&v5_samples()[0], &v3_samples()[0]] {
        let bytes = encode_to_vec(packet, ProtocolVersion::V3_1_1);
        for assumed in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
            assert_eq!(&decode_one(&bytes, assumed).expect("valid"), packet);
        }
    }
}

#[test]
fn v5_fields_are_dropped_in_v3_layouts() {
    let v3 = ProtocolVersion::V3_1_1;
    let ack = PubResp {
        packet_id: 5,
        reason: reason::NO_MATCHING_SUBSCRIBERS,
        reason_string: Some(s("why")),
        user_properties: user_props(),
    };
    assert_eq!(encode_to_vec(&Packet::PubAck(ack.clone()), v3), [0x40, 2, 0, 5]);
    assert_eq!(encode_to_vec(&Packet::PubRel(ack), v3), [0x62, 2, 0, 5]);

    let connack = Packet::ConnAck(ConnAck {
        session_present: true,
        code: 0,
        properties: ConnAckProperties { reason_string: Some(s("dropped")), ..Default::default() },
    });
    assert_eq!(encode_to_vec(&connack, v3), [0x20, 2, 1, 0]);

    let unsuback =
        Packet::UnsubAck(UnsubAck { packet_id: 9, reason_codes: vec![0, 0x11], reason_string: Some(s("dropped")) });
    assert_eq!(encode_to_vec(&unsuback, v3), [0xB0, 2, 0, 9]);

    let suback =
        Packet::SubAck(SubAck { packet_id: 9, return_codes: vec![0, 1, 2, 0x80], reason_string: Some(s("dropped")) });
    assert_eq!(encode_to_vec(&suback, v3), [0x90, 6, 0, 9, 0, 1, 2, 0x80]);

    let disconnect = Packet::Disconnect(Disconnect {
        reason: reason::DISCONNECT_WITH_WILL_MESSAGE,
        session_expiry_interval: Some(1),
        reason_string: Some(s("dropped")),
        server_reference: None,
    });
    assert_eq!(encode_to_vec(&disconnect, v3), [0xE0, 0]);

    let publish = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: s("a"),
        packet_id: None,
        payload: Bytes::from_static(b"p"),
        properties: PublishProperties { message_expiry_interval: Some(5), ..Default::default() },
    });
    assert_eq!(encode_to_vec(&publish, v3), [0x30, 4, 0, 1, b'a', b'p']);

    let subscribe = Packet::Subscribe(Subscribe {
        packet_id: 3,
        filters: vec![SubscriptionRequest {
            filter: s("a"),
            qos: QoS::AtLeastOnce,
            no_local: true,
            retain_as_published: true,
            retain_handling: 2,
        }],
        subscription_identifier: Some(4),
        user_properties: user_props(),
    });
    assert_eq!(encode_to_vec(&subscribe, v3), [0x82, 6, 0, 3, 0, 1, b'a', 1]);
}

#[test]
fn v5_short_forms_are_used_when_possible() {
    let v5 = ProtocolVersion::V5;
    let ack = |reason, reason_string: Option<&str>| PubResp {
        packet_id: 0x0102,
        reason,
        reason_string: reason_string.map(s),
        user_properties: Vec::new(),
    };
    assert_eq!(encode_to_vec(&Packet::PubAck(ack(0, None)), v5), [0x40, 2, 1, 2]);
    assert_eq!(encode_to_vec(&Packet::PubRec(ack(0x10, None)), v5), [0x50, 3, 1, 2, 0x10]);
    assert_eq!(encode_to_vec(&Packet::PubComp(ack(0, Some("k"))), v5), [0x70, 8, 1, 2, 0, 4, 0x1F, 0, 1, b'k']);
    let disconnect =
        |reason| Disconnect { reason, session_expiry_interval: None, reason_string: None, server_reference: None };
    assert_eq!(encode_to_vec(&Packet::Disconnect(disconnect(0)), v5), [0xE0, 0]);
    assert_eq!(encode_to_vec(&Packet::Disconnect(disconnect(0x8E)), v5), [0xE0, 1, 0x8E]);
    let auth = Auth { reason: 0, method: None, data: None, reason_string: None };
    assert_eq!(encode_to_vec(&Packet::Auth(auth), v5), [0xF0, 0]);
}

#[test]
fn payload_is_a_zero_copy_slice_of_the_read_buffer() {
    let publish = &v5_samples()[5];
    let bytes = encode_to_vec(publish, ProtocolVersion::V5);
    let mut buf = BytesMut::from(&bytes[..]);
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    let Some(Packet::Publish(p)) = decode(&mut buf, ProtocolVersion::V5, MAX).expect("valid") else {
        panic!("not a publish");
    };
    assert_eq!(p.payload.len(), 300);
    assert!(range.contains(&(p.payload.as_ptr() as usize)));
}

#[test]
fn max_packet_size_is_inclusive() {
    let bytes = encode_to_vec(&v3_samples()[3], ProtocolVersion::V3_1_1);
    let mut buf = BytesMut::from(&bytes[..]);
    assert!(matches!(decode(&mut buf, ProtocolVersion::V3_1_1, bytes.len()), Ok(Some(Packet::Publish(_)))));
    let mut buf = BytesMut::from(&bytes[..]);
    assert_eq!(
        decode(&mut buf, ProtocolVersion::V3_1_1, bytes.len() - 1),
        Err(DecodeError::PacketTooLarge { size: bytes.len(), max: bytes.len() - 1 })
    );
}

#[test]
fn large_remaining_lengths_roundtrip() {
    for size in [127usize, 128, 16_383, 16_384, 2_097_152] {
        let packet = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: s("big"),
            packet_id: Some(1),
            payload: Bytes::from(vec![7u8; size]),
            properties: PublishProperties::default(),
        });
        for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
            let bytes = encode_to_vec(&packet, version);
            let mut buf = BytesMut::from(&bytes[..]);
            let got = decode(&mut buf, version, bytes.len()).expect("valid");
            assert_eq!(got.as_ref(), Some(&packet));
        }
    }
}

#[test]
fn encode_publish_writes_the_same_bytes_as_encode() {
    for (samples, version) in [(v3_samples(), ProtocolVersion::V3_1_1), (v5_samples(), ProtocolVersion::V5)] {
        let publishes: Vec<_> =
            samples.iter().filter_map(|p| if let Packet::Publish(p) = p { Some(p) } else { None }).collect();
        assert!(!publishes.is_empty());
        for p in publishes {
            let mut by_ref = BytesMut::new();
            encode_publish(&p.as_ref(), version, &mut by_ref).unwrap();
            assert_eq!(&by_ref[..], &encode_to_vec(&Packet::Publish(p.clone()), version)[..], "{version:?}");
        }
    }
    // Invalid ones are refused the same way, leaving the buffer as it was.
    let bad = Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "a/+".into(),
        packet_id: Some(1),
        payload: Bytes::new(),
        properties: PublishProperties::default(),
    };
    let mut out = BytesMut::from(&b"kept"[..]);
    assert!(encode_publish(&bad.as_ref(), ProtocolVersion::V5, &mut out).is_err());
    assert_eq!(&out[..], b"kept");
}
