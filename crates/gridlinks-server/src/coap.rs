//! ThingsBoard's CoAP device API (RFC 7252 over UDP, `coap.bind`):
//! `POST /api/v1/{token}/telemetry` and `/attributes` (2.01 Created once durable),
//! and `GET /api/v1/{token}/attributes?clientKeys=&sharedKeys=` (2.05 Content).
//!
//! Packets are parsed by `coap-lite` (sans-IO); this module owns the exchange rules:
//!
//! - a confirmable request is answered in its ACK (piggybacked); if the answer is not
//!   ready within [`SEPARATE_AFTER`], an empty ACK goes first and the answer follows as a
//!   separate non-confirmable response with the request's token;
//! - a non-confirmable request gets a non-confirmable response;
//! - a retransmitted request (same peer, same message id, within [`EXCHANGE_LIFETIME`]) is
//!   not processed again: the stored response is sent again, or nothing while the first is
//!   still being processed (deduplication, [`Exchanges`], bounded);
//! - a malformed confirmable message gets a Reset; anything else malformed is dropped;
//! - at most [`MAX_IN_FLIGHT`] requests are processed at once; past it a request gets
//!   5.03 at once (bounded memory under a flood).
//!
//! Errors: 4.00 bad payload, 4.01 bad token, 4.04 unknown path, 4.05 wrong method,
//! 4.13 too large, 5.03 overloaded or out of space, 5.00 storage failure; each with a
//! diagnostic payload (RFC 7252 §5.5.2). Not yet: Observe (attribute updates, server-side
//! RPC and its answers) and block-wise transfer.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coap_lite::{CoapOption, MessageClass, MessageType, Packet, ResponseType};
use gridlinks_ingest::{IngestError, Item};
use gridlinks_thingsboard::coap::{Parts, Resource, RouteError};
use gridlinks_thingsboard::payload::{self, PayloadError};
use gridlinks_types::{AttributeScope, Ts};
use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::sync::{watch, Semaphore};

use crate::app::Core;

/// How long a confirmable request may take before it is acknowledged empty and answered
/// separately (the client retransmits after 2–3 s: ACK_TIMEOUT × ACK_RANDOM_FACTOR).
pub const SEPARATE_AFTER: Duration = Duration::from_millis(1000);
/// How long a message id is remembered for deduplication (RFC 7252 §4.8.2).
pub const EXCHANGE_LIFETIME: Duration = Duration::from_secs(247);
/// Most exchanges remembered; past it the oldest are forgotten first.
const MAX_EXCHANGES: usize = 200_000;
/// Requests processed at once; past it a request is answered 5.03 at once.
const MAX_IN_FLIGHT: usize = 16_384;
/// Largest datagram read.
const MAX_DATAGRAM: usize = 65_535;

/// CoAP counters.
#[derive(Default)]
pub struct CoapMetrics {
    /// Requests processed (not counting retransmissions).
    pub requests: AtomicU64,
    /// Retransmitted requests answered from the exchange store.
    pub duplicates: AtomicU64,
    /// Datagrams that were not CoAP.
    pub malformed: AtomicU64,
    /// Requests answered with a 4.xx or 5.xx.
    pub errors: AtomicU64,
}

/// Remembered exchanges: (peer, message id) → the response sent (`None` while the
/// request is being processed).
#[derive(Default)]
struct Exchanges {
    map: HashMap<(SocketAddr, u16), Option<Vec<u8>>>,
    order: VecDeque<(Instant, (SocketAddr, u16))>,
}

impl Exchanges {
    /// Starts an exchange; `Err(stored)` if it is a retransmission.
    fn begin(&mut self, key: (SocketAddr, u16)) -> Result<(), Option<Vec<u8>>> {
        let now = Instant::now();
        while let Some((at, k)) = self.order.front() {
            if now.duration_since(*at) < EXCHANGE_LIFETIME && self.order.len() < MAX_EXCHANGES {
                break;
            }
            self.map.remove(k);
            self.order.pop_front();
        }
        if let Some(stored) = self.map.get(&key) {
            return Err(stored.clone());
        }
        self.map.insert(key, None);
        self.order.push_back((now, key));
        Ok(())
    }

    fn finish(&mut self, key: (SocketAddr, u16), response: Vec<u8>) {
        if let Some(slot) = self.map.get_mut(&key) {
            *slot = Some(response);
        }
    }
}

/// What the CoAP listener shares with its request tasks.
struct Server {
    socket: UdpSocket,
    core: Arc<Core>,
    metrics: Arc<CoapMetrics>,
    exchanges: Mutex<Exchanges>,
    /// Message ids of the server's own messages (separate and non-confirmable responses).
    next_mid: AtomicU16,
    /// One permit per request being processed ([`MAX_IN_FLIGHT`]).
    in_flight: Arc<Semaphore>,
}

/// Socket buffers asked for (the kernel caps them at `net.core.rmem_max` / `wmem_max`):
/// the default ~200 KiB receive buffer overflowed at ~90,000 requests/s from 1,000 devices,
/// and every datagram lost there cost its device a 2 s retransmission timeout.
const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

/// Serves CoAP on `socket` until `shutdown`.
pub async fn serve(socket: UdpSocket, core: Arc<Core>, metrics: Arc<CoapMetrics>, mut shutdown: watch::Receiver<bool>) {
    let sock = socket2::SockRef::from(&socket);
    if sock.set_recv_buffer_size(SOCKET_BUFFER).and_then(|()| sock.set_send_buffer_size(SOCKET_BUFFER)).is_err() {
        tracing::warn!("cannot enlarge the CoAP socket's buffers; bursts may drop datagrams");
    }
    let server = Arc::new(Server {
        socket,
        core,
        metrics,
        exchanges: Mutex::default(),
        next_mid: AtomicU16::new(rand_u16()),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
    });
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, peer) = tokio::select! {
            _ = shutdown.changed() => return,
            r = server.socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                Err(e) => {
                    crate::logging::warn_limited!(error = %e, "CoAP receive failed");
                    continue;
                }
            },
        };
        let datagram = &buf[..n];
        let packet = match Packet::from_bytes(datagram) {
            Ok(p) => p,
            Err(_) => {
                server.metrics.malformed.fetch_add(1, Ordering::Relaxed);
                // A confirmable message we cannot understand is rejected with a Reset.
                if n >= 4 && datagram[0] >> 6 == 1 && (datagram[0] >> 4) & 0b11 == 0 {
                    let _ = server.socket.send_to(&[0x70, 0x00, datagram[2], datagram[3]], peer).await;
                }
                continue;
            }
        };
        let kind = packet.header.get_type();
        if !matches!(packet.header.code, MessageClass::Request(_))
            || !matches!(kind, MessageType::Confirmable | MessageType::NonConfirmable)
        {
            // ACKs, Resets and responses: the server sends nothing that needs them yet. An
            // empty confirmable message is a ping: answer with a Reset.
            if kind == MessageType::Confirmable && packet.header.code == MessageClass::Empty {
                let _ = server.socket.send_to(&reset(packet.header.message_id), peer).await;
            }
            continue;
        }
        let key = (peer, packet.header.message_id);
        let begun = server.exchanges.lock().begin(key);
        match begun {
            Ok(()) => {}
            Err(stored) => {
                server.metrics.duplicates.fetch_add(1, Ordering::Relaxed);
                if let Some(response) = stored {
                    let _ = server.socket.send_to(&response, peer).await;
                }
                continue;
            }
        }
        server.metrics.requests.fetch_add(1, Ordering::Relaxed);
        let Ok(permit) = server.in_flight.clone().try_acquire_owned() else {
            // Overload: answer at once instead of queueing without bound.
            server.metrics.errors.fetch_add(1, Ordering::Relaxed);
            let (kind, mid) = match kind {
                MessageType::Confirmable => (MessageType::Acknowledgement, packet.header.message_id),
                _ => (MessageType::NonConfirmable, server.next_mid.fetch_add(1, Ordering::Relaxed)),
            };
            let busy = format!("{MAX_IN_FLIGHT} requests in progress: retry later");
            let bytes = response(&packet, kind, mid, ResponseType::ServiceUnavailable, busy.into_bytes(), false);
            server.exchanges.lock().finish(key, bytes.clone());
            let _ = server.socket.send_to(&bytes, peer).await;
            continue;
        };
        let s = server.clone();
        tokio::spawn(async move {
            exchange(s, packet, peer).await;
            drop(permit);
        });
    }
}

/// Answers one request, piggybacked or separately.
async fn exchange(server: Arc<Server>, request: Packet, peer: SocketAddr) {
    let key = (peer, request.header.message_id);
    let confirmable = request.header.get_type() == MessageType::Confirmable;
    let answer = handle(&server, &request);
    tokio::pin!(answer);
    let piggybacked = if confirmable { tokio::time::timeout(SEPARATE_AFTER, &mut answer).await.ok() } else { None };
    let ((code, body, content), kind, mid) = match piggybacked {
        Some(a) => (a, MessageType::Acknowledgement, request.header.message_id),
        None => {
            if confirmable {
                // Acknowledge now, answer when ready (separate response, RFC 7252 §5.2.2).
                let _ = server.socket.send_to(&empty_ack(request.header.message_id), peer).await;
            }
            (answer.await, MessageType::NonConfirmable, server.next_mid.fetch_add(1, Ordering::Relaxed))
        }
    };
    if code.is_error() {
        server.metrics.errors.fetch_add(1, Ordering::Relaxed);
    }
    let bytes = response(&request, kind, mid, code, body, content);
    server.exchanges.lock().finish(key, bytes.clone());
    let _ = server.socket.send_to(&bytes, peer).await;
}

/// Content-Format `application/json`.
const JSON_FORMAT: u16 = 50;

/// A response to `request`: its token, the given type, message id, code and payload.
fn response(request: &Packet, kind: MessageType, mid: u16, code: ResponseType, body: Vec<u8>, json: bool) -> Vec<u8> {
    let mut p = Packet::new();
    p.header.set_version(1);
    p.header.set_type(kind);
    p.header.message_id = mid;
    p.header.code = MessageClass::Response(code);
    p.set_token(request.get_token().to_vec());
    if json {
        p.add_option(CoapOption::ContentFormat, JSON_FORMAT.to_be_bytes().to_vec());
    }
    p.payload = body;
    // A response of at most 64 KiB of payload always encodes.
    p.to_bytes_unlimited().unwrap_or_default()
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

type Answer = (ResponseType, Vec<u8>, bool);

fn text(code: ResponseType, msg: impl Into<String>) -> Answer {
    (code, msg.into().into_bytes(), false)
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

/// Routes and serves one request.
async fn handle(server: &Server, request: &Packet) -> Answer {
    let parts = Parts::of(request);
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
    let core = &server.core;
    let max = core.cfg.coap.max_payload_bytes;
    if request.payload.len() > max {
        return text(
            ResponseType::RequestEntityTooLarge,
            format!("payload larger than {max} bytes (coap.max_payload_bytes)"),
        );
    }
    let (Resource::PostTelemetry(token) | Resource::PostAttributes(token) | Resource::GetAttributes(token, _)) =
        &resource;
    let device = match core.ingest.authenticate(token) {
        Ok(d) => d,
        Err(e) => return ingest_error(e),
    };
    let lim = core.payload_limits();
    let submitted = match resource {
        Resource::PostTelemetry(_) => match payload::parse_telemetry(&request.payload, Ts::now(), lim) {
            Ok(records) => core.ingest.submit_one(Item::Telemetry { device, records }).await,
            Err(e) => return payload_error(e),
        },
        Resource::PostAttributes(_) => match payload::parse_attributes(&request.payload, lim, true) {
            Ok(values) => {
                core.ingest.submit_one(Item::Attributes { device, scope: AttributeScope::Client, values }).await
            }
            Err(e) => return payload_error(e),
        },
        Resource::GetAttributes(_, req) => {
            return match crate::thingsboard::attributes::read_for_device(&core.store, device, req).await {
                Ok(j) => (ResponseType::Content, j.to_string().into_bytes(), true),
                Err(e) => ingest_error(e.into()),
            };
        }
    };
    match submitted {
        Ok(()) => (ResponseType::Created, Vec::new(), false),
        Err(e) => ingest_error(e),
    }
}
