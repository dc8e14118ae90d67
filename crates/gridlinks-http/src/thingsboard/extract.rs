//! Request extractors that turn axum's plain-text rejections into ThingsBoard error
//! bodies, and who the caller is ([`User`], [`Admin`]).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::state::Http;
use gridlinks_platform::auth::{AuthError, Authority, Caller};
use gridlinks_thingsboard::error::ErrorCode;

/// Query parameters; unknown parameters are rejected by the target type.
pub struct Q<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Q<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Q(v))
            .map_err(|e: QueryRejection| ApiError::bad_request(format!("Invalid query parameters: {}", e.body_text())))
    }
}

/// The raw request body, bounded by the route's body limit (413 beyond it) and by
/// `http.body_read_timeout` (408: a client that trickles its body holds nothing for long).
pub struct Body(pub Bytes);

impl FromRequest<Http> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Http) -> Result<Self, ApiError> {
        let http = &state.core.cfg.http;
        // A body declared larger than the limit is refused before it is waited for.
        let path = req.uri().path();
        let limit = if path == crate::state::BULK_IMPORT_PATH {
            http.max_import_bytes
        } else if req.method() == axum::http::Method::POST && path.starts_with(super::ota::UPLOAD_PREFIX) {
            state.core.cfg.ota.max_package_bytes + super::ota::FRAMING_BYTES
        } else {
            http.max_body_bytes
        };
        let declared =
            req.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        let timeout = http.body_read_timeout.duration();
        let read = Bytes::from_request(req, state);
        let Ok(read) = tokio::time::timeout(timeout, read).await else {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::BadRequestParams,
                "Request body was not received within http.body_read_timeout",
            ));
        };
        read.map(Body).map_err(|e: BytesRejection| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large()
            } else {
                ApiError::bad_request(format!("Cannot read request body: {}", e.body_text()))
            }
        })
    }
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::BadRequestParams,
        "Request body is larger than the configured limit (http.max_body_bytes; http.max_import_bytes for bulk import, ota.max_package_bytes for OTA packages)",
    )
}

/// The token of an `X-Authorization: Bearer …` (or `Authorization`) header.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get("x-authorization")
        .or_else(|| headers.get(axum::http::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The key of an `X-Authorization: ApiKey …` header.
pub fn api_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get("x-authorization").and_then(|v| v.to_str().ok()).and_then(|h| h.strip_prefix("ApiKey ")).map(str::trim)
}

/// A request of a logged-in user: a valid access token (`X-Authorization: Bearer …`) of a
/// login in force, or a live API key (`X-Authorization: ApiKey …`), which acts as its user.
pub struct User(pub Caller);

impl FromRequestParts<Http> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Http) -> Result<Self, ApiError> {
        let caller = if let Some(key) = api_key(&parts.headers) {
            match state.auth.api_key(key) {
                Some(c) => c,
                None => return Err(ApiError::unauthorized("Invalid, disabled or expired API key")),
            }
        } else {
            let token = bearer(&parts.headers).ok_or_else(|| ApiError::unauthorized("Authentication failed"))?;
            match state.auth.access(token).await {
                Ok(c) => c,
                Err(AuthError::Expired) => {
                    return Err(ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::JwtExpired, "Token has expired"))
                }
                Err(_) => return Err(ApiError::unauthorized("Invalid JWT token")),
            }
        };
        // One call counts once against the tenant profile's REST limits, however many
        // extractors read its caller.
        if parts.extensions.insert(Metered).is_none() {
            state.core.limits.rest(&caller).map_err(ApiError::too_many)?;
        }
        Ok(User(caller))
    }
}

/// Marks a request counted against the REST rate limits.
#[derive(Clone, Copy)]
struct Metered;

/// A request of a tenant administrator; any other user (the system administrator too: it
/// sees no tenant's data) gets 403.
pub struct Admin(pub Caller);

impl FromRequestParts<Http> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Http) -> Result<Self, ApiError> {
        let User(c) = User::from_request_parts(parts, state).await?;
        match c.authority {
            Authority::TenantAdmin => Ok(Admin(c)),
            Authority::CustomerUser | Authority::SysAdmin => Err(ApiError::forbidden()),
        }
    }
}

/// A request of the system administrator; any other user gets 403.
pub struct SysAdmin(pub Caller);

impl FromRequestParts<Http> for SysAdmin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Http) -> Result<Self, ApiError> {
        let User(c) = User::from_request_parts(parts, state).await?;
        match c.authority {
            Authority::SysAdmin => Ok(SysAdmin(c)),
            Authority::TenantAdmin | Authority::CustomerUser => Err(ApiError::forbidden()),
        }
    }
}

/// A boolean query parameter parsed as Spring does: `true/false/on/off/yes/no/1/0`, any case
/// (ThingsBoard's Python client sends `True`).
pub fn lenient_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    let s: Option<String> = serde::Deserialize::deserialize(d)?;
    match s.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("") => Ok(None),
        Some("true" | "on" | "yes" | "1") => Ok(Some(true)),
        Some("false" | "off" | "no" | "0") => Ok(Some(false)),
        Some(other) => Err(serde::de::Error::custom(format!("'{other}' is not a boolean (true or false)"))),
    }
}
