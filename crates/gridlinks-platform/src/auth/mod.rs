//! Who may do what: users and their logins, JWT access and refresh tokens, API keys, the
//! signing secret, and the defences around password checks.
//!
//! | module | owns |
//! |---|---|
//! | [`password`] | argon2id hashing on its own small low-priority pool, the dummy hash for unknown names |
//! | [`throttle`] | growing delays after failed logins, per source address and per user name |
//! | [`jwt`] | signing and checking tokens (signature, scope, `iss`, `sub`, `nbf`, `exp`) |
//! | [`logins`] | logins (`sessionId`) and their one valid refresh token; reuse ends the login |
//! | [`secret`] | the signing secret's file, its creation and rotation |
//! | [`users`] | tenant administrators and customer users, what each may reach ([`Caller`]) |
//! | [`api_keys`] | API keys, kept as SHA-256 |
//!
//! The same throttle and hashing pool guard MQTT application logins (`crate::mqtt::clients`).

pub mod api_keys;
pub mod jwt;
pub mod logins;
pub mod password;
pub mod secret;
pub mod throttle;
pub mod users;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gridlinks_storage::{Store, StoreError, WriteOp, WriterHandle};
use gridlinks_types::Ts;
use uuid::Uuid;

pub use jwt::{Claims, Jwt, REFRESH_SCOPE};
pub use password::{hash_password, PasswordPool};
pub use throttle::Throttle;
pub use users::{Authority, Caller};

use crate::config::Config;

/// Errors of password and token checks.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AuthError {
    /// Wrong user name or password.
    #[error("Invalid username or password")]
    BadCredentials,
    /// The user has not activated the account, or it is disabled.
    #[error("User account is not active")]
    NotActive,
    /// The token is malformed, its signature or claims are wrong, or its login ended.
    #[error("Invalid JWT token")]
    BadToken,
    /// The token has expired.
    #[error("Token has expired")]
    Expired,
    /// Too many failed attempts from this address or for this name: retry after the wait.
    #[error("Too many failed login attempts; retry in {} s", .0.as_secs().max(1))]
    Throttled(Duration),
    /// Every password-hashing thread is busy and its queue is full.
    #[error("Authentication is busy; retry shortly")]
    Busy,
    /// Hashing failed (bad stored hash).
    #[error("password hash error: {0}")]
    Hash(String),
    /// The login could not be stored.
    #[error("cannot store the login: {0}")]
    Store(String),
    /// A token could not be signed.
    #[error("cannot sign a token: {0}")]
    Sign(String),
}

impl From<StoreError> for AuthError {
    fn from(e: StoreError) -> Self {
        Self::Store(e.to_string())
    }
}

/// An access token and its refresh token, as `/api/auth/login` returns them.
pub struct TokenPair {
    /// Access token.
    pub token: String,
    /// Refresh token.
    pub refresh_token: String,
    /// The user's authority (the access token's scope).
    pub scope: Authority,
}

/// Users, their logins and keys.
pub struct Auth {
    /// Token signer.
    pub jwt: Jwt,
    /// Logins in force.
    pub logins: logins::Logins,
    /// Failed-attempt throttle (REST login and MQTT application logins).
    pub throttle: Throttle,
    /// Password hashing threads.
    pub passwords: PasswordPool,
    /// API keys in force (`X-Authorization: ApiKey …`).
    pub api_keys: api_keys::ApiKeys,
    /// Who can log in.
    pub users: users::Users,
    token_ttl: u64,
    refresh_ttl: u64,
    store: Store,
    /// With shared entities: catching up with other nodes, when a token or user is not
    /// known here yet.
    follow: Option<Follow>,
    /// Other nodes' document changes ([`Store::remote_generation`]) the users and API keys
    /// here include.
    docs_seen: AtomicU64,
}

/// Catching up with other nodes' changes on demand (a token of a login made on another
/// node a moment ago), one catch-up at a time.
struct Follow {
    writer: WriterHandle,
    /// When the last catch-up that completed began (it read the replica after then).
    last: tokio::sync::Mutex<Instant>,
}

impl Follow {
    /// Applies other nodes' changes, unless a catch-up that began after `since` did.
    async fn catch_up(&self, since: Instant) -> Result<(), StoreError> {
        let mut last = self.last.lock().await;
        if *last > since {
            return Ok(());
        }
        let began = Instant::now();
        self.writer.submit(WriteOp::CatchUp).await?;
        *last = began;
        Ok(())
    }
}

impl Auth {
    /// Authentication for `cfg`'s administrator of the first tenant `first_tenant` and its
    /// system administrator (their password hashes: `[admin, sysadmin]`), and the users
    /// stored in `store` (logins are written through `writer`).
    pub fn new(
        cfg: &Config,
        store: &Store,
        writer: &WriterHandle,
        secret: Vec<u8>,
        [admin_hash, sysadmin_hash]: [String; 2],
        first_tenant: Uuid,
    ) -> Result<Self, AuthError> {
        let admin = users::Configured {
            email: &cfg.admin.user,
            hash: admin_hash,
            id: Uuid::new_v5(&first_tenant, cfg.admin.user.as_bytes()),
        };
        let sysadmin = users::Configured {
            email: &cfg.admin.sysadmin_user,
            hash: sysadmin_hash,
            id: Uuid::new_v5(&Uuid::nil(), cfg.admin.sysadmin_user.as_bytes()),
        };
        Ok(Self {
            jwt: Jwt::new(secret),
            logins: logins::Logins::load(store, writer)?,
            throttle: Throttle::new(cfg.auth.login_free_attempts, cfg.auth.login_max_delay.duration()),
            passwords: PasswordPool::start(cfg.auth.password_threads)?,
            api_keys: api_keys::ApiKeys::load(store)?,
            users: users::Users::load(store, admin, sysadmin, first_tenant)?,
            token_ttl: cfg.auth.token_ttl.0,
            refresh_ttl: cfg.auth.refresh_ttl.0,
            store: store.clone(),
            follow: store
                .replicated()
                .then(|| Follow { writer: writer.clone(), last: tokio::sync::Mutex::new(Instant::now()) }),
            docs_seen: AtomicU64::new(store.remote_generation("docs")),
        })
    }

    /// Reloads users and API keys if other nodes changed documents since they were read.
    fn fresh(&self) {
        let seen = self.store.remote_generation("docs");
        if self.docs_seen.load(Ordering::Acquire) == seen {
            return;
        }
        let reloaded = self.users.reload(&self.store).and_then(|()| self.api_keys.reload(&self.store));
        match reloaded {
            Ok(()) => self.docs_seen.store(seen, Ordering::Release),
            Err(e) => crate::logging::warn_limited!(error = %e, "cannot reload users changed on other nodes"),
        }
    }

    /// With shared entities, applies other nodes' changes now (unless that was done since
    /// `since`); whether there are other nodes.
    async fn catch_up(&self, since: Instant) -> Result<bool, AuthError> {
        let Some(f) = &self.follow else { return Ok(false) };
        f.catch_up(since).await?;
        self.fresh();
        Ok(true)
    }

    /// Checks a password login from `peer`: throttled (per address and per lower-case
    /// name), and an unknown user name or an account not yet activated costs what a wrong
    /// password costs.
    pub async fn login(&self, peer: IpAddr, user: &str, password: &str) -> Result<TokenPair, AuthError> {
        let name = user.to_lowercase();
        self.throttle.check(peer, &name).map_err(AuthError::Throttled)?;
        self.fresh();
        let mut entry = self.users.by_email(&name);
        if entry.is_none() && self.catch_up(Instant::now()).await? {
            entry = self.users.by_email(&name);
        }
        let phc = entry.as_ref().and_then(|e| e.hash.as_deref());
        let mut verified = self.passwords.verify(password.as_bytes(), phc).await?;
        if !verified && self.catch_up(Instant::now()).await? {
            // Activated, or its password changed, on another node a moment ago: checked again
            // only if the catch-up changed its password (a wrong guess costs one check).
            let again = self.users.by_email(&name);
            let hash = |e: &Option<std::sync::Arc<users::Entry>>| e.as_ref().and_then(|e| e.hash.clone());
            if hash(&again).is_some() && hash(&again) != hash(&entry) {
                let phc = again.as_ref().and_then(|e| e.hash.as_deref());
                verified = self.passwords.verify(password.as_bytes(), phc).await?;
                entry = again;
            }
        }
        let entry = match (verified, entry) {
            (true, Some(e)) => e,
            _ => {
                self.throttle.failed(peer, &name);
                return Err(AuthError::BadCredentials);
            }
        };
        self.throttle.succeeded(peer, &name);
        if !entry.enabled {
            return Err(AuthError::NotActive);
        }
        self.start(&entry).await
    }

    /// Starts a login for a user whose password was just checked (or set): `entry` is the
    /// user as it was when checked, so a login whose check raced a password change is of
    /// the old credentials stamp and does not work.
    pub async fn start(&self, entry: &users::Entry) -> Result<TokenPair, AuthError> {
        let (session_id, jti) = self.logins.start(self.refresh_exp(), &entry.stamp).await?;
        self.pair(entry, &session_id, jti)
    }

    /// A new token pair for a refresh token, which stops working; a refresh token used
    /// twice ends its login.
    pub async fn refresh(&self, refresh_token: &str) -> Result<TokenPair, AuthError> {
        let claims = self.jwt.verify(refresh_token, &[REFRESH_SCOPE])?;
        // Its login may have been refreshed on another node a moment ago: a token that is
        // stale here must not count as reused.
        self.catch_up(Instant::now()).await?;
        let entry = self.holder(&claims)?.ok_or(AuthError::BadToken)?;
        let jti = claims.jti.as_deref().ok_or(AuthError::BadToken)?;
        match self.logins.rotate(&claims.session_id, jti, self.refresh_exp(), &entry.stamp).await? {
            Ok(next) => self.pair(&entry, &claims.session_id, next),
            Err(_) => Err(AuthError::BadToken),
        }
    }

    /// The user of a valid access token of a login in force.
    pub async fn access(&self, token: &str) -> Result<Caller, AuthError> {
        Ok(self.checked(token).await?.1.caller.clone())
    }

    /// [`Auth::access`], and when the token expires (seconds since epoch).
    pub async fn access_with_expiry(&self, token: &str) -> Result<(Caller, i64), AuthError> {
        let (claims, entry) = self.checked(token).await?;
        Ok((entry.caller.clone(), claims.exp))
    }

    /// A valid access token of a login in force, and its user; a well-signed token whose
    /// login or user is not known here is checked again after catching up with other nodes.
    async fn checked(&self, token: &str) -> Result<(Claims, std::sync::Arc<users::Entry>), AuthError> {
        let since = Instant::now();
        if let Some(c) = self.checked_here(token)? {
            return Ok(c);
        }
        if self.catch_up(since).await? {
            if let Some(c) = self.checked_here(token)? {
                return Ok(c);
            }
        }
        Err(AuthError::BadToken)
    }

    /// [`Auth::checked`] against what this node knows: `None` when the token is well
    /// signed but its login or user is unknown.
    fn checked_here(&self, token: &str) -> Result<Option<(Claims, std::sync::Arc<users::Entry>)>, AuthError> {
        let scopes = [Authority::SysAdmin.as_str(), Authority::TenantAdmin.as_str(), Authority::CustomerUser.as_str()];
        let claims = self.jwt.verify(token, &scopes)?;
        self.fresh();
        let Some(entry) = self.holder(&claims)? else { return Ok(None) };
        if !claims.scopes.iter().any(|s| s == entry.caller.authority.as_str()) {
            return Err(AuthError::BadToken);
        }
        Ok(self.logins.contains(&claims.session_id, &entry.stamp).then_some((claims, entry)))
    }

    /// The user a token was issued to (`None`: no user of that name here), if it is enabled
    /// and has the same id (whether its password changed since is the login's business).
    /// Tokens of releases before users existed carry no user id: they are the configured
    /// administrator's.
    fn holder(&self, claims: &Claims) -> Result<Option<std::sync::Arc<users::Entry>>, AuthError> {
        let Some(entry) = self.users.by_email(&claims.sub) else { return Ok(None) };
        let same = match claims.user_id.as_deref() {
            Some(id) => id == entry.caller.user.to_string(),
            None => entry.configured,
        };
        if !same || !entry.enabled {
            return Err(AuthError::BadToken);
        }
        Ok(Some(entry))
    }

    /// The user of a live API key.
    pub fn api_key(&self, value: &str) -> Option<Caller> {
        self.fresh();
        let user = self.api_keys.check(value, Ts::now().0)?;
        self.users.by_id(user).filter(|e| e.enabled).map(|e| e.caller.clone())
    }

    /// Ends the login of a valid access token.
    pub async fn logout(&self, token: &str) -> Result<(), AuthError> {
        let (claims, _) = self.checked(token).await?;
        Ok(self.logins.end(&claims.session_id).await?)
    }

    /// Signs with `secret` from now on and ends every login.
    pub async fn set_secret(&self, secret: Vec<u8>) -> Result<(), AuthError> {
        self.jwt.set_secret(secret);
        Ok(self.logins.end_all().await?)
    }

    fn refresh_exp(&self) -> i64 {
        Ts::now().0 / 1000 + i64::try_from(self.refresh_ttl).unwrap_or(i64::MAX / 4)
    }

    fn pair(&self, e: &users::Entry, session_id: &str, jti: String) -> Result<TokenPair, AuthError> {
        let who = jwt::Subject {
            email: &e.caller.email,
            user_id: e.caller.user,
            first_name: e.first_name.as_deref(),
            last_name: e.last_name.as_deref(),
            tenant_id: e.caller.tenant,
            customer_id: e.caller.customer,
        };
        let scope = e.caller.authority;
        Ok(TokenPair {
            token: self.jwt.issue(&who, scope.as_str(), self.token_ttl, session_id, None)?,
            refresh_token: self.jwt.issue(&who, REFRESH_SCOPE, self.refresh_ttl, session_id, Some(jti))?,
            scope,
        })
    }
}
