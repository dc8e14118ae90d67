//! The CoAP transport: it owns the UDP socket and the CoAP exchange rules, and stands on
//! `gridlinks-platform` alone (what a device message means, device sessions for
//! observations, provisioning, claims) — it never reaches into another transport.
//!
//! ThingsBoard's CoAP device API (RFC 7252 over UDP, `coap.bind`):
//! `POST /api/v1/{token}/telemetry` and `/attributes` (2.01 Created once durable),
//! `GET /api/v1/{token}/attributes?clientKeys=&sharedKeys=` (2.05 Content), Observe on
//! `…/attributes` and `…/rpc` ([`observe`]), RPC answers `POST …/rpc/{id}` and client-side
//! RPC `POST …/rpc`.
//!
//! Packets are parsed by `coap-lite` after the stricter checks of
//! `gridlinks_thingsboard::coap::message` (sans-IO, like the exchange store and the Echo
//! values); this crate owns the exchange rules:
//!
//! - a datagram of another CoAP version than 1 is ignored; a message format error (a
//!   payload marker with no payload, a reserved option nibble, …) gets a Reset if it is
//!   confirmable and is dropped otherwise;
//! - a request with a critical option the server does not implement gets 4.02 Bad Option
//!   (confirmable) or a Reset (non-confirmable) and is not processed; a body whose
//!   Content-Format is not JSON gets 4.15;
//! - a confirmable request is answered in its ACK (piggybacked); if the answer is not
//!   ready within [`SEPARATE_AFTER`], an empty ACK goes first and the answer follows as a
//!   separate non-confirmable response with the request's token;
//! - a non-confirmable request gets a non-confirmable response;
//! - a retransmitted request (same peer, same message id, within `coap.exchange_lifetime`)
//!   is not processed again: the stored response is sent again, or nothing while the first
//!   is still being processed (deduplication, `gridlinks_thingsboard::coap::exchange`,
//!   bounded per endpoint and in total, forgotten on a timer). GETs are safe and
//!   idempotent, so they are served again instead (RFC 7252 §4.5) and not remembered;
//! - an answer to an endpoint not yet verified is at most `coap.amplification_factor`
//!   times its request's size (RFC 7252 §11.3): a larger one becomes 4.01 with an Echo
//!   option (RFC 9175), which the client repeats to verify its address; an error loses its
//!   diagnostic text instead (`gridlinks_thingsboard::coap::echo`). Small answers — every
//!   2.01 to a telemetry post — go out at once, with no extra round trip;
//! - block-wise transfer (RFC 7959, `gridlinks_thingsboard::coap::block`): a request body
//!   may come in Block1 blocks (2.31 Continue until the last), a response larger than one
//!   1,024-byte block goes in Block2 blocks the client asks for one by one, each block cut
//!   from the representation read again and marked with its ETag;
//! - at most [`MAX_IN_FLIGHT`] requests are processed at once; past it a request gets
//!   5.03 at once (bounded memory under a flood).
//!
//! Errors: 4.00 bad payload, 4.01 bad token, 4.02 a block past the end or an unsupported
//! critical option, 4.04 unknown path, 4.05 wrong method, 4.06 an Accept other than JSON,
//! 4.08 a block out of order, 4.13 too large, 4.15 a body that is not JSON, 5.03 overloaded
//! or out of space, 5.05 a proxy request, 5.00 storage failure; each with a diagnostic
//! payload (RFC 7252 §5.5.2) to a verified endpoint.

pub mod dtls;
pub mod observe;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coap_lite::{CoapOption, MessageClass, MessageType, Packet, RequestType, ResponseType};
use gridlinks_ingest::{IngestError, Item};
use gridlinks_thingsboard::attributes::AttributeRequest;
use gridlinks_thingsboard::coap::block::{self, Block, Offer, Uploads};
use gridlinks_thingsboard::coap::echo::{Echo, Verified};
use gridlinks_thingsboard::coap::exchange::{Begin, Exchanges, Limits};
use gridlinks_thingsboard::coap::message::{self, OptionError, ECHO};
use gridlinks_thingsboard::coap::{DeviceResource, Parts, Resource, RouteError};
use gridlinks_thingsboard::payload::{self, PayloadError};
use gridlinks_types::{AttributeScope, DeviceId, Ts};
use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::sync::{watch, Semaphore};

use gridlinks_platform::config::CoapConfig;
use gridlinks_platform::entities::ota::{self, OtaType};
use gridlinks_platform::Platform;
use observe::Watched;

/// How long a confirmable request may take before it is acknowledged empty and answered
/// separately (the client retransmits after 2–3 s: ACK_TIMEOUT × ACK_RANDOM_FACTOR).
pub const SEPARATE_AFTER: Duration = Duration::from_millis(1000);
/// How long a body arriving in blocks is kept after its first block (RFC 7252's
/// EXCHANGE_LIFETIME).
pub const UPLOAD_LIFETIME: Duration = Duration::from_secs(247);
/// How long an Echo value is taken after it was sent (RFC 9175 leaves it to the server; a
/// client repeats its request at once).
pub const ECHO_FRESH: Duration = Duration::from_secs(60);
/// Longest pause between two sweeps of the exchange, upload and verified-endpoint stores
/// (a sweep forgets what has expired, whether or not requests arrive).
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Requests processed at once; past it a request is answered 5.03 at once.
const MAX_IN_FLIGHT: usize = 16_384;
/// Largest datagram read.
const MAX_DATAGRAM: usize = 65_535;
/// Request bodies being received in blocks at once (each at most `coap.max_payload_bytes`).
const MAX_UPLOADS: usize = 4_096;

/// CoAP counters and gauges (`/metrics`, docs/operations.md).
#[derive(Default)]
pub struct CoapMetrics {
    /// Requests processed (not counting retransmissions).
    pub requests: AtomicU64,
    /// Retransmitted requests answered from the exchange store.
    pub duplicates: AtomicU64,
    /// Datagrams that were not CoAP version 1, had a message format error, or were
    /// non-confirmable requests rejected for an unsupported critical option.
    pub malformed: AtomicU64,
    /// Requests answered with a 4.xx or 5.xx.
    pub errors: AtomicU64,
    /// Notifications sent (retransmissions included).
    pub notifications: AtomicU64,
    /// Exchanges remembered for deduplication now.
    pub exchanges: AtomicU64,
    /// Exchanges forgotten before `coap.exchange_lifetime` because a bound was reached.
    pub exchanges_evicted: AtomicU64,
    /// Requests refused (5.03) because all of their endpoint's remembered exchanges
    /// (`coap.max_exchanges_per_peer`) were still being processed.
    pub exchanges_refused: AtomicU64,
    /// Answers to unverified endpoints replaced by 4.01 with an Echo option.
    pub echo_challenges: AtomicU64,
    /// Error answers to unverified endpoints sent without their diagnostic text.
    pub diagnostics_withheld: AtomicU64,
    /// Endpoints verified by an Echo value, remembered now.
    pub verified_peers: AtomicU64,
}

/// What the CoAP listener shares with its request and notification tasks.
pub struct Server {
    socket: UdpSocket,
    /// The DTLS sessions when this is the `coaps://` socket: every message in and out goes
    /// through its peer's session.
    dtls: Option<Arc<dtls::Dtls>>,
    platform: Arc<Platform>,
    metrics: Arc<CoapMetrics>,
    /// Requests remembered for deduplication, by (peer, message id).
    exchanges: Mutex<Exchanges<SocketAddr>>,
    /// Request bodies arriving in blocks, by (peer, path and query).
    uploads: Mutex<Uploads<(SocketAddr, String)>>,
    /// Issues and checks Echo values (stateless).
    echo: Echo,
    /// Endpoints that repeated an Echo value lately: their answers are not limited.
    verified: Mutex<Verified<SocketAddr>>,
    /// `coap.amplification_factor` (0: no limit).
    amplification_factor: usize,
    observations: Arc<observe::Observations>,
    /// Message ids of the server's own messages (separate responses, notifications).
    next_mid: AtomicU16,
    /// Observe option values (24 bits), one sequence for all notifications.
    next_observe: AtomicU32,
    /// One permit per request being processed ([`MAX_IN_FLIGHT`]).
    in_flight: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
}

impl Server {
    /// Sends `message` to `peer` (sealed in its DTLS session on the `coaps://` socket; with
    /// none, nothing goes).
    async fn send(&self, message: &[u8], peer: SocketAddr) {
        match &self.dtls {
            None => {
                let _ = self.socket.send_to(message, peer).await;
            }
            Some(d) => {
                for datagram in d.seal(peer, message).unwrap_or_default() {
                    let _ = self.socket.send_to(&datagram, peer).await;
                }
            }
        }
    }

    fn mid(&self) -> u16 {
        self.next_mid.fetch_add(1, Ordering::Relaxed)
    }

    fn observe_seq(&self) -> u32 {
        self.next_observe.fetch_add(1, Ordering::Relaxed) & 0xFF_FFFF
    }

    /// Starts the exchange of `peer`'s message `mid`, keeping the store's gauges current.
    fn begin(&self, peer: SocketAddr, mid: u16) -> Begin {
        let mut x = self.exchanges.lock();
        let begun = x.begin(peer, mid, Instant::now());
        self.metrics.exchanges.store(x.len() as u64, Ordering::Relaxed);
        self.metrics.exchanges_evicted.store(x.evicted(), Ordering::Relaxed);
        begun
    }

    /// Forgets what has expired in every store (the sweep's work).
    fn sweep(&self) {
        let now = Instant::now();
        let mut x = self.exchanges.lock();
        x.expire(now);
        self.metrics.exchanges.store(x.len() as u64, Ordering::Relaxed);
        drop(x);
        self.uploads.lock().expire(now);
        let mut v = self.verified.lock();
        v.expire(now);
        self.metrics.verified_peers.store(v.len() as u64, Ordering::Relaxed);
        drop(v);
        if let Some(d) = &self.dtls {
            d.sweep();
        }
    }

    /// Takes the Echo option of `request`, if it carries one this server gave `peer`
    /// lately: `peer` is verified from now on.
    fn take_echo(&self, request: &Packet, peer: SocketAddr) {
        let Some(value) = request.get_first_option(CoapOption::Unknown(ECHO)) else { return };
        let now = Instant::now();
        if self.echo.verify(&peer, value, now) {
            let mut v = self.verified.lock();
            v.insert(peer, now);
            self.metrics.verified_peers.store(v.len() as u64, Ordering::Relaxed);
        }
    }

    /// The largest Block2 size exponent whose block, with its header, token and options,
    /// stays within the amplification limit of `request` from `peer`, when `peer` is not
    /// verified and a body of `len` bytes would not fit whole; `None`: send as usual (the
    /// limit does not apply, the body fits, or not even the smallest block fits).
    fn unverified_block_cap(&self, request: &Packet, peer: SocketAddr, len: usize) -> Option<u8> {
        if self.amplification_factor == 0 || self.verified.lock().contains(&peer, Instant::now()) {
            return None;
        }
        let request_len = request.to_bytes().map_or(0, |b| b.len());
        let limit = self.amplification_factor.saturating_mul(request_len);
        // Header, token, ETag (9), Block2 (4), Content-Format (2), payload marker.
        let overhead = 4 + request.get_token().len() + 9 + 4 + 2 + 1;
        if len + overhead <= limit {
            return None;
        }
        (0..=6u8).rev().find(|szx| (16usize << szx) + overhead <= limit)
    }

    /// Encodes `answer` as a message of `kind`, `mid` and `token` to `peer`, within the
    /// amplification limit of a request of `request_len` bytes (RFC 7252 §11.3): an answer
    /// over it to an endpoint not verified becomes 4.01 with an Echo option if it is a
    /// success, or loses its payload if it is an error. True with the bytes when the
    /// answer was replaced by the Echo challenge.
    ///
    /// Only answers without lasting effects can be replaced: telemetry, attribute, claim
    /// and RPC-answer posts are answered with no payload, client-side RPC answers are
    /// computed, and a provisioning answer is smaller than a third of its request (which
    /// carries the key and secret); GETs read, and an observation registered by a GET
    /// whose answer is replaced is cancelled by the caller.
    fn encode(
        &self,
        peer: SocketAddr,
        request_len: usize,
        kind: MessageType,
        mid: u16,
        token: &[u8],
        answer: Answer,
    ) -> (Vec<u8>, bool) {
        let Answer { code, body, json, options } = answer;
        let bytes = message(kind, mid, token, code, &options, body, json);
        let limit = self.amplification_factor.saturating_mul(request_len);
        if self.amplification_factor == 0 || bytes.len() <= limit {
            return (bytes, false);
        }
        if self.verified.lock().contains(&peer, Instant::now()) {
            return (bytes, false);
        }
        if code.is_error() {
            self.metrics.diagnostics_withheld.fetch_add(1, Ordering::Relaxed);
            let bare = message(kind, mid, token, code, &options, Vec::new(), false);
            if bare.len() <= limit {
                return (bare, false);
            }
            // At most the request's own header and token.
            return (message(kind, mid, token, code, &[], Vec::new(), false), false);
        }
        self.metrics.echo_challenges.fetch_add(1, Ordering::Relaxed);
        let echo = vec![(CoapOption::Unknown(ECHO), self.echo.challenge(&peer, Instant::now()).to_vec())];
        (message(kind, mid, token, ResponseType::Unauthorized, &echo, Vec::new(), false), true)
    }
}

/// Socket buffers asked for (the kernel caps them at `net.core.rmem_max` / `wmem_max`):
/// the default ~200 KiB receive buffer overflowed at ~90,000 requests/s from 1,000 devices,
/// and every datagram lost there cost its device a 2 s retransmission timeout.
const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

/// The sockets CoAP is served on.
pub struct Sockets {
    /// `coap.bind`: CoAP over UDP.
    pub plain: Option<UdpSocket>,
    /// `coap.dtls_bind`: CoAP over DTLS, with its sessions.
    pub dtls: Option<(UdpSocket, Arc<dtls::Dtls>)>,
}

/// Serves CoAP on `sockets` until `shutdown`.
pub async fn serve(sockets: Sockets, platform: Arc<Platform>, shutdown: watch::Receiver<bool>) {
    let servers: Vec<Arc<Server>> = [sockets.plain.map(|s| (s, None)), sockets.dtls.map(|(s, d)| (s, Some(d)))]
        .into_iter()
        .flatten()
        .map(|(socket, dtls)| server(socket, dtls, &platform, &shutdown))
        .collect();
    // One set of metrics, the sum over both sockets.
    platform.metrics.register(Arc::new(CoapSource {
        servers: servers.iter().map(|s| (s.metrics.clone(), s.observations.clone())).collect(),
        dtls: servers.iter().find_map(|s| Some(s.dtls.as_ref()?.metrics.clone())),
    }));
    let runs: Vec<_> = servers.into_iter().map(|s| tokio::spawn(run(s, shutdown.clone()))).collect();
    for r in runs {
        let _ = r.await;
    }
}

/// The server of one socket.
fn server(
    socket: UdpSocket,
    dtls: Option<Arc<dtls::Dtls>>,
    platform: &Arc<Platform>,
    shutdown: &watch::Receiver<bool>,
) -> Arc<Server> {
    let sock = socket2::SockRef::from(&socket);
    if sock.set_recv_buffer_size(SOCKET_BUFFER).and_then(|()| sock.set_send_buffer_size(SOCKET_BUFFER)).is_err() {
        tracing::warn!("cannot enlarge the CoAP socket's buffers; bursts may drop datagrams");
    }
    let cfg: &CoapConfig = &platform.core.cfg.coap;
    let limits = Limits {
        lifetime: cfg.exchange_lifetime.duration(),
        per_peer: cfg.max_exchanges_per_peer,
        total: cfg.max_exchanges,
    };
    Arc::new(Server {
        socket,
        exchanges: Mutex::new(Exchanges::new(limits)),
        uploads: Mutex::new(Uploads::new(MAX_UPLOADS, cfg.max_payload_bytes, UPLOAD_LIFETIME)),
        echo: Echo::new(ECHO_FRESH, Instant::now()),
        verified: Mutex::new(Verified::new(cfg.max_verified_peers, cfg.verified_lifetime.duration())),
        // A DTLS peer proved its address in the handshake (its cookie).
        amplification_factor: if dtls.is_some() { 0 } else { cfg.amplification_factor },
        dtls,
        observations: Arc::default(),
        next_mid: AtomicU16::new(rand_u16()),
        next_observe: AtomicU32::new(u32::from(rand_u16())),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        shutdown: shutdown.clone(),
        metrics: Arc::default(),
        platform: platform.clone(),
    })
}

/// Serves one socket until `shutdown`.
async fn run(server: Arc<Server>, mut shutdown: watch::Receiver<bool>) {
    let lifetime = server.platform.core.cfg.coap.exchange_lifetime.duration();
    // Stores forget on a timer, not only when the next request arrives.
    let sweep_every = (lifetime / 4).clamp(Duration::from_millis(50), SWEEP_EVERY);
    let sweeper = tokio::spawn({
        let (server, mut shutdown) = (server.clone(), shutdown.clone());
        async move {
            let mut tick = tokio::time::interval(sweep_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.changed() => break,
                    _ = tick.tick() => server.sweep(),
                }
            }
        }
    });
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, peer) = tokio::select! {
            _ = shutdown.changed() => break,
            r = server.socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                Err(e) => {
                    gridlinks_platform::logging::warn_limited!(error = %e, "CoAP receive failed");
                    continue;
                }
            },
        };
        match &server.dtls {
            None => datagram(&server, &buf[..n], peer).await,
            Some(d) => {
                let input = d.input(peer, &buf[..n]);
                for reply in input.replies {
                    let _ = server.socket.send_to(&reply, peer).await;
                }
                for message in input.messages {
                    datagram(&server, &message, peer).await;
                }
            }
        }
    }
    sweeper.abort();
    server.observations.cancel_all();
}

/// Takes one datagram: checks it, answers what the receive loop answers itself (Resets,
/// retransmissions, overload) and spawns the exchange of a new request.
async fn datagram(server: &Arc<Server>, datagram: &[u8], peer: SocketAddr) {
    let parsed = message::screen(datagram).map_err(Some).and_then(|()| Packet::from_bytes(datagram).map_err(|_| None));
    let packet = match parsed {
        Ok(p) => p,
        Err(why) => {
            server.metrics.malformed.fetch_add(1, Ordering::Relaxed);
            // A confirmable version-1 message with a format error is rejected with a
            // Reset; another version is ignored (RFC 7252 §3, §4.2).
            let resettable = why.is_none_or(message::FormatError::resettable);
            if resettable && datagram.len() >= 4 && datagram[0] >> 6 == 1 && (datagram[0] >> 4) & 0b11 == 0 {
                server.send(&[0x70, 0x00, datagram[2], datagram[3]], peer).await;
            }
            return;
        }
    };
    let kind = packet.header.get_type();
    let mid = packet.header.message_id;
    match kind {
        // The answer to a notification.
        MessageType::Acknowledgement | MessageType::Reset => {
            server.observations.answered(peer, mid, kind == MessageType::Acknowledgement);
            return;
        }
        // A ping (an empty confirmable message) is answered with a Reset.
        MessageType::Confirmable if packet.header.code == MessageClass::Empty => {
            server.send(&reset(mid), peer).await;
            return;
        }
        _ if !matches!(packet.header.code, MessageClass::Request(_)) => return,
        _ => {}
    }
    // A non-confirmable request with a critical option this server does not implement is
    // rejected (RFC 7252 §5.4.1); a confirmable one gets 4.02 from `respond`.
    if kind == MessageType::NonConfirmable && message::check_options(&packet).is_err_and(OptionError::rejects_message) {
        server.metrics.malformed.fetch_add(1, Ordering::Relaxed);
        server.send(&reset(mid), peer).await;
        return;
    }
    // GETs are safe and idempotent: a retransmitted one is served again (RFC 7252 §4.5),
    // so they take no room in the exchange store.
    let remembered = packet.header.code != MessageClass::Request(RequestType::Get);
    if remembered {
        match server.begin(peer, mid) {
            Begin::New => {}
            Begin::Duplicate(stored) => {
                server.metrics.duplicates.fetch_add(1, Ordering::Relaxed);
                if let Some(response) = stored {
                    server.send(&response, peer).await;
                }
                return;
            }
            Begin::Busy => {
                server.metrics.exchanges_refused.fetch_add(1, Ordering::Relaxed);
                let max = server.platform.core.cfg.coap.max_exchanges_per_peer;
                let why = format!("{max} requests from this endpoint in progress (coap.max_exchanges_per_peer)");
                refuse(server, &packet, peer, datagram.len(), why).await;
                return;
            }
        }
    }
    server.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let Ok(permit) = server.in_flight.clone().try_acquire_owned() else {
        // Overload: answer at once instead of queueing without bound.
        let why = format!("{MAX_IN_FLIGHT} requests in progress: retry later");
        let bytes = refuse(server, &packet, peer, datagram.len(), why).await;
        if remembered {
            server.exchanges.lock().finish(peer, mid, bytes);
        }
        return;
    };
    let (s, request_len) = (server.clone(), datagram.len());
    tokio::spawn(async move {
        exchange(s, packet, peer, request_len, remembered).await;
        drop(permit);
    });
}

/// Answers `request` 5.03 with `why` at once; the bytes sent.
async fn refuse(server: &Server, request: &Packet, peer: SocketAddr, request_len: usize, why: String) -> Vec<u8> {
    server.metrics.errors.fetch_add(1, Ordering::Relaxed);
    let (kind, mid) = match request.header.get_type() {
        MessageType::Confirmable => (MessageType::Acknowledgement, request.header.message_id),
        _ => (MessageType::NonConfirmable, server.mid()),
    };
    let answer = text(ResponseType::ServiceUnavailable, why);
    let (bytes, _) = server.encode(peer, request_len, kind, mid, request.get_token(), answer);
    server.send(&bytes, peer).await;
    bytes
}

/// Answers one request of `request_len` bytes, piggybacked or separately; `remembered`:
/// the exchange store waits for its response.
async fn exchange(server: Arc<Server>, request: Packet, peer: SocketAddr, request_len: usize, remembered: bool) {
    let (request_mid, token) = (request.header.message_id, request.get_token().to_vec());
    let confirmable = request.header.get_type() == MessageType::Confirmable;
    let registers = request.get_observe_value().is_some_and(|o| o.is_ok_and(|v| v == 0));
    server.take_echo(&request, peer);
    let answer = respond(&server, request, peer);
    tokio::pin!(answer);
    let piggybacked = if confirmable { tokio::time::timeout(SEPARATE_AFTER, &mut answer).await.ok() } else { None };
    let (answer, kind, mid) = match piggybacked {
        Some(a) => (a, MessageType::Acknowledgement, request_mid),
        None => {
            if confirmable {
                // Acknowledge now, answer when ready (separate response, RFC 7252 §5.2.2).
                server.send(&empty_ack(request_mid), peer).await;
            }
            (answer.await, MessageType::NonConfirmable, server.mid())
        }
    };
    if answer.code.is_error() {
        server.metrics.errors.fetch_add(1, Ordering::Relaxed);
    }
    let registered = registers && !answer.code.is_error();
    let (bytes, challenged) = server.encode(peer, request_len, kind, mid, &token, answer);
    if challenged && registered {
        // Its answer did not go out: neither do notifications. The client registers again
        // with the Echo value.
        server.observations.cancel(&(peer, token));
    }
    if remembered {
        server.exchanges.lock().finish(peer, request_mid, bytes.clone());
    }
    server.send(&bytes, peer).await;
}

/// The answer to `request`. A body in Block1 blocks is stored block by block (2.31
/// Continue) until the last block completes it; then the whole request is served.
async fn respond(server: &Arc<Server>, mut request: Packet, peer: SocketAddr) -> Answer {
    if let Err(e) = message::check_options(&request) {
        let code = match e {
            OptionError::Unrecognized(_) => ResponseType::BadOption,
            OptionError::Proxy(_) => ResponseType::ProxyingNotSupported,
            OptionError::ContentFormat(_) => ResponseType::UnsupportedContentFormat,
            OptionError::Accept(_) => ResponseType::NotAcceptable,
        };
        return text(code, e.to_string());
    }
    let mut options = Vec::new();
    if let Some(b) = request.get_first_option(CoapOption::Block1) {
        let Some(b) = Block::decode(b) else {
            return text(ResponseType::BadOption, "Block1: malformed or reserved block size (szx 7)");
        };
        let path = request.get_option(CoapOption::UriPath);
        let resource = format!("{path:?}{:?}", request.get_option(CoapOption::UriQuery));
        let offer = server.uploads.lock().offer((peer, resource), b, &request.payload, Instant::now());
        match offer {
            Offer::Continue(b) => {
                return Answer { options: vec![(CoapOption::Block1, b.encode())], ..text(ResponseType::Continue, "") };
            }
            Offer::Complete(body, b) => {
                request.payload = body;
                options.push((CoapOption::Block1, b.encode()));
            }
            Offer::Incomplete => {
                return text(ResponseType::RequestEntityIncomplete, "block out of order: start again from block 0")
            }
            Offer::TooLarge => return too_large(server.platform.core.cfg.coap.max_payload_bytes),
            Offer::Malformed(why) => return text(ResponseType::BadRequest, why),
        }
    }
    let mut answer = handle(server, &request, peer).await;
    answer.options.append(&mut options);
    answer
}

/// Content-Format `application/json`.
const JSON_FORMAT: u16 = 50;

/// A message of `kind` with `mid`, `token`, `code`, `options` (in any order) and `body`
/// (`json`: Content-Format application/json).
fn message(
    kind: MessageType,
    mid: u16,
    token: &[u8],
    code: ResponseType,
    options: &[(CoapOption, Vec<u8>)],
    body: Vec<u8>,
    json: bool,
) -> Vec<u8> {
    let mut p = Packet::new();
    p.header.set_version(1);
    p.header.set_type(kind);
    p.header.message_id = mid;
    p.header.code = MessageClass::Response(code);
    p.set_token(token.to_vec());
    if json {
        p.add_option(CoapOption::ContentFormat, JSON_FORMAT.to_be_bytes().to_vec());
    }
    for (o, v) in options {
        p.add_option(*o, v.clone());
    }
    p.payload = body;
    // A response of at most 64 KiB of payload always encodes.
    p.to_bytes_unlimited().unwrap_or_default()
}

/// A confirmable 2.05 notification with Observe `seq` carrying JSON `body`.
fn notification(mid: u16, token: &[u8], seq: u32, body: Vec<u8>) -> Vec<u8> {
    let observe = vec![(CoapOption::Observe, uint(seq))];
    message(MessageType::Confirmable, mid, token, ResponseType::Content, &observe, body, true)
}

/// An unsigned option value in as few bytes as it needs.
fn uint(v: u32) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    let skip = bytes.iter().take_while(|b| **b == 0).count();
    bytes[skip..].to_vec()
}

fn empty_ack(mid: u16) -> Vec<u8> {
    let [hi, lo] = mid.to_be_bytes();
    vec![0x60, 0x00, hi, lo]
}

fn reset(mid: u16) -> Vec<u8> {
    let [hi, lo] = mid.to_be_bytes();
    vec![0x70, 0x00, hi, lo]
}

fn rand_u16() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    h.finish() as u16
}

/// A response before it is encoded.
struct Answer {
    code: ResponseType,
    body: Vec<u8>,
    /// Content-Format application/json.
    json: bool,
    options: Vec<(CoapOption, Vec<u8>)>,
}

fn text(code: ResponseType, msg: impl Into<String>) -> Answer {
    Answer { code, body: msg.into().into_bytes(), json: false, options: Vec::new() }
}

fn json(code: ResponseType, body: Vec<u8>) -> Answer {
    Answer { code, body, json: true, options: Vec::new() }
}

fn too_large(max: usize) -> Answer {
    // Size1 tells the client the largest body taken (RFC 7959 §4).
    let size1 = vec![(CoapOption::Size1, uint(u32::try_from(max).unwrap_or(u32::MAX)))];
    Answer {
        options: size1,
        ..text(ResponseType::RequestEntityTooLarge, format!("payload larger than {max} bytes (coap.max_payload_bytes)"))
    }
}

/// The response code of an ingest error (the CoAP column of docs/api.md's error table).
fn ingest_code(e: &IngestError) -> ResponseType {
    match e {
        IngestError::BadPayload(_) | IngestError::Rejected(_) | IngestError::Limit(_) => ResponseType::BadRequest,
        IngestError::BadCredential | IngestError::DeviceGone => ResponseType::Unauthorized,
        IngestError::NotGateway | IngestError::ForeignDevice(_) => ResponseType::Forbidden,
        IngestError::Overloaded | IngestError::DiskFull(_) | IngestError::Unavailable(_) => {
            ResponseType::ServiceUnavailable
        }
        IngestError::Failed(_) => ResponseType::InternalServerError,
        IngestError::RateLimited(_) => ResponseType::TooManyRequests,
    }
}

fn ingest_error(e: IngestError) -> Answer {
    text(ingest_code(&e), e.to_string())
}

fn payload_error(e: PayloadError) -> Answer {
    let code = match e {
        PayloadError::TooMany(_) => ResponseType::RequestEntityTooLarge,
        _ => ResponseType::BadRequest,
    };
    text(code, e.to_string())
}

/// The Observe option of a GET: `Some(true)` register, `Some(false)` deregister.
fn observe_flag(request: &Packet) -> Result<Option<bool>, Answer> {
    match request.get_observe_value() {
        None => Ok(None),
        Some(Ok(0)) => Ok(Some(true)),
        Some(Ok(1)) => Ok(Some(false)),
        Some(_) => Err(text(ResponseType::BadOption, "Observe: 0 registers, 1 deregisters")),
    }
}

/// Routes and serves one request (its body already put together from its blocks).
async fn handle(server: &Arc<Server>, request: &Packet, peer: SocketAddr) -> Answer {
    let mut parts = Parts::of(request);
    // Over DTLS with a client certificate, ThingsBoard's paths name no token
    // (`/api/v1/telemetry`): the certificate names the device.
    let certificate = server.dtls.as_ref().and_then(|d| d.client_cert(peer));
    if certificate.is_some() && is_tokenless(&parts.path) {
        parts.path.insert(2, String::new());
    }
    let resource = match parts.route() {
        Ok(r) => r,
        Err(e) => {
            let code = match e {
                RouteError::NotFound => ResponseType::NotFound,
                RouteError::MethodNotAllowed => ResponseType::MethodNotAllowed,
                RouteError::BadQuery(_) => ResponseType::BadRequest,
            };
            return text(code, e.to_string());
        }
    };
    let platform = &server.platform;
    let core = &platform.core;
    let max = core.cfg.coap.max_payload_bytes;
    if request.payload.len() > max {
        return too_large(max);
    }
    let (token, resource) = match resource {
        Resource::Device(token, r) => (token, r),
        Resource::Provision => {
            let answer = gridlinks_platform::provision::provision(platform, peer.ip(), &request.payload).await;
            return json(ResponseType::Content, answer.to_string().into_bytes());
        }
    };
    let device = match (token, &certificate) {
        ("", Some(der)) => match certificate_device(core, der) {
            Ok(d) => d,
            Err(why) => return text(ResponseType::Unauthorized, why),
        },
        _ => match core.ingest.authenticate(token) {
            Ok(d) => d,
            Err(e) => return ingest_error(e),
        },
    };
    // What observations are counted under (`mqtt.max_connections_per_credential`).
    let credential = if token.is_empty() { format!("x509:{device}") } else { token.to_owned() };
    core.activity.touch(device);
    let lim = core.payload_limits();
    // Posted data is counted with its points once parsed; any other request here.
    if !matches!(resource, DeviceResource::PostTelemetry | DeviceResource::PostAttributes) {
        if let Err(e) = core.limits.meter(device, 0) {
            return ingest_error(e);
        }
    }
    let submitted = match resource {
        DeviceResource::PostTelemetry => match payload::parse_telemetry(&request.payload, Ts::now(), lim) {
            Ok(records) => core.submit_from_device(Item::Telemetry { device, records }).await,
            Err(e) => return payload_error(e),
        },
        DeviceResource::PostAttributes => match payload::parse_attributes(&request.payload, lim, true) {
            Ok(values) => {
                core.submit_from_device(Item::Attributes { device, scope: AttributeScope::Client, values }).await
            }
            Err(e) => return payload_error(e),
        },
        DeviceResource::RpcResponse(id) => {
            // An answer nobody waits for any more (timed out, one-way) is dropped, as
            // ThingsBoard does.
            platform.devices.rpc.complete(device, id, request.payload.clone().into());
            Ok(())
        }
        DeviceResource::Claim => match gridlinks_platform::claims::open_from_device(core, device, &request.payload) {
            Ok(()) => Ok(()),
            Err(e) => return payload_error(e),
        },
        DeviceResource::ClientRpc => {
            let answer = gridlinks_platform::device_api::client_rpc(core, device, &request.payload, max, MAX_IN_FLIGHT);
            return json(ResponseType::Content, answer.to_string().into_bytes());
        }
        DeviceResource::GetAttributes(req) => {
            let observe = match observe_flag(request) {
                Ok(o) => o,
                Err(a) => return a,
            };
            let Some(register) = observe else { return read_attributes(server, request, peer, device, req).await };
            let watch = register.then_some((credential.as_str(), Watched::Attributes));
            return observed(server, request, peer, device, watch, Some(req)).await;
        }
        DeviceResource::Ota { software, title, version, size, chunk } => {
            let t = if software { OtaType::Software } else { OtaType::Firmware };
            return match ota::device_chunk(platform, device, t, size as usize, chunk as usize).await {
                Ok(None) => {
                    text(ResponseType::NotFound, format!("no {} package is assigned to this device", t.prefix()))
                }
                // The device names what it expects; another package (reassigned meanwhile) is 4.00.
                Ok(Some((pkg, _)))
                    if title.is_some_and(|v| pkg.doc["title"] != v.as_str())
                        || version.is_some_and(|v| pkg.doc["version"] != v.as_str()) =>
                {
                    text(ResponseType::BadRequest, "not the package assigned to this device")
                }
                Ok(Some((_, bytes))) => blockwise(server, request, peer, bytes, false),
                Err(e) => text(ResponseType::InternalServerError, e.to_string()),
            };
        }
        DeviceResource::GetRpc => {
            return match observe_flag(request) {
                Ok(Some(register)) => {
                    observed(
                        server,
                        request,
                        peer,
                        device,
                        register.then_some((credential.as_str(), Watched::Rpc)),
                        None,
                    )
                    .await
                }
                Ok(None) => text(
                    ResponseType::BadRequest,
                    "GET …/rpc is observed: send Observe 0 to receive server-side RPC requests",
                ),
                Err(a) => a,
            };
        }
    };
    match submitted {
        Ok(()) => text(ResponseType::Created, ""),
        Err(e) => ingest_error(e),
    }
}

/// Whether `path` is a device API path without its token (`api/v1/telemetry`, …).
fn is_tokenless(path: &[String]) -> bool {
    matches!(path, [api, v1, resource, ..] if api == "api" && v1 == "v1"
        && matches!(resource.as_str(), "telemetry" | "attributes" | "rpc" | "claim"))
}

/// The device whose X509_CERTIFICATE credentials hold `der` (ThingsBoard's fingerprint),
/// if the certificate is within its validity; why not, if not.
fn certificate_device(core: &gridlinks_platform::Core, der: &[u8]) -> Result<gridlinks_types::DeviceId, String> {
    let info = gridlinks_thingsboard::x509::parse_der(der).map_err(|e| e.to_string())?;
    let now = Ts::now().0 / 1000;
    if now < info.not_before || now > info.not_after {
        return Err("the client certificate is not within its validity".into());
    }
    let fingerprint = gridlinks_thingsboard::x509::der_fingerprint(der);
    match core.store.device_by_x509(&fingerprint) {
        Ok(Some(d)) => Ok(d.id),
        Ok(None) => Err("no device has this client certificate (X509_CERTIFICATE credentials)".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// `GET …/attributes`: the client and shared attributes asked for, in Block2 blocks when
/// the representation is larger than one block or the client asks for a block. To an
/// endpoint not verified, a representation over the amplification limit goes in blocks
/// small enough to stay within it (RFC 7959 used as RFC 7252 §11.3 suggests): any
/// block-wise client (aiocoap, libcoap, Californium) reads it block by block, with no Echo
/// round trip, which not every client makes.
async fn read_attributes(
    server: &Server,
    request: &Packet,
    peer: SocketAddr,
    device: DeviceId,
    req: AttributeRequest,
) -> Answer {
    let body = match gridlinks_platform::attributes::read_for_device(&server.platform.core.store, device, req).await {
        Ok(j) => j.to_string().into_bytes(),
        Err(e) => return ingest_error(e.into()),
    };
    blockwise(server, request, peer, body.into(), true)
}

/// A 2.05 with `body` (JSON or not), in the Block2 block the client asks for, or in
/// blocks when it is larger than one block or, to an endpoint not verified, than the
/// amplification limit.
fn blockwise(server: &Server, request: &Packet, peer: SocketAddr, body: bytes::Bytes, is_json: bool) -> Answer {
    let asked = match request.get_first_option(CoapOption::Block2).map(|b| Block::decode(b)) {
        None => None,
        Some(Some(b)) => Some(b),
        Some(None) => return text(ResponseType::BadOption, "Block2: malformed or reserved block size (szx 7)"),
    };
    // Only the block sent is copied out of `body` (an OTA package may be megabytes).
    let content =
        |body: &[u8]| Answer { code: ResponseType::Content, body: body.to_vec(), json: is_json, options: Vec::new() };
    let asked = match server.unverified_block_cap(request, peer, body.len()) {
        Some(cap) if asked.is_none_or(|b| b.szx > cap) => {
            let offset = asked.map_or(0, |b| b.offset());
            Some(Block { num: u32::try_from(offset >> (4 + cap)).unwrap_or(u32::MAX), more: false, szx: cap })
        }
        _ => asked,
    };
    match block::slice(body.len(), asked) {
        Ok(None) => content(&body),
        Ok(Some((b, range))) => {
            // The ETag lets the client see that the blocks it put together are of one version.
            let etag = fnv1a(&body).to_be_bytes().to_vec();
            let options = vec![(CoapOption::ETag, etag), (CoapOption::Block2, b.encode())];
            Answer { options, ..content(&body[range]) }
        }
        Err(e) => text(ResponseType::BadOption, e.to_string()),
    }
}

/// A GET with Observe: registers (`watch` is the token and what is watched) or deregisters
/// (`None`) the observation of this client endpoint and token, and answers with the
/// current representation: the shared attributes asked for (`attributes`), or nothing
/// for `…/rpc` (requests come as notifications).
async fn observed(
    server: &Arc<Server>,
    request: &Packet,
    peer: SocketAddr,
    device: DeviceId,
    watch: Option<(&str, Watched)>,
    attributes: Option<AttributeRequest>,
) -> Answer {
    let token = request.get_token().to_vec();
    let mut options = Vec::new();
    match watch {
        Some((access_token, watched)) => {
            if let Err(e) = observe::register(server, peer, token, access_token, device, watched) {
                return text(ResponseType::ServiceUnavailable, e.to_string());
            }
            options.push((CoapOption::Observe, uint(server.observe_seq())));
        }
        None => {
            server.observations.cancel(&(peer, token));
        }
    }
    let body = match attributes {
        Some(req) => {
            let store = &server.platform.core.store;
            match gridlinks_platform::attributes::read(store, device, Some(AttributeScope::Shared), req.shared).await {
                Ok(entries) => observe::shared_attributes(entries),
                Err(e) => return ingest_error(e.into()),
            }
        }
        None => Vec::new(),
    };
    Answer { options, ..json(ResponseType::Content, body) }
}

/// FNV-1a, 64 bits: the representation's ETag.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

// ---- /metrics ---------------------------------------------------------------------

use gridlinks_platform::metrics::{counter, gauge, DescriptorEncoder, Source};
use std::fmt;
/// The CoAP counters and the live observations, read at scrape time.
struct CoapSource {
    /// Each socket's counters and observations.
    servers: Vec<(Arc<CoapMetrics>, Arc<observe::Observations>)>,
    /// The DTLS sessions', if `coaps://` is served.
    dtls: Option<Arc<dtls::DtlsMetrics>>,
}

impl Source for CoapSource {
    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let l = |a: fn(&CoapMetrics) -> &AtomicU64| -> u64 {
            self.servers.iter().map(|(m, _)| a(m).load(Ordering::Relaxed)).sum()
        };
        counter(
            e,
            "gridlinks_coap_requests_total",
            "CoAP requests processed (retransmissions not counted).",
            l(|m| &m.requests),
        )?;
        counter(
            e,
            "gridlinks_coap_duplicates_total",
            "Retransmitted CoAP requests answered from the exchange store, not processed again.",
            l(|m| &m.duplicates),
        )?;
        counter(
            e,
            "gridlinks_coap_malformed_total",
            "UDP datagrams on the CoAP port that were not CoAP version 1, had a format error, or were rejected for an unsupported critical option.",
            l(|m| &m.malformed),
        )?;
        counter(
            e,
            "gridlinks_coap_errors_total",
            "CoAP requests answered with a 4.xx or 5.xx code.",
            l(|m| &m.errors),
        )?;
        gauge(
            e,
            "gridlinks_coap_observations",
            "Live CoAP observations (attributes and RPC).",
            self.servers.iter().map(|(_, o)| o.len() as u64).sum::<u64>(),
        )?;
        counter(
            e,
            "gridlinks_coap_notifications_total",
            "CoAP notifications sent, retransmissions included.",
            l(|m| &m.notifications),
        )?;
        gauge(e, "gridlinks_coap_exchanges", "CoAP exchanges remembered for deduplication.", l(|m| &m.exchanges))?;
        counter(
            e,
            "gridlinks_coap_exchanges_evicted_total",
            "CoAP exchanges forgotten before coap.exchange_lifetime because a bound was reached.",
            l(|m| &m.exchanges_evicted),
        )?;
        counter(
            e,
            "gridlinks_coap_exchanges_refused_total",
            "CoAP requests refused (5.03): coap.max_exchanges_per_peer of their endpoint in progress.",
            l(|m| &m.exchanges_refused),
        )?;
        counter(
            e,
            "gridlinks_coap_echo_challenges_total",
            "CoAP answers to unverified endpoints replaced by 4.01 with an Echo option (amplification limit).",
            l(|m| &m.echo_challenges),
        )?;
        counter(
            e,
            "gridlinks_coap_diagnostics_withheld_total",
            "CoAP error answers to unverified endpoints sent without their diagnostic text (amplification limit).",
            l(|m| &m.diagnostics_withheld),
        )?;
        gauge(
            e,
            "gridlinks_coap_verified_peers",
            "CoAP endpoints verified by an Echo value.",
            l(|m| &m.verified_peers),
        )?;
        let Some(m) = &self.dtls else { return Ok(()) };
        let d = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(e, "gridlinks_coap_dtls_handshakes_total", "CoAP DTLS handshakes completed.", d(&m.handshakes))?;
        counter(
            e,
            "gridlinks_coap_dtls_failures_total",
            "CoAP DTLS sessions ended by a failed handshake or a protocol error.",
            d(&m.failures),
        )?;
        counter(
            e,
            "gridlinks_coap_dtls_refused_total",
            "New CoAP DTLS sessions refused: coap.max_dtls_sessions were open.",
            d(&m.refused),
        )?;
        gauge(e, "gridlinks_coap_dtls_sessions", "CoAP DTLS sessions open.", d(&m.sessions))
    }
}
