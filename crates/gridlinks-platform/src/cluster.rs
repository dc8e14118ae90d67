//! What `[cluster]` names, made: the commit log (`cluster.queue`: the embedded store's group
//! commit, or Kafka with this node's storage writer consuming it) and the time-series store
//! (`cluster.timeseries`: the embedded store, or a shared database, Cassandra or
//! PostgreSQL, which the storage writer then writes and every telemetry read comes from),
//! and the shared entities (`cluster.entities`: the node's store following a replica in
//! PostgreSQL). [`Backends`] probes the shared services; while one does not answer, the
//! node refuses new work ([`Gated`], the MQTT handshake) and `/readyz` says so.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::start::{Context, StartError};
use gridlinks_cassandra::{CassandraSettings, CassandraTimeseries};
use gridlinks_ingest::{BoxFuture, CommitLog, Embedded};
use gridlinks_kafka::{Bus, Check, KafkaLog, KafkaSettings, Sink, StorageWriter};
use gridlinks_postgres::{PgReplica, PgTimeseries};
use gridlinks_storage::timeseries::Shared;
use gridlinks_storage::{DeleteTelemetry, Health, Store, StoreError, Timeseries, WriteOp, WriteOutcome, WriterHandle};
use parking_lot::Mutex;

use crate::config::{ClusterConfig, EntitiesBackend, QueueBackend, TimeseriesBackend};

/// Where telemetry is read from and deleted in.
#[derive(Clone)]
pub enum TsStore {
    /// The node's own store.
    Embedded(Store, WriterHandle),
    /// A database the nodes share (Cassandra or PostgreSQL).
    Shared(Arc<dyn Shared>),
}

/// Runs a blocking call of a shared database off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| StoreError::Database(format!("database task: {e}")))?
}

impl TsStore {
    /// The reads.
    pub fn reads(&self) -> &dyn Timeseries {
        match self {
            TsStore::Embedded(s, _) => s,
            TsStore::Shared(db) => db.as_ref(),
        }
    }

    /// Deletes telemetry, durably.
    pub async fn delete(&self, d: DeleteTelemetry) -> Result<(), StoreError> {
        match self {
            TsStore::Embedded(_, w) => w.submit(WriteOp::DeleteTelemetry(d)).await.map(drop),
            TsStore::Shared(db) => {
                let db = db.clone();
                blocking(move || db.delete(&d)).await
            }
        }
    }

    /// After a device is deleted: in a shared database, deletes its telemetry in the
    /// background (the node's own store deletes it with the device). Points of the device
    /// still on their way through Kafka may be written after this; they stay until the
    /// database's TTL, as in ThingsBoard before its housekeeper.
    pub fn forget_device(&self, device: gridlinks_types::DeviceId) {
        let TsStore::Shared(db) = self else { return };
        let db = db.clone();
        tokio::spawn(async move {
            let done = blocking(move || {
                let keys = db.ts_keys(device)?;
                if keys.is_empty() {
                    return Ok(());
                }
                db.delete(&DeleteTelemetry { device, keys, range: None, delete_latest: true, rewrite_latest: false })
            })
            .await;
            if let Err(e) = done {
                tracing::warn!(%device, error = %e, "the deleted device's telemetry was not deleted from the shared database");
            }
        });
    }
}

/// The storage writer's sink when the time series are in a shared database: telemetry goes
/// there, everything else (attributes) to the node's store.
struct SharedSink {
    db: Arc<dyn Shared>,
    writer: WriterHandle,
    store: Store,
}

impl Sink for SharedSink {
    async fn write(&self, ops: Vec<WriteOp>) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let n = ops.len();
        let mut results: Vec<Result<(), StoreError>> = (0..n).map(|_| Ok(())).collect();
        let mut points = Vec::new();
        let mut rest = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            // What data forwarding sends of the time series goes to the node's outbox (the
            // node's writer does that for everything else it writes).
            let forward = matches!(op, WriteOp::Telemetry { .. }) && self.store.outbox_wants(&op);
            match op {
                // Refused before it was produced ([`start`]'s check); a record from before
                // that check is refused for good, not retried forever.
                WriteOp::Telemetry { device, records } => match self.db.storable(&records) {
                    Ok(()) => {
                        if forward {
                            let e = gridlinks_storage::OutboxEvent::Telemetry { device, records: records.to_vec() };
                            rest.push((i, WriteOp::Outbox(e)));
                        }
                        points.push((device, records));
                    }
                    Err(e) => results[i] = Err(e),
                },
                other => rest.push((i, other)),
            }
        }
        let db = self.db.clone();
        blocking(move || {
            let batch: Vec<_> = points.iter().map(|(d, r)| (*d, &r[..])).collect();
            db.write(&batch)
        })
        .await?;
        let (at, rest): (Vec<usize>, Vec<WriteOp>) = rest.into_iter().unzip();
        if !rest.is_empty() {
            for (i, r) in at.into_iter().zip(self.writer.submit_batch(rest).await?) {
                results[i] = r.map(drop);
            }
        }
        Ok(results)
    }
}

/// A storage writer's sink that hands what it wrote to the alarm rule engine: with Kafka,
/// the node that consumes a device's partition evaluates its alarm rules.
struct AlarmSink<S> {
    inner: S,
    feed: crate::alarms::engine::Feed,
}

impl<S: Sink> Sink for AlarmSink<S> {
    async fn write(&self, ops: Vec<WriteOp>) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let wanted: Vec<_> = ops.iter().enumerate().filter_map(|(i, op)| Some((i, self.feed.copy(op)?))).collect();
        let results = self.inner.write(ops).await?;
        let written =
            wanted.into_iter().filter(|(i, _)| results.get(*i).is_some_and(Result::is_ok)).map(|(_, c)| c).collect();
        self.feed.written(written).await;
        Ok(results)
    }
}

/// How long one probe may take before its service counts as down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A probe of one shared service: blocks, and says why it could not be used.
type ProbeFn = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// One shared service and what its last probe found.
struct Probe {
    /// `kafka` or `postgresql`.
    name: &'static str,
    check: ProbeFn,
    /// The error a refused request gets, from the reason.
    error: fn(String) -> StoreError,
    /// `None` while it answers, else why it did not.
    down: Mutex<Option<String>>,
    /// A probe is running (one that hangs is not started again until it returns).
    running: Arc<AtomicBool>,
}

/// The shared services this node depends on (none when everything is embedded), probed
/// every `cluster.probe_interval` by [`Backends::watch`]. They start as up: [`start`] has
/// just used each of them.
#[derive(Default)]
pub struct Backends {
    probes: Vec<Probe>,
    /// Whether any probe is down (so that the answer costs one load while all are up).
    any_down: AtomicBool,
    /// Records produced and not yet stored, as last read ([`Backends::watch_lag`]).
    lag: AtomicU64,
    /// `cluster.kafka.max_lag` (0: no Kafka, nothing to wait for).
    max_lag: u64,
}

impl Backends {
    fn add(&mut self, name: &'static str, error: fn(String) -> StoreError, check: ProbeFn) {
        self.probes.push(Probe { name, check, error, down: Mutex::new(None), running: Arc::default() });
    }

    /// Why this node takes no new work now: the first service down, or `None`.
    pub fn refusal(&self) -> Option<StoreError> {
        if !self.any_down.load(Ordering::Acquire) {
            return None;
        }
        self.probes
            .iter()
            .find_map(|p| p.down.lock().as_ref().map(|why| (p.error)(format!("{} is unreachable: {why}", p.name))))
    }

    /// Records the storage writers are behind, as last read (0 without Kafka).
    pub fn lag(&self) -> u64 {
        self.lag.load(Ordering::Relaxed)
    }

    /// Whether the storage writers are further behind than `cluster.kafka.max_lag`.
    fn lagging(&self) -> bool {
        self.max_lag > 0 && self.lag() > self.max_lag
    }

    /// Reads the storage writers' lag from `kafka` forever: every 500 ms, every 50 ms while
    /// it is past half the bound (writes wait on it then).
    async fn watch_lag(self: Arc<Self>, kafka: Arc<KafkaLog>) {
        loop {
            // While a service is down nothing is taken anyway, and the probe has said why.
            if self.any_down.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            let k = kafka.clone();
            match tokio::task::spawn_blocking(move || k.lag(Duration::from_secs(2))).await {
                Ok(Ok(lag)) => self.lag.store(lag, Ordering::Relaxed),
                Ok(Err(e)) => crate::logging::warn_limited!(error = %e, "cannot read the storage writers' lag"),
                Err(e) => crate::logging::warn_limited!(error = %e, "lag task failed"),
            }
            let busy = self.lag() > self.max_lag / 2;
            tokio::time::sleep(Duration::from_millis(if busy { 50 } else { 500 })).await;
        }
    }

    /// Each service's state, for `/readyz`: `"UP"`, or `"DOWN: why"`.
    pub fn report(&self) -> serde_json::Map<String, serde_json::Value> {
        let state = |p: &Probe| match &*p.down.lock() {
            None => "UP".to_owned(),
            Some(why) => format!("DOWN: {why}"),
        };
        self.probes.iter().map(|p| (p.name.to_owned(), state(p).into())).collect()
    }

    /// Probes every service every `interval`, forever; a change is logged.
    async fn watch(self: Arc<Self>, interval: Duration) {
        if self.probes.is_empty() {
            return;
        }
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for p in &self.probes {
                if p.running.swap(true, Ordering::AcqRel) {
                    continue; // the last one still hangs: it stays down
                }
                let (check, running) = (p.check.clone(), p.running.clone());
                let task = tokio::task::spawn_blocking(move || {
                    let r = check();
                    running.store(false, Ordering::Release);
                    r
                });
                let found = match tokio::time::timeout(PROBE_TIMEOUT, task).await {
                    Ok(Ok(r)) => r.err(),
                    Ok(Err(e)) => Some(format!("probe failed: {e}")),
                    Err(_) => Some(format!("no answer within {} s", PROBE_TIMEOUT.as_secs())),
                };
                let mut down = p.down.lock();
                match (&*down, &found) {
                    (None, Some(why)) => {
                        tracing::warn!(backend = p.name, reason = %why, "backend unreachable: refusing new work until it answers")
                    }
                    (Some(_), None) => tracing::info!(backend = p.name, "backend answers again: taking work"),
                    _ => {}
                }
                *down = found;
            }
            let any = self.probes.iter().any(|p| p.down.lock().is_some());
            self.any_down.store(any, Ordering::Release);
        }
    }
}

/// The commit log behind a refusal and a brake. While a shared service is down, device
/// data is refused at once with the reason (HTTP 503, MQTT 0x80 with a reason string,
/// CoAP 5.03) instead of waiting for Kafka's produce timeout or being taken while it cannot
/// become queryable. While the storage writers are more than `cluster.kafka.max_lag`
/// records behind, it waits for them (up to `patience`), then refuses as overloaded (HTTP
/// 503, MQTT 0x97): Kafka takes data faster than it can be stored, and without the brake
/// the lag, and the time from acknowledgement to queryable, would grow without bound.
struct Gated {
    log: Arc<dyn CommitLog>,
    backends: Arc<Backends>,
    patience: Duration,
}

impl CommitLog for Gated {
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'_, Result<Vec<Result<WriteOutcome, StoreError>>, StoreError>> {
        if let Some(e) = self.backends.refusal() {
            return Box::pin(std::future::ready(Err(e)));
        }
        if !self.backends.lagging() {
            return self.log.commit(ops);
        }
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + self.patience;
            while self.backends.lagging() {
                if tokio::time::Instant::now() >= deadline {
                    return Err(StoreError::Overloaded);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            self.log.commit(ops).await
        })
    }
}

/// Before Kafka, with the node's store behind it: the store takes writes now (not full,
/// not failed), and every telemetry key has its dictionary id, reserved now if new. Once
/// acknowledged, the storage writer cannot meet the key limit with the record (it would
/// have to leave it out); a full store waits to be written, as acknowledged data.
struct EmbeddedCheck {
    store: Store,
    writer: WriterHandle,
}

impl Check for EmbeddedCheck {
    fn check<'a>(&'a self, op: &'a WriteOp) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            match self.store.health() {
                Health::Ok => {}
                // Deletes free space: the store takes them while it is nearly full.
                Health::DiskFull if matches!(op, WriteOp::DeleteAttributes { .. }) => {}
                Health::DiskFull => {
                    return Err(StoreError::DiskFull("the node's store refuses writes until space is freed".into()))
                }
                Health::Failed => return Err(StoreError::Unavailable),
            }
            let WriteOp::Telemetry { records, .. } = op else { return Ok(()) };
            let unknown =
                self.store.unknown_keys(records.iter().flat_map(|r| r.values.iter().map(|(k, _)| k.as_str())));
            if unknown.is_empty() {
                return Ok(());
            }
            self.writer.submit(WriteOp::ReserveKeys(unknown)).await.map(drop)
        })
    }
}

/// Before Kafka, with a shared database behind it: what it cannot hold (PostgreSQL: text
/// with NUL) is refused.
struct SharedCheck(Arc<dyn Shared>);

impl Check for SharedCheck {
    fn check<'a>(&'a self, op: &'a WriteOp) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(match op {
            WriteOp::Telemetry { records, .. } => self.0.storable(records),
            _ => Ok(()),
        }))
    }
}

/// What `[cluster]` makes: the commit log, the time-series store, the shared services'
/// probes, and the tasks that keep them going.
pub struct Cluster {
    /// Where device data is committed.
    pub log: Arc<dyn CommitLog>,
    /// Where telemetry is read.
    pub ts: TsStore,
    /// Kafka and PostgreSQL as last probed.
    pub backends: Arc<Backends>,
    /// The probes, and with Kafka the storage writer and the lag reader. They run until
    /// aborted, and hold writer handles: abort them before the writer is to stop.
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Live delivery across nodes (Kafka with shared entities: several nodes).
    pub bus: Option<Arc<Bus>>,
}

/// The connection URL in `cluster.postgres.url_file`, which only its owner may read.
fn postgres_url(c: &ClusterConfig) -> Result<String, StartError> {
    secret_file(&c.postgres.url_file, "cluster.postgres.url_file")
}

/// The secret in the file `setting` names (trimmed); refused unless only its owner may
/// read it.
pub fn secret_file(path: &std::path::Path, setting: &str) -> Result<String, StartError> {
    let meta = std::fs::metadata(path).with_context(|| format!("{setting} {}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(StartError::msg(format!(
            "{setting} {} holds a password: make it readable by its owner only (chmod 600)",
            path.display()
        )));
    }
    let secret = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(secret.trim().to_owned())
}

/// With `entities = "postgres"`: makes `store` follow the shared entities' replica in
/// PostgreSQL. Before the store's writer starts.
pub async fn attach_entities(c: &ClusterConfig, store: &Store) -> Result<(), StartError> {
    if c.entities != EntitiesBackend::Postgres {
        return Ok(());
    }
    let url = postgres_url(c)?;
    let replica = tokio::task::spawn_blocking(move || PgReplica::open(&url))
        .await?
        .context("cluster.entities = \"postgres\": opening the entity tables")?;
    store.attach_replica(Box::new(replica))?;
    tracing::info!("entities are shared through postgresql");
    Ok(())
}

/// With `entities = "postgres"`: applies what other nodes changed now, then every
/// `cluster.entities_poll` in a task (abort it before the writer is to stop).
pub async fn follow_entities(
    c: &ClusterConfig,
    writer: &WriterHandle,
) -> Result<Option<tokio::task::JoinHandle<()>>, StartError> {
    if c.entities != EntitiesBackend::Postgres {
        return Ok(None);
    }
    writer.submit(WriteOp::CatchUp).await.context("catching up with the shared entities")?;
    let (writer, every) = (writer.clone(), c.entities_poll.duration());
    Ok(Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = writer.submit(WriteOp::CatchUp).await {
                crate::logging::warn_limited!(error = %e, "cannot apply other nodes' entity changes; retrying");
            }
        }
    })))
}

/// Makes what `c` names.
pub async fn start(
    c: &ClusterConfig,
    store: &Store,
    writer: &WriterHandle,
    alarms: &crate::alarms::engine::Feed,
) -> Result<Cluster, StartError> {
    let shared: Option<Arc<dyn Shared>> = match c.timeseries {
        TimeseriesBackend::Postgres => {
            let (url, size) = (postgres_url(c)?, c.postgres.pool_size as usize);
            // The connection's password stays out of the error (the URL is not shown).
            let pg = blocking(move || PgTimeseries::open(&url, size))
                .await
                .context("cluster.timeseries = \"postgres\": opening the time-series tables")?;
            Some(Arc::new(pg))
        }
        TimeseriesBackend::Cassandra => {
            let s = CassandraSettings {
                contact_points: c.cassandra.contact_points.clone(),
                keyspace: c.cassandra.keyspace.clone(),
                replication_factor: c.cassandra.replication_factor,
                ttl_days: c.cassandra.ttl_days,
            };
            let db = blocking(move || CassandraTimeseries::open(&s)).await.with_context(|| {
                format!("cluster.timeseries = \"cassandra\" at {}", c.cassandra.contact_points.join(","))
            })?;
            Some(Arc::new(db))
        }
        TimeseriesBackend::Embedded => None,
    };
    let mut backends = Backends::default();
    let ts = match shared {
        Some(db) => {
            tracing::info!(database = db.name(), "time series are stored in a shared database");
            let probe = db.clone();
            let prefix = format!("{}: ", db.name());
            backends.add(
                db.name(),
                StoreError::Database,
                Arc::new(move || {
                    probe.ping().map_err(|e| match e {
                        StoreError::Database(m) => m.trim_start_matches(prefix.as_str()).to_owned(),
                        e => e.to_string(),
                    })
                }),
            );
            TsStore::Shared(db)
        }
        None => TsStore::Embedded(store.clone(), writer.clone()),
    };
    let probe_every = c.probe_interval.duration();
    match c.queue {
        QueueBackend::Embedded => {
            let backends = Arc::new(backends);
            let tasks = vec![tokio::spawn(backends.clone().watch(probe_every))];
            Ok(Cluster { log: Arc::new(Embedded(writer.clone())), ts, backends, tasks, bus: None })
        }
        QueueBackend::Kafka => {
            let k = &c.kafka;
            let settings = KafkaSettings {
                bootstrap_servers: k.bootstrap_servers.clone(),
                topic_prefix: k.topic_prefix.clone(),
                partitions: k.partitions,
                replication_factor: k.replication_factor,
                min_insync_replicas: k.min_insync_replicas,
                produce_timeout: Duration::from_millis(k.produce_timeout.0),
                node_id: c.node_id.clone(),
            };
            gridlinks_kafka::ensure_topic(&settings)
                .await
                .with_context(|| format!("kafka at {}", k.bootstrap_servers.join(",")))?;
            let check: Box<dyn Check> = match &ts {
                TsStore::Shared(db) => Box::new(SharedCheck(db.clone())),
                TsStore::Embedded(..) => Box::new(EmbeddedCheck { store: store.clone(), writer: writer.clone() }),
            };
            let log = KafkaLog::new(&settings, writer.clone(), check).context("kafka producer")?;
            let task = match &ts {
                TsStore::Shared(db) => {
                    let inner = SharedSink { db: db.clone(), writer: writer.clone(), store: store.clone() };
                    StorageWriter::spawn(&settings, AlarmSink { inner, feed: alarms.clone() })
                }
                TsStore::Embedded(..) => {
                    StorageWriter::spawn(&settings, AlarmSink { inner: writer.clone(), feed: alarms.clone() })
                }
            }
            .context("kafka storage writer")?;
            tracing::info!(topic = %settings.topic(), group = %settings.group(), "device data is committed to kafka");
            let kafka = log.clone();
            backends.add(
                "kafka",
                StoreError::Queue,
                Arc::new(move || kafka.probe(PROBE_TIMEOUT - Duration::from_secs(1))),
            );
            backends.max_lag = k.max_lag;
            let backends = Arc::new(backends);
            let tasks = vec![
                task,
                tokio::spawn(backends.clone().watch_lag(log.clone())),
                tokio::spawn(backends.clone().watch(probe_every)),
            ];
            let patience = settings.produce_timeout;
            let log = Arc::new(Gated { log, backends: backends.clone(), patience });
            // Several nodes share entities: what one takes is delivered live on the others.
            let bus = if c.several_nodes() { Some(Bus::new(&settings).context("kafka bus producer")?) } else { None };
            Ok(Cluster { log, ts, backends, tasks, bus })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_file_must_be_its_owners_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("url");
        std::fs::write(&path, "postgres://u:secret@127.0.0.1:5432/db\n").unwrap();
        let mut c = ClusterConfig::default();
        c.postgres.url_file = path.clone();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = postgres_url(&c).unwrap_err().to_string();
        assert!(e.contains("chmod 600") && !e.contains("secret"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(postgres_url(&c).unwrap(), "postgres://u:secret@127.0.0.1:5432/db");
    }
}
