//! ThingsBoard's telemetry and attribute JSON payloads, decoded into typed records.
//! Shared by the HTTP device API and (later) the MQTT device topics. Sans-IO: bytes in,
//! records or a precise error out.
//!
//! Accepted telemetry forms: `{"k":v}`, `{"ts":ms,"values":{…}}`, and arrays of either.
//! Values are typed as ThingsBoard's `JsonConverter` types them (with its default
//! `type_cast_enabled`): booleans, integers that fit a long, other numbers as doubles,
//! integers too large for a long as strings, numeric strings such as `"42"` cast to
//! numbers, objects and arrays kept as JSON text. `null` values are skipped on the
//! device API, as ThingsBoard does.

use gridlinks_types::{Ts, TsRecord, Value};
use serde_json::{Map, Value as J};

/// Bounds applied while decoding.
#[derive(Clone, Copy, Debug)]
pub struct PayloadLimits {
    /// Longest key, bytes.
    pub max_key_len: usize,
    /// Most values in one payload.
    pub max_values: usize,
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

/// Decodes a telemetry payload; points without a `ts` get `now`.
pub fn parse_telemetry(body: &[u8], now: Ts, lim: PayloadLimits) -> Result<Vec<TsRecord>, PayloadError> {
    let json: J = serde_json::from_slice(body).map_err(|e| PayloadError::Json(e.to_string()))?;
    let mut count = 0usize;
    telemetry_from_json(json, now, lim, &mut count)
}

fn telemetry_from_json(json: J, now: Ts, lim: PayloadLimits, count: &mut usize) -> Result<Vec<TsRecord>, PayloadError> {
    let mut out = Vec::new();
    match json {
        J::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    J::Object(m) => out.push(record(m, now, lim, count)?),
                    other => {
                        return Err(shape(format!(
                            "array element {i} must be an object, got {}",
                            kind(&other)
                        )))
                    }
                }
            }
        }
        J::Object(m) => out.push(record(m, now, lim, count)?),
        other => {
            return Err(shape(format!(
                "telemetry must be a JSON object or an array of objects, got {}",
                kind(&other)
            )))
        }
    }
    out.retain(|r| !r.values.is_empty());
    if out.is_empty() {
        return Err(shape("no telemetry values found in the payload"));
    }
    Ok(out)
}

/// Decodes a gateway telemetry payload `{"Device A":[{"ts":..,"values":{..}}], …}`
/// (each device's value in any telemetry form) into (device name, records).
pub fn parse_gateway_telemetry(body: &[u8], now: Ts, lim: PayloadLimits) -> Result<Vec<(String, Vec<TsRecord>)>, PayloadError> {
    let mut count = 0usize;
    gateway_object(body)?
        .into_iter()
        .map(|(name, v)| Ok((name.clone(), telemetry_from_json(v, now, lim, &mut count).map_err(|e| in_device(&name, e))?)))
        .collect()
}

/// One gateway device's attributes: its name and (key, value) pairs.
pub type DeviceAttributes = (String, Vec<(String, Value)>);

/// Decodes a gateway attributes payload `{"Device A":{"attr":v}, …}`.
pub fn parse_gateway_attributes(body: &[u8], lim: PayloadLimits) -> Result<Vec<DeviceAttributes>, PayloadError> {
    let mut count = 0usize;
    gateway_object(body)?
        .into_iter()
        .map(|(name, v)| match v {
            J::Object(m) => Ok((name.clone(), values(m, lim, &mut count, true).map_err(|e| in_device(&name, e))?)),
            other => Err(shape(format!("attributes of device {name:?} must be an object, got {}", kind(&other)))),
        })
        .collect()
}

/// Decodes `{"device":"Name","type":"…"}` of `v1/gateway/connect` / `disconnect`: (name, type).
pub fn parse_gateway_device(body: &[u8]) -> Result<(String, Option<String>), PayloadError> {
    let json: J = serde_json::from_slice(body).map_err(|e| PayloadError::Json(e.to_string()))?;
    let name = json
        .get("device")
        .and_then(J::as_str)
        .filter(|n| !n.trim().is_empty() && n.len() <= 255)
        .ok_or_else(|| shape("\"device\" must be a non-empty device name of at most 255 bytes"))?;
    Ok((name.to_owned(), json.get("type").and_then(J::as_str).map(String::from)))
}

fn gateway_object(body: &[u8]) -> Result<Map<String, J>, PayloadError> {
    match serde_json::from_slice(body).map_err(|e| PayloadError::Json(e.to_string()))? {
        J::Object(m) if !m.is_empty() => {
            if let Some(bad) = m.keys().find(|k| k.trim().is_empty() || k.len() > 255) {
                return Err(shape(format!("invalid device name {bad:?}")));
            }
            Ok(m)
        }
        J::Object(_) => Err(shape("no devices found in the payload")),
        other => Err(shape(format!("gateway payload must be an object keyed by device name, got {}", kind(&other)))),
    }
}

fn in_device(name: &str, e: PayloadError) -> PayloadError {
    match e {
        PayloadError::Shape(m) => PayloadError::Shape(format!("device {name:?}: {m}")),
        other => other,
    }
}

/// Decodes an attributes payload (a flat JSON object).
pub fn parse_attributes(body: &[u8], lim: PayloadLimits, skip_nulls: bool) -> Result<Vec<(String, Value)>, PayloadError> {
    let json: J = serde_json::from_slice(body).map_err(|e| PayloadError::Json(e.to_string()))?;
    let J::Object(m) = json else {
        return Err(shape(format!("attributes must be a JSON object, got {}", kind(&json))));
    };
    let mut count = 0;
    let values = values(m, lim, &mut count, skip_nulls)?;
    if values.is_empty() {
        return Err(shape("no attribute values found in the payload"));
    }
    Ok(values)
}

fn record(mut m: Map<String, J>, now: Ts, lim: PayloadLimits, count: &mut usize) -> Result<TsRecord, PayloadError> {
    if m.contains_key("ts") && m.contains_key("values") {
        let ts = match m.remove("ts") {
            Some(J::Number(n)) => n.as_i64(),
            Some(J::String(s)) => s.trim().parse().ok(),
            _ => None,
        }
        .ok_or_else(|| shape("\"ts\" must be an integer number of milliseconds"))?;
        let vals = match m.remove("values") {
            Some(J::Object(v)) => v,
            Some(other) => return Err(shape(format!("\"values\" must be an object, got {}", kind(&other)))),
            None => Map::new(),
        };
        if let Some(extra) = m.keys().next() {
            return Err(shape(format!("unexpected field {extra:?} beside \"ts\" and \"values\"")));
        }
        return Ok(TsRecord { ts: Ts(ts), values: values(vals, lim, count, true)? });
    }
    Ok(TsRecord { ts: now, values: values(m, lim, count, true)? })
}

fn values(m: Map<String, J>, lim: PayloadLimits, count: &mut usize, skip_nulls: bool) -> Result<Vec<(String, Value)>, PayloadError> {
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        if k.trim().is_empty() {
            return Err(shape("key must not be blank"));
        }
        if k.len() > lim.max_key_len {
            return Err(shape(format!(
                "key of {} bytes is longer than the limit of {} bytes",
                k.len(),
                lim.max_key_len
            )));
        }
        *count += 1;
        if *count > lim.max_values {
            return Err(PayloadError::TooMany(format!("more than {} values", lim.max_values)));
        }
        match typed(&v) {
            Some(val) => out.push((k, val)),
            None if skip_nulls => {}
            None => return Err(shape(format!("value of {k:?} is null"))),
        }
    }
    Ok(out)
}

/// Types one JSON value as ThingsBoard does; `None` for `null`.
pub fn typed(v: &J) -> Option<Value> {
    Some(match v {
        J::Null => return None,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Long(i)
            } else if n.is_u64() {
                // Integers beyond a long are kept exactly, as strings.
                Value::Str(n.to_string())
            } else {
                // serde_json refuses non-finite literals, so this is a finite double.
                Value::Double(n.as_f64().unwrap_or_default())
            }
        }
        J::String(s) => cast_string(s),
        J::Array(_) | J::Object(_) => Value::Json(v.to_string()),
    })
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

fn kind(v: &J) -> &'static str {
    match v {
        J::Null => "null",
        J::Bool(_) => "a boolean",
        J::Number(_) => "a number",
        J::String(_) => "a string",
        J::Array(_) => "an array",
        J::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: PayloadLimits = PayloadLimits { max_key_len: 16, max_values: 8 };
    const NOW: Ts = Ts(1000);

    fn tel(s: &str) -> Result<Vec<TsRecord>, PayloadError> {
        parse_telemetry(s.as_bytes(), NOW, LIM)
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
        assert_eq!(typed(&serde_json::json!(42.0)), Some(Value::Double(42.0)));
        assert_eq!(typed(&serde_json::json!(u64::MAX)), Some(Value::Str(u64::MAX.to_string())));
        assert_eq!(typed(&serde_json::json!(null)), None);
        assert_eq!(tel(r#"{"a":null,"b":1}"#).unwrap()[0].values, vec![("b".into(), Value::Long(1))]);
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
        assert!(matches!(tel("{}"), Err(PayloadError::Shape(m)) if m.contains("no telemetry")));
        assert!(matches!(tel(r#"{"ts":"x","values":{}}"#), Err(PayloadError::Shape(m)) if m.contains("ts")));
        assert!(matches!(tel(r#"{"ts":1,"values":5}"#), Err(PayloadError::Shape(m)) if m.contains("values")));
        assert!(matches!(tel(r#"{"aaaaaaaaaaaaaaaaaaaaaa":1}"#), Err(PayloadError::Shape(m)) if m.contains("limit")));
        assert!(matches!(tel(r#"{"":1}"#), Err(PayloadError::Shape(_))));
        assert!(matches!(tel(r#"{"a":1e400}"#), Err(PayloadError::Json(_))));
        assert!(matches!(tel(r#"{"a":NaN}"#), Err(PayloadError::Json(_))));
        let many = format!("{{{}}}", (0..9).map(|i| format!("\"k{i}\":1")).collect::<Vec<_>>().join(","));
        assert!(matches!(tel(&many), Err(PayloadError::TooMany(_))));
        assert!(parse_attributes(b"[]", LIM, true).is_err());
        assert!(parse_attributes(br#"{"a":null}"#, LIM, false).is_err());
    }
}
