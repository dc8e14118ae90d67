//! Devices: reading one the caller may use, deleting it (its live sessions closed at
//! once, on every transport), assigning it to a customer, and gateway relations (a
//! gateway writes only for the devices it created or was assigned).

use gridlinks_storage::{DeviceRecord, StoreError, WriteOp, WriteOutcome};
use gridlinks_types::DeviceId;
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
            Ok(())
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
    match core.writer.submit(WriteOp::AssignCustomer { device, customer }).await {
        Ok(WriteOutcome::Device(d)) => Ok(*d),
        Ok(_) => Err(StoreError::Corrupt("unexpected write outcome").into()),
        Err(StoreError::DeviceNotFound) => Err(missing(device)),
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

/// Gives device `name`, of the caller's customer, back to its tenant.
pub async fn reclaim(core: &Core, me: &Caller, name: String) -> ServiceResult<()> {
    let customer = me.customer.filter(|_| me.authority == crate::auth::Authority::CustomerUser);
    let Some(customer) = customer else { return Err(ServiceError::Forbidden) };
    let d = named(core, me, name).await?;
    if d.customer != Some(customer) {
        return Err(ServiceError::Forbidden);
    }
    set_customer(core, d.id, None).await?;
    Ok(())
}
