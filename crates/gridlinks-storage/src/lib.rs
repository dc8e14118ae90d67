//! GridLinks' embedded storage. It owns everything on disk under the data directory:
//! devices (with their name and access-token indexes), device profiles, telemetry time series, the
//! latest value of every (device, key), and attributes in three scopes.
//!
//! Layout (one [fjall] database, one keyspace per kind of row):
//!
//! | keyspace  | key                          | value                                   |
//! |-----------|------------------------------|-----------------------------------------|
//! | `devices` | device id (16 B)             | [`DeviceRecord`] as JSON                |
//! | `names`   | device name                  | device id                               |
//! | `gateways`| gateway id ‖ device id       | empty: the device belongs to the gateway |
//! | `tokens`  | access token                 | device id                               |
//! | `identities` | protocol ‖ 0 ‖ identity   | device id (custom TCP protocols' devices) |
//! | `profiles` | profile id (16 B)           | [`ProfileRecord`] as JSON               |
//! | `docs`    | kind (1 B) ‖ id (16 B)       | [`DocRecord`] as JSON (dashboards, API keys, customers) |
//! | `basic`   | `u` ‖ user name, or `c` ‖ client id | device id (MQTT_BASIC credentials) |
//! | `ts`      | device id ‖ ts (BE, 8 B)     | every (key, value) reported at that ts  |
//! | `latest`  | device id                    | (key, ts, value) for every key          |
//! | `attrs`   | device id ‖ scope ‖ key name | (last update ts, value)                 |
//! | `keys`    | key name                     | interned key id (u32 BE)                |
//! | `meta`    | setting name                 | format version, secrets                 |
//! | `broker`  | table byte ‖ key             | the MQTT broker's rows, opaque here     |
//! | `settings`| setting name                 | settings every node shares (first tenant, generated password hashes) |
//!
//! The broker's rows ([`BrokerTable`]: retained messages, application credentials) are
//! bytes the broker encodes; the store keeps them and commits them with everything else.
//!
//! One message therefore costs one `ts` row — not one row per point. The `latest` row of a
//! device is a checkpoint the writer rewrites lazily (every 32 messages or 10 s of a device,
//! at once for a point older than the checkpoint); readers merge it with the `ts` rows newer
//! than its newest point ([`Store::latest`]). Writing the same (device, ts) twice merges the rows,
//! so a point keyed by (device, key, ts) is stored once (idempotent redelivery).
//!
//! All writes go through one [`writer`] thread that groups the requests of many
//! connections into one commit and one fsync (group commit) and answers each request
//! only once its data is durable. Reads go straight to the database from any thread.
//!
//! Health ([`Health`]): the writer keeps `min_free_bytes` free on the data directory's
//! file system (`space`: statvfs, read at most every 100 ms) and refuses writes, not
//! deletes, below it ([`StoreError::DiskFull`]). A write the engine itself fails (it then
//! refuses writes for good) marks the store failed; once there is room again the writer
//! closes the engine and opens it again from disk, recovering its journal, without a
//! restart. Reads go on throughout.
//!
//! Shared entities ([`replica`]): with a [`replica::Replica`] attached, the rows of the
//! entity keyspaces (all above but `ts`, `latest`, `keys` and `meta`) that a write changes
//! are published to it under the cluster's write lock before they are committed here, and
//! what other nodes published is applied first.

pub mod codec;
pub mod histogram;
mod keydict;
pub mod outbox;
pub mod query;
pub mod replica;
mod space;
pub mod timeseries;
pub mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions};
use gridlinks_types::{AttributeScope, DeviceId, ProfileId, ProtocolIdentity, Ts, Value};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::codec::KeyId;
use crate::keydict::KeyDict;

pub use outbox::{OutboxEntry, OutboxEvent, OutboxFilter, Trimmed};
pub use timeseries::Timeseries;
pub use writer::{
    adoption_allowed, BrokerRow, DeleteTelemetry, ImportOutcome, ImportRow, SaveDevice, SaveProfile, TenantCaps,
    WriteOp, WriteOutcome, WriterConfig, WriterHandle, GATEWAY_ADOPTION,
};

/// Version of the on-disk layout, kept in `meta` under [`FORMAT_KEY`].
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_KEY: &str = "format_version";

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The underlying database failed (I/O, or poisoned after an fsync failure).
    #[error("storage failure: {0}")]
    Db(#[from] fjall::Error),
    /// Stored bytes did not decode.
    #[error("corrupt data: {0}")]
    Corrupt(&'static str),
    /// The data directory holds a layout this version cannot read.
    #[error("data directory has format version {found}, this build reads {FORMAT_VERSION}")]
    Format {
        /// The version found on disk.
        found: u32,
    },
    /// A device with this name exists already.
    #[error("device with name '{0}' already exists")]
    NameTaken(String),
    /// Another device uses this access token.
    #[error("Device credentials are already assigned to another device!")]
    TokenTaken,
    /// Another device has this protocol identity.
    #[error("Device credentials are already assigned to another device! (protocol identity {0})")]
    IdentityTaken(String),
    /// The device does not exist (or was deleted).
    #[error("device not found")]
    DeviceNotFound,
    /// No document of this kind has this id.
    #[error("{kind} with id [{1}] is not found", kind = .0.name())]
    DocNotFound(DocKind, uuid::Uuid),
    /// Another document of this kind has this title (customers, users by email).
    #[error("{kind} with such {what} already exists!", kind = .0.name(), what = .0.title_name())]
    TitleTaken(DocKind),
    /// No device profile has this id.
    #[error("Device profile with id [{0}] is not found")]
    ProfileNotFound(ProfileId),
    /// Another device profile has this name.
    #[error("Device profile with such name already exists!")]
    ProfileNameTaken(String),
    /// Devices use the profile.
    #[error("The device profile referenced by the devices cannot be deleted!")]
    ProfileInUse,
    /// The default profile cannot be deleted.
    #[error("Deletion of Default Device Profile is prohibited!")]
    ProfileIsDefault,
    /// A gateway wrote to a device it does not own and may not adopt.
    #[error("device '{0}' belongs to another gateway, is a gateway, or may not be adopted by this gateway")]
    ForeignDevice(String),
    /// A device access token and an MQTT application user name would be equal: the broker
    /// could not tell a device from an application.
    #[error("{0}")]
    CredentialClash(String),
    /// A device used as a gateway is not one (`additionalInfo.gateway` is not true).
    #[error("device is not a gateway (additionalInfo.gateway is not true)")]
    NotGateway,
    /// The write queue stayed full for longer than the enqueue timeout.
    #[error("storage is overloaded, retry later")]
    Overloaded,
    /// The writer has stopped (shutdown or a fatal storage failure).
    #[error("storage writer is not running")]
    Closed,
    /// The store is being reopened after a failure; retry shortly.
    #[error("storage is being reopened after a failure; retry shortly")]
    Unavailable,
    /// The commit log in front of the store (Kafka) did not take the write; retry.
    #[error("commit log unavailable: {0}")]
    Queue(String),
    /// A shared database (PostgreSQL, Cassandra) did not answer or refused; retry.
    #[error("database unavailable: {0}")]
    Database(String),
    /// The data directory's file system is (nearly) full: writes are refused until space
    /// is freed; reads go on.
    #[error("disk full: {0}")]
    DiskFull(String),
    /// A commit or fsync failed; the data of this request is not durable.
    #[error("commit failed: {0}")]
    CommitFailed(String),
    /// A request asked for more than the configured bounds allow.
    #[error("{0}")]
    Limit(String),
    /// A tenant has as many entities of a kind as it may (its tenant profile or the
    /// configuration says how many).
    #[error("{0}")]
    EntitiesLimit(String),
    /// A device field is not acceptable (blank or too long name, control characters).
    #[error("{0}")]
    Invalid(String),
}

impl StoreError {
    /// The same error for another request (an engine error becomes its text).
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Self::Db(e) => Self::CommitFailed(e.to_string()),
            Self::Corrupt(m) => Self::Corrupt(m),
            Self::Format { found } => Self::Format { found: *found },
            Self::NameTaken(n) => Self::NameTaken(n.clone()),
            Self::TokenTaken => Self::TokenTaken,
            Self::IdentityTaken(m) => Self::IdentityTaken(m.clone()),
            Self::DeviceNotFound => Self::DeviceNotFound,
            Self::ProfileNotFound(id) => Self::ProfileNotFound(*id),
            Self::DocNotFound(k, id) => Self::DocNotFound(*k, *id),
            Self::TitleTaken(k) => Self::TitleTaken(*k),
            Self::ProfileNameTaken(n) => Self::ProfileNameTaken(n.clone()),
            Self::ProfileInUse => Self::ProfileInUse,
            Self::ProfileIsDefault => Self::ProfileIsDefault,
            Self::ForeignDevice(n) => Self::ForeignDevice(n.clone()),
            Self::CredentialClash(m) => Self::CredentialClash(m.clone()),
            Self::NotGateway => Self::NotGateway,
            Self::Overloaded => Self::Overloaded,
            Self::Closed => Self::Closed,
            Self::Unavailable => Self::Unavailable,
            Self::Queue(m) => Self::Queue(m.clone()),
            Self::Database(m) => Self::Database(m.clone()),
            Self::DiskFull(m) => Self::DiskFull(m.clone()),
            Self::CommitFailed(m) => Self::CommitFailed(m.clone()),
            Self::Limit(m) => Self::Limit(m.clone()),
            Self::EntitiesLimit(m) => Self::EntitiesLimit(m.clone()),
            Self::Invalid(m) => Self::Invalid(m.clone()),
        }
    }
}

/// A device as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// Its id.
    pub id: DeviceId,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Unique name.
    pub name: String,
    /// Device type (ThingsBoard's device profile name; `default` when none is given).
    pub device_type: String,
    /// Free-text label.
    pub label: Option<String>,
    /// The access token devices authenticate with.
    pub token: String,
    /// Arbitrary JSON kept for the user (ThingsBoard's `additionalInfo`).
    pub additional_info: Option<serde_json::Value>,
    /// The gateway that created this device, or that an administrator assigned it to
    /// (ThingsBoard's "Created" relation): the only gateway that may write to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<DeviceId>,
    /// How a device protocol without tokens knows the device (custom TCP protocols): a
    /// credential beside the access token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<ProtocolIdentity>,
    /// The customer it is assigned to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer: Option<uuid::Uuid>,
    /// MQTT_BASIC credentials, when the device has them instead of a usable access token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicCredentials>,
    /// Its device profile. Devices stored before profiles were entities have none: theirs
    /// is the profile created for their type ([`ProfileId::for_name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileId>,
    /// Its tenant; `None` is the installation's first tenant (every device stored before
    /// tenants existed is one of its).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<uuid::Uuid>,
    /// X509_CERTIFICATE credentials, when the device has them instead of a usable access
    /// token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x509: Option<X509Credentials>,
    /// Its own firmware OTA package (ThingsBoard's `firmwareId`); none: its profile's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<uuid::Uuid>,
    /// Its own software OTA package (`softwareId`); none: its profile's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub software: Option<uuid::Uuid>,
}

/// A device's X.509 certificate, as ThingsBoard keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct X509Credentials {
    /// The SHA3-256 of `cert`, lower-case hex (ThingsBoard's `credentialsId`).
    pub fingerprint: String,
    /// The certificate's PEM body without its BEGIN/END lines and line breaks.
    pub cert: String,
}

impl X509Credentials {
    /// Its key in the `basic` index (beside MQTT_BASIC's `u…` and `c…` keys).
    pub(crate) fn index_key(&self) -> Vec<u8> {
        [b"x".as_slice(), self.fingerprint.as_bytes()].concat()
    }
}

impl DeviceRecord {
    /// Its device profile's id.
    pub fn profile_id(&self) -> ProfileId {
        self.profile.unwrap_or_else(|| ProfileId::for_name(&self.device_type))
    }

    /// Whether the device is a gateway (ThingsBoard's `additionalInfo.gateway: true`), so
    /// that it may use the gateway API.
    pub fn is_gateway(&self) -> bool {
        self.additional_info
            .as_ref()
            .and_then(|i| i.get("gateway"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }
}

/// ThingsBoard's MQTT_BASIC device credentials: a client id, a user name or both, and an
/// optional password (kept as an argon2 PHC string, never in the clear).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BasicCredentials {
    /// The MQTT client id the device must use, if any.
    pub client_id: Option<String>,
    /// The MQTT user name, if any (at least one of the two).
    pub user_name: Option<String>,
    /// The password's argon2 hash; `None`: no password.
    pub password_hash: Option<String>,
}

impl BasicCredentials {
    /// The `basic` index key: by user name, or by client id when there is none.
    pub(crate) fn index_key(&self) -> Option<Vec<u8>> {
        match (&self.user_name, &self.client_id) {
            (Some(u), _) => Some([b"u".as_slice(), u.as_bytes()].concat()),
            (None, Some(c)) => Some([b"c".as_slice(), c.as_bytes()].concat()),
            (None, None) => None,
        }
    }
}

/// A device profile (ThingsBoard's `DeviceProfile`). Devices reference it by id; their
/// `type` is its name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileRecord {
    /// Its id.
    pub id: ProfileId,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Unique name.
    pub name: String,
    /// The tenant's default profile (exactly one of each tenant's is).
    pub default: bool,
    /// Its tenant; `None` is the installation's first tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<uuid::Uuid>,
    /// Everything else the client gave, kept as given: `description`, `type`,
    /// `transportType`, `provisionType`, `profileData` (alarm rules included),
    /// `provisionDeviceKey`, `image`, … (an object).
    pub doc: serde_json::Value,
}

/// Entities stored as documents: an id, a title and the client's JSON ([`DocRecord`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DocKind {
    /// ThingsBoard dashboards.
    Dashboard = 1,
    /// API keys (their SHA-256, never the key).
    ApiKey = 2,
    /// Customers.
    Customer = 3,
    /// Tenant administrators and customer users (title: the email, lower case).
    User = 4,
    /// A user's password hash and activation (same id as the user; never sent to clients).
    UserCredentials = 5,
    /// Tenants.
    Tenant = 6,
    /// OTA packages' descriptions (ThingsBoard's `OtaPackageInfo`; title: `[title,version]`
    /// as JSON, unique in a tenant).
    OtaPackage = 7,
    /// An OTA package's bytes, as uploaded (same id as the package; raw bytes, not a
    /// [`DocRecord`]: read with [`Store::ota_data`]).
    OtaData = 8,
    /// Assets (title: the name, unique in a tenant). An asset holds attributes and time
    /// series under its id, as a device does.
    Asset = 9,
    /// Asset profiles (title: the name, unique in a tenant; an asset's type is its
    /// profile's name).
    AssetProfile = 10,
    /// Relations between entities (id: derived from its ends, type and group, so it is one of a kind).
    Relation = 11,
    /// ThingsBoard's tenant profiles (title: the name, unique): the limits of the tenants
    /// that have them.
    TenantProfile = 12,
    /// Alarms (title: the alarm type; `gridlinks_platform::alarms` keeps them indexed).
    Alarm = 13,
    /// Comments on alarms (title: the alarm's id).
    AlarmComment = 14,
    /// A device's alarm rule states (`DURATION`, `REPEATING` progress; same id as the device).
    AlarmRuleState = 15,
    /// Notification targets (title: the name): who or where notifications go.
    NotificationTarget = 16,
    /// Notification templates (title: the name).
    NotificationTemplate = 17,
    /// Notification rules (title: the name): which events notify which targets.
    NotificationRule = 18,
    /// Notification requests: one rule's notification of one event and its deliveries (the
    /// delivery log).
    NotificationRequest = 19,
    /// A user's inbox notification (title: the recipient's id).
    Notification = 20,
    /// A data forwarding sink (title: the name): where committed data is sent on.
    DataSink = 21,
}

impl DocKind {
    /// As ThingsBoard's messages name it.
    pub fn name(self) -> &'static str {
        match self {
            DocKind::Dashboard => "Dashboard",
            DocKind::ApiKey => "API key",
            DocKind::Customer => "Customer",
            DocKind::User => "User",
            DocKind::UserCredentials => "User credentials",
            DocKind::Tenant => "Tenant",
            DocKind::OtaPackage => "OTA package",
            DocKind::OtaData => "OTA package data",
            DocKind::Asset => "Asset",
            DocKind::AssetProfile => "Asset profile",
            DocKind::Relation => "Relation",
            DocKind::TenantProfile => "Tenant profile",
            DocKind::Alarm => "Alarm",
            DocKind::AlarmComment => "Alarm comment",
            DocKind::AlarmRuleState => "Alarm rule state",
            DocKind::NotificationTarget => "Notification target",
            DocKind::NotificationTemplate => "Notification template",
            DocKind::NotificationRule => "Notification rule",
            DocKind::NotificationRequest => "Notification request",
            DocKind::Notification => "Notification",
            DocKind::DataSink => "Data sink",
        }
    }

    /// What its title is called in messages.
    pub fn title_name(self) -> &'static str {
        match self {
            DocKind::User => "email",
            DocKind::Asset
            | DocKind::AssetProfile
            | DocKind::TenantProfile
            | DocKind::NotificationTarget
            | DocKind::NotificationTemplate
            | DocKind::NotificationRule
            | DocKind::DataSink => "name",
            _ => "title",
        }
    }

    /// Whether no two documents of this kind may have the same title (the writer checks
    /// it, so two concurrent saves cannot both pass).
    pub(crate) fn unique_titles(self) -> bool {
        matches!(
            self,
            DocKind::Customer
                | DocKind::User
                | DocKind::OtaPackage
                | DocKind::Asset
                | DocKind::AssetProfile
                | DocKind::TenantProfile
        )
    }

    /// Fields of the document only the server writes (a client's copy is ignored).
    pub(crate) fn server_fields(self) -> &'static [&'static str] {
        match self {
            DocKind::Dashboard => &["assignedCustomerIds"],
            // Set by an upload only (`WriteOp::PutOtaData`).
            DocKind::OtaPackage => &OTA_DATA_FIELDS,
            DocKind::ApiKey
            | DocKind::Customer
            | DocKind::User
            | DocKind::UserCredentials
            | DocKind::Tenant
            | DocKind::OtaData
            | DocKind::Asset
            | DocKind::AssetProfile
            | DocKind::Relation
            | DocKind::TenantProfile
            | DocKind::Alarm
            | DocKind::AlarmComment
            | DocKind::AlarmRuleState
            | DocKind::NotificationTarget
            | DocKind::NotificationTemplate
            | DocKind::NotificationRule
            | DocKind::NotificationRequest
            | DocKind::Notification
            | DocKind::DataSink => &[],
        }
    }

    /// The row kept under the same id that goes with a document of this kind.
    pub(crate) fn companion(self) -> Option<DocKind> {
        match self {
            DocKind::User => Some(DocKind::UserCredentials),
            DocKind::OtaPackage => Some(DocKind::OtaData),
            _ => None,
        }
    }

    pub(crate) fn key(self, id: uuid::Uuid) -> Vec<u8> {
        let mut k = Vec::with_capacity(17);
        k.push(self as u8);
        k.extend_from_slice(id.as_bytes());
        k
    }
}

/// The fields of an OTA package's description that describe its data.
pub const OTA_DATA_FIELDS: [&str; 6] =
    ["hasData", "fileName", "contentType", "checksumAlgorithm", "checksum", "dataSize"];

/// An entity kept as a document (a dashboard: its title and configuration).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocRecord {
    /// Its id.
    pub id: uuid::Uuid,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Its title.
    pub title: String,
    /// Everything else the client gave, kept as given (an object).
    pub doc: serde_json::Value,
}

/// The name of the profile every installation starts with.
pub const DEFAULT_PROFILE: &str = "default";

/// An attribute as read back.
#[derive(Clone, Debug, PartialEq)]
pub struct AttributeEntry {
    /// Which scope it lives in.
    pub scope: AttributeScope,
    /// Its key.
    pub key: String,
    /// When it was last written (ms since epoch, server time).
    pub last_update_ts: Ts,
    /// Its value.
    pub value: Value,
}

/// A row's key and value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// The MQTT broker's tables in the `broker` keyspace (the byte is the key prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BrokerTable {
    /// Retained message per topic.
    Retained = 1,
    /// Application credentials per user name.
    Credentials = 2,
    /// Persistent MQTT sessions per client id (subscriptions, expiry).
    Sessions = 3,
    /// Durable queues of persistent sessions: client id ‖ 0 ‖ sequence number (8 B BE).
    Queue = 4,
    /// QoS 2 messages a persistent session's client published and has not released yet
    /// (PUBREC sent, PUBREL awaited): client id ‖ 0 ‖ packet id (2 B BE), empty value.
    Incoming = 5,
}

impl BrokerTable {
    pub(crate) fn key(self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(key.len() + 1);
        k.push(self as u8);
        k.extend_from_slice(key);
        k
    }
}

/// Options fixed when the store is opened.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Block cache size in bytes.
    pub cache_bytes: u64,
    /// Memtable size of the time-series keyspace, bytes (applies when it is created).
    pub memtable_bytes: u64,
    /// Most table files the engine keeps open at once (its descriptor cache).
    pub max_open_files: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self { cache_bytes: 64 * 1024 * 1024, memtable_bytes: 32 * 1024 * 1024, max_open_files: 256 }
    }
}

/// Memtable size of the small keyspaces (devices, names, tokens, attributes, …).
const SMALL_MEMTABLE_BYTES: u64 = 4 * 1024 * 1024;

pub(crate) struct Keyspaces {
    pub meta: Keyspace,
    pub devices: Keyspace,
    pub names: Keyspace,
    pub gateways: Keyspace,
    pub tokens: Keyspace,
    pub identities: Keyspace,
    pub profiles: Keyspace,
    pub docs: Keyspace,
    pub basic: Keyspace,
    pub ts: Keyspace,
    pub latest: Keyspace,
    pub attrs: Keyspace,
    pub keys: Keyspace,
    pub broker: Keyspace,
    pub settings: Keyspace,
    /// Committed writes for data forwarding, by sequence number ([`outbox`]).
    pub outbox: Keyspace,
}

/// Most cached access tokens; the cache is emptied when it would grow past this.
const TOKEN_CACHE_MAX: usize = 1_000_000;

#[derive(Default)]
pub(crate) struct TokenCache {
    map: RwLock<HashMap<String, DeviceId>>,
    /// Bumped after every commit that changes token ownership.
    generation: AtomicU64,
}

/// Device records by id, good while [`Store::devices_generation`] is `generation`.
#[derive(Default)]
struct DeviceCache {
    generation: u64,
    map: rustc_hash::FxHashMap<DeviceId, Arc<DeviceRecord>>,
}

/// Most device records [`Store::device_cached`] keeps (emptied when it would keep more).
const DEVICE_CACHE_MAX: usize = 1_000_000;

/// The open database and its keyspaces: replaced as a whole when the store is reopened.
pub(crate) struct Engine {
    pub db: Database,
    pub ks: Keyspaces,
}

/// A device's latest values as the store derives them: its checkpointed `latest` row
/// merged with the `ts` rows newer than that row's newest point.
pub(crate) struct DerivedLatest {
    /// (key, ts, value) per key.
    pub row: Vec<(KeyId, Ts, Value)>,
    /// The newest point in the checkpointed row (`i64::MIN` without one).
    pub checkpoint: Ts,
    /// `ts` rows newer than the checkpoint (merged into `row`).
    pub newer_rows: u32,
}

impl Engine {
    /// Every device profile, in id order.
    pub(crate) fn profiles(&self) -> Result<Vec<ProfileRecord>, StoreError> {
        self.ks.profiles.iter().map(|kv| decode_profile(&kv.into_inner()?.1)).collect()
    }

    /// A device by id.
    fn device(&self, id: DeviceId) -> Result<Option<DeviceRecord>, StoreError> {
        self.ks.devices.get(id.as_bytes())?.map(|v| decode_device(&v)).transpose()
    }

    /// The latest value of every key of `device`. The writer checkpoints a device's `latest`
    /// row lazily (see `writer`), keeping one invariant: every stored point that the row
    /// does not reflect is newer than the row's newest point. So the row, merged with the
    /// few `ts` rows after its newest point, is exact.
    pub(crate) fn latest(&self, device: DeviceId) -> Result<DerivedLatest, StoreError> {
        let mut row = match self.ks.latest.get(device.as_bytes())? {
            Some(v) => codec::decode_latest_row(&v)?,
            None => Vec::new(),
        };
        let checkpoint = row.iter().map(|e| e.1).max().unwrap_or(Ts(i64::MIN));
        let mut newer_rows = 0;
        if checkpoint < Ts(i64::MAX) {
            let (lo, hi) = (codec::ts_key(device, Ts(checkpoint.0 + 1)), codec::ts_key(device, Ts(i64::MAX)));
            // Newest first: the first value seen of a key is its latest.
            for kv in self.ks.ts.range(lo..=hi).rev() {
                let (k, v) = kv.into_inner()?;
                let ts = codec::ts_of_key(&k)?;
                newer_rows += 1;
                for (key, value) in codec::decode_ts_row(&v)? {
                    match row.iter_mut().find(|e| e.0 == key) {
                        Some(e) if e.1 < ts => *e = (key, ts, value),
                        Some(_) => {}
                        None => row.push((key, ts, value)),
                    }
                }
            }
        }
        Ok(DerivedLatest { row, checkpoint, newer_rows })
    }
}

/// Whether the store takes writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Health {
    /// Reads and writes.
    Ok = 0,
    /// The data directory's file system has less than the configured headroom free: writes
    /// (but deletes) are refused, before the engine runs out of space; reads go on.
    DiskFull = 1,
    /// A write or sync failed (the engine refuses writes from then on): writes are refused
    /// until the writer has reopened the store; reads go on.
    Failed = 2,
}

pub(crate) struct Inner {
    /// The engine in use; `None` only while it is being reopened.
    engine: RwLock<Option<Arc<Engine>>>,
    /// Access token → device, so device authentication costs no storage read.
    pub tokens: TokenCache,
    /// Device records as read, for [`Store::device_cached`].
    devices: RwLock<DeviceCache>,
    /// A [`Health`], set by the writer.
    pub health: std::sync::atomic::AtomicU8,
    /// Key-name dictionary shared by the writer (which interns) and readers (which resolve).
    pub keys: RwLock<KeyDict>,
    /// Every device profile, by name, read once ([`Store::profiles`]); emptied by the
    /// writer, under this lock, whenever it commits a profile change.
    profiles: RwLock<Option<Arc<Vec<ProfileRecord>>>>,
    /// Counts the emptyings of `profiles` ([`Store::profiles_generation`]).
    profiles_generation: AtomicU64,
    /// The replica of the shared rows this store follows (`cluster.entities`), if any.
    pub follower: parking_lot::Mutex<Option<replica::Follower>>,
    /// How many times other nodes' rows changed each shared keyspace
    /// ([`Store::remote_generation`]).
    pub remote_generations: [std::sync::atomic::AtomicU64; replica::SHARED.len()],
    /// Where the store lives and how it was opened, for reopening.
    pub dir: PathBuf,
    opts: StoreOptions,
    /// Where the outbox stands.
    pub outbox: outbox::OutboxState,
}

/// The rows of `ks` whose (UTF-8) name starts with `prefix`: (name, value).
fn named_rows(ks: &fjall::Keyspace, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let mut out = Vec::new();
    for kv in ks.prefix(prefix) {
        let (k, v) = kv.into_inner()?;
        out.push((String::from_utf8(k.to_vec()).map_err(|_| StoreError::Corrupt("row name"))?, v.to_vec()));
    }
    Ok(out)
}

/// Handle to the open store; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

/// Opens the database in `dir`, creating keyspaces and the format marker as needed.
fn open_engine(dir: &Path, opts: &StoreOptions) -> Result<Engine, StoreError> {
    let db = Database::builder(dir)
        .cache_size(opts.cache_bytes)
        .max_cached_files(Some(opts.max_open_files.max(16)))
        .manual_journal_persist(true)
        .open()?;
    // fjall's default memtable is 64 MiB per keyspace; a sealed one waiting for its flush
    // doubles that. Smaller memtables keep the server's memory bounded and modest.
    let ks =
        |name: &str, memtable: u64| db.keyspace(name, || KeyspaceCreateOptions::default().max_memtable_size(memtable));
    let small = SMALL_MEMTABLE_BYTES;
    let ks = Keyspaces {
        meta: ks("meta", small)?,
        devices: ks("devices", small)?,
        names: ks("names", small)?,
        gateways: ks("gateways", small)?,
        tokens: ks("tokens", small)?,
        identities: ks("identities", small)?,
        profiles: ks("profiles", small)?,
        docs: ks("docs", small)?,
        basic: ks("basic", small)?,
        ts: ks("ts", opts.memtable_bytes)?,
        latest: ks("latest", small)?,
        attrs: ks("attrs", small)?,
        keys: ks("keys", small)?,
        broker: ks("broker", small)?,
        settings: ks("settings", small)?,
        outbox: ks("outbox", small)?,
    };
    match ks.meta.get(FORMAT_KEY)? {
        None => {
            ks.meta.insert(FORMAT_KEY, FORMAT_VERSION.to_be_bytes().to_vec())?;
            db.persist(fjall::PersistMode::SyncAll)?;
        }
        Some(v) => {
            let found =
                <[u8; 4]>::try_from(&*v).map(u32::from_be_bytes).map_err(|_| StoreError::Corrupt("format version"))?;
            if found != FORMAT_VERSION {
                return Err(StoreError::Format { found });
            }
        }
    }
    let engine = Engine { db, ks };
    engine.ensure_profiles()?;
    Ok(engine)
}

impl Engine {
    /// A data directory without device profiles (new, or written before profiles were
    /// entities) gets the default profile and one profile for each device type in use, with
    /// the ids devices without a profile point at ([`ProfileId::for_name`]).
    fn ensure_profiles(&self) -> Result<(), StoreError> {
        if self.ks.profiles.first_key_value().is_some() {
            return Ok(());
        }
        let mut names = std::collections::BTreeSet::from([DEFAULT_PROFILE.to_owned()]);
        for kv in self.ks.devices.iter() {
            names.insert(decode_device(&kv.into_inner()?.1)?.device_type);
        }
        let now = Ts::now().0;
        let mut batch = self.db.batch();
        for name in names {
            let id = ProfileId::for_name(&name);
            let doc = serde_json::json!({"type": "DEFAULT", "transportType": "DEFAULT", "provisionType": "DISABLED"});
            let rec =
                ProfileRecord { id, created_time: now, default: name == DEFAULT_PROFILE, name, doc, tenant: None };
            batch.insert(&self.ks.profiles, id.0.as_bytes().to_vec(), encode_profile(&rec)?);
        }
        batch.commit()?;
        self.db.persist(fjall::PersistMode::SyncAll)?;
        Ok(())
    }
}

impl Store {
    /// Opens (or creates) the store in `dir`, recovering the journal after a crash.
    pub fn open(dir: &Path, opts: &StoreOptions) -> Result<Self, StoreError> {
        let engine = open_engine(dir, opts)?;
        let keys = KeyDict::load(&engine.ks.keys)?;
        let outbox = outbox::OutboxState::load(&engine)?;
        Ok(Self {
            inner: Arc::new(Inner {
                engine: RwLock::new(Some(Arc::new(engine))),
                keys: RwLock::new(keys),
                profiles: RwLock::new(None),
                profiles_generation: AtomicU64::new(0),
                tokens: TokenCache::default(),
                devices: RwLock::default(),
                follower: parking_lot::Mutex::new(None),
                remote_generations: Default::default(),
                health: std::sync::atomic::AtomicU8::new(Health::Ok as u8),
                dir: dir.to_owned(),
                opts: opts.clone(),
                outbox,
            }),
        })
    }

    /// The engine in use (`Unavailable` for the moment it is being reopened).
    pub(crate) fn engine(&self) -> Result<Arc<Engine>, StoreError> {
        self.inner.engine.read().clone().ok_or(StoreError::Unavailable)
    }

    /// Closes the engine and opens it again from disk (recovering its journal): the way
    /// back from a failed write, since the engine refuses writes for good after one. Only
    /// the writer thread calls this. Readers get `Unavailable` meanwhile.
    pub(crate) fn reopen(&self) -> Result<(), StoreError> {
        let old = self.inner.engine.write().take();
        if let Some(old) = old {
            // Readers finish with the old engine first: it must be closed (its lock file
            // released) before it can be opened again.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while Arc::strong_count(&old) > 1 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            drop(old);
        }
        let engine = open_engine(&self.inner.dir, &self.inner.opts)?;
        *self.inner.keys.write() = KeyDict::load(&engine.ks.keys)?;
        self.inner.outbox.reload(&engine)?;
        let mut tokens = self.inner.tokens.map.write();
        tokens.clear();
        self.inner.tokens.generation.fetch_add(1, Ordering::AcqRel);
        *self.inner.engine.write() = Some(Arc::new(engine));
        self.change_profiles(|| Ok(()))
    }

    /// Bytes the store's files take on disk (its directory, walked now).
    pub fn disk_bytes(&self) -> u64 {
        fn walk(dir: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.inner.dir)
    }

    /// A shared setting ([`WriteOp::SettingIfAbsent`] and [`WriteOp::SwapSetting`] write them).
    pub fn setting(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.engine()?.ks.settings.get(name)?.map(|v| v.to_vec()))
    }

    /// Every shared setting whose name starts with `prefix`: (name, value).
    pub fn settings_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        named_rows(&self.engine()?.ks.settings, prefix)
    }

    /// The names of `names` that have no telemetry key id yet (each once).
    pub fn unknown_keys<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let dict = self.inner.keys.read();
        let mut unknown: Vec<String> = names.into_iter().filter(|n| dict.id(n).is_none()).map(str::to_owned).collect();
        unknown.sort_unstable();
        unknown.dedup();
        unknown
    }

    /// Whether the store takes writes now.
    pub fn health(&self) -> Health {
        match self.inner.health.load(Ordering::Acquire) {
            0 => Health::Ok,
            1 => Health::DiskFull,
            _ => Health::Failed,
        }
    }

    pub(crate) fn set_health(&self, h: Health) {
        self.inner.health.store(h as u8, Ordering::Release);
    }

    /// Reads a small setting from `meta`.
    pub fn meta_get(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.engine()?.ks.meta.get(name)?.map(|v| v.to_vec()))
    }

    /// Writes a small setting to `meta` and syncs it (used at start-up only).
    pub fn meta_put(&self, name: &str, value: &[u8]) -> Result<(), StoreError> {
        let engine = self.engine()?;
        engine.ks.meta.insert(name, value.to_vec())?;
        engine.db.persist(fjall::PersistMode::SyncAll)?;
        Ok(())
    }

    /// Removes a setting from `meta` and syncs.
    pub fn meta_delete(&self, name: &str) -> Result<(), StoreError> {
        let engine = self.engine()?;
        engine.ks.meta.remove(name)?;
        engine.db.persist(fjall::PersistMode::SyncAll)?;
        Ok(())
    }

    /// Every `meta` setting whose name starts with `prefix`: (name, value).
    pub fn meta_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        named_rows(&self.engine()?.ks.meta, prefix)
    }

    /// The device an access token belongs to.
    pub fn device_id_by_token(&self, token: &str) -> Result<Option<DeviceId>, StoreError> {
        let cache = &self.inner.tokens;
        if let Some(id) = cache.map.read().get(token) {
            return Ok(Some(*id));
        }
        let generation = cache.generation.load(Ordering::Acquire);
        let found = self.engine()?.ks.tokens.get(token)?.map(|v| id_from(&v)).transpose()?;
        if let Some(id) = found {
            let mut map = cache.map.write();
            // A token change committed since our read may have made `found` stale.
            if cache.generation.load(Ordering::Acquire) == generation {
                if map.len() >= TOKEN_CACHE_MAX {
                    map.clear();
                }
                map.insert(token.to_owned(), id);
            }
        }
        Ok(found)
    }

    /// Commits a batch that changes token ownership. The cache lock is held across the
    /// commit so no reader can re-cache a mapping the commit just invalidated.
    pub(crate) fn commit_token_change(
        &self,
        batch: replica::Batch,
        changed: impl IntoIterator<Item = String>,
    ) -> Result<(), StoreError> {
        let cache = &self.inner.tokens;
        let mut map = cache.map.write();
        batch.commit(self)?;
        for t in changed {
            map.remove(&t);
        }
        cache.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Changes whenever a device record may have changed: written here, or (with a
    /// replica) by another node. A cache of anything read from device records is good
    /// while this stays the same.
    pub fn devices_generation(&self) -> u64 {
        self.inner.tokens.generation.load(Ordering::Acquire).wrapping_add(self.remote_generation("devices"))
    }

    /// A device by id.
    pub fn device(&self, id: DeviceId) -> Result<Option<DeviceRecord>, StoreError> {
        self.engine()?.device(id)
    }

    /// A device by id, from memory while no device record changed since it was read (for
    /// the per-message paths: live fan-out, the outbox filter). A device that does not
    /// exist is read every time.
    pub fn device_cached(&self, id: DeviceId) -> Result<Option<Arc<DeviceRecord>>, StoreError> {
        let generation = self.devices_generation();
        {
            let cache = self.inner.devices.read();
            if cache.generation == generation {
                if let Some(d) = cache.map.get(&id) {
                    return Ok(Some(d.clone()));
                }
            }
        }
        let Some(d) = self.device(id)?.map(Arc::new) else { return Ok(None) };
        let mut cache = self.inner.devices.write();
        // Tagged with the generation read before the record: a change committed since
        // then makes the whole map stale rather than this record wrongly fresh.
        if cache.generation != generation || cache.map.len() >= DEVICE_CACHE_MAX {
            *cache = DeviceCache { generation, map: Default::default() };
        }
        cache.map.insert(id, d.clone());
        Ok(Some(d))
    }

    /// Every document of `kind`, by title.
    pub fn docs(&self, kind: DocKind) -> Result<Vec<DocRecord>, StoreError> {
        let mut out = Vec::new();
        for kv in self.engine()?.ks.docs.prefix([kind as u8]) {
            out.push(decode_doc(&kv.into_inner()?.1)?);
        }
        out.sort_by(|a, b| a.title.cmp(&b.title));
        Ok(out)
    }

    /// A document by kind and id.
    pub fn doc(&self, kind: DocKind, id: uuid::Uuid) -> Result<Option<DocRecord>, StoreError> {
        self.engine()?.ks.docs.get(kind.key(id))?.map(|v| decode_doc(&v)).transpose()
    }

    /// The bytes of OTA package `id`, once uploaded.
    pub fn ota_data(&self, id: uuid::Uuid) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.engine()?.ks.docs.get(DocKind::OtaData.key(id))?.map(|v| v.to_vec()))
    }

    /// Every device profile, by name (from memory after the first read).
    pub fn profiles(&self) -> Result<Arc<Vec<ProfileRecord>>, StoreError> {
        if let Some(p) = self.inner.profiles.read().clone() {
            return Ok(p);
        }
        let mut slot = self.inner.profiles.write();
        if let Some(p) = slot.clone() {
            return Ok(p);
        }
        let mut all = self.engine()?.profiles()?;
        all.sort_by(|a, b| a.name.cmp(&b.name));
        let all = Arc::new(all);
        *slot = Some(all.clone());
        Ok(all)
    }

    /// A device profile by id.
    pub fn profile(&self, id: ProfileId) -> Result<Option<ProfileRecord>, StoreError> {
        Ok(self.profiles()?.iter().find(|p| p.id == id).cloned())
    }

    /// Runs `commit`, a write of profiles, so that no reader keeps what it replaced.
    pub(crate) fn change_profiles<T>(&self, commit: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut slot = self.inner.profiles.write();
        let out = commit();
        *slot = None;
        self.inner.profiles_generation.fetch_add(1, Ordering::AcqRel);
        out
    }

    /// A number that changes whenever the profiles may have (read it before
    /// [`Store::profiles`]: what that returns is at least as new): a cache of something
    /// derived from the profiles checks it without a lock.
    pub fn profiles_generation(&self) -> u64 {
        self.inner.profiles_generation.load(Ordering::Acquire)
    }

    /// The device with MQTT_BASIC credentials of this user name, or (`user_name` `None`) of
    /// this client id and no user name.
    pub fn device_by_basic(
        &self,
        user_name: Option<&str>,
        client_id: &str,
    ) -> Result<Option<DeviceRecord>, StoreError> {
        let key = BasicCredentials {
            client_id: Some(client_id.to_owned()),
            user_name: user_name.map(str::to_owned),
            password_hash: None,
        }
        .index_key();
        let engine = self.engine()?;
        let Some(id) = key.map(|k| engine.ks.basic.get(k)).transpose()?.flatten() else { return Ok(None) };
        engine.device(id_from(&id)?)
    }

    /// The device with X509_CERTIFICATE credentials of this fingerprint.
    pub fn device_by_x509(&self, fingerprint: &str) -> Result<Option<DeviceRecord>, StoreError> {
        let key = X509Credentials { fingerprint: fingerprint.to_owned(), cert: String::new() }.index_key();
        let engine = self.engine()?;
        let Some(id) = engine.ks.basic.get(key)? else { return Ok(None) };
        engine.device(id_from(&id)?)
    }

    /// The device a protocol knows by `identity`.
    pub fn device_id_by_identity(&self, identity: &ProtocolIdentity) -> Result<Option<DeviceId>, StoreError> {
        self.engine()?.ks.identities.get(codec::identity_key(identity))?.map(|v| id_from(&v)).transpose()
    }

    /// How many devices hold an identity of `protocol`.
    pub fn identity_count(&self, protocol: &str) -> Result<usize, StoreError> {
        let mut prefix = protocol.as_bytes().to_vec();
        prefix.push(0);
        let mut n = 0;
        for kv in self.engine()?.ks.identities.prefix(prefix) {
            kv.key()?;
            n += 1;
        }
        Ok(n)
    }

    /// A device of `tenant` by its name (unique in its tenant).
    pub fn device_by_name(&self, tenant: Option<uuid::Uuid>, name: &str) -> Result<Option<DeviceRecord>, StoreError> {
        let engine = self.engine()?;
        match engine.ks.names.get(name_key(tenant, name))? {
            Some(id) => engine.device(id_from(&id)?),
            None => Ok(None),
        }
    }

    /// Every device, of every tenant: the first tenant's in name order, then each other
    /// tenant's in name order.
    pub fn devices(&self) -> Result<Vec<DeviceRecord>, StoreError> {
        let engine = self.engine()?;
        let mut out = Vec::new();
        for kv in engine.ks.names.iter() {
            let (_, id) = kv.into_inner()?;
            if let Some(d) = engine.device(id_from(&id)?)? {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// The devices that belong to `gateway` (created by it or assigned to it).
    pub fn gateway_devices(&self, gateway: DeviceId) -> Result<Vec<DeviceId>, StoreError> {
        let mut out = Vec::new();
        for kv in self.engine()?.ks.gateways.prefix(gateway.as_bytes()) {
            out.push(id_from(&kv.key()?[16..])?);
        }
        Ok(out)
    }

    /// Number of devices (an estimate is not good enough for paging, so this counts).
    pub fn device_count(&self) -> Result<usize, StoreError> {
        Ok(self.engine()?.ks.devices.len()?)
    }

    /// Latest value of each requested key (all keys when `keys` is `None`), in key order.
    pub fn latest(&self, device: DeviceId, keys: Option<&[String]>) -> Result<Vec<(String, Ts, Value)>, StoreError> {
        let row = self.engine()?.latest(device)?.row;
        let dict = self.inner.keys.read();
        let mut out: Vec<(String, Ts, Value)> = row
            .into_iter()
            .filter_map(|(k, ts, v)| dict.name(k).map(|n| (n.to_owned(), ts, v)))
            .filter(|(n, _, _)| keys.is_none_or(|ks| ks.iter().any(|k| k == n)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Resolves key names to ids; unknown names are dropped (they have no data).
    pub(crate) fn key_ids(&self, keys: &[String]) -> Vec<(KeyId, String)> {
        let dict = self.inner.keys.read();
        keys.iter().filter_map(|k| dict.id(k).map(|id| (id, k.clone()))).collect()
    }

    /// Attributes of a device: one scope or all, some keys or all.
    pub fn attributes(
        &self,
        device: DeviceId,
        scope: Option<AttributeScope>,
        keys: Option<&[String]>,
    ) -> Result<Vec<AttributeEntry>, StoreError> {
        let mut out = Vec::new();
        let scopes: Vec<AttributeScope> = match scope {
            Some(s) => vec![s],
            None => AttributeScope::ALL.to_vec(),
        };
        for scope in scopes {
            match keys {
                Some(keys) => {
                    for key in keys {
                        let k = codec::attr_key(device, scope.tag(), key);
                        if let Some(v) = self.engine()?.ks.attrs.get(&k)? {
                            let (ts, value) = codec::decode_attr(&v)?;
                            out.push(AttributeEntry { scope, key: key.clone(), last_update_ts: ts, value });
                        }
                    }
                }
                None => {
                    let prefix = codec::attr_key(device, scope.tag(), "");
                    for kv in self.engine()?.ks.attrs.prefix(&prefix) {
                        let (k, v) = kv.into_inner()?;
                        let key = std::str::from_utf8(&k[prefix.len()..])
                            .map_err(|_| StoreError::Corrupt("attribute key utf-8"))?
                            .to_owned();
                        let (ts, value) = codec::decode_attr(&v)?;
                        out.push(AttributeEntry { scope, key, last_update_ts: ts, value });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every row of a broker table, in key order.
    pub fn broker_rows(&self, table: BrokerTable) -> Result<Vec<KeyValue>, StoreError> {
        self.broker_prefix(table, &[])
    }

    /// The rows of a broker table whose keys start with `prefix`.
    pub fn broker_prefix(&self, table: BrokerTable, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        let mut out = Vec::new();
        for kv in self.engine()?.ks.broker.prefix(table.key(prefix)) {
            let (k, v) = kv.into_inner()?;
            out.push((k[1..].to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    /// One row of a broker table.
    pub fn broker_row(&self, table: BrokerTable, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.engine()?.ks.broker.get(table.key(key))?.map(|v| v.to_vec()))
    }

    /// Syncs everything to disk (used at shutdown).
    pub fn sync(&self) -> Result<(), StoreError> {
        self.engine()?.db.persist(fjall::PersistMode::SyncAll)?;
        Ok(())
    }
}

pub(crate) fn id_from(v: &[u8]) -> Result<DeviceId, StoreError> {
    <[u8; 16]>::try_from(v).map(DeviceId::from_bytes).map_err(|_| StoreError::Corrupt("device id length"))
}

pub(crate) fn decode_doc(v: &[u8]) -> Result<DocRecord, StoreError> {
    serde_json::from_slice(v).map_err(|_| StoreError::Corrupt("document record"))
}

pub(crate) fn encode_doc(d: &DocRecord) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(d).map_err(|_| StoreError::Corrupt("document encode"))
}

pub(crate) fn decode_profile(v: &[u8]) -> Result<ProfileRecord, StoreError> {
    serde_json::from_slice(v).map_err(|_| StoreError::Corrupt("device profile record"))
}

/// The `names` index key of a device name: the name itself in the first tenant (as before
/// tenants existed); in another, 0xFF (never in UTF-8), the tenant's 16 bytes, the name.
pub(crate) fn name_key(tenant: Option<uuid::Uuid>, name: &str) -> Vec<u8> {
    match tenant {
        None => name.as_bytes().to_vec(),
        Some(t) => [&[0xFF][..], t.as_bytes(), name.as_bytes()].concat(),
    }
}

pub(crate) fn encode_profile(p: &ProfileRecord) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(p).map_err(|_| StoreError::Corrupt("device profile encode"))
}

pub(crate) fn decode_device(v: &[u8]) -> Result<DeviceRecord, StoreError> {
    serde_json::from_slice(v).map_err(|_| StoreError::Corrupt("device record"))
}

pub(crate) fn encode_device(d: &DeviceRecord) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(d).map_err(|_| StoreError::Corrupt("device encode"))
}

/// Generates a random 20-character alphanumeric access token, as ThingsBoard does.
pub fn generate_token() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(20);
    while out.len() < 20 {
        // Bytes 6 and 8 of a v4 UUID carry fixed version/variant bits; the rest are random.
        let bytes = *uuid::Uuid::new_v4().as_bytes();
        for (i, b) in bytes.into_iter().enumerate() {
            // Rejection sampling keeps the alphabet uniform: 248 = 4 * 62.
            if i != 6 && i != 8 && b < 248 && out.len() < 20 {
                out.push(char::from(ALPHABET[usize::from(b) % 62]));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report
    use super::*;

    /// A data directory written before device profiles were entities: devices without a
    /// profile, no `profiles` rows, no tenants. Opening it gives every type in use a profile
    /// with the id those devices point at, and the default profile; every device and
    /// profile is the first tenant's.
    #[test]
    fn a_directory_without_profiles_gets_one_per_device_type() {
        let tmp = tempfile::tempdir().unwrap();
        let opts = StoreOptions::default();
        {
            let store = Store::open(tmp.path(), &opts).unwrap();
            let engine = store.engine().unwrap();
            for key in engine.ks.profiles.iter().map(|kv| kv.key().unwrap()).collect::<Vec<_>>() {
                engine.ks.profiles.remove(key).unwrap();
            }
            for (name, ty) in [("a", "boiler"), ("b", "boiler"), ("c", "pump")] {
                let id = DeviceId::new_random();
                let legacy = serde_json::json!({"id": id, "created_time": 1, "name": name, "device_type": ty,
                    "label": null, "token": format!("tok-{name}"), "additional_info": null});
                engine.ks.devices.insert(id.as_bytes(), serde_json::to_vec(&legacy).unwrap()).unwrap();
                engine.ks.names.insert(name, id.as_bytes()).unwrap();
            }
            engine.db.persist(fjall::PersistMode::SyncAll).unwrap();
        }
        let store = Store::open(tmp.path(), &opts).unwrap();
        let profiles = store.profiles().unwrap();
        let names: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["boiler", "default", "pump"]);
        assert_eq!(profiles.iter().filter(|p| p.default).map(|p| p.name.as_str()).collect::<Vec<_>>(), ["default"]);
        for d in store.devices().unwrap() {
            assert_eq!(d.profile, None, "the record itself is not rewritten");
            let p = store.profile(d.profile_id()).unwrap().unwrap();
            assert_eq!(p.name, d.device_type);
            // Written before tenants: the first tenant's, found by name there.
            assert_eq!((d.tenant, p.tenant), (None, None));
            assert_eq!(store.device_by_name(None, &d.name).unwrap().map(|f| f.id), Some(d.id));
        }
        // Opening again changes nothing.
        drop(store);
        let store = Store::open(tmp.path(), &opts).unwrap();
        assert_eq!(store.profiles().unwrap(), profiles);
    }
}
