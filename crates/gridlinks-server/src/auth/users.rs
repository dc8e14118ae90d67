//! Who can log in to the REST API, and what each may reach.
//!
//! There are two kinds of users, as in ThingsBoard CE:
//! - **tenant administrators** manage everything: the administrator of the configuration
//!   (`admin.user`, never stored as a document) and those created with `POST /api/user`;
//! - **customer users** see and control only the devices assigned to their customer.
//!
//! Stored users are `DocKind::User` documents (title: the email, lower case) with a
//! `DocKind::UserCredentials` document of the same id that holds the argon2 password hash,
//! whether the account is active, the SHA-256 of a pending activation token, and the time
//! before which tokens are refused (set by a password change). Everything is kept in memory
//! here, so checking a token or an API key costs a map lookup, no storage read.

use std::collections::HashMap;
use std::sync::Arc;

use gridlinks_storage::{DocKind, DocRecord, Store, StoreError};
use parking_lot::RwLock;
use serde_json::{json, Value as J};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// A user's authority (ThingsBoard's `authority`, the access token's scope).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Authority {
    /// Manages the tenant's devices, customers, users, profiles and dashboards.
    TenantAdmin,
    /// Sees and controls the devices assigned to its customer.
    CustomerUser,
}

impl Authority {
    /// As ThingsBoard writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Authority::TenantAdmin => "TENANT_ADMIN",
            Authority::CustomerUser => "CUSTOMER_USER",
        }
    }

    /// From ThingsBoard's name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TENANT_ADMIN" => Some(Authority::TenantAdmin),
            "CUSTOMER_USER" => Some(Authority::CustomerUser),
            _ => None,
        }
    }
}

/// The user a request acts for.
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    /// User id.
    pub user: Uuid,
    /// Email (the login name).
    pub email: String,
    /// Authority.
    pub authority: Authority,
    /// The customer of a customer user.
    pub customer: Option<Uuid>,
}

impl Caller {
    /// Whether it may see and control a device (or dashboard) assigned to `customer`: a
    /// tenant administrator all, a customer user its own customer's only.
    pub fn may_use(&self, customer: Option<Uuid>) -> bool {
        match self.authority {
            Authority::TenantAdmin => true,
            Authority::CustomerUser => customer.is_some() && customer == self.customer,
        }
    }
}

/// A user as kept in memory.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Who.
    pub caller: Caller,
    /// First and last name, for token claims.
    pub first_name: Option<String>,
    /// Last name.
    pub last_name: Option<String>,
    /// Argon2 PHC string; none until the account is activated.
    pub hash: Option<String>,
    /// Whether it may log in.
    pub enabled: bool,
    /// Tokens issued before this second are refused (a password change).
    pub tokens_after: i64,
    /// Whether it is the administrator of the configuration (no stored document).
    pub configured: bool,
}

/// A pending activation.
#[derive(Clone, Copy)]
struct Activation {
    /// SHA-256 of the token.
    hash: [u8; 32],
    user: Uuid,
    /// Ms since epoch.
    expires: i64,
}

#[derive(Default)]
struct Maps {
    by_email: HashMap<String, Arc<Entry>>,
    by_id: HashMap<Uuid, Arc<Entry>>,
    activations: HashMap<[u8; 32], Activation>,
}

/// The users who can log in.
pub struct Users {
    maps: RwLock<Maps>,
    admin: Arc<Entry>,
}

/// The SHA-256 of an activation token, in hex as stored.
pub fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A user document's fields: what clients send and get back, besides id and time.
pub fn user_doc(email: &str, authority: Authority, customer: Option<Uuid>, body: &J) -> J {
    let text = |k: &str| body.get(k).filter(|v| v.is_string()).cloned().unwrap_or(J::Null);
    json!({
        "email": email,
        "authority": authority.as_str(),
        "customerId": customer.map(|c| c.to_string()),
        "firstName": text("firstName"),
        "lastName": text("lastName"),
        "phone": text("phone"),
        "additionalInfo": body.get("additionalInfo").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A credentials document's fields.
pub fn credentials_doc(hash: Option<&str>, enabled: bool, activation: Option<(&str, i64)>, tokens_after: i64) -> J {
    json!({
        "hash": hash,
        "enabled": enabled,
        "activateHash": activation.map(|a| a.0),
        "activateExpires": activation.map(|a| a.1),
        "tokensAfter": tokens_after,
    })
}

fn str_of<'a>(d: &'a J, k: &str) -> Option<&'a str> {
    d.get(k).and_then(J::as_str)
}

/// The entry of user document `u` with its credentials `c`.
fn entry(u: &DocRecord, c: Option<&DocRecord>) -> Option<(Entry, Option<Activation>)> {
    let authority = Authority::parse(str_of(&u.doc, "authority")?)?;
    let customer = str_of(&u.doc, "customerId").and_then(|s| s.parse().ok());
    let cred = c.map(|c| &c.doc);
    let e = Entry {
        caller: Caller { user: u.id, email: u.title.clone(), authority, customer },
        first_name: str_of(&u.doc, "firstName").map(str::to_owned),
        last_name: str_of(&u.doc, "lastName").map(str::to_owned),
        hash: cred.and_then(|c| str_of(c, "hash")).map(str::to_owned),
        enabled: cred.and_then(|c| c.get("enabled")).and_then(J::as_bool).unwrap_or(false),
        tokens_after: cred.and_then(|c| c.get("tokensAfter")).and_then(J::as_i64).unwrap_or(0),
        configured: false,
    };
    let activation = cred.and_then(|c| {
        let hash = unhex(str_of(c, "activateHash")?)?;
        Some(Activation { hash, user: u.id, expires: c.get("activateExpires")?.as_i64()? })
    });
    Some((e, activation))
}

impl Users {
    /// The stored users, and the configured administrator (`admin.user`, whose password
    /// hash is `admin_hash` and id `admin_id`).
    pub fn load(store: &Store, admin_email: &str, admin_hash: String, admin_id: Uuid) -> Result<Self, StoreError> {
        let admin = Arc::new(Entry {
            caller: Caller {
                user: admin_id,
                email: admin_email.to_owned(),
                authority: Authority::TenantAdmin,
                customer: None,
            },
            first_name: None,
            last_name: None,
            hash: Some(admin_hash),
            enabled: true,
            tokens_after: 0,
            configured: true,
        });
        let users = Self { maps: RwLock::new(Maps::default()), admin };
        users.reload(store)?;
        Ok(users)
    }

    /// Reads every user again (after a write that changed several).
    pub fn reload(&self, store: &Store) -> Result<(), StoreError> {
        let creds: HashMap<Uuid, DocRecord> =
            store.docs(DocKind::UserCredentials)?.into_iter().map(|c| (c.id, c)).collect();
        let mut maps = Maps::default();
        for u in store.docs(DocKind::User)? {
            if let Some((e, activation)) = entry(&u, creds.get(&u.id)) {
                Self::insert(&mut maps, e, activation);
            }
        }
        Self::insert(&mut maps, (*self.admin).clone(), None);
        *self.maps.write() = maps;
        Ok(())
    }

    fn insert(maps: &mut Maps, e: Entry, activation: Option<Activation>) {
        let e = Arc::new(e);
        maps.by_email.insert(e.caller.email.to_lowercase(), e.clone());
        maps.by_id.insert(e.caller.user, e);
        if let Some(a) = activation {
            maps.activations.insert(a.hash, a);
        }
    }

    /// Takes in a user as stored (after a create or change).
    pub fn put(&self, user: &DocRecord, credentials: Option<&DocRecord>) {
        let Some((e, activation)) = entry(user, credentials) else { return };
        let mut maps = self.maps.write();
        Self::forget(&mut maps, user.id);
        Self::insert(&mut maps, e, activation);
    }

    /// Forgets a deleted user: its tokens and keys stop working.
    pub fn remove(&self, id: Uuid) {
        Self::forget(&mut self.maps.write(), id);
    }

    fn forget(maps: &mut Maps, id: Uuid) {
        if let Some(old) = maps.by_id.remove(&id) {
            maps.by_email.remove(&old.caller.email.to_lowercase());
        }
        maps.activations.retain(|_, a| a.user != id);
    }

    /// A user by login name (any case).
    pub fn by_email(&self, email: &str) -> Option<Arc<Entry>> {
        self.maps.read().by_email.get(&email.to_lowercase()).cloned()
    }

    /// A user by id.
    pub fn by_id(&self, id: Uuid) -> Option<Arc<Entry>> {
        self.maps.read().by_id.get(&id).cloned()
    }

    /// Whether `email` is the configured administrator's name.
    pub fn is_admin_email(&self, email: &str) -> bool {
        self.admin.caller.email.eq_ignore_ascii_case(email)
    }

    /// The user a live activation token at `now` (ms) belongs to.
    pub fn activation(&self, token: &str, now: i64) -> Option<Arc<Entry>> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let maps = self.maps.read();
        let a = maps.activations.get(&hash).filter(|a| now < a.expires)?;
        maps.by_id.get(&a.user).cloned()
    }

    /// Every user of `customer`, or the tenant administrators when `None`, by email.
    pub fn of(&self, customer: Option<Uuid>) -> Vec<Arc<Entry>> {
        let mut out: Vec<_> = self
            .maps
            .read()
            .by_id
            .values()
            .filter(|e| match customer {
                Some(c) => e.caller.customer == Some(c),
                None => e.caller.authority == Authority::TenantAdmin,
            })
            .cloned()
            .collect();
        out.sort_by(|a, b| a.caller.email.cmp(&b.caller.email));
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report
    use super::*;

    fn doc(id: Uuid, title: &str, doc: J) -> DocRecord {
        DocRecord { id, created_time: 0, title: title.into(), doc }
    }

    #[test]
    fn a_customer_user_may_use_only_its_customers_devices() {
        let c = Uuid::new_v4();
        let user =
            Caller { user: Uuid::new_v4(), email: "u@x".into(), authority: Authority::CustomerUser, customer: Some(c) };
        assert!(user.may_use(Some(c)));
        assert!(!user.may_use(Some(Uuid::new_v4())));
        assert!(!user.may_use(None), "unassigned devices are the tenant's");
        let admin = Caller { authority: Authority::TenantAdmin, customer: None, ..user };
        assert!(admin.may_use(None) && admin.may_use(Some(c)));
    }

    #[test]
    fn activation_tokens_work_until_they_expire_and_go_with_their_user() {
        let store_dir = tempfile::tempdir().unwrap();
        let store = Store::open(store_dir.path(), &gridlinks_storage::StoreOptions::default()).unwrap();
        let users = Users::load(&store, "admin", "phc".into(), Uuid::new_v4()).unwrap();
        let id = Uuid::new_v4();
        let u = doc(id, "cu@x", user_doc("cu@x", Authority::CustomerUser, Some(Uuid::new_v4()), &json!({})));
        let c = doc(id, "credentials", credentials_doc(None, false, Some((&token_hash("tok"), 100)), 0));
        users.put(&u, Some(&c));
        assert_eq!(users.by_email("CU@x").unwrap().caller.user, id);
        assert_eq!(users.activation("tok", 99).unwrap().caller.user, id);
        assert!(users.activation("tok", 100).is_none(), "expired at its time");
        assert!(users.activation("other", 1).is_none());
        users.remove(id);
        assert!(users.activation("tok", 1).is_none() && users.by_email("cu@x").is_none());
        assert!(users.by_email("ADMIN").is_some_and(|a| a.configured));
    }
}
