//! How a batch of events reaches each kind of sink. A delivery succeeds only when the sink
//! acknowledged every event of it (a 2xx answer, Kafka `acks=all`, MQTT PUBACKs); anything
//! else is an error and the batch is tried again.

use std::collections::HashSet;
use std::time::Duration;

use bytes::BytesMut;
use gridlinks_codec::mqtt::{decode, encode, reason, Connect, ConnectProperties, Packet, ProtocolVersion, QoS};
use serde_json::Value as J;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{render_topic, Sink, Target};
use crate::config::ForwardingConfig;
use crate::notify::{agent, post_with, resolve, Destination};

/// Largest packet an MQTT sink's broker may send us (acks and pings only).
const MQTT_MAX_PACKET: usize = 64 * 1024;

/// A sink's connection (made when first needed, dropped after a failure).
pub(super) struct Deliverer {
    target: Target,
    timeout: Duration,
    allow_private: bool,
    http: Option<ureq::Agent>,
    kafka: Option<gridlinks_kafka::ExternalProducer>,
    mqtt: Option<MqttLink>,
    name: String,
}

impl Deliverer {
    pub fn new(sink: &Sink, cfg: &ForwardingConfig) -> Self {
        Self {
            target: sink.target.clone(),
            timeout: cfg.timeout.duration(),
            allow_private: cfg.allow_private_addresses,
            http: None,
            kafka: None,
            mqtt: None,
            name: format!("gridlinks-sink-{}", sink.id),
        }
    }

    /// Delivers every event, or says why not.
    pub async fn deliver(&mut self, events: &[J]) -> Result<(), String> {
        match self.target.clone() {
            Target::Http { url, headers, secret, batch_size } => {
                let http = self.http.get_or_insert_with(|| agent(self.timeout, self.allow_private, "forwarding"));
                for chunk in events.chunks(batch_size) {
                    let to = Destination {
                        url: url.clone(),
                        headers: headers.clone(),
                        secret: secret.clone(),
                        timeout: self.timeout,
                        allow_private: self.allow_private,
                    };
                    // Serialised from the slice: the events are not copied into an array first.
                    let body = serde_json::to_string(chunk).map_err(|e| e.to_string())?;
                    let http = http.clone();
                    tokio::task::spawn_blocking(move || post_with(&http, &to, &body))
                        .await
                        .map_err(|e| e.to_string())??;
                }
                Ok(())
            }
            Target::Kafka { servers, topic } => {
                if self.kafka.is_none() {
                    let (allow, s) = (self.allow_private, servers.clone());
                    tokio::task::spawn_blocking(move || {
                        s.split(',').try_for_each(|a| resolve(a.trim(), allow, "forwarding").map(drop))
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("{servers}: {e}"))?;
                    let p = gridlinks_kafka::ExternalProducer::new(&servers, &topic, &self.name, self.timeout)
                        .map_err(|e| e.to_string())?;
                    self.kafka = Some(p);
                }
                let records: Vec<(String, Vec<u8>)> = events
                    .iter()
                    .map(|e| {
                        let key = e.get("deviceId").or_else(|| e.get("originatorId")).and_then(J::as_str);
                        (key.unwrap_or_default().to_owned(), e.to_string().into_bytes())
                    })
                    .collect();
                let producer = self.kafka.as_ref().ok_or("no producer")?;
                producer.send_all(&records).await.map_err(|e| format!("kafka {topic}: {e}"))
            }
            Target::Mqtt { host, port, topic, client_id, username, password } => {
                if self.mqtt.is_none() {
                    let link = tokio::time::timeout(
                        self.timeout,
                        MqttLink::connect(&host, port, &client_id, username, password, self.allow_private),
                    )
                    .await
                    .map_err(|_| format!("{host}:{port}: no CONNACK within the timeout"))??;
                    self.mqtt = Some(link);
                }
                let link = self.mqtt.as_mut().ok_or("no connection")?;
                let sent: Result<Result<(), String>, _> = tokio::time::timeout(self.timeout, async {
                    // Packet ids are 16 bits: at most this many publishes wait at once.
                    for chunk in events.chunks(1000) {
                        link.publish_all(&topic, chunk).await?;
                    }
                    Ok(())
                })
                .await;
                let result = match sent {
                    Ok(r) => r,
                    Err(_) => Err("the broker did not acknowledge every publish within the timeout".to_owned()),
                };
                if result.is_err() {
                    self.mqtt = None;
                }
                result.map_err(|e| format!("{host}:{port}: {e}"))
            }
        }
    }
}

/// An MQTT 3.1.1 connection to a sink's broker that publishes at QoS 1.
struct MqttLink {
    stream: TcpStream,
    rbuf: BytesMut,
    next_id: u16,
}

impl MqttLink {
    async fn connect(
        host: &str,
        port: u16,
        client_id: &str,
        username: Option<String>,
        password: Option<String>,
        allow_private: bool,
    ) -> Result<Self, String> {
        let netloc = format!("{host}:{port}");
        let addrs = tokio::task::spawn_blocking(move || resolve(&netloc, allow_private, "forwarding"))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let stream = TcpStream::connect(addrs.as_slice()).await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let mut link = Self { stream, rbuf: BytesMut::with_capacity(1024), next_id: 0 };
        let connect = Packet::Connect(Box::new(Connect {
            protocol: ProtocolVersion::V3_1_1,
            client_id: client_id.to_owned(),
            // No keep-alive: an idle sink's connection is not closed by the broker; a dead
            // one shows as a failed or timed-out delivery, and is made again.
            keep_alive: 0,
            // Publishes the broker had not acknowledged are sent again by the sink anyway.
            clean_start: true,
            username,
            password: password.map(String::into_bytes).map(Into::into),
            will: None,
            properties: ConnectProperties::default(),
        }));
        link.send(&[connect]).await?;
        match link.read().await? {
            Packet::ConnAck(a) if a.code == reason::V3_CONNECTION_ACCEPTED => Ok(link),
            Packet::ConnAck(a) => Err(format!("the broker refused the connection (CONNACK code {})", a.code)),
            other => Err(format!("{} instead of CONNACK", other.name())),
        }
    }

    async fn send(&mut self, packets: &[Packet]) -> Result<(), String> {
        let mut out = BytesMut::new();
        for p in packets {
            encode(p, ProtocolVersion::V3_1_1, &mut out).map_err(|e| e.to_string())?;
        }
        self.stream.write_all(&out).await.map_err(|e| e.to_string())
    }

    async fn read(&mut self) -> Result<Packet, String> {
        loop {
            if let Some(p) =
                decode(&mut self.rbuf, ProtocolVersion::V3_1_1, MQTT_MAX_PACKET).map_err(|e| e.to_string())?
            {
                return Ok(p);
            }
            if self.stream.read_buf(&mut self.rbuf).await.map_err(|e| e.to_string())? == 0 {
                return Err("the broker closed the connection".into());
            }
        }
    }

    /// Publishes each event (QoS 1) to its topic and waits for every PUBACK.
    async fn publish_all(&mut self, topic: &str, events: &[J]) -> Result<(), String> {
        let mut waiting = HashSet::new();
        let mut packets = Vec::with_capacity(events.len());
        for e in events {
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            waiting.insert(self.next_id);
            packets.push(Packet::Publish(gridlinks_codec::mqtt::Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: render_topic(topic, e),
                packet_id: Some(self.next_id),
                payload: e.to_string().into_bytes().into(),
                properties: Default::default(),
            }));
        }
        self.send(&packets).await?;
        while !waiting.is_empty() {
            match self.read().await? {
                Packet::PubAck(a) => {
                    waiting.remove(&a.packet_id);
                }
                Packet::PingResp => {}
                other => return Err(format!("unexpected {} from the broker", other.name())),
            }
        }
        Ok(())
    }
}
