//! The HTTP transport's state: what every request handler may ask for ([`Http`], handed
//! out through axum's `FromRef`), readiness and the HTTP counters ([`Status`]).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use axum::extract::FromRef;
use gridlinks_platform::auth::Auth;
use gridlinks_platform::{Core, Platform};

use crate::thingsboard::long_poll::LongPolls;

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
/// `State<Arc<Core>>`, `State<Arc<Auth>>`, `State<Arc<Platform>>` (device sessions, RPC,
/// application credentials), `State<Arc<Status>>`, `State<Arc<LongPolls>>` — through [`FromRef`]. axum clones the
/// state for every request: one reference count.
#[derive(Clone)]
pub struct Http(Arc<Handles>);

impl Http {
    /// The state of the routes over `platform`.
    pub fn new(platform: Arc<Platform>, status: Arc<Status>, ws: Arc<crate::ws::Hub>, polls: Arc<LongPolls>) -> Self {
        Self(Arc::new(Handles {
            core: Arc::new(platform.core.clone()),
            auth: platform.auth.clone(),
            platform,
            status,
            ws,
            polls,
        }))
    }
}

/// What [`Http`] hands out.
pub struct Handles {
    /// Storage, ingest, configuration.
    pub core: Arc<Core>,
    /// The administrator's login, tokens and the password-check defences.
    pub auth: Arc<Auth>,
    /// Device sessions, RPC, application credentials, metrics.
    pub platform: Arc<Platform>,
    /// Readiness and counters.
    pub status: Arc<Status>,
    /// WebSocket API subscriptions.
    pub ws: Arc<crate::ws::Hub>,
    /// HTTP devices' long polls.
    pub polls: Arc<LongPolls>,
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

impl FromRef<Http> for Arc<LongPolls> {
    fn from_ref(h: &Http) -> Self {
        h.polls.clone()
    }
}

impl FromRef<Http> for Arc<Platform> {
    fn from_ref(h: &Http) -> Self {
        h.platform.clone()
    }
}

impl FromRef<Http> for Arc<Status> {
    fn from_ref(h: &Http) -> Self {
        h.status.clone()
    }
}

/// The bulk import's path: its bodies may be larger (`http.max_import_bytes`).
pub const BULK_IMPORT_PATH: &str = "/api/device/bulk_import";
