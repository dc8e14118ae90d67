//! One MQTT connection: CONNECT and authentication, then a loop that reads packets,
//! hands publishes to the ThingsBoard topic layer, writes acknowledgements **in order and
//! only after the durable commit**, publishes server-originated messages, and enforces
//! keep-alive. Buffers are allocated only while there is something in them, so an idle
//! connection holds no read or write buffer.

use std::collections::VecDeque;

use rustc_hash::FxHashSet as HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::stream::{FuturesOrdered, StreamExt};
use gridlinks_broker::acl::Acl;
use gridlinks_broker::router::{Message, SubOptions, SubscribeError};
use gridlinks_broker::sessions::{CloseReason, Outbound, SessionId, SessionLink, Unregistered};
use gridlinks_broker::topic::validate_filter;
use gridlinks_codec::mqtt::topic::is_valid_topic_name;
use gridlinks_codec::mqtt::{
    decode, encode, encode_publish, reason as rc, ConnAck, ConnAckProperties, Connect, DecodeError, Disconnect, Packet,
    ProtocolVersion, PubResp, Publish, PublishProperties, PublishRef, QoS, SubAck, Subscribe, UnsubAck, Unsubscribe,
};
use gridlinks_storage::{BrokerRow, BrokerTable, StoreError, WriteOp};
use gridlinks_types::DeviceId;
use tokio::time::{sleep_until, Instant};

use super::transport::Transport;
use super::{pubsub, retained};
use crate::app::AppState;
use crate::auth::AuthError;
use crate::logging::spawn_logged;
use crate::thingsboard::device_mqtt::{self, Reply, TopicError};
use gridlinks_ingest::{IngestError, Item};
use gridlinks_thingsboard::topic::{ATTRIBUTES as ATTRIBUTES_TOPIC, TELEMETRY as TELEMETRY_TOPIC};

/// A client that does not take our bytes for this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// A token bucket: `rate` messages per second, bursts up to one second's worth.
struct RateLimit {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    fn new(rate: u32) -> Option<Self> {
        (rate > 0).then(|| Self { rate: f64::from(rate), tokens: f64::from(rate), last: Instant::now() })
    }

    fn allow(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.rate);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What a finished in-flight item asks the connection to do, in order.
#[derive(Default)]
struct Done {
    /// Acknowledgements of a batch of device publishes, written first, in order.
    batch_acks: Vec<Packet>,
    /// Publishes this item answers beyond one (a batch of n: n - 1), for the in-flight count.
    extra: usize,
    /// Acknowledgement to write (PUBACK, PUBREC, SUBACK, …).
    ack: Option<Packet>,
    /// A message to publish back to this client.
    reply: Option<Reply>,
    /// Close the connection after writing: (MQTT 5 DISCONNECT reason, reason string).
    close: Option<(u8, String)>,
    /// Retained messages to send after a SUBACK.
    retained: Vec<Outbound>,
}

type InFlight = Pin<Box<dyn Future<Output = Done> + Send>>;

struct Conn<T> {
    stream: T,
    /// This connection's session in the broker (set once CONNECT is accepted).
    session: SessionId,
    /// An outgoing packet failed to encode: the client would wait forever, so close.
    broken: bool,
    /// A write failed or timed out: nothing more is written (an ending connection must not
    /// wait for a dead peer once per remaining acknowledgement).
    write_failed: bool,
    /// `mqtt.rate_limit_messages`, if set (allocated only when configured).
    rate: Option<Box<RateLimit>>,
    st: Arc<AppState>,
    rbuf: BytesMut,
    wbuf: BytesMut,
    version: ProtocolVersion,
    /// MQTT 5 topic aliases the client set (index = alias - 1); allocated on first use.
    aliases: Vec<Option<String>>,
    /// Session expiry interval in force (pub/sub clients; 0: ends with the connection).
    expiry: u32,
    /// The client's DISCONNECT asked for this session expiry (MQTT 5).
    disconnect_expiry: Option<u32>,
    /// Durable queue rows of copies the client acknowledged, to delete.
    acked_rows: Vec<BrokerRow>,
    /// A pub/sub client's id (its durable rows are keyed by it).
    client_id: Option<Arc<str>>,
    /// The client's Maximum Packet Size (MQTT 5 CONNECT); larger packets are not sent.
    max_out: usize,
    /// A publish of this client met a full subscriber queue (its QoS 0 copy was dropped):
    /// let other tasks, that subscriber's among them, run before reading more.
    congested: bool,
    /// Publishes in flight beyond one per pending item (batches answer many), plus those
    /// of the batch being built: with `pending.len()`, the in-flight count.
    extra_in_flight: usize,
}

/// Device publishes decoded from one read (telemetry, client attributes), committed as
/// one ingest batch: one commit-log request, one wake-up, one write of their acks.
struct Batch {
    /// When its first publish was decoded (for the PUBACK latency histogram).
    decoded: Instant,
    items: Vec<Item>,
    /// Every publish, in order.
    publishes: Vec<BatchedPublish>,
}

/// A publish in a [`Batch`]: its topic, QoS, packet id and item index (or why it has none).
type BatchedPublish = (&'static str, QoS, Option<u16>, Result<usize, IngestError>);

impl Batch {
    /// Commits the batch; the acks of every publish in it, in order.
    async fn commit(self, st: Arc<AppState>, device: DeviceId, version: ProtocolVersion) -> Done {
        let results = if self.items.is_empty() { Vec::new() } else { st.ingest.submit(self.items).await };
        let mut done = Done { extra: self.publishes.len().saturating_sub(1), ..Done::default() };
        for (topic, qos, packet_id, item) in self.publishes {
            let result = match item {
                Ok(i) => results.get(i).cloned().unwrap_or(Err(IngestError::Unavailable("no result".into()))),
                Err(e) => Err(e),
            };
            let one =
                outcome(&st, device, topic, result.map(|()| None).map_err(TopicError::from), version, qos, packet_id);
            if matches!(one.ack, Some(Packet::PubAck(_))) {
                st.mqtt_metrics.observe_puback(self.decoded.elapsed());
            }
            done.batch_acks.extend(one.ack);
            done.close = done.close.or(one.close);
        }
        done
    }
}

/// Who is connected.
#[derive(Clone)]
enum Who {
    /// A device (ThingsBoard access token): the device-API topics.
    Device(DeviceId),
    /// A pub/sub client: an application (user name and password) or, with
    /// `mqtt.allow_anonymous`, a client without credentials. Never the device API's topics.
    Client {
        /// Its client id.
        id: Arc<str>,
        /// The credential's user name ("" when anonymous).
        owner: Arc<str>,
        /// What it may publish and subscribe to.
        acl: Arc<Acl>,
    },
}

/// Topic aliases a client may set (MQTT 5 Topic Alias Maximum in CONNACK).
const TOPIC_ALIAS_MAX: u16 = 64;

/// Most QoS 1 messages the server leaves unacknowledged with one client (lower when the
/// client's MQTT 5 Receive Maximum says so).
const OUTBOUND_WINDOW: u16 = 1024;

/// The server's own QoS 1 publishes to one client that await its PUBACK: a window of at
/// most `max`, and packet ids never reused while in flight.
struct OutWindow {
    max: u16,
    in_flight: u16,
    next_id: u16,
    /// Packet ids in flight (at most `max`). Dropped when the window empties, so an idle
    /// connection holds none of it (a bitmap of all 65,535 ids would be 8 KiB each).
    used: HashSet<u16>,
    /// For a persistent session, the copies in flight in the order sent: what the next
    /// connection sends again if this one ends before they are acknowledged.
    kept: Option<VecDeque<(u16, Outbound)>>,
}

impl OutWindow {
    fn new(max: u16, keep: bool) -> Self {
        Self { max: max.max(1), in_flight: 0, next_id: 0, used: HashSet::default(), kept: keep.then(VecDeque::new) }
    }

    /// Marks `id` in flight if it is free (a copy sent again keeps its packet id).
    fn reserve(&mut self, id: u16) -> bool {
        if id == 0 || !self.used.insert(id) {
            return false;
        }
        self.in_flight += 1;
        true
    }

    /// Remembers the copy sent as `id` (persistent sessions only).
    fn keep(&mut self, id: u16, out: Outbound) {
        if let Some(kept) = &mut self.kept {
            kept.push_back((id, out));
        }
    }

    /// Whether `id` is in flight.
    fn in_flight(&self, id: u16) -> bool {
        self.used.contains(&id)
    }

    /// QoS 2: the client received copy `id` (PUBREC); only the PUBREL is owed now. Whether
    /// the kept copy (if any) was still owed as a message.
    fn received(&mut self, id: u16) -> Option<Outbound> {
        let kept = self.kept.as_mut()?;
        let (_, out) = kept.iter_mut().find(|(k, _)| *k == id)?;
        if out.released {
            return None;
        }
        out.released = true;
        Some(out.clone())
    }

    /// The kept copy acknowledged as `id`.
    fn acked(&mut self, id: u16) -> Option<Outbound> {
        let kept = self.kept.as_mut()?;
        let i = kept.iter().position(|(k, _)| *k == id)?;
        kept.remove(i).map(|(_, out)| out)
    }

    /// The kept copies still unacknowledged, in the order sent, with their packet ids.
    fn unacked(&mut self) -> Vec<Outbound> {
        self.kept.take().map_or_else(Vec::new, |k| {
            k.into_iter()
                .map(|(id, mut out)| {
                    out.packet_id = Some(id);
                    out
                })
                .collect()
        })
    }

    /// QoS 1 messages that may be sent now.
    fn room(&self) -> usize {
        usize::from(self.max - self.in_flight)
    }

    /// A free packet id, marked in flight; only called with room left (so one is free).
    fn take_id(&mut self) -> u16 {
        loop {
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            if self.used.insert(self.next_id) {
                self.in_flight += 1;
                return self.next_id;
            }
        }
    }

    /// The client acknowledged `id`; false when it was not in flight.
    fn release(&mut self, id: u16) -> bool {
        if !self.used.remove(&id) {
            return false;
        }
        self.in_flight -= 1;
        if self.in_flight == 0 {
            self.used = HashSet::default();
        }
        true
    }
}

/// The device API's topics, closed to pub/sub clients.
const DEVICE_API_PREFIX: &str = "v1/";
/// Topics only the server publishes to (canonical telemetry topics, …).
const SERVER_PREFIX: &str = "gridlinks/";

/// Why the connection ends.
enum End {
    /// The client sent DISCONNECT (normal disconnection): its will is discarded.
    Normal,
    /// The peer closed or broke the socket, or the close was already handled.
    Gone,
    /// Send DISCONNECT (MQTT 5) with this reason, then close.
    Disconnect(u8, String),
}

/// Serves one connection, from CONNECT to close, holding `guard` until then. Not an
/// `async fn`, and to be spawned as it is: its future then holds the stream once, in the
/// connection, not also as an argument or in a wrapping future (every byte counts once per
/// connection).
pub fn run<T: Transport, G: Send + 'static>(stream: T, st: Arc<AppState>, guard: G) -> impl Future<Output = ()> + Send {
    let mut conn = Conn {
        stream,
        session: SessionId(u64::MAX),
        rate: None,
        broken: false,
        write_failed: false,
        st,
        rbuf: BytesMut::new(),
        wbuf: BytesMut::new(),
        version: ProtocolVersion::V3_1_1,
        aliases: Vec::new(),
        expiry: 0,
        disconnect_expiry: None,
        acked_rows: Vec::new(),
        client_id: None,
        max_out: usize::MAX,
        congested: false,
        extra_in_flight: 0,
    };
    // `conn` and `guard` are used in place, as captured: a `let` binding (or an `async fn`
    // argument) would give each a second slot in the future.
    async move {
        let _hold = &guard;
        let st = conn.st.clone();
        let timeout = st.cfg.mqtt.connect_timeout.duration();
        let mut connect = match Box::pin(tokio::time::timeout(timeout, conn.read_connect())).await {
            Ok(Some(c)) => c,
            _ => {
                st.mqtt_metrics.connects_refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        conn.version = connect.protocol;
        if let Some(max) = connect.properties.maximum_packet_size {
            conn.max_out = usize::try_from(max).unwrap_or(usize::MAX);
        }
        // Boxed, as reading the CONNECT above: the handshake's state (timer, storage and
        // credential checks) would otherwise size every connection's task for its whole life.
        let Some(Admitted { who, link, durable, _slot }) = Box::pin(conn.admit(&connect)).await else {
            st.mqtt_metrics.connects_refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        st.mqtt_metrics.connects.fetch_add(1, Ordering::Relaxed);
        st.mqtt_metrics.connections.fetch_add(1, Ordering::Relaxed);
        conn.session = link.id;
        if let Who::Client { id, .. } = &who {
            conn.client_id = Some(id.clone());
        }
        conn.rate = RateLimit::new(st.cfg.mqtt.rate_limit_messages).map(Box::new);
        let keep_alive = connect.keep_alive;
        let mut window = OutWindow::new(
            connect.properties.receive_maximum.map_or(OUTBOUND_WINDOW, |m| m.min(OUTBOUND_WINDOW)),
            durable,
        );
        // Devices' wills are not published: their topics are the device API's.
        let will = match who {
            Who::Client { .. } => connect.will.take().map(Box::new),
            Who::Device(_) => None,
        };
        // Only the keep-alive and a will outlive the handshake.
        drop(connect);
        let end = conn.serve(&who, keep_alive, &link, &mut window).await;
        let shutting_down = matches!(&end, End::Disconnect(rc::SERVER_SHUTTING_DOWN, _));
        let publish_will = !matches!(end, End::Normal) && !shutting_down;
        // Hand the session back before saying goodbye, so a connection taking over gets
        // the unacknowledged copies at once.
        let left = match &who {
            Who::Device(device) => {
                st.sessions.unregister(*device, link.id);
                Unregistered::Ended
            }
            Who::Client { id, .. } => {
                if let Some(x) = conn.disconnect_expiry.filter(|_| conn.expiry > 0) {
                    conn.expiry = x.min(st.cfg.mqtt.max_session_expiry);
                    st.sessions.set_expiry(id, &link, conn.expiry);
                }
                st.sessions.unregister_client(id, &link, window.unacked())
            }
        };
        conn.flush_acked_rows();
        if let End::Disconnect(reason, text) = end {
            conn.disconnect(reason, &text).await;
        }
        if let Who::Client { id, owner, .. } = &who {
            match left {
                Unregistered::Parked { expiry, epoch } => {
                    let row = pubsub::session_row(&st.sessions, id, owner, expiry, Some(gridlinks_types::Ts::now().0));
                    let writer = st.writer.clone();
                    spawn_logged("storing a parked MQTT session", async move {
                        writer.submit(WriteOp::Broker(vec![row])).await
                    });
                    pubsub::expire_later(st.clone(), id.clone(), epoch, expiry);
                }
                Unregistered::Ended if durable => {
                    let (st, id) = (st.clone(), id.clone());
                    spawn_logged("deleting an ended MQTT session's stored state", async move {
                        pubsub::forget(&st, &id).await
                    });
                }
                Unregistered::Ended | Unregistered::Superseded => {}
            }
            if let (Some(will), true) = (will, publish_will) {
                // The Will Delay Interval runs while the session waits offline; a session that
                // ended (or was taken over) publishes at once, or not at all when resumed.
                let delay = will.delay_interval.unwrap_or(0);
                match left {
                    Unregistered::Parked { expiry, epoch } => {
                        pubsub::will_later(st.clone(), id.clone(), *will, delay.min(expiry), Some(epoch))
                    }
                    Unregistered::Superseded if delay > 0 => {}
                    _ => pubsub::will_later(st.clone(), id.clone(), *will, 0, None),
                }
            }
        }
        st.mqtt_metrics.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection whose CONNECT was accepted.
struct Admitted {
    who: Who,
    link: SessionLink,
    /// Its copies may have durable queue rows (a persistent session, now or resumed).
    durable: bool,
    /// Its place in `mqtt.max_connections_per_credential`, held until it closes.
    _slot: Option<super::CredentialSlot>,
}

impl<T: Transport> Conn<T> {
    /// Reads bytes into the read buffer; false on EOF or error.
    async fn fill(&mut self) -> bool {
        self.stream.fill(&mut self.rbuf).await
    }

    fn decode(&mut self) -> Result<Option<Packet>, DecodeError> {
        let r = decode(&mut self.rbuf, self.version, self.st.cfg.mqtt.max_packet_size);
        if self.rbuf.is_empty() {
            // Idle connections keep no read buffer.
            self.rbuf = BytesMut::new();
        }
        r
    }

    async fn read_connect(&mut self) -> Option<Box<Connect>> {
        loop {
            match self.decode() {
                Ok(Some(Packet::Connect(c))) => return Some(c),
                Ok(Some(_)) => return None, // the first packet must be CONNECT
                Ok(None) => {
                    if !self.fill().await {
                        return None;
                    }
                }
                Err(DecodeError::UnsupportedProtocol { .. }) => {
                    // Answered in the MQTT 3.1.1 layout, which every client understands.
                    self.queue(&Packet::ConnAck(ConnAck {
                        session_present: false,
                        code: rc::V3_UNACCEPTABLE_PROTOCOL_VERSION,
                        properties: ConnAckProperties::default(),
                    }));
                    let _ = self.flush().await;
                    return None;
                }
                Err(_) => return None,
            }
        }
    }

    /// Checks an application's user name and password, or a device's access token (user
    /// name), or admits a client without one as a pub/sub client when
    /// `mqtt.allow_anonymous` is on; registers the session (resuming a persistent one,
    /// committing its stored state first); answers CONNACK either way.
    async fn admit(&mut self, c: &Connect) -> Option<Admitted> {
        let v5 = self.version == ProtocolVersion::V5;
        let refuse = |v3: u8, v5code: u8| if v5 { v5code } else { v3 };
        let mut code = 0;
        let mut who = None;
        // Why, for an MQTT 5 CONNACK's reason string.
        let mut refusal = None;
        let assigned = c.client_id.is_empty().then(|| format!("gridlinks-{}", uuid::Uuid::new_v4().simple()));
        let client_id: Arc<str> = assigned.as_deref().unwrap_or(&c.client_id).into();
        let password = c.password.as_deref().filter(|p| !p.is_empty());
        match c.username.as_deref() {
            None | Some("") if self.st.cfg.mqtt.allow_anonymous => {
                who = Some(Who::Client { id: client_id, owner: "".into(), acl: self.st.anonymous_acl.clone() });
            }
            None | Some("") => code = refuse(rc::V3_BAD_USERNAME_OR_PASSWORD, rc::BAD_USER_NAME_OR_PASSWORD),
            Some(user) => {
                // A name is a device token unless it comes with a password and is an
                // application's (names and tokens are kept apart; this settles older data).
                let app = password.is_some() && self.st.clients.contains(user);
                let device = if app { Ok(None) } else { self.st.store.device_id_by_token(user) };
                match (device, password) {
                    (Ok(Some(d)), _) => who = Some(Who::Device(d)),
                    (Err(_), _) => code = refuse(rc::V3_SERVER_UNAVAILABLE, rc::SERVER_UNAVAILABLE),
                    (Ok(None), None) => code = refuse(rc::V3_NOT_AUTHORIZED, rc::NOT_AUTHORIZED),
                    // An application's login; an unknown name costs what a wrong password costs.
                    (Ok(None), Some(password)) => {
                        let peer =
                            self.stream.peer_ip().unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
                        match self.st.clients.login(&self.st.auth, peer, user, password, &client_id).await {
                            Ok(acl) => who = Some(Who::Client { id: client_id, owner: user.into(), acl }),
                            Err(e) => {
                                code = match e {
                                    AuthError::Throttled(_) => {
                                        refuse(rc::V3_SERVER_UNAVAILABLE, rc::CONNECTION_RATE_EXCEEDED)
                                    }
                                    AuthError::Busy => refuse(rc::V3_SERVER_UNAVAILABLE, rc::SERVER_BUSY),
                                    _ => refuse(rc::V3_BAD_USERNAME_OR_PASSWORD, rc::BAD_USER_NAME_OR_PASSWORD),
                                };
                                refusal = v5.then(|| e.to_string()).filter(|_| code != rc::BAD_USER_NAME_OR_PASSWORD);
                            }
                        }
                    }
                }
            }
        }
        if let (Some(Who::Client { acl, .. }), Some(will)) = (&who, &c.will) {
            if may_publish(acl, &will.topic).is_err() {
                code = refuse(rc::V3_NOT_AUTHORIZED, rc::NOT_AUTHORIZED);
                who = None;
            }
        }
        if code == 0 && c.client_id.is_empty() && !v5 && (!c.clean_start || c.protocol == ProtocolVersion::V3_1) {
            code = rc::V3_IDENTIFIER_REJECTED;
            who = None;
        }
        let mut props = ConnAckProperties::default();
        // Each device token and application user name has a bounded number of connections.
        let credential = match (&who, c.username.as_deref()) {
            (Some(Who::Device(_)), Some(token)) => Some(token),
            (Some(Who::Client { owner, .. }), _) if !owner.is_empty() => Some(&**owner),
            _ => None,
        };
        let mut slot = None;
        if let Some(key) = credential.filter(|_| code == 0) {
            slot = self.st.credential_counts.acquire(key, self.st.cfg.mqtt.max_connections_per_credential);
            if slot.is_none() {
                self.st.mqtt_metrics.over_credential_limit.fetch_add(1, Ordering::Relaxed);
                code = refuse(rc::V3_SERVER_UNAVAILABLE, rc::QUOTA_EXCEEDED);
                refusal = v5.then(|| {
                    "too many connections with this credential (mqtt.max_connections_per_credential)".to_owned()
                });
                who = None;
            }
        }
        let mut registered = None;
        if let (0, Some(who)) = (code, &who) {
            match self.register(c, who).await {
                Ok(r) => registered = Some(r),
                Err(e) => {
                    crate::logging::warn_limited!(error = %e, "cannot store an MQTT session");
                    code = refuse(rc::V3_SERVER_UNAVAILABLE, rc::SERVER_UNAVAILABLE);
                }
            }
        }
        props.reason_string = refusal;
        let present = registered.as_ref().is_some_and(|(_, present, _)| *present);
        if v5 && code == 0 {
            props.receive_maximum = Some(self.st.cfg.mqtt.receive_maximum);
            props.maximum_packet_size = u32::try_from(self.st.cfg.mqtt.max_packet_size).ok();
            // Retained messages and shared subscriptions are for pub/sub clients.
            let pubsub = u8::from(matches!(who, Some(Who::Client { .. })));
            props.retain_available = Some(pubsub);
            props.shared_subscription_available = Some(pubsub);
            props.subscription_identifiers_available = Some(pubsub);
            props.topic_alias_maximum = Some(TOPIC_ALIAS_MAX);
            props.wildcard_subscription_available = Some(1);
            props.assigned_client_identifier = assigned;
            let asked = c.properties.session_expiry_interval.unwrap_or(0);
            // The server's own limit, when lower than asked, is said in CONNACK.
            props.session_expiry_interval = (asked > self.expiry).then_some(self.expiry);
        }
        self.queue(&Packet::ConnAck(ConnAck { session_present: present, code, properties: props }));
        let flushed = self.flush().await.is_ok();
        let (link, _, durable) = registered?;
        let admitted = Admitted { who: who?, link, durable, _slot: slot };
        if !flushed {
            self.release(&admitted);
            return None;
        }
        Some(admitted)
    }

    /// Registers an accepted connection's session: (session link, session present,
    /// durable). A pub/sub client's persistent session is stored before CONNACK.
    async fn register(&mut self, c: &Connect, who: &Who) -> Result<(SessionLink, bool, bool), StoreError> {
        let st = self.st.clone();
        let (id, owner) = match who {
            Who::Device(device) => {
                return Ok((st.sessions.register(*device, st.cfg.mqtt.outbound_queue), false, false))
            }
            Who::Client { id, owner, .. } => (id, owner),
        };
        let max = st.cfg.mqtt.max_session_expiry;
        self.expiry = match self.version {
            ProtocolVersion::V5 => c.properties.session_expiry_interval.unwrap_or(0).min(max),
            _ if !c.clean_start => max,
            _ => 0,
        };
        // What a discarded persistent session left on disk (read before registering, so
        // copies queued for the new session are not among them).
        // Every stored session is also in memory (loaded at start-up), so only a known
        // persistent session costs a storage read here.
        let old_rows = if c.clean_start && st.sessions.is_persistent(id) {
            pubsub::forget_rows(&st.store, id)?
        } else {
            Vec::new()
        };
        let r = st.sessions.register_client(
            id,
            owner.clone(),
            st.cfg.mqtt.client_outbound_queue,
            c.clean_start,
            self.expiry,
        );
        let mut rows = if r.discarded { old_rows } else { Vec::new() };
        if self.expiry > 0 {
            rows.push(pubsub::session_row(&st.sessions, id, owner, self.expiry, None));
        } else if r.present {
            // Resumed as a session that now ends with this connection.
            rows.push(BrokerRow { table: BrokerTable::Sessions, key: id.as_bytes().to_vec(), value: None });
        }
        let durable = self.expiry > 0 || r.present;
        if !rows.is_empty() {
            if let Err(e) = st.writer.submit(WriteOp::Broker(rows)).await {
                st.sessions.unregister_client(id, &r.link, Vec::new());
                return Err(e);
            }
        }
        Ok((r.link, r.present, durable))
    }

    /// Ends the session of a connection that failed right after CONNACK.
    fn release(&self, a: &Admitted) {
        match &a.who {
            Who::Device(device) => self.st.sessions.unregister(*device, a.link.id),
            Who::Client { id, .. } => {
                self.st.sessions.unregister_client(id, &a.link, Vec::new());
            }
        }
    }

    /// Deletes (in the background) the durable rows of copies the client acknowledged.
    fn flush_acked_rows(&mut self) {
        if self.acked_rows.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut self.acked_rows);
        let writer = self.st.writer.clone();
        spawn_logged("deleting acknowledged MQTT copies", async move { writer.submit(WriteOp::Broker(rows)).await });
    }

    /// Encodes `p` into the write buffer; false when it was not queued. A packet larger
    /// than the client's Maximum Packet Size goes without its reason string and user
    /// properties if that makes it fit (MQTT 5 §3.1.2.11.4), else not at all (counted).
    fn queue(&mut self, p: &Packet) -> bool {
        let start = self.wbuf.len();
        if let Err(e) = encode(p, self.version, &mut self.wbuf) {
            crate::logging::error_limited!(error = %e, packet = p.name(), "cannot encode MQTT packet; closing the connection");
            self.broken = true;
            return false;
        }
        if self.fits(start) {
            return true;
        }
        match without_diagnostics(p) {
            Some(lean) => self.queue(&lean),
            None => {
                self.st.mqtt_metrics.too_large.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if self.write_failed {
            self.wbuf = BytesMut::new();
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        if self.wbuf.is_empty() {
            return Ok(());
        }
        // Most writes go at once. Only the rest waits, with a timer, in a boxed future: that
        // state would otherwise size every connection's task (~200 bytes each).
        let r = match self.stream.try_write(&self.wbuf) {
            Ok(n) if n == self.wbuf.len() => Ok(()),
            Ok(n) => {
                match Box::pin(tokio::time::timeout(WRITE_TIMEOUT, self.stream.write_all(&self.wbuf[n..]))).await {
                    Ok(r) => r,
                    Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
                }
            }
            Err(e) => Err(e),
        };
        // Idle connections keep no write buffer.
        self.wbuf = BytesMut::new();
        self.write_failed = r.is_err();
        r
    }

    async fn disconnect(&mut self, reason: u8, text: &str) {
        if self.version == ProtocolVersion::V5 {
            let reason_string = (!text.is_empty()).then(|| text.to_owned());
            self.queue(&Packet::Disconnect(Disconnect {
                reason,
                session_expiry_interval: None,
                reason_string,
                server_reference: None,
            }));
            let _ = self.flush().await;
        }
        self.stream.shutdown().await;
    }

    /// The connected phase. Packets that came in the same read as the CONNECT are handled
    /// before the first wait. Once the connection is ending (DISCONNECT, end of stream, a
    /// protocol error, takeover, shutdown) nothing more is read, but every packet received
    /// before that point is processed in order and everything in flight is finished
    /// (committed, and acknowledged while the socket takes bytes) before `serve` returns.
    async fn serve(&mut self, who: &Who, keep_alive: u16, link: &SessionLink, window: &mut OutWindow) -> End {
        let st = self.st.clone();
        let max_in_flight = usize::from(st.cfg.mqtt.receive_maximum);
        let keep_alive = (keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500));
        let mut last_seen = Instant::now();
        let far = Duration::from_secs(365 * 24 * 3600);
        let ka_timer = sleep_until(last_seen + keep_alive.unwrap_or(far));
        tokio::pin!(ka_timer);
        // Allocated only while something is in flight (an empty FuturesOrdered allocates), and
        // boxed: not to size the task of every idle connection for it.
        let mut pending: Option<Box<FuturesOrdered<InFlight>>> = None;
        // How the connection ends, once that is known; from then on nothing is read.
        let mut ending: Option<End> = None;
        // The peer closed its side: what is buffered is still processed, then it ends.
        let mut eof = false;
        // Made once, not on every turn of the loop: registering with a Notify takes its
        // lock, which showed up in profiles at a few percent of the server's CPU.
        let woken = link.inbox.wake.notified();
        tokio::pin!(woken);
        // A resumed session's queue and unacknowledged copies go first.
        if link.inbox.has_queued() {
            self.send_queued(link, window);
            if self.flush().await.is_err() {
                return End::Gone;
            }
        }

        loop {
            // Decode what is buffered, up to the in-flight limit: packets that came with the
            // CONNECT, or were left in the buffer by backpressure, must not wait for new bytes.
            // Device publishes among them go as one batch.
            let mut batch: Option<Box<Batch>> = None;
            while ending.is_none() && pending.as_ref().map_or(0, |p| p.len()) + self.extra_in_flight < max_in_flight {
                match self.decode() {
                    Ok(None) => {
                        if eof {
                            ending = Some(End::Gone);
                        }
                        break;
                    }
                    // Acknowledgements of the server's own QoS 1 and 2 publishes.
                    Ok(Some(
                        Packet::PubAck(PubResp { packet_id, .. }) | Packet::PubComp(PubResp { packet_id, .. }),
                    )) => {
                        self.settle(packet_id, window, link);
                    }
                    Ok(Some(Packet::PubRec(r))) => {
                        self.seal(&mut batch, who, pending.get_or_insert_default());
                        self.on_pubrec(r, window, link, &mut pending)
                    }
                    Ok(Some(p)) => {
                        let queue = pending.get_or_insert_default();
                        ending = self.on_packet(p, who, link, queue, &mut batch);
                    }
                    Err(e) => {
                        st.mqtt_metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        let reason = match e {
                            DecodeError::PacketTooLarge { .. } => rc::PACKET_TOO_LARGE,
                            DecodeError::Protocol(_) => rc::PROTOCOL_ERROR,
                            _ => rc::MALFORMED_PACKET,
                        };
                        ending = Some(End::Disconnect(reason, e.to_string()));
                    }
                }
            }
            if batch.is_some() {
                self.seal(&mut batch, who, pending.get_or_insert_default());
            }
            self.flush_acked_rows();
            if self.flush().await.is_err() && ending.is_none() {
                ending = Some(End::Gone);
            }
            if std::mem::take(&mut self.congested) {
                // Without this a publisher whose socket always has data keeps its worker
                // busy for a whole scheduling budget, and the subscriber it floods runs
                // too seldom to drain its queue: most QoS 0 copies would be dropped.
                tokio::task::yield_now().await;
            }
            if self.broken && ending.is_none() {
                ending = Some(End::Disconnect(rc::IMPLEMENTATION_SPECIFIC_ERROR, "internal encoding error".into()));
            }
            if pending.as_ref().is_some_and(|p| p.is_empty()) {
                pending = None;
            }
            if pending.is_none() {
                if let Some(end) = ending {
                    return end;
                }
            }
            let in_flight = pending.as_ref().map_or(0, |p| p.len());
            let can_read = ending.is_none() && !eof && in_flight + self.extra_in_flight < max_in_flight;
            tokio::select! {
                biased;
                _ = &mut woken, if ending.is_none() => {
                    woken.set(link.inbox.wake.notified());
                    ending = match link.close_reason() {
                        None => {
                            self.send_queued(link, window);
                            None
                        }
                        // Stop reading; acknowledge what is in flight, then say goodbye.
                        Some(CloseReason::ShuttingDown) => Some(End::Disconnect(rc::SERVER_SHUTTING_DOWN, "server shutting down".into())),
                        Some(CloseReason::TakenOver) => Some(End::Disconnect(rc::SESSION_TAKEN_OVER, "another connection took this client id over".into())),
                        Some(CloseReason::TooSlow) => {
                            st.mqtt_metrics.too_slow.fetch_add(1, Ordering::Relaxed);
                            Some(End::Disconnect(rc::QUOTA_EXCEEDED, "too slow to receive: outbound queue full".into()))
                        }
                        Some(CloseReason::Revoked) => Some(End::Disconnect(rc::NOT_AUTHORIZED, "device deleted or credential changed".into())),
                    };
                }
                Some(done) = async { pending.as_mut()?.next().await }, if in_flight > 0 => {
                    let mut end = self.finish(done, link, window);
                    // Batch every other ack that is already complete into the same write.
                    if let Some(p) = pending.as_mut() {
                        while let Some(Some(done)) = futures_util::FutureExt::now_or_never(p.next()) {
                            end = end.or(self.finish(done, link, window));
                        }
                    }
                    if ending.is_none() {
                        ending = end;
                    }
                }
                filled = self.stream.fill(&mut self.rbuf), if can_read => {
                    if filled {
                        last_seen = Instant::now();
                    } else {
                        eof = true;
                    }
                }
                _ = &mut ka_timer, if keep_alive.is_some() && ending.is_none() && !eof => {
                    let ka = keep_alive.unwrap_or(far);
                    if last_seen.elapsed() >= ka {
                        st.mqtt_metrics.keepalive_timeouts.fetch_add(1, Ordering::Relaxed);
                        ending = Some(End::Disconnect(rc::KEEP_ALIVE_TIMEOUT, "keep alive timeout".into()));
                    } else {
                        ka_timer.as_mut().reset(last_seen + ka);
                    }
                }
            }
        }
    }

    /// A PUBREC for one of the server's QoS 2 publishes.
    fn on_pubrec(
        &mut self,
        r: PubResp,
        window: &mut OutWindow,
        link: &SessionLink,
        pending: &mut Option<Box<FuturesOrdered<InFlight>>>,
    ) {
        if r.reason >= 0x80 {
            // Refused by the client (MQTT 5): the exchange ends here.
            self.settle(r.packet_id, window, link);
        } else if window.in_flight(r.packet_id) {
            // Delivered: only the PUBREL is owed now. A durable copy's row says so before
            // the PUBREL goes, so that after a crash the client gets the PUBREL again, not
            // the message.
            let pubrel = Packet::PubRel(resp(r.packet_id, 0, None));
            let row = window
                .received(r.packet_id)
                .zip(self.client_id.as_ref())
                .and_then(|(out, client)| pubsub::released_row(client, &out));
            match row {
                Some(row) => {
                    let done = Done { ack: Some(pubrel), reply: None, close: None, ..Default::default() };
                    pending.get_or_insert_default().push_back(self.after_stored(vec![row], done));
                }
                None => {
                    self.queue(&pubrel);
                }
            }
        } else {
            let reason = if self.version == ProtocolVersion::V5 { rc::PACKET_IDENTIFIER_NOT_FOUND } else { 0 };
            self.queue(&Packet::PubRel(resp(r.packet_id, reason, None)));
        }
    }

    /// Queues what waits in the session's inbox, as far as the window allows: first the
    /// copies an earlier connection left unacknowledged (same packet id, DUP set), then the
    /// queue. Expired messages (MQTT 5 message expiry) are dropped here, without using the
    /// window.
    fn send_queued(&mut self, link: &SessionLink, window: &mut OutWindow) {
        let now = std::time::Instant::now();
        let mut unacked = link.inbox.take_unacked();
        if !unacked.is_empty() {
            let rest = unacked.split_off(unacked.len().min(window.room()));
            link.inbox.requeue_unacked(rest);
            for out in unacked {
                if out.released {
                    // QoS 2 after PUBREC: only the PUBREL is owed, with the same id.
                    if let Some(id) = out.packet_id.filter(|id| window.reserve(*id)) {
                        self.queue(&Packet::PubRel(resp(id, 0, None)));
                        window.keep(id, out);
                    }
                } else if !self.expired(&out, now) {
                    let id = out.packet_id.filter(|id| window.reserve(*id)).unwrap_or_else(|| window.take_id());
                    self.send(out, Some(id), true, now, window);
                }
            }
        }
        loop {
            let batch = link.inbox.take(window.room(), |id| !window.in_flight(id));
            if batch.is_empty() {
                return;
            }
            for out in batch {
                if self.expired(&out, now) {
                    continue;
                }
                // A durable copy goes with its fixed id (free unless two in one batch share
                // it, which takes 65,535 copies between them: then it gets another).
                let packet_id = (out.qos > QoS::AtMostOnce).then(|| {
                    out.fixed_packet_id().filter(|&id| window.reserve(id)).unwrap_or_else(|| window.take_id())
                });
                self.send(out, packet_id, false, now, window);
            }
        }
    }

    /// Queues the PUBLISH of `out` (`packet_id` taken for QoS 1 and 2, DUP when sent
    /// again). A message larger than the client's Maximum Packet Size is discarded as if
    /// it had been delivered (MQTT 5 §3.1.2.11.4): its window slot frees, its durable copy
    /// goes.
    fn send(
        &mut self,
        out: Outbound,
        packet_id: Option<u16>,
        dup: bool,
        now: std::time::Instant,
        window: &mut OutWindow,
    ) {
        if self.queue_publish(&out, packet_id, dup, now) {
            if let Some(id) = packet_id {
                window.keep(id, out);
            }
            return;
        }
        if packet_id.is_some_and(|id| window.release(id)) {
            if let Some(client) = self.client_id.clone() {
                self.acked_rows.extend(pubsub::acked_row(&client, &out));
            }
        }
    }

    /// The client finished with the server's publish `id` (PUBACK, PUBCOMP, or a refusing
    /// PUBREC): its window slot frees, its durable copy goes, waiting messages follow.
    fn settle(&mut self, id: u16, window: &mut OutWindow, link: &SessionLink) {
        if !window.release(id) {
            return;
        }
        if let (Some(out), Some(client)) = (window.acked(id), self.client_id.clone()) {
            self.acked_rows.extend(pubsub::acked_row(&client, &out));
        }
        if link.inbox.has_queued() {
            self.send_queued(link, window);
        }
    }

    /// Whether `out` expired; an expired durable copy's row is deleted.
    fn expired(&mut self, out: &Outbound, now: std::time::Instant) -> bool {
        if !out.msg.expired(now) {
            return false;
        }
        if let Some(client) = self.client_id.clone() {
            self.acked_rows.extend(pubsub::acked_row(&client, out));
        }
        true
    }

    /// Encodes the PUBLISH carrying `out` to this client (for MQTT 5 with the message's
    /// properties, its remaining expiry and the matching subscription identifiers) into the
    /// write buffer, by reference: a copy of a fanned-out message costs no allocation
    /// unless its MQTT 5 properties differ per copy. False when it was not queued: larger
    /// than the client's Maximum Packet Size (counted), or not encodable.
    fn queue_publish(&mut self, out: &Outbound, packet_id: Option<u16>, dup: bool, now: std::time::Instant) -> bool {
        let none = PublishProperties::default();
        let mut own;
        let mut properties = &none;
        if self.version == ProtocolVersion::V5 {
            let expiry = out.msg.expires.map(|e| retained::remaining_secs(e, now));
            properties = match (&out.msg.props, expiry, out.subscription_ids.is_empty()) {
                (Some(p), None, true) => p,
                (p, expiry, _) => {
                    own = p.as_deref().cloned().unwrap_or_default();
                    own.message_expiry_interval = expiry;
                    own.subscription_identifiers.clone_from(&out.subscription_ids);
                    &own
                }
            };
        }
        let qos = match (packet_id, out.qos) {
            (None, _) => QoS::AtMostOnce,
            (Some(_), QoS::ExactlyOnce) => QoS::ExactlyOnce,
            (Some(_), _) => QoS::AtLeastOnce,
        };
        let publish = PublishRef {
            dup,
            qos,
            retain: out.retain,
            topic: &out.msg.topic,
            packet_id,
            payload: &out.msg.payload,
            properties,
        };
        let start = self.wbuf.len();
        if let Err(e) = encode_publish(&publish, self.version, &mut self.wbuf) {
            crate::logging::error_limited!(error = %e, "cannot encode MQTT PUBLISH; closing the connection");
            self.broken = true;
            return false;
        }
        if !self.fits(start) {
            self.st.mqtt_metrics.too_large.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Whether the packet encoded into the write buffer from `start` on fits the client's
    /// Maximum Packet Size; if not, it is taken out again.
    fn fits(&mut self, start: usize) -> bool {
        if self.wbuf.len() - start <= self.max_out {
            return true;
        }
        self.wbuf.truncate(start);
        false
    }

    /// Writes what a completed in-flight item produced; `Some` ends the connection.
    fn finish(&mut self, done: Done, link: &SessionLink, window: &mut OutWindow) -> Option<End> {
        self.extra_in_flight -= done.extra;
        for ack in done.batch_acks.iter().chain(&done.ack) {
            if let Packet::PubRec(r) = ack {
                if r.reason < 0x80 {
                    // Received: until its PUBREL, a copy sent again is not routed again.
                    link.inbox.received(r.packet_id);
                }
            }
            self.queue(ack);
        }
        if let Some(reply) = done.reply {
            self.queue(&Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtMostOnce,
                retain: false,
                topic: reply.topic,
                packet_id: None,
                payload: reply.payload,
                properties: PublishProperties::default(),
            }));
        }
        // Retained messages of a new subscription, after its SUBACK, at the lower of their
        // QoS and the subscription's: through the inbox, so QoS 1 ones respect the window.
        if !done.retained.is_empty() {
            link.inbox.push_all(done.retained);
            self.send_queued(link, window);
        }
        done.close.map(|(reason, text)| End::Disconnect(reason, text))
    }

    /// Queues the batch being built as one in-flight item (before anything queued after it).
    fn seal(&mut self, batch: &mut Option<Box<Batch>>, who: &Who, pending: &mut FuturesOrdered<InFlight>) {
        let (Some(b), Who::Device(device)) = (batch.take(), who) else { return };
        let (st, device, version) = (self.st.clone(), *device, self.version);
        // The batch counted each of its publishes while it was built; now one item is pending.
        self.extra_in_flight -= 1;
        pending.push_back(Box::pin(b.commit(st, device, version)));
    }

    fn on_packet(
        &mut self,
        p: Packet,
        who: &Who,
        link: &SessionLink,
        pending: &mut FuturesOrdered<InFlight>,
        batch: &mut Option<Box<Batch>>,
    ) -> Option<End> {
        let v5 = self.version == ProtocolVersion::V5;
        if let (Packet::Publish(p), Who::Device(device)) = (&p, who) {
            let batchable = p.properties.topic_alias.is_none()
                && (p.qos != QoS::ExactlyOnce || p.packet_id.is_none_or(|pid| !link.inbox.awaiting_release(pid)))
                && self.rate.as_ref().is_none();
            if let (true, Some(item)) = (batchable, device_mqtt::batch_item(&self.st, *device, &p.topic, &p.payload)) {
                self.st.mqtt_metrics.publishes.fetch_add(1, Ordering::Relaxed);
                let topic = if p.topic == TELEMETRY_TOPIC { TELEMETRY_TOPIC } else { ATTRIBUTES_TOPIC };
                let b = batch.get_or_insert_with(|| {
                    Box::new(Batch { decoded: Instant::now(), items: Vec::new(), publishes: Vec::new() })
                });
                let index = item.map(|item| {
                    b.items.push(item);
                    b.items.len() - 1
                });
                b.publishes.push((
                    topic,
                    p.qos,
                    p.packet_id,
                    index.map_err(|e| IngestError::BadPayload(e.to_string())),
                ));
                self.extra_in_flight += 1;
                return None;
            }
        }
        // Everything else keeps its place after the batch.
        self.seal(batch, who, pending);
        match p {
            Packet::Publish(p) => {
                self.st.mqtt_metrics.publishes.fetch_add(1, Ordering::Relaxed);
                if self.rate.as_mut().is_some_and(|r| !r.allow()) {
                    let text = format!(
                        "message rate limit exceeded: mqtt.rate_limit_messages = {} per second",
                        self.st.cfg.mqtt.rate_limit_messages
                    );
                    // PUBACK/PUBREC cannot carry 0x96 (message rate too high): 0x97 quota exceeded.
                    return match (v5, p.qos, p.packet_id) {
                        (true, QoS::AtLeastOnce, Some(pid)) => {
                            pending.push_back(ready(Some(Packet::PubAck(resp(pid, rc::QUOTA_EXCEEDED, Some(text))))));
                            None
                        }
                        (true, QoS::ExactlyOnce, Some(pid)) => {
                            pending.push_back(ready(Some(Packet::PubRec(resp(pid, rc::QUOTA_EXCEEDED, Some(text))))));
                            None
                        }
                        // QoS 0 cannot be refused one by one, and 3.1.1 cannot refuse at all.
                        _ => Some(End::Disconnect(rc::MESSAGE_RATE_TOO_HIGH, text)),
                    };
                }
                let mut p = p;
                if let Some(alias) = p.properties.topic_alias.take() {
                    if let Err(end) = self.resolve_alias(alias, &mut p.topic) {
                        return Some(end);
                    }
                }
                if p.qos == QoS::ExactlyOnce {
                    if let Some(pid) = p.packet_id.filter(|pid| link.inbox.awaiting_release(*pid)) {
                        // A redelivery of a QoS 2 message already received (on this or an
                        // earlier connection of the session): PUBREC again, nothing routed.
                        pending.push_back(ready(Some(Packet::PubRec(resp(pid, 0, None)))));
                        return None;
                    }
                }
                let device = match who {
                    Who::Device(device) => *device,
                    Who::Client { id, acl, .. } => return self.route(id, acl, p, pending),
                };
                let st = self.st.clone();
                let (version, decoded) = (self.version, Instant::now());
                pending.push_back(Box::pin(async move {
                    let result = device_mqtt::handle_publish(st.clone(), device, &p.topic, p.payload).await;
                    let done = outcome(&st, device, &p.topic, result, version, p.qos, p.packet_id);
                    if matches!(done.ack, Some(Packet::PubAck(_))) {
                        st.mqtt_metrics.observe_puback(decoded.elapsed());
                    }
                    done
                }));
            }
            Packet::PubRel(r) => {
                let known = link.inbox.release(r.packet_id);
                let reason = if known || !v5 { 0 } else { rc::PACKET_IDENTIFIER_NOT_FOUND };
                let pubcomp = Done {
                    ack: Some(Packet::PubComp(resp(r.packet_id, reason, None))),
                    reply: None,
                    close: None,
                    ..Default::default()
                };
                match (&self.client_id, known && self.expiry > 0) {
                    // A persistent session stored the packet id: the PUBCOMP waits until it
                    // is deleted, or a restart could take the client's next message with
                    // that id for a copy sent again and drop it.
                    (Some(client), true) => {
                        let row = pubsub::incoming_row(client, r.packet_id, false);
                        pending.push_back(self.after_stored(vec![row], pubcomp));
                    }
                    _ => pending.push_back(Box::pin(std::future::ready(pubcomp))),
                }
            }
            // Handled in the read loop (they open the outbound window).
            Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_) => {}
            Packet::Subscribe(s) => {
                let (ack, retained) = self.subscribe(who, s);
                let done = Done { ack: Some(ack), reply: None, close: None, retained, ..Default::default() };
                pending.push_back(self.after_session_saved(who, done));
            }
            Packet::Unsubscribe(u) => {
                let ack = self.unsubscribe(who, u);
                let done = Done { ack: Some(ack), reply: None, close: None, ..Default::default() };
                pending.push_back(self.after_session_saved(who, done));
            }
            Packet::PingReq => {
                self.queue(&Packet::PingResp);
            }
            // 0x04: "disconnect with will message".
            Packet::Disconnect(d) => {
                self.disconnect_expiry = d.session_expiry_interval;
                return Some(if d.reason == rc::DISCONNECT_WITH_WILL_MESSAGE { End::Gone } else { End::Normal });
            }
            Packet::Connect(_) => {
                self.st.mqtt_metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
                return Some(End::Disconnect(rc::PROTOCOL_ERROR, "second CONNECT".into()));
            }
            Packet::Auth(_) | Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                self.st.mqtt_metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
                return Some(End::Disconnect(rc::PROTOCOL_ERROR, "unexpected packet from a client".into()));
            }
        }
        None
    }

    /// `done` once a persistent session's subscriptions are stored (SUBACK and UNSUBACK
    /// wait for that); at once for other sessions.
    fn after_session_saved(&self, who: &Who, done: Done) -> InFlight {
        match who {
            Who::Client { id, owner, .. } if self.expiry > 0 => {
                let row = pubsub::session_row(&self.st.sessions, id, owner, self.expiry, None);
                self.after_stored(vec![row], done)
            }
            _ => Box::pin(std::future::ready(done)),
        }
    }

    /// `done` once `rows` are committed; if they cannot be, the connection closes (an
    /// acknowledgement cannot say "not stored" for every packet). The write goes ahead
    /// if the connection ends first.
    fn after_stored(&self, rows: Vec<BrokerRow>, done: Done) -> InFlight {
        let writer = self.st.writer.clone();
        let write = tokio::spawn(async move { writer.submit(WriteOp::Broker(rows)).await });
        let v5 = self.version == ProtocolVersion::V5;
        Box::pin(async move {
            match write.await.unwrap_or(Err(StoreError::Closed)) {
                Ok(_) => done,
                Err(e) => Done {
                    ack: None,
                    reply: None,
                    close: Some((if v5 { rc::UNSPECIFIED_ERROR } else { 0 }, format!("session state not stored: {e}"))),
                    ..Default::default()
                },
            }
        })
    }

    /// Applies MQTT 5 topic alias `alias` to a PUBLISH topic: an empty topic takes the
    /// alias's, a non-empty one (re)defines it.
    fn resolve_alias(&mut self, alias: u16, topic: &mut String) -> Result<(), End> {
        if alias == 0 || alias > TOPIC_ALIAS_MAX {
            return Err(End::Disconnect(
                rc::TOPIC_ALIAS_INVALID,
                format!("topic alias {alias} is outside 1..={TOPIC_ALIAS_MAX}"),
            ));
        }
        let slot = usize::from(alias - 1);
        if topic.is_empty() {
            match self.aliases.get(slot).cloned().flatten() {
                Some(t) => *topic = t,
                None => return Err(End::Disconnect(rc::PROTOCOL_ERROR, format!("topic alias {alias} was never set"))),
            }
        } else {
            if self.aliases.is_empty() {
                self.aliases = vec![None; usize::from(TOPIC_ALIAS_MAX)];
            }
            self.aliases[slot] = Some(topic.clone());
        }
        Ok(())
    }

    /// A pub/sub client's PUBLISH: routed to the subscribed client sessions at once, then
    /// acknowledged once what must be durable is committed. Topics outside the client's
    /// ACL, and the device API's, are refused.
    fn route(&mut self, client: &str, acl: &Acl, p: Publish, pending: &mut FuturesOrdered<InFlight>) -> Option<End> {
        let v5 = self.version == ProtocolVersion::V5;
        let (qos, packet_id) = (p.qos, p.packet_id);
        if let Err(text) = may_publish(acl, &p.topic) {
            self.st.mqtt_metrics.bad_publishes.fetch_add(1, Ordering::Relaxed);
            if !v5 {
                return Some(End::Disconnect(rc::NOT_AUTHORIZED, text));
            }
            pending.push_back(ready(pub_ack(qos, packet_id, rc::NOT_AUTHORIZED, Some(text))));
            return None;
        }
        let retain = p.retain;
        let msg = message(p);
        // A persistent session remembers a QoS 2 message's packet id until its PUBREL, also
        // across a restart: committed with the copies, before the PUBREC.
        let remember = packet_id
            .filter(|_| qos == QoS::ExactlyOnce && self.expiry > 0)
            .map(|id| pubsub::incoming_row(client, id, true));
        let routing = pubsub::route(&self.st, client, &msg, retain, remember);
        self.congested |= routing.congested;
        // MQTT 5: 0x10 "no matching subscribers" is a success code.
        let reason = if !routing.matched && v5 { rc::NO_MATCHING_SUBSCRIBERS } else { 0 };
        let Some(work) = routing.pending else {
            pending.push_back(ready(pub_ack(qos, packet_id, reason, None)));
            return None;
        };
        // The acknowledgement waits until the retained message and the copies for
        // persistent sessions are committed, and (backpressure) until full subscriber
        // queues have room or those subscribers are disconnected as too slow.
        pending.push_back(Box::pin(async move {
            match work.await {
                Ok(()) => {
                    Done { ack: pub_ack(qos, packet_id, reason, None), reply: None, close: None, ..Default::default() }
                }
                Err(e) => {
                    let text = format!("message not stored: {e}");
                    let reason = if matches!(e, StoreError::DiskFull(_) | StoreError::Overloaded) {
                        rc::QUOTA_EXCEEDED
                    } else {
                        rc::UNSPECIFIED_ERROR
                    };
                    if v5 {
                        Done {
                            ack: pub_ack(qos, packet_id, reason, Some(text)),
                            reply: None,
                            close: None,
                            ..Default::default()
                        }
                    } else {
                        Done {
                            ack: None,
                            reply: None,
                            close: Some((rc::UNSPECIFIED_ERROR, text)),
                            ..Default::default()
                        }
                    }
                }
            }
        }));
        None
    }

    fn subscribe(&mut self, who: &Who, s: Subscribe) -> (Packet, Vec<Outbound>) {
        let v5 = self.version == ProtocolVersion::V5;
        let mut retained = Vec::new();
        let codes: Vec<u8> = s
            .filters
            .iter()
            .map(|f| {
                let granted = f.qos;
                match who {
                    Who::Device(device) => {
                        // Server-originated device messages go at QoS 0 or 1.
                        let granted = granted.min(QoS::AtLeastOnce);
                        if f.filter.starts_with("$share/") {
                            return if v5 {
                                rc::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
                            } else {
                                rc::V3_SUBSCRIPTION_FAILURE
                            };
                        }
                        if validate_filter(&f.filter).is_err() {
                            return if v5 { rc::TOPIC_FILTER_INVALID } else { rc::V3_SUBSCRIPTION_FAILURE };
                        }
                        match self.st.sessions.subscribe(*device, self.session, &f.filter, granted) {
                            Ok(()) => u8::from(granted),
                            Err(_) => {
                                if v5 {
                                    rc::QUOTA_EXCEEDED
                                } else {
                                    rc::V3_SUBSCRIPTION_FAILURE
                                }
                            }
                        }
                    }
                    Who::Client { id: client, acl, .. } => {
                        let plain = f
                            .filter
                            .strip_prefix("$share/")
                            .and_then(|r| r.split_once('/'))
                            .map_or(f.filter.as_str(), |(_, p)| p);
                        if plain.starts_with(DEVICE_API_PREFIX) || !acl.may_subscribe(&f.filter) {
                            return if v5 { rc::NOT_AUTHORIZED } else { rc::V3_SUBSCRIPTION_FAILURE };
                        }
                        let opts = SubOptions {
                            qos: granted,
                            no_local: f.no_local,
                            retain_as_published: f.retain_as_published,
                            retain_handling: f.retain_handling,
                            subscription_id: s.subscription_identifier,
                        };
                        match self.st.sessions.subscribe_client(client, &f.filter, opts) {
                            Ok(r) => {
                                retained.extend(r.into_iter().map(|(msg, qos)| Outbound {
                                    retain: true,
                                    subscription_ids: s.subscription_identifier.into_iter().collect(),
                                    ..Outbound::plain(msg, qos)
                                }));
                                u8::from(granted)
                            }
                            Err(SubscribeError::TooMany(_)) => {
                                if v5 {
                                    rc::QUOTA_EXCEEDED
                                } else {
                                    rc::V3_SUBSCRIPTION_FAILURE
                                }
                            }
                            Err(_) => {
                                if v5 {
                                    rc::TOPIC_FILTER_INVALID
                                } else {
                                    rc::V3_SUBSCRIPTION_FAILURE
                                }
                            }
                        }
                    }
                }
            })
            .collect();
        let reason_string = (v5 && codes.contains(&rc::QUOTA_EXCEEDED)).then(|| {
            format!(
                "too many subscriptions: at most {} per session (mqtt.max_subscriptions_per_client)",
                self.st.cfg.mqtt.max_subscriptions_per_client
            )
        });
        (Packet::SubAck(SubAck { packet_id: s.packet_id, return_codes: codes, reason_string }), retained)
    }

    fn unsubscribe(&mut self, who: &Who, u: Unsubscribe) -> Packet {
        let codes = u
            .filters
            .iter()
            .map(|f| {
                let existed = match who {
                    Who::Device(device) => self.st.sessions.unsubscribe(*device, self.session, f),
                    Who::Client { id, .. } => self.st.sessions.unsubscribe_client(id, f),
                };
                if existed {
                    0
                } else {
                    rc::NO_SUBSCRIPTION_EXISTED
                }
            })
            .collect();
        Packet::UnsubAck(UnsubAck { packet_id: u.packet_id, reason_codes: codes, reason_string: None })
    }
}

/// `p` without its reason string and user properties, if it has any.
fn without_diagnostics(p: &Packet) -> Option<Packet> {
    let lean = |r: &PubResp| {
        (r.reason_string.is_some() || !r.user_properties.is_empty()).then(|| resp(r.packet_id, r.reason, None))
    };
    match p {
        Packet::PubAck(r) => lean(r).map(Packet::PubAck),
        Packet::PubRec(r) => lean(r).map(Packet::PubRec),
        Packet::PubRel(r) => lean(r).map(Packet::PubRel),
        Packet::PubComp(r) => lean(r).map(Packet::PubComp),
        Packet::SubAck(a) if a.reason_string.is_some() => {
            Some(Packet::SubAck(SubAck { reason_string: None, ..a.clone() }))
        }
        Packet::UnsubAck(a) if a.reason_string.is_some() => {
            Some(Packet::UnsubAck(UnsubAck { reason_string: None, ..a.clone() }))
        }
        Packet::Disconnect(d) if d.reason_string.is_some() => {
            Some(Packet::Disconnect(Disconnect { reason_string: None, ..d.clone() }))
        }
        _ => None,
    }
}

fn resp(packet_id: u16, reason: u8, reason_string: Option<String>) -> PubResp {
    PubResp { packet_id, reason, reason_string, user_properties: Vec::new() }
}

/// May a pub/sub client with `acl` publish to `topic`? If not, why.
fn may_publish(acl: &Acl, topic: &str) -> Result<(), String> {
    if topic.starts_with(DEVICE_API_PREFIX) {
        Err(format!("not authorized to publish to {topic:?}: the device API needs a device token"))
    } else if topic.starts_with(SERVER_PREFIX) {
        Err(format!("not authorized to publish to {topic:?}: only the server publishes under {SERVER_PREFIX}"))
    } else if !is_valid_topic_name(topic) || !acl.may_publish(topic) {
        Err(format!("not authorized to publish to {topic:?}: outside this client's ACL"))
    } else {
        Ok(())
    }
}

/// The acknowledgement of a PUBLISH: PUBACK (QoS 1), PUBREC (QoS 2), none (QoS 0).
fn pub_ack(qos: QoS, packet_id: Option<u16>, reason: u8, text: Option<String>) -> Option<Packet> {
    let r = resp(packet_id?, reason, text);
    match qos {
        QoS::AtMostOnce => None,
        QoS::AtLeastOnce => Some(Packet::PubAck(r)),
        QoS::ExactlyOnce => Some(Packet::PubRec(r)),
    }
}

/// A client's PUBLISH as the message its subscribers get: the topic alias and
/// subscription identifiers are the sender's business; the expiry becomes a deadline.
pub(crate) fn message(p: Publish) -> Message {
    let mut props = p.properties;
    let expires =
        props.message_expiry_interval.take().map(|s| std::time::Instant::now() + Duration::from_secs(u64::from(s)));
    props.topic_alias = None;
    props.subscription_identifiers.clear();
    let has_props = !props.is_empty();
    Message {
        topic: p.topic.into(),
        payload: p.payload,
        qos: p.qos,
        props: has_props.then(|| Arc::new(props)),
        expires,
    }
}

fn ready(ack: Option<Packet>) -> InFlight {
    Box::pin(std::future::ready(Done { ack, reply: None, close: None, ..Default::default() }))
}

/// Maps the result of a device publish to what the client sees: the one place where the
/// ingest path's refusals ([`IngestError`]) become MQTT reason codes.
fn outcome(
    st: &AppState,
    device: DeviceId,
    topic: &str,
    result: Result<Option<Reply>, TopicError>,
    version: ProtocolVersion,
    qos: QoS,
    packet_id: Option<u16>,
) -> Done {
    let ack = |reason: u8, text: Option<String>| pub_ack(qos, packet_id, reason, text);
    let err = match result {
        Ok(reply) => return Done { ack: ack(0, None), reply, ..Default::default() },
        Err(e) => e,
    };
    let (reason, text, bad) = match &err {
        TopicError::UnknownTopic => {
            (rc::TOPIC_NAME_INVALID, format!("unknown topic {topic:?}: not a ThingsBoard device topic"), true)
        }
        TopicError::Ingest(e) => match e {
            IngestError::BadPayload(m) => (rc::PAYLOAD_FORMAT_INVALID, format!("payload format invalid: {m}"), true),
            IngestError::Rejected(m) => (rc::PAYLOAD_FORMAT_INVALID, m.clone(), true),
            IngestError::NotGateway | IngestError::ForeignDevice(_) => (rc::NOT_AUTHORIZED, e.to_string(), true),
            IngestError::BadCredential | IngestError::DeviceGone => {
                return Done { close: Some((rc::NOT_AUTHORIZED, "device deleted".into())), ..Default::default() };
            }
            IngestError::Overloaded | IngestError::DiskFull(_) => (rc::QUOTA_EXCEEDED, e.to_string(), false),
            IngestError::Limit(m) => (rc::QUOTA_EXCEEDED, m.clone(), false),
            IngestError::Unavailable(_) | IngestError::Failed(_) => (rc::UNSPECIFIED_ERROR, e.to_string(), false),
        },
    };
    if bad {
        st.mqtt_metrics.bad_publishes.fetch_add(1, Ordering::Relaxed);
        // One line per rejected message, never with the payload.
        crate::logging::warn_limited!(%device, topic, error = %text, "rejected MQTT publish");
    }
    if version == ProtocolVersion::V5 {
        // MQTT 5 can say what was wrong and keep the connection (QoS 0 cannot be answered).
        Done { ack: ack(reason, Some(text)), ..Default::default() }
    } else {
        // MQTT 3.1.1 has no negative acknowledgement: closing is the only honest answer.
        Done { close: Some((reason, text)), ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::OutWindow;

    #[test]
    fn the_outbound_window_never_reuses_an_id_in_flight_even_across_the_wrap() {
        let mut w = OutWindow::new(3, false);
        let first = w.take_id();
        assert_eq!(w.room(), 2);
        // Cycle through the whole id space twice with `first` still unacknowledged.
        for _ in 0..(2 * 65_535) {
            let id = w.take_id();
            assert_ne!(id, first, "id {first} is still in flight");
            assert_ne!(id, 0);
            assert!(w.release(id));
        }
        assert_eq!(w.room(), 2);
        assert!(w.release(first));
        assert!(!w.release(first), "a second PUBACK for the same id frees nothing");
        assert_eq!(w.room(), 3);
    }
}
