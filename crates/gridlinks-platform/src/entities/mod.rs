//! The entity services: plain Rust APIs over devices, device profiles, customers,
//! dashboards and gateway relations, each checking its caller (`Caller::may_use`, tenant
//! boundaries) before it reads or changes anything. The REST API serves them; a later
//! rule, alarm or OTA layer calls the same functions with the same checks. An entity of
//! another tenant is answered as one that does not exist unless the caller may know that
//! tenant ([`hidden`]).

pub mod api_keys;
pub mod customers;
pub mod dashboards;
pub mod devices;
pub mod profiles;
pub mod users;

use gridlinks_storage::StoreError;
use uuid::Uuid;

use crate::auth::Caller;

/// Why an entity service refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No such entity (or one the caller may not learn of).
    #[error("{0}")]
    NotFound(String),
    /// The caller may not do this (it may know the entity exists).
    #[error("You don't have permission to perform this operation!")]
    Forbidden,
    /// The request itself is wrong.
    #[error("{0}")]
    Invalid(String),
    /// Storage refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The result of an entity service.
pub type ServiceResult<T> = Result<T, ServiceError>;

/// The refusal of an entity of `tenant` the caller may not use: "not found" when the
/// caller may not even learn of other tenants (`auth.hide_other_tenants`), so a tenant
/// administrator learns nothing of other tenants' ids; "forbidden" when it is of the
/// caller's own tenant (a customer user on another customer's entity, as in ThingsBoard) or
/// the caller is the system administrator, who may know every tenant.
pub fn hidden(me: &Caller, tenant: Uuid, missing: impl FnOnce() -> ServiceError) -> ServiceError {
    if me.knows_tenant(tenant) {
        ServiceError::Forbidden
    } else {
        missing()
    }
}

/// Runs a storage read off the async threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    // The blocking pool is gone only while the runtime shuts down.
    tokio::task::spawn_blocking(f).await.map_err(|_| StoreError::Closed)?
}
