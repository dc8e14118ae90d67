//! OTA packages (ThingsBoard's firmware and software updates): their descriptions
//! (documents of kind [`DocKind::OtaPackage`]) and bytes ([`DocKind::OtaData`], stored once
//! with their checksum), which devices they are assigned to (a device's own
//! `firmwareId`/`softwareId`, else its profile's), the `fw_*`/`sw_*` shared attributes that
//! tell a device, and the bytes devices download in chunks over any transport.
//!
//! Packages are tenant entities: a tenant administrator manages them; a device gets only
//! the package assigned to it, whatever it asks for.

use std::collections::HashMap;

use bytes::Bytes;
use gridlinks_ingest::Item;
use gridlinks_storage::{DeviceRecord, DocKind, DocRecord, ProfileRecord, WriteOp};
use gridlinks_types::{AttributeScope, DeviceId, ProfileId, Value};
use parking_lot::Mutex;
use serde_json::{Map, Value as J};
use sha2::Digest;
use uuid::Uuid;

use super::{blocking, hidden, written_doc, ServiceError, ServiceResult};
use crate::auth::Caller;
use crate::core::{Core, Platform};

/// Firmware or software.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OtaType {
    /// `FIRMWARE`: `firmwareId`, `fw_*` attributes, `v2/fw/…` topics.
    Firmware,
    /// `SOFTWARE`: `softwareId`, `sw_*` attributes, `v2/sw/…` topics.
    Software,
}

impl OtaType {
    /// ThingsBoard's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Firmware => "FIRMWARE",
            Self::Software => "SOFTWARE",
        }
    }

    /// From ThingsBoard's name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "FIRMWARE" => Some(Self::Firmware),
            "SOFTWARE" => Some(Self::Software),
            _ => None,
        }
    }

    /// The attribute prefix: `fw` or `sw`.
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Firmware => "fw",
            Self::Software => "sw",
        }
    }

    /// The assignment field of a device or profile: `firmwareId` or `softwareId`.
    pub fn field(self) -> &'static str {
        match self {
            Self::Firmware => "firmwareId",
            Self::Software => "softwareId",
        }
    }

    /// Both.
    pub const ALL: [OtaType; 2] = [Self::Firmware, Self::Software];
}

/// The shared attributes a device is told about its package (ThingsBoard's names).
fn attribute_keys(t: OtaType) -> Vec<String> {
    ["title", "version", "tag", "size", "checksum_algorithm", "checksum", "url"]
        .iter()
        .map(|k| format!("{}_{k}", t.prefix()))
        .collect()
}

/// Packages' bytes kept in memory for devices' chunk requests, up to a byte budget.
#[derive(Default)]
pub struct DataCache {
    held: Mutex<(HashMap<Uuid, Bytes>, usize)>,
}

/// Bytes of package data kept in memory at most (a package larger than this is read from
/// storage for each chunk).
const CACHE_BYTES: usize = 256 * 1024 * 1024;

impl DataCache {
    fn forget(&self, id: Uuid) {
        let mut held = self.held.lock();
        if let Some(b) = held.0.remove(&id) {
            held.1 -= b.len();
        }
    }
}

/// The description of a package: its tenant's, or not found.
pub async fn get(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<DocRecord> {
    let store = core.store.clone();
    let missing = || ServiceError::NotFound(format!("OtaPackage with id [{id}] is not found"));
    let d = blocking(move || store.doc(DocKind::OtaPackage, id)).await?.ok_or_else(missing)?;
    let tenant = core.doc_tenant(&d);
    if !me.may_use(tenant, None) || me.customer.is_some() {
        return Err(hidden(me, tenant, missing));
    }
    Ok(d)
}

/// Which packages the caller's lists show: its tenant's; of one profile and type (with
/// data only) when given. Customer users see none.
pub fn listed<'a>(
    core: &'a Core,
    me: &'a Caller,
    of: Option<(ProfileId, OtaType)>,
) -> ServiceResult<impl Fn(&DocRecord) -> bool + 'a> {
    if me.customer.is_some() {
        return Err(ServiceError::Forbidden);
    }
    Ok(move |d: &DocRecord| {
        core.doc_tenant(d) == me.tenant
            && of.is_none_or(|(profile, t)| {
                profile_of(d) == Some(profile) && type_of(d) == Some(t) && d.doc["hasData"].as_bool() == Some(true)
            })
    })
}

fn profile_of(d: &DocRecord) -> Option<ProfileId> {
    d.doc["deviceProfileId"]["id"].as_str()?.parse().ok().map(ProfileId)
}

/// A package's type.
pub fn type_of(d: &DocRecord) -> Option<OtaType> {
    OtaType::parse(d.doc["type"].as_str()?)
}

fn text(doc: &J, field: &str, required: bool) -> ServiceResult<Option<String>> {
    match doc.get(field) {
        None | Some(J::Null) if !required => Ok(None),
        Some(J::String(s)) if !s.trim().is_empty() && s.chars().count() <= 255 && !s.chars().any(char::is_control) => {
            Ok(Some(s.clone()))
        }
        _ => Err(ServiceError::Invalid(format!(
            "OtaPackage {field} should be specified: 1 to 255 characters, without control characters"
        ))),
    }
}

/// Creates (no `id` in `doc`) or updates a package description of the caller's tenant:
/// `title`, `version`, `type`, `deviceProfileId` (a profile of the tenant), optional `tag`,
/// `url`, `additionalInfo`. The data fields come only with the upload; a package with data
/// keeps its title, version, type and profile.
pub async fn save(core: &Core, me: &Caller, mut doc: J) -> ServiceResult<DocRecord> {
    if me.customer.is_some() {
        return Err(ServiceError::Forbidden);
    }
    let Some(obj) = doc.as_object_mut() else {
        return Err(ServiceError::Invalid("Invalid request body: an OTA package is a JSON object".into()));
    };
    let id = match obj.remove("id") {
        Some(J::Object(i)) => Some(
            i.get("id")
                .and_then(J::as_str)
                .and_then(|s| s.parse::<Uuid>().ok())
                .ok_or_else(|| ServiceError::Invalid("invalid id".into()))?,
        ),
        _ => None,
    };
    for f in ["createdTime", "tenantId", "name"] {
        obj.remove(f);
    }
    // Another tenant's package does not exist for the caller, whatever else the body says.
    let old = match id {
        Some(id) => Some(get(core, me, id).await?),
        None => None,
    };
    let title = text(&doc, "title", true)?.unwrap_or_default();
    let version = text(&doc, "version", true)?.unwrap_or_default();
    text(&doc, "tag", false)?;
    if doc.get("url").is_some_and(|u| !u.is_null()) {
        text(&doc, "url", false)?;
    }
    let t = doc["type"]
        .as_str()
        .and_then(OtaType::parse)
        .ok_or_else(|| ServiceError::Invalid("Type should be specified: FIRMWARE or SOFTWARE".into()))?;
    let profile = doc["deviceProfileId"]["id"]
        .as_str()
        .and_then(|s| s.parse::<Uuid>().ok())
        .ok_or_else(|| ServiceError::Invalid("OtaPackage should be assigned to device profile!".into()))?;
    super::profiles::get(core, me, ProfileId(profile)).await.map_err(|e| match e {
        ServiceError::NotFound(_) | ServiceError::Forbidden => {
            ServiceError::Invalid("OtaPackage is referencing to non-existent device profile!".into())
        }
        e => e,
    })?;
    if let Some(old) = old {
        let same = |f: &str| old.doc.get(f) == doc.get(f);
        if old.doc["hasData"].as_bool() == Some(true)
            && !(same("title") && same("version") && same("type") && profile_of(&old) == Some(ProfileId(profile)))
        {
            return Err(ServiceError::Invalid(
                "Updating the title, version, type or device profile of an OTA package with data is prohibited!".into(),
            ));
        }
    }
    if let Some(o) = doc.as_object_mut() {
        o.insert("type".into(), t.name().into());
    }
    core.set_doc_tenant(&mut doc, me.tenant);
    // Title and version together are unique in a tenant (the writer checks the pair).
    let pair = J::from(vec![title, version]).to_string();
    let written = core.writer.submit(WriteOp::SaveDoc { kind: DocKind::OtaPackage, id, title: pair, doc }).await;
    written_doc(written.map_err(|e| match e {
        gridlinks_storage::StoreError::TitleTaken(_) => {
            gridlinks_storage::StoreError::Invalid("OtaPackage with such title and version already exists!".into())
        }
        e => e,
    })?)
}

/// The checksum of `data` with ThingsBoard's algorithm name, lower-case hex.
pub fn checksum(algorithm: &str, data: &[u8]) -> ServiceResult<String> {
    let digest = match algorithm {
        "SHA256" => sha2::Sha256::digest(data).to_vec(),
        "SHA384" => sha2::Sha384::digest(data).to_vec(),
        "SHA512" => sha2::Sha512::digest(data).to_vec(),
        "MD5" => <md5::Md5 as md5::Digest>::digest(data).to_vec(),
        other => {
            return Err(ServiceError::Invalid(format!(
                "checksumAlgorithm {other} is not supported (SHA256, SHA384, SHA512, MD5)"
            )))
        }
    };
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// What an upload says about its file.
pub struct Upload {
    /// The bytes.
    pub data: Bytes,
    /// `checksumAlgorithm` (default `SHA256`).
    pub algorithm: Option<String>,
    /// `checksum`: when given, the data must have it.
    pub checksum: Option<String>,
    /// The file's name.
    pub file_name: String,
    /// Its content type.
    pub content_type: String,
}

/// Stores the bytes of a package of the caller's tenant, once.
pub async fn upload(core: &Core, me: &Caller, id: Uuid, up: Upload) -> ServiceResult<DocRecord> {
    get(core, me, id).await?;
    if up.data.is_empty() {
        return Err(ServiceError::Invalid("OtaPackage data should be specified!".into()));
    }
    if up.data.len() > core.cfg.ota.max_package_bytes {
        return Err(ServiceError::Invalid(format!(
            "OtaPackage data is larger than ota.max_package_bytes ({} bytes)",
            core.cfg.ota.max_package_bytes
        )));
    }
    let algorithm = up.algorithm.unwrap_or_else(|| "SHA256".into()).to_ascii_uppercase();
    let data = up.data.clone();
    let alg = algorithm.clone();
    let sum = tokio::task::spawn_blocking(move || checksum(&alg, &data))
        .await
        .map_err(|_| gridlinks_storage::StoreError::Closed)??;
    if up.checksum.as_ref().is_some_and(|c| !c.eq_ignore_ascii_case(&sum)) {
        return Err(ServiceError::Invalid("Wrong otaPackage checksum!".into()));
    }
    let mut fields = Map::new();
    fields.insert("fileName".into(), up.file_name.into());
    fields.insert("contentType".into(), up.content_type.into());
    fields.insert("checksumAlgorithm".into(), algorithm.into());
    fields.insert("checksum".into(), sum.into());
    fields.insert("dataSize".into(), up.data.len().into());
    written_doc(core.writer.submit(WriteOp::PutOtaData { id, data: up.data.to_vec(), fields }).await?)
}

/// Deletes a package of the caller's tenant that no device or profile is assigned.
pub async fn delete(p: &Platform, me: &Caller, id: Uuid) -> ServiceResult<()> {
    let d = get(&p.core, me, id).await?;
    let store = p.core.store.clone();
    let wanted = J::String(id.to_string());
    let used = blocking(move || {
        let by_profile = store
            .profiles()?
            .iter()
            .any(|pr| OtaType::ALL.iter().any(|t| pr.doc.get(t.field()).and_then(|f| f.get("id")) == Some(&wanted)));
        Ok(by_profile || store.devices()?.iter().any(|dev| dev.firmware == Some(id) || dev.software == Some(id)))
    })
    .await?;
    if used {
        return Err(ServiceError::Invalid("The otaPackage referenced by the devices cannot be deleted!".into()));
    }
    p.core.writer.submit(WriteOp::DeleteDoc(DocKind::OtaPackage, d.id)).await?;
    p.ota.forget(d.id);
    Ok(())
}

/// The bytes of package `id` (from memory when they fit its budget).
pub async fn data(p: &Platform, id: Uuid) -> ServiceResult<Option<Bytes>> {
    if let Some(b) = p.ota.held.lock().0.get(&id) {
        return Ok(Some(b.clone()));
    }
    let store = p.core.store.clone();
    let Some(bytes) = blocking(move || store.ota_data(id)).await?.map(Bytes::from) else { return Ok(None) };
    let mut held = p.ota.held.lock();
    if held.1 + bytes.len() <= CACHE_BYTES && !held.0.contains_key(&id) {
        held.1 += bytes.len();
        held.0.insert(id, bytes.clone());
    }
    Ok(Some(bytes))
}

/// The package of type `t` assigned to `device`: its own, else its profile's.
pub fn assigned(core: &Core, device: &DeviceRecord, t: OtaType) -> ServiceResult<Option<DocRecord>> {
    let own = match t {
        OtaType::Firmware => device.firmware,
        OtaType::Software => device.software,
    };
    let id = match own {
        Some(id) => Some(id),
        None => core.store.profile(device.profile_id())?.and_then(|pr| {
            pr.doc.get(t.field()).and_then(|f| f.get("id")).and_then(J::as_str).and_then(|s| s.parse().ok())
        }),
    };
    match id {
        Some(id) => Ok(core.store.doc(DocKind::OtaPackage, id)?),
        None => Ok(None),
    }
}

/// The package `field` (`firmwareId`/`softwareId`) of a device or profile names, checked:
/// one of the caller's tenant, of type `t`, with data, for `profile`. `None`: no package.
pub async fn check_assignment(
    core: &Core,
    me: &Caller,
    t: OtaType,
    field: Option<&J>,
    profile: ProfileId,
) -> ServiceResult<Option<Uuid>> {
    let Some(id) = field.filter(|f| !f.is_null()) else { return Ok(None) };
    let id = id["id"].as_str().and_then(|s| s.parse::<Uuid>().ok()).ok_or_else(|| {
        ServiceError::Invalid(format!("{} must be {{\"entityType\":\"OTA_PACKAGE\",\"id\":…}}", t.field()))
    })?;
    let pkg = get(core, me, id)
        .await
        .map_err(|_| ServiceError::Invalid(format!("Can't assign {}: no OTA package {id}", t.name().to_lowercase())))?;
    if type_of(&pkg) != Some(t) {
        return Err(ServiceError::Invalid(format!(
            "Can't assign {} with type: {:?}",
            t.name().to_lowercase(),
            type_of(&pkg)
        )));
    }
    if pkg.doc["hasData"].as_bool() != Some(true) && pkg.doc.get("url").is_none_or(J::is_null) {
        return Err(ServiceError::Invalid(format!("Can't assign {} with empty data!", t.name().to_lowercase())));
    }
    if profile_of(&pkg) != Some(profile) {
        return Err(ServiceError::Invalid(format!(
            "Can't assign {} with different deviceProfile!",
            t.name().to_lowercase()
        )));
    }
    Ok(Some(id))
}

/// Sets `device`'s own packages from its JSON's `firmwareId`/`softwareId` (null or absent:
/// none, its profile's apply), checked as [`check_assignment`]. When that changes what the
/// device is assigned, or the device is new or changed profile (`moved`), it is told
/// ([`notify`]).
pub async fn assign_device(
    p: &Platform,
    me: &Caller,
    device: DeviceRecord,
    firmware: Option<&J>,
    software: Option<&J>,
    moved: bool,
) -> ServiceResult<DeviceRecord> {
    let profile = device.profile_id();
    let fw = check_assignment(&p.core, me, OtaType::Firmware, firmware, profile).await?;
    let sw = check_assignment(&p.core, me, OtaType::Software, software, profile).await?;
    if (fw, sw) == (device.firmware, device.software) {
        if moved {
            notify(p, vec![device.clone()]).await?;
        }
        return Ok(device);
    }
    let op = WriteOp::SetDeviceOta { device: device.id, firmware: fw, software: sw };
    let d = match p.core.writer.submit(op).await? {
        gridlinks_storage::WriteOutcome::Device(d) => *d,
        _ => return Err(gridlinks_storage::StoreError::Corrupt("unexpected write outcome").into()),
    };
    notify(p, vec![d.clone()]).await?;
    Ok(d)
}

/// Checks the `firmwareId`/`softwareId` of profile `id`'s JSON before it is saved (a new
/// profile can have none: a package names its profile).
pub async fn check_profile(core: &Core, me: &Caller, id: Option<ProfileId>, doc: &J) -> ServiceResult<()> {
    for t in OtaType::ALL {
        match id {
            Some(id) => {
                check_assignment(core, me, t, doc.get(t.field()), id).await?;
            }
            None if doc.get(t.field()).is_some_and(|f| !f.is_null()) => {
                return Err(ServiceError::Invalid(format!(
                    "Can't assign {} to a new device profile: create the profile first",
                    t.name().to_lowercase()
                )))
            }
            None => {}
        }
    }
    Ok(())
}

/// After profile `id` was saved: when its assignments differ from `before`'s, the devices
/// that follow it are told.
pub async fn profile_saved(p: &Platform, id: ProfileId, before: Option<&J>, after: &J) -> ServiceResult<()> {
    let changed = OtaType::ALL.iter().any(|t| {
        before.and_then(|b| b.get(t.field())).filter(|f| !f.is_null()) != after.get(t.field()).filter(|f| !f.is_null())
    });
    if changed {
        notify(p, followers(&p.core, id).await?).await?;
    }
    Ok(())
}

/// Tells devices just made some other way than a REST save (provisioned, created or
/// adopted by a gateway, imported) their profile's packages, as a saved device is told:
/// only devices whose profile assigns a package are read and told.
pub async fn created(p: &Platform, ids: Vec<DeviceId>) -> ServiceResult<()> {
    let store = p.core.store.clone();
    let devices = blocking(move || {
        let profiles = store.profiles()?;
        let assigns = |profile: ProfileId| profiles.iter().find(|pr| pr.id == profile).is_some_and(assigns_package);
        let mut out = Vec::new();
        for id in ids {
            out.extend(store.device(id)?.filter(|d| assigns(d.profile_id())));
        }
        Ok(out)
    })
    .await?;
    notify(p, devices).await
}

/// Whether a profile assigns a firmware or software package.
fn assigns_package(pr: &ProfileRecord) -> bool {
    OtaType::ALL.iter().any(|t| pr.doc.get(t.field()).and_then(|f| f.get("id")).is_some_and(|id| !id.is_null()))
}

/// Whether any device profile assigns a package (when none does, nothing needs telling).
pub fn any_assigned(core: &Core) -> ServiceResult<bool> {
    Ok(core.store.profiles()?.iter().any(assigns_package))
}

/// Tells `devices` the packages now assigned to them: the `fw_*`/`sw_*` shared attributes
/// of each assigned package are stored and pushed (a device's own session, or its
/// gateway's); where none is assigned any more they are deleted (and the deletion
/// pushed). Run after a device's or profile's assignment changed.
pub async fn notify(p: &Platform, devices: Vec<DeviceRecord>) -> ServiceResult<()> {
    for d in devices {
        for t in OtaType::ALL {
            match assigned(&p.core, &d, t)? {
                Some(pkg) => {
                    let values = package_attributes(t, &pkg);
                    p.core
                        .ingest
                        .submit_one(Item::Attributes {
                            device: d.id,
                            scope: AttributeScope::Shared,
                            values: values.clone(),
                        })
                        .await
                        .map_err(|e| ServiceError::Internal(e.to_string()))?;
                    p.devices.push_shared(d.id, &values);
                }
                None => {
                    let keys = attribute_keys(t);
                    let store = p.core.store.clone();
                    let (id, probe) = (d.id, keys.clone());
                    let had =
                        blocking(move || store.attributes(id, Some(AttributeScope::Shared), Some(&probe))).await?;
                    if had.is_empty() {
                        continue;
                    }
                    let keys: Vec<String> = had.into_iter().map(|a| a.key).collect();
                    p.core
                        .ingest
                        .submit_one(Item::DeleteAttributes {
                            device: d.id,
                            scope: AttributeScope::Shared,
                            keys: keys.clone(),
                        })
                        .await
                        .map_err(|e| ServiceError::Internal(e.to_string()))?;
                    p.devices.push_deleted(d.id, &keys);
                }
            }
        }
    }
    Ok(())
}

/// The `fw_*`/`sw_*` attributes of a package, as ThingsBoard sets them.
fn package_attributes(t: OtaType, pkg: &DocRecord) -> Vec<(String, Value)> {
    let pre = t.prefix();
    let mut out = Vec::new();
    let mut text = |k: &str, field: &str| {
        if let Some(v) = pkg.doc.get(field).and_then(J::as_str) {
            out.push((format!("{pre}_{k}"), Value::Str(v.into())));
        }
    };
    text("title", "title");
    text("version", "version");
    text("tag", "tag");
    text("url", "url");
    text("checksum_algorithm", "checksumAlgorithm");
    text("checksum", "checksum");
    if let Some(size) = pkg.doc.get("dataSize").and_then(J::as_i64) {
        out.push((format!("{pre}_size"), Value::Long(size)));
    }
    out
}

/// The devices of profile `profile`.
async fn followers(core: &Core, profile: ProfileId) -> ServiceResult<Vec<DeviceRecord>> {
    let store = core.store.clone();
    Ok(blocking(move || store.devices()).await?.into_iter().filter(|d| d.profile_id() == profile).collect())
}

/// Chunk `chunk` of `size` bytes (0: the whole package) of the package of type `t`
/// assigned to `device`: `None` when none is assigned or it has no data. A chunk past
/// the end is empty (ThingsBoard's clients ask for one more than there are).
pub async fn device_chunk(
    p: &Platform,
    device: DeviceId,
    t: OtaType,
    size: usize,
    chunk: usize,
) -> ServiceResult<Option<(DocRecord, Bytes)>> {
    let store = p.core.store.clone();
    let Some(d) = blocking(move || store.device(device)).await? else { return Ok(None) };
    let Some(pkg) = assigned(&p.core, &d, t)? else { return Ok(None) };
    let Some(bytes) = data(p, pkg.id).await? else { return Ok(None) };
    if size == 0 {
        let whole = if chunk == 0 { bytes } else { Bytes::new() };
        return Ok(Some((pkg, whole)));
    }
    let start = size.saturating_mul(chunk).min(bytes.len());
    let end = start.saturating_add(size).min(bytes.len());
    Ok(Some((pkg, bytes.slice(start..end))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_as_thingsboard_names_them() {
        assert_eq!(
            checksum("SHA256", b"abc").unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(checksum("MD5", b"abc").unwrap(), "900150983cd24fb0d6963f7d28e17f72");
        assert!(checksum("CRC32", b"abc").is_err());
    }
}
