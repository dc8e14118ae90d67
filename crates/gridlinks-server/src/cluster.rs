//! What `[cluster]` names, made: the commit log (`cluster.queue`: the embedded store's group
//! commit, or Kafka with this node's storage writer consuming it) and the time-series store
//! (`cluster.timeseries`: the embedded store, or PostgreSQL, which the storage writer then
//! writes and every telemetry read comes from). Cassandra and shared entities are refused
//! here until they are built.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gridlinks_ingest::{CommitLog, Embedded};
use gridlinks_kafka::{KafkaLog, KafkaSettings, Sink, StorageWriter};
use gridlinks_postgres::PgTimeseries;
use gridlinks_storage::{DeleteTelemetry, Store, StoreError, Timeseries, WriteOp, WriterHandle};

use crate::config::{ClusterConfig, EntitiesBackend, QueueBackend, TimeseriesBackend};

/// Where telemetry is read from and deleted in.
#[derive(Clone)]
pub enum TsStore {
    /// The node's own store.
    Embedded(Store, WriterHandle),
    /// PostgreSQL, shared by the nodes.
    Postgres(Arc<PgTimeseries>),
}

impl TsStore {
    /// The reads.
    pub fn reads(&self) -> &dyn Timeseries {
        match self {
            TsStore::Embedded(s, _) => s,
            TsStore::Postgres(p) => p.as_ref(),
        }
    }

    /// Deletes telemetry, durably.
    pub async fn delete(&self, d: DeleteTelemetry) -> Result<(), StoreError> {
        match self {
            TsStore::Embedded(_, w) => w.submit(WriteOp::DeleteTelemetry(d)).await.map(drop),
            TsStore::Postgres(p) => {
                let p = p.clone();
                tokio::task::spawn_blocking(move || p.delete(&d))
                    .await
                    .map_err(|e| StoreError::Database(format!("delete task: {e}")))?
            }
        }
    }
}

/// The storage writer's sink when the time series are in PostgreSQL: telemetry goes there,
/// everything else (attributes) to the node's store.
struct PgSink {
    pg: Arc<PgTimeseries>,
    writer: WriterHandle,
}

impl Sink for PgSink {
    async fn write(&self, ops: Vec<WriteOp>) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let n = ops.len();
        let mut results: Vec<Result<(), StoreError>> = (0..n).map(|_| Ok(())).collect();
        let mut points = Vec::new();
        let mut rest = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                // Refused before it was produced ([`start`]'s check); a record from before
                // that check is refused for good, not retried forever.
                WriteOp::Telemetry { device, records } => match gridlinks_postgres::storable(&records) {
                    Ok(()) => points.push((device, records)),
                    Err(e) => results[i] = Err(e),
                },
                other => rest.push((i, other)),
            }
        }
        let pg = self.pg.clone();
        tokio::task::spawn_blocking(move || {
            let batch: Vec<_> = points.iter().map(|(d, r)| (*d, r.as_slice())).collect();
            pg.write(&batch)
        })
        .await
        .map_err(|e| StoreError::Database(format!("write task: {e}")))??;
        let (at, rest): (Vec<usize>, Vec<WriteOp>) = rest.into_iter().unzip();
        if !rest.is_empty() {
            for (i, r) in at.into_iter().zip(self.writer.submit_batch(rest).await?) {
                results[i] = r.map(drop);
            }
        }
        Ok(results)
    }
}

/// What `[cluster]` makes: the commit log, the time-series store, and the storage
/// writer's task when the log is Kafka.
pub struct Cluster {
    /// Where device data is committed.
    pub log: Arc<dyn CommitLog>,
    /// Where telemetry is read.
    pub ts: TsStore,
    /// The storage writer (Kafka only); it runs until aborted.
    pub storage_writer: Option<tokio::task::JoinHandle<()>>,
}

/// The connection URL in `cluster.postgres.url_file`, which only its owner may read.
fn postgres_url(c: &ClusterConfig) -> anyhow::Result<String> {
    let path = &c.postgres.url_file;
    let meta = std::fs::metadata(path).with_context(|| format!("cluster.postgres.url_file {}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "cluster.postgres.url_file {} holds a password: make it readable by its owner only (chmod 600)",
            path.display()
        );
    }
    let url = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(url.trim().to_owned())
}

/// Makes what `c` names.
pub async fn start(c: &ClusterConfig, store: &Store, writer: &WriterHandle) -> anyhow::Result<Cluster> {
    if c.timeseries == TimeseriesBackend::Cassandra || c.entities != EntitiesBackend::Embedded {
        bail!(
            "cluster.timeseries = {:?} / cluster.entities = {:?}: not built in this version yet; \
             cluster.timeseries = \"postgres\" with embedded entities runs (docs/scaling.md)",
            c.timeseries,
            c.entities
        );
    }
    let ts = match c.timeseries {
        TimeseriesBackend::Postgres => {
            let (url, size) = (postgres_url(c)?, c.postgres.pool_size as usize);
            // The connection's password stays out of the error (the URL is not shown).
            let pg = tokio::task::spawn_blocking(move || PgTimeseries::open(&url, size))
                .await?
                .context("cluster.timeseries = \"postgres\": opening the time-series tables")?;
            tracing::info!("time series are stored in postgresql");
            TsStore::Postgres(Arc::new(pg))
        }
        _ => TsStore::Embedded(store.clone(), writer.clone()),
    };
    match c.queue {
        QueueBackend::Embedded => Ok(Cluster { log: Arc::new(Embedded(writer.clone())), ts, storage_writer: None }),
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
            let check: gridlinks_kafka::Check = match &ts {
                TsStore::Postgres(_) => |op| match op {
                    WriteOp::Telemetry { records, .. } => gridlinks_postgres::storable(records),
                    _ => Ok(()),
                },
                TsStore::Embedded(..) => |_| Ok(()),
            };
            let log = KafkaLog::new(&settings, writer.clone(), check).context("kafka producer")?;
            let task = match &ts {
                TsStore::Postgres(pg) => {
                    StorageWriter::spawn(&settings, PgSink { pg: pg.clone(), writer: writer.clone() })
                }
                TsStore::Embedded(..) => StorageWriter::spawn(&settings, writer.clone()),
            }
            .context("kafka storage writer")?;
            tracing::info!(topic = %settings.topic(), group = %settings.group(), "device data is committed to kafka");
            Ok(Cluster { log, ts, storage_writer: Some(task) })
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
