//! MQTT 5 properties (§2.2.2): identifiers, which packet allows which property, and
//! the property block reader and writers.
//!
//! Decoding reads any property block into [`Props`], a superset of every packet's
//! properties, enforcing per [`Context`]: unknown identifier → Malformed, identifier
//! not allowed in this packet → Malformed, repeated where the spec forbids it →
//! Protocol error, out-of-range value → Protocol error. Each packet then moves the
//! fields it has a place for into its own struct.

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{ConnAckProperties, ConnectProperties, PublishProperties};
use super::topic;
use super::wire::{Counter, Reader, Sink, MAX_REMAINING_LENGTH};

/// Property identifiers (MQTT 5 §2.2.2.2, table 2-4).
pub(crate) mod id {
    pub(crate) const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
    pub(crate) const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
    pub(crate) const CONTENT_TYPE: u8 = 0x03;
    pub(crate) const RESPONSE_TOPIC: u8 = 0x08;
    pub(crate) const CORRELATION_DATA: u8 = 0x09;
    pub(crate) const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
    pub(crate) const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
    pub(crate) const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
    pub(crate) const SERVER_KEEP_ALIVE: u8 = 0x13;
    pub(crate) const AUTHENTICATION_METHOD: u8 = 0x15;
    pub(crate) const AUTHENTICATION_DATA: u8 = 0x16;
    pub(crate) const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
    pub(crate) const WILL_DELAY_INTERVAL: u8 = 0x18;
    pub(crate) const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
    pub(crate) const RESPONSE_INFORMATION: u8 = 0x1A;
    pub(crate) const SERVER_REFERENCE: u8 = 0x1C;
    pub(crate) const REASON_STRING: u8 = 0x1F;
    pub(crate) const RECEIVE_MAXIMUM: u8 = 0x21;
    pub(crate) const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
    pub(crate) const TOPIC_ALIAS: u8 = 0x23;
    pub(crate) const MAXIMUM_QOS: u8 = 0x24;
    pub(crate) const RETAIN_AVAILABLE: u8 = 0x25;
    pub(crate) const USER_PROPERTY: u8 = 0x26;
    pub(crate) const MAXIMUM_PACKET_SIZE: u8 = 0x27;
    pub(crate) const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
    pub(crate) const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
    pub(crate) const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;
}

/// Bit of a property identifier in a `u64` set (every identifier is below 64).
const fn bit(id: u8) -> u64 {
    1u64 << id
}

const fn set(ids: &[u8]) -> u64 {
    let mut mask = 0;
    let mut i = 0;
    while i < ids.len() {
        mask |= bit(ids[i]);
        i += 1;
    }
    mask
}

/// The packet (or part of CONNECT) a property block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Context {
    Connect,
    Will,
    ConnAck,
    Publish,
    /// PUBACK, PUBREC, PUBREL, PUBCOMP.
    PubResp,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

impl Context {
    /// Identifiers allowed in this packet (table 2-4).
    fn allowed(self) -> u64 {
        use id::*;
        match self {
            Context::Connect => set(&[
                SESSION_EXPIRY_INTERVAL,
                AUTHENTICATION_METHOD,
                AUTHENTICATION_DATA,
                REQUEST_PROBLEM_INFORMATION,
                REQUEST_RESPONSE_INFORMATION,
                RECEIVE_MAXIMUM,
                TOPIC_ALIAS_MAXIMUM,
                USER_PROPERTY,
                MAXIMUM_PACKET_SIZE,
            ]),
            Context::Will => set(&[
                PAYLOAD_FORMAT_INDICATOR,
                MESSAGE_EXPIRY_INTERVAL,
                CONTENT_TYPE,
                RESPONSE_TOPIC,
                CORRELATION_DATA,
                WILL_DELAY_INTERVAL,
                USER_PROPERTY,
            ]),
            Context::ConnAck => set(&[
                SESSION_EXPIRY_INTERVAL,
                ASSIGNED_CLIENT_IDENTIFIER,
                SERVER_KEEP_ALIVE,
                AUTHENTICATION_METHOD,
                AUTHENTICATION_DATA,
                RESPONSE_INFORMATION,
                SERVER_REFERENCE,
                REASON_STRING,
                RECEIVE_MAXIMUM,
                TOPIC_ALIAS_MAXIMUM,
                MAXIMUM_QOS,
                RETAIN_AVAILABLE,
                USER_PROPERTY,
                MAXIMUM_PACKET_SIZE,
                WILDCARD_SUBSCRIPTION_AVAILABLE,
                SUBSCRIPTION_IDENTIFIER_AVAILABLE,
                SHARED_SUBSCRIPTION_AVAILABLE,
            ]),
            Context::Publish => set(&[
                PAYLOAD_FORMAT_INDICATOR,
                MESSAGE_EXPIRY_INTERVAL,
                CONTENT_TYPE,
                RESPONSE_TOPIC,
                CORRELATION_DATA,
                SUBSCRIPTION_IDENTIFIER,
                TOPIC_ALIAS,
                USER_PROPERTY,
            ]),
            Context::PubResp | Context::SubAck | Context::UnsubAck => set(&[REASON_STRING, USER_PROPERTY]),
            Context::Subscribe => set(&[SUBSCRIPTION_IDENTIFIER, USER_PROPERTY]),
            Context::Unsubscribe => set(&[USER_PROPERTY]),
            Context::Disconnect => set(&[SESSION_EXPIRY_INTERVAL, SERVER_REFERENCE, REASON_STRING, USER_PROPERTY]),
            Context::Auth => set(&[AUTHENTICATION_METHOD, AUTHENTICATION_DATA, REASON_STRING, USER_PROPERTY]),
        }
    }

    /// Identifiers that may appear more than once in this packet.
    fn repeatable(self) -> u64 {
        match self {
            Context::Publish => set(&[id::USER_PROPERTY, id::SUBSCRIPTION_IDENTIFIER]),
            _ => bit(id::USER_PROPERTY),
        }
    }
}

/// Every property a block can carry; each packet takes the ones it has a place for.
#[derive(Default)]
pub(crate) struct Props {
    pub(crate) payload_format_indicator: Option<u8>,
    pub(crate) message_expiry_interval: Option<u32>,
    pub(crate) content_type: Option<String>,
    pub(crate) response_topic: Option<String>,
    pub(crate) correlation_data: Option<Bytes>,
    pub(crate) subscription_identifiers: Vec<u32>,
    pub(crate) session_expiry_interval: Option<u32>,
    pub(crate) assigned_client_identifier: Option<String>,
    pub(crate) server_keep_alive: Option<u16>,
    pub(crate) authentication_method: Option<String>,
    pub(crate) authentication_data: Option<Bytes>,
    pub(crate) request_problem_information: Option<u8>,
    pub(crate) will_delay_interval: Option<u32>,
    pub(crate) request_response_information: Option<u8>,
    pub(crate) response_information: Option<String>,
    pub(crate) server_reference: Option<String>,
    pub(crate) reason_string: Option<String>,
    pub(crate) receive_maximum: Option<u16>,
    pub(crate) topic_alias_maximum: Option<u16>,
    pub(crate) topic_alias: Option<u16>,
    pub(crate) maximum_qos: Option<u8>,
    pub(crate) retain_available: Option<u8>,
    pub(crate) user_properties: Vec<(String, String)>,
    pub(crate) maximum_packet_size: Option<u32>,
    pub(crate) wildcard_subscription_available: Option<u8>,
    pub(crate) subscription_identifiers_available: Option<u8>,
    pub(crate) shared_subscription_available: Option<u8>,
}

/// A property whose only valid values are 0 and 1.
fn flag(r: &mut Reader, what: &'static str) -> Result<Option<u8>, DecodeError> {
    match r.u8()? {
        v @ (0 | 1) => Ok(Some(v)),
        _ => Err(DecodeError::Protocol(what)),
    }
}

fn non_zero_u16(r: &mut Reader, what: &'static str) -> Result<Option<u16>, DecodeError> {
    match r.u16()? {
        0 => Err(DecodeError::Protocol(what)),
        v => Ok(Some(v)),
    }
}

/// Reads a property block (length, then properties) for `ctx`.
pub(crate) fn decode_properties(r: &mut Reader, ctx: Context) -> Result<Props, DecodeError> {
    use id::*;
    let len = r.varint()?;
    let mut block = r.sub(len as usize)?;
    let mut p = Props::default();
    let mut seen: u64 = 0;
    while !block.is_empty() {
        // Identifiers are Variable Byte Integers, but every defined one is below
        // 0x80, so a byte >= 0x80 can only start an unknown identifier.
        let pid = block.u8()?;
        if pid >= 64 || KNOWN & bit(pid) == 0 {
            return Err(DecodeError::Malformed("unknown property identifier"));
        }
        if ctx.allowed() & bit(pid) == 0 {
            return Err(DecodeError::Malformed("property not allowed in this packet"));
        }
        if seen & bit(pid) != 0 && ctx.repeatable() & bit(pid) == 0 {
            return Err(DecodeError::Protocol("property included more than once"));
        }
        seen |= bit(pid);
        match pid {
            PAYLOAD_FORMAT_INDICATOR => {
                p.payload_format_indicator = flag(&mut block, "payload format indicator not 0 or 1")?
            }
            MESSAGE_EXPIRY_INTERVAL => p.message_expiry_interval = Some(block.u32()?),
            CONTENT_TYPE => p.content_type = Some(block.string()?),
            RESPONSE_TOPIC => {
                let t = block.string()?;
                if !topic::is_valid_topic_name(&t) {
                    return Err(DecodeError::Protocol("response topic is not a valid topic name"));
                }
                p.response_topic = Some(t);
            }
            CORRELATION_DATA => p.correlation_data = Some(block.binary()?),
            SUBSCRIPTION_IDENTIFIER => {
                let v = block.varint()?;
                if v == 0 {
                    return Err(DecodeError::Protocol("subscription identifier 0"));
                }
                p.subscription_identifiers.push(v);
            }
            SESSION_EXPIRY_INTERVAL => p.session_expiry_interval = Some(block.u32()?),
            ASSIGNED_CLIENT_IDENTIFIER => p.assigned_client_identifier = Some(block.string()?),
            SERVER_KEEP_ALIVE => p.server_keep_alive = Some(block.u16()?),
            AUTHENTICATION_METHOD => p.authentication_method = Some(block.string()?),
            AUTHENTICATION_DATA => p.authentication_data = Some(block.binary()?),
            REQUEST_PROBLEM_INFORMATION => {
                p.request_problem_information = flag(&mut block, "request problem information not 0 or 1")?
            }
            WILL_DELAY_INTERVAL => p.will_delay_interval = Some(block.u32()?),
            REQUEST_RESPONSE_INFORMATION => {
                p.request_response_information = flag(&mut block, "request response information not 0 or 1")?
            }
            RESPONSE_INFORMATION => p.response_information = Some(block.string()?),
            SERVER_REFERENCE => p.server_reference = Some(block.string()?),
            REASON_STRING => p.reason_string = Some(block.string()?),
            RECEIVE_MAXIMUM => p.receive_maximum = non_zero_u16(&mut block, "receive maximum 0")?,
            TOPIC_ALIAS_MAXIMUM => p.topic_alias_maximum = Some(block.u16()?),
            TOPIC_ALIAS => p.topic_alias = non_zero_u16(&mut block, "topic alias 0")?,
            MAXIMUM_QOS => p.maximum_qos = flag(&mut block, "maximum QoS not 0 or 1")?,
            RETAIN_AVAILABLE => p.retain_available = flag(&mut block, "retain available not 0 or 1")?,
            USER_PROPERTY => {
                let key = block.string()?;
                let value = block.string()?;
                p.user_properties.push((key, value));
            }
            MAXIMUM_PACKET_SIZE => match block.u32()? {
                0 => return Err(DecodeError::Protocol("maximum packet size 0")),
                v => p.maximum_packet_size = Some(v),
            },
            WILDCARD_SUBSCRIPTION_AVAILABLE => {
                p.wildcard_subscription_available = flag(&mut block, "wildcard subscription available not 0 or 1")?
            }
            SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
                p.subscription_identifiers_available =
                    flag(&mut block, "subscription identifiers available not 0 or 1")?
            }
            SHARED_SUBSCRIPTION_AVAILABLE => {
                p.shared_subscription_available = flag(&mut block, "shared subscription available not 0 or 1")?
            }
            _ => return Err(DecodeError::Malformed("unknown property identifier")),
        }
    }
    if p.authentication_data.is_some() && p.authentication_method.is_none() {
        return Err(DecodeError::Protocol("authentication data without authentication method"));
    }
    Ok(p)
}

/// Every defined identifier.
const KNOWN: u64 = {
    use id::*;
    set(&[
        PAYLOAD_FORMAT_INDICATOR,
        MESSAGE_EXPIRY_INTERVAL,
        CONTENT_TYPE,
        RESPONSE_TOPIC,
        CORRELATION_DATA,
        SUBSCRIPTION_IDENTIFIER,
        SESSION_EXPIRY_INTERVAL,
        ASSIGNED_CLIENT_IDENTIFIER,
        SERVER_KEEP_ALIVE,
        AUTHENTICATION_METHOD,
        AUTHENTICATION_DATA,
        REQUEST_PROBLEM_INFORMATION,
        WILL_DELAY_INTERVAL,
        REQUEST_RESPONSE_INFORMATION,
        RESPONSE_INFORMATION,
        SERVER_REFERENCE,
        REASON_STRING,
        RECEIVE_MAXIMUM,
        TOPIC_ALIAS_MAXIMUM,
        TOPIC_ALIAS,
        MAXIMUM_QOS,
        RETAIN_AVAILABLE,
        USER_PROPERTY,
        MAXIMUM_PACKET_SIZE,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        SHARED_SUBSCRIPTION_AVAILABLE,
    ])
};

impl Props {
    pub(crate) fn into_connect(self) -> ConnectProperties {
        ConnectProperties {
            session_expiry_interval: self.session_expiry_interval,
            receive_maximum: self.receive_maximum,
            maximum_packet_size: self.maximum_packet_size,
            topic_alias_maximum: self.topic_alias_maximum,
            request_response_information: self.request_response_information,
            request_problem_information: self.request_problem_information,
            user_properties: self.user_properties,
            authentication_method: self.authentication_method,
            authentication_data: self.authentication_data,
        }
    }

    pub(crate) fn into_connack(self) -> ConnAckProperties {
        ConnAckProperties {
            session_expiry_interval: self.session_expiry_interval,
            receive_maximum: self.receive_maximum,
            maximum_qos: self.maximum_qos,
            retain_available: self.retain_available,
            maximum_packet_size: self.maximum_packet_size,
            assigned_client_identifier: self.assigned_client_identifier,
            topic_alias_maximum: self.topic_alias_maximum,
            reason_string: self.reason_string,
            user_properties: self.user_properties,
            wildcard_subscription_available: self.wildcard_subscription_available,
            subscription_identifiers_available: self.subscription_identifiers_available,
            shared_subscription_available: self.shared_subscription_available,
            server_keep_alive: self.server_keep_alive,
            response_information: self.response_information,
            server_reference: self.server_reference,
            authentication_method: self.authentication_method,
            authentication_data: self.authentication_data,
        }
    }

    /// PUBLISH properties (also the will's, which cannot carry alias or ids).
    pub(crate) fn into_publish(self) -> PublishProperties {
        PublishProperties {
            payload_format_indicator: self.payload_format_indicator,
            message_expiry_interval: self.message_expiry_interval,
            topic_alias: self.topic_alias,
            response_topic: self.response_topic,
            correlation_data: self.correlation_data,
            user_properties: self.user_properties,
            subscription_identifiers: self.subscription_identifiers,
            content_type: self.content_type,
        }
    }
}

// ---------------------------------------------------------------------------
// Encoding

/// A set of properties that can write itself; [`write_block`] prefixes the length.
pub(crate) trait PropertyBlock {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError>;

    /// True if the block has no property (for the MQTT 5 short forms).
    fn is_empty(&self) -> Result<bool, EncodeError> {
        let mut c = Counter::default();
        self.write_props(&mut c)?;
        Ok(c.0 == 0)
    }
}

/// Writes Property Length then the properties.
pub(crate) fn write_block<S: Sink, P: PropertyBlock + ?Sized>(s: &mut S, props: &P) -> Result<(), EncodeError> {
    let mut counter = Counter::default();
    props.write_props(&mut counter)?;
    if counter.0 > MAX_REMAINING_LENGTH {
        return Err(EncodeError::PayloadTooLarge);
    }
    s.write_varint(counter.0)?;
    props.write_props(s)
}

fn put_u8<S: Sink>(s: &mut S, pid: u8, v: Option<u8>) {
    if let Some(v) = v {
        s.write_u8(pid);
        s.write_u8(v);
    }
}

fn put_flag<S: Sink>(s: &mut S, pid: u8, v: Option<u8>, what: &'static str) -> Result<(), EncodeError> {
    if matches!(v, Some(v) if v > 1) {
        return Err(EncodeError::InvalidPacket(what));
    }
    put_u8(s, pid, v);
    Ok(())
}

fn put_u16<S: Sink>(s: &mut S, pid: u8, v: Option<u16>) {
    if let Some(v) = v {
        s.write_u8(pid);
        s.write_u16(v);
    }
}

fn put_non_zero_u16<S: Sink>(s: &mut S, pid: u8, v: Option<u16>, what: &'static str) -> Result<(), EncodeError> {
    if v == Some(0) {
        return Err(EncodeError::InvalidPacket(what));
    }
    put_u16(s, pid, v);
    Ok(())
}

fn put_u32<S: Sink>(s: &mut S, pid: u8, v: Option<u32>) {
    if let Some(v) = v {
        s.write_u8(pid);
        s.write_u32(v);
    }
}

fn put_string<S: Sink>(s: &mut S, pid: u8, v: Option<&str>) -> Result<(), EncodeError> {
    if let Some(v) = v {
        s.write_u8(pid);
        s.write_string(v)?;
    }
    Ok(())
}

fn put_binary<S: Sink>(s: &mut S, pid: u8, v: Option<&Bytes>) -> Result<(), EncodeError> {
    if let Some(v) = v {
        s.write_u8(pid);
        s.write_binary(v)?;
    }
    Ok(())
}

fn put_subscription_identifier<S: Sink>(s: &mut S, v: u32) -> Result<(), EncodeError> {
    if v == 0 || v as usize > MAX_REMAINING_LENGTH {
        return Err(EncodeError::InvalidPacket("subscription identifier outside 1..=268435455"));
    }
    s.write_u8(id::SUBSCRIPTION_IDENTIFIER);
    s.write_varint(v as usize)
}

fn put_user_properties<S: Sink>(s: &mut S, props: &[(String, String)]) -> Result<(), EncodeError> {
    for (key, value) in props {
        s.write_u8(id::USER_PROPERTY);
        s.write_string(key)?;
        s.write_string(value)?;
    }
    Ok(())
}

fn put_auth<S: Sink>(s: &mut S, method: Option<&str>, data: Option<&Bytes>) -> Result<(), EncodeError> {
    if data.is_some() && method.is_none() {
        return Err(EncodeError::InvalidPacket("authentication data without authentication method"));
    }
    put_string(s, id::AUTHENTICATION_METHOD, method)?;
    put_binary(s, id::AUTHENTICATION_DATA, data)
}

impl PropertyBlock for ConnectProperties {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_u32(s, id::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        put_non_zero_u16(s, id::RECEIVE_MAXIMUM, self.receive_maximum, "receive maximum 0")?;
        if self.maximum_packet_size == Some(0) {
            return Err(EncodeError::InvalidPacket("maximum packet size 0"));
        }
        put_u32(s, id::MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        put_u16(s, id::TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        put_flag(
            s,
            id::REQUEST_RESPONSE_INFORMATION,
            self.request_response_information,
            "request response information not 0 or 1",
        )?;
        put_flag(
            s,
            id::REQUEST_PROBLEM_INFORMATION,
            self.request_problem_information,
            "request problem information not 0 or 1",
        )?;
        put_auth(s, self.authentication_method.as_deref(), self.authentication_data.as_ref())?;
        put_user_properties(s, &self.user_properties)
    }
}

impl PropertyBlock for ConnAckProperties {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_u32(s, id::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        put_non_zero_u16(s, id::RECEIVE_MAXIMUM, self.receive_maximum, "receive maximum 0")?;
        put_flag(s, id::MAXIMUM_QOS, self.maximum_qos, "maximum QoS not 0 or 1")?;
        put_flag(s, id::RETAIN_AVAILABLE, self.retain_available, "retain available not 0 or 1")?;
        if self.maximum_packet_size == Some(0) {
            return Err(EncodeError::InvalidPacket("maximum packet size 0"));
        }
        put_u32(s, id::MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        put_string(s, id::ASSIGNED_CLIENT_IDENTIFIER, self.assigned_client_identifier.as_deref())?;
        put_u16(s, id::TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        put_string(s, id::REASON_STRING, self.reason_string.as_deref())?;
        put_flag(
            s,
            id::WILDCARD_SUBSCRIPTION_AVAILABLE,
            self.wildcard_subscription_available,
            "wildcard subscription available not 0 or 1",
        )?;
        put_flag(
            s,
            id::SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            self.subscription_identifiers_available,
            "subscription identifiers available not 0 or 1",
        )?;
        put_flag(
            s,
            id::SHARED_SUBSCRIPTION_AVAILABLE,
            self.shared_subscription_available,
            "shared subscription available not 0 or 1",
        )?;
        put_u16(s, id::SERVER_KEEP_ALIVE, self.server_keep_alive);
        put_string(s, id::RESPONSE_INFORMATION, self.response_information.as_deref())?;
        put_string(s, id::SERVER_REFERENCE, self.server_reference.as_deref())?;
        put_auth(s, self.authentication_method.as_deref(), self.authentication_data.as_ref())?;
        put_user_properties(s, &self.user_properties)
    }
}

/// Properties shared by PUBLISH and the will.
fn put_message_props<S: Sink>(s: &mut S, p: &PublishProperties) -> Result<(), EncodeError> {
    put_flag(s, id::PAYLOAD_FORMAT_INDICATOR, p.payload_format_indicator, "payload format indicator not 0 or 1")?;
    put_u32(s, id::MESSAGE_EXPIRY_INTERVAL, p.message_expiry_interval);
    put_string(s, id::CONTENT_TYPE, p.content_type.as_deref())?;
    if let Some(t) = &p.response_topic {
        if !topic::is_valid_topic_name(t) {
            return Err(EncodeError::InvalidPacket("response topic is not a valid topic name"));
        }
    }
    put_string(s, id::RESPONSE_TOPIC, p.response_topic.as_deref())?;
    put_binary(s, id::CORRELATION_DATA, p.correlation_data.as_ref())?;
    put_user_properties(s, &p.user_properties)
}

impl PropertyBlock for PublishProperties {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_non_zero_u16(s, id::TOPIC_ALIAS, self.topic_alias, "topic alias 0")?;
        for &sid in &self.subscription_identifiers {
            put_subscription_identifier(s, sid)?;
        }
        put_message_props(s, self)
    }
}

/// Will properties: the will's message properties plus the Will Delay Interval.
pub(crate) struct WillProps<'a> {
    pub(crate) properties: &'a PublishProperties,
    pub(crate) delay_interval: Option<u32>,
}

impl PropertyBlock for WillProps<'_> {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        if self.properties.topic_alias.is_some() {
            return Err(EncodeError::InvalidPacket("topic alias in will properties"));
        }
        if !self.properties.subscription_identifiers.is_empty() {
            return Err(EncodeError::InvalidPacket("subscription identifier in will properties"));
        }
        put_u32(s, id::WILL_DELAY_INTERVAL, self.delay_interval);
        put_message_props(s, self.properties)
    }
}

/// Reason String and User Properties: the acks (PUBACK.., SUBACK, UNSUBACK) and,
/// with no reason string, UNSUBSCRIBE.
pub(crate) struct ReasonProps<'a> {
    pub(crate) reason_string: Option<&'a str>,
    pub(crate) user_properties: &'a [(String, String)],
}

impl PropertyBlock for ReasonProps<'_> {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_string(s, id::REASON_STRING, self.reason_string)?;
        put_user_properties(s, self.user_properties)
    }
}

/// SUBSCRIBE properties.
pub(crate) struct SubscribeProps<'a> {
    pub(crate) subscription_identifier: Option<u32>,
    pub(crate) user_properties: &'a [(String, String)],
}

impl PropertyBlock for SubscribeProps<'_> {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        if let Some(sid) = self.subscription_identifier {
            put_subscription_identifier(s, sid)?;
        }
        put_user_properties(s, self.user_properties)
    }
}

/// DISCONNECT properties.
pub(crate) struct DisconnectProps<'a> {
    pub(crate) session_expiry_interval: Option<u32>,
    pub(crate) reason_string: Option<&'a str>,
    pub(crate) server_reference: Option<&'a str>,
}

impl PropertyBlock for DisconnectProps<'_> {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_u32(s, id::SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        put_string(s, id::REASON_STRING, self.reason_string)?;
        put_string(s, id::SERVER_REFERENCE, self.server_reference)
    }
}

/// AUTH properties.
pub(crate) struct AuthProps<'a> {
    pub(crate) method: Option<&'a str>,
    pub(crate) data: Option<&'a Bytes>,
    pub(crate) reason_string: Option<&'a str>,
}

impl PropertyBlock for AuthProps<'_> {
    fn write_props<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_auth(s, self.method, self.data)?;
        put_string(s, id::REASON_STRING, self.reason_string)
    }
}
