//! ThingsBoard's WebSocket API for live telemetry: `ws://host/api/ws` (first message
//! `{"authCmd": {"cmdId", "token"}}`, commands in `cmds`) and the older
//! `ws://host/api/ws/plugins/telemetry?token=JWT` (`tsSubCmds`, `historyCmds`). The commands
//! and update JSON are `gridlinks_thingsboard::ws`'s.
//!
//! A `TIMESERIES` subscription answers with the current values (or the points of its time
//! window), then with every committed change of the device; an `ATTRIBUTES` subscription
//! the same for its attributes (of one scope, or all); an `ENTITY_DATA` command with a
//! page of devices (filtered by key filters, sorted by any key), then the changes of their
//! keys it follows ([`entity`]); an `ENTITY_COUNT` with the count, then the count again
//! whenever a recount (`ws.count_refresh`) finds it changed. Changes come from the same
//! fan-out as the canonical MQTT topics (`crate::mqtt::telemetry_topics`), after the durable
//! commit and never before.
//!
//! Each subscription is checked as the REST paths check a device (`Caller::may_use`), at
//! subscription and again at every delivery (an unassigned device stops at once). The
//! session's token is checked again at every ping, so a deleted user's session ends
//! within `ws.ping_interval`; it ends at the token's expiry too.
//!
//! Every session is bounded:
//! - its queue of updates (`ws.queue`): a session that falls that far behind is closed,
//!   and nothing waits on it;
//! - its subscriptions (`ws.max_subscriptions`), and those of all its user's sessions
//!   (`ws.max_subscriptions_per_user`) and its tenant's (`ws.max_subscriptions_per_tenant`);
//!   a user holds at most `ws.max_sessions_per_user` sessions;
//! - its messages (`ws.max_message_bytes`): a larger one closes the session with 1009 and
//!   the reason;
//! - its silence (`ws.idle_timeout`; pings go out after `ws.ping_interval`), and the time
//!   it has to authenticate (`ws.auth_timeout`).

pub(crate) mod alarm;
pub(crate) mod entity;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use gridlinks_storage::query::{HistoryQuery, Order};
use gridlinks_storage::{StoreError, Timeseries};
use gridlinks_thingsboard::ws::{
    self as proto, code, AlarmQuery, AttrSub, Cmd, EntityDataCmd, EntityQuery, HistoryCmd, TsSub,
};
use gridlinks_types::{AttributeScope, DeviceId, Ts, TsRecord, Value};
use parking_lot::RwLock;
use serde::Deserialize;
use serde_json::Value as J;
use tokio::sync::{mpsc, Notify};

use crate::state::Http;
use gridlinks_platform::auth::{Auth, Caller};
use gridlinks_platform::entities::ServiceError;
use gridlinks_platform::limits::Limit;
use gridlinks_platform::Core;

/// The least time between two refreshes of a session's alarm subscriptions.
const ALARM_REFRESH: Duration = Duration::from_millis(250);

/// A session's outgoing queue, as the hub sees it.
struct Outbox {
    tx: mpsc::Sender<Utf8Bytes>,
    /// Set when an update found the queue full: the session closes.
    overflowed: AtomicBool,
    wake: Notify,
}

impl Outbox {
    fn push(&self, text: String) {
        if self.tx.try_send(text.into()).is_err() && !self.overflowed.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }
}

/// What a subscription follows.
#[derive(Clone)]
enum Kind {
    Telemetry,
    /// One scope's attributes, or all scopes'.
    Attributes(Option<AttributeScope>),
    /// One device of an `ENTITY_DATA` page.
    Entity(Arc<entity::EntityKeys>),
}

/// One subscribing command; the devices it follows share it (an `ENTITY_DATA` page of
/// 1,000 devices costs a pointer per device, not a copy of its keys and caller).
struct Sub {
    session: u64,
    cmd_id: i64,
    kind: Kind,
    keys: Option<Vec<String>>,
    caller: Arc<Caller>,
    out: Arc<Outbox>,
}

/// The subscriptions by device, and how many each user, tenant and customer holds.
#[derive(Default)]
struct Table {
    by_device: HashMap<DeviceId, Vec<Arc<Sub>>>,
    per_user: HashMap<uuid::Uuid, usize>,
    per_tenant: HashMap<uuid::Uuid, usize>,
    per_customer: HashMap<uuid::Uuid, usize>,
}

/// Takes `n` off `key`'s count, dropping the entry at zero.
fn uncount(counts: &mut HashMap<uuid::Uuid, usize>, key: uuid::Uuid, n: usize) {
    if let Some(c) = counts.get_mut(&key) {
        *c = c.saturating_sub(n);
        if *c == 0 {
            counts.remove(&key);
        }
    }
}

/// The live subscriptions of every session, by device.
#[derive(Default)]
pub struct Hub {
    subs: RwLock<Table>,
    count: AtomicUsize,
    next_session: AtomicU64,
    sessions: AtomicUsize,
    /// Open sessions per user, tenant and customer (ids of different kinds never meet).
    user_sessions: parking_lot::Mutex<HashMap<uuid::Uuid, usize>>,
}

/// A user's session, counted against `ws.max_sessions_per_user` and its tenant profile's
/// `maxWsSessionsPerTenant` and `…PerCustomer` while it lives.
struct UserSession {
    hub: Arc<Hub>,
    user: uuid::Uuid,
    /// The user, its tenant and its customer.
    owners: Vec<uuid::Uuid>,
}

impl Drop for UserSession {
    fn drop(&mut self) {
        let mut open = self.hub.user_sessions.lock();
        for o in &self.owners {
            uncount(&mut open, *o, 1);
        }
    }
}

/// Committed data reaches the WebSocket API's subscriptions through the platform's live
/// fan-out (`gridlinks_platform::live`), the same path as the canonical MQTT topics.
impl gridlinks_platform::live::LiveSink for Hub {
    fn wants_telemetry(&self) -> bool {
        self.interested()
    }
    fn wants_attributes(&self) -> bool {
        self.interested()
    }
    fn telemetry<'a>(
        &'a self,
        device: &'a gridlinks_storage::DeviceRecord,
        tenant: uuid::Uuid,
        records: &'a [TsRecord],
    ) -> Option<gridlinks_ingest::BoxFuture<'a, Result<(), StoreError>>> {
        self.deliver(device.id, "DEVICE", tenant, device.customer, records);
        None
    }
    fn asset_telemetry(&self, asset: &gridlinks_platform::live::Owner, records: &[TsRecord]) {
        self.deliver(asset.id, "ASSET", asset.tenant, asset.customer, records);
    }
    fn asset_attributes(
        &self,
        asset: &gridlinks_platform::live::Owner,
        scope: AttributeScope,
        values: &[(String, Value)],
        now: Ts,
    ) {
        self.deliver_attributes(asset.id, "ASSET", asset.tenant, asset.customer, scope, values, now);
    }
    fn attributes(
        &self,
        device: &gridlinks_storage::DeviceRecord,
        tenant: uuid::Uuid,
        scope: AttributeScope,
        values: &[(String, Value)],
        now: Ts,
    ) {
        self.deliver_attributes(device.id, "DEVICE", tenant, device.customer, scope, values, now);
    }
}

impl Hub {
    /// Open sessions.
    pub fn sessions(&self) -> usize {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Subscriptions of every session (an `ENTITY_DATA` page's devices count one each).
    pub fn subscriptions(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Whether any session subscribes to anything (a lock-free read for the commit path).
    pub fn interested(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Delivers committed telemetry of `device` (an entity of `entity_type`, `DEVICE` or
    /// `ASSET`, of `tenant`, assigned to `customer`) to its subscriptions whose caller may
    /// still see it.
    pub fn deliver(
        &self,
        device: DeviceId,
        entity_type: &'static str,
        tenant: uuid::Uuid,
        customer: Option<uuid::Uuid>,
        records: &[TsRecord],
    ) {
        let subs = self.subs.read();
        let Some(list) = subs.by_device.get(&device) else { return };
        for s in list.iter().filter(|s| s.caller.may_use(tenant, customer)) {
            match &s.kind {
                Kind::Telemetry => {}
                Kind::Entity(keys) => {
                    if let Some(u) = entity::telemetry_update(device, entity_type, keys, records) {
                        s.out.push(proto::entity_update(s.cmd_id, vec![u]).to_string());
                    }
                    continue;
                }
                Kind::Attributes(_) => continue,
            }
            let series = points_by_key(records, |k| s.keys.as_ref().is_none_or(|keys| keys.iter().any(|x| x == k)));
            if !series.is_empty() {
                s.out.push(proto::update(s.cmd_id, series).to_string());
            }
        }
    }

    /// Delivers committed attribute changes of `device` (as [`Hub::deliver`]), stamped `now`.
    #[allow(clippy::too_many_arguments)] // one per part of the change, as `deliver`
    pub fn deliver_attributes(
        &self,
        device: DeviceId,
        entity_type: &'static str,
        tenant: uuid::Uuid,
        customer: Option<uuid::Uuid>,
        scope: AttributeScope,
        values: &[(String, Value)],
        now: Ts,
    ) {
        let subs = self.subs.read();
        let Some(list) = subs.by_device.get(&device) else { return };
        for s in list.iter().filter(|s| s.caller.may_use(tenant, customer)) {
            let wanted = match &s.kind {
                Kind::Attributes(wanted) => *wanted,
                Kind::Entity(keys) => {
                    if let Some(u) = entity::attribute_update(device, entity_type, keys, scope, values, now.0) {
                        s.out.push(proto::entity_update(s.cmd_id, vec![u]).to_string());
                    }
                    continue;
                }
                Kind::Telemetry => continue,
            };
            if wanted.is_some_and(|w| w != scope) {
                continue;
            }
            let series: Vec<(&str, Vec<(i64, String)>)> = values
                .iter()
                .filter(|(k, _)| s.keys.as_ref().is_none_or(|keys| keys.contains(k)))
                .map(|(k, v)| (k.as_str(), vec![(now.0, v.to_display_string())]))
                .collect();
            if !series.is_empty() {
                s.out.push(proto::update(s.cmd_id, series).to_string());
            }
        }
    }

    /// Subscribes `sub` to `devices`, within its user's, tenant's and customer's bounds
    /// (why not, if not).
    fn add(&self, devices: &[DeviceId], sub: Sub, core: &Core) -> Result<(), String> {
        let cfg = &core.cfg.ws;
        let profile = core.limits.ws(sub.caller.tenant);
        let mut subs = self.subs.write();
        let n = devices.len();
        let (user, tenant) = (sub.caller.user, sub.caller.tenant);
        let over = |held: usize, max: u64| max > 0 && (held + n) as u64 > max;
        if over(subs.per_tenant.get(&tenant).copied().unwrap_or(0), profile.subscriptions_per_tenant) {
            return Err(core.limits.ws_refusal(&profile, Limit::WsSubscriptionsPerTenant));
        }
        if let Some(c) = sub.caller.customer {
            if over(subs.per_customer.get(&c).copied().unwrap_or(0), profile.subscriptions_per_customer) {
                return Err(core.limits.ws_refusal(&profile, Limit::WsSubscriptionsPerCustomer));
            }
        }
        let held = subs.per_user.get(&user).copied().unwrap_or(0);
        if over(held, profile.subscriptions_per_user) {
            return Err(core.limits.ws_refusal(&profile, Limit::WsSubscriptionsPerUser));
        }
        let max_user = cfg.max_subscriptions_per_user;
        if held + n > max_user {
            return Err(format!("too many subscriptions: at most {max_user} per user (ws.max_subscriptions_per_user)"));
        }
        let max_tenant = cfg.max_subscriptions_per_tenant;
        if subs.per_tenant.get(&tenant).copied().unwrap_or(0) + n > max_tenant {
            return Err(format!(
                "too many subscriptions: at most {max_tenant} per tenant (ws.max_subscriptions_per_tenant)"
            ));
        }
        *subs.per_user.entry(user).or_default() += n;
        *subs.per_tenant.entry(tenant).or_default() += n;
        if let Some(c) = sub.caller.customer {
            *subs.per_customer.entry(c).or_default() += n;
        }
        let sub = Arc::new(sub);
        for &device in devices {
            subs.by_device.entry(device).or_default().push(sub.clone());
        }
        self.count.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Counts a session of `caller` within `ws.max_sessions_per_user` and its tenant
    /// profile's bounds; why not, if not.
    fn open_session(self: &Arc<Self>, caller: &Caller, core: &Core) -> Result<UserSession, String> {
        let profile = core.limits.ws(caller.tenant);
        let max_user = core.cfg.ws.max_sessions_per_user;
        // The user's bound: the profile's where it is the lower (a refusal naming it).
        let user_bound = match profile.sessions_per_user {
            p if p > 0 && p < max_user as u64 => (caller.user, p, Some(Limit::WsSessionsPerUser)),
            _ => (caller.user, max_user as u64, None),
        };
        let mut bounds =
            vec![user_bound, (caller.tenant, profile.sessions_per_tenant, Some(Limit::WsSessionsPerTenant))];
        if let Some(c) = caller.customer {
            bounds.push((c, profile.sessions_per_customer, Some(Limit::WsSessionsPerCustomer)));
        }
        let mut open = self.user_sessions.lock();
        for &(owner, max, limit) in &bounds {
            let held = open.get(&owner).copied().unwrap_or(0) as u64;
            if (limit.is_none() || max > 0) && held >= max {
                return Err(match limit {
                    Some(l) => core.limits.ws_refusal(&profile, l),
                    None => format!("too many sessions: at most {max_user} per user (ws.max_sessions_per_user)"),
                });
            }
        }
        for &(owner, ..) in &bounds {
            *open.entry(owner).or_default() += 1;
        }
        Ok(UserSession { hub: self.clone(), user: caller.user, owners: bounds.iter().map(|b| b.0).collect() })
    }

    /// Ends command `cmd_id` of `session`, which follows `devices`: only their lists are
    /// touched, however many subscriptions other sessions hold.
    fn remove(&self, session: u64, cmd_id: i64, devices: &[DeviceId]) {
        let mut guard = self.subs.write();
        let subs = &mut *guard;
        for device in devices {
            let Some(list) = subs.by_device.get_mut(device) else { continue };
            let Some(at) = list.iter().position(|s| s.session == session && s.cmd_id == cmd_id) else { continue };
            let gone = list.swap_remove(at);
            if list.is_empty() {
                subs.by_device.remove(device);
            }
            uncount(&mut subs.per_user, gone.caller.user, 1);
            uncount(&mut subs.per_tenant, gone.caller.tenant, 1);
            if let Some(c) = gone.caller.customer {
                uncount(&mut subs.per_customer, c, 1);
            }
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// `?token=` of the older endpoint.
#[derive(Deserialize)]
pub struct TokenParam {
    token: Option<String>,
}

/// The upgrade with the session's bounds. Buffers start small (tungstenite's default is
/// 128 KiB each way): commands and updates are small, and every idle session pays them.
/// The socket itself takes messages up to [`socket_bound`], so that one over
/// `ws.max_message_bytes` is read whole and answered with a close frame saying why (a
/// socket closed with unread bytes resets, and the client never reads the reason).
fn bounded(ws: WebSocketUpgrade, h: &Http) -> WebSocketUpgrade {
    let max = socket_bound(h.core.cfg.ws.max_message_bytes);
    ws.max_message_size(max).max_frame_size(max).read_buffer_size(4096).write_buffer_size(4096)
}

/// The most a session's socket reads of one message: 16 times `ws.max_message_bytes`,
/// at least 1 MiB.
fn socket_bound(max_message_bytes: usize) -> usize {
    max_message_bytes.saturating_mul(16).max(1 << 20)
}

/// `GET /api/ws`: the first message authenticates (`authCmd`).
pub async fn upgrade(ws: WebSocketUpgrade, State(h): State<Http>) -> Response {
    bounded(ws, &h).on_upgrade(move |socket| serve(h, socket, None))
}

/// `GET /api/ws/plugins/telemetry?token=JWT`.
pub async fn upgrade_legacy(ws: WebSocketUpgrade, State(h): State<Http>, Query(p): Query<TokenParam>) -> Response {
    bounded(ws, &h).on_upgrade(move |socket| serve(h, socket, Some(p.token.unwrap_or_default())))
}

/// The caller of a token and when the token expires (seconds), if it is valid.
async fn authenticate(auth: &Auth, token: &str) -> Option<(Caller, i64)> {
    auth.access_with_expiry(token).await.ok()
}

/// The close code for a message over the size bound (RFC 6455: message too big).
const TOO_BIG: u16 = 1009;

/// A session's state while it runs.
struct Session {
    h: Http,
    id: u64,
    out: Arc<Outbox>,
    caller: Option<(Arc<Caller>, i64)>,
    /// The session counted against its user's `ws.max_sessions_per_user`.
    counted: Option<UserSession>,
    token: String,
    /// The devices of each `ENTITY_DATA` command's page (a later command with the same
    /// `cmdId` and no query follows them).
    /// Each `ENTITY_DATA` command's page: its entities' ids and types.
    pages: HashMap<i64, Vec<(DeviceId, &'static str)>>,
    /// The devices each subscribing command follows in the hub.
    followed: HashMap<i64, Vec<DeviceId>>,
    /// Each `ENTITY_COUNT` subscription's query and the count last sent.
    counts: HashMap<i64, (Arc<EntityQuery>, usize)>,
    /// Each `ALARM_DATA` subscription's query and the answer last sent.
    alarm_pages: HashMap<i64, (Arc<AlarmQuery>, J)>,
    /// Each `ALARM_COUNT` subscription's query and the count last sent.
    alarm_counts: HashMap<i64, (Arc<AlarmQuery>, usize)>,
}

enum Next {
    Go,
    /// Close, with the last error update's code and message, if any.
    Close(Option<(u8, String)>),
}

/// Why a session ends.
enum End {
    /// Just the close (the client went away, the socket failed, or the last answer said
    /// why).
    Quiet,
    /// An error update with this code and message, then the close.
    Error(u8, String),
    /// A close frame with this code and reason (a message too large).
    Close(u16, String),
}

async fn serve(h: Http, socket: WebSocket, token: Option<String>) {
    let cfg = h.core.cfg.ws.clone();
    let (tx, mut rx) = mpsc::channel(cfg.queue.max(1));
    let out = Arc::new(Outbox { tx, overflowed: AtomicBool::new(false), wake: Notify::new() });
    let id = h.ws.next_session.fetch_add(1, Ordering::Relaxed);
    let _open = Open::count(&h.ws.sessions);
    let (mut sink, mut stream) = socket.split();
    let mut s = Session {
        h: h.clone(),
        id,
        out: out.clone(),
        caller: None,
        counted: None,
        token: String::new(),
        pages: HashMap::new(),
        followed: HashMap::new(),
        counts: HashMap::new(),
        alarm_pages: HashMap::new(),
        alarm_counts: HashMap::new(),
    };
    if let Some(t) = token {
        if let Err((code, why)) = s.authenticate(t).await {
            let e = proto::error(0, code, &why).to_string();
            let _ = sink.send(Message::Text(e.into())).await;
            let _ = sink.close().await;
            return;
        }
    }
    let max_message = cfg.max_message_bytes;
    let too_big = |n: usize| {
        End::Close(TOO_BIG, format!("message of {n} bytes is larger than ws.max_message_bytes ({max_message})"))
    };
    let idle = cfg.idle_timeout.duration();
    let ping = cfg.ping_interval.duration();
    let mut last_heard = tokio::time::Instant::now();
    let auth_deadline = last_heard + cfg.auth_timeout.duration();
    let mut ticker = tokio::time::interval(ping);
    ticker.tick().await;
    // Alarm subscriptions are answered again after an alarm changed, at most every
    // ALARM_REFRESH (a burst of changes is one refresh).
    let mut alarm_changes = h.core.alarms.changes();
    let mut alarm_due: Option<tokio::time::Instant> = None;
    let mut alarms_refreshed = tokio::time::Instant::now();
    let mut recount = tokio::time::interval(cfg.count_refresh.duration());
    recount.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recount.tick().await;
    // One timer for the token's expiry, moved only when an authCmd changes the token (not
    // made anew for every message and update that passes through the loop).
    let token_end = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(token_end);
    let mut expiry_set = None;
    let end = loop {
        let expiry = s.caller.as_ref().map(|c| c.1);
        if expiry != expiry_set {
            let secs = expiry.map_or(0, |e| u64::try_from(e - Ts::now().0 / 1000).unwrap_or(0));
            token_end.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(secs));
            expiry_set = expiry;
        }
        tokio::select! {
            msg = stream.next() => {
                last_heard = tokio::time::Instant::now();
                let text = match msg {
                    Some(Ok(Message::Text(t))) if t.len() > max_message => break too_big(t.len()),
                    Some(Ok(Message::Binary(b))) if b.len() > max_message => break too_big(b.len()),
                    Some(Ok(Message::Text(t))) => t,
                    // Larger than the socket's own bound: its length is not known.
                    Some(Err(e)) if is_capacity(&e) => break End::Close(TOO_BIG, format!("message larger than ws.max_message_bytes ({max_message})")),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break End::Quiet,
                    Some(Ok(Message::Binary(_))) => {
                        let e = proto::error(0, code::BAD_REQUEST, "commands are JSON text messages");
                        if sink.send(Message::Text(e.to_string().into())).await.is_err() { break End::Quiet; }
                        continue;
                    }
                    Some(Ok(_)) => continue,
                };
                let (answers, next) = s.handle(&text).await;
                let mut failed = false;
                for a in answers {
                    if sink.send(Message::Text(a.to_string().into())).await.is_err() { failed = true; break; }
                }
                match (failed, next) {
                    (true, _) | (false, Next::Close(None)) => break End::Quiet,
                    (false, Next::Close(Some((code, why)))) => break End::Error(code, why),
                    (false, Next::Go) => {}
                }
            }
            update = rx.recv() => {
                let Some(update) = update else { break End::Quiet };
                if sink.send(Message::Text(update)).await.is_err() { break End::Quiet; }
            }
            () = out.wake.notified() => {
                break End::Error(code::INTERNAL_ERROR, format!("too many updates queued for this session (ws.queue = {}): it was closed", cfg.queue));
            }
            _ = ticker.tick() => {
                if last_heard.elapsed() >= idle {
                    break End::Error(code::BAD_REQUEST, "idle for ws.idle_timeout".into());
                }
                // A user deleted or disabled, or whose password changed, is out.
                if s.caller.is_some() && authenticate(&h.auth, &s.token).await.is_none() {
                    break End::Error(code::UNAUTHORIZED, "Invalid JWT token".into());
                }
                if sink.send(Message::Ping(Default::default())).await.is_err() { break End::Quiet; }
            }
            r = alarm_changes.changed(), if alarm_due.is_none() && s.follows_alarms() => {
                if r.is_ok() {
                    alarm_due = Some(tokio::time::Instant::now().max(alarms_refreshed + ALARM_REFRESH));
                }
            }
            () = tokio::time::sleep_until(alarm_due.unwrap_or_else(tokio::time::Instant::now)), if alarm_due.is_some() => {
                alarm_due = None;
                alarms_refreshed = tokio::time::Instant::now();
                let mut failed = false;
                for a in s.refresh_alarms().await {
                    if sink.send(Message::Text(a.to_string().into())).await.is_err() { failed = true; break; }
                }
                if failed { break End::Quiet; }
            }
            _ = recount.tick(), if !s.counts.is_empty() || s.follows_alarms() => {
                let mut failed = false;
                // Time windows move: alarm answers are taken again too.
                let mut answers = s.recount().await;
                answers.extend(s.refresh_alarms().await);
                for a in answers {
                    if sink.send(Message::Text(a.to_string().into())).await.is_err() { failed = true; break; }
                }
                if failed { break End::Quiet; }
            }
            () = tokio::time::sleep_until(auth_deadline), if s.caller.is_none() => {
                break End::Error(code::UNAUTHORIZED, "no authCmd within ws.auth_timeout".into());
            }
            () = &mut token_end, if s.caller.is_some() => {
                break End::Error(code::UNAUTHORIZED, "Token has expired".into());
            }
        }
    };
    for cmd_id in s.followed.keys().copied().collect::<Vec<_>>() {
        s.unfollow(cmd_id);
    }
    match end {
        End::Quiet => {}
        End::Error(code, why) => {
            let e = proto::error(0, code, &why).to_string();
            let _ = sink.send(Message::Text(e.into())).await;
        }
        End::Close(code, reason) => {
            let frame = axum::extract::ws::CloseFrame { code, reason: reason.into() };
            if sink.send(Message::Close(Some(frame))).await.is_ok() {
                // Until the client answers the close (what it still sends is dropped), so
                // that it reads the reason instead of a reset; bounded.
                let drain = async { while let Some(Ok(_)) = stream.next().await {} };
                let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
            }
            return;
        }
    }
    let _ = sink.close().await;
}

/// Whether a socket error is a message or frame over the socket's size bound.
fn is_capacity(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(t) = err.downcast_ref::<tungstenite::Error>() {
            return matches!(t, tungstenite::Error::Capacity(_));
        }
        source = err.source();
    }
    false
}

/// An open session in the count: counted up when made, down when it ends, however it ends.
struct Open<'a>(&'a AtomicUsize);

impl<'a> Open<'a> {
    fn count(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Open(n)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Session {
    /// Takes `token` as the session's: its caller, the session counted against its user's
    /// `ws.max_sessions_per_user`.
    async fn authenticate(&mut self, token: String) -> Result<(), Refusal> {
        let found = authenticate(&self.h.auth, &token).await;
        self.token = token;
        let Some((caller, expiry)) = found else {
            self.caller = None;
            return Err((code::UNAUTHORIZED, "Invalid JWT token".into()));
        };
        if self.counted.as_ref().is_none_or(|c| c.user != caller.user) {
            self.counted = None;
            match self.h.ws.open_session(&caller, &self.h.core) {
                Ok(counted) => self.counted = Some(counted),
                Err(why) => {
                    self.caller = None;
                    return Err((code::BAD_REQUEST, why));
                }
            }
        }
        self.caller = Some((Arc::new(caller), expiry));
        Ok(())
    }

    /// Answers a client message: the updates to send at once, and whether to go on.
    async fn handle(&mut self, text: &str) -> (Vec<J>, Next) {
        let msg = match proto::parse(text, Ts::now().0) {
            Ok(m) => m,
            Err(e) => return (vec![proto::error(0, code::BAD_REQUEST, &e)], Next::Go),
        };
        if let Some((cmd_id, token)) = msg.auth {
            if let Err((code, why)) = self.authenticate(token).await {
                return (vec![proto::error(cmd_id, code, &why)], Next::Close(None));
            }
        }
        let Some((caller, _)) = self.caller.clone() else {
            let cmd_id = msg.cmds.first().map_or(0, cmd_id);
            let e = proto::error(cmd_id, code::UNAUTHORIZED, "Unauthorized: send authCmd first");
            return (vec![e], Next::Close(None));
        };
        let mut answers = Vec::new();
        for cmd in msg.cmds {
            answers.push(match cmd {
                Cmd::EntityData(e) => {
                    answers.extend(self.entity_data(&caller, *e).await);
                    continue;
                }
                Cmd::EntityUnsubscribe(cmd_id) => {
                    self.unfollow(cmd_id);
                    self.pages.remove(&cmd_id);
                    continue;
                }
                Cmd::Subscribe(sub) => self.subscribe(&caller, sub).await,
                Cmd::History(q) => self.history(&caller, q).await,
                Cmd::Attributes(a) => self.attributes(&caller, a).await,
                Cmd::Unsubscribe(cmd_id) => {
                    self.unfollow(cmd_id);
                    continue;
                }
                Cmd::EntityCount(cmd_id, q) => self.entity_count(&caller, cmd_id, q).await,
                Cmd::EntityCountUnsubscribe(cmd_id) => {
                    self.counts.remove(&cmd_id);
                    continue;
                }
                Cmd::AlarmData(cmd_id, q) => self.alarm_data(&caller, cmd_id, q).await,
                Cmd::AlarmDataUnsubscribe(cmd_id) => {
                    self.alarm_pages.remove(&cmd_id);
                    continue;
                }
                Cmd::AlarmCount(cmd_id, q) => self.alarm_count(&caller, cmd_id, q).await,
                Cmd::AlarmCountUnsubscribe(cmd_id) => {
                    self.alarm_counts.remove(&cmd_id);
                    continue;
                }
                Cmd::Unsupported(cmd_id, why) => proto::error(cmd_id, code::BAD_REQUEST, &why),
                Cmd::BadEntityData(cmd_id, why) => proto::entity_error(cmd_id, code::BAD_REQUEST, &why),
            });
        }
        (answers, Next::Go)
    }

    async fn subscribe(&mut self, caller: &Arc<Caller>, sub: TsSub) -> J {
        let device = match device_for(&self.h.core, caller, &sub.entity_type, &sub.entity_id).await {
            Ok(d) => d,
            Err(e) => return proto::error(sub.cmd_id, e.0, &e.1),
        };
        // Registered before the first read, so no change committed in between is missed.
        if let Err(why) = self.register(&[device], sub.cmd_id, Kind::Telemetry, sub.keys.clone(), caller) {
            return proto::error(sub.cmd_id, code::BAD_REQUEST, &why);
        }
        self.settle().await;
        let store = self.h.core.ts.clone();
        blocking(move || first_values(store.reads(), device, &sub).map_err(internal))
            .await
            .unwrap_or_else(|(code, why)| proto::error(0, code, &why))
    }

    /// Waits, after a subscription is registered and before its first read, for the writes
    /// already queued to commit. The ingest path decides whether a write goes live before
    /// it commits (`LiveData::wants_telemetry`): a write queued just before the subscription
    /// existed is not delivered to it, so the first read must come after its commit, or
    /// the value would be in neither (a browser saw a published value never arrive). A
    /// failed barrier (storage refusing writes) leaves nothing to wait for.
    async fn settle(&self) {
        let _ = self.h.core.writer.barrier().await;
    }

    /// Subscribes command `cmd_id` to `devices`, replacing what it followed before, within
    /// the session's, its user's and its tenant's bounds (why not, if not).
    fn register(
        &mut self,
        devices: &[DeviceId],
        cmd_id: i64,
        kind: Kind,
        keys: Option<Vec<String>>,
        caller: &Arc<Caller>,
    ) -> Result<(), String> {
        if let Some(why) = self.over(cmd_id, devices.len()) {
            return Err(why);
        }
        self.unfollow(cmd_id);
        let s = Sub { session: self.id, cmd_id, kind, keys, caller: caller.clone(), out: self.out.clone() };
        self.h.ws.add(devices, s, &self.h.core)?;
        self.followed.insert(cmd_id, devices.to_vec());
        Ok(())
    }

    /// Ends what command `cmd_id` follows, if anything.
    fn unfollow(&mut self, cmd_id: i64) {
        if let Some(devices) = self.followed.remove(&cmd_id) {
            self.h.ws.remove(self.id, cmd_id, &devices);
        }
    }

    /// Whether `more` subscriptions for command `cmd_id` (replacing its own) would pass
    /// `ws.max_subscriptions`: why, if so.
    fn over(&self, cmd_id: i64, more: usize) -> Option<String> {
        let max = self.h.core.cfg.ws.max_subscriptions;
        let others: usize = self.followed.iter().filter(|(c, _)| **c != cmd_id).map(|(_, d)| d.len()).sum();
        (others + more > max)
            .then(|| format!("too many subscriptions: at most {max} per session (ws.max_subscriptions)"))
    }

    /// `ENTITY_DATA`: the page of its query (or of the query this `cmdId` sent before),
    /// its subscriptions, and the points of its `tsCmd` or `historyCmd` window.
    async fn entity_data(&mut self, caller: &Arc<Caller>, e: EntityDataCmd) -> Vec<J> {
        let cmd_id = e.cmd_id;
        match self.try_entity_data(caller, e).await {
            Ok(answers) => answers,
            Err((code, why)) => vec![proto::entity_error(cmd_id, code, &why)],
        }
    }

    async fn try_entity_data(&mut self, caller: &Arc<Caller>, e: EntityDataCmd) -> Result<Vec<J>, Refusal> {
        let mut answers = Vec::new();
        let core = self.h.core.clone();
        let max = core.cfg.ws.max_subscriptions;
        if e.query.is_some() && !self.pages.contains_key(&e.cmd_id) && self.queries() >= max {
            return Err((code::BAD_REQUEST, format!("too many entity queries: at most {max} per session")));
        }
        if let Some(q) = e.query {
            let who = caller.clone();
            let mut keys = q.entity_fields.clone();
            keys.extend(q.latest_values.iter().chain(e.latest.iter().flatten()).cloned());
            let (page, ids) = blocking(move || {
                let (total, devices) = entity::select(&core, &who, &q)?;
                let rows = devices.iter().map(|d| entity::row(&core, d, &keys)).collect::<Result<_, _>>()?;
                let ids: Vec<_> = devices.iter().map(|d| (d.id(), d.entity_type())).collect();
                Ok((proto::entity_page(e.cmd_id, rows, total, q.page_size, q.page), ids))
            })
            .await?;
            // A new query ends what the command followed before.
            self.unfollow(e.cmd_id);
            answers.push(page);
            self.pages.insert(e.cmd_id, ids);
        }
        let Some(page) = self.pages.get(&e.cmd_id).cloned() else {
            return Err((code::BAD_REQUEST, format!("no query for cmdId {}: send one first", e.cmd_id)));
        };
        let devices: Vec<DeviceId> = page.iter().map(|(id, _)| *id).collect();
        let keys = entity::EntityKeys::new(e.latest.as_deref().unwrap_or_default(), e.ts.as_ref());
        if !keys.is_empty() {
            // Registered before the window is read, so no change committed in between is missed.
            self.register(&devices, e.cmd_id, Kind::Entity(Arc::new(keys)), None, caller)
                .map_err(|why| (code::BAD_REQUEST, why))?;
        }
        for window in [e.ts, e.history].into_iter().flatten() {
            let (store, page) = (self.h.core.ts.clone(), page.clone());
            let update = blocking(move || entity::series(store.reads(), &page, &window)).await?;
            answers.push(proto::entity_update(e.cmd_id, update));
        }
        Ok(answers)
    }

    /// `ENTITY_DATA`, `ENTITY_COUNT`, `ALARM_DATA` and `ALARM_COUNT` queries the session holds.
    fn queries(&self) -> usize {
        self.pages.len() + self.counts.len() + self.alarm_pages.len() + self.alarm_counts.len()
    }

    fn follows_alarms(&self) -> bool {
        !self.alarm_pages.is_empty() || !self.alarm_counts.is_empty()
    }

    /// Why a new query `cmd_id` would be one too many for the session, if it would.
    fn too_many(&self, held: bool) -> Option<String> {
        let max = self.h.core.cfg.ws.max_subscriptions;
        (!held && self.queries() >= max).then(|| format!("too many queries: at most {max} per session"))
    }

    /// `ALARM_DATA`: the page of its query; again whenever it changes.
    async fn alarm_data(&mut self, caller: &Arc<Caller>, cmd_id: i64, q: Result<Box<AlarmQuery>, String>) -> J {
        let q = match q {
            Ok(q) => Arc::new(*q),
            Err(why) => return proto::alarm_error(cmd_id, code::BAD_REQUEST, &why),
        };
        if let Some(why) = self.too_many(self.alarm_pages.contains_key(&cmd_id)) {
            return proto::alarm_error(cmd_id, code::BAD_REQUEST, &why);
        }
        let (core, auth, who, query) = (self.h.core.clone(), self.h.auth.clone(), caller.clone(), q.clone());
        match blocking(move || alarm::page(&core, &auth, &who, cmd_id, &query, Ts::now().0)).await {
            Ok(page) => {
                self.alarm_pages.insert(cmd_id, (q, page.clone()));
                page
            }
            Err((code, why)) => proto::alarm_error(cmd_id, code, &why),
        }
    }

    /// `ALARM_COUNT`: how many alarms its query selects; again whenever that changes.
    async fn alarm_count(&mut self, caller: &Arc<Caller>, cmd_id: i64, q: Result<Box<AlarmQuery>, String>) -> J {
        let q = match q {
            Ok(q) => Arc::new(*q),
            Err(why) => return proto::alarm_count_error(cmd_id, code::BAD_REQUEST, &why),
        };
        if let Some(why) = self.too_many(self.alarm_counts.contains_key(&cmd_id)) {
            return proto::alarm_count_error(cmd_id, code::BAD_REQUEST, &why);
        }
        let (core, who, query) = (self.h.core.clone(), caller.clone(), q.clone());
        match blocking(move || alarm::count(&core, &who, &query, Ts::now().0)).await {
            Ok(n) => {
                self.alarm_counts.insert(cmd_id, (q, n));
                proto::alarm_count(cmd_id, n)
            }
            Err((code, why)) => proto::alarm_count_error(cmd_id, code, &why),
        }
    }

    /// The alarm answers that changed since they were last sent.
    async fn refresh_alarms(&mut self) -> Vec<J> {
        let Some((caller, _)) = self.caller.clone() else { return Vec::new() };
        let pages: Vec<(i64, Arc<AlarmQuery>)> = self.alarm_pages.iter().map(|(id, (q, _))| (*id, q.clone())).collect();
        let counts: Vec<(i64, Arc<AlarmQuery>)> =
            self.alarm_counts.iter().map(|(id, (q, _))| (*id, q.clone())).collect();
        let (core, auth) = (self.h.core.clone(), self.h.auth.clone());
        let taken = blocking(move || {
            let now = Ts::now().0;
            let pages =
                pages.into_iter().map(|(id, q)| alarm::page(&core, &auth, &caller, id, &q, now).map(|p| (id, p)));
            let counts = counts.into_iter().map(|(id, q)| alarm::count(&core, &caller, &q, now).map(|n| (id, n)));
            Ok((pages.collect::<Result<Vec<_>, _>>()?, counts.collect::<Result<Vec<_>, _>>()?))
        })
        .await;
        let Ok((pages, counts)) = taken else { return Vec::new() };
        let mut answers = Vec::new();
        for (id, page) in pages {
            // Unsubscribed meanwhile: nothing to send.
            if let Some((_, last)) = self.alarm_pages.get_mut(&id) {
                if *last != page {
                    *last = page.clone();
                    answers.push(page);
                }
            }
        }
        for (id, n) in counts {
            if let Some((_, last)) = self.alarm_counts.get_mut(&id) {
                if *last != n {
                    *last = n;
                    answers.push(proto::alarm_count(id, n));
                }
            }
        }
        answers
    }

    /// `ENTITY_COUNT`: how many devices the query selects now; the count is taken again
    /// every `ws.count_refresh` and sent when it changed ([`Session::recount`]).
    async fn entity_count(&mut self, caller: &Caller, cmd_id: i64, q: Result<Box<EntityQuery>, String>) -> J {
        let q = match q {
            Ok(q) => Arc::new(*q),
            Err(why) => return proto::count_error(cmd_id, code::BAD_REQUEST, &why),
        };
        let max = self.h.core.cfg.ws.max_subscriptions;
        if !self.counts.contains_key(&cmd_id) && self.queries() >= max {
            return proto::count_error(
                cmd_id,
                code::BAD_REQUEST,
                &format!("too many entity queries: at most {max} per session"),
            );
        }
        let (core, who, query) = (self.h.core.clone(), caller.clone(), q.clone());
        match blocking(move || entity::select(&core, &who, &query).map(|(total, _)| total)).await {
            Ok(n) => {
                self.counts.insert(cmd_id, (q, n));
                proto::count_update(cmd_id, n)
            }
            Err((code, why)) => proto::count_error(cmd_id, code, &why),
        }
    }

    /// The counts of the session's `ENTITY_COUNT` subscriptions that changed.
    async fn recount(&mut self) -> Vec<J> {
        let Some((caller, _)) = self.caller.clone() else { return Vec::new() };
        let queries: Vec<(i64, Arc<EntityQuery>)> = self.counts.iter().map(|(id, (q, _))| (*id, q.clone())).collect();
        let core = self.h.core.clone();
        let counted = blocking(move || {
            let mut out = Vec::with_capacity(queries.len());
            for (id, q) in queries {
                out.push((id, entity::select(&core, &caller, &q)?.0));
            }
            Ok(out)
        })
        .await;
        let Ok(counted) = counted else { return Vec::new() };
        let mut answers = Vec::new();
        for (id, n) in counted {
            // Unsubscribed meanwhile: nothing to send.
            if let Some((_, last)) = self.counts.get_mut(&id) {
                if *last != n {
                    *last = n;
                    answers.push(proto::count_update(id, n));
                }
            }
        }
        answers
    }

    async fn attributes(&mut self, caller: &Arc<Caller>, sub: AttrSub) -> J {
        let scope = match sub.scope.as_deref().map(str::parse::<AttributeScope>).transpose() {
            Ok(s) => s,
            Err(e) => return proto::error(sub.cmd_id, code::BAD_REQUEST, &e),
        };
        let device = match device_for(&self.h.core, caller, &sub.entity_type, &sub.entity_id).await {
            Ok(d) => d,
            Err(e) => return proto::error(sub.cmd_id, e.0, &e.1),
        };
        if let Err(why) = self.register(&[device], sub.cmd_id, Kind::Attributes(scope), sub.keys.clone(), caller) {
            return proto::error(sub.cmd_id, code::BAD_REQUEST, &why);
        }
        self.settle().await;
        match gridlinks_platform::attributes::read(&self.h.core.store, device, scope, sub.keys).await {
            Ok(attrs) => proto::update(
                sub.cmd_id,
                attrs.iter().map(|a| (a.key.as_str(), vec![(a.last_update_ts.0, a.value.to_display_string())])),
            ),
            Err(e) => proto::error(sub.cmd_id, code::INTERNAL_ERROR, &e.to_string()),
        }
    }

    async fn history(&self, caller: &Caller, q: HistoryCmd) -> J {
        let device = match device_for(&self.h.core, caller, &q.entity_type, &q.entity_id).await {
            Ok(d) => d,
            Err(e) => return proto::error(q.cmd_id, e.0, &e.1),
        };
        let store = self.h.core.ts.clone();
        blocking(move || {
            let series = store
                .reads()
                .history(device, &raw_query(q.keys.clone(), q.start_ts, q.end_ts, q.limit))
                .map_err(internal)?;
            Ok(proto::update(q.cmd_id, texts(&series)))
        })
        .await
        .unwrap_or_else(|(code, why)| proto::error(0, code, &why))
    }
}

fn cmd_id(c: &Cmd) -> i64 {
    match c {
        Cmd::Subscribe(s) => s.cmd_id,
        Cmd::History(h) => h.cmd_id,
        Cmd::Attributes(a) => a.cmd_id,
        Cmd::EntityData(e) => e.cmd_id,
        Cmd::Unsubscribe(id)
        | Cmd::EntityUnsubscribe(id)
        | Cmd::EntityCount(id, _)
        | Cmd::EntityCountUnsubscribe(id)
        | Cmd::AlarmData(id, _)
        | Cmd::AlarmDataUnsubscribe(id)
        | Cmd::AlarmCount(id, _)
        | Cmd::AlarmCountUnsubscribe(id)
        | Cmd::Unsupported(id, _)
        | Cmd::BadEntityData(id, _) => *id,
    }
}

/// The points of `records` whose key `wanted` takes, grouped by key in the order keys
/// first appear: `(key, [(ts, value as text)])`.
fn points_by_key(records: &[TsRecord], wanted: impl Fn(&str) -> bool) -> Vec<(&str, Vec<(i64, String)>)> {
    let mut series: Vec<(&str, Vec<(i64, String)>)> = Vec::new();
    for r in records {
        for (k, v) in r.values.iter().filter(|(k, _)| wanted(k)) {
            let point = (r.ts.0, v.to_display_string());
            match series.iter_mut().find(|(key, _)| key == k) {
                Some((_, points)) => points.push(point),
                None => series.push((k, vec![point])),
            }
        }
    }
    series
}

/// Why a command was refused: an error code and message.
pub(crate) type Refusal = (u8, String);

pub(crate) fn internal(e: StoreError) -> Refusal {
    (code::INTERNAL_ERROR, e.to_string())
}

/// `f` on the blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Refusal> + Send + 'static) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(f).await.map_err(|e| (code::INTERNAL_ERROR, e.to_string()))?
}

/// The device an entity reference names, if the caller may see it: an error code and
/// message otherwise.
async fn device_for(core: &Core, caller: &Caller, entity_type: &str, id: &str) -> Result<DeviceId, Refusal> {
    let found = if entity_type == "ASSET" {
        let id = id.parse().map_err(|_| (code::BAD_REQUEST, format!("Invalid asset id: {id}")))?;
        gridlinks_platform::entities::assets::get(core, caller, id).await.map(|a| DeviceId(a.id))
    } else {
        let id = gridlinks_thingsboard::model::entity_device_id(entity_type, id)
            .map_err(|e| (code::BAD_REQUEST, e.to_string()))?;
        gridlinks_platform::entities::devices::get(core, caller, id).await.map(|d| d.id)
    };
    match found {
        Ok(id) => Ok(id),
        // Another tenant's entity is answered as one that does not exist (as REST does).
        Err(ServiceError::NotFound(_)) => {
            let what = if entity_type == "ASSET" { "Asset" } else { "Device" };
            Err((code::BAD_REQUEST, format!("{what} with requested id wasn't found!")))
        }
        Err(ServiceError::Forbidden) => {
            Err((code::UNAUTHORIZED, "You don't have permission to perform this operation!".into()))
        }
        Err(e) => Err((code::INTERNAL_ERROR, e.to_string())),
    }
}

/// Raw points of `keys` in `[start, end)`, newest first, at most `limit` per key.
pub(super) fn raw_query(keys: Vec<String>, start: i64, end: i64, limit: usize) -> HistoryQuery {
    HistoryQuery {
        keys,
        start: Ts(start),
        end: Ts(end),
        interval: 0,
        agg: gridlinks_storage::query::Agg::None,
        limit,
        order: Order::Desc,
    }
}

pub(super) fn texts(series: &[(String, Vec<(Ts, Value)>)]) -> Vec<(&str, Vec<(i64, String)>)> {
    series
        .iter()
        .map(|(k, points)| (k.as_str(), points.iter().map(|(ts, v)| (ts.0, v.to_display_string())).collect()))
        .collect()
}

/// A subscription's first update: its window's points, or the latest values.
fn first_values(store: &dyn Timeseries, device: DeviceId, sub: &TsSub) -> Result<J, StoreError> {
    match sub.history {
        Some((start, limit)) => {
            let keys = match &sub.keys {
                Some(k) => k.clone(),
                None => store.ts_keys(device)?,
            };
            let series = store.history(device, &raw_query(keys, start, Ts::now().0 + 1, limit))?;
            Ok(proto::update(sub.cmd_id, texts(&series)))
        }
        None => {
            let latest = store.latest(device, sub.keys.as_deref())?;
            Ok(proto::update(
                sub.cmd_id,
                latest.iter().map(|(k, ts, v)| (k.as_str(), vec![(ts.0, v.to_display_string())])),
            ))
        }
    }
}
