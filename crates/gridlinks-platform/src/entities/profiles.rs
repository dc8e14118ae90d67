//! Device profiles: which a caller may see.

use gridlinks_storage::ProfileRecord;
use gridlinks_types::ProfileId;

use super::{blocking, hidden, ServiceError, ServiceResult};
use crate::auth::Caller;
use crate::core::Core;

/// A profile of the caller's tenant.
pub async fn get(core: &Core, me: &Caller, id: ProfileId) -> ServiceResult<ProfileRecord> {
    let store = core.store.clone();
    let missing = || ServiceError::NotFound(format!("Device profile with id [{id}] is not found"));
    let p = blocking(move || store.profile(id)).await?.ok_or_else(missing)?;
    let tenant = core.tenant_of(p.tenant);
    if tenant != me.tenant {
        return Err(hidden(me, tenant, missing));
    }
    Ok(p)
}

/// The caller's tenant's profiles.
pub async fn of_tenant(core: &Core, me: &Caller) -> ServiceResult<Vec<ProfileRecord>> {
    let store = core.store.clone();
    let tenant = core.stored_tenant(me.tenant);
    Ok(blocking(move || store.profiles()).await?.iter().filter(|p| p.tenant == tenant).cloned().collect())
}
