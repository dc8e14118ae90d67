//! The running server: start-up (store, writer, admin account, secrets), the HTTP
//! router, `/healthz`, `/readyz` and `/metrics`, and ordered shutdown (stop accepting → finish
//! in-flight requests → drain the write queue → final sync).

use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, delete, get, post, put};
use axum::Router;
use gridlinks_storage::{Health, Store, StoreOptions, WriteOp, WriteOutcome, WriterConfig, WriterHandle};
use uuid::Uuid;

use crate::auth::{self, Auth};
use crate::config::Config;
use crate::mqtt::clients::{self, Credentials};
use crate::mqtt::{Mqtt, MqttMetrics};
use crate::thingsboard::rpc::{self, RpcRegistry};
use crate::thingsboard::{
    api, api_keys, claim, customers, dashboards, device_api, profiles, relations, tenants, users,
};
use gridlinks_broker::acl::Acl;
use gridlinks_broker::sessions::Sessions;
use gridlinks_ingest::Ingest;
use gridlinks_thingsboard::payload::PayloadLimits;

/// The platform every subsystem is built on: the configuration, storage (reads, and the
/// writer queue for what is not device data), the ingest boundary and the tenant. Cheap to
/// clone; a subsystem keeps its own copy.
#[derive(Clone)]
pub struct Core {
    /// The configuration in force.
    pub cfg: Arc<Config>,
    /// Reads.
    pub store: Store,
    /// Telemetry reads and deletes: the node's store or a shared database (`cluster.timeseries`).
    pub ts: crate::cluster::TsStore,
    /// The shared services (Kafka, PostgreSQL) as last probed: while one is down, new work
    /// is refused.
    pub backends: Arc<crate::cluster::Backends>,
    /// Writes that are not device data (devices, deletes, broker rows): group commit.
    pub writer: WriterHandle,
    /// Device data in: credentials, batched durable submits, live fan-out.
    pub ingest: Ingest,
    /// The first tenant's id: the tenant of everything stored without one.
    pub tenant_id: Uuid,
    /// Devices' open claims.
    pub claims: Arc<crate::thingsboard::claim::Claims>,
    /// Throttles on credential-conflict answers and on provisioning.
    pub guards: Arc<crate::thingsboard::guards::Guards>,
    /// Live delivery across nodes (client publishes go to it; other nodes' come from it).
    pub bus: Option<Arc<gridlinks_kafka::Bus>>,
}

impl Core {
    /// The tenant of an entity as storage keeps it (`None`: the first tenant).
    pub fn tenant_of(&self, stored: Option<Uuid>) -> Uuid {
        stored.unwrap_or(self.tenant_id)
    }

    /// A tenant as storage keeps it: the first one as `None`, as before tenants existed.
    pub fn stored_tenant(&self, tenant: Uuid) -> Option<Uuid> {
        (tenant != self.tenant_id).then_some(tenant)
    }

    /// The tenant of a document (its `tenantId`; none: the first tenant).
    pub fn doc_tenant(&self, d: &gridlinks_storage::DocRecord) -> Uuid {
        self.tenant_of(d.doc.get("tenantId").and_then(serde_json::Value::as_str).and_then(|t| t.parse().ok()))
    }

    /// Sets a document's tenant (a client's `tenantId` is never trusted).
    pub fn set_doc_tenant(&self, doc: &mut serde_json::Value, tenant: Uuid) {
        if let Some(o) = doc.as_object_mut() {
            match self.stored_tenant(tenant) {
                Some(t) => o.insert("tenantId".into(), t.to_string().into()),
                None => o.remove("tenantId"),
            };
        }
    }

    /// Payload bounds from the configuration.
    pub fn payload_limits(&self) -> PayloadLimits {
        PayloadLimits {
            max_key_len: self.cfg.limits.max_key_len,
            max_values: self.cfg.limits.max_values_per_request,
            cast_strings: true,
        }
    }
}

/// Readiness and the HTTP side's own counters.
#[derive(Default)]
pub struct Status {
    /// False until start-up completes and again during shutdown.
    pub ready: AtomicBool,
    /// Device payloads refused as malformed or over limits.
    pub payload_rejected: AtomicU64,
    /// HTTP connections refused at `http.max_connections` or
    /// `http.max_connections_per_address` with every connection in the way busy.
    pub http_over_limit: AtomicU64,
}

/// The HTTP router's state: one handle per subsystem. A handler asks for the one it needs —
/// `State<Arc<Core>>`, `State<Arc<Auth>>`, `State<Arc<Mqtt>>` (device sessions, RPC,
/// application credentials), `State<Arc<Status>>` — through [`FromRef`]. axum clones the
/// state for every request: one reference count.
#[derive(Clone)]
pub struct Http(Arc<Handles>);

/// What [`Http`] hands out.
pub struct Handles {
    /// Storage, ingest, configuration.
    pub core: Arc<Core>,
    /// The administrator's login, tokens and the password-check defences.
    pub auth: Arc<Auth>,
    /// The MQTT subsystem.
    pub mqtt: Arc<Mqtt>,
    /// Readiness and counters.
    pub status: Arc<Status>,
    /// Custom TCP protocols' counters.
    pub tcp: Arc<crate::tcp::TcpMetrics>,
    /// CoAP counters.
    pub coap: Arc<crate::coap::CoapMetrics>,
    /// WebSocket API subscriptions.
    pub ws: Arc<crate::ws::Hub>,
}

impl std::ops::Deref for Http {
    type Target = Handles;
    fn deref(&self) -> &Handles {
        &self.0
    }
}

impl FromRef<Http> for Arc<Core> {
    fn from_ref(h: &Http) -> Self {
        h.core.clone()
    }
}

impl FromRef<Http> for Arc<Auth> {
    fn from_ref(h: &Http) -> Self {
        h.auth.clone()
    }
}

impl FromRef<Http> for Arc<Mqtt> {
    fn from_ref(h: &Http) -> Self {
        h.mqtt.clone()
    }
}

impl FromRef<Http> for Arc<Status> {
    fn from_ref(h: &Http) -> Self {
        h.status.clone()
    }
}

/// The bulk import's path: its bodies may be larger (`http.max_import_bytes`).
pub const BULK_IMPORT_PATH: &str = "/api/device/bulk_import";

/// The HTTP routes.
pub fn router(state: Http) -> Router {
    let body_limit = state.core.cfg.http.max_body_bytes;
    let import_limit = state.core.cfg.http.max_import_bytes;
    let tel = "/api/plugins/telemetry/{entity_type}/{id}";
    Router::new()
        .route("/", get(crate::console::index))
        .route("/assets/{file}", get(crate::console::asset))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/ws", get(crate::ws::upgrade))
        .route("/api/ws/plugins/telemetry", get(crate::ws::upgrade_legacy))
        .route("/api/auth/login", post(api::login))
        .route("/api/auth/token", post(api::refresh))
        .route("/api/auth/logout", post(api::logout))
        .route("/api/auth/user", get(users::current))
        .route("/api/auth/changePassword", post(users::change_password))
        .route("/api/noauth/activate", post(users::activate).get(users::activate_page))
        .route("/api/user", post(users::save))
        .route("/api/user/{id}", get(users::get).delete(users::delete))
        .route("/api/user/{id}/activationLink", get(users::get_activation_link))
        .route("/api/user/{id}/activationLinkInfo", get(users::get_activation_link_info))
        .route("/api/users", get(users::list))
        .route("/api/tenant", post(tenants::save))
        .route("/api/tenant/{id}", get(tenants::get).delete(tenants::delete))
        .route("/api/tenant/{id}/users", get(users::of_tenant))
        .route("/api/tenants", get(tenants::list))
        .route("/api/customer/{customer}/users", get(users::of_customer))
        .route("/api/deviceProfiles", get(profiles::list))
        .route("/api/deviceProfileInfos", get(profiles::infos))
        .route("/api/deviceProfile", post(profiles::save))
        .route("/api/deviceProfile/names", get(profiles::names))
        .route("/api/deviceProfile/{id}", get(profiles::get).delete(profiles::delete))
        .route("/api/deviceProfile/{id}/default", post(profiles::set_default))
        .route("/api/deviceProfileInfo/default", get(profiles::default_info))
        .route("/api/deviceProfileInfo/{id}", get(profiles::info))
        .route("/api/apiKey", post(api_keys::create))
        .route("/api/apiKeys/{user}", get(api_keys::list))
        .route("/api/apiKey/{id}", delete(api_keys::delete))
        .route("/api/apiKey/{id}/enabled/{enabled}", put(api_keys::set_enabled))
        .route("/api/apiKey/{id}/description", put(api_keys::set_description))
        .route("/api/customer", post(customers::save))
        .route("/api/customer/{id}", get(customers::get).delete(customers::delete))
        .route("/api/customers", get(customers::list))
        .route("/api/tenant/customers", get(customers::by_title))
        .route("/api/customer/{customer}/device/{device}", post(customers::assign))
        .route("/api/customer/device/{device}", delete(customers::unassign))
        .route("/api/customer/device/{device}/claim", post(claim::claim).delete(claim::reclaim))
        .route("/api/owner/{kind}/{owner}/{entity_type}/{entity}", post(customers::change_owner))
        .route("/api/customer/{customer}/devices", get(customers::devices))
        .route(
            "/api/customer/{customer}/dashboard/{dashboard}",
            post(customers::assign_dashboard_to).delete(customers::unassign_dashboard_from),
        )
        .route("/api/customer/{customer}/dashboards", get(customers::dashboards_of))
        .route("/api/dashboard", post(dashboards::save))
        .route("/api/dashboard/{id}", get(dashboards::get).delete(dashboards::delete))
        .route("/api/dashboard/info/{id}", get(dashboards::info))
        .route("/api/tenant/dashboards", get(dashboards::list))
        .route("/api/ruleChains", any(profiles::rule_engine))
        .route("/api/ruleChain", any(profiles::rule_engine))
        .route("/api/ruleChain/{*rest}", any(profiles::rule_engine))
        .route("/api/ruleNode/{*rest}", any(profiles::rule_engine))
        .route("/api/device", post(api::save_device))
        .route("/api/device/{id}", get(api::get_device).delete(api::delete_device))
        .route("/api/device/{id}/credentials", get(api::get_credentials))
        .route("/api/device/credentials", post(api::save_credentials))
        .route(BULK_IMPORT_PATH, post(api::bulk_import).layer(DefaultBodyLimit::max(import_limit)))
        .route("/api/tenant/devices", get(api::list_devices))
        .route("/api/relation", post(relations::save).delete(relations::delete))
        .route("/api/relations", get(relations::list))
        .route(&format!("{tel}/values/timeseries"), get(api::get_timeseries))
        .route(&format!("{tel}/values/timeseries/history"), get(api::get_timeseries_history))
        .route(&format!("{tel}/keys/timeseries"), get(api::ts_keys))
        .route(&format!("{tel}/keys/attributes"), get(api::attr_keys))
        .route(&format!("{tel}/keys/attributes/{{scope}}"), get(api::attr_keys_scope))
        .route(&format!("{tel}/values/attributes"), get(api::get_attributes))
        .route(&format!("{tel}/values/attributes/{{scope}}"), get(api::get_attributes_scope))
        .route(&format!("{tel}/attributes/{{scope}}"), post(api::post_attributes))
        .route(&format!("{tel}/timeseries/delete"), delete(api::delete_timeseries))
        .route(&format!("{tel}/timeseries/{{scope}}"), post(api::post_timeseries))
        .route(&format!("{tel}/{{scope}}"), delete(api::delete_attributes).post(api::post_attributes))
        // ThingsBoard's older device-only form: /api/plugins/telemetry/{deviceId}/{scope}.
        .route(tel, post(api::post_device_attributes))
        .route("/api/plugins/rpc/{kind}/{device_id}", post(rpc::rpc_v1))
        .route("/api/rpc/{kind}/{device_id}", post(rpc::rpc_v2))
        .route("/api/mqtt/clients", post(clients::save).get(clients::list))
        .route("/api/mqtt/clients/{username}", get(clients::get).delete(clients::delete))
        .route("/api/v1/provision", post(device_api::provision))
        .route("/api/v1/{token}/telemetry", post(device_api::post_telemetry))
        .route("/api/v1/{token}/attributes", post(device_api::post_attributes).get(device_api::get_attributes))
        .route("/api/v1/{token}/claim", post(device_api::post_claim))
        .fallback(api::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// `GET /healthz`: 200 while the server takes data; 503 before it is ready, while shutting
/// down, and while storage refuses writes (disk full, or reopening after a failure) — reads
/// keep working then. The node's own state only: a liveness check.
async fn healthz(State(core): State<Arc<Core>>, State(status): State<Arc<Status>>) -> impl IntoResponse {
    let (up, body) = local_health(&core, &status);
    answer(up, body)
}

/// `GET /readyz`: `/healthz` and the shared services (`backends`: Kafka, PostgreSQL, each
/// `"UP"` or `"DOWN: why"`): 503 while any is down, when the node refuses new work. A
/// load balancer's readiness check. `storage_lag`: records in Kafka not stored yet.
async fn readyz(State(core): State<Arc<Core>>, State(status): State<Arc<Status>>) -> impl IntoResponse {
    let (up, mut body) = local_health(&core, &status);
    body.insert("backends".into(), core.backends.report().into());
    body.insert("storage_lag".into(), core.backends.lag().into());
    answer(up && core.backends.refusal().is_none(), body)
}

/// Whether the node itself takes data, and the body saying so.
fn local_health(core: &Core, status: &Status) -> (bool, serde_json::Map<String, serde_json::Value>) {
    let health = core.store.health();
    let storage = match health {
        Health::Ok => "OK",
        Health::DiskFull => "DISK_FULL",
        Health::Failed => "FAILED",
    };
    let up = status.ready.load(Ordering::Acquire) && health == Health::Ok;
    (up, serde_json::Map::from_iter([("storage".to_owned(), storage.into())]))
}

/// 200 `{"status":"UP",…}` or 503 `{"status":"DOWN",…}`.
fn answer(up: bool, mut body: serde_json::Map<String, serde_json::Value>) -> impl IntoResponse {
    body.insert("status".into(), if up { "UP" } else { "DOWN" }.into());
    let code = if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, axum::Json(serde_json::Value::Object(body)))
}

/// `GET /metrics`: OpenMetrics text, every name in [`crate::metrics`].
async fn metrics(State(st): State<Http>) -> axum::response::Response {
    match crate::metrics::render(&st) {
        Ok(body) => ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the metrics").into_response(),
    }
}

/// The password hash of a user of the configuration: of `password` when set, else the one
/// kept as a shared setting under `key`, generated and printed once on the first start.
async fn configured_password(
    store: &Store,
    writer: &WriterHandle,
    cfg: &Config,
    user: &str,
    password: &str,
    key: &str,
) -> anyhow::Result<String> {
    if !password.is_empty() {
        return Ok(auth::hash_password(password)?);
    }
    let mut generated = None;
    let (hash, created) = shared_setting(store, writer, key, || {
        let pw = gridlinks_storage::generate_token();
        let hash = auth::hash_password(&pw)?;
        generated = Some(pw);
        Ok(hash)
    })
    .await?;
    if let (Some(pw), true) = (generated, created) {
        // Printed once, on the first start only; only the hash is kept.
        println!(
            "GridLinks generated the password for user '{user}': {pw}\n\
             It is stored hashed in {} and will not be shown again. \
             Set it in the configuration (admin section) to choose your own.",
            cfg.data_dir.display()
        );
    }
    Ok(hash)
}

/// A setting every node shares (`settings`), made with `make` on the first start; whether
/// it was made now. A value kept in `meta` by versions before settings were shared is
/// taken over.
async fn shared_setting(
    store: &Store,
    writer: &WriterHandle,
    name: &str,
    make: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<(String, bool)> {
    if let Some(v) = store.setting(name)? {
        return Ok((String::from_utf8(v).context("stored setting is not UTF-8")?, false));
    }
    let made = make()?;
    let op = WriteOp::SettingIfAbsent { name: name.to_owned(), value: made.clone().into_bytes() };
    match writer.submit(op).await? {
        WriteOutcome::Setting(v) => {
            let v = String::from_utf8(v).context("stored setting is not UTF-8")?;
            let created = v == made;
            Ok((v, created))
        }
        _ => anyhow::bail!("unexpected write outcome for setting {name}"),
    }
}

/// Makes `dir` and everything in it private to the server's user: directories 0700, files
/// 0600 (the store holds device tokens, password hashes and sessions). How many entries had
/// to be changed.
fn private_tree(dir: &std::path::Path) -> std::io::Result<usize> {
    use std::os::unix::fs::PermissionsExt;
    let mut changed = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let meta = std::fs::symlink_metadata(&d)?;
        if meta.permissions().mode() & 0o777 != 0o700 {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))?;
            changed += 1;
        }
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))?;
                changed += 1;
            }
        }
    }
    Ok(changed)
}

/// Re-reads the JWT secret file every few seconds; a new secret (`gridlinks admin
/// rotate-secret`) takes effect at once and logs every session out.
async fn watch_secret(auth: Arc<Auth>, path: std::path::PathBuf, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut current = auth::secret::read(&path).ok();
    let mut tick = tokio::time::interval(auth::secret::WATCH_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // Ends with the server.
            _ = stop.changed() => return,
        }
        let read = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || auth::secret::read(&path)).await
        };
        match read {
            Ok(Ok(secret)) if current.as_ref() != Some(&secret) => {
                current = Some(secret.clone());
                match auth.set_secret(secret).await {
                    Ok(()) => tracing::info!(file = %path.display(), "JWT secret changed: every session is logged out"),
                    Err(e) => {
                        tracing::error!(error = %e, "JWT secret changed, but the ended logins could not be stored")
                    }
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                crate::logging::warn_limited!(error = %e, file = %path.display(), "cannot read the JWT secret file; keeping the current secret")
            }
            Err(_) => return,
        }
    }
}

/// Runs the server until `shutdown` resolves; returns after the final sync.
pub async fn serve(
    cfg: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&cfg.data_dir)
        .with_context(|| format!("cannot create data directory {}", cfg.data_dir.display()))?;
    let tightened = private_tree(&cfg.data_dir)
        .with_context(|| format!("cannot restrict the permissions of {}", cfg.data_dir.display()))?;
    if tightened > 0 {
        tracing::warn!(files = tightened, data_dir = %cfg.data_dir.display(), "data directory was readable by other users; restricted it to the server's user (0700 directories, 0600 files)");
    }
    let store = Store::open(
        &cfg.data_dir,
        &StoreOptions {
            cache_bytes: cfg.storage.cache_mb * 1024 * 1024,
            memtable_bytes: cfg.storage.memtable_mb * 1024 * 1024,
            max_open_files: cfg.storage.max_open_files,
        },
    )
    .with_context(|| format!("cannot open storage in {}", cfg.data_dir.display()))?;

    // Shared entities: the store follows the cluster's replica, caught up before anything
    // reads it.
    crate::cluster::attach_entities(&cfg.cluster, &store).await?;
    let (writer, writer_thread) = store.start_writer(WriterConfig {
        queue_capacity: cfg.storage.queue_capacity,
        max_batch_ops: cfg.storage.max_batch_ops,
        fsync: cfg.storage.fsync,
        enqueue_timeout: cfg.storage.enqueue_timeout.duration(),
        max_keys: cfg.storage.max_keys,
        min_free_bytes: cfg.storage.min_free_mb * 1024 * 1024,
        max_devices_per_tenant: cfg.limits.max_devices_per_tenant,
    })?;
    let follower = crate::cluster::follow_entities(&cfg.cluster, &writer).await?;

    let admin_hash =
        configured_password(&store, &writer, &cfg, &cfg.admin.user, &cfg.admin.password, "admin_password_hash").await?;
    let sysadmin_hash = configured_password(
        &store,
        &writer,
        &cfg,
        &cfg.admin.sysadmin_user,
        &cfg.admin.sysadmin_password,
        "sysadmin_password_hash",
    )
    .await?;
    let secret_file = cfg.auth.jwt_secret.is_empty().then(|| auth::secret::path(&cfg));
    let jwt_secret = match &secret_file {
        None => cfg.auth.jwt_secret.clone().into_bytes(),
        Some(path) => {
            // Versions before 0.1 kept the secret in the store; it moves to the file.
            let legacy = store.meta_get("jwt_secret")?;
            let secret = auth::secret::load_or_create(path, legacy.clone())
                .with_context(|| format!("JWT secret file {}", path.display()))?;
            if legacy.is_some() {
                store.meta_delete("jwt_secret")?;
            }
            secret
        }
    };
    let tenant_id: Uuid = shared_setting(&store, &writer, "tenant_id", || Ok(Uuid::new_v4().to_string()))
        .await?
        .0
        .parse()
        .context("stored tenant id")?;

    let addr: SocketAddr = cfg.http.bind.parse().context("http.bind")?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let mqtt_addr: SocketAddr = cfg.mqtt.bind.parse().context("mqtt.bind")?;
    let mqtt_listener = tokio::net::TcpListener::bind(mqtt_addr)
        .await
        .with_context(|| format!("cannot listen on {mqtt_addr} (MQTT)"))?;
    let mqtt_local = mqtt_listener.local_addr()?;
    let ws_listener = match cfg.mqtt.ws_bind.as_str() {
        "" => None,
        bind => {
            let addr: SocketAddr = bind.parse().context("mqtt.ws_bind")?;
            Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (MQTT over WebSocket)"))?,
            )
        }
    };
    let ws_local = ws_listener.as_ref().map(|l| l.local_addr()).transpose()?;
    let coap_socket = match cfg.coap.bind.as_str() {
        "" => None,
        bind => {
            let addr: SocketAddr = bind.parse().context("coap.bind")?;
            Some(
                tokio::net::UdpSocket::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (CoAP, UDP)"))?,
            )
        }
    };
    let coap_local = coap_socket.as_ref().map(|s| s.local_addr()).transpose()?;
    let mut tcp_listeners = Vec::new();
    for l in &cfg.tcp.listeners {
        let addr: SocketAddr = l.bind.parse().context("tcp.listeners bind")?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (custom TCP protocol {})", l.protocol))?;
        tcp_listeners.push((l.clone(), listener));
    }
    let drop_oldest = cfg.mqtt.offline_queue_full == "drop_oldest";
    let hard_limit = cfg.mqtt.client_queue_hard_limit;
    let max_subscriptions = cfg.mqtt.max_subscriptions_per_client;
    let anonymous_acl =
        Arc::new(Acl { publish: cfg.mqtt.anonymous_publish.clone(), subscribe: cfg.mqtt.anonymous_subscribe.clone() });
    auth::users::hide_other_tenants(cfg.auth.hide_other_tenants);
    let auth = Arc::new(Auth::new(&cfg, &store, &writer, jwt_secret, [admin_hash, sysadmin_hash], tenant_id)?);
    let sessions = Arc::new(
        Sessions::with_interest(crate::mqtt::telemetry_topics::FILTER, Some(crate::mqtt::MOUNT_ROOT))
            .drop_oldest_when_offline_queue_full(drop_oldest)
            .hard_limit(hard_limit)
            .max_subscriptions(max_subscriptions)
            .groups_elsewhere(cfg.cluster.several_nodes()),
    );
    let ws_hub = Arc::new(crate::ws::Hub::default());
    let live = crate::mqtt::telemetry_topics::CanonicalTopics {
        sessions: sessions.clone(),
        writer: writer.clone(),
        store: store.clone(),
        ws: ws_hub.clone(),
        first_tenant: tenant_id,
    };
    let cluster = crate::cluster::start(&cfg.cluster, &store, &writer).await?;
    let live = Arc::new(live);
    let ingest = Ingest::new(store.clone(), cluster.log, live.clone(), cfg.limits.max_devices_per_gateway)
        .gateways_adopt(cfg.limits.gateway_adopts_devices);
    let (ts, backends, bus, cluster_tasks) = (cluster.ts, cluster.backends, cluster.bus, cluster.tasks);
    let guards = Arc::new(crate::thingsboard::guards::Guards::new(&cfg));
    let core = Core {
        cfg: Arc::new(cfg),
        store: store.clone(),
        ts,
        backends,
        writer,
        ingest,
        tenant_id,
        claims: Default::default(),
        guards,
        bus,
    };
    crate::thingsboard::tenants::ensure_first(&core).await.context("writing the first tenant")?;
    let mqtt = Arc::new(Mqtt {
        core: core.clone(),
        auth: auth.clone(),
        rpc: RpcRegistry::new(core.bus.clone()),
        clients: Credentials::load(&store, &sessions).context("loading MQTT client credentials")?,
        sessions,
        metrics: MqttMetrics::default(),
        anonymous_acl,
        credential_counts: Arc::default(),
        shared: core.bus.as_ref().map(|b| crate::mqtt::shared::SharedGroups::new(b.settings().clone())),
        handoffs: Default::default(),
    });
    let status = Arc::new(Status::default());
    let tcp_metrics = Arc::new(crate::tcp::TcpMetrics::default());
    let coap_metrics = Arc::new(crate::coap::CoapMetrics::default());
    let core = Arc::new(core);
    let mut tcp_shared = Vec::new();
    // One script pool for every listener that runs scripts.
    let mut scripts = None;
    for (l, listener) in tcp_listeners {
        let protocol = crate::tcp::Protocol::load(&core, &l)
            .with_context(|| format!("tcp.listeners ({}, protocol {})", l.bind, l.protocol))?;
        let pool = if protocol.uses_script() {
            if scripts.is_none() {
                let threads = match core.cfg.tcp.script_threads {
                    0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                    n => n,
                };
                let pool = crate::tcp::scripts::ScriptPool::start(threads).context("starting the script threads")?;
                scripts = Some(Arc::new(pool));
            }
            scripts.clone()
        } else {
            None
        };
        let shared = crate::tcp::Shared {
            core: core.clone(),
            mqtt: mqtt.clone(),
            protocol: Arc::new(protocol),
            metrics: tcp_metrics.clone(),
            scripts: pool,
        };
        tcp_shared.push((listener, shared));
    }
    let retained = crate::mqtt::retained::load(&store, &mqtt.sessions).context("loading retained MQTT messages")?;
    let sessions = crate::mqtt::pubsub::load(&mqtt).context("loading persistent MQTT sessions")?;
    tracing::debug!(retained, sessions, "retained messages and persistent sessions loaded");
    if let Some(shared) = &mqtt.shared {
        // Stored sessions' shared subscriptions.
        shared.sweep(&mqtt);
    }
    let sweeper = crate::mqtt::shared::keep_up(&mqtt);
    // `live` holds a writer handle: it must not outlive the server (the writer drains when
    // the last handle goes).
    let bus_task = mqtt
        .core
        .bus
        .as_ref()
        .map(|bus| crate::mqtt::pubsub::follow_bus(bus, &mqtt, live))
        .transpose()
        .context("following the kafka bus")?;
    let revoker = crate::mqtt::close_revoked(&mqtt);
    let cfg = core.cfg.clone();
    let app = router(Http(Arc::new(Handles {
        core,
        auth: auth.clone(),
        mqtt: mqtt.clone(),
        status: status.clone(),
        tcp: tcp_metrics,
        coap: coap_metrics.clone(),
        ws: ws_hub,
    })));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (alive, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let limit = Arc::new(tokio::sync::Semaphore::new(cfg.mqtt_max_connections()));
    if let Some(path) = secret_file {
        tokio::spawn(watch_secret(auth.clone(), path, stop_rx.clone()));
    }
    let ws_task = ws_listener
        .map(|l| tokio::spawn(crate::mqtt::listen_ws(l, mqtt.clone(), stop_rx.clone(), alive.clone(), limit.clone())));
    let coap_task =
        coap_socket.map(|s| tokio::spawn(crate::coap::serve(s, mqtt.clone(), coap_metrics, stop_rx.clone())));
    let mut tcp_tasks = Vec::new();
    let mut tcp_locals = Vec::new();
    for (listener, shared) in tcp_shared {
        tcp_locals.push(format!("{} {}", shared.protocol.name, listener.local_addr()?));
        let task = crate::tcp::listen(listener, shared, stop_rx.clone(), alive.clone(), limit.clone());
        tcp_tasks.push(tokio::spawn(task));
    }
    let mqtt_task = tokio::spawn(crate::mqtt::listen(mqtt_listener, mqtt.clone(), stop_rx.clone(), alive, limit));
    let limits = crate::listener::HttpLimits {
        header_read_timeout: cfg.http.header_read_timeout.duration(),
        max_connections: cfg.http_max_connections(),
        max_per_address: match cfg.http.max_connections_per_address {
            0 => usize::MAX,
            n => n,
        },
        unbounded: cfg.http.unbounded_addresses.clone(),
        keepalive_idle: cfg.tcp_keepalive_idle.duration(),
    };
    let st = status.clone();
    let over_limit = move |why| {
        st.http_over_limit.fetch_add(1, Ordering::Relaxed);
        match why {
            crate::listener::Refusal::Total => {
                crate::logging::warn_limited!("HTTP connection refused: http.max_connections reached, all busy")
            }
            crate::listener::Refusal::Address => {
                crate::logging::warn_limited!(
                    "HTTP connection refused: http.max_connections_per_address reached, all busy"
                )
            }
        }
    };
    let http_task = tokio::spawn(crate::listener::serve_http(listener, app, limits, stop_rx, over_limit));
    status.ready.store(true, Ordering::Release);
    tracing::info!(http = %local, mqtt = %mqtt_local, mqtt_ws = ?ws_local, coap = ?coap_local, tcp = ?tcp_locals, mqtt_max_connections = cfg.mqtt_max_connections(), data_dir = %cfg.data_dir.display(), console = crate::console::embedded(), "gridlinks ready");

    shutdown.await;
    status.ready.store(false, Ordering::Release);
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    let _ = stop.send(true);
    // MQTT connections stop reading, acknowledge what is in flight, then close.
    mqtt.sessions.shut_down();
    let tcp_tasks = tcp_tasks.into_iter().map(|t| ("custom TCP", Some(t)));
    let tasks =
        [("HTTP", Some(http_task)), ("MQTT", Some(mqtt_task)), ("MQTT over WebSocket", ws_task), ("CoAP", coap_task)];
    for (what, task) in tasks.into_iter().chain(tcp_tasks) {
        let Some(task) = task else { continue };
        if let Err(e) = task.await {
            tracing::error!(listener = what, error = %e, "listener task failed");
        }
    }
    // Every device connection task (MQTT, custom TCP) holds a sender; recv() returns None
    // once all have ended.
    let _ = all_closed.recv().await;

    // Every handler is done; dropping the last writer handle lets the writer drain and sync.
    for task in [follower, bus_task, revoker, sweeper].into_iter().flatten().chain(cluster_tasks) {
        task.abort();
        let _ = task.await;
    }
    // Shared groups' consumers hand copies to the writer: they stop before it drains.
    let m = mqtt.clone();
    tokio::task::spawn_blocking(move || m.shared.as_ref().map(|s| s.stop_all())).await?;
    // Logins write through the writer too.
    drop((mqtt, auth));
    tokio::task::spawn_blocking(move || writer_thread.join())
        .await?
        .map_err(|_| anyhow::anyhow!("writer thread panicked"))?;
    store.sync()?;
    tracing::info!("shutdown complete: all acknowledged data is on disk");
    Ok(())
}
