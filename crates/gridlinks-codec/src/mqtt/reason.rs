//! Reason and return codes: named constants and, per packet type, the set the
//! specifications allow (MQTT 5 §2.4 and the packet chapters; MQTT 3.1.1 §3.2.2.3
//! and §3.9.3). Decoding rejects a code outside its packet's set as a protocol
//! error; encoding refuses to write one.

use super::ProtocolVersion;

// MQTT 3.x CONNACK return codes.
/// 3.x CONNACK: connection accepted.
pub const V3_CONNECTION_ACCEPTED: u8 = 0x00;
/// 3.x CONNACK: unacceptable protocol version.
pub const V3_UNACCEPTABLE_PROTOCOL_VERSION: u8 = 0x01;
/// 3.x CONNACK: identifier rejected.
pub const V3_IDENTIFIER_REJECTED: u8 = 0x02;
/// 3.x CONNACK: server unavailable.
pub const V3_SERVER_UNAVAILABLE: u8 = 0x03;
/// 3.x CONNACK: bad user name or password.
pub const V3_BAD_USERNAME_OR_PASSWORD: u8 = 0x04;
/// 3.x CONNACK: not authorized.
pub const V3_NOT_AUTHORIZED: u8 = 0x05;
/// 3.1.1 SUBACK: subscription failure.
pub const V3_SUBSCRIPTION_FAILURE: u8 = 0x80;

// MQTT 5 reason codes.
/// Success / normal disconnection / granted QoS 0.
pub const SUCCESS: u8 = 0x00;
/// SUBACK: granted QoS 1.
pub const GRANTED_QOS_1: u8 = 0x01;
/// SUBACK: granted QoS 2.
pub const GRANTED_QOS_2: u8 = 0x02;
/// DISCONNECT: disconnect with will message.
pub const DISCONNECT_WITH_WILL_MESSAGE: u8 = 0x04;
/// PUBACK/PUBREC: no matching subscribers.
pub const NO_MATCHING_SUBSCRIBERS: u8 = 0x10;
/// UNSUBACK: no subscription existed.
pub const NO_SUBSCRIPTION_EXISTED: u8 = 0x11;
/// AUTH: continue authentication.
pub const CONTINUE_AUTHENTICATION: u8 = 0x18;
/// AUTH: re-authenticate.
pub const RE_AUTHENTICATE: u8 = 0x19;
/// Unspecified error.
pub const UNSPECIFIED_ERROR: u8 = 0x80;
/// Malformed packet.
pub const MALFORMED_PACKET: u8 = 0x81;
/// Protocol error.
pub const PROTOCOL_ERROR: u8 = 0x82;
/// Implementation specific error.
pub const IMPLEMENTATION_SPECIFIC_ERROR: u8 = 0x83;
/// CONNACK: unsupported protocol version.
pub const UNSUPPORTED_PROTOCOL_VERSION: u8 = 0x84;
/// CONNACK: client identifier not valid.
pub const CLIENT_IDENTIFIER_NOT_VALID: u8 = 0x85;
/// CONNACK: bad user name or password.
pub const BAD_USER_NAME_OR_PASSWORD: u8 = 0x86;
/// Not authorized.
pub const NOT_AUTHORIZED: u8 = 0x87;
/// Server unavailable.
pub const SERVER_UNAVAILABLE: u8 = 0x88;
/// Server busy.
pub const SERVER_BUSY: u8 = 0x89;
/// CONNACK: banned.
pub const BANNED: u8 = 0x8A;
/// DISCONNECT: server shutting down.
pub const SERVER_SHUTTING_DOWN: u8 = 0x8B;
/// Bad authentication method.
pub const BAD_AUTHENTICATION_METHOD: u8 = 0x8C;
/// DISCONNECT: keep alive timeout.
pub const KEEP_ALIVE_TIMEOUT: u8 = 0x8D;
/// DISCONNECT: session taken over.
pub const SESSION_TAKEN_OVER: u8 = 0x8E;
/// Topic filter invalid.
pub const TOPIC_FILTER_INVALID: u8 = 0x8F;
/// Topic name invalid.
pub const TOPIC_NAME_INVALID: u8 = 0x90;
/// Packet identifier in use.
pub const PACKET_IDENTIFIER_IN_USE: u8 = 0x91;
/// PUBREL/PUBCOMP: packet identifier not found.
pub const PACKET_IDENTIFIER_NOT_FOUND: u8 = 0x92;
/// DISCONNECT: receive maximum exceeded.
pub const RECEIVE_MAXIMUM_EXCEEDED: u8 = 0x93;
/// DISCONNECT: topic alias invalid.
pub const TOPIC_ALIAS_INVALID: u8 = 0x94;
/// Packet too large.
pub const PACKET_TOO_LARGE: u8 = 0x95;
/// DISCONNECT: message rate too high.
pub const MESSAGE_RATE_TOO_HIGH: u8 = 0x96;
/// Quota exceeded.
pub const QUOTA_EXCEEDED: u8 = 0x97;
/// DISCONNECT: administrative action.
pub const ADMINISTRATIVE_ACTION: u8 = 0x98;
/// Payload format invalid.
pub const PAYLOAD_FORMAT_INVALID: u8 = 0x99;
/// Retain not supported.
pub const RETAIN_NOT_SUPPORTED: u8 = 0x9A;
/// QoS not supported.
pub const QOS_NOT_SUPPORTED: u8 = 0x9B;
/// Use another server.
pub const USE_ANOTHER_SERVER: u8 = 0x9C;
/// Server moved.
pub const SERVER_MOVED: u8 = 0x9D;
/// Shared subscriptions not supported.
pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0x9E;
/// Connection rate exceeded.
pub const CONNECTION_RATE_EXCEEDED: u8 = 0x9F;
/// DISCONNECT: maximum connect time.
pub const MAXIMUM_CONNECT_TIME: u8 = 0xA0;
/// Subscription identifiers not supported.
pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: u8 = 0xA1;
/// Wildcard subscriptions not supported.
pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0xA2;

const V5_CONNACK: &[u8] = &[
    0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B,
    0x9C, 0x9D, 0x9F,
];
const V5_PUBACK_PUBREC: &[u8] = &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99];
const V5_PUBREL_PUBCOMP: &[u8] = &[0x00, 0x92];
const V5_SUBACK: &[u8] = &[0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2];
const V3_SUBACK: &[u8] = &[0x00, 0x01, 0x02, 0x80];
const V5_UNSUBACK: &[u8] = &[0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91];
const V5_DISCONNECT: &[u8] = &[
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98,
    0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
];
const V5_AUTH: &[u8] = &[0x00, 0x18, 0x19];

/// True if `code` may appear in a CONNACK of `version`.
pub fn valid_connack(version: ProtocolVersion, code: u8) -> bool {
    if version.is_v5() {
        V5_CONNACK.contains(&code)
    } else {
        code <= V3_NOT_AUTHORIZED
    }
}

/// True if `code` may appear in an MQTT 5 PUBACK or PUBREC.
pub fn valid_puback(code: u8) -> bool {
    V5_PUBACK_PUBREC.contains(&code)
}

/// True if `code` may appear in an MQTT 5 PUBREL or PUBCOMP.
pub fn valid_pubrel(code: u8) -> bool {
    V5_PUBREL_PUBCOMP.contains(&code)
}

/// True if `code` may appear in a SUBACK of `version`.
pub fn valid_suback(version: ProtocolVersion, code: u8) -> bool {
    if version.is_v5() {
        V5_SUBACK.contains(&code)
    } else {
        V3_SUBACK.contains(&code)
    }
}

/// True if `code` may appear in an MQTT 5 UNSUBACK.
pub fn valid_unsuback(code: u8) -> bool {
    V5_UNSUBACK.contains(&code)
}

/// True if `code` may appear in an MQTT 5 DISCONNECT.
pub fn valid_disconnect(code: u8) -> bool {
    V5_DISCONNECT.contains(&code)
}

/// True if `code` may appear in an AUTH.
pub fn valid_auth(code: u8) -> bool {
    V5_AUTH.contains(&code)
}
