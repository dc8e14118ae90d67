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

/// Starts serving HTTP on `listener` (and HTTPS on `tls`'s listener) over `platform` until
/// `shutdown`: the WebSocket API joins the live fan-out and the HTTP metrics are
/// registered. Not ready (`/healthz` 503) until the caller sets `status.ready`.
pub fn start(
    platform: &Arc<Platform>,
    listener: TcpListener,
    tls: Option<(TcpListener, Acceptor)>,
    shutdown: watch::Receiver<bool>,
) -> Running {
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
    let app = app::router(Http::new(platform.clone(), status.clone(), ws, polls));
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
    // HTTPS has its own connection bounds (the same settings).
    let mut tasks = Vec::with_capacity(2);
    if let Some((tls_listener, tls)) = tls {
        let serve = serve_http(
            tls_listener,
            app.clone(),
            limits.clone(),
            Some(tls),
            shutdown.clone(),
            over_limit(status.clone()),
        );
        tasks.push(tokio::spawn(serve));
    }
    tasks.insert(0, tokio::spawn(serve_http(listener, app, limits, None, shutdown, over_limit(status.clone()))));
    Running { status, tasks }
}
