//! Device profiles: which a caller may see; saving, deleting and choosing the default one
//! (a tenant administrator's).

use base64::Engine;
use gridlinks_storage::{ProfileRecord, SaveProfile, StoreError, WriteOp, WriteOutcome, GATEWAY_ADOPTION};
use gridlinks_types::ProfileId;
use serde_json::Value as J;

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

fn written(outcome: WriteOutcome) -> ServiceResult<ProfileRecord> {
    match outcome {
        WriteOutcome::Profile(p) => Ok(p),
        _ => Err(StoreError::Corrupt("unexpected write outcome").into()),
    }
}

/// Creates (`id` none) or updates a profile of the caller's tenant. `gatewayAdoption` is
/// `ALLOW`, `REFUSE` or absent; a provision key is unique across tenants (devices provision
/// by key alone).
pub async fn save(
    core: &Core,
    me: &Caller,
    id: Option<ProfileId>,
    name: String,
    mut doc: J,
) -> ServiceResult<ProfileRecord> {
    if !doc.is_object() {
        return Err(ServiceError::Invalid("Invalid request body: a device profile is a JSON object".into()));
    }
    x509_chain_key(&mut doc)?;
    // Alarm rules are checked here, so a rule that cannot work is refused with where it is wrong.
    crate::alarms::rules::ProfileAlarms::compile(doc.get("profileData").and_then(|d| d.get("alarms")))
        .map_err(|e| ServiceError::Invalid(e.to_string()))?;
    let adoption = doc.get(GATEWAY_ADOPTION).filter(|v| !v.is_null());
    if adoption.is_some_and(|v| !matches!(v.as_str(), Some("ALLOW" | "REFUSE"))) {
        return Err(ServiceError::Invalid(format!(
            "{GATEWAY_ADOPTION}: ALLOW or REFUSE (whether gateways may adopt this profile's devices), or absent for the \
             server's limits.gateway_adopts_devices"
        )));
    }
    if let Some(id) = id {
        get(core, me, id).await?;
    }
    if let Some(key) = doc.get("provisionDeviceKey").and_then(J::as_str).filter(|k| !k.is_empty()) {
        let store = core.store.clone();
        let all = blocking(move || store.profiles()).await?;
        if all.iter().any(|p| Some(p.id) != id && p.doc.get("provisionDeviceKey").and_then(J::as_str) == Some(key)) {
            return Err(ServiceError::Invalid("Device profile with such provision device key already exists!".into()));
        }
    }
    let tenant = core.stored_tenant(me.tenant);
    written(core.writer.submit(WriteOp::SaveProfile(SaveProfile { id, tenant, name, doc })).await?)
}

/// ThingsBoard's X.509 chain provisioning (`provisionConfiguration.type =
/// "X509_CERTIFICATE_CHAIN"`, `provisionDeviceSecret` = the CA certificate in PEM): as
/// ThingsBoard's profile service does, the profile's `provisionType` follows and its
/// `provisionDeviceKey` becomes the CA certificate's fingerprint, which a device's chain is
/// matched by.
fn x509_chain_key(doc: &mut J) -> ServiceResult<()> {
    let config = doc.pointer("/profileData/provisionConfiguration");
    if config.and_then(|c| c.get("type")).and_then(J::as_str) != Some(crate::provision::X509_CHAIN) {
        return Ok(());
    }
    let bad = || {
        ServiceError::Invalid(
            "provisionConfiguration.provisionDeviceSecret must be the CA certificate (PEM) for X509_CERTIFICATE_CHAIN"
                .into(),
        )
    };
    let pem = config.and_then(|c| c.get("provisionDeviceSecret")).and_then(J::as_str).ok_or_else(bad)?;
    // The first certificate of the text is the CA's.
    let first = pem.split_inclusive("-----END CERTIFICATE-----").next().ok_or_else(bad)?;
    let (body, fingerprint) = gridlinks_thingsboard::x509::fingerprint(first).map_err(|_| bad())?;
    let der = base64::engine::general_purpose::STANDARD.decode(&body).map_err(|_| bad())?;
    gridlinks_thingsboard::x509::parse_der(&der).map_err(|_| bad())?;
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("provisionType".into(), J::from(crate::provision::X509_CHAIN));
        obj.insert("provisionDeviceKey".into(), J::from(fingerprint));
    }
    Ok(())
}

/// Deletes a profile of the caller's tenant.
pub async fn delete(core: &Core, me: &Caller, id: ProfileId) -> ServiceResult<()> {
    let p = get(core, me, id).await?;
    core.writer.submit(WriteOp::DeleteProfile(p.id)).await?;
    super::relations::forget(core, super::relations::EntityKind::DeviceProfile, p.id.0).await
}

/// Makes a profile of the caller's tenant its default one.
pub async fn set_default(core: &Core, me: &Caller, id: ProfileId) -> ServiceResult<ProfileRecord> {
    let p = get(core, me, id).await?;
    written(core.writer.submit(WriteOp::SetDefaultProfile(p.id)).await?)
}
