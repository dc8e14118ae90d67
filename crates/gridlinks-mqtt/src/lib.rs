//! The MQTT transport: listeners (TCP and WebSocket), per-connection protocol handling (MQTT
//! 3.1, 3.1.1, 5.0 through the sans-IO `gridlinks-codec`), authentication (access tokens,
//! MQTT_BASIC, application credentials), keep-alive, in-order durable PUBACKs, delivery of
//! server-originated messages from `gridlinks_broker::sessions`, and the broker around it:
//! persistent sessions, retained messages, the canonical telemetry topics, and across nodes
//! the Kafka bus, session handoff and shared subscriptions. It stands on
//! `gridlinks-platform` alone (ThingsBoard's topic semantics are its `device_api`) and
//! never reaches into another transport.

pub mod canonical;
mod connection;
pub mod handoff;
pub mod metrics;
pub mod pubsub;
pub mod retained;
pub mod shared;
pub mod transport;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gridlinks_listener::tls::Acceptor;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

use gridlinks_broker::acl::Acl;
use gridlinks_platform::Platform;

/// The MQTT subsystem's handle: what the listeners, every connection and the broker's
/// routing share. The REST endpoints that manage application credentials and call device
/// RPCs use it too.
pub struct Mqtt {
    /// What every transport stands on: core, auth, device sessions, credentials.
    pub platform: Arc<Platform>,
    /// Counters.
    pub metrics: MqttMetrics,
    /// What anonymous clients may do (`mqtt.anonymous_publish` / `anonymous_subscribe`).
    pub anonymous_acl: Arc<Acl>,
    /// With several nodes: the shared subscription groups this node follows on Kafka.
    pub shared: Option<shared::SharedGroups>,
    /// With several nodes: sessions this node is taking over, waiting for their holder.
    pub handoffs: handoff::Handoffs,
    /// `tls.client_ca_file`'s CA certificates (DER): who issues application clients'
    /// (read again on SIGHUP).
    pub client_cas: parking_lot::RwLock<Arc<Vec<Vec<u8>>>>,
}

impl std::ops::Deref for Mqtt {
    type Target = Platform;
    fn deref(&self) -> &Platform {
        &self.platform
    }
}

/// Counters of the MQTT transport, for `/metrics` (named and encoded in `crate::metrics`).
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
    /// TLS connections whose handshake failed or timed out.
    pub tls_refused: AtomicU64,
    /// Connections refused by `mqtt.max_connects_per_address`.
    pub over_connect_rate: AtomicU64,
    /// CONNECTs refused because their credential had `mqtt.max_connections_per_credential`.
    pub over_credential_limit: AtomicU64,
    /// Packets not sent because they exceeded the client's Maximum Packet Size.
    pub too_large: AtomicU64,
    /// Pub/sub connections closed because their outbound queue stayed full (too slow).
    pub too_slow: AtomicU64,
    /// Seconds from a device's QoS 1 PUBLISH decoded to its PUBACK ready (after the commit).
    pub puback: prometheus_client::metrics::histogram::Histogram,
}

impl Default for MqttMetrics {
    fn default() -> Self {
        Self {
            connections: AtomicI64::default(),
            connects: AtomicU64::default(),
            connects_refused: AtomicU64::default(),
            publishes: AtomicU64::default(),
            bad_publishes: AtomicU64::default(),
            protocol_errors: AtomicU64::default(),
            keepalive_timeouts: AtomicU64::default(),
            over_limit: AtomicU64::default(),
            tls_refused: AtomicU64::default(),
            over_connect_rate: AtomicU64::default(),
            over_credential_limit: AtomicU64::default(),
            too_large: AtomicU64::default(),
            too_slow: AtomicU64::default(),
            puback: prometheus_client::metrics::histogram::Histogram::new(metrics::PUBACK_SECONDS_BUCKETS),
        }
    }
}

impl Mqtt {
    /// A pub/sub client's ACL: the rules of `mqtt.acl_rules` that apply to it (`user`
    /// `None`: anonymous), then `base` (its credential's rules and allow lists).
    pub fn client_acl(&self, base: &Arc<Acl>, user: Option<&str>, client_id: &str) -> Arc<Acl> {
        let configured = &self.core.cfg.mqtt.acl_rules;
        if configured.is_empty() {
            return base.clone();
        }
        let mut rules = gridlinks_platform::broker_clients::configured_rules(configured, user, client_id);
        rules.extend(base.rules.iter().cloned());
        Arc::new(Acl { rules, ..(**base).clone() })
    }

    /// Whether a client's certificate `chain` (DER, its own first) chains to one of
    /// `tls.client_ca_file`'s CA certificates: an application client's.
    pub fn issued_to_application(&self, chain: &[Vec<u8>]) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else { return false };
        let cas = self.client_cas.read().clone();
        cas.iter().any(|ca| gridlinks_platform::provision::chains_to(leaf, intermediates, ca))
    }

    /// Reads `tls.client_ca_file` again; a file that cannot be read keeps the CAs in use.
    pub fn reload_client_cas(&self) -> Result<usize, gridlinks_listener::tls::TlsError> {
        let cas = gridlinks_listener::tls::load_certificates(&self.core.cfg.tls.client_ca_file)?;
        let n = cas.len();
        *self.client_cas.write() = Arc::new(cas);
        Ok(n)
    }

    /// The device whose X509_CERTIFICATE credentials have this fingerprint; `Err` when the
    /// store cannot be read.
    pub async fn x509_login(&self, fingerprint: &str) -> Result<Option<gridlinks_types::DeviceId>, ()> {
        let (store, fingerprint) = (self.core.store.clone(), fingerprint.to_owned());
        let found = tokio::task::spawn_blocking(move || store.device_by_x509(&fingerprint)).await;
        match found {
            Ok(Ok(device)) => Ok(device.filter(|d| d.x509.is_some()).map(|d| d.id)),
            _ => Err(()),
        }
    }

    /// A device's MQTT_BASIC login: `Ok(None)` when no device has credentials of this user
    /// name (or, without one, of this client id alone); the device when the client id and
    /// password match. Password checks are throttled per address and user name and run on
    /// the password threads, like application logins.
    pub async fn basic_login(
        &self,
        peer: std::net::IpAddr,
        user_name: Option<&str>,
        client_id: &str,
        password: Option<&[u8]>,
    ) -> Result<Option<gridlinks_types::DeviceId>, gridlinks_platform::auth::AuthError> {
        use gridlinks_platform::auth::AuthError;
        let store = self.core.store.clone();
        let (user, client) = (user_name.map(str::to_owned), client_id.to_owned());
        let found = tokio::task::spawn_blocking(move || store.device_by_basic(user.as_deref(), &client))
            .await
            .map_err(|_| AuthError::Busy)?
            .map_err(|_| AuthError::Busy)?;
        let Some(device) = found else { return Ok(None) };
        let Some(basic) = &device.basic else { return Ok(None) };
        let key = format!("\0basic/{}", user_name.unwrap_or(client_id));
        self.auth.throttle.check(peer, &key).map_err(AuthError::Throttled)?;
        let client_ok = basic.client_id.as_deref().is_none_or(|c| c == client_id);
        let password_ok = match (&basic.password_hash, password.filter(|p| !p.is_empty())) {
            (Some(phc), Some(p)) => self.auth.passwords.verify(p, Some(phc)).await?,
            (None, None) => true,
            _ => false,
        };
        if client_ok && password_ok {
            self.auth.throttle.succeeded(peer, &key);
            Ok(Some(device.id))
        } else {
            self.auth.throttle.failed(peer, &key);
            Err(AuthError::BadCredentials)
        }
    }
}

impl MqttMetrics {
    /// Records the time from a device's PUBLISH decoded to its PUBACK ready.
    pub fn observe_puback(&self, elapsed: Duration) {
        self.puback.observe(elapsed.as_secs_f64());
    }
}

/// Over-limit connections answered at once (each holds a descriptor for up to
/// [`REFUSAL_WAIT`]); more are closed without a word.
const MAX_REFUSALS: usize = 64;
/// How long an over-limit connection may take to send its CONNECT before it is closed.
const REFUSAL_WAIT: Duration = Duration::from_secs(2);

/// Accepts MQTT connections until `shutdown` turns true. Every connection task holds a
/// clone of `alive`; the caller waits for all of them by waiting for the channel to close.
/// Past `limit`, a client gets a CONNACK saying why (MQTT 5: 0x97 quota exceeded, 3.1.1:
/// server unavailable) and is closed.
pub async fn listen(
    listener: TcpListener,
    tls: Option<Acceptor>,
    st: Arc<Mqtt>,
    mut shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
    limit: Arc<Semaphore>,
) {
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let keepalive = st.core.cfg.tcp_keepalive_idle.duration();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    gridlinks_platform::net::tune(&stream, keepalive);
                    let refusal = if st.connect_rate.as_ref().is_some_and(|r| !r.admit(peer.ip())) {
                        st.metrics.over_connect_rate.fetch_add(1, Ordering::Relaxed);
                        gridlinks_platform::logging::warn_limited!(%peer, "MQTT connection refused: mqtt.max_connects_per_address reached");
                        Some(OVER_RATE)
                    } else {
                        None
                    };
                    let permit = match refusal {
                        None => limit.clone().try_acquire_owned().ok(),
                        Some(_) => None,
                    };
                    let Some(permit) = permit else {
                        if refusal.is_none() {
                            st.metrics.over_limit.fetch_add(1, Ordering::Relaxed);
                            gridlinks_platform::logging::warn_limited!(limit = st.core.cfg.mqtt_max_connections(), "MQTT connection refused: mqtt.max_connections reached");
                        }
                        // Over TLS it is closed: a CONNACK would need a handshake first.
                        if let Some(slot) = refusals.clone().try_acquire_owned().ok().filter(|_| tls.is_none()) {
                            let why = refusal.unwrap_or(OVER_LIMIT);
                            tokio::spawn(refuse(stream, slot, st.core.cfg.mqtt.max_packet_size, why));
                        }
                        continue;
                    };
                    let (st, alive) = (st.clone(), alive.clone());
                    match &tls {
                        None => {
                            tokio::spawn(connection::run(stream, st, (permit, alive)));
                        }
                        // The handshake holds the connection's permit; its timeout bounds it.
                        Some(tls) => {
                            let tls = tls.clone();
                            tokio::spawn(async move {
                                match tls.accept(stream).await {
                                    Ok((stream, cert)) => {
                                        let stream = transport::Tls(Box::new(stream), cert.map(Box::new));
                                        connection::run(stream, st, (permit, alive)).await;
                                    }
                                    Err(e) => {
                                        st.metrics.tls_refused.fetch_add(1, Ordering::Relaxed);
                                        tracing::debug!(error = %e, "MQTT over TLS: handshake refused");
                                    }
                                }
                            });
                        }
                    }
                }
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    gridlinks_platform::logging::warn_limited!(error = %e, "MQTT accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Why a connection is refused before its CONNECT is read: the MQTT 5 and 3.1.1 codes and
/// the reason string.
type Refusal = (u8, u8, &'static str);

/// Over `mqtt.max_connections`.
const OVER_LIMIT: Refusal = (
    gridlinks_codec::mqtt::reason::QUOTA_EXCEEDED,
    gridlinks_codec::mqtt::reason::V3_SERVER_UNAVAILABLE,
    "too many connections (mqtt.max_connections); retry later",
);
/// Over `mqtt.max_connects_per_address`.
const OVER_RATE: Refusal = (
    gridlinks_codec::mqtt::reason::CONNECTION_RATE_EXCEEDED,
    gridlinks_codec::mqtt::reason::V3_SERVER_UNAVAILABLE,
    "too many new connections from this address (mqtt.max_connects_per_address); retry later",
);

/// Reads the CONNECT of a connection refused at accept and answers it with a refusing
/// CONNACK in the client's protocol version.
async fn refuse(
    mut stream: tokio::net::TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
    max_packet_size: usize,
    (v5_code, v3_code, why): Refusal,
) {
    use gridlinks_codec::mqtt::{decode, encode, ConnAck, ConnAckProperties, Packet, ProtocolVersion};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut buf = bytes::BytesMut::with_capacity(512);
        loop {
            match decode(&mut buf, ProtocolVersion::V3_1_1, max_packet_size) {
                Ok(Some(Packet::Connect(c))) => return Some(c.protocol),
                Ok(None) if buf.len() < max_packet_size => {}
                _ => return None,
            }
            if stream.read_buf(&mut buf).await.ok()? == 0 {
                return None;
            }
        }
    };
    let Ok(Some(version)) = tokio::time::timeout(REFUSAL_WAIT, read).await else { return };
    let v5 = version == ProtocolVersion::V5;
    let properties = ConnAckProperties { reason_string: v5.then(|| why.to_owned()), ..ConnAckProperties::default() };
    let code = if v5 { v5_code } else { v3_code };
    let mut out = bytes::BytesMut::new();
    if encode(&Packet::ConnAck(ConnAck { session_present: false, code, properties }), version, &mut out).is_ok() {
        let _ = tokio::time::timeout(REFUSAL_WAIT, stream.write_all(&out)).await;
    }
}

/// What the WebSocket upgrade handler needs.
struct WsContext {
    st: Arc<Mqtt>,
    alive: mpsc::Sender<()>,
    limit: Arc<Semaphore>,
}

/// Serves MQTT over WebSocket (`GET /mqtt`, subprotocol `mqtt`) until `shutdown` turns
/// true; connections count against the same `mqtt.max_connections` as TCP ones.
pub async fn listen_ws(
    listener: TcpListener,
    tls: Option<Acceptor>,
    st: Arc<Mqtt>,
    shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
    limit: Arc<Semaphore>,
) {
    use axum::routing::get;
    // The upgrade request must come within the CONNECT timeout; upgraded connections count
    // against `mqtt.max_connections` (in `upgrade`), the HTTP exchange before against this.
    let limits = gridlinks_listener::HttpLimits {
        header_read_timeout: st.core.cfg.mqtt.connect_timeout.duration(),
        max_connections: st.core.cfg.http_max_connections(),
        // Device fleets behind one NAT address: the MQTT connection limits bound them.
        max_per_address: usize::MAX,
        unbounded: Vec::new(),
        keepalive_idle: st.core.cfg.tcp_keepalive_idle.duration(),
    };
    let ctx = Arc::new(WsContext { st: st.clone(), alive, limit });
    let app = axum::Router::new().route("/mqtt", get(upgrade)).with_state(ctx);
    let over_limit = move |_| {
        st.metrics.over_limit.fetch_add(1, Ordering::Relaxed);
        gridlinks_platform::logging::warn_limited!(
            "MQTT over WebSocket connection refused: http.max_connections upgrades in progress"
        );
    };
    gridlinks_listener::serve_http(listener, app, limits, tls, shutdown, over_limit).await;
}

async fn upgrade(
    axum::extract::State(ctx): axum::extract::State<Arc<WsContext>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    cert: Option<axum::Extension<Arc<gridlinks_listener::tls::ClientCert>>>,
    ws: axum::extract::ws::WebSocketUpgrade,
) -> axum::response::Response {
    let peer = Some(peer.ip());
    use axum::response::IntoResponse;
    let Ok(permit) = ctx.limit.clone().try_acquire_owned() else {
        ctx.st.metrics.over_limit.fetch_add(1, Ordering::Relaxed);
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "mqtt.max_connections reached").into_response();
    };
    // One WebSocket message may hold several MQTT packets; none may exceed the limit.
    let max = ctx.st.core.cfg.mqtt.max_packet_size.saturating_add(64 * 1024);
    let (st, alive) = (ctx.st.clone(), ctx.alive.clone());
    ws.protocols(["mqtt"])
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| connection::run(transport::Ws(socket, peer, cert.map(|c| c.0)), st, (permit, alive)))
}

/// Reads `tls.client_ca_file` again at every SIGHUP (new handshakes use it; clients logged
/// in stay); a file that cannot be read is logged as an ERROR naming it, and the CAs in use
/// stay.
fn reload_client_cas_on_hangup(mqtt: &Arc<Mqtt>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mqtt = Arc::downgrade(mqtt);
    Ok(tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let Some(m) = mqtt.upgrade() else { return };
            let file = m.core.cfg.tls.client_ca_file.display().to_string();
            match tokio::task::spawn_blocking(move || m.reload_client_cas()).await {
                Ok(Ok(n)) => tracing::info!(file, certificates = n, "client CA certificates reloaded"),
                Ok(Err(e)) => tracing::error!(file, error = %e, "client CA file not reloaded; the CAs in use stay"),
                Err(e) => tracing::error!(error = %e, "client CA reload failed"),
            }
        }
    }))
}

/// With shared entities (`cluster.entities = "postgres"`): closes this node's live
/// sessions that another node revoked, at the first catch-up that applies the change:
/// those of devices deleted there, and those of MQTT credentials changed or deleted there
/// (the node that made the change closes its own at once). A sweep runs only when other
/// nodes changed devices or broker rows.
pub fn close_revoked(mqtt: &Arc<Mqtt>) -> Option<tokio::task::JoinHandle<()>> {
    let cluster = &mqtt.core.cfg.cluster;
    if cluster.entities != gridlinks_platform::config::EntitiesBackend::Postgres {
        return None;
    }
    let (mqtt, every) = (mqtt.clone(), cluster.entities_poll.duration());
    Some(tokio::spawn(async move {
        let store = mqtt.core.store.clone();
        let generations = || (store.remote_generation("devices"), store.remote_generation("broker"));
        let mut seen = generations();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = generations();
            if now == seen {
                continue;
            }
            let (devices, credentials, m) = (now.0 != seen.0, now.1 != seen.1, mqtt.clone());
            seen = now;
            // One read of the store per connected device, and every credential: off the
            // async threads.
            let _ = tokio::task::spawn_blocking(move || {
                if devices {
                    for id in m.devices.sessions.devices() {
                        if matches!(m.core.store.device(id), Ok(None)) {
                            m.devices.close(id);
                        }
                    }
                }
                if credentials {
                    if let Err(e) = m.clients.reload() {
                        gridlinks_platform::logging::warn_limited!(error = %e, "cannot read the MQTT credentials to close revoked ones");
                    }
                }
            })
            .await;
        }
    }))
}

/// The running MQTT transport.
pub struct Running {
    mqtt: Arc<Mqtt>,
    /// The accept loops (TCP, WebSocket), named; they end when `shutdown` turns true.
    pub listeners: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    /// Following the bus, closing revoked sessions, keeping shared groups up.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The MQTT transport's listeners: plain TCP, and optionally TLS, WebSocket and secure
/// WebSocket.
pub struct Listeners {
    /// MQTT over TCP.
    pub tcp: TcpListener,
    /// MQTT over TLS.
    pub tls: Option<(TcpListener, Acceptor)>,
    /// MQTT over WebSocket.
    pub ws: Option<TcpListener>,
    /// MQTT over secure WebSocket.
    pub wss: Option<(TcpListener, Acceptor)>,
}

/// Starts the MQTT transport on `platform`: the canonical telemetry topics join the live
/// fan-out, retained messages and persistent sessions are loaded, and with several nodes
/// the bus is followed; then the listeners accept until `shutdown`. Every connection holds
/// a permit of `limit` (the device connection limit, shared with other transports) and a
/// clone of `alive`.
pub fn start(
    platform: &Arc<Platform>,
    listeners: Listeners,
    shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
    limit: Arc<Semaphore>,
) -> Result<Running, gridlinks_platform::StartError> {
    use gridlinks_platform::Context;
    let cfg = &platform.core.cfg;
    let anonymous_acl = Arc::new(Acl {
        rules: Vec::new(),
        publish: cfg.mqtt.anonymous_publish.clone(),
        subscribe: cfg.mqtt.anonymous_subscribe.clone(),
    });
    platform.live.register(Arc::new(canonical::CanonicalTopics {
        sessions: platform.devices.sessions.clone(),
        writer: platform.core.writer.clone(),
    }));
    let mqtt = Arc::new(Mqtt {
        platform: platform.clone(),
        metrics: MqttMetrics::default(),
        anonymous_acl,
        shared: platform.core.bus.as_ref().map(|b| shared::SharedGroups::new(b.settings().clone())),
        handoffs: Default::default(),
        client_cas: Default::default(),
    });
    let reload_cas = !cfg.tls.client_ca_file.as_os_str().is_empty();
    if reload_cas {
        mqtt.reload_client_cas().context("tls.client_ca_file")?;
    }
    let retained =
        retained::load(&platform.core.store, &platform.devices.sessions).context("loading retained MQTT messages")?;
    let sessions = pubsub::load(&mqtt).context("loading persistent MQTT sessions")?;
    tracing::debug!(retained, sessions, "retained messages and persistent sessions loaded");
    if let Some(shared) = &mqtt.shared {
        // Stored sessions' shared subscriptions.
        shared.sweep(&mqtt);
    }
    let mut tasks: Vec<_> = [shared::keep_up(&mqtt), close_revoked(&mqtt)].into_iter().flatten().collect();
    if reload_cas {
        tasks.push(reload_client_cas_on_hangup(&mqtt).context("installing the SIGHUP handler (client CA reload)")?);
    }
    if let Some(bus) = &platform.core.bus {
        tasks.push(pubsub::follow_bus(bus, &mqtt).context("following the kafka bus")?);
    }
    platform.metrics.register(Arc::new(metrics::MqttSource(Arc::downgrade(&mqtt))));
    let Listeners { tcp, tls, ws, wss } = listeners;
    let mut listeners = Vec::with_capacity(4);
    let sockets = [
        (ws.map(|l| (l, None)), true),
        (wss.map(|(l, a)| (l, Some(a))), true),
        (tls.map(|(l, a)| (l, Some(a))), false),
    ];
    for (listener, over_ws) in sockets {
        let Some((listener, tls)) = listener else { continue };
        let name = match (over_ws, tls.is_some()) {
            (true, false) => "MQTT over WebSocket",
            (true, true) => "MQTT over secure WebSocket",
            _ => "MQTT over TLS",
        };
        let (st, stop, alive, limit) = (mqtt.clone(), shutdown.clone(), alive.clone(), limit.clone());
        let task = match over_ws {
            true => tokio::spawn(listen_ws(listener, tls, st, stop, alive, limit)),
            false => tokio::spawn(listen(listener, tls, st, stop, alive, limit)),
        };
        listeners.push((name, task));
    }
    listeners.push(("MQTT", tokio::spawn(listen(tcp, None, mqtt.clone(), shutdown, alive, limit))));
    Ok(Running { mqtt, listeners, tasks })
}

impl Running {
    /// Once every connection has ended: stops following the bus, the revoker and the
    /// shared groups (their consumers hand copies to the writer: they stop before it drains).
    pub async fn finish(self) {
        for task in self.tasks {
            task.abort();
            let _ = task.await;
        }
        let m = self.mqtt;
        let _ = tokio::task::spawn_blocking(move || m.shared.as_ref().map(|s| s.stop_all())).await;
    }
}
