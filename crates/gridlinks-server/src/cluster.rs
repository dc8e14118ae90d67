//! The commit log `cluster.queue` names: the embedded store's group commit, or Kafka with
//! this node's storage writer consuming it. Shared time-series and entity stores
//! (`cluster.timeseries`, `cluster.entities`) are refused here until they are built.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use gridlinks_ingest::{CommitLog, Embedded};
use gridlinks_kafka::{KafkaLog, KafkaSettings, StorageWriter};
use gridlinks_storage::WriterHandle;

use crate::config::{ClusterConfig, EntitiesBackend, QueueBackend, TimeseriesBackend};

/// The commit log, and the storage writer's task when it is Kafka.
pub async fn commit_log(
    c: &ClusterConfig,
    writer: &WriterHandle,
) -> anyhow::Result<(Arc<dyn CommitLog>, Option<tokio::task::JoinHandle<()>>)> {
    if c.timeseries != TimeseriesBackend::Embedded || c.entities != EntitiesBackend::Embedded {
        bail!(
            "cluster.timeseries = {:?} / cluster.entities = {:?}: shared stores are not built in this version yet; \
             only cluster.queue = \"kafka\" with embedded storage runs (docs/scaling.md)",
            c.timeseries,
            c.entities
        );
    }
    match c.queue {
        QueueBackend::Embedded => Ok((Arc::new(Embedded(writer.clone())), None)),
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
            let log = KafkaLog::new(&settings, writer.clone()).context("kafka producer")?;
            let task = StorageWriter::spawn(&settings, writer.clone()).context("kafka storage writer")?;
            tracing::info!(topic = %settings.topic(), group = %settings.group(), "device data is committed to kafka");
            Ok((log, Some(task)))
        }
    }
}
