//! Encoding: each packet body is written by one function generic over [`Sink`], run
//! first on a [`Counter`] (which also validates) to get the remaining length, then
//! on the output buffer. Nothing is written to `out` unless the packet is valid.

use bytes::BytesMut;

use super::decode::kind;
use super::error::EncodeError;
use super::packet::{
    Auth, ConnAck, Connect, Disconnect, Packet, PubResp, PublishProperties, PublishRef, SubAck, Subscribe, UnsubAck,
    Unsubscribe,
};
use super::properties::{
    write_block, AuthProps, DisconnectProps, PropertyBlock, ReasonProps, SubscribeProps, WillProps,
};
use super::wire::{varint_len, Counter, Sink, MAX_REMAINING_LENGTH};
use super::{reason, topic, ProtocolVersion, QoS};

/// Appends the encoding of `packet` for `version` to `out`.
///
/// Every packet type can be encoded (server and client share the codec). CONNECT is
/// encoded for the version it names (`connect.protocol`), mirroring
/// [`decode`](super::decode()). For 3.1/3.1.1 the MQTT 5 only fields are dropped and
/// the 3.x layouts are used (PUBACK = packet id only, SUBACK return codes, UNSUBACK without
/// codes, empty DISCONNECT, CONNACK = flags + code); AUTH has no 3.x form. In MQTT 5
/// the short forms are used where the spec allows them (PUBACK.. with reason 0 and no
/// properties = packet id only; DISCONNECT/AUTH with reason 0 and no properties =
/// empty body).
///
/// On error `out` is left as it was.
pub fn encode(packet: &Packet, version: ProtocolVersion, out: &mut BytesMut) -> Result<(), EncodeError> {
    frame(fixed_header(packet, version)?, packet, version, out)
}

/// Appends the encoding of PUBLISH `p` for `version` to `out`: the same bytes as
/// [`encode`] of the equivalent [`Packet::Publish`]. On error `out` is left as it was.
pub fn encode_publish(p: &PublishRef<'_>, version: ProtocolVersion, out: &mut BytesMut) -> Result<(), EncodeError> {
    frame((kind::PUBLISH << 4) | publish_flags(p), p, version, out)
}

/// The fixed-header flags of a PUBLISH: DUP, QoS, RETAIN.
fn publish_flags(p: &PublishRef<'_>) -> u8 {
    (u8::from(p.dup) << 3) | ((p.qos as u8) << 1) | u8::from(p.retain)
}

/// A packet body that can be written to any [`Sink`].
trait Body {
    fn write<S: Sink>(&self, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError>;
}

impl Body for Packet {
    fn write<S: Sink>(&self, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
        write_body(self, version, s)
    }
}

impl Body for PublishRef<'_> {
    fn write<S: Sink>(&self, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
        write_publish(self, version, s)
    }
}

/// Writes `header`, the remaining length and `body`, sized (and validated) first on a
/// [`Counter`] so that nothing reaches `out` unless the whole packet is valid.
fn frame<B: Body>(header: u8, body: &B, version: ProtocolVersion, out: &mut BytesMut) -> Result<(), EncodeError> {
    let mut counter = Counter::default();
    body.write(version, &mut counter)?;
    let remaining = counter.0;
    if remaining > MAX_REMAINING_LENGTH {
        return Err(EncodeError::PayloadTooLarge);
    }
    out.reserve(1 + varint_len(remaining) + remaining);
    out.write_u8(header);
    out.write_varint(remaining)?;
    body.write(version, out)
}

fn fixed_header(packet: &Packet, version: ProtocolVersion) -> Result<u8, EncodeError> {
    let (packet_type, flags) = match packet {
        Packet::Connect(_) => (kind::CONNECT, 0),
        Packet::ConnAck(_) => (kind::CONNACK, 0),
        Packet::Publish(p) => (kind::PUBLISH, publish_flags(&p.as_ref())),
        Packet::PubAck(_) => (kind::PUBACK, 0),
        Packet::PubRec(_) => (kind::PUBREC, 0),
        Packet::PubRel(_) => (kind::PUBREL, 0b0010),
        Packet::PubComp(_) => (kind::PUBCOMP, 0),
        Packet::Subscribe(_) => (kind::SUBSCRIBE, 0b0010),
        Packet::SubAck(_) => (kind::SUBACK, 0),
        Packet::Unsubscribe(_) => (kind::UNSUBSCRIBE, 0b0010),
        Packet::UnsubAck(_) => (kind::UNSUBACK, 0),
        Packet::PingReq => (kind::PINGREQ, 0),
        Packet::PingResp => (kind::PINGRESP, 0),
        Packet::Disconnect(_) => (kind::DISCONNECT, 0),
        Packet::Auth(_) => {
            if !version.is_v5() {
                return Err(EncodeError::InvalidPacketForVersion("AUTH exists only in MQTT 5"));
            }
            (kind::AUTH, 0)
        }
    };
    Ok((packet_type << 4) | flags)
}

fn write_body<S: Sink>(packet: &Packet, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
    match packet {
        Packet::Connect(c) => write_connect(c, s),
        Packet::ConnAck(c) => write_connack(c, version, s),
        Packet::Publish(p) => write_publish(&p.as_ref(), version, s),
        Packet::PubAck(r) | Packet::PubRec(r) => write_pub_resp(r, version, "PUBACK/PUBREC", reason::valid_puback, s),
        Packet::PubRel(r) | Packet::PubComp(r) => write_pub_resp(r, version, "PUBREL/PUBCOMP", reason::valid_pubrel, s),
        Packet::Subscribe(sub) => write_subscribe(sub, version, s),
        Packet::SubAck(ack) => write_suback(ack, version, s),
        Packet::Unsubscribe(u) => write_unsubscribe(u, version, s),
        Packet::UnsubAck(ack) => write_unsuback(ack, version, s),
        Packet::PingReq | Packet::PingResp => Ok(()),
        Packet::Disconnect(d) => write_disconnect(d, version, s),
        Packet::Auth(a) => write_auth(a, s),
    }
}

fn write_packet_id<S: Sink>(s: &mut S, id: u16) -> Result<(), EncodeError> {
    if id == 0 {
        return Err(EncodeError::InvalidPacket("packet identifier 0"));
    }
    s.write_u16(id);
    Ok(())
}

fn write_connect<S: Sink>(c: &Connect, s: &mut S) -> Result<(), EncodeError> {
    let v5 = c.protocol.is_v5();
    if c.protocol == ProtocolVersion::V3_1_1 && c.password.is_some() && c.username.is_none() {
        return Err(EncodeError::InvalidPacketForVersion("password without user name needs MQTT 5"));
    }
    s.write_string(c.protocol.protocol_name())?;
    s.write_u8(c.protocol.protocol_level());

    let mut flags = 0u8;
    if c.clean_start {
        flags |= 0x02;
    }
    if let Some(w) = &c.will {
        flags |= 0x04 | ((w.qos as u8) << 3);
        if w.retain {
            flags |= 0x20;
        }
    }
    if c.password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    s.write_u8(flags);
    s.write_u16(c.keep_alive);
    if v5 {
        write_block(s, &c.properties)?;
    }
    s.write_string(&c.client_id)?;
    if let Some(w) = &c.will {
        if v5 {
            write_block(s, &WillProps { properties: &w.properties, delay_interval: w.delay_interval })?;
        }
        if !topic::is_valid_topic_name(&w.topic) {
            return Err(EncodeError::InvalidPacket("will topic is not a valid topic name"));
        }
        s.write_string(&w.topic)?;
        s.write_binary(&w.payload)?;
    }
    if let Some(u) = &c.username {
        s.write_string(u)?;
    }
    if let Some(p) = &c.password {
        s.write_binary(p)?;
    }
    Ok(())
}

fn write_connack<S: Sink>(c: &ConnAck, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
    if !reason::valid_connack(version, c.code) {
        return Err(EncodeError::InvalidReasonCode { packet: "CONNACK", code: c.code });
    }
    s.write_u8(u8::from(c.session_present));
    s.write_u8(c.code);
    if version.is_v5() {
        write_block(s, &c.properties)?;
    }
    Ok(())
}

fn write_publish<S: Sink>(p: &PublishRef<'_>, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
    let v5 = version.is_v5();
    match (p.qos, p.packet_id) {
        (QoS::AtMostOnce, Some(_)) => return Err(EncodeError::InvalidPacket("QoS 0 PUBLISH with packet id")),
        (QoS::AtMostOnce, None) if p.dup => return Err(EncodeError::InvalidPacket("QoS 0 PUBLISH with DUP set")),
        (QoS::AtLeastOnce | QoS::ExactlyOnce, None) => {
            return Err(EncodeError::InvalidPacket("QoS > 0 PUBLISH without packet id"))
        }
        _ => {}
    }
    if p.topic.is_empty() {
        if !(v5 && p.properties.topic_alias.is_some()) {
            return Err(EncodeError::InvalidPacket("empty topic name without topic alias"));
        }
    } else if topic::has_wildcard(p.topic) {
        return Err(EncodeError::InvalidPacket("wildcard in PUBLISH topic name"));
    }
    s.write_string(p.topic)?;
    if let Some(id) = p.packet_id {
        write_packet_id(s, id)?;
    }
    if v5 {
        write_block::<S, PublishProperties>(s, p.properties)?;
    }
    s.write_slice(p.payload);
    Ok(())
}

fn write_pub_resp<S: Sink>(
    r: &PubResp,
    version: ProtocolVersion,
    name: &'static str,
    valid: fn(u8) -> bool,
    s: &mut S,
) -> Result<(), EncodeError> {
    write_packet_id(s, r.packet_id)?;
    if !version.is_v5() {
        return Ok(());
    }
    if !valid(r.reason) {
        return Err(EncodeError::InvalidReasonCode { packet: name, code: r.reason });
    }
    let props = ReasonProps { reason_string: r.reason_string.as_deref(), user_properties: &r.user_properties };
    let no_props = props.is_empty()?;
    if r.reason == reason::SUCCESS && no_props {
        return Ok(());
    }
    s.write_u8(r.reason);
    if !no_props {
        write_block(s, &props)?;
    }
    Ok(())
}

fn write_subscribe<S: Sink>(sub: &Subscribe, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
    if sub.filters.is_empty() {
        return Err(EncodeError::InvalidPacket("SUBSCRIBE without topic filters"));
    }
    write_packet_id(s, sub.packet_id)?;
    let v5 = version.is_v5();
    if v5 {
        write_block(
            s,
            &SubscribeProps {
                subscription_identifier: sub.subscription_identifier,
                user_properties: &sub.user_properties,
            },
        )?;
    }
    for f in &sub.filters {
        s.write_string(&f.filter)?;
        let mut options = f.qos as u8;
        if v5 {
            if f.retain_handling > 2 {
                return Err(EncodeError::InvalidPacket("retain handling above 2"));
            }
            options |= (u8::from(f.no_local) << 2) | (u8::from(f.retain_as_published) << 3) | (f.retain_handling << 4);
        }
        s.write_u8(options);
    }
    Ok(())
}

fn write_suback<S: Sink>(ack: &SubAck, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
    if ack.return_codes.is_empty() {
        return Err(EncodeError::InvalidPacket("SUBACK without return codes"));
    }
    if let Some(&code) = ack.return_codes.iter().find(|&&code| !reason::valid_suback(version, code)) {
        return Err(EncodeError::InvalidReasonCode { packet: "SUBACK", code });
    }
    write_packet_id(s, ack.packet_id)?;
    if version.is_v5() {
        write_block(s, &ReasonProps { reason_string: ack.reason_string.as_deref(), user_properties: &[] })?;
    }
    s.write_slice(&ack.return_codes);
    Ok(())
}

fn write_unsubscribe<S: Sink>(u: &Unsubscribe, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
    if u.filters.is_empty() {
        return Err(EncodeError::InvalidPacket("UNSUBSCRIBE without topic filters"));
    }
    write_packet_id(s, u.packet_id)?;
    if version.is_v5() {
        write_block(s, &ReasonProps { reason_string: None, user_properties: &u.user_properties })?;
    }
    for f in &u.filters {
        s.write_string(f)?;
    }
    Ok(())
}

fn write_unsuback<S: Sink>(ack: &UnsubAck, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
    write_packet_id(s, ack.packet_id)?;
    if !version.is_v5() {
        return Ok(());
    }
    if ack.reason_codes.is_empty() {
        return Err(EncodeError::InvalidPacket("UNSUBACK without reason codes"));
    }
    if let Some(&code) = ack.reason_codes.iter().find(|&&code| !reason::valid_unsuback(code)) {
        return Err(EncodeError::InvalidReasonCode { packet: "UNSUBACK", code });
    }
    write_block(s, &ReasonProps { reason_string: ack.reason_string.as_deref(), user_properties: &[] })?;
    s.write_slice(&ack.reason_codes);
    Ok(())
}

fn write_disconnect<S: Sink>(d: &Disconnect, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
    if !version.is_v5() {
        return Ok(());
    }
    if !reason::valid_disconnect(d.reason) {
        return Err(EncodeError::InvalidReasonCode { packet: "DISCONNECT", code: d.reason });
    }
    let props = DisconnectProps {
        session_expiry_interval: d.session_expiry_interval,
        reason_string: d.reason_string.as_deref(),
        server_reference: d.server_reference.as_deref(),
    };
    let no_props = props.is_empty()?;
    if d.reason == reason::SUCCESS && no_props {
        return Ok(());
    }
    s.write_u8(d.reason);
    if !no_props {
        write_block(s, &props)?;
    }
    Ok(())
}

fn write_auth<S: Sink>(a: &Auth, s: &mut S) -> Result<(), EncodeError> {
    if !reason::valid_auth(a.reason) {
        return Err(EncodeError::InvalidReasonCode { packet: "AUTH", code: a.reason });
    }
    let props =
        AuthProps { method: a.method.as_deref(), data: a.data.as_ref(), reason_string: a.reason_string.as_deref() };
    if a.reason == reason::SUCCESS && props.is_empty()? {
        return Ok(());
    }
    s.write_u8(a.reason);
    write_block(s, &props)
}
