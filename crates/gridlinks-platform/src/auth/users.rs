//! Who can log in to the REST API, and what each may reach.
//!
//! Three kinds of users, as in ThingsBoard CE:
//! - the **system administrator** (`admin.sysadmin_user`, of the configuration) manages
//!   tenants and their administrators, and sees no tenant's data;
//! - **tenant administrators** manage everything of their tenant: the administrator of the
//!   configuration (`admin.user`, of the first tenant) and those created with `POST /api/user`;
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
    /// Manages tenants and their administrators.
    SysAdmin,
    /// Manages the tenant's devices, customers, users, profiles and dashboards.
    TenantAdmin,
    /// Sees and controls the devices assigned to its customer.
    CustomerUser,
}

impl Authority {
    /// As ThingsBoard writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Authority::SysAdmin => "SYS_ADMIN",
            Authority::TenantAdmin => "TENANT_ADMIN",
            Authority::CustomerUser => "CUSTOMER_USER",
        }
    }

    /// From ThingsBoard's name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "SYS_ADMIN" => Some(Authority::SysAdmin),
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
    /// Its tenant (nil for the system administrator).
    pub tenant: Uuid,
    /// The customer of a customer user.
    pub customer: Option<Uuid>,
}

/// `auth.hide_other_tenants`, set once at start.
static HIDE_OTHER_TENANTS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Sets `auth.hide_other_tenants` for [`Caller::knows_tenant`].
pub fn hide_other_tenants(hide: bool) {
    HIDE_OTHER_TENANTS.store(hide, std::sync::atomic::Ordering::Relaxed);
}

impl Caller {
    /// Whether it may learn that entities of `tenant` exist: its own tenant's, or any for
    /// the system administrator (or anyone with `auth.hide_other_tenants` off, as in
    /// ThingsBoard). Other tenants' ids are answered as ids that do not exist.
    pub fn knows_tenant(&self, tenant: Uuid) -> bool {
        tenant == self.tenant
            || self.authority == Authority::SysAdmin
            || !HIDE_OTHER_TENANTS.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether it may create, read, change and delete user `other`: the system administrator
    /// tenant administrators; a tenant administrator its tenant's administrators and
    /// customer users; a customer user nobody (itself through other paths).
    pub fn may_manage(&self, other: &Caller) -> bool {
        match self.authority {
            Authority::SysAdmin => other.authority == Authority::TenantAdmin,
            Authority::TenantAdmin => other.authority != Authority::SysAdmin && other.tenant == self.tenant,
            Authority::CustomerUser => false,
        }
    }

    /// Whether it may see and control an entity of `tenant` assigned to `customer`: a
    /// tenant administrator all of its tenant's, a customer user its own customer's only,
    /// the system administrator none.
    pub fn may_use(&self, tenant: Uuid, customer: Option<Uuid>) -> bool {
        match self.authority {
            Authority::SysAdmin => false,
            Authority::TenantAdmin => tenant == self.tenant,
            Authority::CustomerUser => tenant == self.tenant && customer.is_some() && customer == self.customer,
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
    /// The credentials' version: a new one with every password change. A login records the
    /// stamp of the password it checked, and works only while the user's stamp is the same.
    pub stamp: String,
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
    /// The users of the configuration: the first tenant's administrator and the system
    /// administrator.
    configured: [Arc<Entry>; 2],
    first_tenant: Uuid,
}

/// A user of the configuration.
pub struct Configured<'a> {
    /// Login name.
    pub email: &'a str,
    /// Argon2 PHC string.
    pub hash: String,
    /// Its id.
    pub id: Uuid,
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
pub fn user_doc(email: &str, authority: Authority, tenant: Uuid, customer: Option<Uuid>, body: &J) -> J {
    let text = |k: &str| body.get(k).filter(|v| v.is_string()).cloned().unwrap_or(J::Null);
    json!({
        "email": email,
        "authority": authority.as_str(),
        "tenantId": tenant.to_string(),
        "customerId": customer.map(|c| c.to_string()),
        "firstName": text("firstName"),
        "lastName": text("lastName"),
        "phone": text("phone"),
        "additionalInfo": body.get("additionalInfo").cloned().unwrap_or_else(|| json!({})),
    })
}

/// A credentials document's fields (`stamp`: see [`Entry::stamp`]).
pub fn credentials_doc(hash: Option<&str>, enabled: bool, activation: Option<(&str, i64)>, stamp: &str) -> J {
    json!({
        "hash": hash,
        "enabled": enabled,
        "activateHash": activation.map(|a| a.0),
        "activateExpires": activation.map(|a| a.1),
        "stamp": stamp,
    })
}

/// A fresh credentials stamp, for a password change.
pub fn new_stamp() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn str_of<'a>(d: &'a J, k: &str) -> Option<&'a str> {
    d.get(k).and_then(J::as_str)
}

/// The entry of user document `u` with its credentials `c`.
/// (Users stored before tenants existed carry no `tenantId`: they are of `first_tenant`.)
fn entry(u: &DocRecord, c: Option<&DocRecord>, first_tenant: Uuid) -> Option<(Entry, Option<Activation>)> {
    let authority = Authority::parse(str_of(&u.doc, "authority")?)?;
    let customer = str_of(&u.doc, "customerId").and_then(|s| s.parse().ok());
    let tenant = str_of(&u.doc, "tenantId").and_then(|s| s.parse().ok()).unwrap_or(first_tenant);
    let cred = c.map(|c| &c.doc);
    let e = Entry {
        caller: Caller { user: u.id, email: u.title.clone(), authority, tenant, customer },
        first_name: str_of(&u.doc, "firstName").map(str::to_owned),
        last_name: str_of(&u.doc, "lastName").map(str::to_owned),
        hash: cred.and_then(|c| str_of(c, "hash")).map(str::to_owned),
        enabled: cred.and_then(|c| c.get("enabled")).and_then(J::as_bool).unwrap_or(false),
        // Documents of releases before stamps: the second of the last password change, so
        // that the logins made before it (which have no stamp) stay ended.
        stamp: match cred.and_then(|c| str_of(c, "stamp")) {
            Some(s) => s.to_owned(),
            None => cred
                .and_then(|c| c.get("tokensAfter"))
                .and_then(J::as_i64)
                .filter(|&t| t > 0)
                .map(|t| t.to_string())
                .unwrap_or_default(),
        },
        configured: false,
    };
    let activation = cred.and_then(|c| {
        let hash = unhex(str_of(c, "activateHash")?)?;
        Some(Activation { hash, user: u.id, expires: c.get("activateExpires")?.as_i64()? })
    });
    Some((e, activation))
}

impl Users {
    /// The stored users, the administrator of `first_tenant` and the system administrator
    /// of the configuration.
    pub fn load(
        store: &Store,
        admin: Configured<'_>,
        sysadmin: Configured<'_>,
        first_tenant: Uuid,
    ) -> Result<Self, StoreError> {
        let configured = |c: Configured<'_>, authority, tenant| {
            Arc::new(Entry {
                caller: Caller { user: c.id, email: c.email.to_owned(), authority, tenant, customer: None },
                first_name: None,
                last_name: None,
                hash: Some(c.hash),
                enabled: true,
                stamp: String::new(),
                configured: true,
            })
        };
        let users = Self {
            maps: RwLock::new(Maps::default()),
            configured: [
                configured(admin, Authority::TenantAdmin, first_tenant),
                configured(sysadmin, Authority::SysAdmin, Uuid::nil()),
            ],
            first_tenant,
        };
        users.reload(store)?;
        Ok(users)
    }

    /// Reads every user again (after a write that changed several, or other nodes' changes).
    /// The map is locked meanwhile, so a change taken in at the same time is not lost.
    pub fn reload(&self, store: &Store) -> Result<(), StoreError> {
        let mut locked = self.maps.write();
        let creds: HashMap<Uuid, DocRecord> =
            store.docs(DocKind::UserCredentials)?.into_iter().map(|c| (c.id, c)).collect();
        let mut maps = Maps::default();
        for u in store.docs(DocKind::User)? {
            if let Some((e, activation)) = entry(&u, creds.get(&u.id), self.first_tenant) {
                Self::insert(&mut maps, e, activation);
            }
        }
        for c in &self.configured {
            Self::insert(&mut maps, (**c).clone(), None);
        }
        *locked = maps;
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
        let Some((e, activation)) = entry(user, credentials, self.first_tenant) else { return };
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

    /// Every user who can log in (the configuration's included).
    pub fn all(&self) -> Vec<Arc<Entry>> {
        let maps = self.maps.read();
        let mut all: Vec<Arc<Entry>> = maps.by_id.values().cloned().collect();
        all.extend(self.configured.iter().filter(|c| !maps.by_id.contains_key(&c.caller.user)).cloned());
        all
    }

    /// Whether `email` is the name of a user of the configuration.
    pub fn is_configured_email(&self, email: &str) -> bool {
        self.configured.iter().any(|c| c.caller.email.eq_ignore_ascii_case(email))
    }

    /// The user a live activation token at `now` (ms) belongs to.
    pub fn activation(&self, token: &str, now: i64) -> Option<Arc<Entry>> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let maps = self.maps.read();
        let a = maps.activations.get(&hash).filter(|a| now < a.expires)?;
        maps.by_id.get(&a.user).cloned()
    }

    /// Forgets the users of a deleted tenant.
    pub fn remove_tenant(&self, tenant: Uuid) {
        let mut maps = self.maps.write();
        let gone: Vec<Uuid> =
            maps.by_id.values().filter(|e| e.caller.tenant == tenant && !e.configured).map(|e| e.caller.user).collect();
        for id in gone {
            Self::forget(&mut maps, id);
        }
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
        let t = Uuid::new_v4();
        let user = Caller {
            user: Uuid::new_v4(),
            email: "u@x".into(),
            authority: Authority::CustomerUser,
            tenant: t,
            customer: Some(c),
        };
        assert!(user.may_use(t, Some(c)));
        assert!(!user.may_use(t, Some(Uuid::new_v4())));
        assert!(!user.may_use(t, None), "unassigned devices are the tenant's");
        assert!(!user.may_use(Uuid::new_v4(), Some(c)), "another tenant's, whatever its customer field says");
        let admin = Caller { authority: Authority::TenantAdmin, customer: None, ..user.clone() };
        assert!(admin.may_use(t, None) && admin.may_use(t, Some(c)));
        assert!(!admin.may_use(Uuid::new_v4(), None), "another tenant's");
        let sys = Caller { authority: Authority::SysAdmin, tenant: Uuid::nil(), customer: None, ..user };
        assert!(!sys.may_use(t, None) && !sys.may_use(Uuid::nil(), None), "no tenant's data");
    }

    #[test]
    fn activation_tokens_work_until_they_expire_and_go_with_their_user() {
        let store_dir = tempfile::tempdir().unwrap();
        let store = Store::open(store_dir.path(), &gridlinks_storage::StoreOptions::default()).unwrap();
        let conf = |email| Configured { email, hash: "phc".into(), id: Uuid::new_v4() };
        let users = Users::load(&store, conf("admin"), conf("sysadmin"), Uuid::new_v4()).unwrap();
        let id = Uuid::new_v4();
        let u = doc(
            id,
            "cu@x",
            user_doc("cu@x", Authority::CustomerUser, Uuid::new_v4(), Some(Uuid::new_v4()), &json!({})),
        );
        let c = doc(id, "credentials", credentials_doc(None, false, Some((&token_hash("tok"), 100)), ""));
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
