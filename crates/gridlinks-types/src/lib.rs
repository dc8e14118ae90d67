//! Core domain types shared by every GridLinks crate: newtype ids ([`DeviceId`],
//! [`ProfileId`]),
//! millisecond timestamps ([`Ts`]), typed telemetry values ([`Value`]), one message's
//! worth of points at one timestamp ([`TsRecord`]), attribute scopes ([`AttributeScope`]) and
//! the identities device protocols without tokens name devices by ([`ProtocolIdentity`]).
//!
//! This crate does no I/O. Value typing follows ThingsBoard: JSON booleans are
//! `Bool`, integers that fit an `i64` are `Long`, other finite numbers are `Double`,
//! strings are `Str`, objects and arrays are kept verbatim as `Json`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A device's identity: a UUID, as in ThingsBoard (`{"entityType":"DEVICE","id":"…"}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DeviceId(pub Uuid);

impl DeviceId {
    /// A fresh random id.
    pub fn new_random() -> Self {
        Self(Uuid::new_v4())
    }

    /// The 16 bytes used as a storage key prefix (big-endian, so ordering is stable).
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    /// Rebuilds an id from its 16 storage bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(Uuid::from_bytes(bytes))
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for DeviceId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// A device profile's identity (`{"entityType":"DEVICE_PROFILE","id":"…"}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProfileId(pub Uuid);

impl ProfileId {
    /// A fresh random id (profiles created through the API).
    pub fn new_random() -> Self {
        Self(Uuid::new_v4())
    }

    /// The id of a profile created for a device type name: the same for the same name in
    /// every installation (devices stored before profiles were entities name their profile
    /// by type only, and keep pointing at it by this id).
    pub fn for_name(name: &str) -> Self {
        Self(Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("gridlinks/device-profile/{name}").as_bytes()))
    }
}

impl fmt::Display for ProfileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for ProfileId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// Milliseconds since the Unix epoch, the unit ThingsBoard uses on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Ts(pub i64);

impl Ts {
    /// The current wall-clock time.
    pub fn now() -> Self {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Self(ms)
    }
}

/// One telemetry or attribute value, typed as ThingsBoard types it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `true` / `false`.
    Bool(bool),
    /// An integer that fits in an `i64`.
    Long(i64),
    /// Any other finite number.
    Double(f64),
    /// A JSON string.
    Str(String),
    /// A JSON object or array, kept as its compact JSON text.
    Json(String),
}

/// Why a JSON value cannot be a telemetry value.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ValueError {
    /// `null` has no ThingsBoard type.
    #[error("null is not a valid value")]
    Null,
    /// NaN or an infinity (e.g. a number literal too large for a double).
    #[error("number is not finite")]
    NotFinite,
}

impl Value {
    /// Types a JSON value the way ThingsBoard does.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, ValueError> {
        use serde_json::Value as J;
        Ok(match v {
            J::Null => return Err(ValueError::Null),
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Value::Long(i)
                } else {
                    let f = n.as_f64().ok_or(ValueError::NotFinite)?;
                    if !f.is_finite() {
                        return Err(ValueError::NotFinite);
                    }
                    Value::Double(f)
                }
            }
            J::String(s) => Value::Str(s.clone()),
            J::Array(_) | J::Object(_) => Value::Json(v.to_string()),
        })
    }

    /// The value as typed JSON (`useStrictDataTypes=true` in ThingsBoard's REST API).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Bool(b) => J::Bool(*b),
            Value::Long(i) => J::from(*i),
            Value::Double(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Json(s) => serde_json::from_str(s).unwrap_or_else(|_| J::String(s.clone())),
        }
    }

    /// The value as a string (ThingsBoard's REST default, `useStrictDataTypes=false`).
    pub fn to_display_string(&self) -> String {
        match self {
            Value::Bool(b) => b.to_string(),
            Value::Long(i) => i.to_string(),
            Value::Double(f) => format_double(*f),
            Value::Str(s) | Value::Json(s) => s.clone(),
        }
    }

    /// The value as a number, if it is one (used by aggregation).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Long(i) => Some(*i as f64),
            Value::Double(f) => Some(*f),
            _ => None,
        }
    }
}

/// Formats a double the way Java's `Double.toString` does for common values
/// (`1.0`, not `1`), so string-typed REST answers look like ThingsBoard's.
fn format_double(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{f:.1}")
    } else {
        f.to_string()
    }
}

/// How a device protocol without tokens knows a device (a custom TCP protocol's address
/// field, a meter's serial number): the protocol's name and the identity within it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProtocolIdentity {
    /// The protocol (a listener's `protocol`, e.g. `lamp`).
    pub protocol: String,
    /// The device's identity in that protocol (e.g. `000000000001`).
    pub id: String,
}

/// Why a protocol identity was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// A protocol name other than 1 to 64 lowercase letters, digits, `-` or `_`.
    #[error("invalid protocol name {0:?}: 1 to 64 lowercase letters, digits, - or _")]
    Protocol(String),
    /// An identity other than 1 to 128 letters, digits or `._:-`.
    #[error("invalid device identity {0:?}: 1 to 128 letters, digits or ._:-")]
    Id(String),
}

impl ProtocolIdentity {
    /// Checks both parts: names that can appear in a device name (`{protocol}-{id}`), a
    /// storage key and a log line as they are.
    pub fn validate(&self) -> Result<(), IdentityError> {
        check_protocol_name(&self.protocol)?;
        check_identity(&self.id)
    }

    /// The name of a device created for this identity: `{protocol}-{id}`.
    pub fn device_name(&self) -> String {
        format!("{}-{}", self.protocol, self.id)
    }
}

/// 1 to 64 lowercase ASCII letters, digits, `-` or `_`.
pub fn check_protocol_name(name: &str) -> Result<(), IdentityError> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(IdentityError::Protocol(name.chars().take(80).collect()))
    }
}

/// 1 to 128 ASCII letters, digits or `._:-`.
pub fn check_identity(id: &str) -> Result<(), IdentityError> {
    let ok = (1..=128).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(IdentityError::Id(id.chars().take(140).collect()))
    }
}

/// All values a device reported at one timestamp (one ThingsBoard `{"ts","values"}` object).
#[derive(Clone, Debug, PartialEq)]
pub struct TsRecord {
    /// When the values were measured (ms since epoch).
    pub ts: Ts,
    /// Key/value pairs; a key appears at most once.
    pub values: Vec<(String, Value)>,
}

/// ThingsBoard's three attribute scopes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttributeScope {
    /// Reported by the device itself.
    Client,
    /// Set by the server, visible to the device.
    Shared,
    /// Set by the server, private to it.
    Server,
}

impl AttributeScope {
    /// Every scope, in ThingsBoard's order.
    pub const ALL: [AttributeScope; 3] = [Self::Client, Self::Shared, Self::Server];

    /// ThingsBoard's wire name (`CLIENT_SCOPE`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "CLIENT_SCOPE",
            Self::Shared => "SHARED_SCOPE",
            Self::Server => "SERVER_SCOPE",
        }
    }

    /// One-byte tag used in storage keys.
    pub fn tag(self) -> u8 {
        match self {
            Self::Client => 1,
            Self::Shared => 2,
            Self::Server => 3,
        }
    }

    /// Inverse of [`AttributeScope::tag`].
    pub fn from_tag(t: u8) -> Option<Self> {
        match t {
            1 => Some(Self::Client),
            2 => Some(Self::Shared),
            3 => Some(Self::Server),
            _ => None,
        }
    }
}

impl FromStr for AttributeScope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "CLIENT_SCOPE" => Ok(Self::Client),
            "SHARED_SCOPE" => Ok(Self::Shared),
            "SERVER_SCOPE" => Ok(Self::Server),
            other => {
                Err(format!("invalid attribute scope '{other}': expected CLIENT_SCOPE, SHARED_SCOPE or SERVER_SCOPE"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_values_are_typed_like_thingsboard() {
        assert_eq!(Value::from_json(&json!(true)), Ok(Value::Bool(true)));
        assert_eq!(Value::from_json(&json!(42)), Ok(Value::Long(42)));
        assert_eq!(Value::from_json(&json!(-1.5)), Ok(Value::Double(-1.5)));
        assert_eq!(Value::from_json(&json!("x")), Ok(Value::Str("x".into())));
        assert_eq!(Value::from_json(&json!({"a":[1,2]})), Ok(Value::Json("{\"a\":[1,2]}".into())));
        assert_eq!(Value::from_json(&json!(null)), Err(ValueError::Null));
        // u64 beyond i64 becomes a double, as in ThingsBoard.
        assert_eq!(Value::from_json(&json!(u64::MAX)), Ok(Value::Double(u64::MAX as f64)));
    }

    #[test]
    fn display_strings_match_java() {
        assert_eq!(Value::Double(1.0).to_display_string(), "1.0");
        assert_eq!(Value::Double(21.5).to_display_string(), "21.5");
        assert_eq!(Value::Long(7).to_display_string(), "7");
        assert_eq!(Value::Bool(false).to_display_string(), "false");
    }

    #[test]
    fn scope_round_trips() {
        for s in AttributeScope::ALL {
            assert_eq!(s.as_str().parse::<AttributeScope>(), Ok(s));
            assert_eq!(AttributeScope::from_tag(s.tag()), Some(s));
        }
        assert!("BAD".parse::<AttributeScope>().is_err());
    }
}
