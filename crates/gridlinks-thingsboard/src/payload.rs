//! ThingsBoard's telemetry and attribute JSON payloads, decoded into typed records.
//! Shared by the HTTP and MQTT device APIs, the gateway API and the REST API. Sans-IO:
//! bytes in, records or a precise error out.
//!
//! Accepted telemetry forms: `{"k":v}`, `{"ts":ms,"values":{…}}`, and arrays of either.
//! Values are typed as ThingsBoard's `JsonConverter` types them (with its default
//! `type_cast_enabled`): booleans, integers that fit a long, other numbers as doubles,
//! integers too large for a long as strings of their exact digits, numeric strings such as
//! `"42"` cast to numbers, objects and arrays kept as their JSON text (as sent, without
//! whitespace). `null` values are skipped on the device API, as ThingsBoard does.

use std::collections::BTreeMap;

use gridlinks_types::{Ts, TsRecord, Value};
use serde_json::value::RawValue;

/// Bounds applied while decoding.
#[derive(Clone, Copy, Debug)]
pub struct PayloadLimits {
    /// Longest key, bytes.
    pub max_key_len: usize,
    /// Most values in one payload.
    pub max_values: usize,
    /// Numeric strings (`"42"`) become numbers, as ThingsBoard's `json.type_cast_enabled`
    /// does for devices; off where values come typed (decoder scripts).
    pub cast_strings: bool,
}

/// What is wrong with a payload; the text is sent to the client.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PayloadError {
    /// Not JSON at all.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// JSON, but not one of the accepted shapes.
    #[error("invalid payload: {0}")]
    Shape(String),
    /// Over a configured bound.
    #[error("payload too large: {0}")]
    TooMany(String),
}

fn shape(msg: impl Into<String>) -> PayloadError {
    PayloadError::Shape(msg.into())
}

fn json_error(e: serde_json::Error) -> PayloadError {
    PayloadError::Json(e.to_string())
}

// Payloads are decoded in two steps: serde_json checks the JSON and hands out each value's
// exact text (`RawValue`, borrowed from the body, no copy); each value is then typed from
// its text. Integers beyond 64 bits thus keep their digits (serde_json would round them to
// a double), and nested JSON keeps exactly what the device sent.

/// A JSON object: its entries by key (a repeated key: the last one counts), in key order.
type Object<'a> = BTreeMap<String, &'a RawValue>;

/// A JSON value, by its outermost shape.
enum Json<'a> {
    Object(Object<'a>),
    Array(Vec<&'a RawValue>),
    Scalar(&'a RawValue),
}

fn decode(v: &RawValue) -> Result<Json<'_>, PayloadError> {
    Ok(match v.get().as_bytes().first() {
        Some(b'{') => Json::Object(serde_json::from_str(v.get()).map_err(json_error)?),
        Some(b'[') => Json::Array(serde_json::from_str(v.get()).map_err(json_error)?),
        _ => Json::Scalar(v),
    })
}

fn parse(body: &[u8]) -> Result<Json<'_>, PayloadError> {
    // Straight into the outer shape: one pass over the body, not two.
    Ok(match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Json::Object(serde_json::from_slice(body).map_err(json_error)?),
        Some(b'[') => Json::Array(serde_json::from_slice(body).map_err(json_error)?),
        _ => Json::Scalar(serde_json::from_slice(body).map_err(json_error)?),
    })
}

/// Decodes a telemetry payload; points without a `ts` get `now`. No values: no records.
pub fn parse_telemetry(body: &[u8], now: Ts, lim: PayloadLimits) -> Result<Vec<TsRecord>, PayloadError> {
    let mut count = 0usize;
    telemetry_from_json(parse(body)?, now, lim, &mut count)
}

fn telemetry_from_json(
    json: Json<'_>,
    now: Ts,
    lim: PayloadLimits,
    count: &mut usize,
) -> Result<Vec<TsRecord>, PayloadError> {
    let mut out = Vec::new();
    match json {
        Json::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                match decode(item)? {
                    Json::Object(m) => out.push(record(m, now, lim, count)?),
                    _ => return Err(shape(format!("array element {i} must be an object, got {}", kind(item)))),
                }
            }
        }
        Json::Object(m) => out.push(record(m, now, lim, count)?),
        Json::Scalar(v) => {
            return Err(shape(format!("telemetry must be a JSON object or an array of objects, got {}", kind(v))))
        }
    }
    // A payload with no values (`{}`, `[]`, `{"ts":…,"values":{}}`) is accepted with nothing
    // to store, as ThingsBoard accepts it (its HTTP client's connection test posts `{}`).
    out.retain(|r| !r.values.is_empty());
    Ok(out)
}

/// Decodes a gateway telemetry payload `{"Device A":[{"ts":..,"values":{..}}], …}`
/// (each device's value in any telemetry form) into (device name, records).
pub fn parse_gateway_telemetry(
    body: &[u8],
    now: Ts,
    lim: PayloadLimits,
) -> Result<Vec<(String, Vec<TsRecord>)>, PayloadError> {
    let mut count = 0usize;
    gateway_object(body)?
        .into_iter()
        .map(|(name, v)| {
            let records = telemetry_from_json(decode(v)?, now, lim, &mut count).map_err(|e| in_device(&name, e))?;
            Ok((name, records))
        })
        .collect()
}

/// One gateway device's attributes: its name and (key, value) pairs.
pub type DeviceAttributes = (String, Vec<(String, Value)>);

/// Decodes a gateway attributes payload `{"Device A":{"attr":v}, …}`.
pub fn parse_gateway_attributes(body: &[u8], lim: PayloadLimits) -> Result<Vec<DeviceAttributes>, PayloadError> {
    let mut count = 0usize;
    gateway_object(body)?
        .into_iter()
        .map(|(name, v)| match decode(v)? {
            Json::Object(m) => {
                let values = values(m, lim, &mut count, true).map_err(|e| in_device(&name, e))?;
                Ok((name, values))
            }
            _ => Err(shape(format!("attributes of device {name:?} must be an object, got {}", kind(v)))),
        })
        .collect()
}

/// Decodes `{"device":"Name","type":"…"}` of `v1/gateway/connect` / `disconnect`: (name, type).
pub fn parse_gateway_device(body: &[u8]) -> Result<(String, Option<String>), PayloadError> {
    let Json::Object(m) = parse(body)? else {
        return Err(shape("\"device\" must be a non-empty device name of at most 255 bytes"));
    };
    let text = |key: &str| m.get(key).and_then(|v| serde_json::from_str::<String>(v.get()).ok());
    let name = text("device").filter(|n| valid_name(n)).ok_or_else(|| {
        shape("\"device\" must be a non-empty device name of at most 255 bytes, without control characters")
    })?;
    let device_type = text("type").filter(|t| !t.is_empty());
    if device_type.as_ref().is_some_and(|t| t.len() > 255 || t.chars().any(char::is_control)) {
        return Err(shape("\"type\" must be at most 255 bytes, without control characters"));
    }
    Ok((name, device_type))
}

/// A device's claiming request (`v1/devices/me/claim`, `POST /api/v1/{token}/claim`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The secret a customer user must give to claim the device ("" when none).
    pub secret_key: String,
    /// How long the claim is open, ms; `None`: the server's default.
    pub duration_ms: Option<u64>,
}

/// Longest claiming secret, bytes.
pub const MAX_CLAIM_SECRET: usize = 255;

/// Decodes `{"secretKey":"…","durationMs":N}`; both are optional and an empty body is an
/// empty object.
pub fn parse_claim(body: &[u8]) -> Result<ClaimRequest, PayloadError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(ClaimRequest { secret_key: String::new(), duration_ms: None });
    }
    let Json::Object(m) = parse(body)? else {
        return Err(shape("a claiming request is an object {\"secretKey\", \"durationMs\"}"));
    };
    let secret_key = match m.get("secretKey") {
        None => String::new(),
        Some(v) => serde_json::from_str::<String>(v.get())
            .ok()
            .filter(|k| k.len() <= MAX_CLAIM_SECRET && !k.chars().any(char::is_control))
            .ok_or_else(|| {
                shape(format!(
                    "\"secretKey\" must be a string of at most {MAX_CLAIM_SECRET} bytes, without control characters"
                ))
            })?,
    };
    let duration_ms = match m.get("durationMs") {
        None => None,
        Some(v) => Some(
            serde_json::from_str::<u64>(v.get())
                .map_err(|_| shape("\"durationMs\" must be a positive whole number of milliseconds"))?,
        ),
    };
    Ok(ClaimRequest { secret_key, duration_ms: duration_ms.filter(|d| *d > 0) })
}

/// A device name a gateway may use: not blank, at most 255 bytes, no control characters.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.trim().is_empty() && name.len() <= 255 && !name.chars().any(char::is_control)
}

fn gateway_object(body: &[u8]) -> Result<Object<'_>, PayloadError> {
    match parse(body)? {
        Json::Object(m) if !m.is_empty() => {
            if let Some(bad) = m.keys().find(|k| !valid_name(k)) {
                return Err(shape(format!("invalid device name {bad:?}")));
            }
            Ok(m)
        }
        Json::Object(_) => Err(shape("no devices found in the payload")),
        Json::Array(_) => Err(shape("gateway payload must be an object keyed by device name, got an array")),
        Json::Scalar(v) => {
            Err(shape(format!("gateway payload must be an object keyed by device name, got {}", kind(v))))
        }
    }
}

fn in_device(name: &str, e: PayloadError) -> PayloadError {
    match e {
        PayloadError::Shape(m) => PayloadError::Shape(format!("device {name:?}: {m}")),
        other => other,
    }
}

/// Decodes an attributes payload (a flat JSON object).
pub fn parse_attributes(
    body: &[u8],
    lim: PayloadLimits,
    skip_nulls: bool,
) -> Result<Vec<(String, Value)>, PayloadError> {
    let m = match parse(body)? {
        Json::Object(m) => m,
        Json::Array(_) => return Err(shape("attributes must be a JSON object, got an array")),
        Json::Scalar(v) => return Err(shape(format!("attributes must be a JSON object, got {}", kind(v)))),
    };
    let mut count = 0;
    let values = values(m, lim, &mut count, skip_nulls)?;
    if values.is_empty() {
        return Err(shape("no attribute values found in the payload"));
    }
    Ok(values)
}

fn record(mut m: Object<'_>, now: Ts, lim: PayloadLimits, count: &mut usize) -> Result<TsRecord, PayloadError> {
    if m.contains_key("ts") && m.contains_key("values") {
        let ts = m
            .remove("ts")
            .and_then(|v| match v.get().as_bytes().first() {
                Some(b'"') => serde_json::from_str::<String>(v.get()).ok()?.trim().parse().ok(),
                _ => v.get().parse::<i64>().ok(),
            })
            .ok_or_else(|| shape("\"ts\" must be an integer number of milliseconds"))?;
        let vals = match m.remove("values").map(decode).transpose()? {
            Some(Json::Object(v)) => v,
            Some(Json::Array(_)) => return Err(shape("\"values\" must be an object, got an array")),
            Some(Json::Scalar(v)) => return Err(shape(format!("\"values\" must be an object, got {}", kind(v)))),
            None => Object::new(),
        };
        if let Some(extra) = m.keys().next() {
            return Err(shape(format!("unexpected field {extra:?} beside \"ts\" and \"values\"")));
        }
        return Ok(TsRecord { ts: Ts(ts), values: values(vals, lim, count, true)? });
    }
    Ok(TsRecord { ts: now, values: values(m, lim, count, true)? })
}

fn values(
    m: Object<'_>,
    lim: PayloadLimits,
    count: &mut usize,
    skip_nulls: bool,
) -> Result<Vec<(String, Value)>, PayloadError> {
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        check_key(&k, lim, count)?;
        match typed(v, lim.cast_strings)? {
            Some(val) => out.push((k, val)),
            None if skip_nulls => {}
            None => return Err(shape(format!("value of {k:?} is null"))),
        }
    }
    Ok(out)
}

/// Checks one key of a payload's values, the `count`-th value so far: not blank, no control
/// characters, within the key length and value count limits (every way values come in
/// applies these: JSON payloads, decoder scripts).
pub fn check_key(k: &str, lim: PayloadLimits, count: &mut usize) -> Result<(), PayloadError> {
    if k.trim().is_empty() {
        return Err(shape("key must not be blank"));
    }
    if k.chars().any(char::is_control) {
        return Err(shape(format!("key {k:?} must not contain control characters")));
    }
    if k.len() > lim.max_key_len {
        return Err(shape(format!("key of {} bytes is longer than the limit of {} bytes", k.len(), lim.max_key_len)));
    }
    *count += 1;
    if *count > lim.max_values {
        return Err(PayloadError::TooMany(format!("more than {} values", lim.max_values)));
    }
    Ok(())
}

/// Types one JSON value, from its text, as ThingsBoard does; `None` for `null`. Integers
/// that fit a long are longs, larger ones keep their exact digits as a string; other
/// numbers are doubles; numeric strings such as `"42"` are cast to numbers if `cast`; objects
/// and arrays are kept as their JSON text (whitespace removed, otherwise as sent).
fn typed(v: &RawValue, cast: bool) -> Result<Option<Value>, PayloadError> {
    let text = v.get();
    Ok(Some(match text.as_bytes().first() {
        Some(b'n') => return Ok(None),
        Some(b't') => Value::Bool(true),
        Some(b'f') => Value::Bool(false),
        Some(b'"') => {
            let s = serde_json::from_str::<String>(text).map_err(json_error)?;
            if cast {
                cast_string(&s)
            } else {
                Value::Str(s)
            }
        }
        Some(b'{' | b'[') => Value::Json(minify(text)),
        _ if text.bytes().all(|b| b.is_ascii_digit() || b == b'-') => match text.parse::<i64>() {
            Ok(i) => Value::Long(i),
            // Beyond a long: the digits, exactly (JSON's grammar makes them a valid integer).
            Err(_) => Value::Str(text.to_owned()),
        },
        _ => match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Value::Double(f),
            _ => return Err(PayloadError::Json(format!("number {text} is out of range"))),
        },
    }))
}

/// JSON text without the whitespace between tokens (strings are left as they are).
fn minify(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

/// `"42"` → 42, `"4.2"` → 4.2, anything else stays a string (ThingsBoard's type cast).
pub fn cast_string(s: &str) -> Value {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match digits.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (digits, None),
    };
    let all_digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || frac.is_some_and(|f| !all_digits(f)) {
        return Value::Str(s.to_owned());
    }
    match frac {
        None => s.parse().map_or_else(|_| Value::Str(s.to_owned()), Value::Long),
        Some(_) => s.parse().map_or_else(|_| Value::Str(s.to_owned()), Value::Double),
    }
}

fn kind(v: &RawValue) -> &'static str {
    match v.get().as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: PayloadLimits = PayloadLimits { max_key_len: 16, max_values: 8, cast_strings: true };
    const NOW: Ts = Ts(1000);

    fn tel(s: &str) -> Result<Vec<TsRecord>, PayloadError> {
        parse_telemetry(s.as_bytes(), NOW, LIM)
    }

    #[test]
    fn a_double_is_stored_exactly_as_sent() {
        // serde_json's default float parsing is one ulp off for some inputs (found by the
        // `outbox` fuzz target); the workspace enables `float_roundtrip`.
        for s in ["6.6666e53", "0.1", "2.2250738585072014e-308", "1.7976931348623157e308"] {
            let v = &tel(&format!(r#"{{"x":{s}}}"#)).unwrap()[0].values[0].1;
            assert_eq!(v, &Value::Double(s.parse().unwrap()), "{s}");
        }
    }

    #[test]
    fn every_thingsboard_form() {
        let r = tel(r#"{"t":21.5,"on":true,"n":7,"s":"x","j":{"a":[1]}}"#).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].ts, NOW);
        assert_eq!(
            r[0].values,
            vec![
                ("j".into(), Value::Json("{\"a\":[1]}".into())),
                ("n".into(), Value::Long(7)),
                ("on".into(), Value::Bool(true)),
                ("s".into(), Value::Str("x".into())),
                ("t".into(), Value::Double(21.5)),
            ]
        );
        let r = tel(r#"{"ts":5,"values":{"a":1}}"#).unwrap();
        assert_eq!(r, vec![TsRecord { ts: Ts(5), values: vec![("a".into(), Value::Long(1))] }]);
        let r = tel(r#"[{"ts":5,"values":{"a":1}},{"b":2},{"ts":"6","values":{"c":3}}]"#).unwrap();
        assert_eq!(r.iter().map(|r| r.ts).collect::<Vec<_>>(), vec![Ts(5), NOW, Ts(6)]);
        // `ts` alone is an ordinary key.
        assert_eq!(tel(r#"{"ts":5}"#).unwrap()[0].values, vec![("ts".into(), Value::Long(5))]);
    }

    #[test]
    fn typing_matches_thingsboard() {
        assert_eq!(cast_string("42"), Value::Long(42));
        assert_eq!(cast_string("-4.20"), Value::Double(-4.2));
        assert_eq!(cast_string("1e5"), Value::Str("1e5".into()));
        assert_eq!(cast_string("99999999999999999999"), Value::Str("99999999999999999999".into()));
        assert_eq!(cast_string("4."), Value::Str("4.".into()));
        let ty = |s: &str| typed(&serde_json::from_str::<Box<RawValue>>(s).unwrap(), true).unwrap();
        assert_eq!(ty("42.0"), Some(Value::Double(42.0)));
        assert_eq!(ty("-7"), Some(Value::Long(-7)));
        assert_eq!(ty(&u64::MAX.to_string()), Some(Value::Str(u64::MAX.to_string())));
        assert_eq!(ty("null"), None);
        assert_eq!(ty(r#""4\u0032""#), Some(Value::Long(42)));
        assert_eq!(tel(r#"{"a":null,"b":1}"#).unwrap()[0].values, vec![("b".into(), Value::Long(1))]);
    }

    #[test]
    fn integers_beyond_64_bits_keep_every_digit() {
        let r = tel(r#"{"bigpos":123456789012345678901234567890,"bigneg":-98765432109876543210987654321,"small":9223372036854775807}"#).unwrap();
        assert_eq!(
            r[0].values,
            vec![
                ("bigneg".into(), Value::Str("-98765432109876543210987654321".into())),
                ("bigpos".into(), Value::Str("123456789012345678901234567890".into())),
                ("small".into(), Value::Long(i64::MAX)),
            ]
        );
        // Inside nested JSON, and in attributes and gateway payloads too.
        let r = tel(r#"{"j": {"n": 123456789012345678901234567890, "s": "a \" b"} }"#).unwrap();
        assert_eq!(r[0].values[0].1, Value::Json(r#"{"n":123456789012345678901234567890,"s":"a \" b"}"#.into()));
        let a = parse_attributes(br#"{"big":123456789012345678901234567890}"#, LIM, true).unwrap();
        assert_eq!(a[0].1, Value::Str("123456789012345678901234567890".into()));
        let g = parse_gateway_telemetry(br#"{"A":{"big":123456789012345678901234567890}}"#, NOW, LIM).unwrap();
        assert_eq!(g[0].1[0].values[0].1, Value::Str("123456789012345678901234567890".into()));
    }

    #[test]
    fn gateway_payloads() {
        let r = parse_gateway_telemetry(br#"{"A":[{"ts":1,"values":{"t":1}}],"B":{"h":2}}"#, NOW, LIM).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].0, "A");
        assert_eq!(r[0].1[0].ts, Ts(1));
        assert_eq!(r[1].1[0].ts, NOW);
        let a = parse_gateway_attributes(br#"{"A":{"fw":"x"}}"#, LIM).unwrap();
        assert_eq!(a, vec![("A".to_string(), vec![("fw".to_string(), Value::Str("x".into()))])]);
        assert!(parse_gateway_telemetry(br#"{"A":5}"#, NOW, LIM).is_err());
        assert!(parse_gateway_telemetry(b"[]", NOW, LIM).is_err());
        assert!(parse_gateway_telemetry(b"{}", NOW, LIM).is_err());
        assert_eq!(parse_gateway_device(br#"{"device":"A","type":"t"}"#).unwrap(), ("A".into(), Some("t".into())));
        assert!(parse_gateway_device(br#"{"device":""}"#).is_err());
    }

    #[test]
    fn bad_payloads_say_what_is_wrong() {
        assert!(matches!(tel("{"), Err(PayloadError::Json(_))));
        assert!(matches!(tel("[1]"), Err(PayloadError::Shape(m)) if m.contains("element 0")));
        assert!(matches!(tel("5"), Err(PayloadError::Shape(_))));
        for empty in ["{}", "[]", r#"{"ts":1,"values":{}}"#, r#"[{},{"ts":2,"values":{}}]"#] {
            assert_eq!(tel(empty), Ok(vec![]), "accepted, nothing to store: {empty}");
        }
        assert!(matches!(tel(r#"{"ts":"x","values":{}}"#), Err(PayloadError::Shape(m)) if m.contains("ts")));
        assert!(matches!(tel(r#"{"ts":1,"values":5}"#), Err(PayloadError::Shape(m)) if m.contains("values")));
        assert!(matches!(tel(r#"{"aaaaaaaaaaaaaaaaaaaaaa":1}"#), Err(PayloadError::Shape(m)) if m.contains("limit")));
        assert!(matches!(tel(r#"{"":1}"#), Err(PayloadError::Shape(_))));
        assert!(matches!(tel(r#"{"a\u0000b":1}"#), Err(PayloadError::Shape(m)) if m.contains("control")));
        assert!(parse_gateway_telemetry(br#"{"dev\u0000":{"t":1}}"#, NOW, LIM).is_err());
        assert!(parse_gateway_device(br#"{"device":"a\nb"}"#).is_err());
        assert!(matches!(tel(r#"{"a":1e400}"#), Err(PayloadError::Json(_))));
        assert!(matches!(tel(r#"{"a":NaN}"#), Err(PayloadError::Json(_))));
        let many = format!("{{{}}}", (0..9).map(|i| format!("\"k{i}\":1")).collect::<Vec<_>>().join(","));
        assert!(matches!(tel(&many), Err(PayloadError::TooMany(_))));
        assert!(parse_attributes(b"[]", LIM, true).is_err());
        assert!(parse_attributes(br#"{"a":null}"#, LIM, false).is_err());
    }

    #[test]
    fn claim_requests_are_bounded_and_optional() {
        let ok = |b: &str| parse_claim(b.as_bytes()).unwrap();
        assert_eq!(ok(""), ClaimRequest { secret_key: String::new(), duration_ms: None });
        assert_eq!(ok("{}"), ClaimRequest { secret_key: String::new(), duration_ms: None });
        assert_eq!(
            ok(r#"{"secretKey":"s3","durationMs":60000}"#),
            ClaimRequest { secret_key: "s3".into(), duration_ms: Some(60_000) }
        );
        assert_eq!(ok(r#"{"durationMs":0}"#).duration_ms, None, "0: the default");
        for bad in [r#"{"secretKey":1}"#, r#"{"durationMs":-5}"#, r#"{"durationMs":"x"}"#, "[1]", "{"] {
            assert!(parse_claim(bad.as_bytes()).is_err(), "{bad}");
        }
        let long = format!(r#"{{"secretKey":"{}"}}"#, "k".repeat(MAX_CLAIM_SECRET + 1));
        assert!(parse_claim(long.as_bytes()).is_err());
    }
}
