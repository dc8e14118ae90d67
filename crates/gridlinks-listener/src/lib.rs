//! HTTP accept loops for the transports that speak HTTP (the REST API and MQTT over
//! WebSocket): connection limits with a clear refusal, and serving with header-read, idle
//! and body timeouts. It knows no routes and no transport; socket options are
//! `gridlinks_platform::net`.
//!
//! `axum::serve` sets no timer, so hyper's header-read timeout is off there: a client
//! that sends half a request, or an idle keep-alive connection, would hold its socket for
//! ever. Here hyper runs with a timer: a connection waiting for (the rest of) a request
//! header longer than `http.header_read_timeout` is closed — that covers slowloris
//! clients and idle keep-alive connections alike (hyper starts the timer whenever it
//! waits for the next request). A slow body is bounded by `http.body_read_timeout` in the
//! body extractor (408).
//!
//! Connections are bounded in total (`http.max_connections`, by default a share of the
//! open-files limit) and per source address (`http.max_connections_per_address`). At either
//! bound a new connection takes the place of the longest-idle one that is not in the middle
//! of a request (an idle keep-alive connection, or one that has not finished its request
//! header): an address that opens hundreds of idle connections holds nothing another
//! client needs. Only when every connection in the way is busy is the new one refused with
//! 503.
//!
//! [`tls`]: TLS for these listeners and for the other transports' TCP listeners.

pub mod tls;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::http::header;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};

/// How an HTTP listener serves.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Longest wait for a complete request header, and for the next request on an idle
    /// keep-alive connection.
    pub header_read_timeout: Duration,
    /// Most simultaneous connections.
    pub max_connections: usize,
    /// Most simultaneous connections from one address.
    pub max_per_address: usize,
    /// Addresses `max_per_address` does not apply to.
    pub unbounded: Vec<IpAddr>,
    /// TCP keepalive idle time (zero: off).
    pub keepalive_idle: Duration,
}

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `http.max_connections` reached, every connection busy.
    Total,
    /// `http.max_connections_per_address` reached for its address, every one busy.
    Address,
}

/// What a refused connection gets before it is closed (written without waiting).
fn over_limit_response(why: Refusal) -> &'static [u8] {
    fn response(message: &str) -> Vec<u8> {
        let body = format!(r#"{{"status":503,"message":"{message}","errorCode":33}}"#);
        format!("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
    }
    static TOTAL: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        response("Too many HTTP connections (http.max_connections), all busy; retry later")
    });
    static ADDRESS: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        response(
            "Too many HTTP connections from your address (http.max_connections_per_address), all busy; retry later",
        )
    });
    match why {
        Refusal::Total => &TOTAL,
        Refusal::Address => &ADDRESS,
    }
}

/// One open connection, as the admission sees it.
struct Conn {
    addr: IpAddr,
    /// Requests being handled.
    busy: AtomicUsize,
    /// When it last finished a request (or opened), ms since [`Conns::epoch`].
    idle_since: AtomicU64,
    /// Chosen to make room: closing (it no longer counts).
    leaving: AtomicBool,
    /// Wakes the connection to close.
    shed: Notify,
}

/// The open connections: how many in all and per address, and which may make room.
struct Conns {
    epoch: Instant,
    max: usize,
    max_per_address: usize,
    unbounded: Vec<IpAddr>,
    inner: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next: u64,
    conns: HashMap<u64, Arc<Conn>>,
    /// Connections per address that are not leaving.
    per_address: HashMap<IpAddr, usize>,
    /// Connections that are leaving.
    leaving: usize,
}

/// A connection's place; gives it back when dropped.
struct Place {
    conns: Arc<Conns>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.conns.inner.lock();
        open.conns.remove(&self.id);
        if self.conn.leaving.load(Ordering::Relaxed) {
            open.leaving -= 1;
        } else {
            forget(&mut open.per_address, self.conn.addr);
        }
    }
}

fn forget(per_address: &mut HashMap<IpAddr, usize>, addr: IpAddr) {
    if let Some(n) = per_address.get_mut(&addr) {
        *n -= 1;
        if *n == 0 {
            per_address.remove(&addr);
        }
    }
}

impl Conns {
    fn new(limits: &HttpLimits) -> Self {
        Conns {
            epoch: Instant::now(),
            max: limits.max_connections,
            max_per_address: limits.max_per_address,
            unbounded: limits.unbounded.clone(),
            inner: Mutex::default(),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A place for a connection from `addr`, making room by closing the longest-idle
    /// connection (of `addr` when its address is at its bound) if need be.
    fn admit(self: &Arc<Self>, addr: IpAddr) -> Result<Place, Refusal> {
        let mut open = self.inner.lock();
        let from_addr = match self.unbounded.contains(&addr) {
            true => 0,
            false => open.per_address.get(&addr).copied().unwrap_or(0),
        };
        let counted = open.conns.len() - open.leaving;
        let room = if from_addr >= self.max_per_address {
            Some((Some(addr), Refusal::Address))
        } else if counted >= self.max {
            Some((None, Refusal::Total))
        } else {
            None
        };
        if let Some((of, refusal)) = room {
            let idlest = open
                .conns
                .values()
                .filter(|c| of.is_none_or(|a| c.addr == a))
                .filter(|c| c.busy.load(Ordering::Acquire) == 0 && !c.leaving.load(Ordering::Relaxed))
                .min_by_key(|c| c.idle_since.load(Ordering::Relaxed))
                .cloned();
            let Some(victim) = idlest else { return Err(refusal) };
            victim.leaving.store(true, Ordering::Relaxed);
            open.leaving += 1;
            forget(&mut open.per_address, victim.addr);
            victim.shed.notify_one();
        }
        let conn = Arc::new(Conn {
            addr,
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(self.now()),
            leaving: AtomicBool::new(false),
            shed: Notify::new(),
        });
        open.next += 1;
        let id = open.next;
        open.conns.insert(id, conn.clone());
        *open.per_address.entry(addr).or_default() += 1;
        Ok(Place { conns: self.clone(), id, conn })
    }
}

/// Marks a connection busy while a request is handled.
struct Busy<'a>(&'a Conns, &'a Conn);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.1.idle_since.store(self.0.now(), Ordering::Relaxed);
        self.1.busy.fetch_sub(1, Ordering::Release);
    }
}

/// Serves `app` on `listener` until `shutdown` turns true, then lets open connections
/// finish their requests (`graceful_shutdown`) and returns once all have closed. Handlers
/// see the peer's address as `ConnectInfo<SocketAddr>`. With `tls`, each connection's
/// handshake comes first (it holds the connection's place meanwhile; the handshake timeout
/// bounds it).
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<tls::Acceptor>,
    mut shutdown: watch::Receiver<bool>,
    on_over_limit: impl Fn(Refusal) + Send + Sync + 'static,
) {
    let conns = Arc::new(Conns::new(&limits));
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
                    gridlinks_platform::logging::warn_limited!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let place = match conns.admit(peer.ip()) {
            Ok(place) => place,
            Err(why) => {
                on_over_limit(why);
                if tls.is_none() {
                    let _ = stream.try_write(over_limit_response(why));
                }
                continue;
            }
        };
        gridlinks_platform::net::tune(&stream, limits.keepalive_idle);
        let conn = Connection { app: app.clone(), builder: builder.clone(), place: Arc::new(place), peer, cert: None };
        let (tls, alive, stop) = (tls.clone(), alive.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _alive = alive;
            match tls {
                None => conn.serve(TokioIo::new(stream), stop).await,
                Some(tls) => match tls.accept(stream).await {
                    Ok((stream, cert)) => {
                        Connection { cert: cert.map(Arc::new), ..conn }.serve(TokioIo::new(stream), stop).await
                    }
                    Err(e) => tracing::debug!(%peer, error = %e, "HTTPS connection refused"),
                },
            }
        });
    }
    drop(alive);
    let _ = all_closed.recv().await;
}

/// One admitted connection.
struct Connection {
    app: Router,
    builder: Arc<hyper::server::conn::http1::Builder>,
    place: Arc<Place>,
    peer: std::net::SocketAddr,
    /// The certificate the client presented in the TLS handshake (where asked for): each
    /// request carries it as an extension.
    cert: Option<Arc<tls::ClientCert>>,
}

impl Connection {
    /// Serves requests on `io` until the client closes, `stop` turns true or the
    /// connection is shed to make room.
    async fn serve<I>(self, io: I, mut stop: watch::Receiver<bool>)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let Connection { app, builder, place, peer, cert } = self;
        let in_service = place.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            if let Some(cert) = &cert {
                req.extensions_mut().insert(cert.clone());
            }
            let mut app = app.clone();
            let place = in_service.clone();
            place.conn.busy.fetch_add(1, Ordering::AcqRel);
            let has_body = req.headers().get(header::CONTENT_LENGTH).is_some_and(|n| n.as_bytes() != b"0")
                || req.headers().contains_key(header::TRANSFER_ENCODING);
            async move {
                let _busy = Busy(&place.conns, &place.conn);
                let mut res = tower_service::Service::call(&mut app, req).await;
                if let Ok(res) = &mut res {
                    close_if_refused(has_body, res);
                }
                res
            }
        });
        let conn = builder.serve_connection(io, service).with_upgrades();
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
            // Making room for another: idle, so it closes at once.
            () = place.conn.shed.notified() => {}
        }
        conn.as_mut().graceful_shutdown();
        if let Err(e) = conn.await {
            tracing::debug!(%peer, error = %e, "HTTP connection ended with an error during shutdown");
        }
    }
}

/// An error answered to a request that came with a body says `Connection: close`: its
/// handler may have refused before reading the body (a bad token, no permission), and hyper
/// then cannot reuse the connection. Said in the answer, a client does not send its next
/// request down a connection that is closing (ureq and others do not retry a POST that met
/// a closed connection).
fn close_if_refused<B>(has_body: bool, res: &mut axum::http::Response<B>) {
    if has_body && (res.status().is_client_error() || res.status().is_server_error()) {
        res.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
