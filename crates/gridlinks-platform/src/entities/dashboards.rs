//! Dashboards (stored as documents): which a caller may see; saving, deleting and
//! assigning them to customers (a tenant administrator's).

use gridlinks_storage::{DocKind, DocRecord, WriteOp};
use serde_json::Value as J;
use uuid::Uuid;

use super::{blocking, hidden, may_create, written_doc, ServiceError, ServiceResult};
use crate::auth::Caller;
use crate::core::Core;

/// The customers dashboard `d` is assigned to.
pub fn assigned_customers(d: &DocRecord) -> Vec<Uuid> {
    let listed = d.doc.get("assignedCustomerIds").and_then(J::as_array);
    listed.into_iter().flatten().filter_map(|c| c.as_str()?.parse().ok()).collect()
}

/// Whether dashboard `d` is assigned to `customer`.
pub fn assigned(d: &DocRecord, customer: Uuid) -> bool {
    let id = J::String(customer.to_string());
    d.doc.get("assignedCustomerIds").and_then(J::as_array).is_some_and(|a| a.contains(&id))
}

/// A dashboard the caller may see: its tenant's, and for a customer user only those
/// assigned to its customer.
pub async fn get(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<DocRecord> {
    let store = core.store.clone();
    let missing = || ServiceError::NotFound(format!("Dashboard with id [{id}] is not found"));
    let d = blocking(move || store.doc(DocKind::Dashboard, id)).await?.ok_or_else(missing)?;
    let tenant = core.doc_tenant(&d);
    if !me.may_use(tenant, me.customer) || me.customer.is_some_and(|c| !assigned(&d, c)) {
        return Err(hidden(me, tenant, missing));
    }
    Ok(d)
}

/// Creates (`id` none) or updates a dashboard of the caller's tenant.
pub async fn save(core: &Core, me: &Caller, id: Option<Uuid>, title: String, mut doc: J) -> ServiceResult<DocRecord> {
    if !doc.is_object() {
        return Err(ServiceError::Invalid("Invalid request body: a dashboard is a JSON object".into()));
    }
    if title.trim().is_empty() {
        return Err(ServiceError::Invalid("Dashboard title should be specified!".into()));
    }
    if let Some(id) = id {
        get(core, me, id).await?;
    }
    if id.is_none() {
        may_create(core, me.tenant, DocKind::Dashboard).await?;
    }
    core.set_doc_tenant(&mut doc, me.tenant);
    written_doc(core.writer.submit(WriteOp::SaveDoc { kind: DocKind::Dashboard, id, title, doc }).await?)
}

/// Deletes a dashboard of the caller's tenant.
pub async fn delete(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<()> {
    let d = get(core, me, id).await?;
    core.writer.submit(WriteOp::DeleteDoc(DocKind::Dashboard, d.id)).await?;
    super::relations::forget(core, super::relations::EntityKind::Dashboard, d.id).await
}

/// Assigns (`assign`) or unassigns a dashboard of the caller's tenant to one of its
/// customers; the dashboard as it is now.
pub async fn assign(
    core: &Core,
    me: &Caller,
    customer: Uuid,
    dashboard: Uuid,
    assign: bool,
) -> ServiceResult<DocRecord> {
    let customer = super::customers::get(core, me, customer).await?.id;
    let dashboard = get(core, me, dashboard).await?.id;
    written_doc(core.writer.submit(WriteOp::AssignDashboard { dashboard, customer, assign }).await?)
}
