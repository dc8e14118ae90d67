//! Start-up and shutdown of the platform: the data directory (private to the server's
//! user), storage and its writer, the shared services (`cluster`), the configured users and
//! the JWT secret, the first tenant, and [`Platform`] built on them. Transports start on
//! the platform afterwards; [`Running::finish`] ends it once they are done (drain the write
//! queue, final sync).

use std::fmt::Display;
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;

use gridlinks_broker::sessions::Sessions;
use gridlinks_ingest::Ingest;
use gridlinks_storage::{DocKind, Store, StoreOptions, WriteOp, WriteOutcome, WriterConfig, WriterHandle};
use uuid::Uuid;

use crate::auth::{self, Auth};
use crate::broker_clients::Credentials;
use crate::config::Config;
use crate::core::{Core, Platform};
use crate::live::Live;
use crate::metrics::{Metrics, StorageMetrics};
use crate::sessions::DeviceSessions;

/// Why the platform could not start: what it was doing, and why (the error's source).
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct StartError {
    what: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StartError {
    /// An error without a cause of its own.
    pub fn msg(what: impl Display) -> Self {
        Self { what: what.to_string(), source: None }
    }
}

/// Errors passed through unnamed are their own description.
macro_rules! start_error_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StartError {
            fn from(e: $t) -> Self {
                Self { what: e.to_string(), source: None }
            }
        }
    )*};
}
start_error_from!(gridlinks_storage::StoreError, tokio::task::JoinError, std::io::Error);

/// Names what failed, as `anyhow::Context` does.
pub trait Context<T> {
    /// The error, as the cause of `what`.
    fn context(self, what: impl Display) -> Result<T, StartError>;
    /// The error, as the cause of what `what()` says (made only on failure).
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T, StartError>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for Result<T, E> {
    fn context(self, what: impl Display) -> Result<T, StartError> {
        self.map_err(|e| StartError { what: what.to_string(), source: Some(Box::new(e)) })
    }
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T, StartError> {
        self.map_err(|e| StartError { what: what().to_string(), source: Some(Box::new(e)) })
    }
}

/// What runs beside the platform until shutdown.
pub struct Running {
    writer_thread: std::thread::JoinHandle<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    store: Store,
    /// The alarm rule engine, to write what it holds at the stop.
    alarms: crate::alarms::engine::Feed,
}

impl Platform {
    /// Opens the data directory and storage, starts the writer and the shared services,
    /// and builds the platform. `stop` ends its background tasks (the JWT secret watcher).
    pub async fn start(
        cfg: Config,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(Arc<Platform>, Running), StartError> {
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

        // Shared entities: the store follows the cluster's replica, caught up before
        // anything reads it.
        crate::cluster::attach_entities(&cfg.cluster, &store).await?;
        let device_caps = Arc::new(gridlinks_storage::TenantCaps::default());
        let (writer, writer_thread) = store
            .start_writer(WriterConfig {
                queue_capacity: cfg.storage.queue_capacity,
                max_batch_ops: cfg.storage.max_batch_ops,
                fsync: cfg.storage.fsync,
                enqueue_timeout: cfg.storage.enqueue_timeout.duration(),
                max_keys: cfg.storage.max_keys,
                min_free_bytes: cfg.storage.min_free_mb * 1024 * 1024,
                max_devices_per_tenant: cfg.limits.max_devices_per_tenant,
                tenant_device_caps: device_caps.clone(),
            })
            .context("starting the storage writer")?;
        let follower = crate::cluster::follow_entities(&cfg.cluster, &writer).await?;

        let admin_hash =
            configured_password(&store, &writer, &cfg, &cfg.admin.user, &cfg.admin.password, "admin_password_hash")
                .await?;
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
                let legacy = store.meta_get("jwt_secret").context("reading the stored JWT secret")?;
                let secret = auth::secret::load_or_create(path, legacy.clone())
                    .with_context(|| format!("JWT secret file {}", path.display()))?;
                if legacy.is_some() {
                    store.meta_delete("jwt_secret").context("removing the stored JWT secret")?;
                }
                secret
            }
        };
        let tenant_id: Uuid = shared_setting(&store, &writer, "tenant_id", || Ok(Uuid::new_v4().to_string()))
            .await?
            .0
            .parse()
            .context("stored tenant id")?;

        auth::users::hide_other_tenants(cfg.auth.hide_other_tenants);
        let auth = Arc::new(
            Auth::new(&cfg, &store, &writer, jwt_secret, [admin_hash, sysadmin_hash], tenant_id)
                .context("starting authentication")?,
        );
        let sessions = Arc::new(
            Sessions::with_interest(crate::live::FILTER, Some(crate::sessions::MOUNT_ROOT))
                .drop_oldest_when_offline_queue_full(cfg.mqtt.offline_queue_full == "drop_oldest")
                .hard_limit(cfg.mqtt.client_queue_hard_limit)
                .max_subscriptions(cfg.mqtt.max_subscriptions_per_client)
                .groups_elsewhere(cfg.cluster.several_nodes()),
        );
        let live = Arc::new(Live::new(store.clone(), tenant_id));
        let (alarm_feed, alarm_queues) = crate::alarms::engine::Feed::new(store.clone());
        let cluster = crate::cluster::start(&cfg.cluster, &store, &writer, &alarm_feed).await?;
        if cfg.cluster.queue != crate::config::QueueBackend::Kafka {
            // One node: alarm rules run on what the embedded log committed.
            live.register(Arc::new(alarm_feed.clone()));
        }
        let (notify, notify_rx) = crate::notify::channel();
        let alarms = crate::alarms::Alarms::load(store.clone(), writer.clone(), tenant_id, notify.clone())
            .context("loading alarms")?;
        let ingest = Ingest::new(store.clone(), cluster.log, live.clone(), cfg.limits.max_devices_per_gateway)
            .gateways_adopt(cfg.limits.gateway_adopts_devices);
        let guards = Arc::new(crate::guards::Guards::new(&cfg));
        let cfg_activity = cfg.activity.clone();
        let core = Core {
            cfg: Arc::new(cfg),
            store: store.clone(),
            ts: cluster.ts,
            backends: cluster.backends,
            writer,
            ingest,
            tenant_id,
            claims: Default::default(),
            guards,
            bus: cluster.bus,
            activity: Arc::new(crate::activity::Activity::new(cfg_activity)),
            limits: Arc::new(crate::limits::Limits::new(store.clone(), tenant_id, device_caps)),
            alarms: Arc::new(alarms),
            notify,
        };
        ensure_first_tenant(&core).await.context("writing the first tenant")?;
        core.limits.reload().context("reading tenant profiles")?;
        let clients = Credentials::load(&store, &sessions).context("loading MQTT client credentials")?;
        if core.cfg.activity.enabled {
            core.activity.load(&store).context("loading device activity")?;
        }
        let m = &core.cfg.mqtt;
        let connect_rate = crate::connect_rate::ConnectRate::new(
            m.max_connects_per_address,
            m.connect_burst_per_address,
            m.connect_rate_exempt_loopback,
        );
        let platform = Arc::new(Platform {
            connect_rate,
            forwarding: crate::forward::Forwarding::new(core.clone()),
            devices: DeviceSessions::new(sessions, core.store.clone(), core.bus.clone()),
            metrics: Metrics::default(),
            ota: Default::default(),
            core,
            auth,
            clients,
            live,
        });
        platform.metrics.register(Arc::new(StorageMetrics(platform.core.clone())));
        platform.metrics.register(platform.core.limits.clone());
        platform.metrics.register(platform.forwarding.clone());
        let mut tasks: Vec<_> = [follower].into_iter().flatten().chain(cluster.tasks).collect();
        tasks.extend(crate::alarms::engine::start(platform.core.clone(), &alarm_feed, alarm_queues));
        tasks.push(crate::notify::start(platform.clone(), notify_rx).context("reading notification requests")?);
        tasks.push(platform.forwarding.start().await);
        if platform.core.cfg.activity.enabled {
            tasks.push(tokio::spawn(crate::activity::run(platform.core.clone())));
        }
        if platform.core.cfg.cluster.several_nodes() {
            tasks.push(tokio::spawn(crate::limits::follow(platform.core.limits.clone())));
        }
        if let Some(path) = secret_file {
            tasks.push(tokio::spawn(watch_secret(platform.auth.clone(), path, stop)));
        }
        Ok((platform, Running { writer_thread, tasks, store, alarms: alarm_feed }))
    }
}

impl Running {
    /// Ends the platform once every transport has stopped: its background tasks end, and
    /// when `platform` was the last reference the writer drains its queue; then the final
    /// sync. Everything acknowledged is on disk when this returns `Ok`.
    pub async fn finish(self, platform: Arc<Platform>) -> Result<(), StartError> {
        // Alarms decided and rule states not written yet.
        self.alarms.finish().await;
        for task in self.tasks {
            task.abort();
            let _ = task.await;
        }
        // Activity not written yet (lastActivityTime, disconnects at shutdown).
        platform.core.activity.flush(&platform.core, true).await;
        drop(platform);
        tokio::task::spawn_blocking(move || self.writer_thread.join())
            .await
            .context("waiting for the storage writer")?
            .map_err(|_| StartError::msg("storage writer thread panicked"))?;
        self.store.sync().context("final sync")?;
        Ok(())
    }
}

/// The first tenant's record and the default tenant profile, written on the first start.
async fn ensure_first_tenant(core: &Core) -> Result<(), gridlinks_storage::StoreError> {
    if core.store.docs(DocKind::TenantProfile)?.is_empty() {
        let op = WriteOp::InsertDoc {
            kind: DocKind::TenantProfile,
            id: crate::limits::default_profile_id(),
            title: "Default".into(),
            doc: serde_json::json!({
                "description": "Default tenant profile",
                "default": true,
                "isolatedTbRuleEngine": false,
                "profileData": {"configuration": {"type": "DEFAULT"}},
            }),
        };
        core.writer.submit(op).await?;
    }
    if core.store.doc(DocKind::Tenant, core.tenant_id)?.is_none() {
        let op = WriteOp::InsertDoc {
            kind: DocKind::Tenant,
            id: core.tenant_id,
            title: "Tenant".into(),
            doc: serde_json::json!({}),
        };
        core.writer.submit(op).await?;
    }
    Ok(())
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
) -> Result<String, StartError> {
    if !password.is_empty() {
        return auth::hash_password(password).context("hashing a configured password");
    }
    let mut generated = None;
    let (hash, created) = shared_setting(store, writer, key, || {
        let pw = gridlinks_storage::generate_token();
        let hash = auth::hash_password(&pw).context("hashing a generated password")?;
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
    make: impl FnOnce() -> Result<String, StartError>,
) -> Result<(String, bool), StartError> {
    if let Some(v) = store.setting(name).context("reading a setting")? {
        return Ok((String::from_utf8(v).context("stored setting is not UTF-8")?, false));
    }
    let made = make()?;
    let op = WriteOp::SettingIfAbsent { name: name.to_owned(), value: made.clone().into_bytes() };
    match writer.submit(op).await.context("storing a setting")? {
        WriteOutcome::Setting(v) => {
            let v = String::from_utf8(v).context("stored setting is not UTF-8")?;
            let created = v == made;
            Ok((v, created))
        }
        _ => Err(StartError::msg(format!("unexpected write outcome for setting {name}"))),
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
                crate::warn_limited!(error = %e, file = %path.display(), "cannot read the JWT secret file; keeping the current secret")
            }
            Err(_) => return,
        }
    }
}
