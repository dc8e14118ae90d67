//! ThingsBoard's device API by topic: what a publish from an authenticated device means,
//! whatever transport carried it (MQTT, and CoAP and custom TCP in MQTT's terms). The
//! transport owns the socket and its protocol; this module owns
//! the topic names and payloads, and resolves only once the data is durably committed.
//!
//! | topic | meaning |
//! |---|---|
//! | `v1/devices/me/telemetry` | time series (every ThingsBoard payload form) |
//! | `v1/devices/me/attributes` | client-scope attributes |
//! | `v1/devices/me/attributes/request/{id}` | `{"clientKeys":"a,b","sharedKeys":"c"}` → reply on `…/attributes/response/{id}` |
//! | `v1/devices/me/rpc/response/{id}` | the device's answer to server-side RPC `{id}` |
//! | `v1/devices/me/claim` | `{"secretKey","durationMs"}`: the device may be claimed by a customer user (`crate::claims`) |
//! | `v1/devices/me/rpc/request/{id}` | client-side RPC: `getSessionLimits` answered with the limits, anything else "not supported", on `…/rpc/response/{id}` |
//! | `v1/gateway/connect`, `v1/gateway/disconnect` | `{"device":"Name","type":"…"}`; sub-devices are created on first use |
//! | `v1/gateway/telemetry`, `v1/gateway/attributes` | `{"Device A": <telemetry or attributes>}` |
//! | `v1/gateway/attributes/request` | `{"id":1,"device":"A","client":false,"key":"k"}` (or `"keys"`) → `v1/gateway/attributes/response` |
//! | `v1/gateway/rpc` | a sub-device's answer to server-side RPC: `{"device":"A","id":7,"data":{…}}` |
//! | `v1/gateway/claim` | `{"A":{"secretKey","durationMs"},…}`: each sub-device may be claimed |
//! | `v2/fw/request/{id}/chunk/{n}`, `v2/sw/…` | chunk `n` of the device's assigned firmware/software, the chunk size as text (empty: all) → `v2/fw/response/{id}/chunk/{n}` |
//!
//! The server pushes to a gateway for its sub-devices on `v1/gateway/attributes` (shared
//! attribute changes and deletions) and `v1/gateway/rpc` (server-side RPC), see
//! [`crate::sessions::DeviceSessions`]; shapes in `gridlinks_thingsboard::gateway`.
//!
//! The gateway topics are for gateways only (`additionalInfo.gateway: true`), and a gateway
//! writes only to the devices it created (at most `limits.max_devices_per_gateway`) or was
//! assigned (a "Created" relation from the gateway, `POST /api/relation`). A message naming
//! any other device is refused whole: nothing of it is stored.

use std::sync::Arc;

use bytes::Bytes;
use gridlinks_ingest::{IngestError, Item};
use gridlinks_storage::StoreError;
use gridlinks_types::{AttributeScope, DeviceId, Ts};
use serde_json::{json, Value as J};

use crate::attributes;
use crate::core::Platform;
use crate::entities::ota::{self, OtaType};
use gridlinks_thingsboard::attributes::AttributeRequest;
use gridlinks_thingsboard::gateway;
use gridlinks_thingsboard::payload::{self, PayloadError};
use gridlinks_thingsboard::topic::{self, attributes_response, is_gateway_topic, rpc_response, DeviceTopic};

/// Why a publish was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// Not a ThingsBoard device topic.
    #[error("unknown topic")]
    UnknownTopic,
    /// Refused by the ingest path (payload, gateway rights, storage).
    #[error("{0}")]
    Ingest(#[from] IngestError),
}

impl From<PayloadError> for TopicError {
    fn from(e: PayloadError) -> Self {
        Self::Ingest(IngestError::BadPayload(e.to_string()))
    }
}

impl From<StoreError> for TopicError {
    fn from(e: StoreError) -> Self {
        Self::Ingest(e.into())
    }
}

/// A message to publish back to the same connection.
#[derive(Debug)]
pub struct Reply {
    /// Topic.
    pub topic: String,
    /// Payload.
    pub payload: Bytes,
}

/// The publishes that join a batch (one ingest submit for everything decoded from one
/// read): telemetry and client attributes of the device itself, parsed here and counted
/// against the tenant profile's rate limits. `None` for every other topic, which
/// [`handle_publish`] handles one by one.
pub fn batch_item(st: &Platform, device: DeviceId, topic: &str, body: &[u8]) -> Option<Result<Item, IngestError>> {
    let parse = match DeviceTopic::parse(topic)? {
        DeviceTopic::Telemetry => telemetry_item,
        DeviceTopic::Attributes => attributes_item,
        _ => return None,
    };
    // Past the limit, refused before the payload is parsed.
    if let Some(refused) = st.core.limits.refuses_data(device) {
        return Some(Err(refused));
    }
    let item = parse(st, device, body);
    Some(item.map_err(|e| IngestError::BadPayload(e.to_string())).and_then(|item| {
        st.core.limits.meter_item(&item)?;
        Ok(item)
    }))
}

/// Data points of a gateway message (its values, over every device).
fn points<T>(per_device: &[(String, Vec<T>)], count: impl Fn(&T) -> usize) -> usize {
    per_device.iter().map(|(_, v)| v.iter().map(&count).sum::<usize>()).sum()
}

fn telemetry_item(st: &Platform, device: DeviceId, body: &[u8]) -> Result<Item, PayloadError> {
    let records = payload::parse_telemetry(body, Ts::now(), st.core.payload_limits())?;
    Ok(Item::Telemetry { device, records })
}

fn attributes_item(st: &Platform, device: DeviceId, body: &[u8]) -> Result<Item, PayloadError> {
    let values = payload::parse_attributes(body, st.core.payload_limits(), true)?;
    Ok(Item::Attributes { device, scope: AttributeScope::Client, values })
}

/// Gateway `gateway`'s sub-device `name` ([`gridlinks_ingest::Ingest::gateway_device`]);
/// one it has just created or adopted is told its profile's OTA packages.
async fn sub_device(
    st: &Platform,
    gateway: DeviceId,
    name: &str,
    device_type: Option<String>,
) -> Result<DeviceId, IngestError> {
    let (id, new) = st.core.ingest.gateway_device(gateway, name, device_type).await?;
    if new {
        if let Err(e) = crate::entities::ota::created(st, vec![id]).await {
            tracing::warn!(device = %id, error = %e, "a gateway's new device was not told its OTA packages");
        }
    }
    Ok(id)
}

/// Handles one PUBLISH of `device` that is not a [`batch_item`]; resolves after the
/// durable commit.
pub async fn handle_publish(
    st: Arc<Platform>,
    device: DeviceId,
    topic: &str,
    body: Bytes,
) -> Result<Option<Reply>, TopicError> {
    let lim = st.core.payload_limits();
    let parsed = DeviceTopic::parse(topic);
    // Every topic under v1/gateway/, known or not, is refused to a device that is not a gateway.
    if is_gateway_topic(topic) && !st.core.ingest.is_gateway(device)? {
        return Err(IngestError::NotGateway.into());
    }
    let Some(parsed) = parsed else {
        return Err(TopicError::UnknownTopic);
    };
    // Data (telemetry, attributes) is counted once parsed, with its points; anything else here.
    let data = matches!(
        parsed,
        DeviceTopic::Telemetry
            | DeviceTopic::Attributes
            | DeviceTopic::GatewayTelemetry
            | DeviceTopic::GatewayAttributes
    );
    if !data {
        if is_gateway_topic(topic) {
            st.core.limits.meter_gateway(device, 0)?;
        } else {
            st.core.limits.meter(device, 0)?;
        }
    }
    match parsed {
        DeviceTopic::Telemetry => {
            st.core.submit_from_device(telemetry_item(&st, device, &body)?).await?;
            Ok(None)
        }
        DeviceTopic::Attributes => {
            st.core.submit_from_device(attributes_item(&st, device, &body)?).await?;
            Ok(None)
        }
        DeviceTopic::GatewayConnect => {
            let (name, device_type) = payload::parse_gateway_device(&body)?;
            let sub = sub_device(&st, device, &name, device_type).await?;
            st.core.activity.connected(sub);
            Ok(None)
        }
        DeviceTopic::GatewayDisconnect => {
            let (name, _) = payload::parse_gateway_device(&body)?;
            st.core.activity.disconnected(st.core.ingest.owns(device, &name)?);
            Ok(None)
        }
        DeviceTopic::GatewayTelemetry => {
            let per_device = payload::parse_gateway_telemetry(&body, Ts::now(), lim)?;
            st.core.limits.meter_gateway(device, points(&per_device, |r| r.values.len()))?;
            let mut items = Vec::with_capacity(per_device.len());
            for (name, records) in per_device {
                let sub = sub_device(&st, device, &name, None).await?;
                st.core.activity.touch(sub);
                items.push(Item::Telemetry { device: sub, records });
            }
            all_ok(st.core.ingest.submit(items).await)?;
            Ok(None)
        }
        DeviceTopic::GatewayAttributes => {
            let per_device = payload::parse_gateway_attributes(&body, lim)?;
            st.core.limits.meter_gateway(device, points(&per_device, |_| 1))?;
            let mut items = Vec::with_capacity(per_device.len());
            for (name, values) in per_device {
                let id = sub_device(&st, device, &name, None).await?;
                st.core.activity.touch(id);
                items.push(Item::Attributes { device: id, scope: AttributeScope::Client, values });
            }
            all_ok(st.core.ingest.submit(items).await)?;
            Ok(None)
        }
        DeviceTopic::GatewayAttributeRequest => gateway_attribute_request(&st, device, &body).await.map(Some),
        DeviceTopic::GatewayRpc => {
            let reply = gateway::parse_rpc_reply(&body)?;
            let sub = st.core.ingest.owned(device, &reply.device)?;
            st.devices.rpc.complete(sub, reply.id, Bytes::from(reply.data));
            Ok(None)
        }
        DeviceTopic::GatewayClaim => {
            let claims = gateway::parse_claims(&body)?;
            let mut subs = Vec::with_capacity(claims.len());
            // Every name is resolved before any claim opens: one foreign name refuses all.
            for (name, claim) in claims {
                subs.push((sub_device(&st, device, &name, None).await?, claim));
            }
            for (sub, claim) in subs {
                st.core.claims.open(sub, claim, Ts::now().0);
            }
            Ok(None)
        }
        DeviceTopic::AttributeRequest(id) => attribute_request(&st, device, id, &body).await.map(Some),
        DeviceTopic::OtaChunk { software, request, chunk } => ota_chunk(&st, device, software, chunk, &body)
            .await
            .map(|payload| Some(Reply { topic: topic::ota_response(software, request, chunk), payload })),
        DeviceTopic::Claim => {
            crate::claims::open_from_device(&st.core, device, &body)?;
            Ok(None)
        }
        DeviceTopic::RpcResponse(n) => {
            // An answer nobody waits for any more (timed out) is simply dropped, as ThingsBoard does.
            st.devices.rpc.complete(device, n, body);
            Ok(None)
        }
        DeviceTopic::RpcRequest(id) => {
            let (max_payload, in_flight) = (st.core.cfg.mqtt.max_packet_size, st.core.cfg.mqtt.receive_maximum);
            let answer = client_rpc(&st.core, device, &body, max_payload, usize::from(in_flight));
            Ok(Some(Reply { topic: rpc_response(id), payload: Bytes::from(answer.to_string()) }))
        }
    }
}

/// The first failure of a batch, if any.
fn all_ok(results: Vec<Result<(), IngestError>>) -> Result<(), IngestError> {
    results.into_iter().collect()
}

/// Client-side RPC (MQTT, CoAP, HTTP). ThingsBoard's device SDK asks `getSessionLimits` on
/// every connect and paces itself by the answer: the transport's real limits and the
/// device's rate limits from its tenant profile (empty strings: none). Any other method is
/// answered "not supported".
pub fn client_rpc(core: &crate::Core, device: DeviceId, body: &[u8], max_payload: usize, max_in_flight: usize) -> J {
    let method =
        serde_json::from_slice::<J>(body).ok().and_then(|r| r.get("method").and_then(J::as_str).map(String::from));
    match method.as_deref() {
        Some("getSessionLimits") => {
            let rates = |[messages, telemetry_messages, telemetry_data_points]: [String; 3]| {
                json!({
                    "messages": messages,
                    "telemetryMessages": telemetry_messages,
                    "telemetryDataPoints": telemetry_data_points,
                })
            };
            let (own, for_devices) = core.limits.device_rates(device);
            let mut limits = json!({
                "maxPayloadSize": max_payload,
                "maxInflightMessages": max_in_flight,
                "rateLimits": rates(own),
            });
            // A gateway also learns the limits of what it sends for its devices, as from ThingsBoard.
            if let Some(g) = for_devices {
                limits["gatewayRateLimits"] = rates(g);
            }
            limits
        }
        _ => json!({"error": "client-side RPC is not supported by GridLinks yet (only getSessionLimits)"}),
    }
}

/// Chunk `chunk` of the device's assigned firmware (or software) package; the payload is
/// the chunk size as text (empty: the whole package).
async fn ota_chunk(
    st: &Platform,
    device: DeviceId,
    software: bool,
    chunk: u32,
    body: &[u8],
) -> Result<Bytes, TopicError> {
    let size = parse_chunk_size(body)?;
    let t = if software { OtaType::Software } else { OtaType::Firmware };
    match ota::device_chunk(st, device, t, size, chunk as usize).await {
        Ok(Some((_, bytes))) => Ok(bytes),
        Ok(None) => {
            Err(IngestError::BadPayload(format!("no {} package with data is assigned to this device", t.prefix()))
                .into())
        }
        Err(e) => Err(IngestError::Unavailable(e.to_string()).into()),
    }
}

/// A chunk size as a device sends it: decimal bytes, or nothing for the whole package.
pub fn parse_chunk_size(body: &[u8]) -> Result<usize, PayloadError> {
    let text =
        std::str::from_utf8(body).map_err(|_| PayloadError::Shape("the chunk size is decimal text".into()))?.trim();
    if text.is_empty() {
        return Ok(0);
    }
    text.parse::<u32>().map(|n| n as usize).map_err(|_| {
        PayloadError::Shape(format!("invalid chunk size {text:?}: a whole number of bytes, at most {}", u32::MAX))
    })
}

/// A gateway's request for one scope's keys of a sub-device, answered on
/// `v1/gateway/attributes/response`.
async fn gateway_attribute_request(st: &Arc<Platform>, gw: DeviceId, body: &[u8]) -> Result<Reply, TopicError> {
    let req = gateway::parse_attribute_request(body)?;
    let sub = sub_device(st, gw, &req.device, None).await?;
    let scope = if req.client { AttributeScope::Client } else { AttributeScope::Shared };
    // No keys: every attribute of the scope, as ThingsBoard reads an empty name list.
    let keys = (!req.keys.is_empty()).then(|| req.keys.clone());
    let found = attributes::read(&st.core.store, sub, Some(scope), keys).await?;
    let answer = gateway::attribute_response(&req, found.into_iter().map(|a| (a.key, a.value.to_json())).collect());
    Ok(Reply { topic: topic::GATEWAY_ATTRIBUTES_RESPONSE.to_owned(), payload: Bytes::from(answer.to_string()) })
}

async fn attribute_request(st: &Arc<Platform>, device: DeviceId, id: &str, body: &[u8]) -> Result<Reply, TopicError> {
    let req = AttributeRequest::parse_json(body)?;
    let answer = attributes::read_for_device(&st.core.store, device, req).await?;
    Ok(Reply { topic: attributes_response(id), payload: Bytes::from(answer.to_string()) })
}
