//! Customers (stored as documents): reading one the caller may use, saving and deleting
//! them (a tenant administrator's).

use std::sync::Arc;

use gridlinks_storage::{DocKind, DocRecord, WriteOp};
use serde_json::Value as J;
use uuid::Uuid;

use super::{blocking, hidden, may_create, written_doc, ServiceError, ServiceResult};
use crate::auth::{Auth, Caller};
use crate::core::Core;

/// A customer the caller may read: a tenant administrator its tenant's, a customer user
/// only its own.
pub async fn get(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<DocRecord> {
    let store = core.store.clone();
    let missing = || ServiceError::NotFound(format!("Customer with id [{id}] is not found"));
    let c = blocking(move || store.doc(DocKind::Customer, id)).await?.ok_or_else(missing)?;
    let tenant = core.doc_tenant(&c);
    if !me.may_use(tenant, Some(id)) {
        return Err(hidden(me, tenant, missing));
    }
    Ok(c)
}

/// Creates (`id` none) or updates a customer of the caller's tenant; titles are unique in
/// a tenant. The caller has the authority of a tenant administrator.
pub async fn save(core: &Core, me: &Caller, id: Option<Uuid>, title: String, mut doc: J) -> ServiceResult<DocRecord> {
    if title.trim().is_empty() {
        return Err(ServiceError::Invalid("Customer title should be specified!".into()));
    }
    if let Some(id) = id {
        get(core, me, id).await?;
    }
    if id.is_none() {
        may_create(core, me.tenant, DocKind::Customer).await?;
    }
    core.set_doc_tenant(&mut doc, me.tenant);
    written_doc(core.writer.submit(WriteOp::SaveDoc { kind: DocKind::Customer, id, title, doc }).await?)
}

/// Deletes a customer: its devices and dashboards are assigned to it no more, and its
/// users are deleted (their tokens and keys stop working at once).
pub async fn delete(core: &Core, auth: &Arc<Auth>, me: &Caller, id: Uuid) -> ServiceResult<()> {
    let c = get(core, me, id).await?;
    core.writer.submit(WriteOp::DeleteCustomer(c.id)).await?;
    let (store, auth) = (core.store.clone(), auth.clone());
    blocking(move || auth.users.reload(&store)).await?;
    super::relations::forget(core, super::relations::EntityKind::Customer, c.id).await
}
