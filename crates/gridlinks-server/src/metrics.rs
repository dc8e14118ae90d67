//! `GET /metrics`: every metric GridLinks exposes, named and described in this one file
//! and encoded by `prometheus-client` (OpenMetrics text, each with `# HELP` and `# TYPE`).
//!
//! The subsystems keep plain atomics ([`crate::app::Metrics`], [`crate::mqtt::MqttMetrics`],
//! the storage writer's [`WriterStats`]) and know nothing of Prometheus; a scrape reads them
//! through the [`Scrape`] collector. The writer's per-commit histograms are its own
//! lock-free [`gridlinks_storage::histogram::Histogram`]s, converted here; the PUBACK
//! latency is a `prometheus-client` histogram in [`crate::mqtt::MqttMetrics`].
//!
//! Counter names below are the exposed ones (`…_total`); the encoder adds that suffix
//! itself, so it is stripped before encoding.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use gridlinks_storage::histogram::Snapshot;
use gridlinks_storage::writer::WriterStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::app::{Core, Http};
use crate::coap::CoapMetrics;
use crate::mqtt::Mqtt;
use crate::tcp::TcpMetrics;

/// The `Content-Type` of the scrape response.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the PUBACK latency histogram, seconds.
pub const PUBACK_SECONDS_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0];

/// The metrics text of one scrape.
pub fn render(st: &Http) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(st.clone())));
    let mut out = String::with_capacity(8 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// Reads the server's counters at scrape time.
struct Scrape(Http);

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Scrape")
    }
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let st = &self.0;
        storage(&mut e, &st.core)?;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut e,
            "gridlinks_payload_rejected_total",
            "Device payloads refused as malformed or over limits.",
            l(&st.status.payload_rejected),
        )?;
        counter(
            &mut e,
            "gridlinks_http_over_limit_total",
            "HTTP connections refused at http.max_connections or http.max_connections_per_address, every connection in the way busy.",
            l(&st.status.http_over_limit),
        )?;
        gauge(
            &mut e,
            "gridlinks_mqtt_sessions",
            "Persistent MQTT sessions, live and offline.",
            st.mqtt.sessions.count() as u64,
        )?;
        counter(
            &mut e,
            "gridlinks_mqtt_dropped_qos0_total",
            "QoS 0 copies dropped because the subscriber's queue was full.",
            st.mqtt.sessions.dropped_qos0(),
        )?;
        counter(
            &mut e,
            "gridlinks_mqtt_dropped_offline_total",
            "QoS 1/2 copies dropped because an offline session's queue was full.",
            st.mqtt.sessions.dropped_offline(),
        )?;
        gauge(&mut e, "gridlinks_ws_sessions", "Open WebSocket API sessions (/api/ws).", st.ws.sessions() as u64)?;
        gauge(
            &mut e,
            "gridlinks_ws_subscriptions",
            "WebSocket API subscriptions (an ENTITY_DATA page's devices count one each).",
            st.ws.subscriptions() as u64,
        )?;
        mqtt(&mut e, &st.mqtt)?;
        tcp(&mut e, &st.tcp)?;
        coap(&mut e, &st.coap)
    }
}

/// CoAP counters.
fn coap(e: &mut DescriptorEncoder, m: &CoapMetrics) -> fmt::Result {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    counter(
        e,
        "gridlinks_coap_requests_total",
        "CoAP requests processed (retransmissions not counted).",
        l(&m.requests),
    )?;
    counter(
        e,
        "gridlinks_coap_duplicates_total",
        "Retransmitted CoAP requests answered from the exchange store, not processed again.",
        l(&m.duplicates),
    )?;
    counter(
        e,
        "gridlinks_coap_malformed_total",
        "UDP datagrams on the CoAP port that were not CoAP version 1, had a format error, or were rejected for an unsupported critical option.",
        l(&m.malformed),
    )?;
    counter(e, "gridlinks_coap_errors_total", "CoAP requests answered with a 4.xx or 5.xx code.", l(&m.errors))?;
    gauge(
        e,
        "gridlinks_coap_observations",
        "Live CoAP observations (attributes and RPC).",
        m.observations.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "gridlinks_coap_notifications_total",
        "CoAP notifications sent, retransmissions included.",
        l(&m.notifications),
    )?;
    gauge(e, "gridlinks_coap_exchanges", "CoAP exchanges remembered for deduplication.", l(&m.exchanges))?;
    counter(
        e,
        "gridlinks_coap_exchanges_evicted_total",
        "CoAP exchanges forgotten before coap.exchange_lifetime because a bound was reached.",
        l(&m.exchanges_evicted),
    )?;
    counter(
        e,
        "gridlinks_coap_exchanges_refused_total",
        "CoAP requests refused (5.03): coap.max_exchanges_per_peer of their endpoint in progress.",
        l(&m.exchanges_refused),
    )?;
    counter(
        e,
        "gridlinks_coap_echo_challenges_total",
        "CoAP answers to unverified endpoints replaced by 4.01 with an Echo option (amplification limit).",
        l(&m.echo_challenges),
    )?;
    counter(
        e,
        "gridlinks_coap_diagnostics_withheld_total",
        "CoAP error answers to unverified endpoints sent without their diagnostic text (amplification limit).",
        l(&m.diagnostics_withheld),
    )?;
    gauge(e, "gridlinks_coap_verified_peers", "CoAP endpoints verified by an Echo value.", l(&m.verified_peers))
}

/// Custom TCP protocols' counters (all listeners together).
fn tcp(e: &mut DescriptorEncoder, m: &TcpMetrics) -> fmt::Result {
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    gauge(
        e,
        "gridlinks_tcp_connections",
        "Open connections of custom TCP protocols.",
        m.connections.load(Ordering::Relaxed),
    )?;
    counter(e, "gridlinks_tcp_logins_total", "Custom TCP connections bound to their device.", l(&m.logins))?;
    counter(
        e,
        "gridlinks_tcp_logins_refused_total",
        "Custom TCP connections closed because their identity was unknown or could not be provisioned.",
        l(&m.logins_refused),
    )?;
    counter(e, "gridlinks_tcp_frames_total", "Custom TCP frames committed and answered.", l(&m.frames))?;
    counter(
        e,
        "gridlinks_tcp_bad_frames_total",
        "Byte runs the framing could not make a frame of (garbage, length, end marker, checksum).",
        l(&m.bad_frames),
    )?;
    counter(
        e,
        "gridlinks_tcp_decode_errors_total",
        "Custom TCP frames the decoder refused (script error or time limit, unknown frame type).",
        l(&m.decode_errors),
    )?;
    counter(
        e,
        "gridlinks_tcp_rejected_total",
        "Custom TCP frames rejected for naming no device before login, or another device.",
        l(&m.rejected),
    )?;
    counter(
        e,
        "gridlinks_tcp_not_committed_total",
        "Custom TCP frames not committed (overload, disk full, bad values), so not answered.",
        l(&m.not_committed),
    )?;
    counter(
        e,
        "gridlinks_tcp_timeouts_total",
        "Custom TCP connections closed after tcp.login_timeout or tcp.idle_timeout.",
        l(&m.timeouts),
    )?;
    counter(
        e,
        "gridlinks_tcp_downlinks_total",
        "Server-to-device messages (RPC requests, shared attributes) sent to custom TCP devices.",
        l(&m.downlinks),
    )?;
    counter(
        e,
        "gridlinks_tcp_downlink_errors_total",
        "Server-to-device messages a custom TCP protocol had no frame for (not sent).",
        l(&m.downlink_errors),
    )
}

/// The storage writer's counters and histograms.
fn storage(e: &mut DescriptorEncoder, st: &Core) -> fmt::Result {
    let w: &WriterStats = st.writer.stats();
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    counter(
        e,
        "gridlinks_storage_commits_total",
        "Group commits done (write rounds; each ends with one fsync when anything was written).",
        l(&w.commits),
    )?;
    counter(e, "gridlinks_storage_write_ops_total", "Write requests answered by the storage writer.", l(&w.ops))?;
    counter(e, "gridlinks_storage_records_total", "Time-series records written.", l(&w.records))?;
    counter(
        e,
        "gridlinks_storage_sync_seconds_total",
        "Seconds the storage writer spent in fsync.",
        l(&w.sync_nanos) as f64 / 1e9,
    )?;
    counter(
        e,
        "gridlinks_storage_overloaded_total",
        "Write requests refused because the write queue stayed full (storage overloaded).",
        l(&w.overloaded),
    )?;
    gauge(
        e,
        "gridlinks_storage_queue_depth",
        "Write requests waiting in the storage writer's queue.",
        st.writer.queued() as u64,
    )?;
    counter(
        e,
        "gridlinks_storage_refused_unhealthy_total",
        "Write requests refused because the disk was (nearly) full or the store had failed.",
        l(&w.refused_unhealthy),
    )?;
    counter(
        e,
        "gridlinks_storage_reopens_total",
        "Times the store was reopened after an engine failure.",
        l(&w.reopens),
    )?;
    gauge(e, "gridlinks_storage_health", "Storage health: 0 ok, 1 disk full, 2 failed.", st.store.health() as u64)?;
    gauge(e, "gridlinks_storage_bytes", "Bytes the store's files take on disk.", st.store.disk_bytes())?;
    histogram(
        e,
        "gridlinks_storage_commit_seconds",
        "Duration of one group commit round, from taking the batch to the end of its fsync.",
        &w.commit_nanos.snapshot(),
        1e-9,
    )?;
    histogram(
        e,
        "gridlinks_storage_commit_batch_ops",
        "Write requests per group commit.",
        &w.commit_batch_ops.snapshot(),
        1.0,
    )
}

/// The MQTT transport's counters and PUBACK latency.
fn mqtt(e: &mut DescriptorEncoder, st: &Mqtt) -> fmt::Result {
    let m = &st.metrics;
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    gauge(
        e,
        "gridlinks_mqtt_connections",
        "Open MQTT connections (TCP and WebSocket).",
        m.connections.load(Ordering::Relaxed),
    )?;
    counter(e, "gridlinks_mqtt_connects_total", "Accepted MQTT CONNECTs.", l(&m.connects))?;
    counter(
        e,
        "gridlinks_mqtt_connects_refused_total",
        "Refused MQTT CONNECTs (bad credentials, protocol, timeout).",
        l(&m.connects_refused),
    )?;
    counter(e, "gridlinks_mqtt_publishes_total", "MQTT PUBLISH packets received.", l(&m.publishes))?;
    counter(
        e,
        "gridlinks_mqtt_bad_publishes_total",
        "MQTT publishes refused for a bad payload, an unknown topic or a device not allowed.",
        l(&m.bad_publishes),
    )?;
    counter(
        e,
        "gridlinks_mqtt_protocol_errors_total",
        "MQTT connections closed for a protocol violation or a malformed packet.",
        l(&m.protocol_errors),
    )?;
    counter(
        e,
        "gridlinks_mqtt_keepalive_timeouts_total",
        "MQTT connections closed because their keep-alive expired.",
        l(&m.keepalive_timeouts),
    )?;
    counter(
        e,
        "gridlinks_mqtt_over_limit_total",
        "MQTT connections refused because mqtt.max_connections was reached.",
        l(&m.over_limit),
    )?;
    counter(
        e,
        "gridlinks_mqtt_over_credential_limit_total",
        "MQTT CONNECTs refused because their credential had mqtt.max_connections_per_credential.",
        l(&m.over_credential_limit),
    )?;
    counter(
        e,
        "gridlinks_mqtt_too_large_discarded_total",
        "MQTT packets not sent because they exceeded the client's Maximum Packet Size.",
        l(&m.too_large),
    )?;
    counter(
        e,
        "gridlinks_mqtt_closed_too_slow_total",
        "MQTT connections closed because their outbound queue stayed full (0x97).",
        l(&m.too_slow),
    )?;
    let help = "Seconds from a device's QoS 1 PUBLISH decoded to its PUBACK ready (a positive PUBACK only after the durable commit).";
    m.puback.encode(e.encode_descriptor("gridlinks_mqtt_puback_seconds", help, None, MetricType::Histogram)?)
}

/// One counter; `name` is the exposed name, ending in `_total`.
fn counter<N>(e: &mut DescriptorEncoder, name: &str, help: &str, value: N) -> fmt::Result
where
    ConstCounter<N>: EncodeMetric,
{
    debug_assert!(name.ends_with("_total"), "{name}");
    let c = ConstCounter::new(value);
    c.encode(e.encode_descriptor(name.strip_suffix("_total").unwrap_or(name), help, None, c.metric_type())?)
}

/// One gauge.
fn gauge<N>(e: &mut DescriptorEncoder, name: &str, help: &str, value: N) -> fmt::Result
where
    ConstGauge<N>: EncodeMetric,
{
    let g = ConstGauge::new(value);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One histogram from a storage snapshot, its bounds and sum multiplied by `scale` (e.g.
/// nanoseconds to seconds).
fn histogram(e: &mut DescriptorEncoder, name: &str, help: &str, s: &Snapshot, scale: f64) -> fmt::Result {
    let buckets: Vec<(f64, u64)> =
        s.buckets.iter().map(|&(bound, n)| (bound.map_or(f64::INFINITY, |b| b as f64 * scale), n)).collect();
    e.encode_descriptor(name, help, None, MetricType::Histogram)?.encode_histogram::<NoLabelSet>(
        s.sum as f64 * scale,
        s.count,
        &buckets,
        None,
    )
}
