//! ThingsBoard's CoAP device API (RFC 7252 over UDP, `coap.bind`):
//! `POST /api/v1/{token}/telemetry` and `/attributes` (2.01 Created once durable),
//! `GET /api/v1/{token}/attributes?clientKeys=&sharedKeys=` (2.05 Content), Observe on
//! `…/attributes` and `…/rpc` ([`observe`]), RPC answers `POST …/rpc/{id}` and client-side
//! RPC `POST …/rpc`.
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
//! - block-wise transfer (RFC 7959, `gridlinks_thingsboard::coap::block`): a request body
//!   may come in Block1 blocks (2.31 Continue until the last), a response larger than one
//!   1,024-byte block goes in Block2 blocks the client asks for one by one, each block cut
//!   from the representation read again and marked with its ETag;
//! - a malformed confirmable message gets a Reset; anything else malformed is dropped;
//! - at most [`MAX_IN_FLIGHT`] requests are processed at once; past it a request gets
//!   5.03 at once (bounded memory under a flood).
//!
//! Errors: 4.00 bad payload, 4.01 bad token, 4.02 a block past the end, 4.04 unknown path,
//! 4.05 wrong method, 4.08 a block out of order, 4.13 too large, 5.03 overloaded or out of
//! space, 5.00 storage failure; each with a diagnostic payload (RFC 7252 §5.5.2).

pub mod observe;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coap_lite::{CoapOption, MessageClass, MessageType, Packet, ResponseType};
use gridlinks_ingest::{IngestError, Item};
use gridlinks_thingsboard::attributes::AttributeRequest;
use gridlinks_thingsboard::coap::block::{self, Block, Offer, Uploads};
use gridlinks_thingsboard::coap::{DeviceResource, Parts, Resource, RouteError};
use gridlinks_thingsboard::payload::{self, PayloadError};
use gridlinks_types::{AttributeScope, DeviceId, Ts};
use parking_lot::Mutex;
use tokio::net::UdpSocket;
use tokio::sync::{watch, Semaphore};

use crate::mqtt::Mqtt;
use observe::Watched;

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
/// Request bodies being received in blocks at once (each at most `coap.max_payload_bytes`).
const MAX_UPLOADS: usize = 4_096;

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
    /// Live observations.
    pub observations: AtomicI64,
    /// Notifications sent (retransmissions included).
    pub notifications: AtomicU64,
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

/// What the CoAP listener shares with its request and notification tasks.
pub struct Server {
    socket: UdpSocket,
    mqtt: Arc<Mqtt>,
    metrics: Arc<CoapMetrics>,
    exchanges: Mutex<Exchanges>,
    /// Request bodies arriving in blocks, by (peer, path and query).
    uploads: Mutex<Uploads<(SocketAddr, String)>>,
    observations: observe::Observations,
    /// Message ids of the server's own messages (separate responses, notifications).
    next_mid: AtomicU16,
    /// Observe option values (24 bits), one sequence for all notifications.
    next_observe: AtomicU32,
    /// One permit per request being processed ([`MAX_IN_FLIGHT`]).
    in_flight: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
}

impl Server {
    fn mid(&self) -> u16 {
        self.next_mid.fetch_add(1, Ordering::Relaxed)
    }

    fn observe_seq(&self) -> u32 {
        self.next_observe.fetch_add(1, Ordering::Relaxed) & 0xFF_FFFF
    }
}

/// Socket buffers asked for (the kernel caps them at `net.core.rmem_max` / `wmem_max`):
/// the default ~200 KiB receive buffer overflowed at ~90,000 requests/s from 1,000 devices,
/// and every datagram lost there cost its device a 2 s retransmission timeout.
const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

/// Serves CoAP on `socket` until `shutdown`.
pub async fn serve(socket: UdpSocket, mqtt: Arc<Mqtt>, metrics: Arc<CoapMetrics>, mut shutdown: watch::Receiver<bool>) {
    let sock = socket2::SockRef::from(&socket);
    if sock.set_recv_buffer_size(SOCKET_BUFFER).and_then(|()| sock.set_send_buffer_size(SOCKET_BUFFER)).is_err() {
        tracing::warn!("cannot enlarge the CoAP socket's buffers; bursts may drop datagrams");
    }
    let max_body = mqtt.core.cfg.coap.max_payload_bytes;
    let server = Arc::new(Server {
        socket,
        mqtt,
        metrics,
        exchanges: Mutex::default(),
        uploads: Mutex::new(Uploads::new(MAX_UPLOADS, max_body, EXCHANGE_LIFETIME)),
        observations: observe::Observations::default(),
        next_mid: AtomicU16::new(rand_u16()),
        next_observe: AtomicU32::new(u32::from(rand_u16())),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        shutdown: shutdown.clone(),
    });
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, peer) = tokio::select! {
            _ = shutdown.changed() => break,
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
        let mid = packet.header.message_id;
        match kind {
            // The answer to a notification.
            MessageType::Acknowledgement | MessageType::Reset => {
                server.observations.answered(peer, mid, kind == MessageType::Acknowledgement);
                continue;
            }
            // A ping (an empty confirmable message) is answered with a Reset.
            MessageType::Confirmable if packet.header.code == MessageClass::Empty => {
                let _ = server.socket.send_to(&reset(mid), peer).await;
                continue;
            }
            _ if !matches!(packet.header.code, MessageClass::Request(_)) => continue,
            _ => {}
        }
        let key = (peer, mid);
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
                MessageType::Confirmable => (MessageType::Acknowledgement, mid),
                _ => (MessageType::NonConfirmable, server.mid()),
            };
            let busy = format!("{MAX_IN_FLIGHT} requests in progress: retry later").into_bytes();
            let token = packet.get_token();
            let bytes = message(kind, mid, token, ResponseType::ServiceUnavailable, &[], busy, false);
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
    server.observations.cancel_all();
}

/// Answers one request, piggybacked or separately.
async fn exchange(server: Arc<Server>, request: Packet, peer: SocketAddr) {
    let (mid, token) = (request.header.message_id, request.get_token().to_vec());
    let key = (peer, mid);
    let confirmable = request.header.get_type() == MessageType::Confirmable;
    let answer = respond(&server, request, peer);
    tokio::pin!(answer);
    let piggybacked = if confirmable { tokio::time::timeout(SEPARATE_AFTER, &mut answer).await.ok() } else { None };
    let (answer, kind, mid) = match piggybacked {
        Some(a) => (a, MessageType::Acknowledgement, mid),
        None => {
            if confirmable {
                // Acknowledge now, answer when ready (separate response, RFC 7252 §5.2.2).
                let _ = server.socket.send_to(&empty_ack(mid), peer).await;
            }
            (answer.await, MessageType::NonConfirmable, server.mid())
        }
    };
    if answer.code.is_error() {
        server.metrics.errors.fetch_add(1, Ordering::Relaxed);
    }
    let bytes = message(kind, mid, &token, answer.code, &answer.options, answer.body, answer.json);
    server.exchanges.lock().finish(key, bytes.clone());
    let _ = server.socket.send_to(&bytes, peer).await;
}

/// The answer to `request`. A body in Block1 blocks is stored block by block (2.31
/// Continue) until the last block completes it; then the whole request is served.
async fn respond(server: &Arc<Server>, mut request: Packet, peer: SocketAddr) -> Answer {
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
            Offer::TooLarge => return too_large(server.mqtt.core.cfg.coap.max_payload_bytes),
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
    let mqtt = &server.mqtt;
    let core = &mqtt.core;
    let max = core.cfg.coap.max_payload_bytes;
    if request.payload.len() > max {
        return too_large(max);
    }
    let (token, resource) = match resource {
        Resource::Device(token, r) => (token, r),
        Resource::Provision => {
            let answer = crate::thingsboard::provision::provision(mqtt, peer.ip(), &request.payload).await;
            return json(ResponseType::Content, answer.to_string().into_bytes());
        }
    };
    let device = match core.ingest.authenticate(token) {
        Ok(d) => d,
        Err(e) => return ingest_error(e),
    };
    let lim = core.payload_limits();
    let submitted = match resource {
        DeviceResource::PostTelemetry => match payload::parse_telemetry(&request.payload, Ts::now(), lim) {
            Ok(records) => core.ingest.submit_one(Item::Telemetry { device, records }).await,
            Err(e) => return payload_error(e),
        },
        DeviceResource::PostAttributes => match payload::parse_attributes(&request.payload, lim, true) {
            Ok(values) => {
                core.ingest.submit_one(Item::Attributes { device, scope: AttributeScope::Client, values }).await
            }
            Err(e) => return payload_error(e),
        },
        DeviceResource::RpcResponse(id) => {
            // An answer nobody waits for any more (timed out, one-way) is dropped, as
            // ThingsBoard does.
            mqtt.rpc.complete(device, id, request.payload.clone().into());
            Ok(())
        }
        DeviceResource::Claim => match crate::thingsboard::claim::open_from_device(core, device, &request.payload) {
            Ok(()) => Ok(()),
            Err(e) => return payload_error(e),
        },
        DeviceResource::ClientRpc => {
            let answer = crate::thingsboard::device_mqtt::client_rpc(&request.payload, max, MAX_IN_FLIGHT);
            return json(ResponseType::Content, answer.to_string().into_bytes());
        }
        DeviceResource::GetAttributes(req) => {
            let observe = match observe_flag(request) {
                Ok(o) => o,
                Err(a) => return a,
            };
            let Some(register) = observe else { return read_attributes(server, request, device, req).await };
            let watch = register.then_some((token, Watched::Attributes));
            return observed(server, request, peer, device, watch, Some(req)).await;
        }
        DeviceResource::GetRpc => {
            return match observe_flag(request) {
                Ok(Some(register)) => {
                    observed(server, request, peer, device, register.then_some((token, Watched::Rpc)), None).await
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

/// `GET …/attributes`: the client and shared attributes asked for, in Block2 blocks when
/// the representation is larger than one block or the client asks for a block.
async fn read_attributes(server: &Server, request: &Packet, device: DeviceId, req: AttributeRequest) -> Answer {
    let asked = match request.get_first_option(CoapOption::Block2).map(|b| Block::decode(b)) {
        None => None,
        Some(Some(b)) => Some(b),
        Some(None) => return text(ResponseType::BadOption, "Block2: malformed or reserved block size (szx 7)"),
    };
    let body = match crate::thingsboard::attributes::read_for_device(&server.mqtt.core.store, device, req).await {
        Ok(j) => j.to_string().into_bytes(),
        Err(e) => return ingest_error(e.into()),
    };
    match block::slice(body.len(), asked) {
        Ok(None) => json(ResponseType::Content, body),
        Ok(Some((b, range))) => {
            // The ETag lets the client see that the blocks it put together are of one version.
            let etag = fnv1a(&body).to_be_bytes().to_vec();
            let options = vec![(CoapOption::ETag, etag), (CoapOption::Block2, b.encode())];
            Answer { options, ..json(ResponseType::Content, body[range].to_vec()) }
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
            let store = &server.mqtt.core.store;
            match crate::thingsboard::attributes::read(store, device, Some(AttributeScope::Shared), req.shared).await {
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
