//! HS256 JWT access and refresh tokens of ThingsBoard's `/api/auth/*` endpoints, encoded,
//! signed and checked by the `jsonwebtoken` crate.
//!
//! Claims follow ThingsBoard's: `sub` (the email), `scopes` (the authority, `TENANT_ADMIN` or
//! `CUSTOMER_USER`, or `REFRESH_TOKEN`), `userId`, `firstName`, `lastName`, `enabled`,
//! `isPublic`, `tenantId`, `customerId` (customer users), `iss`, `iat`, `exp`, `sessionId`
//! (one per login; a refresh keeps it), and on refresh tokens a `jti`. A token is accepted
//! here only with a valid HS256 signature under the current secret, the right scope, issuer
//! `gridlinks`, `nbf`/`iat` not in the future and `exp` not past; whether its subject is a
//! user who may still log in is `super::Auth`'s check. The secret can be replaced at run time ([`Jwt::set_secret`]): every
//! token signed with the old one stops working.
//!
//! `jsonwebtoken` is built without its crypto back-ends (aws-lc-rs, or RustCrypto with
//! RSA and elliptic curves we do not use): [`HS256_ONLY`] gives it HMAC-SHA256 from the
//! RustCrypto `hmac` and `sha2` crates, and refuses every other algorithm.

use hmac::{Hmac, Mac};
use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{Error as JwtError, ErrorKind};
use jsonwebtoken::signature::{Error as SignatureError, Signer, Verifier};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
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
    /// The user's id (absent from tokens of releases before users existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// First name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_name: Option<String>,
    /// Last name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_name: Option<String>,
    /// Whether the account is enabled.
    #[serde(default)]
    pub enabled: bool,
    /// Always false: there are no public customers.
    #[serde(default)]
    pub is_public: bool,
    /// The tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    /// A customer user's customer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer_id: Option<String>,
}

/// Whom a token is issued to.
pub struct Subject<'a> {
    /// Email.
    pub email: &'a str,
    /// User id.
    pub user_id: uuid::Uuid,
    /// First name.
    pub first_name: Option<&'a str>,
    /// Last name.
    pub last_name: Option<&'a str>,
    /// Tenant.
    pub tenant_id: uuid::Uuid,
    /// A customer user's customer.
    pub customer_id: Option<uuid::Uuid>,
}

/// Scope of a refresh token.
pub const REFRESH_SCOPE: &str = "REFRESH_TOKEN";
/// The issuer of every token.
pub const ISSUER: &str = "gridlinks";
/// Clock skew tolerated on `iat` and `nbf`, seconds.
const SKEW: i64 = 60;

/// The secret in the two forms `jsonwebtoken` takes.
struct Keys {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl Keys {
    fn new(secret: &[u8]) -> Self {
        Self { encoding: EncodingKey::from_secret(secret), decoding: DecodingKey::from_secret(secret) }
    }
}

/// Issues and checks HS256 tokens.
pub struct Jwt {
    keys: RwLock<Keys>,
}

impl Jwt {
    /// A signer with this secret.
    pub fn new(secret: Vec<u8>) -> Self {
        // Installed once per process; a second call finds it installed, which is fine.
        let _ = HS256_ONLY.install_default();
        Self { keys: RwLock::new(Keys::new(&secret)) }
    }

    /// Replaces the secret: tokens signed with the old one are refused from now on.
    pub fn set_secret(&self, secret: Vec<u8>) {
        *self.keys.write() = Keys::new(&secret);
    }

    /// A signed token for `who` with one scope, valid for `ttl_secs`.
    pub fn issue(
        &self,
        who: &Subject<'_>,
        scope: &str,
        ttl_secs: u64,
        session_id: &str,
        jti: Option<String>,
    ) -> Result<String, AuthError> {
        let now = Ts::now().0 / 1000;
        let claims = Claims {
            sub: who.email.to_owned(),
            scopes: vec![scope.to_owned()],
            iss: ISSUER.into(),
            iat: now,
            nbf: Some(now),
            exp: now + i64::try_from(ttl_secs).unwrap_or(i64::MAX / 2),
            session_id: session_id.to_owned(),
            jti,
            user_id: Some(who.user_id.to_string()),
            first_name: who.first_name.map(str::to_owned),
            last_name: who.last_name.map(str::to_owned),
            enabled: true,
            is_public: false,
            tenant_id: Some(who.tenant_id.to_string()),
            customer_id: who.customer_id.map(|c| c.to_string()),
        };
        self.sign(&claims)
    }

    fn sign(&self, claims: &Claims) -> Result<String, AuthError> {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.keys.read().encoding)
            .map_err(|e| AuthError::Sign(e.to_string()))
    }

    /// Checks signature, issuer, validity window and that the scope is one of `scopes`.
    pub fn verify(&self, token: &str, scopes: &[&str]) -> Result<Claims, AuthError> {
        let mut v = Validation::new(Algorithm::HS256);
        v.set_issuer(&[ISSUER]);
        v.set_required_spec_claims(&["exp", "iss", "sub"]);
        v.validate_nbf = true;
        v.leeway = SKEW.unsigned_abs();
        // `exp` is checked below without leeway: a token is expired at its `exp` second.
        v.validate_exp = false;
        let claims = jsonwebtoken::decode::<Claims>(token, &self.keys.read().decoding, &v)
            .map_err(|_| AuthError::BadToken)?
            .claims;
        let now = Ts::now().0 / 1000;
        if claims.iat > now + SKEW {
            return Err(AuthError::BadToken);
        }
        if claims.exp <= now {
            return Err(AuthError::Expired);
        }
        if !claims.scopes.iter().any(|s| scopes.contains(&s.as_str())) {
            return Err(AuthError::BadToken);
        }
        Ok(claims)
    }
}

/// `jsonwebtoken`'s crypto for this process: HS256 only.
static HS256_ONLY: CryptoProvider = CryptoProvider {
    signer_factory: |alg, key| match alg {
        Algorithm::HS256 => Ok(Box::new(Hs256(hmac_key(key.as_bytes())?))),
        _ => Err(ErrorKind::UnsupportedAlgorithm.into()),
    },
    verifier_factory: |alg, key| match alg {
        Algorithm::HS256 => Ok(Box::new(Hs256(hmac_key(key.try_get_as_bytes()?)?))),
        _ => Err(ErrorKind::UnsupportedAlgorithm.into()),
    },
    // JWK support (key thumbprints, public key components) is never used.
    key_utils: KeyUtils::new_unimplemented(),
};

fn hmac_key(secret: &[u8]) -> Result<Hmac<Sha256>, JwtError> {
    // HMAC accepts keys of any length; the error exists only in the trait's signature.
    <Hmac<Sha256> as Mac>::new_from_slice(secret).map_err(|_| ErrorKind::InvalidKeyFormat.into())
}

/// HMAC-SHA256 signer and verifier for `jsonwebtoken`.
struct Hs256(Hmac<Sha256>);

impl Signer<Vec<u8>> for Hs256 {
    fn try_sign(&self, msg: &[u8]) -> Result<Vec<u8>, SignatureError> {
        let mut mac = self.0.clone();
        mac.update(msg);
        Ok(mac.finalize().into_bytes().to_vec())
    }
}

impl JwtSigner for Hs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

impl Verifier<Vec<u8>> for Hs256 {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> Result<(), SignatureError> {
        let mut mac = self.0.clone();
        mac.update(msg);
        // Constant-time comparison.
        mac.verify_slice(signature).map_err(SignatureError::from_source)
    }
}

impl JwtVerifier for Hs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report
    use super::*;

    const ACCESS: &str = "TENANT_ADMIN";

    fn admin() -> Subject<'static> {
        Subject {
            email: "admin",
            user_id: uuid::Uuid::nil(),
            first_name: None,
            last_name: None,
            tenant_id: uuid::Uuid::nil(),
            customer_id: None,
        }
    }

    #[test]
    fn tokens_verify_and_reject_tampering_expiry_and_wrong_scope() {
        let jwt = Jwt::new(b"k".to_vec());
        let t = jwt.issue(&admin(), ACCESS, 60, "s1", None).unwrap();
        assert_eq!(jwt.verify(&t, &[ACCESS]).unwrap().session_id, "s1");
        assert_eq!(jwt.verify(&t, &[REFRESH_SCOPE]), Err(AuthError::BadToken));
        assert_eq!(Jwt::new(b"other".to_vec()).verify(&t, &[ACCESS]), Err(AuthError::BadToken));
        let mut tampered = t.clone();
        tampered.insert(tampered.len() - 3, 'A');
        assert!(jwt.verify(&tampered, &[ACCESS]).is_err());
        assert_eq!(jwt.verify(&jwt.issue(&admin(), ACCESS, 0, "s", None).unwrap(), &[ACCESS]), Err(AuthError::Expired));
        assert_eq!(jwt.verify("a.b", &[ACCESS]), Err(AuthError::BadToken));
    }

    #[test]
    fn issuer_and_not_before_are_checked() {
        let jwt = Jwt::new(b"k".to_vec());
        let now = Ts::now().0 / 1000;
        let good = Claims {
            sub: "admin".into(),
            scopes: vec![ACCESS.into()],
            iss: ISSUER.into(),
            iat: now,
            nbf: Some(now),
            exp: now + 60,
            session_id: "s".into(),
            jti: None,
            user_id: None,
            first_name: None,
            last_name: None,
            enabled: true,
            is_public: false,
            tenant_id: None,
            customer_id: None,
        };
        assert!(jwt.verify(&jwt.sign(&good).unwrap(), &[ACCESS]).is_ok());
        let forged = |c: Claims| jwt.verify(&jwt.sign(&c).unwrap(), &[ACCESS]);
        assert_eq!(forged(Claims { iss: "thingsboard.io".into(), ..good.clone() }), Err(AuthError::BadToken));
        assert_eq!(forged(Claims { nbf: Some(now + 3600), ..good.clone() }), Err(AuthError::BadToken));
        assert_eq!(forged(Claims { iat: now + 3600, ..good.clone() }), Err(AuthError::BadToken));
        // Within the tolerated clock skew a token from a slightly fast clock is accepted.
        assert!(forged(Claims { iat: now + 30, nbf: Some(now + 30), ..good.clone() }).is_ok());
        // A rotated secret invalidates every earlier token.
        let t = jwt.sign(&good).unwrap();
        jwt.set_secret(b"new".to_vec());
        assert_eq!(jwt.verify(&t, &[ACCESS]), Err(AuthError::BadToken));
    }

    /// Tokens issued by the earlier hand-written signer (header `{"alg":"HS256","typ":"JWT"}`,
    /// secret `k`, expiring in 2100) stay valid across the upgrade; other algorithms,
    /// even correctly signed with the same secret, and unsigned tokens are refused.
    #[test]
    fn earlier_tokens_verify_and_other_algorithms_are_refused() {
        let jwt = Jwt::new(b"k".to_vec());
        let claims = "eyJzdWIiOiJhZG1pbiIsInNjb3BlcyI6WyJURU5BTlRfQURNSU4iXSwiaXNzIjoiZ3JpZGxpbmtzIiwiaWF0IjoxNzY0MDAwMDAwLCJuYmYiOjE3NjQwMDAwMDAsImV4cCI6NDEwMjQ0NDgwMCwic2Vzc2lvbklkIjoiczEifQ";
        let hs256 =
            format!("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.{claims}.Wtgo6cEgqmoC4h3vW__Al7BBazK0Nh3-5bNYBBHtrsU");
        assert_eq!(jwt.verify(&hs256, &[ACCESS]).unwrap().session_id, "s1");
        let hs512 = format!(
            "eyJhbGciOiJIUzUxMiIsInR5cCI6IkpXVCJ9.{claims}.GlfuhxjC-_rLe_Jz1_fiMmuB4ujHhIiFbDPrj9HwpF1gTWt_q-Qd3pex3_ZiKqU9nqasOWA2V6prDYPUrXxwZg"
        );
        assert_eq!(jwt.verify(&hs512, &[ACCESS]), Err(AuthError::BadToken));
        let none = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{claims}.");
        assert_eq!(jwt.verify(&none, &[ACCESS]), Err(AuthError::BadToken));
    }
}
