//! The gateway API's requests and what the server sends a gateway for its sub-devices,
//! shaped as ThingsBoard's `AbstractGatewaySessionHandler` and `JsonConverter` do.
//! Telemetry, attributes and connect/disconnect payloads are in [`crate::payload`].
//!
//! | from the gateway | to the gateway |
//! |---|---|
//! | `v1/gateway/attributes/request` `{"id":1,"device":"A","client":true,"key":"k"}` (or `"keys":[…]`) | `v1/gateway/attributes/response` `{"id":1,"device":"A","value":v}` (one key asked) or `"values":{…}` |
//! | `v1/gateway/rpc` `{"device":"A","id":7,"data":{…}}` (the answer) | `v1/gateway/rpc` `{"device":"A","data":{"id":7,"method":"m","params":{…}}}` |
//! | `v1/gateway/claim` `{"A":{"secretKey":"s","durationMs":60000}}` | |
//! | | `v1/gateway/attributes` `{"device":"A","data":{"k":v}}` or `{"device":"A","data":{"deleted":["k"]}}` |

use serde_json::{Map, Value as J};

use crate::payload::{parse_claim, valid_name, ClaimRequest, PayloadError};

/// Most keys one gateway attribute request may name.
pub const MAX_REQUEST_KEYS: usize = 1_000;

fn shape(msg: impl Into<String>) -> PayloadError {
    PayloadError::Shape(msg.into())
}

fn object(body: &[u8], what: &str) -> Result<Map<String, J>, PayloadError> {
    match serde_json::from_slice::<J>(body).map_err(|e| PayloadError::Json(e.to_string()))? {
        J::Object(m) => Ok(m),
        _ => Err(shape(format!("{what} must be a JSON object"))),
    }
}

fn device_name(m: &Map<String, J>) -> Result<String, PayloadError> {
    m.get("device").and_then(J::as_str).filter(|n| valid_name(n)).map(str::to_owned).ok_or_else(|| {
        shape("\"device\" must be a non-empty device name of at most 255 bytes, without control characters")
    })
}

/// `v1/gateway/attributes/request`: one scope's keys of one sub-device.
#[derive(Debug, Clone, PartialEq)]
pub struct AttributeRequest {
    /// The gateway's request id, echoed in the answer.
    pub id: J,
    /// The sub-device's name.
    pub device: String,
    /// Client scope (`true`) or shared (`false`).
    pub client: bool,
    /// The keys asked for (none: every attribute of the scope, as ThingsBoard reads it).
    pub keys: Vec<String>,
}

/// Decodes an attribute request; `id` must be a number, `client` a boolean, and either
/// `key` (a string) or `keys` (an array of strings) given.
pub fn parse_attribute_request(body: &[u8]) -> Result<AttributeRequest, PayloadError> {
    let m = object(body, "an attribute request")?;
    let id = m
        .get("id")
        .filter(|v| v.is_i64() || v.is_u64())
        .cloned()
        .ok_or_else(|| shape("\"id\" must be a whole number"))?;
    let device = device_name(&m)?;
    let client = m.get("client").and_then(J::as_bool).ok_or_else(|| shape("\"client\" must be true or false"))?;
    let keys: Vec<String> = match (m.get("key"), m.get("keys")) {
        (Some(J::String(k)), _) => vec![k.clone()],
        (None, Some(J::Array(ks))) => ks
            .iter()
            .map(|k| k.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| shape("\"keys\" must be an array of strings"))?,
        _ => return Err(shape("give \"key\" (a string) or \"keys\" (an array of strings)")),
    };
    if keys.len() > MAX_REQUEST_KEYS {
        return Err(PayloadError::TooMany(format!("at most {MAX_REQUEST_KEYS} keys per request")));
    }
    Ok(AttributeRequest { id, device, client, keys })
}

/// The answer to `req` with the values found: `"value"` when one key was asked for and
/// found, else `"values":{…}` (ThingsBoard's `isMultipleAttributesRequest`); nothing when
/// a single key was not found.
pub fn attribute_response(req: &AttributeRequest, found: Vec<(String, J)>) -> J {
    let mut out = Map::new();
    out.insert("id".into(), req.id.clone());
    out.insert("device".into(), J::String(req.device.clone()));
    if req.keys.len() <= 1 && found.len() == 1 {
        out.insert("value".into(), found.into_iter().next().map(|(_, v)| v).unwrap_or(J::Null));
    } else if !found.is_empty() {
        out.insert("values".into(), J::Object(found.into_iter().collect()));
    }
    J::Object(out)
}

/// The gateway's answer to server-side RPC `id` of sub-device `device`: `data` as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcReply {
    /// The sub-device's name.
    pub device: String,
    /// The request id the server gave.
    pub id: u32,
    /// The answer (`data`), as JSON text.
    pub data: String,
}

/// Decodes `{"device":"A","id":7,"data":{…}}`.
pub fn parse_rpc_reply(body: &[u8]) -> Result<RpcReply, PayloadError> {
    let m = object(body, "an RPC reply")?;
    let device = device_name(&m)?;
    let id = m
        .get("id")
        .and_then(J::as_u64)
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| shape("\"id\" must be the request's id"))?;
    let data = m.get("data").ok_or_else(|| shape("\"data\" is missing"))?.to_string();
    Ok(RpcReply { device, id, data })
}

/// Decodes `{"A":{"secretKey":"s","durationMs":N},…}`: one claim per sub-device.
pub fn parse_claims(body: &[u8]) -> Result<Vec<(String, ClaimRequest)>, PayloadError> {
    let m = object(body, "a gateway claiming request")?;
    if m.is_empty() {
        return Err(shape("no devices found in the claiming request"));
    }
    m.into_iter()
        .map(|(name, v)| {
            if !valid_name(&name) {
                return Err(shape(format!("invalid device name {name:?}")));
            }
            if !v.is_object() {
                return Err(shape(format!("the claim of {name:?} must be an object")));
            }
            // Each device's claim is a device's own claiming request.
            Ok((name, parse_claim(v.to_string().as_bytes())?))
        })
        .collect()
}

/// A push to the gateway for sub-device `device`: `{"device":…,"data":…}` (attribute
/// updates and deletions on `v1/gateway/attributes`).
pub fn for_device(device: &str, data: J) -> J {
    serde_json::json!({"device": device, "data": data})
}

/// Server-side RPC `id` to sub-device `device`, from the call's `{"method","params"}`
/// text: `{"device":…,"data":{"id":…,"method":…,"params":…}}`. `None` if the call is not
/// a JSON object (the REST API only passes objects).
pub fn rpc_request(device: &str, id: u32, call: &[u8]) -> Option<J> {
    let J::Object(mut data) = serde_json::from_slice::<J>(call).ok()? else { return None };
    data.insert("id".into(), id.into());
    Some(for_device(device, J::Object(data)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn attribute_requests_with_one_key_or_a_list() {
        let r = parse_attribute_request(br#"{"id":3,"device":"A","client":false,"key":"k"}"#).unwrap();
        assert_eq!(
            (r.id.clone(), r.device.as_str(), r.client, r.keys.clone()),
            (json!(3), "A", false, vec!["k".to_string()])
        );
        assert_eq!(attribute_response(&r, vec![("k".into(), json!(1))]), json!({"id":3,"device":"A","value":1}));
        assert_eq!(attribute_response(&r, vec![]), json!({"id":3,"device":"A"}));
        let r = parse_attribute_request(br#"{"id":4,"device":"A","client":true,"keys":["a","b"]}"#).unwrap();
        assert!(r.client);
        assert_eq!(
            attribute_response(&r, vec![("a".into(), json!("x"))]),
            json!({"id":4,"device":"A","values":{"a":"x"}})
        );
        for bad in [
            &br#"{"id":"x","device":"A","client":true,"key":"k"}"#[..],
            br#"{"id":1,"client":true,"key":"k"}"#,
            br#"{"id":1,"device":"A","key":"k"}"#,
            br#"{"id":1,"device":"A","client":true}"#,
            br#"{"id":1,"device":"A","client":true,"keys":[1]}"#,
            br#"[1]"#,
            b"{",
        ] {
            assert!(parse_attribute_request(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let many =
            format!(r#"{{"id":1,"device":"A","client":true,"keys":{}}}"#, json!(vec!["k"; MAX_REQUEST_KEYS + 1]));
        assert!(matches!(parse_attribute_request(many.as_bytes()), Err(PayloadError::TooMany(_))));
    }

    #[test]
    fn rpc_both_ways() {
        let r = parse_rpc_reply(br#"{"device":"A","id":7,"data":{"ok":true}}"#).unwrap();
        assert_eq!(r, RpcReply { device: "A".into(), id: 7, data: r#"{"ok":true}"#.into() });
        assert!(parse_rpc_reply(br#"{"device":"A","id":-1,"data":1}"#).is_err());
        assert!(parse_rpc_reply(br#"{"device":"A","id":1}"#).is_err());
        assert_eq!(
            rpc_request("A", 9, br#"{"method":"m","params":{"x":1}}"#),
            Some(json!({"device":"A","data":{"id":9,"method":"m","params":{"x":1}}}))
        );
        assert_eq!(rpc_request("A", 9, b"[]"), None);
    }

    #[test]
    fn claims_per_device() {
        let c = parse_claims(br#"{"A":{"secretKey":"s","durationMs":500},"B":{}}"#).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0], ("A".into(), ClaimRequest { secret_key: "s".into(), duration_ms: Some(500) }));
        assert_eq!(c[1], ("B".into(), ClaimRequest { secret_key: String::new(), duration_ms: None }));
        for bad in
            [&b"{}"[..], br#"{"A":1}"#, br#"{"A":{"secretKey":5}}"#, br#"{"A":{"durationMs":-5}}"#, br#"{"":{}}"#]
        {
            assert!(parse_claims(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
