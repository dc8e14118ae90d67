//! Accepting connections: socket options every listener sets (no Nagle delay, TCP
//! keepalive so that vanished peers are found), connection limits with a clear refusal,
//! and HTTP serving with header-read, idle and body timeouts.
//!
//! `axum::serve` sets no timer, so hyper's header-read timeout is off there: a client
//! that sends half a request, or an idle keep-alive connection, would hold its socket for
//! ever. Here hyper runs with a timer: a connection waiting for (the rest of) a request
//! header longer than `http.header_read_timeout` is closed — that covers slowloris
//! clients and idle keep-alive connections alike (hyper starts the timer whenever it
//! waits for the next request). A slow body is bounded by `http.body_read_timeout` in the
//! body extractor (408).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

/// How often and how long TCP keepalive probes a silent peer (after `idle`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// Socket options for an accepted connection: no Nagle delay (acks must not wait), and
/// TCP keepalive after `keepalive_idle` of silence (none when zero), so that a peer that
/// vanished without a FIN or RST is noticed within about `idle + 30 s`.
pub fn tune(stream: &TcpStream, keepalive_idle: Duration) {
    let _ = stream.set_nodelay(true);
    if !keepalive_idle.is_zero() {
        let ka = socket2::TcpKeepalive::new()
            .with_time(keepalive_idle)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES);
        let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&ka);
    }
}

/// How an HTTP listener serves.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Longest wait for a complete request header, and for the next request on an idle
    /// keep-alive connection.
    pub header_read_timeout: Duration,
    /// Most simultaneous connections; more are answered 503 and closed.
    pub max_connections: usize,
    /// TCP keepalive idle time (zero: off).
    pub keepalive_idle: Duration,
}

/// What a connection over the limit gets before it is closed (written without waiting).
fn over_limit_response() -> &'static [u8] {
    static RESPONSE: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        let body = r#"{"status":503,"message":"Too many HTTP connections (http.max_connections); retry later","errorCode":33}"#;
        format!("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
    });
    &RESPONSE
}

/// Serves `app` on `listener` until `shutdown` turns true, then lets open connections
/// finish their requests (`graceful_shutdown`) and returns once all have closed. Handlers
/// see the peer's address as `ConnectInfo<SocketAddr>`.
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    mut shutdown: watch::Receiver<bool>,
    on_over_limit: impl Fn() + Send + Sync + 'static,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (alive, mut all_closed) = mpsc::channel::<()>(1);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let builder = Arc::new(builder);
    loop {
        let (stream, peer) = tokio::select! {
            () = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    crate::logging::warn_limited!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            on_over_limit();
            let _ = stream.try_write(over_limit_response());
            continue;
        };
        tune(&stream, limits.keepalive_idle);
        let (app, builder, alive, mut stop) = (app.clone(), builder.clone(), alive.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _hold = (permit, alive);
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                let mut app = app.clone();
                async move { tower_service::Service::call(&mut app, req).await }
            });
            let conn = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
            tokio::pin!(conn);
            // A connection's own failure (reset, bad request line, timeout) is the client's
            // business: DEBUG, not WARN, as a flood of them must not flood the log.
            tokio::select! {
                ended = conn.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
                    }
                    return;
                }
                () = stopped(&mut stop) => {}
            }
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error during shutdown");
            }
        });
    }
    drop(alive);
    let _ = all_closed.recv().await;
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
