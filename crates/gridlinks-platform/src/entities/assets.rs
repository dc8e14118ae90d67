//! Assets and asset profiles (stored as documents): which a caller may see, saving and
//! deleting them, assigning assets to customers. An asset's type is its profile's name,
//! as in ThingsBoard: saving an asset of a new type creates that profile, and a tenant
//! always has one default profile (`default`). An asset holds attributes and time series
//! under its id as a device does; deleting it deletes them, and its relations.

use gridlinks_storage::{DocKind, DocRecord, StoreError, WriteOp};
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::{blocking, hidden, may_create, written_doc, ServiceError, ServiceResult};
use crate::auth::{Authority, Caller};
use crate::core::Core;

/// The name of the profile a tenant starts with.
pub const DEFAULT_PROFILE: &str = "default";

fn missing_asset(id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("Asset with id [{id}] is not found"))
}

fn missing_profile(id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("Asset profile with id [{id}] is not found"))
}

/// The customer an asset is assigned to.
pub fn customer(a: &DocRecord) -> Option<Uuid> {
    a.doc.get("customerId").and_then(J::as_str).and_then(|s| s.parse().ok())
}

/// The profile an asset is of.
pub fn profile_id(a: &DocRecord) -> Option<Uuid> {
    a.doc.get("assetProfileId").and_then(J::as_str).and_then(|s| s.parse().ok())
}

/// Whether an asset profile is its tenant's default.
pub fn is_default(p: &DocRecord) -> bool {
    p.doc.get("default").and_then(J::as_bool) == Some(true)
}

/// An asset the caller may see: a tenant administrator its tenant's, a customer user its
/// customer's.
pub async fn get(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<DocRecord> {
    let store = core.store.clone();
    let a = blocking(move || store.doc(DocKind::Asset, id)).await?.ok_or_else(|| missing_asset(id))?;
    let tenant = core.doc_tenant(&a);
    if !me.may_use(tenant, customer(&a)) {
        return Err(hidden(me, tenant, || missing_asset(id)));
    }
    Ok(a)
}

/// The assets the caller may see (all of a tenant administrator's tenant, a customer
/// user's customer's), by name.
pub async fn visible(core: &Core, me: &Caller) -> ServiceResult<Vec<DocRecord>> {
    let store = core.store.clone();
    let mut all = blocking(move || store.docs(DocKind::Asset)).await?;
    all.retain(|a| me.may_use(core.doc_tenant(a), customer(a)));
    Ok(all)
}

/// The caller's tenant's asset profiles, by name; the default one is created first when
/// there is none.
pub async fn profiles(core: &Core, me: &Caller) -> ServiceResult<Vec<DocRecord>> {
    if me.authority == Authority::SysAdmin {
        return Err(ServiceError::Forbidden);
    }
    let mut all = tenant_profiles(core, me.tenant).await?;
    if !all.iter().any(is_default) {
        let created = create_profile(core, me.tenant, DEFAULT_PROFILE, true).await?;
        all = tenant_profiles(core, me.tenant).await?;
        if !all.iter().any(|p| p.id == created.id) {
            all.push(created);
        }
    }
    Ok(all)
}

async fn tenant_profiles(core: &Core, tenant: Uuid) -> ServiceResult<Vec<DocRecord>> {
    let store = core.store.clone();
    let mut all = blocking(move || store.docs(DocKind::AssetProfile)).await?;
    all.retain(|p| core.doc_tenant(p) == tenant);
    Ok(all)
}

async fn create_profile(core: &Core, tenant: Uuid, name: &str, default: bool) -> ServiceResult<DocRecord> {
    let mut doc = json!({"default": default, "description": null, "image": null});
    core.set_doc_tenant(&mut doc, tenant);
    let op = WriteOp::SaveDoc { kind: DocKind::AssetProfile, id: None, title: name.to_owned(), doc };
    match core.writer.submit(op).await {
        Ok(o) => written_doc(o),
        // Another request created it first: that one.
        Err(StoreError::TitleTaken(_)) => tenant_profiles(core, tenant)
            .await?
            .into_iter()
            .find(|p| p.title == name)
            .ok_or_else(|| ServiceError::Internal(format!("asset profile '{name}' vanished"))),
        Err(e) => Err(e.into()),
    }
}

/// The caller's tenant's default asset profile.
pub async fn default_profile(core: &Core, me: &Caller) -> ServiceResult<DocRecord> {
    profiles(core, me)
        .await?
        .into_iter()
        .find(is_default)
        .ok_or_else(|| ServiceError::Internal("no default asset profile".into()))
}

/// An asset profile of the caller's tenant.
pub async fn get_profile(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<DocRecord> {
    let store = core.store.clone();
    let p = blocking(move || store.doc(DocKind::AssetProfile, id)).await?.ok_or_else(|| missing_profile(id))?;
    let tenant = core.doc_tenant(&p);
    if tenant != me.tenant || !me.knows_tenant(tenant) {
        return Err(hidden(me, tenant, || missing_profile(id)));
    }
    Ok(p)
}

/// Creates (`id` none) or updates an asset profile of the caller's tenant (a tenant
/// administrator's); whether it is the default is changed by [`set_default_profile`] only.
pub async fn save_profile(
    core: &Core,
    me: &Caller,
    id: Option<Uuid>,
    name: String,
    mut doc: J,
) -> ServiceResult<DocRecord> {
    let Some(obj) = doc.as_object_mut() else {
        return Err(ServiceError::Invalid("Invalid request body: an asset profile is a JSON object".into()));
    };
    if name.trim().is_empty() {
        return Err(ServiceError::Invalid("Asset profile name should be specified!".into()));
    }
    let default = match id {
        Some(id) => is_default(&get_profile(core, me, id).await?),
        None => false,
    };
    for own in ["id", "createdTime", "tenantId", "name", "version"] {
        obj.remove(own);
    }
    obj.insert("default".into(), default.into());
    core.set_doc_tenant(&mut doc, me.tenant);
    // The default first, so the tenant's first own profile is not its only one.
    profiles(core, me).await?;
    written_doc(core.writer.submit(WriteOp::SaveDoc { kind: DocKind::AssetProfile, id, title: name, doc }).await?)
}

/// Makes an asset profile of the caller's tenant its default: one write per profile whose
/// flag changes (the new default first), so a reader in between may see two defaults and
/// takes the first by name.
pub async fn set_default_profile(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<DocRecord> {
    let target = get_profile(core, me, id).await?;
    let mut made = target.clone();
    let mut all = profiles(core, me).await?;
    all.sort_by_key(|p| p.id != id);
    for p in all {
        let default = p.id == id;
        if is_default(&p) == default {
            continue;
        }
        let mut doc = p.doc.clone();
        if let Some(o) = doc.as_object_mut() {
            o.insert("default".into(), default.into());
        }
        let op = WriteOp::SaveDoc { kind: DocKind::AssetProfile, id: Some(p.id), title: p.title.clone(), doc };
        let saved = written_doc(core.writer.submit(op).await?)?;
        if default {
            made = saved;
        }
    }
    Ok(made)
}

/// Deletes an asset profile of the caller's tenant that is not its default and no asset
/// uses.
pub async fn delete_profile(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<()> {
    let p = get_profile(core, me, id).await?;
    if is_default(&p) {
        return Err(ServiceError::Invalid("Deletion of Default Asset Profile is prohibited!".into()));
    }
    let store = core.store.clone();
    let assets = blocking(move || store.docs(DocKind::Asset)).await?;
    if assets.iter().any(|a| profile_id(a) == Some(id)) {
        return Err(ServiceError::Invalid("The asset profile referenced by the assets cannot be deleted!".into()));
    }
    core.writer.submit(WriteOp::DeleteDoc(DocKind::AssetProfile, id)).await?;
    super::relations::forget(core, super::relations::EntityKind::AssetProfile, id).await
}

/// What a client sends to save an asset.
pub struct AssetSave {
    /// The asset to update; `None` creates one.
    pub id: Option<Uuid>,
    /// Its name (unique in the tenant).
    pub name: String,
    /// Its type: the name of its profile (created when new); `None` with no profile: the default.
    pub asset_type: Option<String>,
    /// Its profile, which wins over the type.
    pub profile: Option<Uuid>,
    /// `label`, `additionalInfo` (kept as given).
    pub label: J,
    /// `additionalInfo`.
    pub additional_info: J,
}

/// Creates or updates an asset of the caller's tenant (a tenant administrator's); its
/// customer stays as it was (assignment changes it).
pub async fn save(core: &Core, me: &Caller, a: AssetSave) -> ServiceResult<DocRecord> {
    if a.name.trim().is_empty() {
        return Err(ServiceError::Invalid("Asset name should be specified!".into()));
    }
    let old = match a.id {
        Some(id) => Some(get(core, me, id).await?),
        None => None,
    };
    // Checked before a new type makes a profile, so a refused save leaves nothing behind
    // (the writer checks again: two saves at once cannot both take the name).
    let store = core.store.clone();
    let assets = blocking(move || store.docs(DocKind::Asset)).await?;
    if assets.iter().any(|x| x.title == a.name && Some(x.id) != a.id && core.doc_tenant(x) == me.tenant) {
        return Err(StoreError::TitleTaken(DocKind::Asset).into());
    }
    let profile = match (a.profile, a.asset_type.as_deref().map(str::trim).filter(|t| !t.is_empty())) {
        (Some(p), _) => get_profile(core, me, p).await?,
        (None, Some(t)) => match profiles(core, me).await?.into_iter().find(|p| p.title == t) {
            Some(p) => p,
            None => create_profile(core, me.tenant, t, false).await?,
        },
        (None, None) => default_profile(core, me).await?,
    };
    let mut doc = json!({
        "assetProfileId": profile.id.to_string(),
        "label": a.label,
        "additionalInfo": a.additional_info,
    });
    if let (Some(c), Some(o)) = (old.as_ref().and_then(customer), doc.as_object_mut()) {
        o.insert("customerId".into(), c.to_string().into());
    }
    if a.id.is_none() {
        may_create(core, me.tenant, DocKind::Asset).await?;
    }
    core.set_doc_tenant(&mut doc, me.tenant);
    written_doc(core.writer.submit(WriteOp::SaveDoc { kind: DocKind::Asset, id: a.id, title: a.name, doc }).await?)
}

/// Assigns an asset of the caller's tenant to one of its customers (`Some`) or to none.
pub async fn assign_customer(core: &Core, me: &Caller, id: Uuid, to: Option<Uuid>) -> ServiceResult<DocRecord> {
    let a = get(core, me, id).await?;
    if let Some(c) = to {
        super::customers::get(core, me, c).await?;
    }
    let mut doc = a.doc.clone();
    if let Some(o) = doc.as_object_mut() {
        match to {
            Some(c) => o.insert("customerId".into(), c.to_string().into()),
            None => o.remove("customerId"),
        };
    }
    written_doc(
        core.writer.submit(WriteOp::SaveDoc { kind: DocKind::Asset, id: Some(a.id), title: a.title, doc }).await?,
    )
}

/// Deletes an asset of the caller's tenant with its data and relations.
pub async fn delete(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<()> {
    let a = get(core, me, id).await?;
    core.writer.submit(WriteOp::DeleteDoc(DocKind::Asset, a.id)).await?;
    core.alarms.delete_of(a.id).await?;
    core.ts.forget_device(gridlinks_types::DeviceId(a.id));
    super::relations::forget(core, super::relations::EntityKind::Asset, a.id).await
}
