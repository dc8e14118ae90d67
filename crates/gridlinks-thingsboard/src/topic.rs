//! ThingsBoard's MQTT device topics: what a topic a device publishes on names
//! ([`DeviceTopic::parse`]) and the topics GridLinks answers or pushes on
//! ([`attributes_response`], [`rpc_request`], [`rpc_response`]).
//!
//! | topic | [`DeviceTopic`] |
//! |---|---|
//! | `v1/devices/me/telemetry` | `Telemetry` |
//! | `v1/devices/me/attributes` | `Attributes` (also the topic of shared-attribute pushes) |
//! | `v1/devices/me/attributes/request/{id}` | `AttributeRequest(id)` |
//! | `v1/devices/me/rpc/response/{id}` (id a `u32`) | `RpcResponse(id)` |
//! | `v1/devices/me/rpc/request/{id}` | `RpcRequest(id)` (client-side RPC) |
//! | `v1/gateway/connect`, `…/disconnect`, `…/telemetry`, `…/attributes` | `Gateway*` |
//! | `v1/gateway/attributes/request`, `v1/gateway/rpc`, `v1/gateway/claim` | `GatewayAttributeRequest`, `GatewayRpc`, `GatewayClaim` |
//! | `v2/fw/request/{id}/chunk/{n}`, `v2/sw/request/{id}/chunk/{n}` (n a `u32`) | `OtaChunk` (answered on [`ota_response`]) |
//!
//! An `{id}` is one non-empty topic level.

/// `v1/devices/me/telemetry`.
pub const TELEMETRY: &str = "v1/devices/me/telemetry";
/// `v1/devices/me/attributes`: client attributes from the device, and the topic devices
/// subscribe to for shared-attribute updates.
pub const ATTRIBUTES: &str = "v1/devices/me/attributes";
/// A device's claiming request: `{"secretKey","durationMs"}`.
pub const CLAIM: &str = "v1/devices/me/claim";
/// Prefix of every gateway topic; only gateways may publish under it.
pub const GATEWAY_PREFIX: &str = "v1/gateway/";
/// Sub-devices' attributes from a gateway, and the server's shared-attribute pushes to it.
pub const GATEWAY_ATTRIBUTES: &str = "v1/gateway/attributes";
/// A gateway's attribute requests for its sub-devices.
pub const GATEWAY_ATTRIBUTES_REQUEST: &str = "v1/gateway/attributes/request";
/// The answers to a gateway's attribute requests.
pub const GATEWAY_ATTRIBUTES_RESPONSE: &str = "v1/gateway/attributes/response";
/// Server-side RPC to a gateway's sub-devices, and the gateway's answers.
pub const GATEWAY_RPC: &str = "v1/gateway/rpc";
/// Claiming requests for a gateway's sub-devices.
pub const GATEWAY_CLAIM: &str = "v1/gateway/claim";

const ATTRIBUTE_REQUEST_PREFIX: &str = "v1/devices/me/attributes/request/";
const ATTRIBUTE_RESPONSE_PREFIX: &str = "v1/devices/me/attributes/response/";
const RPC_REQUEST_PREFIX: &str = "v1/devices/me/rpc/request/";
/// The filter a device subscribes to for server-side RPC requests.
pub const RPC_REQUESTS: &str = "v1/devices/me/rpc/request/+";
const RPC_RESPONSE_PREFIX: &str = "v1/devices/me/rpc/response/";

/// A ThingsBoard device topic a device (or gateway) publishes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceTopic<'a> {
    /// `v1/devices/me/telemetry`: time series in any ThingsBoard payload form.
    Telemetry,
    /// `v1/devices/me/attributes`: client-scope attributes.
    Attributes,
    /// `v1/devices/me/attributes/request/{id}`: `{"clientKeys":"a,b","sharedKeys":"c"}`,
    /// answered on [`attributes_response`]`(id)`.
    AttributeRequest(&'a str),
    /// `v1/devices/me/rpc/response/{id}`: the device's answer to server-side RPC `id`.
    RpcResponse(u32),
    /// `v1/devices/me/rpc/request/{id}`: client-side RPC, answered on [`rpc_response`]`(id)`.
    RpcRequest(&'a str),
    /// `v1/devices/me/claim`: `{"secretKey":"…","durationMs":…}`, both optional.
    Claim,
    /// `v1/gateway/connect`: `{"device":"Name","type":"…"}`.
    GatewayConnect,
    /// `v1/gateway/disconnect`: `{"device":"Name"}`.
    GatewayDisconnect,
    /// `v1/gateway/telemetry`: `{"Device A": <telemetry>, …}`.
    GatewayTelemetry,
    /// `v1/gateway/attributes`: `{"Device A": {attributes}, …}`.
    GatewayAttributes,
    /// `v1/gateway/attributes/request`: `{"id","device","client","key"|"keys"}`.
    GatewayAttributeRequest,
    /// `v1/gateway/rpc`: a sub-device's answer `{"device","id","data"}`.
    GatewayRpc,
    /// `v1/gateway/claim`: `{"Device A": {"secretKey","durationMs"}, …}`.
    GatewayClaim,
    /// `v2/fw/request/{id}/chunk/{n}` (`software: false`) or `v2/sw/…`: chunk `n` of the
    /// device's OTA package, the chunk size as the payload's text (empty: the whole
    /// package), answered on [`ota_response`].
    OtaChunk {
        /// `sw` rather than `fw`.
        software: bool,
        /// The device's request id.
        request: &'a str,
        /// The chunk's index.
        chunk: u32,
    },
}

impl<'a> DeviceTopic<'a> {
    /// The device topic `topic` names, or `None` when it is none of ThingsBoard's
    /// (including an RPC response whose id is not a `u32`).
    pub fn parse(topic: &'a str) -> Option<Self> {
        Some(match topic {
            TELEMETRY => Self::Telemetry,
            ATTRIBUTES => Self::Attributes,
            CLAIM => Self::Claim,
            "v1/gateway/connect" => Self::GatewayConnect,
            "v1/gateway/disconnect" => Self::GatewayDisconnect,
            "v1/gateway/telemetry" => Self::GatewayTelemetry,
            GATEWAY_ATTRIBUTES => Self::GatewayAttributes,
            GATEWAY_ATTRIBUTES_REQUEST => Self::GatewayAttributeRequest,
            GATEWAY_RPC => Self::GatewayRpc,
            GATEWAY_CLAIM => Self::GatewayClaim,
            _ => {
                if let Some(id) = suffix_id(topic, ATTRIBUTE_REQUEST_PREFIX) {
                    Self::AttributeRequest(id)
                } else if let Some(id) = suffix_id(topic, RPC_RESPONSE_PREFIX) {
                    Self::RpcResponse(id.parse().ok()?)
                } else if let Some(id) = suffix_id(topic, RPC_REQUEST_PREFIX) {
                    Self::RpcRequest(id)
                } else {
                    ota_chunk(topic)?
                }
            }
        })
    }

    /// Whether this is one of the gateway API's topics.
    pub fn is_gateway(&self) -> bool {
        matches!(
            self,
            Self::GatewayConnect
                | Self::GatewayDisconnect
                | Self::GatewayTelemetry
                | Self::GatewayAttributes
                | Self::GatewayAttributeRequest
                | Self::GatewayRpc
                | Self::GatewayClaim
        )
    }
}

/// Whether `topic` lies under `v1/gateway/` (known to [`DeviceTopic`] or not): such a
/// publish from a device that is not a gateway is refused as such, not as unknown.
pub fn is_gateway_topic(topic: &str) -> bool {
    topic.starts_with(GATEWAY_PREFIX)
}

/// `v1/devices/me/attributes/response/{id}`: the answer to an attribute request.
pub fn attributes_response(id: &str) -> String {
    format!("{ATTRIBUTE_RESPONSE_PREFIX}{id}")
}

/// `v1/devices/me/rpc/request/{id}`: a server-side RPC call pushed to the device.
pub fn rpc_request(id: u32) -> String {
    format!("{RPC_REQUEST_PREFIX}{id}")
}

/// `v1/devices/me/rpc/response/{id}`: the answer to the device's client-side RPC `id`.
pub fn rpc_response(id: &str) -> String {
    format!("{RPC_RESPONSE_PREFIX}{id}")
}

/// `v2/{fw|sw}/request/{id}/chunk/{n}`.
fn ota_chunk(topic: &str) -> Option<DeviceTopic<'_>> {
    let rest = topic.strip_prefix("v2/")?;
    let (software, rest) = match rest.split_at_checked(3)? {
        ("fw/", rest) => (false, rest),
        ("sw/", rest) => (true, rest),
        _ => return None,
    };
    let (request, chunk) = rest.strip_prefix("request/")?.split_once("/chunk/")?;
    if request.is_empty() || request.contains('/') || chunk.contains('/') {
        return None;
    }
    Some(DeviceTopic::OtaChunk { software, request, chunk: chunk.parse().ok()? })
}

/// `v2/{fw|sw}/response/{id}/chunk/{n}`: where chunk `n` of request `id` goes (sent to the
/// device's connection whatever it subscribed, as ThingsBoard sends it).
pub fn ota_response(software: bool, request: &str, chunk: u32) -> String {
    format!("v2/{}/response/{request}/chunk/{chunk}", if software { "sw" } else { "fw" })
}

/// The `{id}` level after `prefix`: non-empty and a single level.
fn suffix_id<'a>(topic: &'a str, prefix: &str) -> Option<&'a str> {
    topic.strip_prefix(prefix).filter(|id| !id.is_empty() && !id.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_topic() {
        let cases = [
            ("v1/devices/me/telemetry", DeviceTopic::Telemetry),
            ("v1/devices/me/attributes", DeviceTopic::Attributes),
            ("v1/devices/me/attributes/request/7", DeviceTopic::AttributeRequest("7")),
            ("v1/devices/me/rpc/response/42", DeviceTopic::RpcResponse(42)),
            ("v1/devices/me/rpc/request/abc", DeviceTopic::RpcRequest("abc")),
            ("v1/gateway/connect", DeviceTopic::GatewayConnect),
            ("v1/gateway/disconnect", DeviceTopic::GatewayDisconnect),
            ("v1/gateway/telemetry", DeviceTopic::GatewayTelemetry),
            ("v1/gateway/attributes", DeviceTopic::GatewayAttributes),
            ("v1/gateway/attributes/request", DeviceTopic::GatewayAttributeRequest),
            ("v1/gateway/rpc", DeviceTopic::GatewayRpc),
            ("v1/gateway/claim", DeviceTopic::GatewayClaim),
            ("v2/fw/request/1/chunk/0", DeviceTopic::OtaChunk { software: false, request: "1", chunk: 0 }),
            ("v2/sw/request/ab/chunk/12", DeviceTopic::OtaChunk { software: true, request: "ab", chunk: 12 }),
        ];
        for (topic, want) in cases {
            assert_eq!(DeviceTopic::parse(topic), Some(want), "{topic}");
            assert_eq!(want.is_gateway(), is_gateway_topic(topic), "{topic}");
        }
    }

    #[test]
    fn not_device_topics() {
        for topic in [
            "",
            "v1/devices/me",
            "v1/devices/me/telemetry/x",
            "v1/devices/me/attributes/request/",
            "v1/devices/me/attributes/request/1/2",
            "v1/devices/me/attributes/response/1",
            "v1/devices/me/rpc/response/x",
            "v1/devices/me/rpc/response/4294967296",
            "v1/devices/me/rpc/request/",
            "v1/gateway/attributes/response",
            "v1/gateway/rpc/x",
            "v2/fw/request//chunk/0",
            "v2/fw/request/1/chunk/x",
            "v2/fw/request/1/chunk/-1",
            "v2/fw/request/1/2/chunk/0",
            "v2/xw/request/1/chunk/0",
            "v2/fw/response/1/chunk/0",
            "gridlinks/devices/a/telemetry",
        ] {
            assert_eq!(DeviceTopic::parse(topic), None, "{topic}");
        }
        assert!(is_gateway_topic("v1/gateway/rpc/x"));
    }

    #[test]
    fn response_topics() {
        assert_eq!(attributes_response("3"), "v1/devices/me/attributes/response/3");
        assert_eq!(rpc_request(9), "v1/devices/me/rpc/request/9");
        assert_eq!(rpc_response("x1"), "v1/devices/me/rpc/response/x1");
        assert_eq!(ota_response(true, "3", 4), "v2/sw/response/3/chunk/4");
        assert_eq!(DeviceTopic::parse(&rpc_request(9)), Some(DeviceTopic::RpcRequest("9")));
    }
}
