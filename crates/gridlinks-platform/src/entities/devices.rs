//! Devices: reading one the caller may use, deleting it (its live sessions closed at
//! once, on every transport), assigning it to a customer, and gateway relations (a
//! gateway writes only for the devices it created or was assigned).

use gridlinks_storage::{
    BasicCredentials, DeviceRecord, SaveDevice, StoreError, WriteOp, WriteOutcome, X509Credentials,
};
use gridlinks_types::{DeviceId, ProfileId, ProtocolIdentity};
use uuid::Uuid;

use super::{blocking, hidden, ServiceError, ServiceResult};
use crate::auth::Caller;
use crate::core::{Core, Platform};

fn missing(id: DeviceId) -> ServiceError {
    ServiceError::NotFound(format!("Device with id [{id}] is not found"))
}

/// A device the caller may see and control: a tenant administrator its tenant's, a
/// customer user its customer's.
pub async fn get(core: &Core, me: &Caller, id: DeviceId) -> ServiceResult<DeviceRecord> {
    let store = core.store.clone();
    let d = blocking(move || store.device(id)).await?.ok_or_else(|| missing(id))?;
    let tenant = core.tenant_of(d.tenant);
    if !me.may_use(tenant, d.customer) {
        return Err(hidden(me, tenant, || missing(id)));
    }
    Ok(d)
}

/// The device of the caller's tenant named `name`.
pub async fn named(core: &Core, me: &Caller, name: String) -> ServiceResult<DeviceRecord> {
    let store = core.store.clone();
    let tenant = core.stored_tenant(me.tenant);
    blocking(move || store.device_by_name(tenant, &name))
        .await?
        .ok_or_else(|| ServiceError::NotFound("Requested item wasn't found!".into()))
}

/// Deletes a device the caller may use: its data and token go at once, and so do its live
/// sessions on this node (other nodes close theirs at their next catch-up).
pub async fn delete(p: &Platform, me: &Caller, id: DeviceId) -> ServiceResult<()> {
    get(&p.core, me, id).await?;
    match p.core.writer.submit(WriteOp::DeleteDevice(id)).await {
        Ok(_) => {
            p.devices.close(id);
            p.core.ts.forget_device(id);
            p.core.alarms.delete_of(id.0).await?;
            super::relations::forget(&p.core, super::relations::EntityKind::Device, id.0).await
        }
        Err(StoreError::DeviceNotFound) => Err(missing(id)),
        Err(e) => Err(e.into()),
    }
}

/// Assigns `device` (of the caller's tenant) to `customer` (one of its customers), or to
/// none; the device as it is now.
pub async fn assign_customer(
    core: &Core,
    me: &Caller,
    device: DeviceId,
    customer: Option<Uuid>,
) -> ServiceResult<DeviceRecord> {
    get(core, me, device).await?;
    if let Some(c) = customer {
        super::customers::get(core, me, c).await?;
    }
    set_customer(core, device, customer).await
}

async fn set_customer(core: &Core, device: DeviceId, customer: Option<Uuid>) -> ServiceResult<DeviceRecord> {
    written_device(Some(device), core.writer.submit(WriteOp::AssignCustomer { device, customer }).await)
}

/// The device a write about `device` gave back (none for a new one).
fn written_device(device: Option<DeviceId>, r: Result<WriteOutcome, StoreError>) -> ServiceResult<DeviceRecord> {
    match r {
        Ok(WriteOutcome::Device(d)) => Ok(*d),
        Ok(_) => Err(StoreError::Corrupt("unexpected write outcome").into()),
        Err(StoreError::DeviceNotFound) => Err(ServiceError::NotFound(format!(
            "Device with id [{}] is not found",
            device.map(|i| i.to_string()).unwrap_or_default()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Makes `gateway` the gateway of `device` (both the caller's): it may then write for it.
pub async fn relate_gateway(core: &Core, me: &Caller, gateway: DeviceId, device: DeviceId) -> ServiceResult<()> {
    if gateway == device {
        return Err(ServiceError::Invalid("a device cannot be its own gateway".into()));
    }
    get(core, me, gateway).await?;
    get(core, me, device).await?;
    core.writer.submit(WriteOp::AssignGateway { device, gateway: Some(gateway) }).await?;
    Ok(())
}

/// Ends the relation of `device` to `gateway` (404 when there is none).
pub async fn unrelate_gateway(core: &Core, me: &Caller, gateway: DeviceId, device: DeviceId) -> ServiceResult<()> {
    if get(core, me, device).await?.gateway != Some(gateway) {
        return Err(ServiceError::NotFound("Requested item wasn't found!".into()));
    }
    core.writer.submit(WriteOp::AssignGateway { device, gateway: None }).await?;
    Ok(())
}

/// The devices of `gateway` (the caller's).
pub async fn of_gateway(core: &Core, me: &Caller, gateway: DeviceId) -> ServiceResult<Vec<DeviceId>> {
    get(core, me, gateway).await?;
    let store = core.store.clone();
    Ok(blocking(move || store.gateway_devices(gateway)).await?)
}

/// Claims device `name` of the caller's tenant for the caller's customer with the secret
/// the device opened its claim with (`crate::claims`).
pub async fn claim(core: &Core, me: &Caller, name: String, secret: &str) -> ServiceResult<Claimed> {
    let customer = me.customer.filter(|_| me.authority == crate::auth::Authority::CustomerUser);
    let Some(customer) = customer else { return Err(ServiceError::Forbidden) };
    let d = named(core, me, name).await?;
    let taken = core.claims.take(d.id, secret, gridlinks_types::Ts::now().0);
    match (taken, d.customer) {
        (crate::claims::Taken::Yes, None) => {
            Ok(Claimed::Yes(Box::new(set_customer(core, d.id, Some(customer)).await?)))
        }
        (crate::claims::Taken::Yes | crate::claims::Taken::NotOpen, Some(_)) => Ok(Claimed::Already),
        _ => Ok(Claimed::Refused),
    }
}

/// What a claim did.
#[derive(Debug)]
pub enum Claimed {
    /// The device is the customer's now.
    Yes(Box<DeviceRecord>),
    /// It has a customer already.
    Already,
    /// No open claim, an expired one, or a wrong secret (the claim is closed either way).
    Refused,
}

/// Gives device `name` back to its tenant (no customer): a customer user its own customer's
/// device, a tenant administrator any of its tenant's, as in ThingsBoard.
pub async fn reclaim(core: &Core, me: &Caller, name: String) -> ServiceResult<()> {
    let d = match me.authority {
        // Any device of its tenant (`named` looks in the caller's tenant only).
        crate::auth::Authority::TenantAdmin => named(core, me, name).await?,
        crate::auth::Authority::CustomerUser => {
            let d = named(core, me, name).await?;
            if d.customer.is_none() || d.customer != me.customer {
                return Err(ServiceError::Forbidden);
            }
            d
        }
        crate::auth::Authority::SysAdmin => return Err(ServiceError::Forbidden),
    };
    set_customer(core, d.id, None).await?;
    Ok(())
}

/// What a device is, as its tenant's administrator sets it.
#[derive(Debug)]
pub struct DeviceFields {
    /// Unique in the tenant; not empty.
    pub name: String,
    /// Its profile's name (created when no profile has it), when no `profile` is given.
    pub device_type: String,
    /// Its profile by id.
    pub profile: Option<ProfileId>,
    /// Label.
    pub label: Option<String>,
    /// Free-form JSON (`gateway: true` makes it a gateway).
    pub additional_info: Option<serde_json::Value>,
}

/// The outcome of a write that names credentials unique across tenants: a "taken" answer
/// counts against the caller's tenant (`crate::guards`).
fn credential_write(
    core: &Core,
    me: &Caller,
    device: Option<DeviceId>,
    r: Result<WriteOutcome, StoreError>,
) -> ServiceResult<DeviceRecord> {
    match r {
        Ok(WriteOutcome::Device(d)) => Ok(*d),
        Ok(_) => Err(StoreError::Corrupt("unexpected write outcome").into()),
        Err(StoreError::DeviceNotFound) => Err(missing_opt(device)),
        Err(e) => Err(core.guards.note(me, e).into()),
    }
}

fn missing_opt(device: Option<DeviceId>) -> ServiceError {
    ServiceError::NotFound(format!(
        "Device with id [{}] is not found",
        device.map(|i| i.to_string()).unwrap_or_default()
    ))
}

/// Refuses while the caller's tenant is throttled for naming taken credentials.
fn unthrottled(core: &Core, me: &Caller) -> ServiceResult<()> {
    core.guards.check_conflicts(me).map_err(ServiceError::Throttled)
}

/// Creates (`id` none) or updates a device of the caller's tenant, with `token` as its
/// access token when given (a new device without one gets a random one).
pub async fn save(
    core: &Core,
    me: &Caller,
    id: Option<DeviceId>,
    fields: DeviceFields,
    token: Option<String>,
) -> ServiceResult<DeviceRecord> {
    if fields.name.trim().is_empty() {
        return Err(ServiceError::Invalid("Device name should be specified!".into()));
    }
    if let Some(id) = id {
        get(core, me, id).await?;
    }
    if token.is_some() {
        unthrottled(core, me)?;
    }
    let save = SaveDevice {
        tenant: core.stored_tenant(me.tenant),
        id,
        profile: fields.profile,
        name: fields.name,
        device_type: fields.device_type,
        label: fields.label,
        token,
        additional_info: fields.additional_info.filter(|v| !v.is_null()),
    };
    let saved = credential_write(core, me, id, core.writer.submit(WriteOp::SaveDevice(save)).await)?;
    core.limits.device_saved(&saved);
    Ok(saved)
}

/// A device's credentials, as `POST /api/device/credentials` sets them.
#[derive(Debug)]
pub enum Credentials {
    /// Its access token.
    AccessToken(String),
    /// The identity a custom TCP protocol knows it by (beside its token).
    ProtocolIdentity(ProtocolIdentity),
    /// MQTT_BASIC: client id, user name, password (kept as an argon2 hash).
    Basic {
        /// The client id it must connect with, if any.
        client_id: Option<String>,
        /// Its user name, if any.
        user_name: Option<String>,
        /// Its password, if any.
        password: Option<String>,
    },
    /// An X.509 certificate (PEM), matched by its fingerprint.
    X509(String),
}

/// Sets the credentials of a device of the caller's tenant. Each kind is unique across
/// tenants: a taken one is refused, and such refusals are throttled.
pub async fn set_credentials(
    p: &Platform,
    me: &Caller,
    id: DeviceId,
    credentials: Credentials,
) -> ServiceResult<DeviceRecord> {
    let core = &p.core;
    let d = get(core, me, id).await?;
    unthrottled(core, me)?;
    let outcome = match credentials {
        Credentials::AccessToken(token) => {
            let save = SaveDevice {
                tenant: d.tenant,
                profile: None,
                id: Some(id),
                name: d.name,
                device_type: d.device_type,
                label: d.label,
                token: Some(token),
                additional_info: d.additional_info,
            };
            core.writer.submit(WriteOp::SaveDevice(save)).await
        }
        Credentials::ProtocolIdentity(identity) => {
            core.writer.submit(WriteOp::SetIdentity { device: id, identity: Some(identity) }).await
        }
        Credentials::Basic { client_id, user_name, password } => {
            let password_hash = match password {
                Some(pw) => Some(p.auth.passwords.hash(pw).await.map_err(|e| ServiceError::Internal(e.to_string()))?),
                None => None,
            };
            let basic = BasicCredentials { client_id, user_name, password_hash };
            core.writer.submit(WriteOp::SetBasic { device: id, basic }).await
        }
        Credentials::X509(pem) => {
            // Stored and unique now; a device connects with it once a TLS transport exists.
            let (cert, fingerprint) =
                gridlinks_thingsboard::x509::fingerprint(&pem).map_err(|e| ServiceError::Invalid(e.to_string()))?;
            core.writer.submit(WriteOp::SetX509 { device: id, x509: X509Credentials { fingerprint, cert } }).await
        }
    };
    credential_write(core, me, Some(id), outcome)
}
