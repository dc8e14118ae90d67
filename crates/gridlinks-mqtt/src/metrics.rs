//! The MQTT transport's `/metrics`: broker sessions, connection counters and the PUBACK
//! latency histogram.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;

use gridlinks_platform::metrics::{counter, gauge, DescriptorEncoder, EncodeMetric, MetricType, Source};

use super::Mqtt;

/// Upper bounds of the PUBACK latency histogram, seconds.
pub const PUBACK_SECONDS_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0];

/// The MQTT transport's counters, broker sessions and PUBACK latency. Weak: the platform
/// keeps its metrics sources, and the MQTT handle keeps the platform.
pub struct MqttSource(pub Weak<Mqtt>);

impl Source for MqttSource {
    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let Some(st) = self.0.upgrade() else { return Ok(()) };
        gauge(
            e,
            "gridlinks_mqtt_sessions",
            "Persistent MQTT sessions, live and offline.",
            st.devices.sessions.count() as u64,
        )?;
        counter(
            e,
            "gridlinks_mqtt_dropped_qos0_total",
            "QoS 0 copies dropped because the subscriber's queue was full.",
            st.devices.sessions.dropped_qos0(),
        )?;
        counter(
            e,
            "gridlinks_mqtt_dropped_offline_total",
            "QoS 1/2 copies dropped because an offline session's queue was full.",
            st.devices.sessions.dropped_offline(),
        )?;
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
            "gridlinks_mqtt_over_connect_rate_total",
            "MQTT connections refused because their address exceeded mqtt.max_connects_per_address.",
            l(&m.over_connect_rate),
        )?;
        counter(
            e,
            "gridlinks_mqtt_tls_handshakes_refused_total",
            "MQTT over TLS connections whose TLS handshake failed or timed out.",
            l(&m.tls_refused),
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
}
