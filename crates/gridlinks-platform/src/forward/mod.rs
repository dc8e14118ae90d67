//! Data forwarding: a tenant's sinks (an HTTP endpoint, a Kafka topic, an external MQTT
//! broker) receive its committed telemetry, attributes and alarm changes, filtered by
//! device profile, event type and key.
//!
//! **At least once, in order per device.** The storage writer copies what a sink wants into
//! the outbox in the batch that commits it ([`gridlinks_storage::outbox`]); each sink has a
//! task that reads the outbox from its cursor, once synced, in commit order, delivers a
//! batch, retries it (backing off) until it is delivered, and only then moves its cursor.
//! A restart, a sink outage or a server crash therefore loses nothing and may send a batch
//! twice; every event carries its outbox sequence number (`seq`) to recognise a repeat.
//! The outbox is trimmed behind the slowest sink and held under `outbox_max_entries`: past
//! that the oldest entries are dropped, and each sink that had not sent them counts them.
//!
//! With Kafka as the commit log, each node forwards what its storage writer consumed (the
//! devices of its partitions).

mod deliver;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gridlinks_storage::{DeviceRecord, DocKind, DocRecord, OutboxEntry, OutboxEvent, Store, StoreError, WriteOp};
use gridlinks_types::{DeviceId, ProfileId, Ts};
use parking_lot::{Mutex, RwLock};
use serde_json::{json, Map, Value as J};
use uuid::Uuid;

use crate::auth::{Authority, Caller};
use crate::config::ForwardingConfig;
use crate::core::Core;
use crate::entities::{blocking, hidden, written_doc, ServiceError, ServiceResult};

/// The event types a sink may take.
pub const EVENTS: [&str; 3] = ["TELEMETRY", "ATTRIBUTES", "ALARM"];
/// Sink types.
const TYPES: [&str; 3] = ["HTTP", "KAFKA", "MQTT"];
/// Configuration fields that are secrets: stored, never shown, kept when an update leaves
/// them out.
const SECRETS: [&str; 2] = ["secret", "password"];
/// Longest wait between two tries of a delivery.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// How often the outbox is trimmed and other nodes' sink changes are looked for.
const HOUSEKEEPING: Duration = Duration::from_secs(1);

fn invalid(m: impl Into<String>) -> ServiceError {
    ServiceError::Invalid(m.into())
}

/// Where a sink sends.
#[derive(Clone, Debug, PartialEq)]
enum Target {
    Http {
        url: String,
        headers: Vec<(String, String)>,
        secret: Option<String>,
        batch_size: usize,
    },
    Kafka {
        servers: String,
        topic: String,
    },
    Mqtt {
        host: String,
        port: u16,
        topic: String,
        client_id: String,
        username: Option<String>,
        password: Option<String>,
    },
}

/// A sink as stored, checked.
#[derive(Clone, Debug, PartialEq)]
struct Sink {
    id: Uuid,
    tenant: Uuid,
    name: String,
    enabled: bool,
    target: Target,
    /// Device profiles whose devices' events it takes (empty: every profile).
    profiles: HashSet<ProfileId>,
    /// [`EVENTS`] it takes.
    events: [bool; 3],
    /// Keys of telemetry and attributes it takes (empty: all).
    keys: HashSet<String>,
}

const TELEMETRY: usize = 0;
const ATTRIBUTES: usize = 1;
const ALARM: usize = 2;

fn strings(v: Option<&J>, at: &str) -> ServiceResult<Vec<String>> {
    match v {
        None | Some(J::Null) => Ok(Vec::new()),
        Some(J::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_owned).ok_or_else(|| invalid(format!("{at} holds strings"))))
            .collect(),
        Some(_) => Err(invalid(format!("{at} must be a list"))),
    }
}

fn text(c: &J, name: &str, required: bool) -> ServiceResult<Option<String>> {
    match c.get(name) {
        None | Some(J::Null) if !required => Ok(None),
        Some(J::String(s)) if !s.is_empty() && s.len() <= 2048 && !s.chars().any(char::is_control) => {
            Ok(Some(s.clone()))
        }
        _ => Err(invalid(format!("configuration.{name} must be a non-empty text of at most 2048 characters"))),
    }
}

impl Sink {
    /// A stored sink, checked (the save checks the same, so a stored one passes).
    fn parse(core: &Core, d: &DocRecord) -> ServiceResult<Self> {
        let doc = &d.doc;
        let kind = doc.get("type").and_then(J::as_str).unwrap_or_default();
        let c =
            doc.get("configuration").filter(|c| c.is_object()).ok_or_else(|| invalid("configuration is required"))?;
        let target = match kind {
            "HTTP" => {
                let url = text(c, "url", true)?.unwrap_or_default();
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(invalid("configuration.url must be an http(s) URL"));
                }
                let mut headers = Vec::new();
                match c.get("headers") {
                    None | Some(J::Null) => {}
                    Some(J::Object(h)) if h.len() <= 20 => {
                        for (k, v) in h {
                            let v = v.as_str().unwrap_or("\n");
                            let token = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                            if !token || v.chars().any(char::is_control) || v.len() > 2048 {
                                return Err(invalid(format!(
                                    "configuration.headers.{k}: a header name of letters, digits and '-' with a \
                                     text value"
                                )));
                            }
                            headers.push((k.clone(), v.to_owned()));
                        }
                    }
                    Some(_) => return Err(invalid("configuration.headers: an object of at most 20 headers")),
                }
                let batch_size = match c.get("batchSize") {
                    None | Some(J::Null) => 100,
                    Some(n) => match n.as_u64() {
                        Some(n @ 1..=1000) => n as usize,
                        _ => return Err(invalid("configuration.batchSize: 1 to 1000 events per POST")),
                    },
                };
                Target::Http { url, headers, secret: text(c, "secret", false)?, batch_size }
            }
            "KAFKA" => {
                let servers = text(c, "bootstrapServers", true)?.unwrap_or_default();
                if servers.split(',').any(|s| host_port(s.trim()).is_none()) {
                    return Err(invalid("configuration.bootstrapServers: host:port, comma-separated"));
                }
                let topic = text(c, "topic", true)?.unwrap_or_default();
                let legal = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
                if topic.len() > 249 || !topic.bytes().all(legal) || topic == "." || topic == ".." {
                    return Err(invalid("configuration.topic: a Kafka topic name (letters, digits, '.', '_', '-')"));
                }
                Target::Kafka { servers, topic }
            }
            "MQTT" => {
                let host = text(c, "host", true)?.unwrap_or_default();
                let port = match c.get("port") {
                    None | Some(J::Null) => 1883,
                    Some(p) => p
                        .as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .filter(|p| *p > 0)
                        .ok_or_else(|| invalid("configuration.port: 1 to 65535"))?,
                };
                let topic = text(c, "topic", false)?.unwrap_or_else(|| "gridlinks/${deviceName}/${type}".into());
                if topic.contains(['+', '#']) || topic.len() > 1024 {
                    return Err(invalid("configuration.topic: a topic name without wildcards"));
                }
                for f in fields(&topic) {
                    if !TOPIC_FIELDS.contains(&f) {
                        return Err(invalid(format!(
                            "configuration.topic: unknown field ${{{f}}}: {}",
                            TOPIC_FIELDS.map(|f| format!("${{{f}}}")).join(", ")
                        )));
                    }
                }
                let client_id = text(c, "clientId", false)?.unwrap_or_else(|| format!("gridlinks-sink-{}", d.id));
                if client_id.len() > 64 {
                    return Err(invalid("configuration.clientId: at most 64 characters"));
                }
                Target::Mqtt {
                    host,
                    port,
                    topic,
                    client_id,
                    username: text(c, "username", false)?,
                    password: text(c, "password", false)?,
                }
            }
            other => return Err(invalid(format!("type {other:?}: one of {}", TYPES.join(", ")))),
        };
        let filter = doc.get("filter").cloned().unwrap_or(J::Null);
        let mut events = [true; 3];
        let named = strings(filter.get("events"), "filter.events")?;
        if !named.is_empty() {
            events = [false; 3];
            for e in named {
                let i = EVENTS
                    .iter()
                    .position(|k| *k == e)
                    .ok_or_else(|| invalid(format!("filter.events: {e:?} is not one of {}", EVENTS.join(", "))))?;
                events[i] = true;
            }
        }
        let keys: HashSet<String> = strings(filter.get("keys"), "filter.keys")?.into_iter().collect();
        if keys.len() > 1000 {
            return Err(invalid("filter.keys: at most 1000 keys"));
        }
        let mut profiles = HashSet::new();
        let tenant = core.doc_tenant(d);
        let all = core.store.profiles()?;
        for p in strings(filter.get("deviceProfileIds"), "filter.deviceProfileIds")? {
            let id = p.parse().map(ProfileId).map_err(|_| invalid("filter.deviceProfileIds holds profile ids"))?;
            if !all.iter().any(|r| r.id == id && core.tenant_of(r.tenant) == tenant) {
                return Err(ServiceError::NotFound(format!("Device profile with id [{p}] is not found")));
            }
            profiles.insert(id);
        }
        Ok(Self {
            id: d.id,
            tenant,
            name: d.title.clone(),
            enabled: doc.get("enabled").and_then(J::as_bool).unwrap_or(true),
            target,
            profiles,
            events,
            keys,
        })
    }

    /// Whether it takes `event` of a device of `profile`.
    fn takes(&self, event: usize, profile: Option<ProfileId>) -> bool {
        self.events[event] && (self.profiles.is_empty() || profile.is_some_and(|p| self.profiles.contains(&p)))
    }

    /// The (host, port) pairs it connects to.
    fn addresses(&self) -> Vec<String> {
        match &self.target {
            Target::Http { url, .. } => {
                let rest = url.split_once("://").map_or("", |(_, r)| r);
                let netloc = rest.split(['/', '?', '#']).next().unwrap_or_default();
                let netloc = netloc.rsplit_once('@').map_or(netloc, |(_, h)| h);
                let default = if url.starts_with("https") { 443 } else { 80 };
                vec![if host_port(netloc).is_some() { netloc.to_owned() } else { format!("{netloc}:{default}") }]
            }
            Target::Kafka { servers, .. } => servers.split(',').map(|s| s.trim().to_owned()).collect(),
            Target::Mqtt { host, port, .. } => vec![format!("{host}:{port}")],
        }
    }
}

/// `host:port` (a bracketed IPv6 literal too), if `s` is one.
fn host_port(s: &str) -> Option<(&str, u16)> {
    let (h, p) = s.rsplit_once(':')?;
    let port = p.parse::<u16>().ok().filter(|p| *p > 0)?;
    (!h.is_empty() && !h.contains(['/', ' '])).then_some((h, port))
}

/// Fields an MQTT sink's topic may use.
const TOPIC_FIELDS: [&str; 5] = ["deviceId", "deviceName", "deviceType", "tenantId", "type"];

/// The `${…}` names of a template.
fn fields(t: &str) -> impl Iterator<Item = &str> {
    t.split("${").skip(1).filter_map(|s| s.split_once('}').map(|(name, _)| name))
}

/// `t` with `${name}` replaced from `event` (its top-level text fields, `type` lowercased).
fn render_topic(t: &str, event: &J) -> String {
    let mut out = String::with_capacity(t.len() + 40);
    let mut rest = t;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let Some((name, after)) = rest[at + 2..].split_once('}') else { break };
        let v = event.get(name).and_then(J::as_str).unwrap_or_default();
        // A device name may hold what a topic may not: wildcards become '_'.
        let v = v.replace(['+', '#'], "_");
        out.push_str(&if name == "type" { v.to_lowercase() } else { v });
        rest = after;
    }
    out.push_str(rest);
    out
}

// ---- the API ----------------------------------------------------------------------

fn admin_only(me: &Caller) -> ServiceResult<()> {
    match me.authority {
        Authority::TenantAdmin => Ok(()),
        _ => Err(ServiceError::Forbidden),
    }
}

fn missing(id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("Data sink with id [{id}] is not found"))
}

/// A sink of the caller's tenant.
async fn get_doc(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<DocRecord> {
    admin_only(me)?;
    let store = core.store.clone();
    let d = blocking(move || store.doc(DocKind::DataSink, id)).await?.ok_or_else(|| missing(id))?;
    let tenant = core.doc_tenant(&d);
    if tenant != me.tenant {
        return Err(hidden(me, tenant, || missing(id)));
    }
    Ok(d)
}

impl Forwarding {
    /// A sink of the caller's tenant as the API shows it (secrets left out, with its
    /// delivery statistics).
    pub async fn get(&self, me: &Caller, id: Uuid) -> ServiceResult<J> {
        let d = get_doc(&self.core, me, id).await?;
        Ok(self.shown(&d))
    }

    /// The caller's tenant's sinks, by name.
    pub async fn list(&self, me: &Caller) -> ServiceResult<Vec<J>> {
        admin_only(me)?;
        let store = self.core.store.clone();
        let mut all = blocking(move || store.docs(DocKind::DataSink)).await?;
        all.retain(|d| self.core.doc_tenant(d) == me.tenant);
        all.sort_by(|a, b| a.title.cmp(&b.title));
        Ok(all.iter().map(|d| self.shown(d)).collect())
    }

    fn shown(&self, d: &DocRecord) -> J {
        let mut doc = d.doc.clone();
        if let Some(c) = doc.get_mut("configuration").and_then(J::as_object_mut) {
            for s in SECRETS {
                if c.remove(s).is_some() {
                    c.insert(format!("{s}Set"), true.into());
                }
            }
        }
        if let Some(o) = doc.as_object_mut() {
            o.insert("id".into(), json!({"entityType": "DATA_SINK", "id": d.id}));
            o.insert("createdTime".into(), d.created_time.into());
            o.insert("name".into(), d.title.clone().into());
            o.insert("stats".into(), self.stats_json(d.id));
        }
        doc
    }

    /// Creates or updates (`id` in the body) a sink of the caller's tenant, checked; a
    /// secret an update leaves out is kept.
    pub async fn save(self: &Arc<Self>, me: &Caller, mut doc: J) -> ServiceResult<J> {
        let core = &self.core;
        admin_only(me)?;
        let id = doc.get("id").and_then(|i| i.get("id").or(Some(i))).and_then(J::as_str).and_then(|s| s.parse().ok());
        let name = doc.get("name").and_then(J::as_str).unwrap_or_default().trim().to_owned();
        if name.is_empty() {
            return Err(invalid("Data sink name should be specified!"));
        }
        let old = match id {
            Some(id) => Some(get_doc(core, me, id).await?),
            None => None,
        };
        let obj = doc.as_object_mut().ok_or_else(|| invalid("Invalid request body: a JSON object"))?;
        for f in ["id", "createdTime", "tenantId", "name", "stats"] {
            obj.remove(f);
        }
        if let Some(c) = obj.get_mut("configuration").and_then(J::as_object_mut) {
            let old_c = old.as_ref().and_then(|o| o.doc.get("configuration"));
            for s in SECRETS {
                c.remove(&format!("{s}Set"));
                if c.get(s).is_none_or(J::is_null) {
                    match old_c.and_then(|o| o.get(s)) {
                        Some(v) => c.insert(s.into(), v.clone()),
                        None => c.remove(s),
                    };
                }
            }
        }
        core.set_doc_tenant(&mut doc, me.tenant);
        let candidate = DocRecord { id: id.unwrap_or_else(Uuid::nil), created_time: 0, title: name.clone(), doc };
        let sink = Sink::parse(core, &candidate)?;
        if old.is_none() {
            let store = core.store.clone();
            let mine = blocking(move || store.docs(DocKind::DataSink)).await?;
            let n = mine.iter().filter(|d| core.doc_tenant(d) == me.tenant).count();
            if n >= self.cfg.max_sinks_per_tenant {
                return Err(invalid(format!(
                    "a tenant may have {} data sinks (forwarding.max_sinks_per_tenant)",
                    self.cfg.max_sinks_per_tenant
                )));
            }
        }
        // Where it sends must be an address it may reach, checked on save too, so that a
        // mistake shows at once rather than in the sink's last error.
        let allow = self.cfg.allow_private_addresses;
        let addrs = sink.addresses();
        blocking(move || {
            use std::net::ToSocketAddrs;
            for a in addrs {
                // A name that does not resolve now may later: only a forbidden address is
                // refused here.
                let found: Vec<_> = a.to_socket_addrs().map(Iterator::collect).unwrap_or_default();
                if !allow && !found.is_empty() && found.iter().all(|s| crate::notify::private(s.ip())) {
                    return Err(StoreError::Invalid(format!(
                        "{a}: the address is loopback, private or link-local (forwarding.allow_private_addresses is off)"
                    )));
                }
            }
            Ok(())
        })
        .await?;
        let op = WriteOp::SaveDoc { kind: DocKind::DataSink, id, title: name, doc: candidate.doc };
        let d = written_doc(core.writer.submit(op).await?)?;
        self.reload().await;
        Ok(self.shown(&d))
    }

    /// Deletes a sink of the caller's tenant (what it had not sent is not sent).
    pub async fn delete(self: &Arc<Self>, me: &Caller, id: Uuid) -> ServiceResult<()> {
        get_doc(&self.core, me, id).await?;
        self.core.writer.submit(WriteOp::DeleteDoc(DocKind::DataSink, id)).await?;
        self.reload().await;
        Ok(())
    }
}

// ---- the runtime ------------------------------------------------------------------

/// One sink's delivery statistics (since the server started; the cursor is durable).
#[derive(Default)]
struct Stats {
    /// Events delivered.
    delivered: AtomicU64,
    /// Failed tries.
    failures: AtomicU64,
    /// Outbox entries dropped (the outbox was full) before this sink sent them.
    dropped: AtomicU64,
    /// The last outbox entry it is done with.
    cursor: AtomicU64,
    /// When it last delivered, ms.
    last_delivery: AtomicI64,
    /// Commit to delivery of the last entry it delivered, ms.
    lag_ms: AtomicI64,
    /// The last failure: (when, what).
    last_error: Mutex<Option<(i64, String)>>,
}

impl Stats {
    fn failed(&self, e: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.error(e);
    }

    fn error(&self, e: String) {
        *self.last_error.lock() = Some((Ts::now().0, e));
    }
}

struct Runner {
    sink: Sink,
    stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

/// Data forwarding's sinks, their tasks and the outbox they read.
pub struct Forwarding {
    core: Core,
    cfg: ForwardingConfig,
    /// Enabled sinks by tenant (what the outbox filter reads on the writer thread).
    routes: Arc<RwLock<HashMap<Uuid, Vec<Sink>>>>,
    runners: Mutex<HashMap<Uuid, Runner>>,
    /// Runs one reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

/// Stops every sink, and the outbox filter (which holds the store), when dropped.
struct Stop(Arc<Forwarding>);

impl Drop for Stop {
    fn drop(&mut self) {
        for (_, r) in self.0.runners.lock().drain() {
            r.task.abort();
        }
        self.0.core.store.set_outbox_filter(None);
    }
}

/// What the storage writer copies into the outbox: writes of devices and alarms some
/// enabled sink of their tenant takes.
struct Filter {
    store: Store,
    first_tenant: Uuid,
    routes: Arc<RwLock<HashMap<Uuid, Vec<Sink>>>>,
}

impl Filter {
    /// A device's tenant and profile (from the store's device cache: the writer thread
    /// decodes no device record per message).
    fn owner(&self, device: DeviceId) -> Option<(Uuid, ProfileId)> {
        let d = self.store.device_cached(device).ok().flatten()?;
        Some((d.tenant.unwrap_or(self.first_tenant), d.profile_id()))
    }
}

impl gridlinks_storage::OutboxFilter for Filter {
    fn wants(&self, op: &WriteOp) -> bool {
        let routes = self.routes.read();
        if routes.is_empty() {
            return false;
        }
        let (device, event) = match op {
            WriteOp::Telemetry { device, .. } => (*device, TELEMETRY),
            WriteOp::Attributes { device, .. } => (*device, ATTRIBUTES),
            WriteOp::PutDoc { kind: DocKind::Alarm, doc, .. } => {
                let tenant = doc.get("tenant").and_then(J::as_str).and_then(|t| t.parse().ok());
                return tenant.and_then(|t| routes.get(&t)).is_some_and(|s| s.iter().any(|s| s.events[ALARM]));
            }
            _ => return false,
        };
        let Some((tenant, profile)) = self.owner(device) else { return false };
        routes.get(&tenant).is_some_and(|s| s.iter().any(|s| s.takes(event, Some(profile))))
    }
}

impl Forwarding {
    /// Forwarding for `core`'s store (no sink runs before [`Forwarding::start`]).
    pub fn new(core: Core) -> Arc<Self> {
        let cfg = core.cfg.forwarding.clone();
        Arc::new(Self {
            core,
            cfg,
            routes: Arc::default(),
            runners: Mutex::default(),
            reloading: tokio::sync::Mutex::new(()),
        })
    }

    /// Starts the sinks and the outbox's housekeeping; aborting the returned task stops
    /// every sink (they hold the platform, so the server could not stop otherwise).
    pub async fn start(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let filter =
            Filter { store: self.core.store.clone(), first_tenant: self.core.tenant_id, routes: self.routes.clone() };
        self.core.store.set_outbox_filter(Some(Arc::new(filter)));
        self.reload().await;
        let me = self.clone();
        tokio::spawn(async move {
            let _stop = Stop(me.clone());
            let mut seen = me.core.store.remote_generation("docs");
            let mut tick = tokio::time::interval(HOUSEKEEPING);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = me.core.store.remote_generation("docs");
                if now != seen {
                    // Another node changed documents: perhaps a sink.
                    seen = now;
                    me.reload().await;
                }
                me.trim().await;
            }
        })
    }

    /// Brings the running sinks in line with the stored ones.
    pub async fn reload(self: &Arc<Self>) {
        let _one = self.reloading.lock().await;
        let store = self.core.store.clone();
        let docs = match blocking(move || store.docs(DocKind::DataSink)).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "data forwarding: the sinks could not be read");
                return;
            }
        };
        let mut wanted: HashMap<Uuid, Sink> = HashMap::new();
        for d in &docs {
            match Sink::parse(&self.core, d) {
                Ok(s) if s.enabled => {
                    wanted.insert(s.id, s);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(sink = %d.id, error = %e, "data forwarding: a stored sink is not usable"),
            }
        }
        let mut routes: HashMap<Uuid, Vec<Sink>> = HashMap::new();
        for s in wanted.values() {
            routes.entry(s.tenant).or_default().push(s.clone());
        }
        // The filter first, so a new sink's cursor (the outbox's end now) misses nothing
        // committed after it.
        *self.routes.write() = routes;
        let mut runners = self.runners.lock();
        let gone: Vec<Uuid> =
            runners.iter().filter(|(id, r)| wanted.get(id).is_none_or(|s| *s != r.sink)).map(|(id, _)| *id).collect();
        for id in gone {
            if let Some(r) = runners.remove(&id) {
                r.task.abort();
                if !wanted.contains_key(&id) {
                    // Deleted or disabled: what it had not sent is not kept for it.
                    let _ = self.core.store.remove_outbox_cursor(&id.to_string());
                }
            }
        }
        for (id, sink) in wanted {
            if runners.contains_key(&id) {
                continue;
            }
            let reader = id.to_string();
            let durable = *self.core.store.outbox_durable().borrow();
            let cursor = match self.core.store.outbox_cursor(&reader) {
                Ok(Some(c)) => c,
                _ => {
                    let _ = self.core.store.set_outbox_cursor(&reader, durable);
                    durable
                }
            };
            let stats = Arc::new(Stats::default());
            stats.cursor.store(cursor, Ordering::Release);
            let task = tokio::spawn(run(self.clone(), sink.clone(), stats.clone()));
            runners.insert(id, Runner { sink, stats, task });
        }
    }

    /// Removes what every sink has sent, and the oldest entries past the bound (each sink
    /// that had not confirmed them counts them as dropped and skips them).
    async fn trim(&self) {
        let (_, next) = self.core.store.outbox_bounds();
        let slowest = self.runners.lock().values().map(|r| r.stats.cursor.load(Ordering::Acquire)).min();
        let mut below = slowest.map_or(next, |c| c + 1);
        if next.saturating_sub(below) > self.cfg.outbox_max_entries {
            below = next - self.cfg.outbox_max_entries;
            let mut lost_most = 0;
            for r in self.runners.lock().values() {
                let before = r.stats.cursor.fetch_max(below - 1, Ordering::AcqRel);
                let lost = (below - 1).saturating_sub(before);
                if lost > 0 {
                    r.stats.dropped.fetch_add(lost, Ordering::Relaxed);
                    r.stats.error(format!(
                        "the outbox was full (forwarding.outbox_max_entries): {lost} entries were dropped before \
                         this sink confirmed them"
                    ));
                    lost_most = lost_most.max(lost);
                }
            }
            tracing::warn!(
                entries = lost_most,
                "data forwarding: the outbox is full (forwarding.outbox_max_entries); its oldest entries are dropped"
            );
        }
        let store = self.core.store.clone();
        if let Err(e) = blocking(move || store.outbox_trim(below)).await {
            tracing::warn!(error = %e, "data forwarding: the outbox could not be trimmed");
        }
    }

    fn stats_json(&self, id: Uuid) -> J {
        let runners = self.runners.lock();
        let Some(r) = runners.get(&id) else { return json!({"running": false}) };
        let s = &r.stats;
        let (_, next) = self.core.store.outbox_bounds();
        let cursor = s.cursor.load(Ordering::Acquire);
        let error = s.last_error.lock().clone();
        json!({
            "running": true,
            "deliveredEvents": s.delivered.load(Ordering::Relaxed),
            "failedAttempts": s.failures.load(Ordering::Relaxed),
            "droppedEntries": s.dropped.load(Ordering::Relaxed),
            "pendingEntries": next.saturating_sub(cursor + 1),
            "lastDeliveryTime": s.last_delivery.load(Ordering::Relaxed),
            "lastLagMs": s.lag_ms.load(Ordering::Relaxed),
            "lastErrorTime": error.as_ref().map(|e| e.0),
            "lastError": error.map(|e| e.1),
        })
    }
}

/// One sink's task: reads the outbox from its cursor, delivers, moves the cursor.
async fn run(fwd: Arc<Forwarding>, sink: Sink, stats: Arc<Stats>) {
    let store = fwd.core.store.clone();
    let reader = sink.id.to_string();
    let mut durable = store.outbox_durable();
    let mut out = deliver::Deliverer::new(&sink, &fwd.cfg);
    let mut cursor = stats.cursor.load(Ordering::Acquire);
    loop {
        let mut upto = *durable.borrow_and_update();
        if upto <= cursor {
            if durable.changed().await.is_err() {
                return;
            }
            continue;
        }
        // Entries the outbox dropped (counted by the trim) are skipped.
        cursor = cursor.max(stats.cursor.load(Ordering::Acquire));
        let limit = fwd.cfg.batch_max_entries.max(1);
        if upto.saturating_sub(cursor) < limit as u64 && !fwd.cfg.linger.duration().is_zero() {
            tokio::time::sleep(fwd.cfg.linger.duration()).await;
            upto = *durable.borrow_and_update();
        }
        let (core, sink_now, from) = (fwd.core.clone(), sink.clone(), cursor);
        // One blocking call reads the entries and builds their events.
        let read = blocking(move || {
            let entries = core.store.outbox_read(from, upto, limit)?;
            // Read up to `upto` unless the batch was full.
            let done_upto = if entries.len() < limit { upto } else { entries.last().map_or(upto, |e| e.seq) };
            let last_at = entries.last().map(|e| e.at);
            Ok((done_upto, last_at, events(&core, &sink_now, entries)))
        })
        .await;
        let (done_upto, last_at, events) = match read {
            Ok(r) => r,
            Err(e) => {
                stats.failed(format!("reading the outbox: {e}"));
                tokio::time::sleep(fwd.cfg.retry_delay.duration()).await;
                continue;
            }
        };
        if !events.is_empty() {
            let mut delay = fwd.cfg.retry_delay.duration();
            while let Err(e) = out.deliver(&events).await {
                tracing::debug!(sink = %sink.id, error = %e, "data forwarding: delivery failed");
                stats.failed(e);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            }
            let now = Ts::now().0;
            stats.delivered.fetch_add(events.len() as u64, Ordering::Relaxed);
            stats.last_delivery.store(now, Ordering::Relaxed);
            if let Some(at) = last_at {
                stats.lag_ms.store(now - at.0, Ordering::Relaxed);
            }
        }
        cursor = stats.cursor.fetch_max(done_upto, Ordering::AcqRel).max(done_upto);
        if let Err(e) = store.set_outbox_cursor(&reader, cursor) {
            stats.failed(format!("saving the cursor: {e}"));
        }
    }
}

/// The events of `entries` that `sink` takes, as JSON (storage reads: off the async
/// threads).
fn events(core: &Core, sink: &Sink, entries: Vec<OutboxEntry>) -> Vec<J> {
    let device = |id: DeviceId| core.store.device_cached(id).ok().flatten();
    let mut out = Vec::new();
    for e in entries {
        let (seq, at) = (e.seq, e.at.0);
        match e.event {
            OutboxEvent::Telemetry { device: id, records } => {
                let Some(d) = device(id).filter(|d| mine(core, sink, TELEMETRY, d)) else { continue };
                for r in records {
                    if let Some(values) = values(sink, r.values) {
                        out.push(event(core, seq, "TELEMETRY", r.ts.0, &d, values));
                    }
                }
            }
            OutboxEvent::Attributes { device: id, scope, values: v } => {
                let Some(d) = device(id).filter(|d| mine(core, sink, ATTRIBUTES, d)) else { continue };
                if let Some(values) = values(sink, v) {
                    let mut ev = event(core, seq, "ATTRIBUTES", at, &d, values);
                    ev["scope"] = scope.as_str().into();
                    out.push(ev);
                }
            }
            OutboxEvent::Alarm { id, title, doc } => {
                let Ok(a) = crate::alarms::Alarm::from_written(id, title, doc) else { continue };
                if a.tenant != sink.tenant || !sink.events[ALARM] {
                    continue;
                }
                let originator = (a.originator.kind == "DEVICE").then(|| device(DeviceId(a.originator.id))).flatten();
                if !sink.takes(ALARM, originator.as_ref().map(|d| d.profile_id())) {
                    continue;
                }
                let mut ev = json!({
                    "seq": seq,
                    "type": "ALARM",
                    "ts": at,
                    "tenantId": a.tenant,
                    "originatorType": a.originator.kind,
                    "originatorId": a.originator.id,
                    "alarm": a.to_json(),
                });
                if let Some(d) = originator {
                    ev["deviceId"] = d.id.0.to_string().into();
                    ev["deviceName"] = d.name.as_str().into();
                    ev["deviceType"] = d.device_type.as_str().into();
                }
                out.push(ev);
            }
        }
    }
    out
}

/// Whether `d` is of the sink's tenant and takes `event` of it.
fn mine(core: &Core, sink: &Sink, event: usize, d: &DeviceRecord) -> bool {
    core.tenant_of(d.tenant) == sink.tenant && sink.takes(event, Some(d.profile_id()))
}

/// The values the sink takes, as a JSON object; `None` when none is left.
fn values(sink: &Sink, values: Vec<(String, gridlinks_types::Value)>) -> Option<Map<String, J>> {
    let m: Map<String, J> = values
        .into_iter()
        .filter(|(k, _)| sink.keys.is_empty() || sink.keys.contains(k))
        .map(|(k, v)| (k, v.to_json()))
        .collect();
    (!m.is_empty()).then_some(m)
}

fn event(core: &Core, seq: u64, kind: &str, ts: i64, d: &DeviceRecord, values: Map<String, J>) -> J {
    json!({
        "seq": seq,
        "type": kind,
        "ts": ts,
        "tenantId": core.tenant_of(d.tenant),
        "customerId": d.customer,
        "deviceId": d.id.0,
        "deviceName": d.name,
        "deviceType": d.device_type,
        "deviceProfileId": d.profile_id().0,
        "values": values,
    })
}

impl crate::metrics::Source for Forwarding {
    fn encode(&self, e: &mut prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
        use crate::metrics::{gauge, labelled_counter, labelled_gauge};
        let (tail, next) = self.core.store.outbox_bounds();
        let runners = self.runners.lock();
        let ids: Vec<(String, &Stats)> = runners.iter().map(|(id, r)| (id.to_string(), &*r.stats)).collect();
        let per =
            |f: &dyn Fn(&Stats) -> u64| -> Vec<(&str, u64)> { ids.iter().map(|(id, s)| (id.as_str(), f(s))).collect() };
        gauge(e, "gridlinks_forward_outbox_entries", "Entries the data-forwarding outbox holds.", next - tail)?;
        labelled_counter(
            e,
            "gridlinks_forward_delivered_events_total",
            "Events delivered, by sink.",
            "sink",
            &per(&|s| s.delivered.load(Ordering::Relaxed)),
        )?;
        labelled_counter(
            e,
            "gridlinks_forward_failed_attempts_total",
            "Failed delivery tries (each is retried), by sink.",
            "sink",
            &per(&|s| s.failures.load(Ordering::Relaxed)),
        )?;
        labelled_counter(
            e,
            "gridlinks_forward_dropped_entries_total",
            "Outbox entries dropped (the outbox was full) before the sink sent them, by sink.",
            "sink",
            &per(&|s| s.dropped.load(Ordering::Relaxed)),
        )?;
        labelled_gauge(
            e,
            "gridlinks_forward_pending_entries",
            "Outbox entries the sink has not passed yet.",
            "sink",
            &per(&|s| next.saturating_sub(s.cursor.load(Ordering::Acquire) + 1)),
        )?;
        labelled_gauge(
            e,
            "gridlinks_forward_lag_milliseconds",
            "Commit to delivery of the last entry the sink delivered.",
            "sink",
            &per(&|s| u64::try_from(s.lag_ms.load(Ordering::Relaxed)).unwrap_or(0)),
        )
    }
}
