//! A producer to a topic of any Kafka cluster: data forwarding's Kafka sink.

use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use crate::{KafkaError, Quiet};

/// An idempotent, `acks=all` producer to one topic.
pub struct ExternalProducer {
    producer: FutureProducer<Quiet>,
    topic: String,
}

impl ExternalProducer {
    /// A producer to `topic` at `bootstrap_servers` (comma-separated `host:port`); a record
    /// not acknowledged within `timeout` fails.
    pub fn new(bootstrap_servers: &str, topic: &str, client_id: &str, timeout: Duration) -> Result<Self, KafkaError> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers)
            .set("client.id", client_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", timeout.as_millis().to_string())
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            // The Java client's partitioner: a key lands where a Java producer puts it.
            .set("partitioner", "murmur2_random")
            .create_with_context(Quiet)?;
        Ok(Self { producer, topic: topic.to_owned() })
    }

    /// Sends every (key, value) and waits until all are acknowledged; the first failure
    /// (the others may have been written: the caller sends them again). The records are
    /// all queued at once (a `send` future queues its record only when polled: awaiting
    /// them one by one sent one record per round trip, ~170 a second).
    pub async fn send_all(&self, records: &[(String, Vec<u8>)]) -> Result<(), String> {
        let sends = records.iter().map(|(k, v)| {
            let record = FutureRecord::to(&self.topic).key(k.as_bytes()).payload(v.as_slice());
            self.producer.send(record, Duration::from_secs(1))
        });
        for r in futures_util::future::join_all(sends).await {
            r.map_err(|(e, _)| e.to_string())?;
        }
        Ok(())
    }
}
