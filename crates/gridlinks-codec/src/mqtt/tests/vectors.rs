//! Hand-written byte vectors, laid out field by field as in the specifications.

use bytes::Bytes;

use super::*;

const V311: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

/// Decodes `bytes`, checks the packet, and checks the codec writes the same bytes.
fn check(bytes: &[u8], version: ProtocolVersion, expected: &Packet) {
    let got = decode_one(bytes, version).expect("valid vector");
    assert_eq!(&got, expected);
    assert_eq!(encode_to_vec(expected, version), bytes, "re-encoding differs");
}

#[test]
fn connect_v3_1_1() {
    #[rustfmt::skip]
    let bytes = [
        0x10, 21,                               // CONNECT, remaining length
        0x00, 0x04, b'M', b'Q', b'T', b'T',     // protocol name
        0x04,                                   // level 4 = 3.1.1
        0b1100_0010,                            // user name, password, clean session
        0x00, 0x3C,                             // keep alive 60 s
        0x00, 0x03, b'a', b'b', b'c',           // client id
        0x00, 0x01, b'u',                       // user name
        0x00, 0x01, b'p',                       // password
    ];
    let expected = Packet::Connect(Box::new(Connect {
        protocol: V311,
        client_id: s("abc"),
        keep_alive: 60,
        clean_start: true,
        username: Some(s("u")),
        password: Some(Bytes::from_static(b"p")),
        will: None,
        properties: ConnectProperties::default(),
    }));
    check(&bytes, V311, &expected);
}

#[test]
fn connect_v3_1_1_with_will() {
    #[rustfmt::skip]
    let bytes = [
        0x10, 23,
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04,
        0b0011_0110,                            // will retain, will QoS 2, will, clean
        0x00, 0x0A,
        0x00, 0x01, b'c',                       // client id
        0x00, 0x03, b't', b'/', b'w',           // will topic
        0x00, 0x03, b'b', b'y', b'e',           // will payload
    ];
    let expected = Packet::Connect(Box::new(Connect {
        protocol: V311,
        client_id: s("c"),
        keep_alive: 10,
        clean_start: true,
        username: None,
        password: None,
        will: Some(LastWill {
            topic: s("t/w"),
            payload: Bytes::from_static(b"bye"),
            qos: QoS::ExactlyOnce,
            retain: true,
            properties: PublishProperties::default(),
            delay_interval: None,
        }),
        properties: ConnectProperties::default(),
    }));
    check(&bytes, V311, &expected);
}

#[test]
fn connect_v5_with_properties_and_will() {
    #[rustfmt::skip]
    let bytes = [
        0x10, 50,
        0x00, 0x04, b'M', b'Q', b'T', b'T',
        0x05,                                   // level 5
        0b0010_1110,                            // will retain, will QoS 1, will, clean start
        0x00, 0x1E,                             // keep alive 30 s
        15,                                     // property length
        0x11, 0x00, 0x00, 0x00, 0x78,           //   session expiry interval 120
        0x21, 0x00, 0x0A,                       //   receive maximum 10
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // user property k=v
        0x00, 0x04, b'd', b'e', b'v', b'1',     // client id
        7,                                      // will property length
        0x18, 0x00, 0x00, 0x00, 0x05,           //   will delay interval 5
        0x01, 0x01,                             //   payload format indicator UTF-8
        0x00, 0x03, b't', b'/', b'w',           // will topic
        0x00, 0x03, b'b', b'y', b'e',           // will payload
    ];
    let expected = Packet::Connect(Box::new(Connect {
        protocol: V5,
        client_id: s("dev1"),
        keep_alive: 30,
        clean_start: true,
        username: None,
        password: None,
        will: Some(LastWill {
            topic: s("t/w"),
            payload: Bytes::from_static(b"bye"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: PublishProperties { payload_format_indicator: Some(1), ..Default::default() },
            delay_interval: Some(5),
        }),
        properties: ConnectProperties {
            session_expiry_interval: Some(120),
            receive_maximum: Some(10),
            user_properties: vec![(s("k"), s("v"))],
            ..Default::default()
        },
    }));
    // The codec writes properties in its own order, so compare the decode and then
    // the re-encoding's decode rather than bytes.
    assert_eq!(decode_one(&bytes, V311).expect("valid"), expected);
    let again = encode_to_vec(&expected, V5);
    assert_eq!(again.len(), bytes.len());
    assert_eq!(decode_one(&again, V5).expect("valid"), expected);
}

#[test]
fn connect_v3_1_mqisdp() {
    #[rustfmt::skip]
    let bytes = [
        0x10, 15,
        0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p',
        0x03,
        0x02,
        0x00, 0x05,
        0x00, 0x01, b'x',
    ];
    let Packet::Connect(c) = decode_one(&bytes, V311).expect("valid") else {
        panic!("not a connect");
    };
    assert_eq!(c.protocol, ProtocolVersion::V3_1);
    assert_eq!(c.client_id, "x");
    assert_eq!(encode_to_vec(&Packet::Connect(c), ProtocolVersion::V3_1), bytes);
}

#[test]
fn connack() {
    check(
        &[0x20, 0x02, 0x01, 0x00],
        V311,
        &Packet::ConnAck(ConnAck { session_present: true, code: 0, properties: ConnAckProperties::default() }),
    );
    #[rustfmt::skip]
    check(
        &[0x20, 0x08, 0x00, 0x00, 5, 0x24, 0x01, 0x13, 0x00, 0x3C],
        V5,
        &Packet::ConnAck(ConnAck {
            session_present: false,
            code: 0,
            properties: ConnAckProperties {
                maximum_qos: Some(1),
                server_keep_alive: Some(60),
                ..Default::default()
            },
        }),
    );
}

#[test]
fn publish_qos0_and_qos1() {
    #[rustfmt::skip]
    check(
        &[0x30, 7, 0x00, 0x03, b'a', b'/', b'b', b'h', b'i'],
        V311,
        &Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: s("a/b"),
            packet_id: None,
            payload: Bytes::from_static(b"hi"),
            properties: PublishProperties::default(),
        }),
    );
    #[rustfmt::skip]
    check(
        &[0x33, 9, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, b'h', b'i'],
        V311,
        &Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: s("a/b"),
            packet_id: Some(10),
            payload: Bytes::from_static(b"hi"),
            properties: PublishProperties::default(),
        }),
    );
    #[rustfmt::skip]
    let v5 = [
        0x3A, 15,                               // PUBLISH, DUP, QoS 1
        0x00, 0x03, b'a', b'/', b'b',
        0x00, 0x0A,                             // packet id 10
        5,                                      // property length
        0x01, 0x01,                             //   payload format indicator
        0x23, 0x00, 0x05,                       //   topic alias 5
        b'h', b'i',
    ];
    let got = decode_one(&v5, V5).expect("valid");
    let expected = Packet::Publish(Publish {
        dup: true,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: s("a/b"),
        packet_id: Some(10),
        payload: Bytes::from_static(b"hi"),
        properties: PublishProperties { payload_format_indicator: Some(1), topic_alias: Some(5), ..Default::default() },
    });
    assert_eq!(got, expected);
    assert_eq!(decode_one(&encode_to_vec(&expected, V5), V5), Ok(expected));
    // QoS 0 v5 with an empty property block.
    check(
        &[0x30, 5, 0x00, 0x01, b't', 0x00, b'x'],
        V5,
        &Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: s("t"),
            packet_id: None,
            payload: Bytes::from_static(b"x"),
            properties: PublishProperties::default(),
        }),
    );
}

#[test]
fn puback_v5_short_and_long_forms() {
    let ack = |reason, reason_string: Option<&str>| {
        Packet::PubAck(PubResp {
            packet_id: 1,
            reason,
            reason_string: reason_string.map(s),
            user_properties: Vec::new(),
        })
    };
    // Remaining length 2: reason 0.
    check(&[0x40, 0x02, 0x00, 0x01], V5, &ack(0, None));
    // Remaining length 3: reason, no properties.
    check(&[0x40, 0x03, 0x00, 0x01, 0x10], V5, &ack(0x10, None));
    // Remaining length 4: reason and an empty property block (decodes, re-encodes short).
    assert_eq!(decode_one(&[0x40, 0x04, 0x00, 0x01, 0x10, 0x00], V5), Ok(ack(0x10, None)));
    assert_eq!(decode_one(&[0x40, 0x04, 0x00, 0x01, 0x00, 0x00], V5), Ok(ack(0, None)));
    // With a reason string.
    check(&[0x40, 0x09, 0x00, 0x01, 0x80, 0x05, 0x1F, 0x00, 0x02, b'n', b'o'], V5, &ack(0x80, Some("no")));
    // PUBREL short form keeps its 0b0010 flags.
    check(
        &[0x62, 0x02, 0x00, 0x07],
        V5,
        &Packet::PubRel(PubResp { packet_id: 7, reason: 0, reason_string: None, user_properties: Vec::new() }),
    );
}

#[test]
fn subscribe_v3_1_1_and_v5() {
    #[rustfmt::skip]
    check(
        &[
            0x82, 12,
            0x00, 0x0A,                         // packet id 10
            0x00, 0x03, b'a', b'/', b'#', 0x01, // a/# QoS 1
            0x00, 0x01, b'b', 0x02,             // b QoS 2
        ],
        V311,
        &Packet::Subscribe(Subscribe {
            packet_id: 10,
            filters: vec![
                SubscriptionRequest {
                    filter: s("a/#"),
                    qos: QoS::AtLeastOnce,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                },
                SubscriptionRequest {
                    filter: s("b"),
                    qos: QoS::ExactlyOnce,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                },
            ],
            subscription_identifier: None,
            user_properties: Vec::new(),
        }),
    );
    #[rustfmt::skip]
    check(
        &[
            0x82, 11,
            0x00, 0x0A,
            2, 0x0B, 0x05,                      // subscription identifier 5
            0x00, 0x03, b'a', b'/', b'#',
            0b0001_1101,                        // retain handling 1, RAP, no local, QoS 1
        ],
        V5,
        &Packet::Subscribe(Subscribe {
            packet_id: 10,
            filters: vec![SubscriptionRequest {
                filter: s("a/#"),
                qos: QoS::AtLeastOnce,
                no_local: true,
                retain_as_published: true,
                retain_handling: 1,
            }],
            subscription_identifier: Some(5),
            user_properties: Vec::new(),
        }),
    );
}

#[test]
fn suback_unsubscribe_unsuback() {
    check(
        &[0x90, 0x05, 0x00, 0x0A, 0x01, 0x80, 0x02],
        V311,
        &Packet::SubAck(SubAck { packet_id: 10, return_codes: vec![1, 0x80, 2], reason_string: None }),
    );
    check(
        &[0xA2, 0x05, 0x00, 0x0B, 0x00, 0x01, b'a'],
        V311,
        &Packet::Unsubscribe(Unsubscribe { packet_id: 11, filters: vec![s("a")], user_properties: Vec::new() }),
    );
    check(
        &[0xB0, 0x02, 0x00, 0x0B],
        V311,
        &Packet::UnsubAck(UnsubAck { packet_id: 11, reason_codes: Vec::new(), reason_string: None }),
    );
    check(
        &[0xB0, 0x05, 0x00, 0x0B, 0x00, 0x00, 0x11],
        V5,
        &Packet::UnsubAck(UnsubAck { packet_id: 11, reason_codes: vec![0, 0x11], reason_string: None }),
    );
}

#[test]
fn ping_and_disconnect() {
    check(&[0xC0, 0x00], V311, &Packet::PingReq);
    check(&[0xD0, 0x00], V5, &Packet::PingResp);
    let normal = Packet::Disconnect(Disconnect {
        reason: 0,
        session_expiry_interval: None,
        reason_string: None,
        server_reference: None,
    });
    check(&[0xE0, 0x00], V311, &normal);
    // v5 remaining length 0 = reason 0.
    check(&[0xE0, 0x00], V5, &normal);
    assert_eq!(decode_one(&[0xE0, 0x02, 0x00, 0x00], V5), Ok(normal));
    check(
        &[0xE0, 0x07, 0x00, 0x05, 0x11, 0x00, 0x00, 0x00, 0x00],
        V5,
        &Packet::Disconnect(Disconnect {
            reason: 0,
            session_expiry_interval: Some(0),
            reason_string: None,
            server_reference: None,
        }),
    );
}

#[test]
fn auth() {
    #[rustfmt::skip]
    check(
        &[0xF0, 0x07, 0x18, 0x05, 0x15, 0x00, 0x02, b'm', b'1'],
        V5,
        &Packet::Auth(Auth {
            reason: 0x18,
            method: Some(s("m1")),
            data: None,
            reason_string: None,
        }),
    );
}
