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
                    return None;
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
        assert_eq!(DeviceTopic::parse(&rpc_request(9)), Some(DeviceTopic::RpcRequest("9")));
    }
}
