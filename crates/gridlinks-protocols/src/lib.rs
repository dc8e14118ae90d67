//! Devices' own binary protocols, after framing (`gridlinks-framing`) and before the ingest
//! boundary: what a frame says — which device sent it, its telemetry and attributes, and the
//! frames to answer it with. A [`Decoder`] is either native (the single-lamp controller,
//! [`lamp`]) or a user's script run in a sandboxed QuickJS ([`script`]), loaded without
//! recompiling. Sans-IO: frames in, [`Uplink`]s out.

pub mod lamp;
pub mod script;

use gridlinks_types::{check_identity, IdentityError, Ts, TsRecord, Value};

pub use script::{Cut, Script, ScriptError, ScriptLimits};

/// What one frame carried.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Uplink {
    /// The device that sent it, as the protocol names devices (an address, a serial
    /// number); `None` when the frame does not say (the connection's device then).
    pub identity: Option<String>,
    /// The frame is a login: where a listener has `require_login`, only such a frame binds
    /// a connection to the device its identity names.
    pub login: bool,
    /// Time-series records.
    pub telemetry: Vec<TsRecord>,
    /// Client-scope attributes.
    pub attributes: Vec<(String, Value)>,
    /// Frames to send back once what the frame carried is committed (login answers, acks).
    pub replies: Vec<Vec<u8>>,
    /// Answers to server-side RPC requests: (request id, the answer as JSON).
    pub rpc_responses: Vec<(u32, String)>,
}

/// A message from the server to a device, for the decoder's encoder to turn into frames.
#[derive(Clone, Debug, PartialEq)]
pub enum Downlink {
    /// A server-side RPC request (ThingsBoard's `{"method", "params"}`).
    Rpc {
        /// The request id; the device's answer names it.
        id: u32,
        /// The method.
        method: String,
        /// Its parameters.
        params: serde_json::Value,
    },
    /// Shared attributes changed: the new values, a JSON object.
    Attributes(serde_json::Value),
}

/// What a decoder knows about the connection a frame came in on.
#[derive(Clone, Copy, Debug)]
pub struct Session<'a> {
    /// The identity the connection logged in with, if it has.
    pub identity: Option<&'a str>,
    /// The time to stamp telemetry with that carries none (ms since the epoch).
    pub now: Ts,
}

/// Why a frame was not decoded; the frame is rejected, the connection goes on.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than its kind of frame is.
    #[error("frame too short: {got} bytes, a {what} needs {need}")]
    Short {
        /// Which kind of frame.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes there.
        got: usize,
    },
    /// A control code or message type the decoder does not know.
    #[error("unsupported frame type 0x{0:02x}")]
    Unsupported(u8),
    /// The identity cannot name a device.
    #[error(transparent)]
    BadIdentity(#[from] IdentityError),
    /// The script threw, or returned something that is not an uplink.
    #[error("decoder script: {0}")]
    Script(String),
    /// The script ran past its time limit.
    #[error("decoder script ran longer than {0} ms")]
    Timeout(u64),
    /// The protocol has no frame for this server-side message.
    #[error("the protocol cannot send {0}")]
    NoEncoding(String),
}

/// Turns frames into uplinks.
#[derive(Clone, Debug)]
pub enum Decoder {
    /// The single-lamp controller, natively.
    Lamp,
    /// A user's script.
    Script(Script),
}

impl Decoder {
    /// Decodes one whole frame (framing already checked its length, markers and checksum).
    pub fn decode(&self, frame: &[u8], session: Session<'_>) -> Result<Uplink, DecodeError> {
        let up = match self {
            Decoder::Lamp => lamp::decode(frame, session)?,
            Decoder::Script(s) => s.decode(frame, session)?,
        };
        if let Some(id) = &up.identity {
            check_identity(id)?;
        }
        Ok(up)
    }

    /// The frames that carry `down` to the device (none: nothing to send for it).
    pub fn encode(&self, down: &Downlink, session: Session<'_>) -> Result<Vec<Vec<u8>>, DecodeError> {
        match self {
            Decoder::Lamp => lamp::encode(down, session),
            Decoder::Script(s) => s.encode(down, session),
        }
    }
}

/// `up` as a script would give it: keys in order, and numbers without a fraction as longs
/// (JavaScript does not tell 42.0 from 42, so a script's 42.0 is stored as the long 42, as
/// ThingsBoard stores a JSON 42). For comparing a script's output with a native decoder's.
pub fn comparable(mut up: Uplink) -> Uplink {
    let normal = |(_, v): &mut (String, Value)| {
        if let Value::Double(d) = *v {
            if d.fract() == 0.0 && d.abs() < 9.0e15 {
                *v = Value::Long(d as i64);
            }
        }
    };
    for rec in &mut up.telemetry {
        rec.values.iter_mut().for_each(normal);
        rec.values.sort_by(|a, b| a.0.cmp(&b.0));
    }
    up.attributes.iter_mut().for_each(normal);
    up.attributes.sort_by(|a, b| a.0.cmp(&b.0));
    up
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities() {
        for ok in ["000000000001", "meter-7", "a.b_c:d", &"x".repeat(128)] {
            check_identity(ok).unwrap();
        }
        for bad in ["", "has space", "slash/", "ünï", &"x".repeat(129), "nul\0"] {
            assert!(matches!(check_identity(bad), Err(IdentityError::Id(_))), "{bad:?}");
        }
    }
}
