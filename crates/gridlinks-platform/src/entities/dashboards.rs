//! Dashboards (stored as documents): which a caller may see.

use gridlinks_storage::{DocKind, DocRecord};
use serde_json::Value as J;
use uuid::Uuid;

use super::{blocking, hidden, ServiceError, ServiceResult};
use crate::auth::Caller;
use crate::core::Core;

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
