//! Error answers of the REST and device APIs over HTTP: [`ApiError`] (status, ThingsBoard
//! `errorCode`, message), storage errors mapped to it, and its response with ThingsBoard's
//! body `{"status","message","errorCode","timestamp"}` (shape and codes:
//! `gridlinks_thingsboard::error`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gridlinks_ingest::IngestError;
use gridlinks_platform::entities::ServiceError;
use gridlinks_storage::StoreError;
use gridlinks_thingsboard::error::{self as tb_error, ErrorCode};
use gridlinks_types::Ts;

/// An error answer of the REST or device API.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// ThingsBoard error code.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: String,
    /// Seconds for a `Retry-After` header (429 and 503 get 1 when unset).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with an explicit status.
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), retry_after: None }
    }

    /// With a `Retry-After` of `secs`.
    pub fn retry_after(self, secs: u64) -> Self {
        Self { retry_after: Some(secs), ..self }
    }

    /// 429 for a request naming a unique credential while the caller's tenant must `wait`
    /// after too many "taken" answers (`gridlinks_platform::guards`).
    pub fn credential_conflicts(wait: std::time::Duration) -> Self {
        let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TooManyRequests,
            format!(
                "Too many requests naming credentials that are taken: retry in {secs} s (credentials are unique \
                 across tenants, so such answers are throttled)"
            ),
        )
        .retry_after(secs)
    }

    /// 429 with errorCode 33: a limit of the caller's tenant profile is spent (`message`
    /// names it).
    pub fn too_many(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, ErrorCode::TooManyRequests, message)
    }

    /// 400 with errorCode 31.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequestParams, message)
    }

    /// 404 with errorCode 32.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::ItemNotFound, message)
    }

    /// 401 with errorCode 10.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ErrorCode::Authentication, message)
    }

    /// 403 with errorCode 20: the caller may not do this (a customer user on a tenant
    /// administrator's path, or on a device not assigned to its customer).
    pub fn forbidden() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            ErrorCode::PermissionDenied,
            "You don't have permission to perform this operation!",
        )
    }

    /// The answer to an entity of `tenant` that `me` may not use: when it is another
    /// tenant's, `missing` — the very answer an id that does not exist gets, so that a tenant
    /// administrator (or customer user) learns nothing of other tenants' ids; 403 when it is
    /// of the caller's own tenant (a customer user on another customer's entity, as in
    /// ThingsBoard) or the caller is the system administrator, who may know every tenant.
    pub fn hidden(me: &gridlinks_platform::auth::Caller, tenant: uuid::Uuid, missing: impl FnOnce() -> Self) -> Self {
        if !me.knows_tenant(tenant) {
            missing()
        } else {
            Self::forbidden()
        }
    }

    /// 500 with errorCode 2.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::General, message)
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::NotFound(m) => Self::not_found(m),
            ServiceError::Forbidden => Self::forbidden(),
            ServiceError::Invalid(m) => Self::bad_request(m),
            ServiceError::Throttled(wait) => Self::credential_conflicts(wait),
            ServiceError::Internal(m) => Self::internal(m),
            ServiceError::Auth(e) => super::api::auth_error(e),
            ServiceError::Store(e) => e.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NameTaken(_) => Self::bad_request("Device with such name already exists!"),
            StoreError::TokenTaken => Self::bad_request("Device credentials are already assigned to another device!"),
            StoreError::DeviceNotFound => Self::not_found("Device with requested id wasn't found!"),
            e @ (StoreError::ProfileNotFound(_) | StoreError::DocNotFound(..)) => Self::not_found(e.to_string()),
            e @ (StoreError::ProfileNameTaken(_)
            | StoreError::ProfileInUse
            | StoreError::ProfileIsDefault
            | StoreError::TitleTaken(_)) => Self::bad_request(e.to_string()),
            e @ (StoreError::ForeignDevice(_)
            | StoreError::NotGateway
            | StoreError::CredentialClash(_)
            | StoreError::IdentityTaken(_)) => Self::bad_request(e.to_string()),
            StoreError::Limit(m) | StoreError::Invalid(m) => Self::bad_request(m),
            // As ThingsBoard answers a tenant profile's entity limit.
            StoreError::EntitiesLimit(m) => Self::new(StatusCode::FORBIDDEN, ErrorCode::EntitiesLimitExceeded, m),
            StoreError::Overloaded => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::TooManyRequests,
                "Server is overloaded: the storage queue is full. Retry later.",
            ),
            StoreError::DiskFull(m) => Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                ErrorCode::General,
                format!("Disk full: {m}; the data was not stored."),
            ),
            StoreError::Unavailable => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::General,
                "Storage is recovering from a failure; the data was not stored. Retry shortly.",
            ),
            StoreError::Closed => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::General,
                "Server is shutting down or storage has failed; the data was not stored.",
            ),
            other => {
                gridlinks_platform::logging::error_limited!(error = %other, "storage error");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::General,
                    format!("Storage failure; the data was not stored: {other}"),
                )
            }
        }
    }
}

/// How the HTTP APIs (device API, REST telemetry posts, bulk import) answer an ingest
/// refusal: the one place where [`IngestError`] becomes an HTTP status.
impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        match e {
            IngestError::BadPayload(m) | IngestError::Limit(m) | IngestError::Rejected(m) => Self::bad_request(m),
            // Unknown, or deleted after it authenticated: the token no longer works.
            IngestError::BadCredential | IngestError::DeviceGone => {
                Self::unauthorized("Invalid or unknown device access token")
            }
            e @ (IngestError::NotGateway | IngestError::ForeignDevice(_)) => Self::bad_request(e.to_string()),
            IngestError::RateLimited(m) => Self::too_many(m),
            IngestError::Overloaded => Self::from(StoreError::Overloaded),
            IngestError::DiskFull(m) => Self::from(StoreError::DiskFull(m)),
            IngestError::Unavailable(m) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::General,
                format!("Storage is unavailable ({m}); the data was not stored. Retry shortly."),
            ),
            IngestError::Failed(m) => {
                gridlinks_platform::logging::error_limited!(error = %m, "storage error");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::General,
                    format!("Storage failure; the data was not stored: {m}"),
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = tb_error::body(self.status.as_u16(), self.code, &self.message, Ts::now());
        let mut resp = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE || self.status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body is never read, so this connection cannot be reused.
            resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        } else if self.status == StatusCode::SERVICE_UNAVAILABLE || self.status == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// Result type of handlers.
pub type ApiResult<T> = Result<T, ApiError>;
