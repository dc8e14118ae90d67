//! Kafka as GridLinks' commit log (`cluster.queue = "kafka"`): [`KafkaLog`] sits behind
//! the ingest seam ([`gridlinks_ingest::CommitLog`]) and answers a device only once Kafka
//! has acknowledged its data (`acks=all`, idempotent producer, one partition per device by
//! key); [`StorageWriter`] is a member of the storage writers' consumer group: it writes
//! what it consumes to the store and commits offsets only after the write, so a
//! redelivery (rebalance, crash) rewrites the same rows and loses nothing. [`Bus`] carries
//! live deliveries between nodes (MQTT client publishes, and other nodes' device data to
//! this node's subscribers). [`share::ShareConsumer`] gives each shared subscription group
//! its messages once across nodes, through a consumer group of its own.
//! [`ExternalProducer`] writes to another cluster's topic (data forwarding).

pub mod bus;
mod external;
mod log;
pub mod record;
pub mod share;
mod writer;

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{ConsumerContext, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::BorrowedMessage;

pub use bus::Bus;
pub use external::ExternalProducer;
pub use log::{Check, KafkaLog};
pub use writer::{Sink, StorageWriter};

/// What the Kafka parts need to know.
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    /// `host:port` of brokers to bootstrap from.
    pub bootstrap_servers: Vec<String>,
    /// Prefix of the topic and the consumer group.
    pub topic_prefix: String,
    /// Partitions of a new telemetry topic.
    pub partitions: u32,
    /// Replicas of each partition.
    pub replication_factor: u16,
    /// Replicas that must hold a record before it is acknowledged.
    pub min_insync_replicas: u16,
    /// How long a record may wait for its acknowledgement.
    pub produce_timeout: Duration,
    /// This node's name (client ids).
    pub node_id: String,
}

impl KafkaSettings {
    /// The device-data topic.
    pub fn topic(&self) -> String {
        format!("{}telemetry", self.topic_prefix)
    }

    /// The topic of MQTT client publishes, which every node follows ([`Bus`]).
    pub fn broker_topic(&self) -> String {
        format!("{}broker", self.topic_prefix)
    }

    /// The storage writers' consumer group.
    pub fn group(&self) -> String {
        format!("{}storage", self.topic_prefix)
    }

    fn client(&self, role: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", self.bootstrap_servers.join(","))
            .set("client.id", format!("gridlinks-{}-{role}", self.node_id))
            // Java's partitioner, so every client maps a device to the same partition.
            .set("partitioner", "murmur2_random");
        c
    }
}

/// An idempotent producer that waits for every in-sync replica (`acks=all`).
fn producer(s: &KafkaSettings, role: &str) -> Result<rdkafka::producer::FutureProducer<Quiet>, KafkaError> {
    Ok(s.client(role)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", s.produce_timeout.as_millis().to_string())
        // Records of concurrent requests share a produce request; a few ms of wait at
        // most, as the embedded group commit does.
        .set("linger.ms", "2")
        .set("compression.type", "lz4")
        .create_with_context(Quiet)?)
}

/// The producer's and consumer's context: librdkafka's own log lines and error events go
/// to DEBUG. While a broker is away the client reports each failed connection attempt,
/// several a second per client; the node's probe says once, at WARN, that Kafka is
/// unreachable and once, at INFO, that it is back.
pub struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        tracing::debug!(?level, facility = fac, "librdkafka: {message}");
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        tracing::debug!(%error, "librdkafka: {reason}");
    }
}

impl ConsumerContext for Quiet {}

/// The next message of `consumer`, waiting for it.
async fn next_message(consumer: &StreamConsumer<Quiet>) -> BorrowedMessage<'_> {
    loop {
        match consumer.recv().await {
            Ok(m) => return m,
            // Errors are events (a broker down, a transport failure); the client reconnects
            // by itself. They queue ahead of messages, so they are read at once: waiting
            // after each one left the consumer behind a backlog of them for good.
            Err(e) => {
                tracing::debug!(error = %e, "kafka consumer");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Why Kafka could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The client library refused or failed an operation.
    #[error("kafka: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    /// Creating the topic failed.
    #[error("kafka: creating topic {0}: {1}")]
    Topic(String, String),
    /// A consumer's thread could not be started.
    #[error("kafka: starting a consumer thread: {0}")]
    Thread(String),
}

/// How long [`ensure_topic`] waits for the cluster's metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Creates the device-data and broker topics if they do not exist (partitions,
/// replication factor and `min.insync.replicas` from `s`; the broker topic, which only
/// carries live deliveries, keeps records for an hour); existing topics are left as they are.
///
/// Whether they exist is read from the metadata, which any reachable broker answers
/// (blocking, up to [`METADATA_TIMEOUT`]); only a missing topic is created. Creating goes
/// to the controller named in the client's metadata, and for some seconds after a broker
/// died (until Kafka fences it) that may be the dead broker: librdkafka then waits for it
/// for the whole request timeout (`socket.timeout.ms`, 60 s). A node restarted meanwhile
/// must not wait on it.
pub async fn ensure_topic(s: &KafkaSettings) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = s.client("admin").create()?;
    let (data, broker) = (s.topic(), s.broker_topic());
    // Every topic's metadata (asking for named ones could make a broker auto-create them).
    let found = {
        let md = admin.inner().fetch_metadata(None, METADATA_TIMEOUT)?;
        [&data, &broker].map(|name| md.topics().iter().any(|t| t.name() == name.as_str() && t.error().is_none()))
    };
    let min_isr = s.min_insync_replicas.to_string();
    let partitions = i32::try_from(s.partitions).unwrap_or(i32::MAX);
    let replication = || TopicReplication::Fixed(i32::from(s.replication_factor));
    let new: Vec<NewTopic<'_>> = [
        NewTopic::new(&data, partitions, replication()).set("min.insync.replicas", &min_isr),
        NewTopic::new(&broker, partitions, replication())
            .set("min.insync.replicas", &min_isr)
            .set("retention.ms", "3600000"),
    ]
    .into_iter()
    .zip(found)
    .filter_map(|(topic, found)| (!found).then_some(topic))
    .collect();
    if new.is_empty() {
        return Ok(());
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.create_topics(&new, &opts).await? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => return Err(KafkaError::Topic(name, code.to_string())),
        }
    }
    Ok(())
}
