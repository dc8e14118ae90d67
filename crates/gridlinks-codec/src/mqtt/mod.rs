//! MQTT 3.1, 3.1.1 and 5.0 packet codec.
//!
//! [`decode`] frames and parses one packet from a read buffer; [`encode`] appends one
//! packet to a write buffer. Both are pure functions of their arguments: the caller
//! says which [`ProtocolVersion`] the connection speaks (known after CONNECT), and
//! the codec applies that version's body layout. CONNECT names its own version, so
//! it is decoded and encoded according to the protocol name and level it carries.
//!
//! What the codec checks is what the specifications call a malformed packet or a
//! protocol error *visible in one packet*: fixed-header flags, lengths, UTF-8
//! strings, wildcard-free topic names, non-zero packet identifiers, property ids and
//! values, reason codes valid for the packet type. What needs session state or a
//! policy (topic aliases against the negotiated maximum, client-id rules that are
//! answered with a CONNACK code, topic-filter syntax that MQTT 5 answers with a
//! SUBACK code, direction of a packet) is left to the server; [`topic`] has the
//! filter checks it can use.
//!
//! Packets are kept lossless where the API has a place for a field. Some MQTT 5
//! fields have no place in these structs and are dropped on decode: user properties
//! of SUBACK, UNSUBACK, DISCONNECT and AUTH. On encode for 3.1/3.1.1 every MQTT 5
//! only field (properties, reason strings, reason codes of acks) is dropped.

mod decode;
mod encode;
mod error;
mod packet;
mod properties;
pub mod reason;
pub mod topic;
mod wire;

#[cfg(test)]
mod tests;

pub use decode::decode;
pub use encode::{encode, encode_publish};
pub use error::{DecodeError, EncodeError, InvalidQoS};
pub use packet::{
    Auth, ConnAck, ConnAckProperties, Connect, ConnectProperties, Disconnect, LastWill, Packet, PubResp, Publish,
    PublishProperties, PublishRef, SubAck, Subscribe, SubscriptionRequest, UnsubAck, Unsubscribe,
};
pub use wire::MAX_REMAINING_LENGTH;

/// The MQTT protocol revision a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProtocolVersion {
    /// MQTT 3.1: protocol name "MQIsdp", level 3.
    V3_1,
    /// MQTT 3.1.1: protocol name "MQTT", level 4.
    V3_1_1,
    /// MQTT 5.0: protocol name "MQTT", level 5.
    V5,
}

impl ProtocolVersion {
    /// True for MQTT 5, whose packets carry properties and reason codes.
    pub fn is_v5(self) -> bool {
        self == ProtocolVersion::V5
    }

    /// The protocol name written in CONNECT.
    pub fn protocol_name(self) -> &'static str {
        match self {
            ProtocolVersion::V3_1 => "MQIsdp",
            ProtocolVersion::V3_1_1 | ProtocolVersion::V5 => "MQTT",
        }
    }

    /// The protocol level byte written in CONNECT.
    pub fn protocol_level(self) -> u8 {
        match self {
            ProtocolVersion::V3_1 => 3,
            ProtocolVersion::V3_1_1 => 4,
            ProtocolVersion::V5 => 5,
        }
    }
}

/// Quality of service of a PUBLISH or a subscription, ordered (a copy goes at the lower
/// of the published and the granted QoS); `AtMostOnce` by default, as MQTT's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QoS {
    /// Fire and forget.
    #[default]
    AtMostOnce = 0,
    /// Acknowledged with PUBACK; may be delivered twice.
    AtLeastOnce = 1,
    /// Four-way handshake (PUBREC/PUBREL/PUBCOMP); delivered once.
    ExactlyOnce = 2,
}

impl TryFrom<u8> for QoS {
    type Error = InvalidQoS;

    fn try_from(value: u8) -> Result<Self, Self::Error> {
        match value {
            0 => Ok(QoS::AtMostOnce),
            1 => Ok(QoS::AtLeastOnce),
            2 => Ok(QoS::ExactlyOnce),
            other => Err(InvalidQoS(other)),
        }
    }
}

impl From<QoS> for u8 {
    fn from(qos: QoS) -> u8 {
        qos as u8
    }
}
