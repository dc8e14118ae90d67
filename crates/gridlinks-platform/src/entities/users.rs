//! Users: which a caller manages (`Caller::may_manage`), and deleting one.

use std::sync::Arc;

use gridlinks_storage::{DocKind, WriteOp};
use uuid::Uuid;

use super::{hidden, ServiceError, ServiceResult};
use crate::auth::users::Entry;
use crate::auth::{Auth, Caller};
use crate::core::Core;

fn missing(id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("User with id [{id}] is not found"))
}

/// A user the caller manages (forbidden otherwise; not found when there is none or it is
/// of a tenant the caller may not learn of).
pub fn managed(auth: &Auth, me: &Caller, id: Uuid) -> ServiceResult<Arc<Entry>> {
    let e = auth.users.by_id(id).ok_or_else(|| missing(id))?;
    if !me.may_manage(&e.caller) {
        return Err(hidden(me, e.caller.tenant, || missing(id)));
    }
    Ok(e)
}

/// The user whose API keys the caller would manage: itself, or a user it manages.
pub fn keys_owner(auth: &Auth, me: &Caller, user: Uuid) -> ServiceResult<Caller> {
    let e = auth.users.by_id(user).ok_or_else(|| missing(user))?;
    if e.caller.user != me.user && !me.may_manage(&e.caller) {
        return Err(hidden(me, e.caller.tenant, || missing(user)));
    }
    Ok(e.caller.clone())
}

/// Deletes a user the caller manages (not itself, nor a user of the configuration): its
/// tokens and API keys stop working at once.
pub async fn delete(core: &Core, auth: &Auth, me: &Caller, id: Uuid) -> ServiceResult<()> {
    if id == me.user || managed(auth, me, id)?.configured {
        return Err(ServiceError::Invalid(
            "The administrator of the configuration, or yourself, cannot be deleted".into(),
        ));
    }
    core.writer.submit(WriteOp::DeleteDoc(DocKind::User, id)).await?;
    auth.users.remove(id);
    auth.api_keys.remove_user(id);
    Ok(())
}
