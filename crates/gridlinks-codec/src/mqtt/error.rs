//! Decode and encode errors.
//!
//! A [`DecodeError`] means the peer broke the protocol: the connection cannot be
//! resynchronised and must be closed (in MQTT 5 after a DISCONNECT with the matching
//! reason code, see [`DecodeError::reason_code`]). "Need more bytes" is not an error
//! but `Ok(None)` from [`decode`](super::decode).

/// Why a packet could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes do not form a packet of the protocol (MQTT 5 reason 0x81).
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// The packet is well formed but breaks a protocol rule (MQTT 5 reason 0x82).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// The fixed header announces a packet bigger than the caller allows (MQTT 5
    /// reason 0x95). Detected from the fixed header alone, before the body arrives.
    #[error("packet of {size} bytes exceeds the maximum of {max} bytes")]
    PacketTooLarge {
        /// Whole packet size announced by the fixed header, header included.
        size: usize,
        /// The `max_packet_size` passed to `decode`.
        max: usize,
    },
    /// CONNECT named a protocol or level this codec does not speak (answer with
    /// CONNACK return code 0x01 / reason 0x84).
    #[error("unsupported protocol {name:?} level {level}")]
    UnsupportedProtocol {
        /// Protocol name from CONNECT (lossily converted if not UTF-8).
        name: String,
        /// Protocol level byte from CONNECT.
        level: u8,
    },
}

impl DecodeError {
    /// The MQTT 5 reason code a server sends (in CONNACK or DISCONNECT) for this error.
    pub fn reason_code(&self) -> u8 {
        match self {
            DecodeError::Malformed(_) => super::reason::MALFORMED_PACKET,
            DecodeError::Protocol(_) => super::reason::PROTOCOL_ERROR,
            DecodeError::PacketTooLarge { .. } => super::reason::PACKET_TOO_LARGE,
            DecodeError::UnsupportedProtocol { .. } => super::reason::UNSUPPORTED_PROTOCOL_VERSION,
        }
    }
}

/// Why a packet could not be encoded. Each one is a bug in the caller: the codec
/// refuses to write what its own decoder (or a peer's) would reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The packet's remaining length would exceed 268,435,455 bytes.
    #[error("packet exceeds the maximum remaining length of 268435455 bytes")]
    PayloadTooLarge,
    /// A UTF-8 string field is longer than 65,535 bytes.
    #[error("string field longer than 65535 bytes")]
    StringTooLong,
    /// A binary field (password, will payload, correlation or authentication data)
    /// is longer than 65,535 bytes.
    #[error("binary field longer than 65535 bytes")]
    BinaryTooLong,
    /// The packet cannot be expressed in the requested protocol version.
    #[error("packet not valid for this protocol version: {0}")]
    InvalidPacketForVersion(&'static str),
    /// The packet breaks a rule of the protocol (e.g. QoS 1 without packet id).
    #[error("invalid packet: {0}")]
    InvalidPacket(&'static str),
    /// A reason or return code that the packet type does not allow in this version.
    #[error("reason code {code:#04x} not valid in {packet}")]
    InvalidReasonCode {
        /// Packet type name, e.g. "PUBACK".
        packet: &'static str,
        /// The offending code.
        code: u8,
    },
}

/// A QoS value outside 0..=2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid QoS {0}")]
pub struct InvalidQoS(pub u8);

impl From<InvalidQoS> for DecodeError {
    fn from(_: InvalidQoS) -> Self {
        DecodeError::Malformed("QoS 3")
    }
}
