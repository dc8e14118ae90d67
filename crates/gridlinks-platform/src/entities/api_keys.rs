//! API keys: which a caller may manage (its own, and those of the users it manages), and
//! storing one so that it is in force at once.

use gridlinks_storage::{DocKind, DocRecord, WriteOp};
use serde_json::Value as J;
use uuid::Uuid;

use super::{blocking, hidden, users, written_doc, ServiceError, ServiceResult};
use crate::auth::{Auth, Caller};
use crate::core::Core;

/// Whose key `d` is.
pub fn owner(d: &DocRecord) -> Option<Uuid> {
    d.doc.get("userId").and_then(J::as_str).and_then(|u| u.parse().ok())
}

/// A key the caller may manage (another tenant's user's key is not confirmed, nor one
/// whose user is gone).
pub async fn get(core: &Core, auth: &Auth, me: &Caller, id: Uuid) -> ServiceResult<DocRecord> {
    let store = core.store.clone();
    let missing = || ServiceError::NotFound(format!("API key with id [{id}] is not found"));
    let d = blocking(move || store.doc(DocKind::ApiKey, id)).await?.ok_or_else(missing)?;
    match owner(&d).and_then(|u| auth.users.by_id(u)) {
        Some(e) if users::keys_owner(auth, me, e.caller.user).is_ok() => Ok(d),
        Some(e) => Err(hidden(me, e.caller.tenant, missing)),
        None => Err(missing()),
    }
}

/// Stores a key (new with `id` none) and takes it into the keys in force.
pub async fn store(core: &Core, auth: &Auth, id: Option<Uuid>, title: String, doc: J) -> ServiceResult<DocRecord> {
    let d = written_doc(core.writer.submit(WriteOp::SaveDoc { kind: DocKind::ApiKey, id, title, doc }).await?)?;
    auth.api_keys.put(&d);
    Ok(d)
}
