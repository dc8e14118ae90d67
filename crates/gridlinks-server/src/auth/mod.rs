//! Who may do what: the administrator's password and login, JWT access and refresh tokens,
//! the signing secret, and the defences around password checks.
//!
//! | module | owns |
//! |---|---|
//! | [`password`] | argon2id hashing on its own small low-priority pool, the dummy hash for unknown names |
//! | [`throttle`] | growing delays after failed logins, per source address and per user name |
//! | [`jwt`] | signing and checking tokens (signature, scope, `iss`, `sub`, `nbf`, `exp`) |
//! | [`logins`] | logins (`sessionId`) and their one valid refresh token; reuse ends the login |
//! | [`secret`] | the signing secret's file, its creation and rotation |
//!
//! The same throttle and hashing pool guard MQTT application logins (`crate::mqtt::clients`).

pub mod api_keys;
pub mod jwt;
pub mod logins;
pub mod password;
pub mod secret;
pub mod throttle;

use std::net::IpAddr;
use std::time::Duration;

use gridlinks_storage::{Store, StoreError};
use gridlinks_types::Ts;

pub use jwt::{Claims, Jwt, ACCESS_SCOPE, REFRESH_SCOPE};
pub use password::{hash_password, PasswordPool};
pub use throttle::Throttle;

use crate::config::Config;

/// Errors of password and token checks.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AuthError {
    /// Wrong user name or password.
    #[error("Invalid username or password")]
    BadCredentials,
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
}

/// The administrator's authentication.
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
    admin_user: String,
    admin_hash: String,
    token_ttl: u64,
    refresh_ttl: u64,
}

impl Auth {
    /// Authentication for `cfg`'s administrator, whose password hash is `admin_hash`.
    pub fn new(cfg: &Config, store: &Store, secret: Vec<u8>, admin_hash: String) -> Result<Self, AuthError> {
        Ok(Self {
            jwt: Jwt::new(secret),
            logins: logins::Logins::load(store)?,
            throttle: Throttle::new(cfg.auth.login_free_attempts, cfg.auth.login_max_delay.duration()),
            passwords: PasswordPool::start(cfg.auth.password_threads)?,
            api_keys: api_keys::ApiKeys::load(store)?,
            admin_user: cfg.admin.user.clone(),
            admin_hash,
            token_ttl: cfg.auth.token_ttl.0,
            refresh_ttl: cfg.auth.refresh_ttl.0,
        })
    }

    /// Checks a password login from `peer`: throttled, and an unknown user name costs what
    /// a wrong password costs.
    pub async fn login(&self, peer: IpAddr, user: &str, password: &str) -> Result<TokenPair, AuthError> {
        self.throttle.check(peer, user).map_err(AuthError::Throttled)?;
        let phc = (user == self.admin_user).then_some(self.admin_hash.as_str());
        if !self.passwords.verify(password.as_bytes(), phc).await? {
            self.throttle.failed(peer, user);
            return Err(AuthError::BadCredentials);
        }
        self.throttle.succeeded(peer, user);
        let (session_id, jti) = self.logins.start(self.refresh_exp()).await?;
        self.pair(&session_id, jti)
    }

    /// A new token pair for a refresh token, which stops working; a refresh token used
    /// twice ends its login.
    pub async fn refresh(&self, refresh_token: &str) -> Result<TokenPair, AuthError> {
        let claims = self.jwt.verify(refresh_token, REFRESH_SCOPE, &self.admin_user)?;
        let jti = claims.jti.as_deref().ok_or(AuthError::BadToken)?;
        match self.logins.rotate(&claims.session_id, jti, self.refresh_exp()).await? {
            Ok(next) => self.pair(&claims.session_id, next),
            Err(_) => Err(AuthError::BadToken),
        }
    }

    /// The claims of a valid access token of a login in force.
    pub fn access(&self, token: &str) -> Result<Claims, AuthError> {
        let claims = self.jwt.verify(token, ACCESS_SCOPE, &self.admin_user)?;
        if !self.logins.contains(&claims.session_id) {
            return Err(AuthError::BadToken);
        }
        Ok(claims)
    }

    /// Ends the login of a valid access token.
    pub async fn logout(&self, token: &str) -> Result<(), AuthError> {
        let claims = self.access(token)?;
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

    fn pair(&self, session_id: &str, jti: String) -> Result<TokenPair, AuthError> {
        Ok(TokenPair {
            token: self.jwt.issue(&self.admin_user, ACCESS_SCOPE, self.token_ttl, session_id, None)?,
            refresh_token: self.jwt.issue(&self.admin_user, REFRESH_SCOPE, self.refresh_ttl, session_id, Some(jti))?,
        })
    }
}
