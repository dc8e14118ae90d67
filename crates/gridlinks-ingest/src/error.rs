//! Why data was not taken. Each transport maps these to its own answer in one place: an
//! MQTT reason code (`mqtt::ingest_reason`), an HTTP status (`ApiError: From<IngestError>`);
//! a CoAP response code next.

use gridlinks_storage::StoreError;

/// Why a submit (or a credential) was refused. Cheap to clone: one error can answer every
/// item of a batch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    /// The payload is malformed or over the configured limits (decided by the transport's
    /// decoder, reported through here so the mapping stays in one place).
    #[error("{0}")]
    BadPayload(String),
    /// No device has this credential.
    #[error("invalid or unknown device credential")]
    BadCredential,
    /// The device was deleted after it authenticated: its credential no longer works.
    #[error("device deleted")]
    DeviceGone,
    /// A gateway topic or API from a device that is not a gateway.
    #[error("only gateways (additionalInfo.gateway = true) may use the gateway API")]
    NotGateway,
    /// A gateway named a device it does not own and may not adopt.
    #[error("device '{0}' belongs to another gateway, is a gateway, or may not be adopted by this gateway")]
    ForeignDevice(String),
    /// Bounds reached (distinct keys, devices per gateway).
    #[error("{0}")]
    Limit(String),
    /// A field is not acceptable (device names, tokens; clashes with other devices).
    #[error("{0}")]
    Rejected(String),
    /// A rate limit of the device's tenant profile is spent (the message names it): retry
    /// later. Nothing of the message was taken.
    #[error("{0}")]
    RateLimited(String),
    /// The commit log is full: retry later (backpressure).
    #[error("storage overloaded: retry later")]
    Overloaded,
    /// The data directory is (nearly) full: nothing is stored until space is freed.
    #[error("disk full: {0}")]
    DiskFull(String),
    /// Storage is reopening after a failure, or shutting down: retry shortly.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The commit failed; the data is not durable.
    #[error("storage failure: {0}")]
    Failed(String),
}

impl From<StoreError> for IngestError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::DeviceNotFound => Self::DeviceGone,
            StoreError::NotGateway => Self::NotGateway,
            StoreError::ForeignDevice(name) => Self::ForeignDevice(name),
            StoreError::Limit(m) | StoreError::EntitiesLimit(m) => Self::Limit(m),
            e @ (StoreError::NameTaken(_)
            | StoreError::TokenTaken
            | StoreError::IdentityTaken(_)
            | StoreError::CredentialClash(_)
            | StoreError::ProfileNotFound(_)
            | StoreError::DocNotFound(..)
            | StoreError::TitleTaken(_)
            | StoreError::ProfileNameTaken(_)
            | StoreError::ProfileInUse
            | StoreError::ProfileIsDefault
            | StoreError::Invalid(_)) => Self::Rejected(e.to_string()),
            StoreError::Overloaded => Self::Overloaded,
            StoreError::DiskFull(m) => Self::DiskFull(m),
            e @ (StoreError::Unavailable | StoreError::Closed | StoreError::Queue(_) | StoreError::Database(_)) => {
                Self::Unavailable(e.to_string())
            }
            e @ (StoreError::Db(_)
            | StoreError::Corrupt(_)
            | StoreError::Format { .. }
            | StoreError::CommitFailed(_)) => Self::Failed(e.to_string()),
        }
    }
}
