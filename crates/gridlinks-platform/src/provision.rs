//! Device provisioning, as ThingsBoard does it, for every transport: HTTP
//! `POST /api/v1/provision`, MQTT `/provision/request` (user name `provision`) and CoAP
//! `POST /api/v1/provision` all answer through [`provision`].
//!
//! A request names a device profile by its provision key and proves it with the profile's
//! provision secret (`profileData.provisionConfiguration.provisionDeviceSecret`). The
//! profile's `provisionType` decides:
//! - `ALLOW_CREATE_NEW_DEVICES`: a device of that name is created with that profile (and
//!   the token the request gives, or a generated one); one that exists already is refused;
//! - `CHECK_PRE_PROVISIONED_DEVICES`: the device must exist with that profile and not be
//!   provisioned yet; it gets the server attribute `provisionState = "provisioned"`;
//! - `DISABLED`: nothing is provisioned.
//!
//! Wrong keys and secrets are throttled like passwords (per source address and per key).
//! Each profile provisions at most `limits.max_provisions_per_minute` devices a minute (its
//! key and secret ship in firmware), and a tenant has at most `limits.max_devices_per_tenant`
//! devices; past either the answer is a `FAILURE` that says which.
//! The answer is `{"status":"SUCCESS","credentialsType":"ACCESS_TOKEN","credentialsValue":…}`
//! or `{"status":"NOT_FOUND"|"FAILURE","errorMsg":…}`.
//!
//! [`x509_chain`] is ThingsBoard's `X509_CERTIFICATE_CHAIN` strategy: a device whose client
//! certificate chains to a profile's CA certificate is that profile's device named by the
//! certificate's CN, created on its first connection.

use std::net::IpAddr;

use gridlinks_ingest::Item;
use gridlinks_storage::{ProfileRecord, SaveDevice, StoreError, WriteOp, WriteOutcome};
use gridlinks_types::{AttributeScope, Value};
use serde::Deserialize;
use serde_json::{json, Value as J};

use crate::core::Platform;

/// The server attribute that marks a pre-provisioned device as provisioned.
pub const PROVISION_STATE: &str = "provisionState";
/// The provision type (and provision configuration type) of X.509 chain provisioning.
pub const X509_CHAIN: &str = "X509_CERTIFICATE_CHAIN";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    device_name: Option<String>,
    provision_device_key: String,
    provision_device_secret: String,
    credentials_type: Option<String>,
    token: Option<String>,
}

fn failure(status: &str, msg: impl Into<String>) -> J {
    json!({"status": status, "errorMsg": msg.into()})
}

/// The answer to a provisioning request `body` from `peer`.
pub async fn provision(p: &Platform, peer: IpAddr, body: &[u8]) -> J {
    let req: Request = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return failure("FAILURE", format!("invalid provisioning request: {e}")),
    };
    let throttle = &p.auth.throttle;
    let who = format!("\0provision/{}", req.provision_device_key);
    if let Err(wait) = throttle.check(peer, &who) {
        return failure(
            "FAILURE",
            format!("too many failed provisioning attempts: retry in {} s", wait.as_secs().max(1)),
        );
    }
    let store = p.core.store.clone();
    let profiles = match tokio::task::spawn_blocking(move || store.profiles()).await {
        Ok(Ok(p)) => p,
        _ => return failure("FAILURE", "storage unavailable: retry later"),
    };
    let profile = profiles
        .iter()
        .find(|p| {
            !req.provision_device_key.is_empty()
                && p.doc.get("provisionDeviceKey").and_then(J::as_str) == Some(req.provision_device_key.as_str())
        })
        .cloned();
    let Some(profile) = profile.filter(|p| secret_matches(p, &req.provision_device_secret)) else {
        throttle.failed(peer, &who);
        return failure("NOT_FOUND", "no device profile has this provision key and secret");
    };
    throttle.succeeded(peer, &who);
    if let Err(wait) = p.core.guards.provision(profile.id) {
        return failure("FAILURE", over_rate(wait));
    }
    match req.credentials_type.as_deref() {
        None | Some("ACCESS_TOKEN") => {}
        Some(other) => {
            return failure("FAILURE", format!("credentialsType {other} is not supported yet: use ACCESS_TOKEN"))
        }
    }
    let name = req.device_name.filter(|n| !n.trim().is_empty()).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let token = req.token.filter(|t| !t.is_empty());
    let outcome = match profile.doc.get("provisionType").and_then(J::as_str) {
        Some("ALLOW_CREATE_NEW_DEVICES") => create(p, &profile, name, token).await,
        Some("CHECK_PRE_PROVISIONED_DEVICES") => pre_provisioned(p, &profile, name, token).await,
        _ => Err(failure("NOT_FOUND", "provisioning is disabled for this device profile")),
    };
    match outcome {
        Ok(token) => json!({"status": "SUCCESS", "credentialsType": "ACCESS_TOKEN", "credentialsValue": token}),
        Err(answer) => answer,
    }
}

/// Compares the secret in constant time (its length aside).
fn secret_matches(profile: &ProfileRecord, given: &str) -> bool {
    let Some(secret) = profile
        .doc
        .pointer("/profileData/provisionConfiguration/provisionDeviceSecret")
        .or_else(|| profile.doc.get("provisionDeviceSecret"))
        .and_then(J::as_str)
        .filter(|s| !s.is_empty())
    else {
        return false;
    };
    secret.len() == given.len() && secret.bytes().zip(given.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

fn store_failure(e: StoreError) -> J {
    match e {
        StoreError::NameTaken(_) => failure("FAILURE", "a device with this name exists already"),
        StoreError::TokenTaken => failure("FAILURE", "this access token belongs to another device"),
        e => failure("FAILURE", e.to_string()),
    }
}

async fn create(p: &Platform, profile: &ProfileRecord, name: String, token: Option<String>) -> Result<String, J> {
    new_device(p, profile, name, token).await.map(|d| d.token).map_err(store_failure)
}

/// A device of `profile` named `name` (with `token`, or a generated one), told its OTA
/// packages.
async fn new_device(
    p: &Platform,
    profile: &ProfileRecord,
    name: String,
    token: Option<String>,
) -> Result<Box<gridlinks_storage::DeviceRecord>, StoreError> {
    let save = SaveDevice {
        tenant: profile.tenant,
        id: None,
        name,
        device_type: String::new(),
        profile: Some(profile.id),
        label: None,
        token,
        additional_info: None,
    };
    match p.core.writer.submit(WriteOp::SaveDevice(save)).await? {
        WriteOutcome::Device(d) => {
            if let Err(e) = crate::entities::ota::created(p, vec![d.id]).await {
                tracing::warn!(device = %d.id, error = %e, "a provisioned device was not told its OTA packages");
            }
            Ok(d)
        }
        _ => Err(StoreError::Corrupt("unexpected write outcome")),
    }
}

/// What a provisioning past `limits.max_provisions_per_minute` is told.
fn over_rate(wait: std::time::Duration) -> String {
    format!(
        "too many devices provisioned through this device profile (limits.max_provisions_per_minute): retry in {} s",
        wait.as_secs().max(1)
    )
}

async fn pre_provisioned(
    p: &Platform,
    profile: &ProfileRecord,
    name: String,
    token: Option<String>,
) -> Result<String, J> {
    let store = p.core.store.clone();
    let tenant = profile.tenant;
    let found = tokio::task::spawn_blocking(move || {
        let Some(d) = store.device_by_name(tenant, &name)? else { return Ok(None) };
        let keys = [PROVISION_STATE.to_owned()];
        let state = store.attributes(d.id, Some(AttributeScope::Server), Some(&keys))?;
        Ok::<_, StoreError>(Some((d, !state.is_empty())))
    })
    .await;
    let (device, provisioned) = match found {
        Ok(Ok(Some(f))) if f.0.profile_id() == profile.id => f,
        Ok(Ok(_)) => return Err(failure("NOT_FOUND", "no pre-provisioned device of this name in this profile")),
        Ok(Err(e)) => return Err(store_failure(e)),
        Err(_) => return Err(failure("FAILURE", "storage unavailable: retry later")),
    };
    if provisioned {
        return Err(failure("FAILURE", "the device is provisioned already"));
    }
    let mut token_now = device.token.clone();
    if let Some(t) = token.filter(|t| *t != device.token) {
        let save = SaveDevice {
            tenant: device.tenant,
            id: Some(device.id),
            name: device.name.clone(),
            device_type: String::new(),
            profile: Some(profile.id),
            label: device.label.clone(),
            token: Some(t),
            additional_info: device.additional_info.clone(),
        };
        match p.core.writer.submit(WriteOp::SaveDevice(save)).await {
            Ok(WriteOutcome::Device(d)) => token_now = d.token,
            Ok(_) => return Err(failure("FAILURE", "unexpected write outcome")),
            Err(e) => return Err(store_failure(e)),
        }
    }
    let values = vec![(PROVISION_STATE.to_owned(), Value::Str("provisioned".into()))];
    match p.core.ingest.submit_one(Item::Attributes { device: device.id, scope: AttributeScope::Server, values }).await
    {
        Ok(()) => Ok(token_now),
        Err(e) => Err(failure("FAILURE", e.to_string())),
    }
}

/// Why a client certificate chain provisioned no device.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainRefusal {
    /// No certificate of the chain is a profile's CA certificate.
    #[error("no device profile provisions by this certificate chain")]
    NoProfile,
    /// The client's certificate does not chain to the profile's CA certificate.
    #[error("the client certificate is not signed by the device profile's CA certificate")]
    NotSigned,
    /// The CN does not match the profile's `certificateRegExPattern` (with a group).
    #[error("the certificate's CN does not give a device name by the profile's certificateRegExPattern")]
    NoName,
    /// A device of that name exists in another profile, or new devices may not be made.
    #[error("{0}")]
    Refused(String),
    /// Storage could not be read or written.
    #[error("storage unavailable: {0}")]
    Storage(String),
}

/// ThingsBoard's X.509 chain provisioning for a client that presented `chain` (DER, its
/// own certificate first) that no device holds: the first certificate of the chain that is
/// a profile's CA certificate (its `provisionDeviceKey`) picks the profile; the client's
/// certificate must chain to it (signatures and validity checked); its CN, through the
/// profile's `certificateRegExPattern` (first group; default `(.*)`), names the device. A
/// device of that name in that profile gets the certificate as its X509 credentials; none:
/// one is made when `allowCreateNewDevicesByX509Certificate`. Bounded like other
/// provisioning (`limits.max_provisions_per_minute` per profile, the tenant's device limit).
pub async fn x509_chain(p: &Platform, chain: &[Vec<u8>]) -> Result<gridlinks_types::DeviceId, ChainRefusal> {
    use gridlinks_thingsboard::x509;
    let storage = |e: StoreError| ChainRefusal::Storage(e.to_string());
    let Some((leaf, intermediates)) = chain.split_first() else { return Err(ChainRefusal::NoProfile) };
    let store = p.core.store.clone();
    let profiles = tokio::task::spawn_blocking(move || store.profiles())
        .await
        .map_err(|e| ChainRefusal::Storage(e.to_string()))?
        .map_err(storage)?;
    let found = chain.iter().find_map(|cert| {
        let key = x509::der_fingerprint(cert);
        let profile = profiles.iter().find(|p| {
            p.doc.get("provisionType").and_then(J::as_str) == Some(X509_CHAIN)
                && p.doc.get("provisionDeviceKey").and_then(J::as_str) == Some(key.as_str())
        })?;
        Some((profile.clone(), cert))
    });
    let Some((profile, ca)) = found else { return Err(ChainRefusal::NoProfile) };
    if !chains_to(leaf, intermediates, ca) {
        return Err(ChainRefusal::NotSigned);
    }
    let config = profile.doc.pointer("/profileData/provisionConfiguration").cloned().unwrap_or(J::Null);
    let pattern = config.get("certificateRegExPattern").and_then(J::as_str).filter(|p| !p.is_empty()).unwrap_or("(.*)");
    let cn = x509::parse_der(leaf).ok().and_then(|i| i.common_name).ok_or(ChainRefusal::NoName)?;
    let name = regex_lite::Regex::new(pattern)
        .ok()
        .and_then(|re| re.captures(&cn).and_then(|c| c.get(1)).map(|m| m.as_str().trim().to_owned()))
        .filter(|n| !n.is_empty())
        .ok_or(ChainRefusal::NoName)?;
    let x509 = gridlinks_storage::X509Credentials {
        fingerprint: x509::der_fingerprint(leaf),
        cert: base64::Engine::encode(&base64::engine::general_purpose::STANDARD, leaf),
    };
    let store = p.core.store.clone();
    let (tenant, lookup) = (profile.tenant, name.clone());
    let existing = tokio::task::spawn_blocking(move || store.device_by_name(tenant, &lookup))
        .await
        .map_err(|e| ChainRefusal::Storage(e.to_string()))?
        .map_err(storage)?;
    let device = match existing {
        Some(d) if d.profile_id() != profile.id => {
            return Err(ChainRefusal::Refused(format!("device {name:?} exists in another device profile")))
        }
        Some(d) => d.id,
        None if config.get("allowCreateNewDevicesByX509Certificate").and_then(J::as_bool) != Some(true) => {
            return Err(ChainRefusal::Refused(format!(
                "device {name:?} does not exist and the profile does not allow creating devices by certificate"
            )))
        }
        None => {
            if let Err(wait) = p.core.guards.provision(profile.id) {
                return Err(ChainRefusal::Refused(over_rate(wait)));
            }
            match new_device(p, &profile, name, None).await {
                Ok(d) => d.id,
                Err(StoreError::NameTaken(_)) => {
                    return Err(ChainRefusal::Refused("a device of this name was made meanwhile; retry".into()))
                }
                Err(e) => return Err(ChainRefusal::Refused(e.to_string())),
            }
        }
    };
    p.core.writer.submit(WriteOp::SetX509 { device, x509 }).await.map_err(|e| ChainRefusal::Refused(e.to_string()))?;
    Ok(device)
}

/// Whether `leaf` chains, through `intermediates`, to the CA certificate `ca` (all DER), now,
/// for client authentication.
pub fn chains_to(leaf: &[u8], intermediates: &[Vec<u8>], ca: &[u8]) -> bool {
    use rustls_pki_types::{CertificateDer, UnixTime};
    use webpki::KeyUsage;
    let ca = CertificateDer::from(ca);
    let Ok(anchor) = webpki::anchor_from_trusted_cert(&ca) else { return false };
    let leaf = CertificateDer::from(leaf);
    let Ok(end_entity) = webpki::EndEntityCert::try_from(&leaf) else { return false };
    let intermediates: Vec<CertificateDer<'_>> =
        intermediates.iter().map(|c| CertificateDer::from(c.as_slice())).collect();
    end_entity
        .verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &[anchor],
            &intermediates,
            UnixTime::now(),
            KeyUsage::client_auth(),
            None,
            None,
        )
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlinks_types::ProfileId;

    #[test]
    fn the_secret_is_read_where_thingsboard_keeps_it() {
        let profile = |doc: J| ProfileRecord {
            id: ProfileId::for_name("p"),
            created_time: 0,
            name: "p".into(),
            default: false,
            doc,
            tenant: None,
        };
        let p = profile(json!({"profileData": {"provisionConfiguration": {"provisionDeviceSecret": "s3cret"}}}));
        assert!(secret_matches(&p, "s3cret"));
        assert!(!secret_matches(&p, "s3creT"));
        assert!(!secret_matches(&p, "s3cret!"));
        assert!(!secret_matches(&profile(json!({})), ""), "no secret: nothing matches");
    }
}
