//! Packet structs, one per MQTT control packet (the four publish acknowledgements
//! share [`PubResp`]), and the [`Packet`] enum.
//!
//! Field names follow MQTT 5; in 3.1/3.1.1 the MQTT 5 only fields decode as
//! `None`/empty/0 and are dropped on encode. Durations are in seconds as on the
//! wire. `Debug` never prints payloads, passwords or authentication data, only
//! their length, so packets can be traced without leaking them.

use std::fmt;

use bytes::Bytes;

use super::{ProtocolVersion, QoS};

/// Prints a byte field as its length only.
struct Redacted(usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<REDACTED {} bytes>", self.0)
    }
}

fn redact(data: &Option<Bytes>) -> Option<Redacted> {
    data.as_ref().map(|b| Redacted(b.len()))
}

/// CONNECT: the first packet a client sends.
#[derive(Clone, PartialEq, Eq)]
pub struct Connect {
    /// Version named by the protocol name and level; the connection speaks it from now on.
    pub protocol: ProtocolVersion,
    /// Client identifier; may be empty (the server decides whether to assign one or
    /// reject with CONNACK 0x02 / 0x85).
    pub client_id: String,
    /// Keep-alive in seconds; 0 disables it.
    pub keep_alive: u16,
    /// Clean Session (3.1.1) / Clean Start (5).
    pub clean_start: bool,
    /// User name, if the user-name flag was set.
    pub username: Option<String>,
    /// Password (binary data), if the password flag was set.
    pub password: Option<Bytes>,
    /// Last will, if the will flag was set.
    pub will: Option<LastWill>,
    /// MQTT 5 CONNECT properties (default in 3.x).
    pub properties: ConnectProperties,
}

impl fmt::Debug for Connect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connect")
            .field("protocol", &self.protocol)
            .field("client_id", &self.client_id)
            .field("keep_alive", &self.keep_alive)
            .field("clean_start", &self.clean_start)
            .field("username", &self.username)
            .field("password", &redact(&self.password))
            .field("will", &self.will)
            .field("properties", &self.properties)
            .finish()
    }
}

/// MQTT 5 CONNECT properties.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnectProperties {
    /// Session Expiry Interval (0x11), seconds; absent means 0.
    pub session_expiry_interval: Option<u32>,
    /// Receive Maximum (0x21): in-flight QoS>0 publishes the client accepts; never 0.
    pub receive_maximum: Option<u16>,
    /// Maximum Packet Size (0x27) the client accepts; never 0.
    pub maximum_packet_size: Option<u32>,
    /// Topic Alias Maximum (0x22) the client accepts.
    pub topic_alias_maximum: Option<u16>,
    /// Request Response Information (0x19), 0 or 1.
    pub request_response_information: Option<u8>,
    /// Request Problem Information (0x17), 0 or 1.
    pub request_problem_information: Option<u8>,
    /// User Properties (0x26), in wire order.
    pub user_properties: Vec<(String, String)>,
    /// Authentication Method (0x15) for enhanced authentication.
    pub authentication_method: Option<String>,
    /// Authentication Data (0x16); only with a method.
    pub authentication_data: Option<Bytes>,
}

impl fmt::Debug for ConnectProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectProperties")
            .field("session_expiry_interval", &self.session_expiry_interval)
            .field("receive_maximum", &self.receive_maximum)
            .field("maximum_packet_size", &self.maximum_packet_size)
            .field("topic_alias_maximum", &self.topic_alias_maximum)
            .field("request_response_information", &self.request_response_information)
            .field("request_problem_information", &self.request_problem_information)
            .field("user_properties", &self.user_properties)
            .field("authentication_method", &self.authentication_method)
            .field("authentication_data", &redact(&self.authentication_data))
            .finish()
    }
}

/// The will message carried by CONNECT.
#[derive(Clone, PartialEq, Eq)]
pub struct LastWill {
    /// Topic name the will is published to (no wildcards).
    pub topic: String,
    /// Will payload.
    pub payload: Bytes,
    /// QoS of the will publish.
    pub qos: QoS,
    /// Retain flag of the will publish.
    pub retain: bool,
    /// MQTT 5 will properties that become the will PUBLISH's properties (payload
    /// format, message expiry, content type, response topic, correlation data, user
    /// properties). Topic alias and subscription identifiers are not allowed here.
    pub properties: PublishProperties,
    /// MQTT 5 Will Delay Interval (0x18), seconds. Not a PUBLISH property, so it is
    /// kept here rather than in `properties`.
    pub delay_interval: Option<u32>,
}

impl fmt::Debug for LastWill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LastWill")
            .field("topic", &self.topic)
            .field("payload", &Redacted(self.payload.len()))
            .field("qos", &self.qos)
            .field("retain", &self.retain)
            .field("properties", &self.properties)
            .field("delay_interval", &self.delay_interval)
            .finish()
    }
}

/// CONNACK: the server's answer to CONNECT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnAck {
    /// Session Present flag.
    pub session_present: bool,
    /// 3.x return code (0..=5) or MQTT 5 reason code, raw; see [`super::reason`].
    pub code: u8,
    /// MQTT 5 CONNACK properties (default in 3.x).
    pub properties: ConnAckProperties,
}

/// MQTT 5 CONNACK properties.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnAckProperties {
    /// Session Expiry Interval (0x11) the server uses, seconds.
    pub session_expiry_interval: Option<u32>,
    /// Receive Maximum (0x21) the server accepts; never 0.
    pub receive_maximum: Option<u16>,
    /// Maximum QoS (0x24) the server supports, 0 or 1 (absent = 2).
    pub maximum_qos: Option<u8>,
    /// Retain Available (0x25), 0 or 1.
    pub retain_available: Option<u8>,
    /// Maximum Packet Size (0x27) the server accepts; never 0.
    pub maximum_packet_size: Option<u32>,
    /// Assigned Client Identifier (0x12) when the client sent an empty one.
    pub assigned_client_identifier: Option<String>,
    /// Topic Alias Maximum (0x22) the server accepts.
    pub topic_alias_maximum: Option<u16>,
    /// Reason String (0x1F), human readable.
    pub reason_string: Option<String>,
    /// User Properties (0x26), in wire order.
    pub user_properties: Vec<(String, String)>,
    /// Wildcard Subscription Available (0x28), 0 or 1.
    pub wildcard_subscription_available: Option<u8>,
    /// Subscription Identifiers Available (0x29), 0 or 1.
    pub subscription_identifiers_available: Option<u8>,
    /// Shared Subscription Available (0x2A), 0 or 1.
    pub shared_subscription_available: Option<u8>,
    /// Server Keep Alive (0x13), seconds; overrides the client's keep-alive.
    pub server_keep_alive: Option<u16>,
    /// Response Information (0x1A).
    pub response_information: Option<String>,
    /// Server Reference (0x1C): another server to use.
    pub server_reference: Option<String>,
    /// Authentication Method (0x15).
    pub authentication_method: Option<String>,
    /// Authentication Data (0x16); only with a method.
    pub authentication_data: Option<Bytes>,
}

impl fmt::Debug for ConnAckProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnAckProperties")
            .field("session_expiry_interval", &self.session_expiry_interval)
            .field("receive_maximum", &self.receive_maximum)
            .field("maximum_qos", &self.maximum_qos)
            .field("retain_available", &self.retain_available)
            .field("maximum_packet_size", &self.maximum_packet_size)
            .field("assigned_client_identifier", &self.assigned_client_identifier)
            .field("topic_alias_maximum", &self.topic_alias_maximum)
            .field("reason_string", &self.reason_string)
            .field("user_properties", &self.user_properties)
            .field("wildcard_subscription_available", &self.wildcard_subscription_available)
            .field("subscription_identifiers_available", &self.subscription_identifiers_available)
            .field("shared_subscription_available", &self.shared_subscription_available)
            .field("server_keep_alive", &self.server_keep_alive)
            .field("response_information", &self.response_information)
            .field("server_reference", &self.server_reference)
            .field("authentication_method", &self.authentication_method)
            .field("authentication_data", &redact(&self.authentication_data))
            .finish()
    }
}

/// PUBLISH: an application message.
#[derive(Clone, PartialEq, Eq)]
pub struct Publish {
    /// DUP flag: a redelivery. Always false at QoS 0.
    pub dup: bool,
    /// Delivery QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name (no wildcards). Empty only in MQTT 5 with a topic alias.
    pub topic: String,
    /// Packet identifier: `Some(non-zero)` exactly when QoS > 0.
    pub packet_id: Option<u16>,
    /// Application payload, a zero-copy slice of the read buffer.
    pub payload: Bytes,
    /// MQTT 5 PUBLISH properties (default in 3.x).
    pub properties: PublishProperties,
}

/// A PUBLISH by reference, for a server that sends one message to many clients: it is
/// encoded ([`encode_publish`](super::encode_publish)) without building a [`Publish`] and
/// cloning the topic and properties for every copy.
#[derive(Clone, Copy)]
pub struct PublishRef<'a> {
    /// DUP flag: a redelivery. Always false at QoS 0.
    pub dup: bool,
    /// Delivery QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// Topic name (no wildcards). Empty only in MQTT 5 with a topic alias.
    pub topic: &'a str,
    /// Packet identifier: `Some(non-zero)` exactly when QoS > 0.
    pub packet_id: Option<u16>,
    /// Application payload.
    pub payload: &'a [u8],
    /// MQTT 5 PUBLISH properties (ignored in 3.x).
    pub properties: &'a PublishProperties,
}

impl Publish {
    /// This PUBLISH by reference.
    pub fn as_ref(&self) -> PublishRef<'_> {
        PublishRef {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            topic: &self.topic,
            packet_id: self.packet_id,
            payload: &self.payload,
            properties: &self.properties,
        }
    }
}

impl fmt::Debug for Publish {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publish")
            .field("dup", &self.dup)
            .field("qos", &self.qos)
            .field("retain", &self.retain)
            .field("topic", &self.topic)
            .field("packet_id", &self.packet_id)
            .field("payload", &Redacted(self.payload.len()))
            .field("properties", &self.properties)
            .finish()
    }
}

/// MQTT 5 PUBLISH (and will) properties.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishProperties {
    /// Payload Format Indicator (0x01): 0 bytes, 1 UTF-8.
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval (0x02), seconds.
    pub message_expiry_interval: Option<u32>,
    /// Topic Alias (0x23); never 0. Not allowed in a will.
    pub topic_alias: Option<u16>,
    /// Response Topic (0x08), a topic name.
    pub response_topic: Option<String>,
    /// Correlation Data (0x09).
    pub correlation_data: Option<Bytes>,
    /// User Properties (0x26), in wire order.
    pub user_properties: Vec<(String, String)>,
    /// Subscription Identifiers (0x0B) of the matching subscriptions (server to
    /// client only); each in 1..=268,435,455. Not allowed in a will.
    pub subscription_identifiers: Vec<u32>,
    /// Content Type (0x03).
    pub content_type: Option<String>,
}

impl PublishProperties {
    /// True when no property is set.
    pub fn is_empty(&self) -> bool {
        // Destructured so that a new field cannot be forgotten here.
        let Self {
            payload_format_indicator,
            message_expiry_interval,
            topic_alias,
            response_topic,
            correlation_data,
            user_properties,
            subscription_identifiers,
            content_type,
        } = self;
        payload_format_indicator.is_none()
            && message_expiry_interval.is_none()
            && topic_alias.is_none()
            && response_topic.is_none()
            && correlation_data.is_none()
            && user_properties.is_empty()
            && subscription_identifiers.is_empty()
            && content_type.is_none()
    }
}

/// PUBACK, PUBREC, PUBREL or PUBCOMP (which one is the [`Packet`] variant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubResp {
    /// Packet identifier of the acknowledged PUBLISH; never 0.
    pub packet_id: u16,
    /// MQTT 5 reason code; 0 = success. Always 0 in 3.x.
    pub reason: u8,
    /// MQTT 5 Reason String (0x1F).
    pub reason_string: Option<String>,
    /// MQTT 5 User Properties (0x26).
    pub user_properties: Vec<(String, String)>,
}

/// One topic filter of a SUBSCRIBE with its subscription options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionRequest {
    /// Topic filter; its syntax is checked by the server ([`super::topic`]).
    pub filter: String,
    /// Maximum QoS requested.
    pub qos: QoS,
    /// MQTT 5 No Local option.
    pub no_local: bool,
    /// MQTT 5 Retain As Published option.
    pub retain_as_published: bool,
    /// MQTT 5 Retain Handling option, 0..=2.
    pub retain_handling: u8,
}

/// SUBSCRIBE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    /// Packet identifier; never 0.
    pub packet_id: u16,
    /// At least one filter.
    pub filters: Vec<SubscriptionRequest>,
    /// MQTT 5 Subscription Identifier (0x0B), 1..=268,435,455.
    pub subscription_identifier: Option<u32>,
    /// MQTT 5 User Properties (0x26).
    pub user_properties: Vec<(String, String)>,
}

/// SUBACK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubAck {
    /// Packet identifier of the SUBSCRIBE; never 0.
    pub packet_id: u16,
    /// One return / reason code per requested filter (granted QoS or failure).
    pub return_codes: Vec<u8>,
    /// MQTT 5 Reason String (0x1F).
    pub reason_string: Option<String>,
}

/// UNSUBSCRIBE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsubscribe {
    /// Packet identifier; never 0.
    pub packet_id: u16,
    /// At least one topic filter.
    pub filters: Vec<String>,
    /// MQTT 5 User Properties (0x26).
    pub user_properties: Vec<(String, String)>,
}

/// UNSUBACK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsubAck {
    /// Packet identifier of the UNSUBSCRIBE; never 0.
    pub packet_id: u16,
    /// MQTT 5 reason code per filter; only on the wire in MQTT 5 (empty in 3.x).
    pub reason_codes: Vec<u8>,
    /// MQTT 5 Reason String (0x1F).
    pub reason_string: Option<String>,
}

/// DISCONNECT. In 3.x it has no body and `reason` is 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disconnect {
    /// MQTT 5 reason code; 0 = normal disconnection.
    pub reason: u8,
    /// MQTT 5 Session Expiry Interval (0x11), seconds (client to server only).
    pub session_expiry_interval: Option<u32>,
    /// MQTT 5 Reason String (0x1F).
    pub reason_string: Option<String>,
    /// MQTT 5 Server Reference (0x1C).
    pub server_reference: Option<String>,
}

/// AUTH (MQTT 5 only): enhanced authentication exchange.
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    /// Reason code: 0x00 success, 0x18 continue authentication, 0x19 re-authenticate.
    pub reason: u8,
    /// Authentication Method (0x15).
    pub method: Option<String>,
    /// Authentication Data (0x16); only with a method.
    pub data: Option<Bytes>,
    /// Reason String (0x1F).
    pub reason_string: Option<String>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("reason", &self.reason)
            .field("method", &self.method)
            .field("data", &redact(&self.data))
            .field("reason_string", &self.reason_string)
            .finish()
    }
}

/// Any MQTT control packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    /// CONNECT (boxed: it is by far the largest packet struct).
    Connect(Box<Connect>),
    /// CONNACK.
    ConnAck(ConnAck),
    /// PUBLISH.
    Publish(Publish),
    /// PUBACK (QoS 1 acknowledgement).
    PubAck(PubResp),
    /// PUBREC (QoS 2, step 1).
    PubRec(PubResp),
    /// PUBREL (QoS 2, step 2).
    PubRel(PubResp),
    /// PUBCOMP (QoS 2, step 3).
    PubComp(PubResp),
    /// SUBSCRIBE.
    Subscribe(Subscribe),
    /// SUBACK.
    SubAck(SubAck),
    /// UNSUBSCRIBE.
    Unsubscribe(Unsubscribe),
    /// UNSUBACK.
    UnsubAck(UnsubAck),
    /// PINGREQ.
    PingReq,
    /// PINGRESP.
    PingResp,
    /// DISCONNECT.
    Disconnect(Disconnect),
    /// AUTH (MQTT 5 only).
    Auth(Auth),
}

impl Packet {
    /// The packet type name as the specifications spell it, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Connect(_) => "CONNECT",
            Packet::ConnAck(_) => "CONNACK",
            Packet::Publish(_) => "PUBLISH",
            Packet::PubAck(_) => "PUBACK",
            Packet::PubRec(_) => "PUBREC",
            Packet::PubRel(_) => "PUBREL",
            Packet::PubComp(_) => "PUBCOMP",
            Packet::Subscribe(_) => "SUBSCRIBE",
            Packet::SubAck(_) => "SUBACK",
            Packet::Unsubscribe(_) => "UNSUBSCRIBE",
            Packet::UnsubAck(_) => "UNSUBACK",
            Packet::PingReq => "PINGREQ",
            Packet::PingResp => "PINGRESP",
            Packet::Disconnect(_) => "DISCONNECT",
            Packet::Auth(_) => "AUTH",
        }
    }
}
