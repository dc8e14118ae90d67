//! Decoding: framing from the fixed header, then one parser per packet body.
//!
//! Framing never allocates and never waits for a body it would reject: the first
//! byte's type and flags are checked as soon as it is there, and the announced size
//! is checked against the caller's limit as soon as the remaining length is
//! readable. Only a complete, acceptable packet is split off the buffer (zero-copy)
//! and parsed; its payload and binary fields stay slices of that allocation.

use bytes::{Buf, BytesMut};

use super::error::DecodeError;
use super::packet::{
    Auth, ConnAck, Connect, Disconnect, LastWill, Packet, PubResp, Publish, PublishProperties, SubAck, Subscribe,
    SubscriptionRequest, UnsubAck, Unsubscribe,
};
use super::properties::{decode_properties, Context, Props};
use super::wire::{parse_varint, Reader, Varint};
use super::{reason, topic, ProtocolVersion, QoS};

/// Control packet types (fixed header bits 7..4).
pub(crate) mod kind {
    pub(crate) const CONNECT: u8 = 1;
    pub(crate) const CONNACK: u8 = 2;
    pub(crate) const PUBLISH: u8 = 3;
    pub(crate) const PUBACK: u8 = 4;
    pub(crate) const PUBREC: u8 = 5;
    pub(crate) const PUBREL: u8 = 6;
    pub(crate) const PUBCOMP: u8 = 7;
    pub(crate) const SUBSCRIBE: u8 = 8;
    pub(crate) const SUBACK: u8 = 9;
    pub(crate) const UNSUBSCRIBE: u8 = 10;
    pub(crate) const UNSUBACK: u8 = 11;
    pub(crate) const PINGREQ: u8 = 12;
    pub(crate) const PINGRESP: u8 = 13;
    pub(crate) const DISCONNECT: u8 = 14;
    pub(crate) const AUTH: u8 = 15;
}

/// Decodes the first packet in `buf`, removing its bytes; `Ok(None)` = need more
/// bytes (buf untouched).
///
/// The remaining length is validated against `max_packet_size` (whole packet size
/// incl. fixed header) as soon as the fixed header is readable — before waiting for
/// or allocating the body. A remaining-length varint longer than 4 bytes is
/// Malformed (and in MQTT 5 so is a non-minimal one). `buf` is never grown here, so
/// a peer that announces a large packet has to actually send its bytes.
///
/// `version` selects v3 vs v5 body layouts for every packet except CONNECT, which
/// carries its own protocol name/level ("MQIsdp"/3 = V3_1, "MQTT"/4 = V3_1_1,
/// "MQTT"/5 = V5; anything else = UnsupportedProtocol).
///
/// Payloads are zero-copy slices (Bytes split from the BytesMut).
///
/// On `Err` the connection cannot continue (MQTT has no resynchronisation); the
/// offending packet's bytes may or may not have been removed from `buf`.
pub fn decode(
    buf: &mut BytesMut,
    version: ProtocolVersion,
    max_packet_size: usize,
) -> Result<Option<Packet>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let packet_type = first >> 4;
    let flags = first & 0x0F;
    check_fixed_header(packet_type, flags, version)?;

    let (remaining, len_bytes) = match parse_varint(&buf[1..]) {
        Varint::Incomplete => return Ok(None),
        Varint::TooLong => return Err(DecodeError::Malformed("remaining length longer than 4 bytes")),
        Varint::Value { minimal: false, .. } if version.is_v5() => {
            return Err(DecodeError::Malformed("remaining length not minimally encoded"))
        }
        Varint::Value { value, len, .. } => (value as usize, len),
    };
    let total = 1 + len_bytes + remaining;
    if total > max_packet_size {
        return Err(DecodeError::PacketTooLarge { size: total, max: max_packet_size });
    }
    if buf.len() < total {
        return Ok(None);
    }

    let mut frame = buf.split_to(total).freeze();
    frame.advance(1 + len_bytes);
    let r = Reader::new(frame, version.is_v5());
    decode_body(packet_type, flags, r, version).map(Some)
}

/// Packet type and fixed-header flags (MQTT 3.1.1 §2.2.2, MQTT 5 §2.1.3).
fn check_fixed_header(packet_type: u8, flags: u8, version: ProtocolVersion) -> Result<(), DecodeError> {
    match packet_type {
        0 => Err(DecodeError::Malformed("reserved packet type 0")),
        kind::AUTH if !version.is_v5() => Err(DecodeError::Malformed("reserved packet type 15 before MQTT 5")),
        kind::PUBLISH => {
            let qos = (flags >> 1) & 0b11;
            if qos == 3 {
                Err(DecodeError::Malformed("PUBLISH with QoS 3"))
            } else if qos == 0 && flags & 0b1000 != 0 {
                Err(DecodeError::Malformed("PUBLISH with QoS 0 and DUP set"))
            } else {
                Ok(())
            }
        }
        kind::PUBREL | kind::SUBSCRIBE | kind::UNSUBSCRIBE => {
            // MQTT 3.1 allowed the DUP bit on these when they were retransmitted.
            if flags == 0b0010 || (version == ProtocolVersion::V3_1 && flags == 0b1010) {
                Ok(())
            } else {
                Err(DecodeError::Malformed("fixed header flags must be 0b0010"))
            }
        }
        _ if flags != 0 => Err(DecodeError::Malformed("fixed header flags must be 0")),
        _ => Ok(()),
    }
}

fn decode_body(packet_type: u8, flags: u8, mut r: Reader, version: ProtocolVersion) -> Result<Packet, DecodeError> {
    let packet = match packet_type {
        kind::CONNECT => Packet::Connect(Box::new(decode_connect(&mut r)?)),
        kind::CONNACK => Packet::ConnAck(decode_connack(&mut r, version)?),
        kind::PUBLISH => Packet::Publish(decode_publish(&mut r, flags, version)?),
        kind::PUBACK => Packet::PubAck(decode_pub_resp(&mut r, version, reason::valid_puback)?),
        kind::PUBREC => Packet::PubRec(decode_pub_resp(&mut r, version, reason::valid_puback)?),
        kind::PUBREL => Packet::PubRel(decode_pub_resp(&mut r, version, reason::valid_pubrel)?),
        kind::PUBCOMP => Packet::PubComp(decode_pub_resp(&mut r, version, reason::valid_pubrel)?),
        kind::SUBSCRIBE => Packet::Subscribe(decode_subscribe(&mut r, version)?),
        kind::SUBACK => Packet::SubAck(decode_suback(&mut r, version)?),
        kind::UNSUBSCRIBE => Packet::Unsubscribe(decode_unsubscribe(&mut r, version)?),
        kind::UNSUBACK => Packet::UnsubAck(decode_unsuback(&mut r, version)?),
        kind::PINGREQ => Packet::PingReq,
        kind::PINGRESP => Packet::PingResp,
        kind::DISCONNECT => Packet::Disconnect(decode_disconnect(&mut r, version)?),
        kind::AUTH => Packet::Auth(decode_auth(&mut r)?),
        _ => return Err(DecodeError::Malformed("reserved packet type")),
    };
    r.finish()?;
    Ok(packet)
}

/// Packet Identifier of a packet that needs one: never 0.
fn packet_id(r: &mut Reader) -> Result<u16, DecodeError> {
    match r.u16()? {
        0 => Err(DecodeError::Protocol("packet identifier 0")),
        id => Ok(id),
    }
}

/// The property block, or all-`None` before MQTT 5.
fn props(r: &mut Reader, version: ProtocolVersion, ctx: Context) -> Result<Props, DecodeError> {
    if version.is_v5() {
        decode_properties(r, ctx)
    } else {
        Ok(Props::default())
    }
}

fn decode_connect(r: &mut Reader) -> Result<Connect, DecodeError> {
    let name = r.binary()?;
    let level = r.u8()?;
    let protocol = match (&name[..], level) {
        (b"MQIsdp", 3) => ProtocolVersion::V3_1,
        (b"MQTT", 4) => ProtocolVersion::V3_1_1,
        (b"MQTT", 5) => ProtocolVersion::V5,
        _ => return Err(DecodeError::UnsupportedProtocol { name: String::from_utf8_lossy(&name).into_owned(), level }),
    };
    r.set_strict_varint(protocol.is_v5());

    let flags = r.u8()?;
    if flags & 0x01 != 0 {
        return Err(DecodeError::Malformed("CONNECT reserved flag set"));
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0b11;
    let will_retain = flags & 0x20 != 0;
    let password_flag = flags & 0x40 != 0;
    let username_flag = flags & 0x80 != 0;
    if !will_flag && (will_qos != 0 || will_retain) {
        return Err(DecodeError::Malformed("will QoS or will retain set without will flag"));
    }
    let will_qos = QoS::try_from(will_qos).map_err(|_| DecodeError::Malformed("will QoS 3"))?;
    if protocol == ProtocolVersion::V3_1_1 && password_flag && !username_flag {
        return Err(DecodeError::Protocol("password flag without user name flag"));
    }

    let keep_alive = r.u16()?;
    let properties = props(r, protocol, Context::Connect)?.into_connect();
    let client_id = r.string()?;
    let will = if will_flag {
        let will_props = props(r, protocol, Context::Will)?;
        let delay_interval = will_props.will_delay_interval;
        let topic = r.string()?;
        if !topic::is_valid_topic_name(&topic) {
            return Err(DecodeError::Protocol("will topic is not a valid topic name"));
        }
        let payload = r.binary()?;
        Some(LastWill {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties: will_props.into_publish(),
            delay_interval,
        })
    } else {
        None
    };
    let username = if username_flag { Some(r.string()?) } else { None };
    let password = if password_flag { Some(r.binary()?) } else { None };

    Ok(Connect { protocol, client_id, keep_alive, clean_start, username, password, will, properties })
}

fn decode_connack(r: &mut Reader, version: ProtocolVersion) -> Result<ConnAck, DecodeError> {
    let flags = r.u8()?;
    if flags & 0xFE != 0 {
        return Err(DecodeError::Malformed("CONNACK reserved flags set"));
    }
    let code = r.u8()?;
    if !reason::valid_connack(version, code) {
        return Err(DecodeError::Protocol("invalid CONNACK return/reason code"));
    }
    let properties = props(r, version, Context::ConnAck)?.into_connack();
    Ok(ConnAck { session_present: flags & 0x01 != 0, code, properties })
}

fn decode_publish(r: &mut Reader, flags: u8, version: ProtocolVersion) -> Result<Publish, DecodeError> {
    let qos = QoS::try_from((flags >> 1) & 0b11)?;
    let topic = r.string()?;
    let packet_id = if qos > QoS::AtMostOnce { Some(packet_id(r)?) } else { None };
    let properties: PublishProperties = props(r, version, Context::Publish)?.into_publish();
    if topic.is_empty() {
        if properties.topic_alias.is_none() {
            return Err(DecodeError::Protocol("empty topic name without topic alias"));
        }
    } else if topic::has_wildcard(&topic) {
        return Err(DecodeError::Protocol("wildcard in PUBLISH topic name"));
    }
    Ok(Publish {
        dup: flags & 0b1000 != 0,
        qos,
        retain: flags & 0b0001 != 0,
        topic,
        packet_id,
        payload: r.rest(),
        properties,
    })
}

/// PUBACK, PUBREC, PUBREL, PUBCOMP; `valid` is the packet's MQTT 5 reason code set.
fn decode_pub_resp(r: &mut Reader, version: ProtocolVersion, valid: fn(u8) -> bool) -> Result<PubResp, DecodeError> {
    let packet_id = packet_id(r)?;
    let mut resp = PubResp { packet_id, reason: reason::SUCCESS, reason_string: None, user_properties: Vec::new() };
    // MQTT 5 short forms: remaining length 2 = success, 3 = reason without properties.
    if version.is_v5() && !r.is_empty() {
        resp.reason = r.u8()?;
        if !valid(resp.reason) {
            return Err(DecodeError::Protocol("invalid reason code for this ack"));
        }
        if !r.is_empty() {
            let p = decode_properties(r, Context::PubResp)?;
            resp.reason_string = p.reason_string;
            resp.user_properties = p.user_properties;
        }
    }
    Ok(resp)
}

fn decode_subscribe(r: &mut Reader, version: ProtocolVersion) -> Result<Subscribe, DecodeError> {
    let packet_id = packet_id(r)?;
    let p = props(r, version, Context::Subscribe)?;
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        let options = r.u8()?;
        let reserved = if version.is_v5() { 0xC0 } else { 0xFC };
        if options & reserved != 0 {
            return Err(DecodeError::Malformed("subscription options reserved bits set"));
        }
        let qos = QoS::try_from(options & 0b11).map_err(|_| DecodeError::Malformed("subscription with QoS 3"))?;
        let retain_handling = (options >> 4) & 0b11;
        if retain_handling == 3 {
            return Err(DecodeError::Protocol("retain handling 3"));
        }
        filters.push(SubscriptionRequest {
            filter,
            qos,
            no_local: options & 0x04 != 0,
            retain_as_published: options & 0x08 != 0,
            retain_handling,
        });
    }
    if filters.is_empty() {
        return Err(DecodeError::Protocol("SUBSCRIBE without topic filters"));
    }
    Ok(Subscribe {
        packet_id,
        filters,
        subscription_identifier: p.subscription_identifiers.first().copied(),
        user_properties: p.user_properties,
    })
}

fn decode_suback(r: &mut Reader, version: ProtocolVersion) -> Result<SubAck, DecodeError> {
    let packet_id = packet_id(r)?;
    let p = props(r, version, Context::SubAck)?;
    let return_codes = r.rest().to_vec();
    if return_codes.is_empty() {
        return Err(DecodeError::Protocol("SUBACK without return codes"));
    }
    if !return_codes.iter().all(|&code| reason::valid_suback(version, code)) {
        return Err(DecodeError::Protocol("invalid SUBACK return/reason code"));
    }
    Ok(SubAck { packet_id, return_codes, reason_string: p.reason_string })
}

fn decode_unsubscribe(r: &mut Reader, version: ProtocolVersion) -> Result<Unsubscribe, DecodeError> {
    let packet_id = packet_id(r)?;
    let p = props(r, version, Context::Unsubscribe)?;
    let mut filters = Vec::new();
    while !r.is_empty() {
        filters.push(r.string()?);
    }
    if filters.is_empty() {
        return Err(DecodeError::Protocol("UNSUBSCRIBE without topic filters"));
    }
    Ok(Unsubscribe { packet_id, filters, user_properties: p.user_properties })
}

fn decode_unsuback(r: &mut Reader, version: ProtocolVersion) -> Result<UnsubAck, DecodeError> {
    let packet_id = packet_id(r)?;
    if !version.is_v5() {
        return Ok(UnsubAck { packet_id, reason_codes: Vec::new(), reason_string: None });
    }
    let p = decode_properties(r, Context::UnsubAck)?;
    let reason_codes = r.rest().to_vec();
    if reason_codes.is_empty() {
        return Err(DecodeError::Protocol("UNSUBACK without reason codes"));
    }
    if !reason_codes.iter().all(|&code| reason::valid_unsuback(code)) {
        return Err(DecodeError::Protocol("invalid UNSUBACK reason code"));
    }
    Ok(UnsubAck { packet_id, reason_codes, reason_string: p.reason_string })
}

fn decode_disconnect(r: &mut Reader, version: ProtocolVersion) -> Result<Disconnect, DecodeError> {
    let mut d = Disconnect {
        reason: reason::SUCCESS,
        session_expiry_interval: None,
        reason_string: None,
        server_reference: None,
    };
    // MQTT 5: remaining length 0 = normal disconnection, 1 = reason only.
    if version.is_v5() && !r.is_empty() {
        d.reason = r.u8()?;
        if !reason::valid_disconnect(d.reason) {
            return Err(DecodeError::Protocol("invalid DISCONNECT reason code"));
        }
        if !r.is_empty() {
            let p = decode_properties(r, Context::Disconnect)?;
            d.session_expiry_interval = p.session_expiry_interval;
            d.reason_string = p.reason_string;
            d.server_reference = p.server_reference;
        }
    }
    Ok(d)
}

fn decode_auth(r: &mut Reader) -> Result<Auth, DecodeError> {
    let mut a = Auth { reason: reason::SUCCESS, method: None, data: None, reason_string: None };
    // Remaining length 0 = success without properties; 1 is accepted like DISCONNECT.
    if !r.is_empty() {
        a.reason = r.u8()?;
        if !reason::valid_auth(a.reason) {
            return Err(DecodeError::Protocol("invalid AUTH reason code"));
        }
        if !r.is_empty() {
            let p = decode_properties(r, Context::Auth)?;
            a.method = p.authentication_method;
            a.data = p.authentication_data;
            a.reason_string = p.reason_string;
        }
    }
    Ok(a)
}
