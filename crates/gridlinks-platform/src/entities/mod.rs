//! The entity services: plain Rust APIs over devices, device profiles, assets, asset
//! profiles, customers, dashboards, OTA packages and relations, each checking its caller (`Caller::may_use`, tenant
//! boundaries) before it reads or changes anything. The REST API serves them; a later
//! rule, alarm or OTA layer calls the same functions with the same checks. An entity of
//! another tenant is answered as one that does not exist unless the caller may know that
//! tenant ([`hidden`]).

pub mod api_keys;
pub mod assets;
pub mod customers;
pub mod dashboards;
pub mod devices;
pub mod ota;
pub mod profiles;
pub mod relations;
pub mod users;

use gridlinks_storage::{DocKind, DocRecord, StoreError, WriteOutcome};
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
    /// The caller's tenant must wait this long after too many answers that a credential
    /// unique across tenants is taken (`crate::guards`).
    #[error("too many requests naming credentials that are taken: retry in {0:?}")]
    Throttled(std::time::Duration),
    /// Something the service depends on failed (the password threads).
    #[error("{0}")]
    Internal(String),
    /// Authentication refused or could not answer (a wrong current password's throttle,
    /// busy password threads).
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    /// Storage refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether `tenant` may create one more `kind` (its tenant profile's `maxAssets`,
/// `maxCustomers`, `maxUsers`, `maxDashboards`): a check before the save, so two saves at
/// once may both pass it, as in ThingsBoard.
pub(crate) async fn may_create(core: &crate::Core, tenant: uuid::Uuid, kind: DocKind) -> ServiceResult<()> {
    let limits = core.limits.clone();
    Ok(blocking(move || limits.may_create(tenant, kind)).await?)
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

/// The document a write gave back (a save of a customer, dashboard, user, API key …).
pub(crate) fn written_doc(outcome: WriteOutcome) -> ServiceResult<DocRecord> {
    match outcome {
        WriteOutcome::Doc(d) => Ok(d),
        _ => Err(StoreError::Corrupt("unexpected write outcome").into()),
    }
}

/// Runs a storage read off the async threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    // The blocking pool is gone only while the runtime shuts down.
    tokio::task::spawn_blocking(f).await.map_err(|_| StoreError::Closed)?
}

#[cfg(test)]
mod tests {
    use gridlinks_storage::{SaveDevice, WriteOp, WriteOutcome};
    use serde_json::json;
    use uuid::Uuid;

    use super::{customers, devices, ServiceError};
    use crate::auth::{Authority, Caller};
    use crate::config::Config;
    use crate::Platform;

    fn not_found<T>(r: Result<T, ServiceError>) -> bool {
        matches!(r, Err(ServiceError::NotFound(_)))
    }

    fn caller(authority: Authority, tenant: Uuid, customer: Option<Uuid>) -> Caller {
        Caller { user: Uuid::new_v4(), email: "someone@example.com".into(), authority, tenant, customer }
    }

    /// The services decide the boundaries themselves, with no HTTP in front of them: a
    /// tenant's entities do not exist for another tenant's administrator, and a customer
    /// user is refused another customer's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_services_check_their_caller() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config { data_dir: dir.path().join("data"), ..Config::default() };
        cfg.admin.password = "admin-pw".into();
        cfg.admin.sysadmin_password = "sysadmin-pw".into();
        let (_stop, stop_rx) = tokio::sync::watch::channel(false);
        let (platform, running) = Platform::start(cfg, stop_rx).await.unwrap();
        let core = &platform.core;
        let mine = caller(Authority::TenantAdmin, core.tenant_id, None);
        let stranger = caller(Authority::TenantAdmin, Uuid::new_v4(), None);

        let a = customers::save(core, &mine, None, "A".into(), json!({})).await.unwrap();
        let b = customers::save(core, &mine, None, "B".into(), json!({})).await.unwrap();
        let save = SaveDevice {
            id: None,
            tenant: None,
            name: "meter".into(),
            device_type: String::new(),
            profile: None,
            label: None,
            token: None,
            additional_info: None,
        };
        let WriteOutcome::Device(d) = core.writer.submit(WriteOp::SaveDevice(save)).await.unwrap() else {
            panic!("a device")
        };
        let d = devices::assign_customer(core, &mine, d.id, Some(a.id)).await.unwrap();

        // Another tenant's administrator learns nothing, whatever it asks.
        assert!(not_found(customers::get(core, &stranger, a.id).await));
        assert!(not_found(devices::get(core, &stranger, d.id).await));
        assert!(not_found(devices::delete(&platform, &stranger, d.id).await));
        assert!(not_found(devices::assign_customer(core, &stranger, d.id, None).await));
        assert!(not_found(customers::save(core, &stranger, Some(a.id), "taken".into(), json!({})).await));

        // A customer user reads its customer's device, and is refused the other customer.
        let user_of_a = caller(Authority::CustomerUser, core.tenant_id, Some(a.id));
        let user_of_b = caller(Authority::CustomerUser, core.tenant_id, Some(b.id));
        assert_eq!(devices::get(core, &user_of_a, d.id).await.unwrap().id, d.id);
        assert!(matches!(devices::get(core, &user_of_b, d.id).await, Err(ServiceError::Forbidden)));
        assert!(matches!(customers::get(core, &user_of_b, a.id).await, Err(ServiceError::Forbidden)));

        // Nothing changed on the way, and the owner still may.
        assert_eq!(customers::get(core, &mine, a.id).await.unwrap().title, "A");
        devices::delete(&platform, &mine, d.id).await.unwrap();
        assert!(not_found(devices::get(core, &mine, d.id).await));

        running.finish(platform).await.unwrap();
    }
}
