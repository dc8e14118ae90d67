//! One MQTT connection: CONNECT and authentication, then a loop that reads packets,
//! hands publishes to the ThingsBoard topic layer, writes acknowledgements **in order and
//! only after the durable commit**, publishes server-originated messages, and enforces
//! keep-alive. Buffers are allocated only while there is something in them, so an idle
//! connection holds no read or write buffer.
//!
//! Here: the connection's state ([`Conn`]), its life from accept to close ([`run`]) and the
//! read/acknowledge loop (`serve`). [`handshake`]: CONNECT to CONNACK. [`inbound`]: what the
//! client sends. [`outbound`]: what the server sends it, and its window.

use std::collections::VecDeque;

use rustc_hash::FxHashSet as HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::stream::{FuturesOrdered, StreamExt};
use gridlinks_broker::acl::{Acl, Action, Permission, Rule};
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
use crate::Mqtt;
use gridlinks_ingest::{IngestError, Item};
use gridlinks_platform::auth::AuthError;
use gridlinks_platform::device_api::{self, Reply, TopicError};
use gridlinks_platform::logging::spawn_logged;
use gridlinks_thingsboard::topic::{ATTRIBUTES as ATTRIBUTES_TOPIC, TELEMETRY as TELEMETRY_TOPIC};

mod aliases;
mod handshake;
mod inbound;
mod outbound;
mod provision;

use gridlinks_platform::config::DenyAction;
pub(crate) use inbound::message;
use inbound::{may_publish, mounted, Batch};
use outbound::{OutWindow, OUTBOUND_WINDOW};

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
    /// A publish was refused by a rate limit of the tenant profile (`mqtt.rate_limit_pause`).
    rate_limited: bool,
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
    st: Arc<Mqtt>,
    rbuf: BytesMut,
    wbuf: BytesMut,
    version: ProtocolVersion,
    /// MQTT 5 topic aliases both ways; allocated on first use.
    aliases: Option<Box<aliases::Aliases>>,
    /// Session expiry interval in force (pub/sub clients; 0: ends with the connection).
    expiry: u32,
    /// The client's DISCONNECT asked for this session expiry (MQTT 5).
    disconnect_expiry: Option<u32>,
    /// Durable queue rows of copies the client acknowledged, to delete.
    acked_rows: Vec<BrokerRow>,
    /// A pub/sub client's session id (its durable rows are keyed by it): the client id, in
    /// its tenant's namespace for a tenant other than the first (`gridlinks_platform::sessions::mount_of`).
    client_id: Option<Arc<str>>,
    /// The client's Maximum Packet Size (MQTT 5 CONNECT); larger packets are not sent.
    max_out: usize,
    /// [`Flags::CONGESTED`], [`Flags::LEAN_ACKS`].
    flags: Flags,
    /// Publishes in flight beyond one per pending item (batches answer many), plus those
    /// of the batch being built: with `pending.len()`, the in-flight count.
    extra_in_flight: usize,
    /// The client's QoS 1 and 2 publishes not answered yet (PUBACK, PUBCOMP, or a refusing
    /// PUBREC queued), as its Receive Maximum counts them.
    quota_used: u16,
}

/// A connection's small flags, in one byte: every connection's task is bounded in size.
#[derive(Clone, Copy, Default)]
struct Flags(u8);

impl Flags {
    /// A publish of this client met a full subscriber queue (its QoS 0 copy was dropped):
    /// let other tasks, that subscriber's among them, run before reading more.
    const CONGESTED: u8 = 1;
    /// The client's Request Problem Information was 0 (MQTT 5): no reason string or user
    /// properties on acknowledgements (only PUBLISH, CONNACK and DISCONNECT may carry them).
    const LEAN_ACKS: u8 = 2;
    /// A publish was refused by a rate limit of the tenant profile: pause reading.
    const RATE_LIMITED: u8 = 4;
    /// Reading is paused (`mqtt.rate_limit_pause`) until the keep-alive timer fires.
    const PAUSED: u8 = 8;

    fn has(self, f: u8) -> bool {
        self.0 & f != 0
    }

    fn set(&mut self, f: u8) {
        self.0 |= f;
    }

    /// Whether `f` was set; it is not any more.
    fn take(&mut self, f: u8) -> bool {
        let had = self.has(f);
        self.0 &= !f;
        had
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
impl Mqtt {
    /// The pub/sub client an application's login makes: its ACL (with the configured
    /// rules) and, for another tenant's client, its session keyed in its namespace (the same
    /// client id in two tenants is two sessions).
    fn application(&self, login: gridlinks_platform::broker_clients::AppLogin, user: &str, client_id: Arc<str>) -> Who {
        let acl = self.client_acl(&login.acl, Some(user), &client_id);
        let id = match &login.mount {
            Some(m) => format!("{m}{client_id}").into(),
            None => client_id,
        };
        Who::Client { id, owner: user.into(), acl }
    }
}

/// `async fn`, and to be spawned as it is: its future then holds the stream once, in the
/// connection, not also as an argument or in a wrapping future (every byte counts once per
/// connection).
pub fn run<T: Transport, G: Send + 'static>(stream: T, st: Arc<Mqtt>, guard: G) -> impl Future<Output = ()> + Send {
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
        aliases: None,
        expiry: 0,
        disconnect_expiry: None,
        acked_rows: Vec::new(),
        client_id: None,
        max_out: usize::MAX,
        flags: Flags::default(),
        extra_in_flight: 0,
        quota_used: 0,
    };
    // `conn` and `guard` are used in place, as captured: a `let` binding (or an `async fn`
    // argument) would give each a second slot in the future.
    async move {
        let _hold = &guard;
        let st = conn.st.clone();
        let timeout = st.core.cfg.mqtt.connect_timeout.duration();
        let mut connect = match Box::pin(tokio::time::timeout(timeout, conn.read_connect())).await {
            Ok(Some(c)) => c,
            _ => {
                st.metrics.connects_refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        conn.version = connect.protocol;
        if connect.properties.request_problem_information == Some(0) {
            conn.flags.set(Flags::LEAN_ACKS);
        }
        if let Some(max) = connect.properties.maximum_packet_size {
            conn.max_out = usize::try_from(max).unwrap_or(usize::MAX);
        }
        if let Some(max) =
            connect.properties.topic_alias_maximum.filter(|m| *m > 0 && conn.st.core.cfg.mqtt.topic_aliases_out)
        {
            conn.aliases = Some(Box::new(aliases::Aliases::towards(max.min(TOPIC_ALIAS_MAX))));
        }
        // ThingsBoard's provisioning user name: a short exchange, no session.
        if connect.username.as_deref() == Some("provision") && connect.password.as_deref().is_none_or(<[u8]>::is_empty)
        {
            drop(connect);
            Box::pin(conn.provision()).await;
            return;
        }
        // Boxed, as reading the CONNECT above: the handshake's state (timer, storage and
        // credential checks) would otherwise size every connection's task for its whole life.
        let Some(Admitted { who, link, durable, _slot }) = Box::pin(conn.admit(&connect)).await else {
            st.metrics.connects_refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        st.metrics.connects.fetch_add(1, Ordering::Relaxed);
        st.metrics.connections.fetch_add(1, Ordering::Relaxed);
        conn.session = link.id;
        match &who {
            Who::Client { id, .. } => conn.client_id = Some(id.clone()),
            Who::Device(device) => {
                st.core.activity.connected(*device);
            }
        }
        conn.rate = RateLimit::new(st.core.cfg.mqtt.rate_limit_messages).map(Box::new);
        let v5 = connect.protocol == ProtocolVersion::V5;
        let keep_alive = handshake::keep_alive(connect.keep_alive, st.core.cfg.mqtt.max_keep_alive, v5).0;
        let mut window = OutWindow::new(
            connect.properties.receive_maximum.map_or(OUTBOUND_WINDOW, |m| m.min(OUTBOUND_WINDOW)),
            durable,
        );
        // Devices' wills are not published: their topics are the device API's.
        let will = match &who {
            Who::Client { id, .. } => connect.will.take().map(|mut w| {
                if let Some(m) = gridlinks_platform::sessions::mount_of(id) {
                    w.topic = format!("{m}{}", w.topic);
                }
                Box::new(w)
            }),
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
                st.devices.sessions.unregister(*device, link.id);
                st.core.activity.disconnected(*device);
                Unregistered::Ended
            }
            Who::Client { id, .. } => {
                if let Some(x) = conn.disconnect_expiry.filter(|_| conn.expiry > 0) {
                    conn.expiry = x.min(st.core.cfg.mqtt.max_session_expiry);
                    st.devices.sessions.set_expiry(id, &link, conn.expiry);
                }
                st.devices.sessions.unregister_client(id, &link, window.unacked())
            }
        };
        conn.last_flush(&link);
        if let End::Disconnect(reason, text) = end {
            conn.disconnect(reason, &text).await;
        }
        if let Who::Client { id, owner, .. } = &who {
            match left {
                Unregistered::Parked { expiry, epoch } => {
                    let row = pubsub::session_row(&st, id, owner, expiry, Some(gridlinks_types::Ts::now().0));
                    let writer = st.core.writer.clone();
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
        st.metrics.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection whose CONNECT was accepted.
struct Admitted {
    who: Who,
    link: SessionLink,
    /// Its copies may have durable queue rows (a persistent session, now or resumed).
    durable: bool,
    /// Its place in `mqtt.max_connections_per_credential`, held until it closes.
    _slot: Option<gridlinks_platform::sessions::CredentialSlot>,
}

impl<T: Transport> Conn<T> {
    /// Reads bytes into the read buffer; false on EOF or error.
    async fn fill(&mut self) -> bool {
        self.stream.fill(&mut self.rbuf).await
    }

    fn decode(&mut self) -> Result<Option<Packet>, DecodeError> {
        let r = decode(&mut self.rbuf, self.version, self.st.core.cfg.mqtt.max_packet_size);
        if self.rbuf.is_empty() {
            // Idle connections keep no read buffer.
            self.rbuf = BytesMut::new();
        }
        r
    }

    /// Encodes `p` into the write buffer; false when it was not queued. A packet larger
    /// than the client's Maximum Packet Size goes without its reason string and user
    /// properties if that makes it fit (MQTT 5 §3.1.2.11.4), else not at all (counted).
    fn queue(&mut self, p: &Packet) -> bool {
        // The answer that gives the client its Receive Maximum quota back.
        if matches!(p, Packet::PubAck(_) | Packet::PubComp(_)) || matches!(p, Packet::PubRec(r) if r.reason >= 0x80) {
            self.quota_used = self.quota_used.saturating_sub(1);
        }
        if self.flags.has(Flags::LEAN_ACKS) && !matches!(p, Packet::Disconnect(_)) {
            if let Some(lean) = without_diagnostics(p) {
                return self.queue(&lean);
            }
        }
        let start = self.wbuf.len();
        if let Err(e) = encode(p, self.version, &mut self.wbuf) {
            gridlinks_platform::logging::error_limited!(error = %e, packet = p.name(), "cannot encode MQTT packet; closing the connection");
            self.broken = true;
            return false;
        }
        if self.fits(start) {
            return true;
        }
        match without_diagnostics(p) {
            Some(lean) => self.queue(&lean),
            None => {
                self.st.metrics.too_large.fetch_add(1, Ordering::Relaxed);
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
        let receive_maximum = st.core.cfg.mqtt.receive_maximum;
        // MQTT 5 clients are held to the Receive Maximum they were told: reading goes on
        // past it (up to twice the window of pending work), and a QoS 1/2 PUBLISH beyond it
        // ends the connection with 0x93. Otherwise (3.1.1, or mqtt.receive_maximum_lenient)
        // a full window stops reading: backpressure.
        let strict = self.version == ProtocolVersion::V5 && !st.core.cfg.mqtt.receive_maximum_lenient;
        let max_in_flight = usize::from(receive_maximum) * if strict { 2 } else { 1 };
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
            // After a rate-limit refusal nothing is read or decoded for a while; the
            // keep-alive timer (not checked meanwhile) ends the pause, so that the pause adds
            // no state to every connection's task.
            if self.flags.take(Flags::RATE_LIMITED) && !self.flags.has(Flags::PAUSED) {
                let pause = st.core.cfg.mqtt.rate_limit_pause.duration();
                if !pause.is_zero() {
                    self.flags.set(Flags::PAUSED);
                    // Half to one and a half times the pause, spread by the clock's
                    // nanoseconds: a tenant's connections refused at once do not all come
                    // back at once (in step, each second's burst showed in other tenants' p99).
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.subsec_nanos());
                    let spread = pause.mul_f64(f64::from(nanos % 1024) / 1024.0);
                    ka_timer.as_mut().reset(Instant::now() + pause / 2 + spread);
                }
            }
            let paused = self.flags.has(Flags::PAUSED);
            // Decode what is buffered, up to the in-flight limit: packets that came with the
            // CONNECT, or were left in the buffer by backpressure, must not wait for new bytes.
            // Device publishes among them go as one batch.
            let mut batch: Option<Box<Batch>> = None;
            while ending.is_none()
                && !paused
                && pending.as_ref().map_or(0, |p| p.len()) + self.extra_in_flight < max_in_flight
            {
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
                    Ok(Some(Packet::Publish(p)))
                        if p.qos != QoS::AtMostOnce && strict && self.quota_used >= receive_maximum =>
                    {
                        st.metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        let text =
                            format!("more than Receive Maximum ({receive_maximum}) QoS 1 and 2 publishes unanswered");
                        ending = Some(End::Disconnect(rc::RECEIVE_MAXIMUM_EXCEEDED, text));
                        drop(p);
                    }
                    Ok(Some(p)) => {
                        if matches!(&p, Packet::Publish(p) if p.qos != QoS::AtMostOnce) {
                            self.quota_used = self.quota_used.saturating_add(1);
                        }
                        let queue = pending.get_or_insert_default();
                        ending = self.on_packet(p, who, link, queue, &mut batch);
                    }
                    Err(e) => {
                        st.metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
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
            if self.flags.take(Flags::CONGESTED) {
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
            let can_read = ending.is_none() && !eof && !paused && in_flight + self.extra_in_flight < max_in_flight;
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
                            st.metrics.too_slow.fetch_add(1, Ordering::Relaxed);
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
                _ = &mut ka_timer, if (keep_alive.is_some() || paused) && ending.is_none() && !eof => {
                    let ka = keep_alive.unwrap_or(far);
                    if self.flags.take(Flags::PAUSED) {
                        // Nothing was read meanwhile: the client's silence was not its own.
                        last_seen = Instant::now();
                        ka_timer.as_mut().reset(last_seen + ka);
                    } else if last_seen.elapsed() >= ka {
                        st.metrics.keepalive_timeouts.fetch_add(1, Ordering::Relaxed);
                        ending = Some(End::Disconnect(rc::KEEP_ALIVE_TIMEOUT, "keep alive timeout".into()));
                    } else {
                        ka_timer.as_mut().reset(last_seen + ka);
                    }
                }
            }
        }
    }

    /// Writes what a completed in-flight item produced; `Some` ends the connection.
    fn finish(&mut self, done: Done, link: &SessionLink, window: &mut OutWindow) -> Option<End> {
        self.extra_in_flight -= done.extra;
        if done.rate_limited {
            self.flags.set(Flags::RATE_LIMITED);
        }
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

/// The acknowledgement of a PUBLISH: PUBACK (QoS 1), PUBREC (QoS 2), none (QoS 0).
fn pub_ack(qos: QoS, packet_id: Option<u16>, reason: u8, text: Option<String>) -> Option<Packet> {
    let r = resp(packet_id?, reason, text);
    match qos {
        QoS::AtMostOnce => None,
        QoS::AtLeastOnce => Some(Packet::PubAck(r)),
        QoS::ExactlyOnce => Some(Packet::PubRec(r)),
    }
}

fn ready(ack: Option<Packet>) -> InFlight {
    Box::pin(std::future::ready(Done { ack, reply: None, close: None, ..Default::default() }))
}

#[cfg(test)]
mod tests {
    use super::{run, Conn};
    use tokio::net::TcpStream;

    /// The size of what `f` returns, without calling it.
    fn returned_size<A, B, C, R>(_: fn(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every connection is one task of this size, idle or not (buffers are allocated only
    /// while they hold bytes): it sets the server's memory per idle connection, which the
    /// `connect` benchmark compares with Mosquitto's (docs/benchmarks.md). A change that
    /// grows it must say why, here.
    #[test]
    fn a_connection_task_stays_small() {
        let task = returned_size(run::<TcpStream, ()>);
        let conn = std::mem::size_of::<Conn<TcpStream>>();
        eprintln!("connection task: {task} bytes, of which the connection {conn}");
        assert!(task <= 896, "the per-connection task grew to {task} bytes");
        assert!(conn <= 224, "the connection state grew to {conn} bytes");
    }
}
