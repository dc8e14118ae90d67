//! The device's view of its attributes: which ones it asks for (`clientKeys` /
//! `sharedKeys`, over HTTP as query parameters, over MQTT as
//! `{"clientKeys":"a,b","sharedKeys":"c"}` on `v1/devices/me/attributes/request/{id}`)
//! and the answer's shape `{"client":{…},"shared":{…}}`.

use gridlinks_types::{AttributeScope, Value};
use serde_json::{Map, Value as J};

use crate::keys;
use crate::payload::PayloadError;

/// The attributes a device asks for. Neither list given: every client and shared
/// attribute; one given: only that scope, only those keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttributeRequest {
    /// Client-scope keys asked for (`clientKeys`).
    pub client: Option<Vec<String>>,
    /// Shared-scope keys asked for (`sharedKeys`).
    pub shared: Option<Vec<String>>,
}

impl AttributeRequest {
    /// From the comma-separated lists of the HTTP device API's query
    /// (`GET /api/v1/{token}/attributes?clientKeys=&sharedKeys=`).
    pub fn from_key_lists(client: Option<&str>, shared: Option<&str>) -> Self {
        Self { client: client.map(keys::parse), shared: shared.map(keys::parse) }
    }

    /// From the body of an MQTT attribute request, `{"clientKeys":"a,b","sharedKeys":"c"}`
    /// (either may be absent or `null`).
    pub fn parse_json(body: &[u8]) -> Result<Self, PayloadError> {
        let req: J = serde_json::from_slice(body).map_err(|e| PayloadError::Json(e.to_string()))?;
        let list = |field: &str| -> Result<Option<Vec<String>>, PayloadError> {
            match req.get(field) {
                None | Some(J::Null) => Ok(None),
                Some(J::String(s)) => Ok(Some(keys::parse(s))),
                Some(_) => Err(PayloadError::Shape(format!("\"{field}\" must be a comma-separated string"))),
            }
        };
        Ok(Self { client: list("clientKeys")?, shared: list("sharedKeys")? })
    }

    /// The reads that answer it: (scope, keys or `None` for all), client first.
    pub fn reads(self) -> Vec<(AttributeScope, Option<Vec<String>>)> {
        let both = self.client.is_none() && self.shared.is_none();
        [(AttributeScope::Client, self.client), (AttributeScope::Shared, self.shared)]
            .into_iter()
            .filter(|(_, keys)| both || keys.is_some())
            .collect()
    }
}

/// The answer `{"client":{"k":v,…},"shared":{…}}`, typed values; a scope with nothing
/// found is left out (so nothing found at all is `{}`).
pub fn device_response(sections: impl IntoIterator<Item = (AttributeScope, Vec<(String, Value)>)>) -> J {
    let mut out = Map::new();
    for (scope, values) in sections {
        if !values.is_empty() {
            let name = match scope {
                AttributeScope::Client => "client",
                AttributeScope::Shared => "shared",
                // Devices never ask for server attributes; named for completeness.
                AttributeScope::Server => "server",
            };
            out.insert(name.into(), J::Object(values.into_iter().map(|(k, v)| (k, v.to_json())).collect()));
        }
    }
    J::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Option<Vec<String>> {
        Some(v.iter().map(|k| k.to_string()).collect())
    }

    #[test]
    fn neither_list_reads_both_scopes_whole() {
        let r = AttributeRequest::from_key_lists(None, None);
        assert_eq!(r.reads(), [(AttributeScope::Client, None), (AttributeScope::Shared, None)]);
        assert_eq!(AttributeRequest::parse_json(b"{}").unwrap().reads().len(), 2);
        assert_eq!(AttributeRequest::parse_json(br#"{"clientKeys":null}"#).unwrap().reads().len(), 2);
    }

    #[test]
    fn one_list_reads_only_its_scope() {
        let r = AttributeRequest::from_key_lists(Some("a, b"), None);
        assert_eq!(r.reads(), [(AttributeScope::Client, s(&["a", "b"]))]);
        let r = AttributeRequest::parse_json(br#"{"sharedKeys":"c,,d "}"#).unwrap();
        assert_eq!(r.reads(), [(AttributeScope::Shared, s(&["c", "d"]))]);
        let r = AttributeRequest::from_key_lists(Some(""), Some("x"));
        assert_eq!(r.reads(), [(AttributeScope::Client, s(&[])), (AttributeScope::Shared, s(&["x"]))]);
    }

    #[test]
    fn bad_requests() {
        assert!(matches!(AttributeRequest::parse_json(b"{"), Err(PayloadError::Json(_))));
        assert_eq!(
            AttributeRequest::parse_json(br#"{"clientKeys":["a"]}"#),
            Err(PayloadError::Shape("\"clientKeys\" must be a comma-separated string".into()))
        );
    }

    #[test]
    fn response_shape() {
        let j = device_response([
            (AttributeScope::Client, vec![("a".into(), Value::Long(1))]),
            (AttributeScope::Shared, vec![]),
        ]);
        assert_eq!(j, serde_json::json!({"client": {"a": 1}}));
        assert_eq!(device_response([]), serde_json::json!({}));
    }
}
