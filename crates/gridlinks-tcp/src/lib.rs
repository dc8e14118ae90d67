//! The custom TCP transport: devices' own binary protocols over TCP (`[[tcp.listeners]]`).
//! It owns the sockets, the framing and decoding loop and the script pool, and stands on
//! `gridlinks-platform` alone (ingest, device sessions, connection counts) — it never
//! reaches into another transport. Each connection's bytes are
//! cut into frames (`gridlinks-framing`), decoded (`gridlinks-protocols`: natively or by a
//! user's script), bound to the device the first decoded identity names, and committed
//! through the ingest boundary; a frame's replies go out only once what it carried is
//! durable.
//!
//! ```text
//! read ─▶ Framer ─▶ frames ─▶ Decoder ─▶ uplinks ─▶ one Ingest::submit per read ─▶ replies
//!            │ bad frame: counted, skipped     │ decode error, foreign identity:
//!            ▼                                 ▼ counted, frame rejected, no reply
//! ```
//!
//! A connection is bound to one device: its first frame that names a device logs it in
//! (a device registered with that protocol identity, or with `auto_provision` one created
//! for it) — with `require_login`, its first login frame, the frames before it rejected;
//! an unknown identity closes the connection. Frames naming another device are
//! rejected. One identity holds at most `mqtt.max_connections_per_credential` connections,
//! and `auto_provision` stops at the listener's `max_devices`. Problems are counted
//! ([`TcpMetrics`]) and logged once per connection, at a bounded rate overall. Buffers are
//! bounded by the framing's largest frame plus one read.
//!
//! A logged-in connection holds its device's session: server-side RPC requests and shared
//! attributes reach it there and go down as the decoder's encoder frames them; the device's
//! answers (`rpc_responses`) complete two-way calls.
//!
//! Script work (a framing hook, a decoder, an encoder) never runs on the runtime's threads:
//! it goes to the [`scripts::ScriptPool`], one job per read, bounded by `tcp.script_timeout`.

pub mod scripts;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use gridlinks_framing::{FrameError, Framer, FramingSpec, Next};
use gridlinks_ingest::{IngestError, Item};
use gridlinks_listener::tls::Acceptor;
use gridlinks_protocols::{Cut, DecodeError, Decoder, Script, ScriptLimits, Session, Uplink};
use gridlinks_types::{AttributeScope, DeviceId, ProtocolIdentity, Ts};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use gridlinks_broker::sessions::SessionLink;
use gridlinks_codec::mqtt::QoS;
use gridlinks_platform::config::TcpListenerConfig;
use gridlinks_platform::sessions::CredentialSlot;
use gridlinks_platform::Core;
use gridlinks_platform::{Context, Platform, StartError};
use gridlinks_protocols::Downlink;
use gridlinks_thingsboard::topic;

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 4096;
/// Longest a connection may take to accept its replies.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Counters of every custom-protocol listener.
#[derive(Default)]
pub struct TcpMetrics {
    /// Open connections.
    pub connections: AtomicI64,
    /// Connections bound to their device.
    pub logins: AtomicU64,
    /// Connections closed because their identity was unknown (or could not be provisioned).
    pub logins_refused: AtomicU64,
    /// Frames whose data is committed and whose replies were sent.
    pub frames: AtomicU64,
    /// Byte runs the framing could not make a frame of (garbage, bad length, end marker or
    /// checksum).
    pub bad_frames: AtomicU64,
    /// Frames the decoder refused (script error, time limit, unknown frame type).
    pub decode_errors: AtomicU64,
    /// Frames rejected because they named no device before login, or another device.
    pub rejected: AtomicU64,
    /// Frames not committed (storage overloaded, disk full, bad values): not answered.
    pub not_committed: AtomicU64,
    /// Connections closed after `tcp.idle_timeout` or `tcp.login_timeout` of silence.
    pub timeouts: AtomicU64,
    /// Server-to-device messages (RPC requests, shared attributes) sent as frames.
    pub downlinks: AtomicU64,
    /// Server-to-device messages the protocol has no frame for (not sent).
    pub downlink_errors: AtomicU64,
    /// Connections closed at once: their address exceeded `mqtt.max_connects_per_address`.
    pub over_connect_rate: AtomicU64,
}

/// A listener's protocol, ready to serve.
pub struct Protocol {
    /// Its name: the protocol of the identities its devices are registered with.
    pub name: String,
    framing: Arc<FramingSpec>,
    decoder: Decoder,
    /// Type of devices created on first login and the most devices of the protocol;
    /// `None`: unknown devices are refused.
    provision: Option<(String, usize)>,
    /// Only a login frame binds a connection (`require_login`).
    require_login: bool,
}

impl Protocol {
    /// Whether cutting or decoding its frames runs a script (on the script pool).
    pub fn uses_script(&self) -> bool {
        matches!(self.decoder, Decoder::Script(_))
    }

    /// The protocol `listener` speaks, its script loaded (errors name the file).
    pub fn load(core: &Core, listener: &TcpListenerConfig) -> Result<Self, StartError> {
        let tcp = &core.cfg.tcp;
        let (framing, script) = match tcp.protocols.get(&listener.protocol) {
            Some(p) => (p.framing.clone(), Some(&p.script)),
            None => (FramingSpec::lamp(), None),
        };
        let limits = ScriptLimits {
            timeout: tcp.script_timeout.duration(),
            memory_bytes: tcp.script_memory_mb * 1024 * 1024,
            payload: core.payload_limits(),
        };
        let decoder = match listener.script.as_ref().or(script) {
            Some(path) => {
                let source = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read decoder script {}", path.display()))?;
                Decoder::Script(
                    Script::load(&path.display().to_string(), &source, limits)
                        .with_context(|| format!("decoder script {}", path.display()))?,
                )
            }
            None => Decoder::Lamp,
        };
        if let FramingSpec::Script { .. } = framing {
            match &decoder {
                Decoder::Script(s) if s.defines("frame") => {}
                _ => return Err(StartError::msg("framing kind \"script\" needs a script that defines frame(buffer)")),
            }
        }
        let device_type = if listener.device_type.is_empty() { &listener.protocol } else { &listener.device_type };
        Ok(Protocol {
            name: listener.protocol.clone(),
            framing: Arc::new(framing),
            decoder,
            provision: listener.auto_provision.then(|| (device_type.clone(), listener.max_devices)),
            require_login: listener.require_login(),
        })
    }
}

/// What every connection of a listener shares.
#[derive(Clone)]
pub struct Shared {
    /// Storage, ingest, configuration.
    pub core: Arc<Core>,
    /// Device sessions (RPC requests and shared attributes come through them) and the RPC
    /// calls waiting for answers.
    pub platform: Arc<Platform>,
    /// The listener's protocol.
    pub protocol: Arc<Protocol>,
    /// Counters.
    pub metrics: Arc<TcpMetrics>,
    /// Where the protocol's scripts run (`Some` when it has any).
    pub scripts: Option<Arc<scripts::ScriptPool>>,
}

/// Accepts connections until `shutdown`; each holds a permit of `limit` (the device
/// connection limit MQTT counts against too) and a sender of `alive`.
pub async fn listen(
    listener: TcpListener,
    tls: Option<Acceptor>,
    shared: Shared,
    mut shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
    limit: Arc<Semaphore>,
) {
    let keepalive = shared.core.cfg.tcp_keepalive_idle.duration();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // The same bound on new connections per address as MQTT's, shared.
                    if shared.platform.connect_rate.as_ref().is_some_and(|r| !r.admit(peer.ip())) {
                        shared.metrics.over_connect_rate.fetch_add(1, Ordering::Relaxed);
                        gridlinks_platform::logging::warn_limited!(protocol = %shared.protocol.name, %peer, "device connection refused: mqtt.max_connects_per_address reached");
                        continue;
                    }
                    gridlinks_platform::net::tune(&stream, keepalive);
                    let Ok(permit) = limit.clone().try_acquire_owned() else {
                        gridlinks_platform::logging::warn_limited!(protocol = %shared.protocol.name, "device connection refused: mqtt.max_connections (all device connections) reached");
                        continue;
                    };
                    let conn = Connection::new(shared.clone());
                    let held = (permit, alive.clone());
                    match &tls {
                        None => {
                            tokio::spawn(conn.run(stream, shutdown.clone(), held));
                        }
                        // The handshake holds the connection's permit; its timeout bounds it.
                        Some(tls) => {
                            let (tls, stop) = (tls.clone(), shutdown.clone());
                            tokio::spawn(async move {
                                match tls.accept(stream).await {
                                    Ok((stream, _)) => conn.run(stream, stop, held).await,
                                    Err(e) => tracing::debug!(error = %e, "custom TCP over TLS: handshake refused"),
                                }
                            });
                        }
                    }
                }
                Err(e) => {
                    gridlinks_platform::logging::warn_limited!(error = %e, "custom TCP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Cuts a connection's byte stream into frames: the configured framing, or the script's
/// `frame(buffer)` hook.
enum Cutter {
    Spec(Framer),
    Script(Script, usize),
}

impl Cutter {
    fn new(protocol: &Protocol) -> Self {
        match (&*protocol.framing, &protocol.decoder) {
            (FramingSpec::Script { max_frame }, Decoder::Script(s)) => Cutter::Script(s.clone(), *max_frame),
            _ => Cutter::Spec(Framer::new(protocol.framing.clone())),
        }
    }

    fn next(&mut self, buf: &mut BytesMut) -> Next {
        let (script, max) = match self {
            Cutter::Spec(f) => return f.next(buf),
            Cutter::Script(s, max) => (s, *max),
        };
        match script.frame(buf) {
            Ok(Cut::Frame(n)) if n <= max => Next::Frame(buf.split_to(n).freeze()),
            Ok(Cut::Frame(n)) => {
                buf.advance(n);
                Next::Skipped(n, FrameError::BadLength(n as i64, 1, max))
            }
            Ok(Cut::NeedMore) if buf.len() < max => Next::NeedMore,
            Ok(Cut::NeedMore) => Next::Lost(FrameError::TooLong(max)),
            Ok(Cut::Skip(n)) => {
                buf.advance(n);
                Next::Skipped(n, FrameError::Garbage(n))
            }
            // The stream cannot be followed without the script.
            Err(e) => {
                gridlinks_platform::logging::warn_limited!(error = %e, "framing script failed: closing the connection");
                Next::Lost(FrameError::Invalid("the framing script failed"))
            }
        }
    }
}

/// One read's decoding: cut the buffered bytes into frames and decode them. Runs inline for
/// native decoders, on the script pool for scripted ones; it owns what it needs so that it
/// can move there and back.
struct Work {
    cutter: Cutter,
    buf: BytesMut,
    decoder: Decoder,
    /// The identity the connection is (or, after this read's first login, will be) bound to.
    identity: Option<String>,
    last_ts: i64,
    /// Time for the whole read; frames left over wait for the next turn.
    budget: Duration,
    metrics: Arc<TcpMetrics>,
    require_login: bool,
}

/// What [`Work`] gives back.
struct Decoded {
    cutter: Cutter,
    buf: BytesMut,
    /// The decoded frames.
    uplinks: Vec<Uplink>,
    last_ts: i64,
    /// The read's first problem: what, and the detail.
    problem: Option<(&'static str, String)>,
    /// Close once the decoded frames are answered: the stream cannot be followed, or a
    /// frame kept the script busy to its time limit (such frames would burn a core each).
    stop: bool,
    /// Whole frames are left in the buffer (the budget ran out): decode again before reading.
    more: bool,
}

impl Work {
    fn run(mut self) -> Decoded {
        let started = Instant::now();
        let m = &self.metrics;
        let (mut uplinks, mut problem, mut stop, mut more) = (Vec::new(), None, false, false);
        let mut note = |what: &'static str, detail: &dyn std::fmt::Display| {
            problem.get_or_insert_with(|| (what, detail.to_string()));
        };
        loop {
            if !uplinks.is_empty() && started.elapsed() >= self.budget {
                more = true;
                break;
            }
            match self.cutter.next(&mut self.buf) {
                Next::Frame(frame) => {
                    let now = Ts(Ts::now().0.max(self.last_ts + 1));
                    let session = Session { identity: self.identity.as_deref(), now };
                    match self.decoder.decode(&frame, session) {
                        Ok(up) => {
                            if self.identity.is_none() && (up.login || !self.require_login) {
                                self.identity.clone_from(&up.identity);
                            }
                            if !up.telemetry.is_empty() {
                                self.last_ts = now.0;
                            }
                            uplinks.push(up);
                        }
                        Err(e) => {
                            m.decode_errors.fetch_add(1, Ordering::Relaxed);
                            note("decode error", &e);
                            if matches!(e, DecodeError::Timeout(_)) {
                                stop = true;
                                break;
                            }
                        }
                    }
                }
                Next::NeedMore => break,
                Next::Skipped(_, e) => {
                    m.bad_frames.fetch_add(1, Ordering::Relaxed);
                    note("bad frame", &e);
                }
                Next::Lost(e) => {
                    m.bad_frames.fetch_add(1, Ordering::Relaxed);
                    note("bad frame, stream lost", &e);
                    stop = true;
                    break;
                }
            }
        }
        Decoded { cutter: self.cutter, buf: self.buf, uplinks, last_ts: self.last_ts, problem, stop, more }
    }
}

/// One device connection.
struct Connection {
    shared: Shared,
    /// `None` only while a decoding job holds it.
    cutter: Option<Cutter>,
    /// The device this connection logged in as, and its identity.
    device: Option<(DeviceId, String)>,
    /// Timestamp given to the last frame's telemetry: frames of one connection never share
    /// one (a later frame in the same millisecond gets the next).
    last_ts: i64,
    /// Whether this connection's first problem was logged.
    warned: bool,
    /// The device's session once logged in: server-side RPC and shared attributes.
    session: Option<SessionLink>,
    /// The device's activity, touched by each read that decoded something.
    activity: Option<Arc<gridlinks_platform::activity::Entry>>,
    /// This connection, counted against its identity (`mqtt.max_connections_per_credential`).
    _slot: Option<CredentialSlot>,
}

/// What one frame left to do after decoding: its items' range in the batch, its replies.
struct Pending {
    items: std::ops::Range<usize>,
    replies: Vec<Vec<u8>>,
    /// Why its items were not submitted (a tenant profile's rate limit).
    refused: Option<IngestError>,
}

impl Connection {
    fn new(shared: Shared) -> Self {
        let cutter = Some(Cutter::new(&shared.protocol));
        Connection {
            shared,
            cutter,
            device: None,
            last_ts: 0,
            warned: false,
            session: None,
            activity: None,
            _slot: None,
        }
    }

    /// Logs the connection's first problem (rate-limited across connections).
    fn warn(&mut self, what: &str, detail: &dyn std::fmt::Display) {
        if !self.warned {
            self.warned = true;
            let identity = self.device.as_ref().map(|d| d.1.as_str()).unwrap_or("-");
            gridlinks_platform::logging::warn_limited!(protocol = %self.shared.protocol.name, identity, problem = what, detail = %detail, "custom TCP frame refused (later problems of this connection are only counted)");
        }
    }

    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        mut self,
        mut stream: S,
        mut shutdown: watch::Receiver<bool>,
        _held: (OwnedSemaphorePermit, mpsc::Sender<()>),
    ) {
        let m = self.shared.metrics.clone();
        m.connections.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let cfg = &self.shared.core.cfg.tcp;
        let (login_timeout, idle) = (cfg.login_timeout.duration(), cfg.idle_timeout.duration());
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let mut more = false;
        loop {
            if !more {
                let wait = match self.device {
                    None => login_timeout.saturating_sub(started.elapsed()),
                    Some(_) if idle.is_zero() => Duration::MAX,
                    Some(_) => idle,
                };
                buf.reserve(READ_CHUNK);
                let inbox = self.session.as_ref().map(|s| s.inbox.clone());
                let read = tokio::select! {
                    r = tokio::time::timeout(wait, stream.read_buf(&mut buf)) => r,
                    _ = shutdown.changed() => break,
                    () = async { match &inbox { Some(i) => i.wake.notified().await, None => std::future::pending().await } } => {
                        match self.downlink().await {
                            Some(out) if send(&mut stream, &out).await => continue,
                            _ => break,
                        }
                    }
                };
                match read {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(_)) => {}
                    Err(_) => {
                        m.timeouts.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
            let Some(decoded) = self.decode(std::mem::take(&mut buf)).await else { break };
            buf = decoded.buf;
            more = decoded.more;
            self.cutter = Some(decoded.cutter);
            self.last_ts = decoded.last_ts;
            if let Some((what, detail)) = &decoded.problem {
                self.warn(what, detail);
            }
            if let Some(a) = &self.activity {
                a.touch();
            }
            match self.handle(decoded.uplinks).await {
                Ok(out) if send(&mut stream, &out).await => {}
                _ => break,
            }
            if decoded.stop {
                break;
            }
        }
        if let (Some(link), Some((device, _))) = (&self.session, &self.device) {
            self.shared.platform.devices.sessions.unregister(*device, link.id);
            self.shared.core.activity.disconnected(*device);
        }
        m.connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// Cuts and decodes `buf`: on the script pool when the protocol runs scripts, so that no
    /// script (however slow) holds a thread other connections are served on. `None`: the
    /// server is shutting down.
    async fn decode(&mut self, buf: BytesMut) -> Option<Decoded> {
        let shared = &self.shared;
        let work = Work {
            cutter: self.cutter.take()?,
            buf,
            decoder: shared.protocol.decoder.clone(),
            identity: self.device.as_ref().map(|d| d.1.clone()),
            last_ts: self.last_ts,
            budget: shared.core.cfg.tcp.script_timeout.duration(),
            metrics: shared.metrics.clone(),
            require_login: shared.protocol.require_login,
        };
        match &shared.scripts {
            Some(pool) => pool.run(move || work.run()).await.ok(),
            None => Some(work.run()),
        }
    }

    /// The frames for what the device's session holds (RPC requests, shared attributes);
    /// `None`: the session was closed (device deleted, shutdown), close the connection.
    async fn downlink(&mut self) -> Option<Vec<u8>> {
        let link = self.session.as_ref()?;
        if link.close_reason().is_some() {
            return None;
        }
        let downs: Vec<Downlink> =
            link.inbox.drain().into_iter().filter_map(|o| downlink_of(&o.msg.topic, &o.msg.payload)).collect();
        let identity = self.device.as_ref().map(|d| d.1.clone());
        let decoder = self.shared.protocol.decoder.clone();
        let encode = move || {
            let session = Session { identity: identity.as_deref(), now: Ts::now() };
            downs.iter().map(|d| decoder.encode(d, session)).collect::<Vec<_>>()
        };
        let encoded = match &self.shared.scripts {
            Some(pool) => pool.run(encode).await.ok()?,
            None => encode(),
        };
        let mut out = Vec::new();
        for frames in encoded {
            match frames {
                Ok(frames) => {
                    self.shared.metrics.downlinks.fetch_add(1, Ordering::Relaxed);
                    frames.iter().for_each(|f| out.extend_from_slice(f));
                }
                Err(e) => {
                    self.shared.metrics.downlink_errors.fetch_add(1, Ordering::Relaxed);
                    let identity = self.device.as_ref().map(|d| d.1.as_str());
                    gridlinks_platform::logging::warn_limited!(protocol = %self.shared.protocol.name, identity = ?identity, error = %e, "server message not sent to a custom TCP device");
                }
            }
        }
        Some(out)
    }

    /// Commits what this read's decoded frames carry in one submit, and returns the replies
    /// of the frames that were committed. `Err`: close the connection (login refused).
    async fn handle(&mut self, uplinks: Vec<Uplink>) -> Result<Vec<u8>, ()> {
        let m = self.shared.metrics.clone();
        let mut items = Vec::new();
        let mut pending = Vec::with_capacity(uplinks.len());
        for up in uplinks {
            let Some(device) = self.device_of(&up).await? else { continue };
            let start = items.len();
            let Uplink { telemetry, attributes, replies, rpc_responses, .. } = up;
            for (id, answer) in rpc_responses {
                self.shared.platform.devices.rpc.complete(device, id, answer.into());
            }
            if !telemetry.is_empty() {
                items.push(Item::Telemetry { device, records: telemetry });
            }
            if !attributes.is_empty() {
                items.push(Item::Attributes { device, scope: AttributeScope::Client, values: attributes });
            }
            let limits = &self.shared.core.limits;
            let refused = match items[start..].iter().try_for_each(|i| limits.meter_item(i)) {
                Ok(()) => None,
                Err(e) => {
                    items.truncate(start);
                    Some(e)
                }
            };
            pending.push(Pending { items: start..items.len(), replies, refused });
        }
        let results = if items.is_empty() { Vec::new() } else { self.shared.core.ingest.submit(items).await };
        let mut out = Vec::new();
        for p in pending {
            match p.refused.as_ref().or_else(|| results[p.items].iter().find_map(|r| r.as_ref().err())) {
                None => {
                    m.frames.fetch_add(1, Ordering::Relaxed);
                    p.replies.iter().for_each(|r| out.extend_from_slice(r));
                }
                Some(e) => {
                    m.not_committed.fetch_add(1, Ordering::Relaxed);
                    let e = e.clone();
                    self.warn("not committed", &e);
                }
            }
        }
        Ok(out)
    }

    /// The device a decoded frame is for: the connection's (logging in on its first
    /// identity). `None`: the frame is rejected; `Err`: the login was refused.
    async fn device_of(&mut self, up: &Uplink) -> Result<Option<DeviceId>, ()> {
        let m = &self.shared.metrics;
        match (&up.identity, &self.device) {
            (Some(id), Some((device, bound))) if id == bound => Ok(Some(*device)),
            (None, Some((device, _))) => Ok(Some(*device)),
            (Some(id), Some(_)) => {
                m.rejected.fetch_add(1, Ordering::Relaxed);
                self.warn("frame for another device", &format!("frame names {id}"));
                Ok(None)
            }
            (None, None) => {
                m.rejected.fetch_add(1, Ordering::Relaxed);
                self.warn("frame before login", &"the frame names no device and the connection has none yet");
                Ok(None)
            }
            (Some(_), None) if self.shared.protocol.require_login && !up.login => {
                m.rejected.fetch_add(1, Ordering::Relaxed);
                self.warn("frame before login", &"the listener has require_login and this frame is not a login");
                Ok(None)
            }
            (Some(id), None) => {
                let p = &self.shared.protocol;
                // NUL cannot start an MQTT credential: the keys of the two never meet.
                let key = format!("\0tcp/{}/{id}", p.name);
                let max = self.shared.core.cfg.mqtt.max_connections_per_credential;
                let Some(slot) = self.shared.platform.devices.counts.acquire(&key, max) else {
                    m.logins_refused.fetch_add(1, Ordering::Relaxed);
                    let why = format!("identity {id} has {max} connections (mqtt.max_connections_per_credential)");
                    self.warn("login refused", &why);
                    return Err(());
                };
                self._slot = Some(slot);
                let identity = ProtocolIdentity { protocol: p.name.clone(), id: id.clone() };
                let provision = p.provision.as_ref().map(|(t, max)| (t.as_str(), *max));
                match self.shared.core.ingest.protocol_device(&identity, provision).await {
                    Ok(device) => {
                        m.logins.fetch_add(1, Ordering::Relaxed);
                        self.device = Some((device, id.clone()));
                        let sessions = &self.shared.platform.devices.sessions;
                        let link = sessions.register(device, self.shared.core.cfg.mqtt.outbound_queue);
                        for filter in [topic::RPC_REQUESTS, topic::ATTRIBUTES] {
                            // A fresh session has no subscription to exceed a limit with.
                            let _ = sessions.subscribe(device, link.id, filter, QoS::AtMostOnce);
                        }
                        self.session = Some(link);
                        self.activity = Some(self.shared.core.activity.connected(device));
                        Ok(Some(device))
                    }
                    Err(e) => {
                        m.logins_refused.fetch_add(1, Ordering::Relaxed);
                        let why = match e {
                            IngestError::BadCredential => "no device has this identity (auto_provision is off)".into(),
                            e => e.to_string(),
                        };
                        self.warn("login refused", &format!("identity {id}: {why}"));
                        Err(())
                    }
                }
            }
        }
    }
}

/// Writes `out` (if any) within [`WRITE_TIMEOUT`]; false: the connection is gone or stuck.
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, out: &[u8]) -> bool {
    let write = async {
        stream.write_all(out).await?;
        stream.flush().await
    };
    out.is_empty() || matches!(tokio::time::timeout(WRITE_TIMEOUT, write).await, Ok(Ok(())))
}

/// The server message a session copy carries: an RPC request
/// (`v1/devices/me/rpc/request/{id}`, `{"method", "params"}`) or shared attributes.
fn downlink_of(topic: &str, payload: &[u8]) -> Option<Downlink> {
    let body: serde_json::Value = serde_json::from_slice(payload).ok()?;
    if topic == topic::ATTRIBUTES {
        return Some(Downlink::Attributes(body));
    }
    let id = match topic::DeviceTopic::parse(topic) {
        Some(topic::DeviceTopic::RpcRequest(id)) => id.parse().ok()?,
        _ => return None,
    };
    let method = body.get("method")?.as_str()?.to_owned();
    let params = body.get("params").cloned().unwrap_or(serde_json::Value::Null);
    Some(Downlink::Rpc { id, method, params })
}

// ---- /metrics ---------------------------------------------------------------------

use gridlinks_platform::metrics::{counter, gauge, DescriptorEncoder, Source};
use std::fmt;

/// Starts every custom TCP listener of the configuration (`tcp.listeners`, bound by the
/// caller in the same order, with their TLS handshake if `tls = true`) on `platform`: protocols and scripts loaded (one script pool
/// for all), then each accepts until `shutdown`. Every connection holds a permit of `limit`
/// (the device connection limit, shared with MQTT) and a clone of `alive`. Returns each
/// listener's accept loop with its name ("protocol address").
pub fn start(
    platform: &Arc<Platform>,
    listeners: Vec<(TcpListener, Option<Acceptor>)>,
    shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
    limit: Arc<Semaphore>,
) -> Result<Vec<(String, tokio::task::JoinHandle<()>)>, StartError> {
    let cfg = platform.core.cfg.clone();
    let metrics = Arc::new(TcpMetrics::default());
    let core = Arc::new(platform.core.clone());
    // One script pool for every listener that runs scripts.
    let mut scripts = None;
    let mut started = Vec::with_capacity(listeners.len());
    for (l, (listener, tls)) in cfg.tcp.listeners.iter().zip(listeners) {
        let protocol =
            Protocol::load(&core, l).with_context(|| format!("tcp.listeners ({}, protocol {})", l.bind, l.protocol))?;
        let pool = if protocol.uses_script() {
            if scripts.is_none() {
                let threads = match cfg.tcp.script_threads {
                    0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                    n => n,
                };
                let pool = scripts::ScriptPool::start(threads).context("starting the script threads")?;
                scripts = Some(Arc::new(pool));
            }
            scripts.clone()
        } else {
            None
        };
        let shared = Shared {
            core: core.clone(),
            platform: platform.clone(),
            protocol: Arc::new(protocol),
            metrics: metrics.clone(),
            scripts: pool,
        };
        let name = format!("{} {}", l.protocol, listener.local_addr()?);
        let task = listen(listener, tls, shared, shutdown.clone(), alive.clone(), limit.clone());
        started.push((name, tokio::spawn(task)));
    }
    platform.metrics.register(metrics);
    Ok(started)
}
/// Custom TCP protocols' counters (all listeners together).
impl Source for TcpMetrics {
    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let m = self;
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
            "gridlinks_tcp_over_connect_rate_total",
            "Custom TCP connections closed at once: their address exceeded mqtt.max_connects_per_address.",
            l(&m.over_connect_rate),
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
}
