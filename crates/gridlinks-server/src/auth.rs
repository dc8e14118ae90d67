//! Administrator authentication: the argon2-hashed admin password and the HS256 JWT
//! access/refresh tokens of ThingsBoard's `/api/auth/*` endpoints.

use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use gridlinks_types::Ts;

/// Errors of password hashing and token checks.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AuthError {
    /// Wrong user name or password.
    #[error("Invalid username or password")]
    BadCredentials,
    /// The token is malformed or its signature is wrong.
    #[error("Invalid JWT token")]
    BadToken,
    /// The token has expired.
    #[error("Token has expired")]
    Expired,
    /// Hashing failed (bad stored hash).
    #[error("password hash error: {0}")]
    Hash(String),
}

/// Hashes a password with argon2id and a random salt (PHC string).
pub fn hash_password(password: &str) -> Result<String, AuthError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

/// Checks a password against a PHC hash.
pub fn verify_password(password: &str, phc: &str) -> Result<(), AuthError> {
    let parsed = PasswordHash::new(phc).map_err(|e| AuthError::Hash(e.to_string()))?;
    Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .map_err(|_| AuthError::BadCredentials)
}

/// What a token asserts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    /// User name.
    pub sub: String,
    /// `TENANT_ADMIN` for access tokens, `REFRESH_TOKEN` for refresh tokens (as in ThingsBoard).
    pub scopes: Vec<String>,
    /// Issuer.
    pub iss: String,
    /// Issued at, seconds.
    pub iat: i64,
    /// Expires at, seconds.
    pub exp: i64,
}

/// Scope of an access token.
pub const ACCESS_SCOPE: &str = "TENANT_ADMIN";
/// Scope of a refresh token.
pub const REFRESH_SCOPE: &str = "REFRESH_TOKEN";

/// Issues and checks HS256 tokens.
pub struct Jwt {
    secret: Vec<u8>,
}

impl Jwt {
    /// A signer with this secret.
    pub fn new(secret: Vec<u8>) -> Self {
        Self { secret }
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length.
        <Hmac<Sha256> as Mac>::new_from_slice(&self.secret).unwrap_or_else(|_| unreachable!())
    }

    /// A signed token for `sub` with one scope, valid for `ttl_secs`.
    pub fn issue(&self, sub: &str, scope: &str, ttl_secs: u64) -> String {
        let now = Ts::now().0 / 1000;
        let claims = Claims {
            sub: sub.to_owned(),
            scopes: vec![scope.to_owned()],
            iss: "gridlinks".into(),
            iat: now,
            exp: now + i64::try_from(ttl_secs).unwrap_or(i64::MAX / 2),
        };
        let header = B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let payload = B64.encode(serde_json::to_vec(&claims).unwrap_or_default());
        let signing_input = format!("{header}.{payload}");
        let mut mac = self.mac();
        mac.update(signing_input.as_bytes());
        let sig = B64.encode(mac.finalize().into_bytes());
        format!("{signing_input}.{sig}")
    }

    /// Checks signature, expiry and scope.
    pub fn verify(&self, token: &str, scope: &str) -> Result<Claims, AuthError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(AuthError::BadToken);
        };
        let sig = B64.decode(s).map_err(|_| AuthError::BadToken)?;
        let mut mac = self.mac();
        mac.update(h.as_bytes());
        mac.update(b".");
        mac.update(p.as_bytes());
        mac.verify_slice(&sig).map_err(|_| AuthError::BadToken)?;
        let header: serde_json::Value =
            serde_json::from_slice(&B64.decode(h).map_err(|_| AuthError::BadToken)?).map_err(|_| AuthError::BadToken)?;
        if header.get("alg").and_then(|a| a.as_str()) != Some("HS256") {
            return Err(AuthError::BadToken);
        }
        let claims: Claims =
            serde_json::from_slice(&B64.decode(p).map_err(|_| AuthError::BadToken)?).map_err(|_| AuthError::BadToken)?;
        if claims.exp <= Ts::now().0 / 1000 {
            return Err(AuthError::Expired);
        }
        if !claims.scopes.iter().any(|s| s == scope) {
            return Err(AuthError::BadToken);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_and_verify() {
        let h = hash_password("s3cret").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert_eq!(verify_password("s3cret", &h), Ok(()));
        assert_eq!(verify_password("wrong", &h), Err(AuthError::BadCredentials));
    }

    #[test]
    fn tokens_verify_and_reject_tampering_expiry_and_wrong_scope() {
        let jwt = Jwt::new(b"k".to_vec());
        let t = jwt.issue("admin", ACCESS_SCOPE, 60);
        assert_eq!(jwt.verify(&t, ACCESS_SCOPE).unwrap().sub, "admin");
        assert_eq!(jwt.verify(&t, REFRESH_SCOPE), Err(AuthError::BadToken));
        assert_eq!(Jwt::new(b"other".to_vec()).verify(&t, ACCESS_SCOPE), Err(AuthError::BadToken));
        let mut tampered = t.clone();
        tampered.insert(tampered.len() - 3, 'A');
        assert!(jwt.verify(&tampered, ACCESS_SCOPE).is_err());
        assert_eq!(jwt.verify(&jwt.issue("admin", ACCESS_SCOPE, 0), ACCESS_SCOPE), Err(AuthError::Expired));
        assert_eq!(jwt.verify("a.b", ACCESS_SCOPE), Err(AuthError::BadToken));
    }
}
