//! HS256 JWT access and refresh tokens of ThingsBoard's `/api/auth/*` endpoints.
//!
//! Claims follow ThingsBoard's: `sub`, `scopes` (`TENANT_ADMIN` or `REFRESH_TOKEN`), `iss`,
//! `iat`, `exp`, `sessionId` (one per login; a refresh keeps it), and on refresh tokens a
//! `jti`. A token is accepted only with a valid signature under the current secret, the
//! right scope, issuer `gridlinks`, the expected subject, `nbf`/`iat` not in the future and
//! `exp` not past. The secret can be replaced at run time ([`Jwt::set_secret`]): every
//! token signed with the old one stops working.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use gridlinks_types::Ts;

use super::AuthError;

/// What a token asserts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claims {
    /// User name.
    pub sub: String,
    /// `TENANT_ADMIN` for access tokens, `REFRESH_TOKEN` for refresh tokens (as in ThingsBoard).
    pub scopes: Vec<String>,
    /// Issuer.
    pub iss: String,
    /// Issued at, seconds.
    pub iat: i64,
    /// Not valid before, seconds.
    #[serde(default)]
    pub nbf: Option<i64>,
    /// Expires at, seconds.
    pub exp: i64,
    /// The login this token belongs to (ThingsBoard's `sessionId`).
    pub session_id: String,
    /// A refresh token's own id: each may be used once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
}

/// Scope of an access token.
pub const ACCESS_SCOPE: &str = "TENANT_ADMIN";
/// Scope of a refresh token.
pub const REFRESH_SCOPE: &str = "REFRESH_TOKEN";
/// The issuer of every token.
pub const ISSUER: &str = "gridlinks";
/// Clock skew tolerated on `iat` and `nbf`, seconds.
const SKEW: i64 = 60;

/// Issues and checks HS256 tokens.
pub struct Jwt {
    secret: RwLock<Vec<u8>>,
}

impl Jwt {
    /// A signer with this secret.
    pub fn new(secret: Vec<u8>) -> Self {
        Self { secret: RwLock::new(secret) }
    }

    /// Replaces the secret: tokens signed with the old one are refused from now on.
    pub fn set_secret(&self, secret: Vec<u8>) {
        *self.secret.write() = secret;
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length.
        <Hmac<Sha256> as Mac>::new_from_slice(&self.secret.read()).unwrap_or_else(|_| unreachable!())
    }

    /// A signed token for `sub` with one scope, valid for `ttl_secs`.
    pub fn issue(&self, sub: &str, scope: &str, ttl_secs: u64, session_id: &str, jti: Option<String>) -> String {
        let now = Ts::now().0 / 1000;
        let claims = Claims {
            sub: sub.to_owned(),
            scopes: vec![scope.to_owned()],
            iss: ISSUER.into(),
            iat: now,
            nbf: Some(now),
            exp: now + i64::try_from(ttl_secs).unwrap_or(i64::MAX / 2),
            session_id: session_id.to_owned(),
            jti,
        };
        self.sign(&claims)
    }

    fn sign(&self, claims: &Claims) -> String {
        let header = B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let payload = B64.encode(serde_json::to_vec(claims).unwrap_or_default());
        let signing_input = format!("{header}.{payload}");
        let mut mac = self.mac();
        mac.update(signing_input.as_bytes());
        let sig = B64.encode(mac.finalize().into_bytes());
        format!("{signing_input}.{sig}")
    }

    /// Checks signature, issuer, subject, validity window and scope.
    pub fn verify(&self, token: &str, scope: &str, subject: &str) -> Result<Claims, AuthError> {
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
        let header: serde_json::Value = serde_json::from_slice(&B64.decode(h).map_err(|_| AuthError::BadToken)?)
            .map_err(|_| AuthError::BadToken)?;
        if header.get("alg").and_then(|a| a.as_str()) != Some("HS256") {
            return Err(AuthError::BadToken);
        }
        let claims: Claims = serde_json::from_slice(&B64.decode(p).map_err(|_| AuthError::BadToken)?)
            .map_err(|_| AuthError::BadToken)?;
        let now = Ts::now().0 / 1000;
        if claims.iss != ISSUER
            || claims.sub != subject
            || claims.iat > now + SKEW
            || claims.nbf.is_some_and(|nbf| nbf > now + SKEW)
        {
            return Err(AuthError::BadToken);
        }
        if claims.exp <= now {
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
    fn tokens_verify_and_reject_tampering_expiry_and_wrong_scope() {
        let jwt = Jwt::new(b"k".to_vec());
        let t = jwt.issue("admin", ACCESS_SCOPE, 60, "s1", None);
        assert_eq!(jwt.verify(&t, ACCESS_SCOPE, "admin").unwrap().session_id, "s1");
        assert_eq!(jwt.verify(&t, REFRESH_SCOPE, "admin"), Err(AuthError::BadToken));
        assert_eq!(Jwt::new(b"other".to_vec()).verify(&t, ACCESS_SCOPE, "admin"), Err(AuthError::BadToken));
        let mut tampered = t.clone();
        tampered.insert(tampered.len() - 3, 'A');
        assert!(jwt.verify(&tampered, ACCESS_SCOPE, "admin").is_err());
        assert_eq!(
            jwt.verify(&jwt.issue("admin", ACCESS_SCOPE, 0, "s", None), ACCESS_SCOPE, "admin"),
            Err(AuthError::Expired)
        );
        assert_eq!(jwt.verify("a.b", ACCESS_SCOPE, "admin"), Err(AuthError::BadToken));
    }

    #[test]
    fn issuer_subject_and_not_before_are_checked() {
        let jwt = Jwt::new(b"k".to_vec());
        let now = Ts::now().0 / 1000;
        let good = Claims {
            sub: "admin".into(),
            scopes: vec![ACCESS_SCOPE.into()],
            iss: ISSUER.into(),
            iat: now,
            nbf: Some(now),
            exp: now + 60,
            session_id: "s".into(),
            jti: None,
        };
        assert!(jwt.verify(&jwt.sign(&good), ACCESS_SCOPE, "admin").is_ok());
        let forged = |c: Claims| jwt.verify(&jwt.sign(&c), ACCESS_SCOPE, "admin");
        assert_eq!(forged(Claims { iss: "thingsboard.io".into(), ..good.clone() }), Err(AuthError::BadToken));
        assert_eq!(forged(Claims { sub: "mallory".into(), ..good.clone() }), Err(AuthError::BadToken));
        assert_eq!(forged(Claims { nbf: Some(now + 3600), ..good.clone() }), Err(AuthError::BadToken));
        assert_eq!(forged(Claims { iat: now + 3600, ..good.clone() }), Err(AuthError::BadToken));
        // A rotated secret invalidates every earlier token.
        let t = jwt.sign(&good);
        jwt.set_secret(b"new".to_vec());
        assert_eq!(jwt.verify(&t, ACCESS_SCOPE, "admin"), Err(AuthError::BadToken));
    }
}
