//! The MQTT transport: listener, per-connection protocol handling (MQTT 3.1, 3.1.1, 5.0
//! through the sans-IO `gridlinks-codec`), authentication by access token, keep-alive,
//! in-order durable PUBACKs, and delivery of server-originated messages from
//! `gridlinks_broker::sessions`. ThingsBoard's topic semantics live in
//! `crate::thingsboard::device_mqtt`.

pub mod clients;
mod connection;
pub mod pubsub;
pub mod retained;
pub mod telemetry_topics;
pub mod transport;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::app::AppState;

/// Counters of the MQTT transport, for `/metrics`.
#[derive(Default)]
pub struct MqttMetrics {
    /// Open connections.
    pub connections: AtomicI64,
    /// Accepted CONNECTs.
    pub connects: AtomicU64,
    /// Refused CONNECTs (bad token, protocol, timeout).
    pub connects_refused: AtomicU64,
    /// PUBLISH packets received.
    pub publishes: AtomicU64,
    /// Publishes refused for a bad payload or an unknown topic.
    pub bad_publishes: AtomicU64,
    /// Connections closed for a protocol violation or malformed packet.
    pub protocol_errors: AtomicU64,
    /// Connections closed because keep-alive expired.
    pub keepalive_timeouts: AtomicU64,
    /// Connections refused because `mqtt.max_connections` was reached.
    pub over_limit: AtomicU64,
    /// Packets not sent because they exceeded the client's Maximum Packet Size.
    pub too_large: AtomicU64,
    /// Pub/sub connections closed because their outbound queue stayed full (too slow).
    pub too_slow: AtomicU64,
}

impl MqttMetrics {
    /// Prometheus text lines.
    pub fn render(&self) -> String {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "# TYPE gridlinks_mqtt_connections gauge\ngridlinks_mqtt_connections {}\n\
             # TYPE gridlinks_mqtt_connects_total counter\ngridlinks_mqtt_connects_total {}\n\
             # TYPE gridlinks_mqtt_connects_refused_total counter\ngridlinks_mqtt_connects_refused_total {}\n\
             # TYPE gridlinks_mqtt_publishes_total counter\ngridlinks_mqtt_publishes_total {}\n\
             # TYPE gridlinks_mqtt_bad_publishes_total counter\ngridlinks_mqtt_bad_publishes_total {}\n\
             # TYPE gridlinks_mqtt_protocol_errors_total counter\ngridlinks_mqtt_protocol_errors_total {}\n\
             # TYPE gridlinks_mqtt_keepalive_timeouts_total counter\ngridlinks_mqtt_keepalive_timeouts_total {}\n\
             # TYPE gridlinks_mqtt_over_limit_total counter\ngridlinks_mqtt_over_limit_total {}\n\
             # TYPE gridlinks_mqtt_too_large_discarded_total counter\ngridlinks_mqtt_too_large_discarded_total {}\n\
             # TYPE gridlinks_mqtt_closed_too_slow_total counter\ngridlinks_mqtt_closed_too_slow_total {}\n",
            self.connections.load(Ordering::Relaxed),
            l(&self.connects),
            l(&self.connects_refused),
            l(&self.publishes),
            l(&self.bad_publishes),
            l(&self.protocol_errors),
            l(&self.keepalive_timeouts),
            l(&self.over_limit),
            l(&self.too_large),
            l(&self.too_slow),
        )
    }
}

/// Accepts MQTT connections until `shutdown` turns true. Every connection task holds a
/// clone of `alive`; the caller waits for all of them by waiting for the channel to close.
pub async fn listen(listener: TcpListener, st: Arc<AppState>, mut shutdown: watch::Receiver<bool>, alive: mpsc::Sender<()>, limit: Arc<Semaphore>) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let Ok(permit) = limit.clone().try_acquire_owned() else {
                        st.mqtt_metrics.over_limit.fetch_add(1, Ordering::Relaxed);
                        drop(stream);
                        continue;
                    };
                    let st = st.clone();
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection::run(stream, st, (permit, alive.clone())));
                }
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "mqtt accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// What the WebSocket upgrade handler needs.
struct WsContext {
    st: Arc<AppState>,
    alive: mpsc::Sender<()>,
    limit: Arc<Semaphore>,
}

/// Serves MQTT over WebSocket (`GET /mqtt`, subprotocol `mqtt`) until `shutdown` turns
/// true; connections count against the same `mqtt.max_connections` as TCP ones.
pub async fn listen_ws(listener: TcpListener, st: Arc<AppState>, shutdown: watch::Receiver<bool>, alive: mpsc::Sender<()>, limit: Arc<Semaphore>) {
    use axum::routing::get;
    let mut stop = shutdown;
    let ctx = Arc::new(WsContext { st, alive, limit });
    let app = axum::Router::new().route("/mqtt", get(upgrade)).with_state(ctx);
    let served = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stop.wait_for(|stopping| *stopping).await;
    });
    if let Err(e) = served.await {
        tracing::warn!(error = %e, "MQTT over WebSocket listener failed");
    }
}

async fn upgrade(
    axum::extract::State(ctx): axum::extract::State<Arc<WsContext>>,
    ws: axum::extract::ws::WebSocketUpgrade,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Ok(permit) = ctx.limit.clone().try_acquire_owned() else {
        ctx.st.mqtt_metrics.over_limit.fetch_add(1, Ordering::Relaxed);
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "mqtt.max_connections reached").into_response();
    };
    // One WebSocket message may hold several MQTT packets; none may exceed the limit.
    let max = ctx.st.cfg.mqtt.max_packet_size.saturating_add(64 * 1024);
    let (st, alive) = (ctx.st.clone(), ctx.alive.clone());
    ws.protocols(["mqtt"]).max_message_size(max).max_frame_size(max).on_upgrade(move |socket| connection::run(transport::Ws(socket), st, (permit, alive)))
}
