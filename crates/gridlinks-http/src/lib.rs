//! The HTTP transport: ThingsBoard's REST API (entities, telemetry, attributes, RPC,
//! users, tenants, MQTT application credentials), its HTTP device API, its WebSocket API
//! (live subscriptions fed by the platform's live fan-out) and the embedded web console,
//! served through `gridlinks-listener`'s bounded accept loop. It owns the HTTP shapes and
//! statuses and its own metrics; what it serves is `gridlinks-platform`'s (entities, auth,
//! device sessions). It never reaches into another transport: a device is reached through
//! the platform's device-session registry, whatever transport it uses.

pub mod app;
pub mod console;
pub mod metrics;
pub mod state;
pub mod thingsboard;
pub mod ws;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use gridlinks_listener::tls::Acceptor;
use gridlinks_listener::{serve_http, HttpLimits, Refusal};
use gridlinks_platform::logging::warn_limited;
use gridlinks_platform::Platform;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use state::{Http, Status, BULK_IMPORT_PATH};

/// The running HTTP transport.
pub struct Running {
    /// Readiness (`/healthz`, `/readyz`) and the HTTP side's counters.
    pub status: Arc<Status>,
    /// The accept loops (HTTP, then HTTPS if on); they end when `shutdown` turns true,
    /// after in-flight requests.
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The HTTP transport's listeners.
pub struct Listeners {
    /// HTTP.
    pub http: TcpListener,
    /// HTTPS.
    pub https: Option<(TcpListener, Acceptor)>,
    /// `/metrics` alone (`metrics.bind`).
    pub metrics: Option<TcpListener>,
}

/// Starts serving HTTP (and HTTPS, and `/metrics` on its own listener, when given) over
/// `platform` until `shutdown`: the WebSocket API joins the live fan-out and the HTTP
/// metrics are registered. Not ready (`/healthz` 503) until the caller sets `status.ready`.
pub fn start(platform: &Arc<Platform>, listeners: Listeners, shutdown: watch::Receiver<bool>) -> Running {
    let cfg = &platform.core.cfg;
    let ws = Arc::new(ws::Hub::default());
    platform.live.register(ws.clone());
    let status = Arc::new(Status::default());
    let polls = thingsboard::long_poll::LongPolls::start(platform);
    platform.metrics.register(Arc::new(metrics::HttpMetrics {
        status: status.clone(),
        ws: ws.clone(),
        polls: polls.clone(),
    }));
    let state = Http::new(platform.clone(), status.clone(), ws, polls);
    let app = app::router(state.clone());
    let limits = HttpLimits {
        header_read_timeout: cfg.http.header_read_timeout.duration(),
        max_connections: cfg.http_max_connections(),
        max_per_address: match cfg.http.max_connections_per_address {
            0 => usize::MAX,
            n => n,
        },
        unbounded: cfg.http.unbounded_addresses.clone(),
        keepalive_idle: cfg.tcp_keepalive_idle.duration(),
    };
    let over_limit = |st: Arc<Status>| {
        move |why| {
            st.http_over_limit.fetch_add(1, Ordering::Relaxed);
            match why {
                Refusal::Total => warn_limited!("HTTP connection refused: http.max_connections reached, all busy"),
                Refusal::Address => {
                    warn_limited!("HTTP connection refused: http.max_connections_per_address reached, all busy")
                }
            }
        }
    };
    // HTTPS and the metrics listener have connection bounds of their own (the same settings).
    let Listeners { http, https, metrics } = listeners;
    let mut tasks = vec![tokio::spawn(serve_http(
        http,
        app.clone(),
        limits.clone(),
        None,
        shutdown.clone(),
        over_limit(status.clone()),
    ))];
    if let Some((listener, tls)) = https {
        let serve = serve_http(listener, app, limits.clone(), Some(tls), shutdown.clone(), over_limit(status.clone()));
        tasks.push(tokio::spawn(serve));
    }
    if let Some(listener) = metrics {
        let serve =
            serve_http(listener, app::metrics_router(state), limits, None, shutdown, over_limit(status.clone()));
        tasks.push(tokio::spawn(serve));
    }
    Running { status, tasks }
}
