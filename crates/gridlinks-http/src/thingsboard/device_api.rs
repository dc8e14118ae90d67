//! ThingsBoard's HTTP device API: `/api/v1/{token}/telemetry`, `/attributes` and `/claim`.
//! A 200 is sent only after the data is durably committed by the group commit.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_ingest::{IngestError, Item};
use gridlinks_types::{AttributeScope, DeviceId, Ts};
use serde::Deserialize;
use serde_json::Value as J;

use super::error::{ApiError, ApiResult};
use super::extract::{Body, Q};
use crate::state::Status;
use gridlinks_platform::attributes;
use gridlinks_platform::Core;
use gridlinks_thingsboard::attributes::AttributeRequest;
use gridlinks_thingsboard::payload::{self, PayloadError};

type St = State<Arc<Core>>;

fn authenticate(st: &Core, token: &str) -> ApiResult<DeviceId> {
    Ok(st.ingest.authenticate(token)?)
}

fn rejected(status: &Status, e: PayloadError) -> ApiError {
    status.payload_rejected.fetch_add(1, Ordering::Relaxed);
    IngestError::BadPayload(e.to_string()).into()
}

/// `POST /api/v1/{token}/telemetry`.
pub async fn post_telemetry(
    State(st): St,
    State(status): State<Arc<Status>>,
    Path(token): Path<String>,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let device = authenticate(&st, &token)?;
    let records = payload::parse_telemetry(&body, Ts::now(), st.payload_limits()).map_err(|e| rejected(&status, e))?;
    st.ingest.submit_one(Item::Telemetry { device, records }).await?;
    Ok(StatusCode::OK)
}

/// `POST /api/v1/{token}/attributes` (client scope).
pub async fn post_attributes(
    State(st): St,
    State(status): State<Arc<Status>>,
    Path(token): Path<String>,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let device = authenticate(&st, &token)?;
    let values = payload::parse_attributes(&body, st.payload_limits(), true).map_err(|e| rejected(&status, e))?;
    st.ingest.submit_one(Item::Attributes { device, scope: AttributeScope::Client, values }).await?;
    Ok(StatusCode::OK)
}

/// `POST /api/v1/{token}/claim` `{"secretKey","durationMs"}`: the device may be claimed
/// (`super::claim`).
pub async fn post_claim(
    State(st): St,
    State(status): State<Arc<Status>>,
    Path(token): Path<String>,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let device = authenticate(&st, &token)?;
    gridlinks_platform::claims::open_from_device(&st, device, &body).map_err(|e| rejected(&status, e))?;
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AttrParams {
    client_keys: Option<String>,
    shared_keys: Option<String>,
}

/// `GET /api/v1/{token}/attributes?clientKeys=&sharedKeys=` → `{"client":{…},"shared":{…}}`;
/// with neither parameter, all client and shared attributes.
pub async fn get_attributes(State(st): St, Path(token): Path<String>, Q(p): Q<AttrParams>) -> ApiResult<Json<J>> {
    let device = authenticate(&st, &token)?;
    let req = AttributeRequest::from_key_lists(p.client_keys.as_deref(), p.shared_keys.as_deref());
    Ok(Json(attributes::read_for_device(&st.store, device, req).await?))
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
