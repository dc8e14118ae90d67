//! ThingsBoard's CoAP device API resources, from a request's method, Uri-Path segments and
//! Uri-Query options ([`Parts`], read from a coap-lite packet): what the request asks for,
//! or why it cannot be served; block-wise transfer ([`block`]); the message format and
//! option checks before a request is served ([`message`]); the deduplication store
//! ([`exchange`]); address verification against amplification ([`echo`]). All sans-IO.

pub mod block;
pub mod echo;
pub mod exchange;
pub mod message;

use coap_lite::{CoapOption, MessageClass, Packet, RequestType};

use crate::attributes::AttributeRequest;

/// What routing reads of a request packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parts {
    /// The method.
    pub method: Method,
    /// Uri-Path segments.
    pub path: Vec<String>,
    /// Uri-Query options.
    pub query: Vec<String>,
}

impl Parts {
    /// The method, path and query of `packet` (options that are not UTF-8 are read lossily).
    pub fn of(packet: &Packet) -> Self {
        let options = |o| -> Vec<String> {
            packet
                .get_option(o)
                .map(|v| v.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect())
                .unwrap_or_default()
        };
        let method = match packet.header.code {
            MessageClass::Request(RequestType::Get) => Method::Get,
            MessageClass::Request(RequestType::Post) => Method::Post,
            _ => Method::Other,
        };
        Parts { method, path: options(CoapOption::UriPath), query: options(CoapOption::UriQuery) }
    }

    /// The resource these parts name ([`route`]).
    pub fn route(&self) -> Result<Resource<'_>, RouteError> {
        let path: Vec<&str> = self.path.iter().map(String::as_str).collect();
        let query: Vec<&str> = self.query.iter().map(String::as_str).collect();
        route(self.method, &path, &query)
    }
}

/// A CoAP request method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// POST.
    Post,
    /// PUT, DELETE, FETCH, …: no device API resource takes them.
    Other,
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource<'a> {
    /// A device API resource, with the access token in the path.
    Device(&'a str, DeviceResource),
    /// `POST /api/v1/provision`: device provisioning (no token).
    Provision,
}

/// What a device asks for, under `/api/v1/{token}/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceResource {
    /// `POST …/telemetry`.
    PostTelemetry,
    /// `POST …/attributes` (client scope).
    PostAttributes,
    /// `GET …/attributes?clientKeys=&sharedKeys=`; with Observe, shared attribute updates.
    GetAttributes(AttributeRequest),
    /// `GET …/rpc` with Observe: server-side RPC requests.
    GetRpc,
    /// `POST …/rpc`: client-side RPC.
    ClientRpc,
    /// `POST …/rpc/{id}`: the device's answer to server-side RPC `id`.
    RpcResponse(u32),
    /// `POST …/claim`: the device may be claimed (`{"secretKey","durationMs"}`).
    Claim,
    /// `GET /fw/{token}` or `/sw/{token}` `?title=&version=&size=&chunk=` (each optional):
    /// chunk `chunk` of `size` bytes (0: all) of the device's OTA package.
    Ota {
        /// `sw` rather than `fw`.
        software: bool,
        /// The title the device expects, if it says.
        title: Option<String>,
        /// The version it expects, if it says.
        version: Option<String>,
        /// Chunk size, bytes (0: the whole package).
        size: u32,
        /// Chunk index.
        chunk: u32,
    },
}

/// Why a request names no resource.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No such resource (4.04).
    #[error("no such resource: use /api/v1/{{token}}/telemetry, /attributes, /rpc, /rpc/{{id}}, /claim, or /fw/{{token}}, /sw/{{token}}")]
    NotFound,
    /// The resource exists but not with this method (4.05).
    #[error("telemetry and claim: POST; attributes and rpc: POST or GET; rpc/{{id}}: POST")]
    MethodNotAllowed,
    /// A query parameter the resource does not take (4.00).
    #[error("bad query parameter {0:?}: attributes take clientKeys and sharedKeys; fw and sw take title, version, size and chunk (whole numbers)")]
    BadQuery(String),
}

/// The resource `method` on `path` (Uri-Path segments) with `query` (Uri-Query options) names.
pub fn route<'a>(method: Method, path: &[&'a str], query: &[&str]) -> Result<Resource<'a>, RouteError> {
    if let ["api", "v1", "provision"] = path {
        return match method {
            Method::Post => Ok(Resource::Provision),
            _ => Err(RouteError::MethodNotAllowed),
        };
    }
    if let [kind @ ("fw" | "sw"), token] = path {
        if method != Method::Get {
            return Err(RouteError::MethodNotAllowed);
        }
        let (mut title, mut version, mut size, mut chunk) = (None, None, 0, 0);
        for q in query {
            let number = |v: &str| v.parse::<u32>().map_err(|_| RouteError::BadQuery((*q).to_owned()));
            match q.split_once('=') {
                Some(("title", v)) => title = Some(v.to_owned()),
                Some(("version", v)) => version = Some(v.to_owned()),
                Some(("size", v)) => size = number(v)?,
                Some(("chunk", v)) => chunk = number(v)?,
                _ => return Err(RouteError::BadQuery((*q).to_owned())),
            }
        }
        let software = *kind == "sw";
        return Ok(Resource::Device(token, DeviceResource::Ota { software, title, version, size, chunk }));
    }
    if let ["api", "v1", token, "rpc", id] = path {
        let Ok(id) = id.parse() else { return Err(RouteError::NotFound) };
        return match method {
            Method::Post => Ok(Resource::Device(token, DeviceResource::RpcResponse(id))),
            _ => Err(RouteError::MethodNotAllowed),
        };
    }
    let ["api", "v1", token, resource] = path else { return Err(RouteError::NotFound) };
    let device = |r| Ok(Resource::Device(token, r));
    match (method, *resource) {
        (Method::Get, "rpc") => device(DeviceResource::GetRpc),
        (Method::Post, "rpc") => device(DeviceResource::ClientRpc),
        (Method::Post, "telemetry") => device(DeviceResource::PostTelemetry),
        (Method::Post, "attributes") => device(DeviceResource::PostAttributes),
        (Method::Post, "claim") => device(DeviceResource::Claim),
        (Method::Get, "attributes") => {
            let (mut client, mut shared) = (None, None);
            for q in query {
                match q.split_once('=') {
                    Some(("clientKeys", v)) => client = Some(v),
                    Some(("sharedKeys", v)) => shared = Some(v),
                    _ => return Err(RouteError::BadQuery((*q).to_owned())),
                }
            }
            device(DeviceResource::GetAttributes(AttributeRequest::from_key_lists(client, shared)))
        }
        (_, "telemetry" | "attributes" | "rpc" | "claim") => Err(RouteError::MethodNotAllowed),
        _ => Err(RouteError::NotFound),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let p = |s: &'static str| s.split('/').filter(|x| !x.is_empty()).collect::<Vec<_>>();
        assert_eq!(
            route(Method::Post, &p("/api/v1/T/telemetry"), &[]),
            Ok(Resource::Device("T", DeviceResource::PostTelemetry))
        );
        assert_eq!(
            route(Method::Post, &p("/api/v1/T/attributes"), &[]),
            Ok(Resource::Device("T", DeviceResource::PostAttributes))
        );
        let get = route(Method::Get, &p("/api/v1/T/attributes"), &["clientKeys=a,b", "sharedKeys=c"]);
        assert_eq!(
            get,
            Ok(Resource::Device(
                "T",
                DeviceResource::GetAttributes(AttributeRequest::from_key_lists(Some("a,b"), Some("c")))
            ))
        );
        assert_eq!(route(Method::Get, &p("/api/v1/T/telemetry"), &[]), Err(RouteError::MethodNotAllowed));
        assert_eq!(route(Method::Other, &p("/api/v1/T/attributes"), &[]), Err(RouteError::MethodNotAllowed));
        assert_eq!(route(Method::Get, &p("/api/v1/T/rpc"), &[]), Ok(Resource::Device("T", DeviceResource::GetRpc)));
        assert_eq!(route(Method::Post, &p("/api/v1/T/rpc"), &[]), Ok(Resource::Device("T", DeviceResource::ClientRpc)));
        assert_eq!(
            route(Method::Post, &p("/api/v1/T/rpc/7"), &[]),
            Ok(Resource::Device("T", DeviceResource::RpcResponse(7)))
        );
        assert_eq!(route(Method::Get, &p("/api/v1/T/rpc/7"), &[]), Err(RouteError::MethodNotAllowed));
        assert_eq!(route(Method::Post, &p("/api/v1/T/rpc/x"), &[]), Err(RouteError::NotFound));
        assert_eq!(route(Method::Post, &p("/api/v1/T/rpc/4294967296"), &[]), Err(RouteError::NotFound));
        assert_eq!(route(Method::Post, &p("/api/v1/T/other"), &[]), Err(RouteError::NotFound));
        assert_eq!(route(Method::Post, &p("/api/v1/provision"), &[]), Ok(Resource::Provision));
        assert_eq!(route(Method::Get, &p("/api/v1/provision"), &[]), Err(RouteError::MethodNotAllowed));
        assert_eq!(route(Method::Post, &p("/api/v2/T/telemetry"), &[]), Err(RouteError::NotFound));
        assert_eq!(route(Method::Post, &p("/api/v1/T/telemetry/x"), &[]), Err(RouteError::NotFound));
        assert_eq!(route(Method::Get, &p("/api/v1/T/attributes"), &["x=1"]), Err(RouteError::BadQuery("x=1".into())));
    }

    #[test]
    fn ota_resources() {
        let ota = |software, title: Option<&str>, size, chunk| {
            Ok(Resource::Device(
                "T",
                DeviceResource::Ota { software, title: title.map(Into::into), version: None, size, chunk },
            ))
        };
        assert_eq!(route(Method::Get, &["fw", "T"], &[]), ota(false, None, 0, 0));
        assert_eq!(route(Method::Get, &["sw", "T"], &["title=a", "size=5", "chunk=2"]), ota(true, Some("a"), 5, 2));
        assert_eq!(route(Method::Post, &["fw", "T"], &[]), Err(RouteError::MethodNotAllowed));
        for bad in ["size=-1", "chunk=x", "size=99999999999", "other=1"] {
            assert_eq!(route(Method::Get, &["fw", "T"], &[bad]), Err(RouteError::BadQuery(bad.into())));
        }
        assert_eq!(route(Method::Get, &["fw", "T", "x"], &[]), Err(RouteError::NotFound));
    }

    #[test]
    fn parts_of_a_packet() {
        let mut packet = Packet::new();
        packet.header.code = MessageClass::Request(RequestType::Get);
        for seg in ["api", "v1", "T", "attributes"] {
            packet.add_option(CoapOption::UriPath, seg.as_bytes().to_vec());
        }
        packet.add_option(CoapOption::UriQuery, b"sharedKeys=a".to_vec());
        let parts = Parts::of(&packet);
        assert_eq!(parts.method, Method::Get);
        assert_eq!(
            parts.route(),
            Ok(Resource::Device("T", DeviceResource::GetAttributes(AttributeRequest::from_key_lists(None, Some("a")))))
        );
        packet.header.code = MessageClass::Request(RequestType::Delete);
        assert_eq!(Parts::of(&packet).route(), Err(RouteError::MethodNotAllowed));
    }
}
