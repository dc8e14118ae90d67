//! ThingsBoard's HTTP device API under `/api/v1/{token}/`: `telemetry`, `attributes` (post,
//! read, and `attributes/updates` by long poll), `rpc` (client-side calls, server-side
//! requests by long poll, and the answers to them) and `claim`. A 200 to a write is sent
//! only after the data is durably committed by the group commit. Over HTTPS with
//! `http.tls_client_certs`, the same paths without the token (`/api/v1/telemetry`, …) name
//! the device by the connection's client certificate ([`Device`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gridlinks_ingest::{IngestError, Item};
use gridlinks_types::{AttributeScope, DeviceId, Ts};
use serde::Deserialize;
use serde_json::Value as J;

use super::error::{ApiError, ApiResult};
use super::extract::{Body, Q};
use super::long_poll::{Kind, LongPolls, PollError};
use crate::state::Status;
use gridlinks_listener::tls::ClientCert;
use gridlinks_platform::attributes;
use gridlinks_platform::provision::ChainRefusal;
use gridlinks_platform::{Core, Platform};
use gridlinks_thingsboard::attributes::AttributeRequest;
use gridlinks_thingsboard::error::ErrorCode;
use gridlinks_thingsboard::payload::{self, PayloadError};

type St = State<Arc<Core>>;

/// The device a request comes from: the `{token}` of its path or, on a token-less path,
/// the client certificate of its HTTPS connection: the device whose `X509_CERTIFICATE`
/// credentials hold it, else one a profile's `X509_CERTIFICATE_CHAIN` provisioning makes
/// (as over MQTT). The request counts as the device's activity.
pub struct Device(pub DeviceId);

impl<S> FromRequestParts<S> for Device
where
    S: Send + Sync,
    Arc<Platform>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let p = Arc::<Platform>::from_ref(state);
        // Every route with a token names it `{token}`; a path that does not decode is refused
        // (never taken as token-less).
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        let device = if let Some(token) = params.get("token") {
            p.core.ingest.authenticate(token)?
        } else {
            let cert = parts.extensions.get::<Arc<ClientCert>>().cloned().ok_or_else(|| {
                ApiError::unauthorized(
                    "this path names no token: it needs a client certificate (HTTPS with http.tls_client_certs)",
                )
            })?;
            by_certificate(&p, &cert).await?
        };
        p.core.activity.touch(device);
        Ok(Device(device))
    }
}

async fn by_certificate(p: &Platform, cert: &ClientCert) -> ApiResult<DeviceId> {
    let (store, fingerprint) = (p.core.store.clone(), cert.fingerprint.clone());
    let found = tokio::task::spawn_blocking(move || store.device_by_x509(&fingerprint))
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::General, e.to_string()))??;
    if let Some(d) = found.filter(|d| d.x509.is_some()) {
        return Ok(d.id);
    }
    let chain: Vec<Vec<u8>> = cert.chain.iter().map(|d| d.to_vec()).collect();
    match gridlinks_platform::provision::x509_chain(p, &chain).await {
        Ok(d) => Ok(d),
        Err(ChainRefusal::NoProfile) => {
            Err(ApiError::unauthorized("no device has this client certificate (X509_CERTIFICATE credentials)"))
        }
        Err(ChainRefusal::Storage(e)) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::General, e)),
        Err(why) => Err(ApiError::unauthorized(why.to_string())),
    }
}

/// A request that posts no data counts as a message against the device's tenant profile
/// rate limits (429 when spent).
pub(crate) fn metered(st: &Core, Device(device): Device) -> ApiResult<DeviceId> {
    st.limits.meter(device, 0)?;
    Ok(device)
}

fn rejected(status: &Status, e: PayloadError) -> ApiError {
    status.payload_rejected.fetch_add(1, Ordering::Relaxed);
    IngestError::BadPayload(e.to_string()).into()
}

/// `POST /api/v1/{token}/telemetry`.
pub async fn post_telemetry(
    State(st): St,
    State(status): State<Arc<Status>>,
    Device(device): Device,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let records = payload::parse_telemetry(&body, Ts::now(), st.payload_limits()).map_err(|e| rejected(&status, e))?;
    st.submit_from_device(Item::Telemetry { device, records }).await?;
    Ok(StatusCode::OK)
}

/// `POST /api/v1/{token}/attributes` (client scope).
pub async fn post_attributes(
    State(st): St,
    State(status): State<Arc<Status>>,
    Device(device): Device,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let values = payload::parse_attributes(&body, st.payload_limits(), true).map_err(|e| rejected(&status, e))?;
    st.submit_from_device(Item::Attributes { device, scope: AttributeScope::Client, values }).await?;
    Ok(StatusCode::OK)
}

/// `POST /api/v1/{token}/claim` `{"secretKey","durationMs"}`: the device may be claimed
/// (`super::claim`).
pub async fn post_claim(
    State(st): St,
    State(status): State<Arc<Status>>,
    device: Device,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let device = metered(&st, device)?;
    gridlinks_platform::claims::open_from_device(&st, device, &body).map_err(|e| rejected(&status, e))?;
    Ok(StatusCode::OK)
}

/// `GET /api/v1/{token}/attributes?clientKeys=&sharedKeys=` → `{"client":{…},"shared":{…}}`;
/// with neither parameter, all client and shared attributes. A parameter given several
/// times is one comma-separated list (as Spring joins it: ThingsBoard's HTTP client sends
/// `sharedKeys=a&sharedKeys=b`), and `client_keys`/`shared_keys` (its `request_attributes`
/// spelling) are read too. Other parameters are refused.
pub async fn get_attributes(State(st): St, device: Device, RawQuery(q): RawQuery) -> ApiResult<Json<J>> {
    let device = metered(&st, device)?;
    let (mut client, mut shared) = (None::<String>, None::<String>);
    for (k, v) in form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes()) {
        let list = match k.as_ref() {
            "clientKeys" | "client_keys" => &mut client,
            "sharedKeys" | "shared_keys" => &mut shared,
            other => return Err(ApiError::bad_request(format!("Invalid query parameters: unknown field `{other}`"))),
        };
        match list {
            Some(l) => {
                l.push(',');
                l.push_str(&v);
            }
            None => *list = Some(v.into_owned()),
        }
    }
    let req = AttributeRequest::from_key_lists(client.as_deref(), shared.as_deref());
    Ok(Json(attributes::read_for_device(&st.store, device, req).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollParams {
    /// Milliseconds; 0 or absent: `http.long_poll_timeout`.
    timeout: Option<i64>,
}

/// How long a poll with `timeout` waits: 0 or none is the default, more than the bound is
/// the bound, negative is refused.
fn poll_timeout(cfg: &gridlinks_platform::config::HttpConfig, timeout: Option<i64>) -> ApiResult<Duration> {
    match timeout.unwrap_or(0) {
        t if t < 0 => Err(ApiError::bad_request("timeout must not be negative")),
        0 => Ok(cfg.long_poll_timeout.duration()),
        t => Ok(Duration::from_millis(t.unsigned_abs()).min(cfg.max_long_poll_timeout.duration())),
    }
}

async fn long_poll(p: &Platform, polls: &LongPolls, device: Device, kind: Kind, timeout: Option<i64>) -> Response {
    let device = match metered(&p.core, device) {
        Ok(d) => d,
        Err(e) => return e.into_response(),
    };
    let timeout = match poll_timeout(&p.core.cfg.http, timeout) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    match polls.poll(p, device, kind, timeout).await {
        Ok(body) => Json(body).into_response(),
        // ThingsBoard answers a poll that got nothing with an empty 408.
        Err(PollError::Timeout) => StatusCode::REQUEST_TIMEOUT.into_response(),
        Err(PollError::Revoked) => (StatusCode::FORBIDDEN, "Device was deleted!").into_response(),
        Err(PollError::DeviceBusy) => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TooManyRequests,
            format!(
                "Too many long polls of this device at once (http.max_long_polls_per_device = {})",
                p.core.cfg.http.max_long_polls_per_device
            ),
        )
        .into_response(),
        Err(PollError::NodeBusy) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::General,
            format!("Too many long polls on this server (http.max_long_polls = {})", p.core.cfg.http.max_long_polls),
        )
        .into_response(),
        Err(PollError::ShuttingDown) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::General, "The server is shutting down")
                .into_response()
        }
    }
}

/// `GET /api/v1/{token}/rpc?timeout=ms`: the next server-side RPC request for the device,
/// `{"id":7,"method":"m","params":{…}}`, or an empty 408 when none came in time.
pub async fn poll_rpc(
    State(p): State<Arc<Platform>>,
    State(polls): State<Arc<LongPolls>>,
    device: Device,
    Q(q): Q<PollParams>,
) -> Response {
    long_poll(&p, &polls, device, Kind::Rpc, q.timeout).await
}

/// `GET /api/v1/{token}/attributes/updates?timeout=ms`: the next shared-attribute change,
/// `{"k":v}` or `{"deleted":["k"]}`, or an empty 408.
pub async fn poll_attributes(
    State(p): State<Arc<Platform>>,
    State(polls): State<Arc<LongPolls>>,
    device: Device,
    Q(q): Q<PollParams>,
) -> Response {
    long_poll(&p, &polls, device, Kind::Attributes, q.timeout).await
}

/// `POST /api/v1/{token}/rpc/{requestId}`: the device's answer to server-side RPC
/// `requestId` (any JSON, given to the caller as is). 200 also when nobody waits for it
/// any more, as ThingsBoard answers.
pub async fn rpc_reply(
    State(p): State<Arc<Platform>>,
    State(status): State<Arc<Status>>,
    device: Device,
    Path(params): Path<HashMap<String, String>>,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let device = metered(&p.core, device)?;
    let id = params.get("request_id").map_or("", String::as_str);
    let id: u32 = id.parse().map_err(|_| ApiError::bad_request("requestId must be the id of an RPC request"))?;
    if serde_json::from_slice::<J>(&body).is_err() {
        return Err(rejected(&status, PayloadError::Json("the answer must be JSON".into())));
    }
    p.devices.rpc.complete(device, id, body);
    Ok(StatusCode::OK)
}

/// `POST /api/v1/{token}/rpc` `{"method","params"}`: client-side RPC, answered at once as
/// over MQTT (`getSessionLimits` with this transport's limits; anything else is "not
/// supported").
pub async fn client_rpc(
    State(st): St,
    State(status): State<Arc<Status>>,
    device: Device,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let device = metered(&st, device)?;
    match serde_json::from_slice::<J>(&body) {
        Ok(J::Object(m)) if m.get("method").is_some_and(J::is_string) => {}
        Ok(_) => return Err(rejected(&status, PayloadError::Shape("expected {\"method\":\"…\",\"params\":…}".into()))),
        Err(e) => return Err(rejected(&status, PayloadError::Json(e.to_string()))),
    }
    // An HTTP request carries one message: one in flight.
    Ok(Json(gridlinks_platform::device_api::client_rpc(&st, device, &body, st.cfg.http.max_body_bytes, 1)))
}

/// `POST /api/v1/provision`: device provisioning (`gridlinks_platform::provision`); always 200 with
/// the provisioning status in the body, as ThingsBoard answers.
pub async fn provision(
    State(p): State<Arc<gridlinks_platform::Platform>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    Body(body): Body,
) -> Json<J> {
    Json(gridlinks_platform::provision::provision(&p, peer.ip(), &body).await)
}
