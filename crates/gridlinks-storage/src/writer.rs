//! The single writer thread and its group commit.
//!
//! Connections submit [`WriteOp`]s through a bounded queue ([`WriterHandle::submit`]), or
//! many at once as one request with one reply ([`WriterHandle::submit_batch`]: what a
//! transport decoded from one read goes with one channel send and one wake-up).
//! The writer takes everything that is waiting (up to `max_batch_ops`), applies it as
//! one or more atomic batches, makes the journal durable with **one** fsync, and only
//! then answers every request. Throughput therefore grows with concurrency instead of
//! being capped by fsync latency. When the queue is full, `submit` waits (backpressure)
//! and gives up with [`StoreError::Overloaded`] after the enqueue timeout.
//!
//! Telemetry and attribute writes of one round are merged in memory and written as one
//! batch. Operations that read what they change (device create/update/delete, imports,
//! deletes of telemetry) are barriers: what came before them is committed first, so
//! they always read committed state.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjall::PersistMode;

use crate::replica::Batch;
use gridlinks_types::{AttributeScope, DeviceId, ProfileId, ProtocolIdentity, Ts, TsRecord, Value};
use tokio::sync::{mpsc, oneshot};

use crate::codec::{self, KeyId};
use crate::space::Space;
use crate::{
    decode_device, encode_device, encode_doc, encode_profile, id_from, BasicCredentials, BrokerTable, DeviceRecord,
    DocKind, DocRecord, Engine, Health, OutboxEvent, ProfileRecord, Store, StoreError, DEFAULT_PROFILE,
};

/// How many devices' latest rows the writer keeps decoded in memory.
const LATEST_CACHE_DEVICES: usize = 200_000;
/// A device's `latest` row is rewritten once this many of its `ts` rows are newer than it…
const CHECKPOINT_ROWS: u32 = 32;
/// …or its oldest such row is this old (checked when a round commits).
const CHECKPOINT_AGE: Duration = Duration::from_secs(10);

/// A device's latest values as the writer keeps them (the source of truth stays on disk:
/// the checkpointed row plus the newer `ts` rows).
struct Latest {
    row: Vec<(KeyId, Ts, Value)>,
    /// The newest point in the row as last written to disk.
    checkpoint: Ts,
    /// `ts` rows written since (newer than `checkpoint`).
    newer_rows: u32,
    /// When the first of them was written.
    since: Option<Instant>,
}

/// Tuning of the writer thread.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// Requests that may wait in the queue before `submit` blocks.
    pub queue_capacity: usize,
    /// Most requests taken into one commit.
    pub max_batch_ops: usize,
    /// fsync every commit (`true`) or only hand it to the OS (`false`).
    pub fsync: bool,
    /// How long `submit` waits for queue space before answering `Overloaded`.
    pub enqueue_timeout: Duration,
    /// Most distinct telemetry key names the store accepts.
    pub max_keys: usize,
    /// Free bytes the data directory's file system must keep: below it, writes (but
    /// deletes) are refused with [`StoreError::DiskFull`] before the engine runs out of
    /// space, leaving it room to flush, compact and recover. 0 turns the check off.
    pub min_free_bytes: u64,
    /// Most devices one tenant may have, however they are created (REST, bulk import,
    /// provisioning, gateways, protocol listeners); 0: no bound.
    pub max_devices_per_tenant: usize,
    /// Tighter bounds of single tenants (their tenant profiles' `maxDevices`), changeable
    /// while the writer runs.
    pub tenant_device_caps: Arc<TenantCaps>,
}

/// Most devices of single tenants, by the name of what sets it, beside
/// [`WriterConfig::max_devices_per_tenant`]; the tighter bound wins.
#[derive(Debug, Default)]
pub struct TenantCaps {
    caps: parking_lot::RwLock<HashMap<Option<uuid::Uuid>, (usize, String)>>,
    /// Devices refused by a tenant's own bound.
    refused: AtomicU64,
}

impl TenantCaps {
    /// Replaces every tenant's bound (0s are left out).
    pub fn set(&self, caps: impl IntoIterator<Item = (Option<uuid::Uuid>, (usize, String))>) {
        *self.caps.write() = caps.into_iter().filter(|(_, (n, _))| *n > 0).collect();
    }

    /// How many devices a tenant's own bound refused.
    pub fn refusals(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Whether any tenant has a bound.
    fn any(&self) -> bool {
        !self.caps.read().is_empty()
    }

    /// `tenant`'s bound, what sets it and whether it is its own: the tighter of `global`
    /// and its own; 0: none.
    fn of(&self, tenant: Option<uuid::Uuid>, global: usize) -> (usize, String, bool) {
        let own = self.caps.read().get(&tenant).cloned();
        match own {
            Some((n, why)) if global == 0 || n < global => (n, why, true),
            _ => (global, "limits.max_devices_per_tenant".into(), false),
        }
    }
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 8192,
            max_batch_ops: 4096,
            fsync: true,
            enqueue_timeout: Duration::from_secs(5),
            max_keys: 1_000_000,
            min_free_bytes: 64 * 1024 * 1024,
            max_devices_per_tenant: 0,
            tenant_device_caps: Arc::default(),
        }
    }
}

/// The device profile field that says whether gateways may adopt its devices (bind a device
/// of no gateway on first use): `"ALLOW"` or `"REFUSE"`.
pub const GATEWAY_ADOPTION: &str = "gatewayAdoption";

/// Whether a gateway may adopt a device of no gateway whose profile document is `profile`:
/// the profile's [`GATEWAY_ADOPTION`] when it says `ALLOW` or `REFUSE`, else `default`.
pub fn adoption_allowed(profile: Option<&serde_json::Value>, default: bool) -> bool {
    match profile.and_then(|p| p.get(GATEWAY_ADOPTION)).and_then(serde_json::Value::as_str) {
        Some("ALLOW") => true,
        Some("REFUSE") => false,
        _ => default,
    }
}

/// A request to change stored data.
#[derive(Debug)]
pub enum WriteOp {
    /// Time-series records of one device.
    Telemetry {
        /// Whose.
        device: DeviceId,
        /// What (shared: what the ingest hands to the live fan-out once it is committed).
        records: Arc<[TsRecord]>,
    },
    /// Attribute values of one device in one scope (last write wins).
    Attributes {
        /// Whose.
        device: DeviceId,
        /// Which scope.
        scope: AttributeScope,
        /// What.
        values: Vec<(String, Value)>,
    },
    /// Removes attributes by key.
    DeleteAttributes {
        /// Whose.
        device: DeviceId,
        /// Which scope.
        scope: AttributeScope,
        /// Which keys.
        keys: Vec<String>,
    },
    /// Removes time-series data.
    DeleteTelemetry(DeleteTelemetry),
    /// Adds an entry to the outbox only (what was written elsewhere: time series a shared
    /// database took, which data forwarding must still send).
    Outbox(crate::OutboxEvent),
    /// Creates or updates a device.
    SaveDevice(SaveDevice),
    /// Creates or updates a device profile; a new name is written into its devices' type.
    SaveProfile(SaveProfile),
    /// Deletes a device profile no device uses that is not the default.
    DeleteProfile(ProfileId),
    /// Makes a profile the default one.
    SetDefaultProfile(ProfileId),
    /// Creates (`id: None`) or updates a document (a dashboard).
    SaveDoc {
        /// Which kind.
        kind: DocKind,
        /// The document to update; `None` creates one.
        id: Option<uuid::Uuid>,
        /// Its title (1 to 255 characters, no control characters).
        title: String,
        /// The rest, kept as given (an object).
        doc: serde_json::Value,
    },
    /// Creates a document with a given id (an API key, whose value contains it).
    InsertDoc {
        /// Which kind.
        kind: DocKind,
        /// Its id (`Invalid` if taken).
        id: uuid::Uuid,
        /// Its title.
        title: String,
        /// The rest (an object).
        doc: serde_json::Value,
    },
    /// Creates or replaces the document with this id (an alarm, a device's alarm rule
    /// state), keeping its creation time.
    PutDoc {
        /// Which kind.
        kind: DocKind,
        /// Its id.
        id: uuid::Uuid,
        /// Its title.
        title: String,
        /// The rest (an object).
        doc: serde_json::Value,
    },
    /// Creates or replaces documents of a kind whose titles need not be unique and whose
    /// creation time nobody reads (devices' alarm rule states), in one batch: (id, title,
    /// object).
    PutDocs {
        /// Which kind.
        kind: DocKind,
        /// The documents.
        docs: Vec<(uuid::Uuid, String, serde_json::Value)>,
    },
    /// Deletes a document (an OTA package with its data).
    DeleteDoc(DocKind, uuid::Uuid),
    /// Stores OTA package `id`'s bytes once, with the description fields of its data
    /// ([`crate::OTA_DATA_FIELDS`]) in one batch.
    PutOtaData {
        /// The package (its description must exist and have no data yet).
        id: uuid::Uuid,
        /// The bytes.
        data: Vec<u8>,
        /// `fileName`, `contentType`, `checksumAlgorithm`, `checksum`, `dataSize`.
        fields: serde_json::Map<String, serde_json::Value>,
    },
    /// Deletes a device with all its data; its token stops working.
    DeleteDevice(DeviceId),
    /// The device named `name` of the gateway's tenant for a gateway to write to: one it
    /// owns; one of no gateway, which it then owns (adopts), when `adopt` (or the device's
    /// profile, see [`adoption_allowed`]) allows; or a new one it then owns. A gateway owns
    /// at most `max_devices`. Refused when the device belongs to another gateway, is itself
    /// a gateway, may not be adopted, or `gateway` is not a gateway. Another tenant's
    /// devices are never looked at.
    GatewayDevice {
        /// The gateway (must be one, `additionalInfo.gateway: true`).
        gateway: DeviceId,
        /// The sub-device's name.
        name: String,
        /// Its type when it is created (`default` when `None`).
        device_type: Option<String>,
        /// Most devices one gateway may own.
        max_devices: usize,
        /// Whether a gateway may adopt a device of no gateway when its profile does not say.
        adopt: bool,
    },
    /// Gives a device a protocol identity (`Some`) or takes it away (`None`).
    SetIdentity {
        /// The device.
        device: DeviceId,
        /// Its identity from now on.
        identity: Option<ProtocolIdentity>,
    },
    /// The device a protocol knows by `identity`, created on first use, named
    /// `{protocol}-{id}` (a TCP listener's `auto_provision`). Refused when a device of that
    /// name exists without this identity, or when `max_devices` devices hold an identity of
    /// the protocol already.
    ProtocolDevice {
        /// Whose.
        identity: ProtocolIdentity,
        /// The type of a created device (`default` when empty).
        device_type: String,
        /// Most devices with an identity of this protocol.
        max_devices: usize,
    },
    /// Gives a device MQTT_BASIC credentials (the password already hashed). Its access token
    /// is replaced by a fresh one nobody knows, as ThingsBoard keeps one credential per
    /// device; saving an access token again takes the MQTT_BASIC credentials away.
    SetBasic {
        /// The device.
        device: DeviceId,
        /// Its credentials from now on.
        basic: BasicCredentials,
    },
    /// Gives a device X509_CERTIFICATE credentials, which replace its access token (and
    /// MQTT_BASIC credentials): a certificate is one device's only.
    SetX509 {
        /// The device.
        device: DeviceId,
        /// Its certificate from now on.
        x509: crate::X509Credentials,
    },
    /// Sets a device's own OTA packages (each must exist).
    SetDeviceOta {
        /// The device.
        device: DeviceId,
        /// Its firmware package (`None`: its profile's).
        firmware: Option<uuid::Uuid>,
        /// Its software package (`None`: its profile's).
        software: Option<uuid::Uuid>,
    },
    /// Assigns a device to a customer (`Some`, which must exist) or to none.
    AssignCustomer {
        /// The device.
        device: DeviceId,
        /// Its customer from now on.
        customer: Option<uuid::Uuid>,
    },
    /// Deletes a customer; its devices and dashboards are assigned to it no more.
    DeleteCustomer(uuid::Uuid),
    /// Deletes a tenant other than the first (`Some`) with everything of it: its devices
    /// and their data, its profiles, and every document whose `tenantId` it is (customers,
    /// dashboards, users with their credentials, API keys), and its own document.
    DeleteTenant(uuid::Uuid),
    /// Assigns a dashboard to a customer (`assign`) or takes it back; a dashboard may be
    /// assigned to several customers (their ids in its document's `assignedCustomerIds`).
    AssignDashboard {
        /// The dashboard.
        dashboard: uuid::Uuid,
        /// The customer (must exist to be assigned).
        customer: uuid::Uuid,
        /// Assign, or take back.
        assign: bool,
    },
    /// Assigns a device to a gateway (`Some`, which must be a gateway) or to none.
    AssignGateway {
        /// The device.
        device: DeviceId,
        /// Its gateway from now on.
        gateway: Option<DeviceId>,
    },
    /// Rows of the MQTT broker's tables, committed with the telemetry of the same round.
    Broker(Vec<BrokerRow>),
    /// The setting `name` every node shares: the stored one, or (none yet) the one kept in
    /// the node's `meta` before settings were shared, or else `value`, stored now. Answered
    /// with [`WriteOutcome::Setting`]; under a replica's lock, so that nodes starting at
    /// once agree on one value.
    SettingIfAbsent {
        /// Its name.
        name: String,
        /// Its value if it has none.
        value: Vec<u8>,
    },
    /// Sets (`Some`) or removes (`None`) the shared setting `name` if its value is `expect`
    /// (`None`: it has none): a compare-and-set, cluster-wide under a replica's lock.
    /// Answered with [`WriteOutcome::Swapped`].
    SwapSetting {
        /// Its name.
        name: String,
        /// The value it must have now.
        expect: Option<Vec<u8>>,
        /// Its value from now on.
        value: Option<Vec<u8>>,
    },
    /// Applies what other nodes changed in the replica of shared rows (`cluster.entities`;
    /// nothing without one).
    CatchUp,
    /// Gives telemetry key names their dictionary ids now (`Limit` when the dictionary is
    /// full), so that a later write of them cannot meet the key limit: the check a commit
    /// log in front of the store (Kafka) makes before it acknowledges.
    ReserveKeys(Vec<String>),
    /// Creates or updates many devices in one commit.
    Import {
        /// The tenant whose devices these are.
        tenant: Option<uuid::Uuid>,
        /// Rows parsed from the CSV.
        rows: Vec<ImportRow>,
        /// Write the rows' attributes for devices that already existed too (ThingsBoard's
        /// `update`; existing devices' fields are always updated).
        update: bool,
    },
}

/// One row of a broker table to write (`Some`) or remove (`None`).
#[derive(Debug, Clone)]
pub struct BrokerRow {
    /// Which table.
    pub table: BrokerTable,
    /// Its key in the table.
    pub key: Vec<u8>,
    /// The new value; `None` deletes the row.
    pub value: Option<Vec<u8>>,
}

/// Which time-series data to delete.
#[derive(Debug, Clone)]
pub struct DeleteTelemetry {
    /// Whose.
    pub device: DeviceId,
    /// Which keys.
    pub keys: Vec<String>,
    /// `[start, end)`; `None` deletes all data of the keys.
    pub range: Option<(Ts, Ts)>,
    /// Also delete the latest value when it lies in the range.
    pub delete_latest: bool,
    /// After deleting the latest value, promote the newest remaining point.
    pub rewrite_latest: bool,
}

/// A device profile to create (`id: None`) or update.
#[derive(Debug, Clone)]
pub struct SaveProfile {
    /// The profile to update; `None` creates one.
    pub id: Option<ProfileId>,
    /// The tenant of a new profile (`None`: the first tenant); an update keeps its own.
    pub tenant: Option<uuid::Uuid>,
    /// Unique name.
    pub name: String,
    /// The rest of the profile, kept as given (an object).
    pub doc: serde_json::Value,
}

/// A device to create (`id: None`) or update. The default is a new device of the first
/// tenant with no name (so refused until it is given one), the default profile and a
/// generated token.
#[derive(Debug, Clone, Default)]
pub struct SaveDevice {
    /// The device to update; `None` creates one.
    pub id: Option<DeviceId>,
    /// The tenant of a new device (`None`: the first tenant); an update keeps its own.
    pub tenant: Option<uuid::Uuid>,
    /// Unique name.
    pub name: String,
    /// Type: the name of its profile, created when no profile has that name (as ThingsBoard
    /// does). Ignored when `profile` is given; empty keeps the device's profile, or gives a
    /// new device the default one.
    pub device_type: String,
    /// Its profile by id (which must exist).
    pub profile: Option<ProfileId>,
    /// Label.
    pub label: Option<String>,
    /// Access token; `None` keeps the current one, or generates one for a new device.
    pub token: Option<String>,
    /// Free-form JSON.
    pub additional_info: Option<serde_json::Value>,
}

impl SaveDevice {
    /// Checks the fields every way in must respect: a name that is not blank, at most 255
    /// characters for name, type and label, an access token of 1 to 255 characters without
    /// spaces, and no control characters (NUL, newlines, escapes…) anywhere.
    pub fn validate(&self) -> Result<(), StoreError> {
        let field = |what: &str, v: &str| -> Result<(), StoreError> {
            if v.chars().count() > 255 {
                return Err(StoreError::Invalid(format!("{what} length must be equal or less than 255")));
            }
            if v.chars().any(char::is_control) {
                return Err(StoreError::Invalid(format!("{what} must not contain control characters")));
            }
            Ok(())
        };
        if self.name.trim().is_empty() {
            return Err(StoreError::Invalid("Device name should be specified!".into()));
        }
        field("device name", &self.name)?;
        field("device type", &self.device_type)?;
        if let Some(l) = &self.label {
            field("device label", l)?;
        }
        if let Some(t) = &self.token {
            field("access token", t)?;
            if t.is_empty() || t.contains(char::is_whitespace) {
                return Err(StoreError::Invalid("access token must be 1 to 255 characters without spaces".into()));
            }
            if t == "provision" {
                return Err(StoreError::Invalid(
                    "access token 'provision' is reserved: it is MQTT's provisioning user name".into(),
                ));
            }
        }
        Ok(())
    }
}

/// One CSV row of a bulk import.
#[derive(Debug, Clone)]
pub struct ImportRow {
    /// 1-based line number in the file, for error messages.
    pub line: usize,
    /// Device name (required).
    pub name: String,
    /// Type, if the column is present.
    pub device_type: Option<String>,
    /// Label, if the column is present.
    pub label: Option<String>,
    /// Access token, if the column is present and not empty.
    pub token: Option<String>,
    /// `additionalInfo.description`, if the column is present.
    pub description: Option<String>,
    /// `additionalInfo.gateway`, if the column is present.
    pub gateway: Option<bool>,
    /// Shared attributes to set.
    pub shared: Vec<(String, Value)>,
    /// Server attributes to set.
    pub server: Vec<(String, Value)>,
}

/// Result of a bulk import.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ImportOutcome {
    /// Devices created.
    pub created: usize,
    /// Devices updated.
    pub updated: usize,
    /// One message per failed row, `Line N: reason`.
    pub errors: Vec<String>,
}

/// What a successful write returns.
#[derive(Debug)]
pub enum WriteOutcome {
    /// Committed.
    Done,
    /// The device as saved (boxed: every telemetry result carries this enum).
    Device(Box<DeviceRecord>),
    /// Import counts.
    Import(ImportOutcome),
    /// The device profile as saved.
    Profile(ProfileRecord),
    /// The document as saved.
    Doc(DocRecord),
    /// A setting's value ([`WriteOp::SettingIfAbsent`]).
    Setting(Vec<u8>),
    /// Whether [`WriteOp::SwapSetting`] found the value it expected, and so wrote.
    Swapped(bool),
}

/// Counters of the writer, for `/metrics`.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Commits (fsync rounds) done.
    pub commits: AtomicU64,
    /// Requests answered.
    pub ops: AtomicU64,
    /// Time-series records written.
    pub records: AtomicU64,
    /// Nanoseconds spent in fsync.
    pub sync_nanos: AtomicU64,
    /// Requests refused with `Overloaded`.
    pub overloaded: AtomicU64,
    /// Requests refused because the disk was (nearly) full or the store had failed.
    pub refused_unhealthy: AtomicU64,
    /// Times the store was reopened after a failure.
    pub reopens: AtomicU64,
    /// Duration of each commit round, from taking its batch to the end of its fsync.
    pub commit_nanos: crate::histogram::CommitNanos,
    /// Requests per commit round.
    pub commit_batch_ops: crate::histogram::BatchOps,
}

/// The result of each op of a batch, in order.
pub type BatchOutcome = Vec<Result<WriteOutcome, StoreError>>;

struct Request {
    ops: Vec<WriteOp>,
    reply: oneshot::Sender<BatchOutcome>,
}

/// Submits writes to the writer thread. Cheap to clone; the writer stops once every
/// handle is dropped and the queue is drained.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<Request>,
    enqueue_timeout: Duration,
    stats: Arc<WriterStats>,
}

impl WriterHandle {
    /// Resolves once every request queued before it is committed (the writer takes
    /// requests in order): what a caller reads afterwards includes all of them.
    pub async fn barrier(&self) -> Result<(), StoreError> {
        // Reserving no key names writes nothing; it joins the round like any other op.
        self.submit(WriteOp::ReserveKeys(Vec::new())).await.map(drop)
    }

    /// Queues `op` and waits until it is durably committed (or failed).
    pub async fn submit(&self, op: WriteOp) -> Result<WriteOutcome, StoreError> {
        self.submit_batch(vec![op]).await?.pop().ok_or(StoreError::Closed)?
    }

    /// Queues every op as one request (they share one group commit), then waits for all
    /// of them; fails if any failed.
    pub async fn submit_all(&self, ops: Vec<WriteOp>) -> Result<(), StoreError> {
        for r in self.submit_batch(ops).await? {
            r?;
        }
        Ok(())
    }

    /// Queues `ops` as one request and waits until they are committed: one result per op,
    /// in order. The ops are applied in order, in the same group commit unless a barrier
    /// (device changes, imports, deletes of telemetry) splits the round. `Err` when the
    /// request could not be queued at all (overload, shutdown).
    pub async fn submit_batch(&self, ops: Vec<WriteOp>) -> Result<BatchOutcome, StoreError> {
        let n = ops.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let reply = self.enqueue(ops).await?;
        let results = reply.await.map_err(|_| StoreError::Closed)?;
        debug_assert_eq!(results.len(), n);
        Ok(results)
    }

    /// Waits (bounded by the enqueue timeout) for queue space and queues `ops`.
    async fn enqueue(&self, ops: Vec<WriteOp>) -> Result<oneshot::Receiver<BatchOutcome>, StoreError> {
        let permit = match tokio::time::timeout(self.enqueue_timeout, self.tx.reserve()).await {
            Err(_) => {
                self.stats.overloaded.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Overloaded);
            }
            Ok(Err(_)) => return Err(StoreError::Closed),
            Ok(Ok(p)) => p,
        };
        let (reply, rx) = oneshot::channel();
        permit.send(Request { ops, reply });
        Ok(rx)
    }

    /// The writer's counters.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    /// Requests waiting in the queue right now.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

impl Store {
    /// Starts the writer thread. Join the returned handle after dropping every
    /// [`WriterHandle`] to wait for the final sync.
    pub fn start_writer(&self, cfg: WriterConfig) -> std::io::Result<(WriterHandle, std::thread::JoinHandle<()>)> {
        let (tx, rx) = mpsc::channel(cfg.queue_capacity.max(1));
        let stats = Arc::new(WriterStats::default());
        let handle = WriterHandle { tx, enqueue_timeout: cfg.enqueue_timeout, stats: stats.clone() };
        let store = self.clone();
        let engine = self.engine().map_err(std::io::Error::other)?;
        let join = std::thread::Builder::new()
            .name("gridlinks-writer".into())
            .spawn(move || Writer::new(store, engine, cfg, stats).run(rx))?;
        Ok((handle, join))
    }
}

struct Writer {
    store: Store,
    /// The engine this writer writes to (replaced when the store is reopened; `None` from
    /// the start of a reopen until one succeeds).
    engine: Option<Arc<Engine>>,
    cfg: WriterConfig,
    stats: Arc<WriterStats>,
    /// Free space of the data directory's file system.
    space: Space,
    /// No reopen is tried before this (once a second while the store has failed).
    next_reopen: Instant,
    /// The last failure was the file system running out of space.
    no_space: bool,
    /// Decoded latest rows by device.
    latest: HashMap<DeviceId, Latest>,
    /// Devices with rows newer than their checkpoint, oldest first (with `since`).
    unsaved: std::collections::VecDeque<(Instant, DeviceId)>,
    /// Devices owned per gateway, counted on first use (dropped on deletes and assignments).
    gateway_counts: HashMap<DeviceId, usize>,
    /// Devices holding an identity of each protocol, counted on first use (dropped on
    /// deletes and identity changes).
    identity_counts: HashMap<String, usize>,
    /// Devices per tenant, counted on first use when `max_devices_per_tenant` bounds them
    /// (dropped on deletes and when another node changed the shared rows).
    tenant_counts: HashMap<Option<uuid::Uuid>, usize>,
}

/// Telemetry and attribute writes of one round, merged before they hit the database.
#[derive(Default)]
struct Segment {
    /// Indexes (into the round's requests) of the ops in this segment.
    members: Vec<usize>,
    rows: HashMap<(DeviceId, Ts), Vec<(KeyId, Value)>>,
    latest_dirty: HashSet<DeviceId>,
    attrs: HashMap<Vec<u8>, Option<(Ts, Value)>>,
    /// Broker rows by full key: the last write of a round wins.
    broker: HashMap<Vec<u8>, Option<Vec<u8>>>,
    new_keys: Vec<(String, KeyId)>,
    alive: HashMap<DeviceId, bool>,
    records: u64,
    /// Outbox entries of this segment's writes, encoded.
    outbox: Vec<Vec<u8>>,
}

/// What the writer may do this round.
enum Admission {
    /// Everything.
    All,
    /// Deletes only (the disk is nearly full); the rest gets this error.
    DeletesOnly(StoreError),
    /// Nothing (the store failed and is not reopened yet).
    Nothing(StoreError),
}

impl WriteOp {
    /// Whether the op only removes data (allowed while the disk is nearly full, so space can
    /// be freed through the API).
    fn is_delete(&self) -> bool {
        matches!(self, WriteOp::DeleteAttributes { .. } | WriteOp::DeleteTelemetry(_) | WriteOp::DeleteDevice(_))
    }
}

/// How often an unhealthy writer with nothing to do checks whether it can recover.
const RECOVERY_POLL: Duration = Duration::from_millis(200);
/// Free bytes needed before a store that ran out of space is reopened (when
/// `min_free_bytes` asks for less).
const RECOVERY_MIN_FREE: u64 = 4 * 1024 * 1024;

/// Whether `e` is the file system running out of space.
fn is_no_space(e: &StoreError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull) {
            return true;
        }
        cause = c.source();
    }
    // Engine errors do not always expose their cause; their text names it.
    let text = format!("{e:?}");
    text.contains("StorageFull") || text.contains("No space left")
}

impl Writer {
    fn new(store: Store, engine: Arc<Engine>, cfg: WriterConfig, stats: Arc<WriterStats>) -> Self {
        Self {
            space: Space::new(&store.inner.dir),
            store,
            engine: Some(engine),
            cfg,
            stats,
            next_reopen: Instant::now(),
            no_space: false,
            latest: HashMap::default(),
            unsaved: std::collections::VecDeque::new(),
            gateway_counts: HashMap::default(),
            identity_counts: HashMap::default(),
            tenant_counts: HashMap::default(),
        }
    }

    fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut ops = Vec::new();
        // Each request's reply and how many of `ops` are its.
        let mut replies: Vec<(oneshot::Sender<BatchOutcome>, usize)> = Vec::new();
        // Only to wait for a request with a timeout while unhealthy.
        let timer = tokio::runtime::Builder::new_current_thread().enable_time().build();
        loop {
            // Healthy: wait for work. Unhealthy: also look every RECOVERY_POLL whether the
            // disk has room again, so the store recovers without waiting for a write.
            let first = match (&timer, self.store.health()) {
                (Ok(timer), Health::DiskFull | Health::Failed) => {
                    match timer.block_on(async { tokio::time::timeout(RECOVERY_POLL, rx.recv()).await }) {
                        Ok(Some(r)) => r,
                        Ok(None) => break,
                        Err(_) => {
                            self.admission();
                            continue;
                        }
                    }
                }
                _ => match rx.blocking_recv() {
                    Some(r) => r,
                    None => break,
                },
            };
            let round = Instant::now();
            let mut next = Some(first);
            while let Some(Request { ops: mut more, reply }) = next.take() {
                replies.push((reply, more.len()));
                ops.append(&mut more);
                if ops.len() < self.cfg.max_batch_ops {
                    next = rx.try_recv().ok();
                }
            }
            let mut results = match self.admission() {
                Admission::All => self.round(ops.drain(..), None),
                Admission::DeletesOnly(refusal) => self.round(ops.drain(..), Some(refusal)),
                Admission::Nothing(refusal) => ops.drain(..).map(|_| Err(refusal.duplicate())).collect(),
            };
            if results.iter().any(Result::is_ok) {
                let started = Instant::now();
                let mode = if self.cfg.fsync { PersistMode::SyncData } else { PersistMode::Buffer };
                match self.engine().and_then(|engine| Ok(engine.db.persist(mode)?)) {
                    Ok(()) => self.store.inner.outbox.synced(),
                    Err(e) => {
                        let e = self.fail(&e);
                        for r in &mut results {
                            *r = Err(e.duplicate());
                        }
                    }
                }
                self.stats.sync_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            self.stats.commit_nanos.record(u64::try_from(round.elapsed().as_nanos()).unwrap_or(u64::MAX));
            self.stats.commit_batch_ops.record(replies.len() as u64);
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            self.stats.ops.fetch_add(results.len() as u64, Ordering::Relaxed);
            let refused =
                results.iter().filter(|r| matches!(r, Err(StoreError::DiskFull(_) | StoreError::Unavailable))).count();
            self.stats.refused_unhealthy.fetch_add(refused as u64, Ordering::Relaxed);
            let mut results = results.into_iter();
            for (reply, n) in replies.drain(..) {
                // A requester that went away no longer needs the answer.
                let _ = reply.send(results.by_ref().take(n).collect());
            }
        }
        if self.store.health() != Health::Failed {
            // Checkpoint every latest row, so that the next start reads no `ts` rows for it.
            // A failure is logged by `fail`; the values are derived again at the next start.
            let mut seg = Segment::default();
            seg.latest_dirty.extend(self.latest.iter().filter(|(_, l)| l.newer_rows > 0).map(|(d, _)| *d));
            self.commit_segment(&mut seg, &mut []);
            if let Err(e) = self.engine().and_then(|engine| Ok(engine.db.persist(PersistMode::SyncAll)?)) {
                tracing::error!(error = %e, "final sync failed");
            }
        }
        tracing::debug!("writer stopped");
    }

    /// Takes the replica's lock and applies what other nodes changed (nothing without a
    /// replica); cached state is dropped when anything was applied.
    fn replica_begin(&mut self) -> Result<(), StoreError> {
        if self.store.replica_begin()? {
            self.forget_cached();
        }
        Ok(())
    }

    /// Drops what the writer caches of the shared rows (another node changed them).
    fn forget_cached(&mut self) {
        self.latest.clear();
        self.forget_counts();
    }

    /// Drops the cached device counts of gateways, of protocol identities and of tenants.
    fn forget_counts(&mut self) {
        self.gateway_counts.clear();
        self.identity_counts.clear();
        self.tenant_counts.clear();
    }

    /// A device transaction bounded by `max_devices_per_tenant`, seeded with the cached
    /// counts (write them back with [`DeviceTxn::take_counts`] once it committed).
    fn txn<'a>(
        store: &'a Store,
        engine: &'a Engine,
        cfg: &WriterConfig,
        counts: &HashMap<Option<uuid::Uuid>, usize>,
    ) -> DeviceTxn<'a> {
        let mut txn = DeviceTxn::new(store, engine);
        txn.tenant_cap = cfg.max_devices_per_tenant;
        txn.caps = cfg.tenant_device_caps.clone();
        if txn.tenant_cap > 0 || txn.caps.any() {
            txn.tenant_counts = counts.clone();
        }
        txn
    }

    /// The engine to write to.
    fn engine(&self) -> Result<Arc<Engine>, StoreError> {
        self.engine.clone().ok_or(StoreError::Unavailable)
    }

    /// Decides what this round may do, from the store's health and the free space; reopens
    /// a failed store once there is room again (at most once a second).
    fn admission(&mut self) -> Admission {
        let min_free = self.cfg.min_free_bytes;
        let free = self.space.free();
        let roomy = min_free == 0 || free.is_none_or(|f| f >= min_free);
        if self.store.health() == Health::Failed {
            // After running out of space, wait for some room before trying again.
            let room_to_recover = !self.no_space || free.is_none_or(|f| f >= min_free.max(RECOVERY_MIN_FREE));
            if !roomy || !room_to_recover || Instant::now() < self.next_reopen {
                return Admission::Nothing(self.refusal(free));
            }
            self.next_reopen = Instant::now() + Duration::from_secs(1);
            // The old engine must be closed before it can be opened again: let go of ours.
            self.engine = None;
            match self.store.reopen().and_then(|()| self.store.engine()) {
                Ok(engine) => {
                    self.engine = Some(engine);
                    self.no_space = false;
                    self.stats.reopens.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(data_dir = %self.store.inner.dir.display(), "storage reopened after a failure; writes are taken again");
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot reopen storage yet; retrying every second");
                    return Admission::Nothing(self.refusal(free));
                }
            }
        }
        if roomy {
            if self.store.health() != Health::Ok {
                tracing::warn!(free_mib = free.map(|f| f >> 20), "disk space available again; writes are taken again");
                self.store.set_health(Health::Ok);
            }
            Admission::All
        } else {
            if self.store.health() == Health::Ok {
                tracing::error!(free_mib = free.map(|f| f >> 20), min_free_mib = min_free >> 20, data_dir = %self.store.inner.dir.display(), "disk nearly full: refusing writes until space is freed (reads go on)");
                self.store.set_health(Health::DiskFull);
            }
            Admission::DeletesOnly(self.refusal(free))
        }
    }

    /// The error for a write refused while the store is unhealthy.
    fn refusal(&self, free: Option<u64>) -> StoreError {
        let min = self.cfg.min_free_bytes;
        match free {
            Some(f) if min > 0 && f < min => StoreError::DiskFull(format!(
                "{} MiB free in the data directory's file system, less than storage.min_free_mb = {} MiB; writes are refused until space is freed",
                f >> 20,
                min >> 20
            )),
            _ if self.no_space => StoreError::DiskFull("no space left in the data directory's file system; writes are refused until space is freed".into()),
            _ => StoreError::Unavailable,
        }
    }

    /// A write to the engine failed: the engine refuses writes from now on, so the store
    /// is marked failed (reopened once there is room) and cached state is dropped. The
    /// error for the requests of this round.
    fn fail(&mut self, e: &StoreError) -> StoreError {
        if self.store.health() != Health::Failed {
            tracing::error!(error = %e, "storage write failed; refusing writes until the store is reopened (reads go on)");
        }
        self.store.set_health(Health::Failed);
        self.no_space |= is_no_space(e);
        self.forget_cached();
        self.space.invalidate();
        let free = self.space.free();
        match self.refusal(free) {
            StoreError::Unavailable => StoreError::CommitFailed(e.to_string()),
            full => full,
        }
    }

    /// Applies one round of requests; returns one result per request.
    /// With `refusal`, only deletes are applied and every other op gets that error.
    fn round(
        &mut self,
        ops: impl ExactSizeIterator<Item = WriteOp>,
        refusal: Option<StoreError>,
    ) -> Vec<Result<WriteOutcome, StoreError>> {
        if self.latest.len() > LATEST_CACHE_DEVICES {
            self.latest.clear();
        }
        let mut results: Vec<Result<WriteOutcome, StoreError>> =
            (0..ops.len()).map(|_| Ok(WriteOutcome::Done)).collect();
        let mut seg = Segment::default();
        let filter = self.store.inner.outbox.filter.read().clone();
        for (i, op) in ops.enumerate() {
            if let Some(refusal) = refusal.as_ref().filter(|_| !op.is_delete()) {
                results[i] = Err(refusal.duplicate());
                continue;
            }
            // Copied before the op is consumed; kept only if the op succeeds.
            let outboxed = filter.as_ref().filter(|f| f.wants(&op)).and_then(|_| OutboxEvent::of(&op));
            match op {
                WriteOp::Telemetry { device, records } => {
                    results[i] = self.telemetry(&mut seg, device, records);
                    seg.members.push(i);
                }
                WriteOp::Attributes { device, scope, values } => {
                    results[i] =
                        self.attributes(&mut seg, device, scope, values.into_iter().map(|(k, v)| (k, Some(v))));
                    seg.members.push(i);
                }
                WriteOp::DeleteAttributes { device, scope, keys } => {
                    results[i] = self.attributes(&mut seg, device, scope, keys.into_iter().map(|k| (k, None)));
                    seg.members.push(i);
                }
                WriteOp::Outbox(e) => {
                    seg.outbox.push(e.encode(Ts::now()));
                    seg.members.push(i);
                }
                WriteOp::CatchUp => {
                    // Without the lock: nothing is written but what others changed.
                    self.commit_segment(&mut seg, &mut results);
                    results[i] = self.store.replica_catch_up().map(|applied| {
                        if applied {
                            self.forget_cached();
                        }
                        WriteOutcome::Done
                    });
                }
                WriteOp::ReserveKeys(names) => {
                    results[i] =
                        names.iter().try_for_each(|n| self.intern(&mut seg, n).map(drop)).map(|()| WriteOutcome::Done);
                    seg.members.push(i);
                }
                WriteOp::Broker(rows) => {
                    // An application user name may not be a device's access token.
                    let clash = rows
                        .iter()
                        .find(|r| r.table == BrokerTable::Credentials && r.value.is_some())
                        .map(|r| self.engine().and_then(|e| Ok(e.ks.tokens.contains_key(&r.key)?)));
                    match clash {
                        Some(Err(e)) => results[i] = Err(e),
                        Some(Ok(true)) => {
                            results[i] = Err(StoreError::CredentialClash(
                                "user name is a device access token; choose another".into(),
                            ))
                        }
                        _ => {
                            for r in rows {
                                seg.broker.insert(r.table.key(&r.key), r.value);
                            }
                            seg.members.push(i);
                        }
                    }
                }
                heavy => {
                    self.commit_segment(&mut seg, &mut results);
                    if self.store.health() == Health::Failed {
                        results[i] = Err(StoreError::Unavailable);
                        continue;
                    }
                    // With a replica: the cluster's lock, and every other node's change, first.
                    results[i] = self.replica_begin().and_then(|()| self.heavy(heavy));
                    self.store.replica_release();
                    if let Err(e) = &results[i] {
                        // Whatever it half-did is not committed; forget cached state.
                        self.latest.clear();
                        if matches!(e, StoreError::Db(_)) {
                            results[i] = Err(self.fail(e));
                        }
                    }
                }
            }
            if let Some(e) = outboxed.filter(|_| results[i].is_ok()) {
                seg.outbox.push(e.encode(Ts::now()));
                // A heavy op committed on its own: its entry is the next segment's first
                // (synced with it, before any reply).
                if seg.members.last() != Some(&i) {
                    seg.members.push(i);
                }
            }
        }
        self.commit_segment(&mut seg, &mut results);
        results
    }

    fn alive(&self, seg: &mut Segment, device: DeviceId) -> Result<bool, StoreError> {
        // Devices are deleted only by this writer, which drops them from the latest cache:
        // a cached device exists, without a read.
        if self.latest.contains_key(&device) {
            return Ok(true);
        }
        if let Some(a) = seg.alive.get(&device) {
            return Ok(*a);
        }
        // An asset, a customer and a tenant hold data under their ids as a device does.
        let ks = &self.engine()?.ks;
        let mut a = ks.devices.contains_key(device.as_bytes())?;
        for kind in [DocKind::Asset, DocKind::Customer, DocKind::Tenant] {
            if a {
                break;
            }
            a = ks.docs.contains_key(kind.key(device.0))?;
        }
        seg.alive.insert(device, a);
        Ok(a)
    }

    fn load_latest(&mut self, device: DeviceId) -> Result<&mut Latest, StoreError> {
        if !self.latest.contains_key(&device) {
            let d = self.engine()?.latest(device)?;
            let since = (d.newer_rows > 0).then(Instant::now);
            if let Some(since) = since {
                self.unsaved.push_back((since, device));
            }
            self.latest
                .insert(device, Latest { row: d.row, checkpoint: d.checkpoint, newer_rows: d.newer_rows, since });
        }
        self.latest.get_mut(&device).ok_or(StoreError::Corrupt("latest cache"))
    }

    fn intern(&self, seg: &mut Segment, name: &str) -> Result<KeyId, StoreError> {
        if let Some(id) = self.store.inner.keys.read().id(name) {
            return Ok(id);
        }
        let mut dict = self.store.inner.keys.write();
        if dict.len() >= self.cfg.max_keys {
            return Err(StoreError::Limit(format!("too many distinct telemetry keys (limit {})", self.cfg.max_keys)));
        }
        let id = dict.intern(name);
        seg.new_keys.push((name.to_owned(), id));
        Ok(id)
    }

    fn telemetry(
        &mut self,
        seg: &mut Segment,
        device: DeviceId,
        records: Arc<[TsRecord]>,
    ) -> Result<WriteOutcome, StoreError> {
        if !self.alive(seg, device)? {
            return Err(StoreError::DeviceNotFound);
        }
        let mut interned = Vec::with_capacity(records.len());
        for rec in records.iter() {
            let mut vals = Vec::with_capacity(rec.values.len());
            for (k, v) in &rec.values {
                vals.push((self.intern(seg, k)?, v.clone()));
            }
            interned.push((rec.ts, vals));
        }
        let ks_ts = self.engine()?.ks.ts.clone();
        let entry = self.load_latest(device)?;
        // A point at or before the checkpoint must be in the checkpoint: write it now.
        let urgent = interned.iter().any(|(ts, _)| *ts <= entry.checkpoint);
        entry.newer_rows += interned.len() as u32;
        let fresh = entry.since.is_none();
        let since = *entry.since.get_or_insert_with(Instant::now);
        let due = urgent || entry.newer_rows >= CHECKPOINT_ROWS;
        let latest = &mut entry.row;
        // No stored row can be newer than the newest latest value of the device.
        let mut max_ts = latest.iter().map(|e| e.1).max().unwrap_or(Ts(i64::MIN));
        for (ts, vals) in interned {
            for (k, v) in &vals {
                match latest.iter_mut().find(|e| e.0 == *k) {
                    Some(e) if e.1 <= ts => {
                        e.1 = ts;
                        e.2 = v.clone();
                    }
                    Some(_) => {}
                    None => latest.push((*k, ts, v.clone())),
                }
            }
            let row = match seg.rows.entry((device, ts)) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    let existing = if ts <= max_ts {
                        match ks_ts.get(codec::ts_key(device, ts))? {
                            Some(v) => codec::decode_ts_row(&v)?,
                            None => Vec::new(),
                        }
                    } else {
                        Vec::new()
                    };
                    slot.insert(existing)
                }
            };
            for (k, v) in vals {
                match row.iter_mut().find(|e| e.0 == k) {
                    Some(e) => e.1 = v,
                    None => row.push((k, v)),
                }
            }
            max_ts = max_ts.max(ts);
            seg.records += 1;
        }
        if fresh {
            self.unsaved.push_back((since, device));
        }
        if due {
            seg.latest_dirty.insert(device);
        }
        Ok(WriteOutcome::Done)
    }

    fn attributes(
        &mut self,
        seg: &mut Segment,
        device: DeviceId,
        scope: AttributeScope,
        values: impl Iterator<Item = (String, Option<Value>)>,
    ) -> Result<WriteOutcome, StoreError> {
        if !self.alive(seg, device)? {
            return Err(StoreError::DeviceNotFound);
        }
        let now = Ts::now();
        for (k, v) in values {
            seg.attrs.insert(codec::attr_key(device, scope.tag(), &k), v.map(|v| (now, v)));
        }
        Ok(WriteOutcome::Done)
    }

    /// Writes a segment as one atomic batch (not yet synced).
    fn commit_segment(&mut self, seg: &mut Segment, results: &mut [Result<WriteOutcome, StoreError>]) {
        if seg.members.is_empty() && seg.latest_dirty.is_empty() {
            return;
        }
        if !seg.attrs.is_empty() || !seg.broker.is_empty() {
            // The latest-values cache stays: this segment's checkpoints are written from it
            // (and a replica's rows never touch the node's own time series).
            match self.store.replica_begin() {
                Ok(false) => {}
                Ok(true) => self.forget_counts(),
                Err(e) => {
                    for &i in &seg.members {
                        results[i] = Err(e.duplicate());
                    }
                    seg.members.clear();
                    return;
                }
            }
        }
        let engine = match self.engine() {
            Ok(e) => e,
            Err(e) => {
                for &i in &seg.members {
                    results[i] = Err(e.duplicate());
                }
                seg.members.clear();
                return;
            }
        };
        let ks = &engine.ks;
        let mut batch = Batch::new(&engine);
        for (name, id) in seg.new_keys.drain(..) {
            batch.insert(&ks.keys, name.into_bytes(), id.to_be_bytes().to_vec());
        }
        for ((device, ts), row) in seg.rows.drain() {
            batch.insert(&ks.ts, codec::ts_key(device, ts).to_vec(), codec::encode_ts_row(&row));
        }
        // Checkpoints that came of age ride along with this batch.
        while let Some(&(since, device)) = self.unsaved.front() {
            if since.elapsed() < CHECKPOINT_AGE {
                break;
            }
            self.unsaved.pop_front();
            if self.latest.get(&device).is_some_and(|l| l.since == Some(since)) {
                seg.latest_dirty.insert(device);
            }
        }
        for device in seg.latest_dirty.drain() {
            if let Some(l) = self.latest.get_mut(&device) {
                batch.insert(&ks.latest, device.as_bytes().to_vec(), codec::encode_latest_row(&l.row));
                // Taken as written; a failed commit clears the cache, which is then derived
                // from disk again.
                l.checkpoint = l.row.iter().map(|e| e.1).max().unwrap_or(Ts(i64::MIN));
                l.newer_rows = 0;
                l.since = None;
            }
        }
        for (key, v) in seg.attrs.drain() {
            match v {
                Some((ts, v)) => batch.insert(&ks.attrs, key, codec::encode_attr(ts, &v)),
                None => batch.remove(&ks.attrs, key),
            }
        }
        for (key, v) in seg.broker.drain() {
            match v {
                Some(v) => batch.insert(&ks.broker, key, v),
                None => batch.remove(&ks.broker, key),
            }
        }
        if !seg.outbox.is_empty() {
            let first = self.store.inner.outbox.next.fetch_add(seg.outbox.len() as u64, Ordering::AcqRel);
            for (seq, e) in (first..).zip(seg.outbox.drain(..)) {
                batch.insert(&ks.outbox, seq.to_be_bytes().to_vec(), e);
            }
        }
        let outcome = batch.commit(&self.store);
        self.store.replica_release();
        self.stats.records.fetch_add(std::mem::take(&mut seg.records), Ordering::Relaxed);
        if let Err(e) = outcome {
            // The replica failing leaves the local store as it was.
            let e = if matches!(e, StoreError::Database(_)) { e } else { self.fail(&e) };
            for &i in &seg.members {
                results[i] = Err(e.duplicate());
            }
        }
        seg.members.clear();
        seg.alive.clear();
    }

    fn heavy(&mut self, op: WriteOp) -> Result<WriteOutcome, StoreError> {
        match op {
            WriteOp::DeleteTelemetry(d) => self.delete_telemetry(d),
            WriteOp::SaveDevice(s) => {
                let engine = self.engine()?;
                let mut txn = Self::txn(&self.store, &engine, &self.cfg, &self.tenant_counts);
                let rec = txn.save(s, None)?;
                let counts = txn.take_counts();
                txn.commit()?;
                self.tenant_counts = counts;
                Ok(WriteOutcome::Device(Box::new(rec)))
            }
            WriteOp::SaveProfile(p) => {
                let engine = self.engine()?;
                let mut txn = DeviceTxn::new(&self.store, &engine);
                let rec = txn.save_profile(p)?;
                txn.commit()?;
                Ok(WriteOutcome::Profile(rec))
            }
            WriteOp::DeleteProfile(id) => {
                let engine = self.engine()?;
                let rec = self.store.profile(id)?.ok_or(StoreError::ProfileNotFound(id))?;
                if rec.default {
                    return Err(StoreError::ProfileIsDefault);
                }
                for kv in engine.ks.devices.iter() {
                    if decode_device(&kv.into_inner()?.1)?.profile_id() == id {
                        return Err(StoreError::ProfileInUse);
                    }
                }
                let mut batch = Batch::new(&engine);
                batch.remove(&engine.ks.profiles, id.0.as_bytes().to_vec());
                self.store.change_profiles(|| batch.commit(&self.store))?;
                Ok(WriteOutcome::Done)
            }
            WriteOp::SetDefaultProfile(id) => {
                let engine = self.engine()?;
                let target = self.store.profile(id)?.ok_or(StoreError::ProfileNotFound(id))?;
                let mut batch = Batch::new(&engine);
                let same_tenant = self.store.profiles()?;
                for p in same_tenant.iter().filter(|p| p.tenant == target.tenant && p.default != (p.id == id)) {
                    let p = ProfileRecord { default: p.id == id, ..p.clone() };
                    batch.insert(&engine.ks.profiles, p.id.0.as_bytes().to_vec(), encode_profile(&p)?);
                }
                self.store.change_profiles(|| batch.commit(&self.store))?;
                Ok(WriteOutcome::Profile(ProfileRecord { default: true, ..target }))
            }
            WriteOp::SaveDoc { kind, id, title, mut doc } => {
                let old = match id {
                    Some(id) => Some(self.store.doc(kind, id)?.ok_or(StoreError::DocNotFound(kind, id))?),
                    None => None,
                };
                if let Some(obj) = doc.as_object_mut() {
                    for f in kind.server_fields() {
                        match old.as_ref().and_then(|o| o.doc.get(*f)) {
                            Some(v) => obj.insert((*f).to_owned(), v.clone()),
                            None => obj.remove(*f),
                        };
                    }
                }
                let (id, created) = old.map_or_else(|| (uuid::Uuid::new_v4(), Ts::now().0), |o| (o.id, o.created_time));
                self.put_doc(kind, DocRecord { id, created_time: created, title, doc })
            }
            WriteOp::InsertDoc { kind, id, title, doc } => {
                if self.store.doc(kind, id)?.is_some() {
                    return Err(StoreError::Invalid(format!("{} {id} exists already", kind.name())));
                }
                self.put_doc(kind, DocRecord { id, created_time: Ts::now().0, title, doc })
            }
            WriteOp::PutDocs { kind, docs } => {
                if kind.unique_titles() {
                    return Err(StoreError::Invalid(format!("{kind:?} documents have unique titles: one at a time")));
                }
                let engine = self.engine()?;
                let mut batch = Batch::new(&engine);
                let now = Ts::now().0;
                for (id, title, doc) in docs {
                    if !doc.is_object() {
                        return Err(StoreError::Invalid("the document is a JSON object".into()));
                    }
                    let rec = DocRecord { id, created_time: now, title, doc };
                    batch.insert(&engine.ks.docs, kind.key(id), encode_doc(&rec)?);
                }
                batch.commit(&self.store)?;
                Ok(WriteOutcome::Done)
            }
            WriteOp::PutDoc { kind, id, title, doc } => {
                let created = self.store.doc(kind, id)?.map_or_else(|| Ts::now().0, |o| o.created_time);
                self.put_doc(kind, DocRecord { id, created_time: created, title, doc })
            }
            WriteOp::DeleteDoc(kind, id) => {
                let engine = self.engine()?;
                if !engine.ks.docs.contains_key(kind.key(id))? {
                    return Err(StoreError::DocNotFound(kind, id));
                }
                let mut batch = Batch::new(&engine);
                batch.remove(&engine.ks.docs, kind.key(id));
                if let Some(companion) = kind.companion() {
                    batch.remove(&engine.ks.docs, companion.key(id));
                }
                if matches!(kind, DocKind::Asset | DocKind::Customer | DocKind::Tenant) {
                    self.remove_data(&mut batch, &engine, DeviceId(id))?;
                }
                batch.commit(&self.store)?;
                Ok(WriteOutcome::Done)
            }
            WriteOp::PutOtaData { id, data, fields } => {
                let kind = DocKind::OtaPackage;
                let mut rec = self.store.doc(kind, id)?.ok_or(StoreError::DocNotFound(kind, id))?;
                if rec.doc.get("hasData").and_then(serde_json::Value::as_bool) == Some(true) {
                    return Err(StoreError::Invalid("Updating otaPackage data is prohibited!".into()));
                }
                if let Some(obj) = rec.doc.as_object_mut() {
                    obj.extend(fields);
                    obj.insert("hasData".into(), true.into());
                }
                let engine = self.engine()?;
                let mut batch = Batch::new(&engine);
                batch.insert(&engine.ks.docs, kind.key(id), encode_doc(&rec)?);
                batch.insert(&engine.ks.docs, DocKind::OtaData.key(id), data);
                batch.commit(&self.store)?;
                Ok(WriteOutcome::Doc(rec))
            }
            WriteOp::DeleteDevice(id) => {
                self.forget_counts();
                self.delete_device(id)
            }
            WriteOp::GatewayDevice { gateway, name, device_type, max_devices, adopt } => {
                self.gateway_device(gateway, name, device_type, max_devices, adopt)
            }
            WriteOp::SetIdentity { device, identity } => {
                self.identity_counts.clear();
                let engine = self.engine()?;
                let mut txn = DeviceTxn::new(&self.store, &engine);
                let old = txn.record(device)?.ok_or(StoreError::DeviceNotFound)?;
                if let Some(i) = &identity {
                    txn.check_identity(i, device)?;
                }
                let new = DeviceRecord { identity, ..old.clone() };
                txn.put(new.clone(), Some(&old))?;
                txn.commit()?;
                Ok(WriteOutcome::Device(Box::new(new)))
            }
            WriteOp::ProtocolDevice { identity, device_type, max_devices } => {
                identity.validate().map_err(|e| StoreError::Invalid(e.to_string()))?;
                let engine = self.engine()?;
                let mut txn = Self::txn(&self.store, &engine, &self.cfg, &self.tenant_counts);
                if let Some(id) = txn.identity_owner(&identity)? {
                    return Ok(WriteOutcome::Device(Box::new(txn.record(id)?.ok_or(StoreError::DeviceNotFound)?)));
                }
                let holders = match self.identity_counts.get(&identity.protocol) {
                    Some(n) => *n,
                    None => self.store.identity_count(&identity.protocol)?,
                };
                if holders >= max_devices {
                    self.identity_counts.insert(identity.protocol.clone(), holders);
                    return Err(StoreError::Limit(format!(
                        "{holders} devices have a {} identity, the limit (tcp.listeners max_devices); device {} was not created",
                        identity.protocol,
                        identity.device_name()
                    )));
                }
                let protocol = identity.protocol.clone();
                let save = SaveDevice {
                    profile: None,
                    tenant: None,
                    id: None,
                    name: identity.device_name(),
                    device_type,
                    label: None,
                    token: None,
                    additional_info: None,
                };
                let created = txn.save(save, None)?;
                let rec = DeviceRecord { identity: Some(identity), ..created.clone() };
                txn.put(rec.clone(), Some(&created))?;
                let counts = txn.take_counts();
                txn.commit()?;
                self.tenant_counts = counts;
                self.identity_counts.insert(protocol, holders + 1);
                Ok(WriteOutcome::Device(Box::new(rec)))
            }
            WriteOp::SetBasic { device, basic } => {
                let engine = self.engine()?;
                let mut txn = DeviceTxn::new(&self.store, &engine);
                let old = txn.record(device)?.ok_or(StoreError::DeviceNotFound)?;
                txn.check_basic(&basic, device)?;
                let token = txn.fresh_token()?;
                let new = DeviceRecord { basic: Some(basic), x509: None, token, ..old.clone() };
                txn.put(new.clone(), Some(&old))?;
                txn.commit()?;
                Ok(WriteOutcome::Device(Box::new(new)))
            }
            WriteOp::SetX509 { device, x509 } => {
                let engine = self.engine()?;
                let mut txn = DeviceTxn::new(&self.store, &engine);
                let old = txn.record(device)?.ok_or(StoreError::DeviceNotFound)?;
                if txn.basic_owner(&x509.index_key())?.is_some_and(|o| o != device) {
                    return Err(StoreError::CredentialClash("this certificate belongs to another device".into()));
                }
                let token = txn.fresh_token()?;
                let new = DeviceRecord { x509: Some(x509), basic: None, token, ..old.clone() };
                txn.put(new.clone(), Some(&old))?;
                txn.commit()?;
                Ok(WriteOutcome::Device(Box::new(new)))
            }
            WriteOp::SetDeviceOta { device, firmware, software } => {
                for id in [firmware, software].into_iter().flatten() {
                    self.store.doc(DocKind::OtaPackage, id)?.ok_or(StoreError::DocNotFound(DocKind::OtaPackage, id))?;
                }
                let engine = self.engine()?;
                let mut txn = DeviceTxn::new(&self.store, &engine);
                let old = txn.record(device)?.ok_or(StoreError::DeviceNotFound)?;
                let new = DeviceRecord { firmware, software, ..old.clone() };
                txn.put(new.clone(), Some(&old))?;
                txn.commit()?;
                Ok(WriteOutcome::Device(Box::new(new)))
            }
            WriteOp::AssignCustomer { device, customer } => {
                if let Some(c) = customer {
                    self.store.doc(DocKind::Customer, c)?.ok_or(StoreError::DocNotFound(DocKind::Customer, c))?;
                }
                let engine = self.engine()?;
                let mut txn = DeviceTxn::new(&self.store, &engine);
                let old = txn.record(device)?.ok_or(StoreError::DeviceNotFound)?;
                let new = DeviceRecord { customer, ..old.clone() };
                txn.put(new.clone(), Some(&old))?;
                txn.commit()?;
                Ok(WriteOutcome::Device(Box::new(new)))
            }
            WriteOp::DeleteTenant(tenant) => self.delete_tenant(tenant),
            WriteOp::SettingIfAbsent { name, value } => {
                let engine = self.engine()?;
                if let Some(v) = engine.ks.settings.get(&name)? {
                    return Ok(WriteOutcome::Setting(v.to_vec()));
                }
                let value = engine.ks.meta.get(&name)?.map_or(value, |v| v.to_vec());
                let mut batch = Batch::new(&engine);
                batch.insert(&engine.ks.settings, name, value.clone());
                batch.commit(&self.store)?;
                Ok(WriteOutcome::Setting(value))
            }
            WriteOp::SwapSetting { name, expect, value } => {
                let engine = self.engine()?;
                if engine.ks.settings.get(&name)?.as_deref() != expect.as_deref() {
                    return Ok(WriteOutcome::Swapped(false));
                }
                let mut batch = Batch::new(&engine);
                match value {
                    Some(v) => batch.insert(&engine.ks.settings, name, v),
                    None => batch.remove(&engine.ks.settings, name),
                }
                batch.commit(&self.store)?;
                Ok(WriteOutcome::Swapped(true))
            }
            WriteOp::DeleteCustomer(id) => {
                let engine = self.engine()?;
                if !engine.ks.docs.contains_key(DocKind::Customer.key(id))? {
                    return Err(StoreError::DocNotFound(DocKind::Customer, id));
                }
                let mut txn = DeviceTxn::new(&self.store, &engine);
                for kv in engine.ks.devices.iter() {
                    let d = decode_device(&kv.into_inner()?.1)?;
                    if d.customer == Some(id) {
                        txn.put(DeviceRecord { customer: None, ..d.clone() }, Some(&d))?;
                    }
                }
                for mut d in self.store.docs(DocKind::Dashboard)? {
                    if assign_to(&mut d.doc, id, false) {
                        txn.batch.insert(&engine.ks.docs, DocKind::Dashboard.key(d.id), encode_doc(&d)?);
                    }
                }
                // Its users go with it, as in ThingsBoard.
                let id_json = serde_json::Value::String(id.to_string());
                for u in self.store.docs(DocKind::User)? {
                    if u.doc.get("customerId") == Some(&id_json) {
                        txn.batch.remove(&engine.ks.docs, DocKind::User.key(u.id));
                        txn.batch.remove(&engine.ks.docs, DocKind::UserCredentials.key(u.id));
                    }
                }
                txn.batch.remove(&engine.ks.docs, DocKind::Customer.key(id));
                txn.commit()?;
                Ok(WriteOutcome::Done)
            }
            WriteOp::AssignDashboard { dashboard, customer, assign } => {
                let mut d = self
                    .store
                    .doc(DocKind::Dashboard, dashboard)?
                    .ok_or(StoreError::DocNotFound(DocKind::Dashboard, dashboard))?;
                if assign {
                    self.store
                        .doc(DocKind::Customer, customer)?
                        .ok_or(StoreError::DocNotFound(DocKind::Customer, customer))?;
                }
                assign_to(&mut d.doc, customer, assign);
                self.put_doc(DocKind::Dashboard, d)
            }
            WriteOp::AssignGateway { device, gateway } => {
                self.gateway_counts.clear();
                let engine = self.engine()?;
                let mut txn = DeviceTxn::new(&self.store, &engine);
                let old = txn.record(device)?.ok_or(StoreError::DeviceNotFound)?;
                if let Some(g) = gateway {
                    txn.require_gateway(g)?;
                }
                let new = DeviceRecord { gateway, ..old.clone() };
                txn.put(new.clone(), Some(&old))?;
                txn.commit()?;
                Ok(WriteOutcome::Device(Box::new(new)))
            }
            WriteOp::Import { tenant, rows, update } => {
                let engine = self.engine()?;
                let mut txn = Self::txn(&self.store, &engine, &self.cfg, &self.tenant_counts);
                let out = txn.import(tenant, rows, update)?;
                let counts = txn.take_counts();
                txn.commit()?;
                self.tenant_counts = counts;
                Ok(WriteOutcome::Import(out))
            }
            WriteOp::Telemetry { .. }
            | WriteOp::Attributes { .. }
            | WriteOp::DeleteAttributes { .. }
            | WriteOp::Broker(_)
            | WriteOp::ReserveKeys(_)
            | WriteOp::CatchUp
            | WriteOp::Outbox(_) => Err(StoreError::Corrupt("op routed wrongly")),
        }
    }

    /// Checks and writes a document ([`WriteOp::SaveDoc`], [`WriteOp::InsertDoc`]).
    fn put_doc(&self, kind: DocKind, rec: DocRecord) -> Result<WriteOutcome, StoreError> {
        let title = &rec.title;
        if title.trim().is_empty() || title.chars().count() > 255 || title.chars().any(char::is_control) {
            return Err(StoreError::Invalid(
                "title should be specified: 1 to 255 characters, without control characters".into(),
            ));
        }
        if !rec.doc.is_object() {
            return Err(StoreError::Invalid("the document is a JSON object".into()));
        }
        // Titles are unique in a tenant (`tenantId`); users' (their emails, login names) everywhere.
        let same_scope = |d: &DocRecord| kind == DocKind::User || d.doc.get("tenantId") == rec.doc.get("tenantId");
        if kind.unique_titles()
            && self.store.docs(kind)?.iter().any(|d| d.title == rec.title && d.id != rec.id && same_scope(d))
        {
            return Err(StoreError::TitleTaken(kind));
        }
        let engine = self.engine()?;
        let mut batch = Batch::new(&engine);
        batch.insert(&engine.ks.docs, kind.key(rec.id), encode_doc(&rec)?);
        batch.commit(&self.store)?;
        Ok(WriteOutcome::Doc(rec))
    }

    /// [`WriteOp::DeleteTenant`]: devices one by one (each with its data, as
    /// [`WriteOp::DeleteDevice`]), then profiles and documents in one batch.
    fn delete_tenant(&mut self, tenant: uuid::Uuid) -> Result<WriteOutcome, StoreError> {
        let engine = self.engine()?;
        if !engine.ks.docs.contains_key(DocKind::Tenant.key(tenant))? {
            return Err(StoreError::DocNotFound(DocKind::Tenant, tenant));
        }
        let mut devices = Vec::new();
        for kv in engine.ks.devices.iter() {
            let d = decode_device(&kv.into_inner()?.1)?;
            if d.tenant == Some(tenant) {
                devices.push(d.id);
            }
        }
        self.forget_counts();
        for id in devices {
            // Each device is its own commit (and publish): the lock again for the next.
            self.replica_begin()?;
            self.delete_device(id)?;
        }
        self.replica_begin()?;
        let mut batch = Batch::new(&engine);
        for p in self.store.profiles()?.iter().filter(|p| p.tenant == Some(tenant)) {
            batch.remove(&engine.ks.profiles, p.id.0.as_bytes().to_vec());
        }
        let id_json = serde_json::Value::String(tenant.to_string());
        for kind in [
            DocKind::Customer,
            DocKind::Dashboard,
            DocKind::User,
            DocKind::ApiKey,
            DocKind::OtaPackage,
            DocKind::Asset,
            DocKind::AssetProfile,
            DocKind::Relation,
            DocKind::Alarm,
            DocKind::AlarmComment,
            DocKind::NotificationTarget,
            DocKind::NotificationTemplate,
            DocKind::NotificationRule,
            DocKind::NotificationRequest,
            DocKind::Notification,
            DocKind::DataSink,
        ] {
            for d in self.store.docs(kind)? {
                if d.doc.get("tenantId") == Some(&id_json) {
                    if matches!(kind, DocKind::Asset | DocKind::Customer) {
                        self.remove_data(&mut batch, &engine, DeviceId(d.id))?;
                    }
                    batch.remove(&engine.ks.docs, kind.key(d.id));
                    if let Some(companion) = kind.companion() {
                        batch.remove(&engine.ks.docs, companion.key(d.id));
                    }
                }
            }
        }
        self.remove_data(&mut batch, &engine, DeviceId(tenant))?;
        batch.remove(&engine.ks.docs, DocKind::Tenant.key(tenant));
        self.store.change_profiles(|| batch.commit(&self.store))?;
        Ok(WriteOutcome::Done)
    }

    /// [`WriteOp::GatewayDevice`].
    fn gateway_device(
        &mut self,
        gateway: DeviceId,
        name: String,
        device_type: Option<String>,
        max_devices: usize,
        adopt: bool,
    ) -> Result<WriteOutcome, StoreError> {
        let engine = self.engine()?;
        let mut txn = Self::txn(&self.store, &engine, &self.cfg, &self.tenant_counts);
        txn.require_gateway(gateway)?;
        // A gateway's devices are of its tenant.
        let tenant = txn.record(gateway)?.and_then(|g| g.tenant);
        let existing = match txn.name_owner(tenant, &name)? {
            Some(id) => Some(txn.record(id)?.ok_or(StoreError::DeviceNotFound)?),
            None => None,
        };
        if let Some(rec) = &existing {
            match rec.gateway {
                Some(g) if g == gateway => return Ok(WriteOutcome::Device(Box::new(rec.clone()))),
                // Bound to another gateway: never taken over.
                Some(_) => return Err(StoreError::ForeignDevice(name)),
                None if rec.id == gateway || rec.is_gateway() => return Err(StoreError::ForeignDevice(name)),
                None => {
                    let profile = txn.store.profile(rec.profile_id())?;
                    if !adoption_allowed(profile.as_ref().map(|p| &p.doc), adopt) {
                        return Err(StoreError::ForeignDevice(name));
                    }
                }
            }
        }
        let owned = match self.gateway_counts.get(&gateway) {
            Some(n) => *n,
            None => self.store.gateway_devices(gateway)?.len(),
        };
        if owned >= max_devices {
            self.gateway_counts.insert(gateway, owned);
            let what = if existing.is_some() { "adopted" } else { "created" };
            return Err(StoreError::Limit(format!(
                "this gateway owns {owned} devices, the limit (limits.max_devices_per_gateway); device '{name}' was not {what}"
            )));
        }
        let rec = match existing {
            // Adopted: bound to the gateway, which ThingsBoard records as its last gateway.
            Some(old) => {
                let mut info = old
                    .additional_info
                    .clone()
                    .filter(serde_json::Value::is_object)
                    .unwrap_or_else(|| serde_json::json!({}));
                if let Some(o) = info.as_object_mut() {
                    o.insert("lastConnectedGateway".into(), gateway.to_string().into());
                }
                let new = DeviceRecord { gateway: Some(gateway), additional_info: Some(info), ..old.clone() };
                txn.put(new.clone(), Some(&old))?;
                new
            }
            None => txn.save(
                SaveDevice {
                    profile: None,
                    tenant,
                    id: None,
                    name,
                    device_type: device_type.unwrap_or_default(),
                    label: None,
                    token: None,
                    additional_info: Some(
                        serde_json::json!({"gateway": false, "lastConnectedGateway": gateway.to_string()}),
                    ),
                },
                Some(gateway),
            )?,
        };
        let counts = txn.take_counts();
        txn.commit()?;
        self.tenant_counts = counts;
        self.gateway_counts.insert(gateway, owned + 1);
        Ok(WriteOutcome::Device(Box::new(rec)))
    }

    fn delete_device(&mut self, id: DeviceId) -> Result<WriteOutcome, StoreError> {
        let engine = self.engine()?;
        let ks = &engine.ks;
        let Some(rec) = self.store.device(id)? else {
            return Err(StoreError::DeviceNotFound);
        };
        let mut batch = Batch::new(&engine);
        batch.remove(&ks.devices, id.as_bytes().to_vec());
        batch.remove(&ks.names, crate::name_key(rec.tenant, &rec.name));
        batch.remove(&ks.tokens, rec.token.clone().into_bytes());
        if let Some(i) = &rec.identity {
            batch.remove(&ks.identities, codec::identity_key(i));
        }
        if let Some(k) = rec.x509.as_ref().map(crate::X509Credentials::index_key) {
            batch.remove(&ks.basic, k);
        }
        if let Some(k) = rec.basic.as_ref().and_then(BasicCredentials::index_key) {
            batch.remove(&ks.basic, k);
        }
        self.remove_data(&mut batch, &engine, id)?;
        // Only when there is one: a removal is published to the other nodes as a document change.
        if ks.docs.contains_key(DocKind::AlarmRuleState.key(id.0))? {
            batch.remove(&ks.docs, DocKind::AlarmRuleState.key(id.0));
        }
        if let Some(g) = rec.gateway {
            batch.remove(&ks.gateways, gateway_key(g, id));
        }
        // A deleted gateway's devices belong to no gateway any more.
        for child in self.store.gateway_devices(id)? {
            batch.remove(&ks.gateways, gateway_key(id, child));
            if let Some(c) = self.store.device(child)? {
                batch.insert(
                    &ks.devices,
                    child.as_bytes().to_vec(),
                    encode_device(&DeviceRecord { gateway: None, ..c })?,
                );
            }
        }
        self.store.commit_token_change(batch, [rec.token])?;
        Ok(WriteOutcome::Done)
    }

    /// Adds to `batch` the removal of everything stored under `id` (a device's or an
    /// asset's attributes, time series and latest values), and forgets its cached latest.
    fn remove_data(&mut self, batch: &mut Batch, engine: &Engine, id: DeviceId) -> Result<(), StoreError> {
        let ks = &engine.ks;
        batch.remove(&ks.latest, id.as_bytes().to_vec());
        for kv in ks.attrs.prefix(id.as_bytes()) {
            batch.remove(&ks.attrs, kv.key()?);
        }
        for kv in ks.ts.prefix(id.as_bytes()) {
            batch.remove(&ks.ts, kv.key()?);
        }
        self.latest.remove(&id);
        Ok(())
    }

    fn delete_telemetry(&mut self, d: DeleteTelemetry) -> Result<WriteOutcome, StoreError> {
        let ks = self.engine()?.ks.ts.clone();
        let ids: Vec<KeyId> = self.store.key_ids(&d.keys).into_iter().map(|(id, _)| id).collect();
        if ids.is_empty() {
            return Ok(WriteOutcome::Done);
        }
        let (lo, hi) = match d.range {
            Some((s, e)) => (codec::ts_key(d.device, s), codec::ts_key(d.device, e)),
            None => (codec::ts_key(d.device, Ts(i64::MIN)), codec::ts_key(d.device, Ts(i64::MAX))),
        };
        let in_range = |ts: Ts| d.range.is_none_or(|(s, e)| ts >= s && ts < e);
        // The latest values are checkpointed first, in the same batch: once points are
        // deleted they could no longer be derived (and a kept latest value must stay).
        let row = self.load_latest(d.device)?.row.clone();
        let mut batch = Batch::new(&*self.engine()?);
        write_latest(&mut batch, &*self.engine()?, d.device, &row);
        for kv in ks.range(lo..hi) {
            let (k, v) = kv.into_inner()?;
            let mut row = codec::decode_ts_row(&v)?;
            let before = row.len();
            row.retain(|(id, _)| !ids.contains(id));
            if row.len() == before {
                continue;
            }
            if row.is_empty() {
                batch.remove(&ks, k);
            } else {
                batch.insert(&ks, k, codec::encode_ts_row(&row));
            }
        }
        // `range(lo..hi)` excludes `hi` itself; the open-ended delete must include i64::MAX.
        if d.range.is_none() {
            if let Some(v) = ks.get(hi)? {
                let mut row = codec::decode_ts_row(&v)?;
                row.retain(|(id, _)| !ids.contains(id));
                if row.is_empty() {
                    batch.remove(&ks, hi.to_vec());
                } else {
                    batch.insert(&ks, hi.to_vec(), codec::encode_ts_row(&row));
                }
            }
        }
        batch.commit(&self.store)?;
        // Its checkpoint moved: derive the cached entry again.
        self.latest.remove(&d.device);
        if !d.delete_latest {
            return Ok(WriteOutcome::Done);
        }
        let latest = self.load_latest(d.device)?.row.clone();
        let mut changed = false;
        let mut kept = Vec::with_capacity(latest.len());
        for (k, ts, v) in latest {
            if ids.contains(&k) && in_range(ts) {
                changed = true;
                if d.rewrite_latest {
                    if let Some((ts, v)) = self.newest_point(d.device, k)? {
                        kept.push((k, ts, v));
                    }
                }
            } else {
                kept.push((k, ts, v));
            }
        }
        if changed {
            let engine = self.engine()?;
            let mut batch = Batch::new(&engine);
            write_latest(&mut batch, &engine, d.device, &kept);
            batch.commit(&self.store)?;
            self.latest.remove(&d.device);
        }
        Ok(WriteOutcome::Done)
    }

    /// The newest stored point of one key of a device.
    fn newest_point(&self, device: DeviceId, key: KeyId) -> Result<Option<(Ts, Value)>, StoreError> {
        for kv in self.engine()?.ks.ts.prefix(device.as_bytes()).rev() {
            let (k, v) = kv.into_inner()?;
            if let Some((_, val)) = codec::decode_ts_row(&v)?.into_iter().find(|e| e.0 == key) {
                return Ok(Some((codec::ts_of_key(&k)?, val)));
            }
        }
        Ok(None)
    }
}

/// Key of the `gateways` index: gateway ‖ device.
fn gateway_key(gateway: DeviceId, device: DeviceId) -> Vec<u8> {
    let mut k = Vec::with_capacity(32);
    k.extend_from_slice(gateway.as_bytes());
    k.extend_from_slice(device.as_bytes());
    k
}

fn write_latest(batch: &mut Batch, engine: &Engine, device: DeviceId, row: &[(KeyId, Ts, Value)]) {
    let ks = &engine.ks.latest;
    if row.is_empty() {
        batch.remove(ks, device.as_bytes().to_vec());
    } else {
        batch.insert(ks, device.as_bytes().to_vec(), codec::encode_latest_row(row));
    }
}

/// Adds `customer` to (`assign`) or removes it from a dashboard document's
/// `assignedCustomerIds`; whether the document changed.
fn assign_to(doc: &mut serde_json::Value, customer: uuid::Uuid, assign: bool) -> bool {
    let Some(obj) = doc.as_object_mut() else { return false };
    let list = obj.entry("assignedCustomerIds").or_insert_with(|| serde_json::json!([]));
    let Some(ids) = list.as_array_mut() else { return false };
    let id = serde_json::Value::String(customer.to_string());
    let had = ids.contains(&id);
    match (assign, had) {
        (true, false) => ids.push(id),
        (false, true) => ids.retain(|v| *v != id),
        _ => return false,
    }
    true
}

/// Device creates and updates inside one batch, with an overlay so later rows of the
/// same import see earlier ones.
struct DeviceTxn<'a> {
    store: &'a Store,
    engine: &'a Engine,
    batch: Batch,
    /// name index key → owner as of this transaction (`None`: freed).
    names: HashMap<Vec<u8>, Option<DeviceId>>,
    tokens: HashMap<String, Option<DeviceId>>,
    /// `identities` key → owner as of this transaction.
    identities: HashMap<Vec<u8>, Option<DeviceId>>,
    /// `basic` key → owner as of this transaction.
    basic: HashMap<Vec<u8>, Option<DeviceId>>,
    records: HashMap<DeviceId, DeviceRecord>,
    /// Profiles written by this transaction (they win over the store's).
    staged_profiles: Vec<ProfileRecord>,
    /// Most devices per tenant (0: no bound).
    tenant_cap: usize,
    /// Single tenants' tighter bounds.
    caps: Arc<TenantCaps>,
    /// Devices per tenant as of this transaction, counted on first need (only when bounded).
    tenant_counts: HashMap<Option<uuid::Uuid>, usize>,
}

impl<'a> DeviceTxn<'a> {
    fn new(store: &'a Store, engine: &'a Engine) -> Self {
        Self {
            store,
            engine,
            batch: Batch::new(engine),
            names: HashMap::default(),
            tokens: HashMap::default(),
            identities: HashMap::default(),
            basic: HashMap::default(),
            records: HashMap::default(),
            staged_profiles: Vec::new(),
            tenant_cap: 0,
            caps: Arc::default(),
            tenant_counts: HashMap::default(),
        }
    }

    /// The devices per tenant as of this transaction, for the writer's cache.
    fn take_counts(&mut self) -> HashMap<Option<uuid::Uuid>, usize> {
        std::mem::take(&mut self.tenant_counts)
    }

    /// How many devices `tenant` has as of this transaction: its entries in the name index
    /// (keys only), counted once per transaction unless the writer knew it already.
    fn tenant_devices(&mut self, tenant: Option<uuid::Uuid>) -> Result<usize, StoreError> {
        if let Some(n) = self.tenant_counts.get(&tenant) {
            return Ok(*n);
        }
        let names = &self.engine.ks.names;
        let mut n = 0;
        match tenant {
            // The first tenant's names are the bare names: every key below 0xFF.
            None => {
                for kv in names.range(..vec![0xFFu8]) {
                    kv.key()?;
                    n += 1;
                }
            }
            Some(t) => {
                for kv in names.prefix(crate::name_key(Some(t), "")) {
                    kv.key()?;
                    n += 1;
                }
            }
        }
        self.tenant_counts.insert(tenant, n);
        Ok(n)
    }

    /// The first profile, as of this transaction, that `pred` accepts.
    fn find_profile(&self, pred: impl Fn(&ProfileRecord) -> bool) -> Result<Option<ProfileRecord>, StoreError> {
        let staged = &self.staged_profiles;
        if let Some(p) = staged.iter().find(|p| pred(p)) {
            return Ok(Some(p.clone()));
        }
        let stored = self.store.profiles()?;
        Ok(stored.iter().filter(|p| staged.iter().all(|s| s.id != p.id)).find(|p| pred(p)).cloned())
    }

    /// Stages `p` as the profile of its id.
    fn put_profile(&mut self, p: ProfileRecord) -> Result<(), StoreError> {
        self.batch.insert(&self.engine.ks.profiles, p.id.0.as_bytes().to_vec(), encode_profile(&p)?);
        self.staged_profiles.retain(|q| q.id != p.id);
        self.staged_profiles.push(p);
        Ok(())
    }

    /// The profile a saved device gets: `id` (must exist); else the one named `name`,
    /// created if there is none; else (`name` empty) `current`'s, or the default one.
    fn resolve_profile(
        &mut self,
        tenant: Option<uuid::Uuid>,
        id: Option<ProfileId>,
        name: &str,
        current: Option<ProfileId>,
    ) -> Result<ProfileRecord, StoreError> {
        // Only the tenant's own profiles: another tenant's id is as unknown as a wrong one.
        let found = match (id, name, current) {
            (Some(id), _, _) => {
                Some(self.find_profile(|p| p.id == id && p.tenant == tenant)?.ok_or(StoreError::ProfileNotFound(id))?)
            }
            (None, "", Some(c)) => match self.find_profile(|p| p.id == c && p.tenant == tenant)? {
                Some(p) => Some(p),
                None => self.find_profile(|p| p.default && p.tenant == tenant)?,
            },
            (None, "", None) => self.find_profile(|p| p.default && p.tenant == tenant)?,
            (None, name, _) => self.find_profile(|p| p.name == name && p.tenant == tenant)?,
        };
        if let Some(p) = found {
            return Ok(p);
        }
        let name = if name.is_empty() { DEFAULT_PROFILE } else { name };
        let doc = serde_json::json!({"type": "DEFAULT", "transportType": "DEFAULT", "provisionType": "DISABLED"});
        let p = ProfileRecord {
            id: ProfileId::new_random(),
            created_time: Ts::now().0,
            name: name.to_owned(),
            default: self.find_profile(|p| p.default && p.tenant == tenant)?.is_none(),
            doc,
            tenant,
        };
        self.put_profile(p.clone())?;
        Ok(p)
    }

    /// [`WriteOp::SaveProfile`]: a renamed profile's devices take the new name as their type.
    fn save_profile(&mut self, s: SaveProfile) -> Result<ProfileRecord, StoreError> {
        if s.name.trim().is_empty() {
            return Err(StoreError::Invalid("Device profile name should be specified!".into()));
        }
        if s.name.chars().count() > 255 || s.name.chars().any(char::is_control) {
            return Err(StoreError::Invalid(
                "device profile name must be at most 255 characters, without control characters".into(),
            ));
        }
        if !s.doc.is_object() {
            return Err(StoreError::Invalid("a device profile is a JSON object".into()));
        }
        let old = match s.id {
            Some(id) => Some(self.find_profile(|p| p.id == id)?.ok_or(StoreError::ProfileNotFound(id))?),
            None => None,
        };
        let id = old.as_ref().map_or_else(ProfileId::new_random, |o| o.id);
        let tenant = old.as_ref().map_or(s.tenant, |o| o.tenant);
        if self.find_profile(|p| p.name == s.name && p.id != id && p.tenant == tenant)?.is_some() {
            return Err(StoreError::ProfileNameTaken(s.name));
        }
        let rec = ProfileRecord {
            id,
            created_time: old.as_ref().map_or_else(|| Ts::now().0, |o| o.created_time),
            name: s.name,
            // A tenant's first profile is its default.
            default: match &old {
                Some(o) => o.default,
                None => self.find_profile(|p| p.default && p.tenant == tenant)?.is_none(),
            },
            doc: s.doc,
            tenant,
        };
        if old.as_ref().is_some_and(|o| o.name != rec.name) {
            for kv in self.engine.ks.devices.iter() {
                let d = decode_device(&kv.into_inner()?.1)?;
                if d.profile_id() == id {
                    let new = DeviceRecord { device_type: rec.name.clone(), profile: Some(id), ..d.clone() };
                    self.put(new, Some(&d))?;
                }
            }
        }
        self.put_profile(rec.clone())?;
        Ok(rec)
    }

    fn commit(self) -> Result<(), StoreError> {
        let (store, batch, changed) = (self.store, self.batch, self.tokens.into_keys());
        if self.staged_profiles.is_empty() {
            return store.commit_token_change(batch, changed);
        }
        store.change_profiles(|| store.commit_token_change(batch, changed))
    }

    fn name_owner(&self, tenant: Option<uuid::Uuid>, name: &str) -> Result<Option<DeviceId>, StoreError> {
        let key = crate::name_key(tenant, name);
        match self.names.get(&key) {
            Some(o) => Ok(*o),
            None => self.engine.ks.names.get(key)?.map(|v| id_from(&v)).transpose(),
        }
    }

    /// A device token may not be an MQTT application's user name.
    fn check_not_a_user_name(&self, token: &str) -> Result<(), StoreError> {
        if self.engine.ks.broker.contains_key(BrokerTable::Credentials.key(token.as_bytes()))? {
            return Err(StoreError::CredentialClash(
                "access token is an MQTT application user name; choose another".into(),
            ));
        }
        Ok(())
    }

    fn token_owner(&self, token: &str) -> Result<Option<DeviceId>, StoreError> {
        match self.tokens.get(token) {
            Some(o) => Ok(*o),
            None => self.store.device_id_by_token(token),
        }
    }

    fn identity_owner(&self, identity: &ProtocolIdentity) -> Result<Option<DeviceId>, StoreError> {
        match self.identities.get(&codec::identity_key(identity)) {
            Some(o) => Ok(*o),
            None => self.store.device_id_by_identity(identity),
        }
    }

    /// `identity` is well-formed and no device but `device` has it.
    fn check_identity(&self, identity: &ProtocolIdentity, device: DeviceId) -> Result<(), StoreError> {
        identity.validate().map_err(|e| StoreError::Invalid(e.to_string()))?;
        if self.identity_owner(identity)?.is_some_and(|o| o != device) {
            return Err(StoreError::IdentityTaken(format!("{}:{}", identity.protocol, identity.id)));
        }
        Ok(())
    }

    /// The owner of a `basic` index key as of this transaction.
    fn basic_owner(&self, key: &[u8]) -> Result<Option<DeviceId>, StoreError> {
        match self.basic.get(key) {
            Some(o) => Ok(*o),
            None => self.engine.ks.basic.get(key)?.map(|v| id_from(&v)).transpose(),
        }
    }

    /// `basic` is well-formed, no other device has it, and its user name is neither a
    /// device's access token nor an MQTT application's user name (a CONNECT must name one
    /// thing only).
    fn check_basic(&self, basic: &BasicCredentials, device: DeviceId) -> Result<(), StoreError> {
        let key =
            basic.index_key().ok_or_else(|| StoreError::Invalid("MQTT_BASIC needs a clientId or a userName".into()))?;
        for v in [&basic.client_id, &basic.user_name].into_iter().flatten() {
            if v.is_empty() || v.chars().count() > 255 || v.chars().any(char::is_control) {
                return Err(StoreError::Invalid(
                    "clientId and userName are 1 to 255 characters without control characters".into(),
                ));
            }
        }
        if self.basic_owner(&key)?.is_some_and(|o| o != device) {
            return Err(StoreError::CredentialClash("these MQTT_BASIC credentials belong to another device".into()));
        }
        if let Some(u) = &basic.user_name {
            if self.token_owner(u)?.is_some_and(|o| o != device) {
                return Err(StoreError::CredentialClash("this userName is another device's access token".into()));
            }
            self.check_not_a_user_name(u)?;
        }
        Ok(())
    }

    /// `NotGateway` unless device `id` is a gateway (`DeviceNotFound` if there is none).
    fn require_gateway(&self, id: DeviceId) -> Result<(), StoreError> {
        match self.record(id)? {
            Some(d) if d.is_gateway() => Ok(()),
            Some(_) => Err(StoreError::NotGateway),
            None => Err(StoreError::DeviceNotFound),
        }
    }

    fn record(&self, id: DeviceId) -> Result<Option<DeviceRecord>, StoreError> {
        match self.records.get(&id) {
            Some(r) => Ok(Some(r.clone())),
            None => self.store.device(id),
        }
    }

    /// Stages `new`, replacing `old` (same id) if given.
    fn put(&mut self, new: DeviceRecord, old: Option<&DeviceRecord>) -> Result<(), StoreError> {
        let ks = &self.engine.ks;
        if let Some(old) = old {
            if old.name != new.name || old.tenant != new.tenant {
                let key = crate::name_key(old.tenant, &old.name);
                self.batch.remove(&ks.names, key.clone());
                self.names.insert(key, None);
            }
            if old.token != new.token {
                self.batch.remove(&ks.tokens, old.token.clone().into_bytes());
                self.tokens.insert(old.token.clone(), None);
            }
            if let Some(g) = old.gateway.filter(|_| old.gateway != new.gateway) {
                self.batch.remove(&ks.gateways, gateway_key(g, old.id));
            }
            if let Some(i) = old.identity.as_ref().filter(|_| old.identity != new.identity) {
                let key = codec::identity_key(i);
                self.batch.remove(&ks.identities, key.clone());
                self.identities.insert(key, None);
            }
        }
        if let Some(k) = old.and_then(|o| o.basic.as_ref()).and_then(BasicCredentials::index_key) {
            self.batch.remove(&ks.basic, k.clone());
            self.basic.insert(k, None);
        }
        if let Some(k) = old.and_then(|o| o.x509.as_ref()).map(crate::X509Credentials::index_key) {
            self.batch.remove(&ks.basic, k.clone());
            self.basic.insert(k, None);
        }
        if let Some(k) = new.x509.as_ref().map(crate::X509Credentials::index_key) {
            self.batch.insert(&ks.basic, k.clone(), new.id.as_bytes().to_vec());
            self.basic.insert(k, Some(new.id));
        }
        if let Some(k) = new.basic.as_ref().and_then(BasicCredentials::index_key) {
            self.batch.insert(&ks.basic, k.clone(), new.id.as_bytes().to_vec());
            self.basic.insert(k, Some(new.id));
        }
        if let Some(i) = &new.identity {
            let key = codec::identity_key(i);
            self.batch.insert(&ks.identities, key.clone(), new.id.as_bytes().to_vec());
            self.identities.insert(key, Some(new.id));
        }
        if let Some(g) = new.gateway {
            self.batch.insert(&ks.gateways, gateway_key(g, new.id), Vec::new());
        }
        let id = new.id.as_bytes().to_vec();
        self.batch.insert(&ks.devices, id.clone(), encode_device(&new)?);
        let name_key = crate::name_key(new.tenant, &new.name);
        self.batch.insert(&ks.names, name_key.clone(), id.clone());
        self.batch.insert(&ks.tokens, new.token.clone().into_bytes(), id);
        self.names.insert(name_key, Some(new.id));
        self.tokens.insert(new.token.clone(), Some(new.id));
        self.records.insert(new.id, new);
        Ok(())
    }

    fn fresh_token(&self) -> Result<String, StoreError> {
        loop {
            let t = crate::generate_token();
            if self.token_owner(&t)?.is_none() && self.check_not_a_user_name(&t).is_ok() {
                return Ok(t);
            }
        }
    }

    /// Stages a create or update; a created device belongs to `gateway`, an updated one
    /// keeps its gateway.
    fn save(&mut self, s: SaveDevice, gateway: Option<DeviceId>) -> Result<DeviceRecord, StoreError> {
        s.validate()?;
        let old = match s.id {
            Some(id) => Some(self.record(id)?.ok_or(StoreError::DeviceNotFound)?),
            None => None,
        };
        let id = old.as_ref().map_or_else(DeviceId::new_random, |o| o.id);
        let tenant = old.as_ref().map_or(s.tenant, |o| o.tenant);
        if self.name_owner(tenant, &s.name)?.is_some_and(|o| o != id) {
            return Err(StoreError::NameTaken(s.name));
        }
        let count = match (&old, self.caps.of(tenant, self.tenant_cap)) {
            (None, (cap, why, own)) if cap > 0 => {
                let n = self.tenant_devices(tenant)?;
                if n >= cap {
                    if own {
                        self.caps.refused.fetch_add(1, Ordering::Relaxed);
                    }
                    return Err(StoreError::EntitiesLimit(format!(
                        "this tenant has {n} devices, the limit ({why}); device '{}' was not created",
                        s.name
                    )));
                }
                Some(n)
            }
            _ => None,
        };
        let token = match (&s.token, &old) {
            (Some(t), _) => {
                if self.token_owner(t)?.is_some_and(|o| o != id) {
                    return Err(StoreError::TokenTaken);
                }
                if self.basic_owner(&[b"u".as_slice(), t.as_bytes()].concat())?.is_some_and(|o| o != id) {
                    return Err(StoreError::CredentialClash(
                        "access token is another device's MQTT_BASIC userName".into(),
                    ));
                }
                self.check_not_a_user_name(t)?;
                t.clone()
            }
            (None, Some(o)) => o.token.clone(),
            (None, None) => self.fresh_token()?,
        };
        let profile =
            self.resolve_profile(tenant, s.profile, &s.device_type, old.as_ref().map(DeviceRecord::profile_id))?;
        let rec = DeviceRecord {
            id,
            created_time: old.as_ref().map_or_else(|| Ts::now().0, |o| o.created_time),
            name: s.name,
            device_type: profile.name,
            profile: Some(profile.id),
            label: s.label,
            token,
            additional_info: s.additional_info,
            gateway: old.as_ref().map_or(gateway, |o| o.gateway),
            identity: old.as_ref().and_then(|o| o.identity.clone()),
            customer: old.as_ref().and_then(|o| o.customer),
            // A new access token replaces MQTT_BASIC credentials (one credential per device).
            basic: old.as_ref().and_then(|o| o.basic.clone()).filter(|_| s.token.is_none()),
            x509: old.as_ref().and_then(|o| o.x509.clone()).filter(|_| s.token.is_none()),
            firmware: old.as_ref().and_then(|o| o.firmware),
            software: old.as_ref().and_then(|o| o.software),
            tenant,
        };
        self.put(rec.clone(), old.as_ref())?;
        if let Some(n) = count {
            self.tenant_counts.insert(tenant, n + 1);
        }
        Ok(rec)
    }

    fn import(
        &mut self,
        tenant: Option<uuid::Uuid>,
        rows: Vec<ImportRow>,
        update: bool,
    ) -> Result<ImportOutcome, StoreError> {
        let mut out = ImportOutcome::default();
        let now = Ts::now();
        for row in rows {
            let line = row.line;
            let existing = match self.name_owner(tenant, &row.name)? {
                Some(id) => self.record(id)?,
                None => None,
            };
            let mut info =
                existing.as_ref().and_then(|e| e.additional_info.clone()).unwrap_or_else(|| serde_json::json!({}));
            if let Some(obj) = info.as_object_mut() {
                if let Some(d) = row.description {
                    obj.insert("description".into(), d.into());
                }
                if let Some(g) = row.gateway {
                    obj.insert("gateway".into(), g.into());
                }
            }
            let save = SaveDevice {
                profile: None,
                tenant,
                id: existing.as_ref().map(|e| e.id),
                name: row.name,
                device_type: row
                    .device_type
                    .or_else(|| existing.as_ref().map(|e| e.device_type.clone()))
                    .unwrap_or_default(),
                label: row.label.or_else(|| existing.as_ref().and_then(|e| e.label.clone())),
                token: row.token,
                additional_info: Some(info).filter(|i| i.as_object().is_none_or(|o| !o.is_empty())),
            };
            match self.save(save, None) {
                Ok(rec) => {
                    let write_attrs = update || existing.is_none();
                    let attrs = row
                        .shared
                        .into_iter()
                        .map(|kv| (AttributeScope::Shared, kv))
                        .chain(row.server.into_iter().map(|kv| (AttributeScope::Server, kv)));
                    for (scope, (k, v)) in attrs.filter(|_| write_attrs) {
                        self.batch.insert(
                            &self.engine.ks.attrs,
                            codec::attr_key(rec.id, scope.tag(), &k),
                            codec::encode_attr(now, &v),
                        );
                    }
                    if existing.is_some() {
                        out.updated += 1;
                    } else {
                        out.created += 1;
                    }
                }
                Err(StoreError::Db(e)) => return Err(StoreError::Db(e)),
                Err(e) => out.errors.push(format!("Line {line}: {e}")),
            }
        }
        Ok(out)
    }
}
