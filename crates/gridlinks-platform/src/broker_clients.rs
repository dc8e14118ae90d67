//! Application credentials: MQTT clients that are not devices log in with a user name and
//! password (stored argon2-hashed in the broker's `Credentials` table) and get an
//! [`Acl`] of topic filters. Managed over REST at `/api/mqtt/clients` (the HTTP transport).
//!
//! Checking a password costs an argon2 verification (tens of milliseconds, on the password
//! pool of `crate::auth`), so the last password that verified is remembered as an HMAC under
//! a per-process key: a reconnect storm of the same application costs one argon2 per user,
//! not one per connection. Logins are throttled like the REST login.
//!
//! A user name never equals a device access token (the store refuses either when the other
//! exists), so a credential cannot lock a device out of MQTT.
//!
//! A credential belongs to a tenant. The first tenant's clients see the broker as it is; a
//! client of another tenant works inside its tenant's namespace ([`crate::sessions::mount`]): its
//! topics, filters, client id and retained messages are its tenant's alone. User names are
//! unique across tenants: a client logs in by name alone.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use gridlinks_broker::acl::{Acl, Action, Permission, Rule};
use gridlinks_broker::sessions::Sessions;
use gridlinks_storage::{BrokerRow, BrokerTable, Store, StoreError, WriteOp, WriterHandle};
use hmac::{Hmac, Mac};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::auth::{Auth, AuthError};
use crate::config::AclRuleConfig;

/// Longest user name, client id or topic filter accepted in a credential.
pub const MAX_FIELD: usize = 256;
/// Most topic filters in one ACL list.
pub const MAX_FILTERS: usize = 256;

/// A credential as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credential {
    /// The MQTT user name.
    pub username: String,
    /// argon2 PHC string of the password.
    pub password_hash: String,
    /// When set, the only client id this credential may connect with.
    pub client_id: Option<String>,
    /// Topic filters the client may publish to.
    pub publish: Vec<String>,
    /// Topic filters the client may subscribe within.
    pub subscribe: Vec<String>,
    /// Ordered allow/deny rules, read before `publish` and `subscribe`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleSpec>,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Its tenant; `None`: the first tenant (as every credential stored before tenants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<uuid::Uuid>,
}

impl Credential {
    /// The REST view: everything but the hash.
    pub fn view(&self) -> serde_json::Value {
        serde_json::json!({
            "username": self.username,
            "clientId": self.client_id,
            "publish": self.publish,
            "subscribe": self.subscribe,
            "rules": self.rules,
            "createdTime": self.created_time,
        })
    }
}

struct Entry {
    cred: Credential,
    acl: Arc<Acl>,
    /// Its tenant's namespace (none for the first tenant).
    mount: Option<Arc<str>>,
    /// HMAC of the last password that verified against `cred.password_hash`.
    verified: Mutex<Option<Vec<u8>>>,
}

/// Every credential, in memory (the table is small), kept in step with storage by the
/// REST handlers; with shared entities, a login reads its credential's row again, so one
/// made, changed or deleted on another node holds here too.
pub struct Credentials {
    map: RwLock<HashMap<String, Arc<Entry>>>,
    key: Vec<u8>,
    store: Store,
    /// Where the live connections of a credential found changed or deleted are closed.
    sessions: Arc<Sessions>,
}

impl Credentials {
    /// Loads the stored credentials.
    pub fn load(store: &Store, sessions: &Arc<Sessions>) -> Result<Self, StoreError> {
        let key = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()].iter().flat_map(|u| *u.as_bytes()).collect();
        let credentials = Self { map: RwLock::default(), key, store: store.clone(), sessions: sessions.clone() };
        credentials.reload()?;
        Ok(credentials)
    }

    /// Reads every credential again, keeping the entries (and their verified passwords)
    /// of those that did not change. The map is locked meanwhile, so a change taken in at
    /// the same time is not lost. The live connections of those that changed or went
    /// (another node changed them) are closed.
    pub fn reload(&self) -> Result<(), StoreError> {
        let mut map = self.map.write();
        let mut fresh = HashMap::with_capacity(map.len());
        for (_, v) in self.store.broker_rows(BrokerTable::Credentials)? {
            let cred: Credential = serde_json::from_slice(&v).map_err(|_| StoreError::Corrupt("MQTT credential"))?;
            let e = match map.remove(&cred.username) {
                Some(e) if e.cred == cred => e,
                old => {
                    if old.is_some() {
                        self.sessions.close_clients_of(&cred.username);
                    }
                    Arc::new(entry(cred))
                }
            };
            fresh.insert(e.cred.username.clone(), e);
        }
        for gone in map.keys() {
            self.sessions.close_clients_of(gone);
        }
        *map = fresh;
        Ok(())
    }

    /// `username`'s credential; with shared entities, as its row is now (other nodes may
    /// have changed it).
    fn current(&self, username: &str) -> Option<Arc<Entry>> {
        let known = self.map.read().get(username).cloned();
        if !self.store.replicated() {
            return known;
        }
        let stored = match self.store.broker_row(BrokerTable::Credentials, username.as_bytes()) {
            Ok(row) => row.and_then(|v| serde_json::from_slice::<Credential>(&v).ok()),
            Err(e) => {
                crate::logging::warn_limited!(error = %e, "cannot read an MQTT credential: using the one in memory");
                return known;
            }
        };
        match (stored, known) {
            (Some(cred), Some(e)) if e.cred == cred => Some(e),
            (Some(cred), known) => {
                let e = Arc::new(entry(cred));
                self.map.write().insert(username.to_owned(), e.clone());
                if known.is_some() {
                    self.sessions.close_clients_of(username);
                }
                Some(e)
            }
            (None, known) => {
                if known.is_some() {
                    self.map.write().remove(username);
                    self.sessions.close_clients_of(username);
                }
                None
            }
        }
    }

    /// Is `username` an application's?
    pub fn contains(&self, username: &str) -> bool {
        self.current(username).is_some()
    }

    /// Checks an application login from `peer`: its ACL when the password (and the client
    /// id, if the credential fixes one) fit. Throttled like the REST login, checked on the
    /// password pool, and an unknown user name costs what a wrong password costs.
    pub async fn login(
        &self,
        auth: &Auth,
        peer: IpAddr,
        username: &str,
        password: &[u8],
        client_id: &str,
    ) -> Result<AppLogin, AuthError> {
        auth.throttle.check(peer, username).map_err(AuthError::Throttled)?;
        let entry = self.current(username);
        let mac = self.mac(password);
        let cached = entry.as_ref().is_some_and(|e| e.verified.lock().as_deref() == Some(mac.as_slice()));
        let ok =
            cached || auth.passwords.verify(password, entry.as_ref().map(|e| e.cred.password_hash.as_str())).await?;
        match entry.filter(|e| ok && e.cred.client_id.as_deref().is_none_or(|c| c == client_id)) {
            Some(e) => {
                auth.throttle.succeeded(peer, username);
                *e.verified.lock() = Some(mac);
                Ok(AppLogin { acl: e.acl.clone(), mount: e.mount.clone() })
            }
            None => {
                auth.throttle.failed(peer, username);
                Err(AuthError::BadCredentials)
            }
        }
    }

    /// The login of an application whose certificate a trusted CA issued for `username`
    /// (its CN): no password; the credential's client id, if it has one, must match.
    pub fn cert_login(&self, username: &str, client_id: &str) -> Option<AppLogin> {
        let e = self.current(username)?;
        e.cred
            .client_id
            .as_deref()
            .is_none_or(|c| c == client_id)
            .then(|| AppLogin { acl: e.acl.clone(), mount: e.mount.clone() })
    }

    fn mac(&self, password: &[u8]) -> Vec<u8> {
        // HMAC accepts keys of any length.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("any key length");
        m.update(password);
        m.finalize().into_bytes().to_vec()
    }

    pub fn get(&self, username: &str) -> Option<Credential> {
        self.current(username).map(|e| e.cred.clone())
    }

    /// `tenant`'s credentials, by user name; with shared entities, as stored now (other
    /// nodes may have made or deleted some).
    pub fn of_tenant(&self, tenant: Option<uuid::Uuid>) -> Result<Vec<Credential>, StoreError> {
        if self.store.replicated() {
            self.reload()?;
        }
        let mut all: Vec<Credential> =
            self.map.read().values().filter(|e| e.cred.tenant == tenant).map(|e| e.cred.clone()).collect();
        all.sort_by(|a, b| a.username.cmp(&b.username));
        Ok(all)
    }

    /// Stores `cred` (new, or replacing the one of its user name) and closes the live
    /// connections that use it, so they reconnect under the new rules.
    pub async fn save(&self, writer: &WriterHandle, cred: Credential) -> Result<(), StoreError> {
        let value =
            serde_json::to_vec(&cred).map_err(|_| StoreError::Corrupt("an MQTT credential cannot be encoded"))?;
        let row =
            BrokerRow { table: BrokerTable::Credentials, key: cred.username.clone().into_bytes(), value: Some(value) };
        writer.submit(WriteOp::Broker(vec![row])).await?;
        let username = cred.username.clone();
        self.map.write().insert(username.clone(), Arc::new(entry(cred)));
        self.sessions.close_clients_of(&username);
        Ok(())
    }

    /// Deletes credentials (stored and in memory) and closes their live connections.
    pub async fn delete(&self, writer: &WriterHandle, usernames: Vec<String>) -> Result<(), StoreError> {
        let rows = usernames
            .iter()
            .map(|u| BrokerRow { table: BrokerTable::Credentials, key: u.clone().into_bytes(), value: None })
            .collect();
        writer.submit(WriteOp::Broker(rows)).await?;
        for u in &usernames {
            self.map.write().remove(u);
            self.sessions.close_clients_of(u);
        }
        Ok(())
    }
}

/// What an application's login gives its connection.
pub struct AppLogin {
    /// What it may publish and subscribe to (in its own terms).
    pub acl: Arc<Acl>,
    /// Its tenant's namespace, for a tenant other than the first.
    pub mount: Option<Arc<str>>,
}

fn entry(cred: Credential) -> Entry {
    let acl = Arc::new(Acl {
        rules: cred.rules.iter().map(|r| r.rule(r.topic.clone())).collect(),
        publish: cred.publish.clone(),
        subscribe: cred.subscribe.clone(),
    });
    let mount = cred.tenant.map(crate::sessions::mount);
    Entry { cred, acl, mount, verified: Mutex::new(None) }
}

/// One rule of a credential (`rules` in `POST /api/mqtt/clients`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// `allow` or `deny`.
    pub permission: Permission,
    /// `publish`, `subscribe` or `all`.
    pub action: Action,
    /// A topic filter.
    pub topic: String,
}

impl RuleSpec {
    fn rule(&self, filter: String) -> Rule {
        Rule { permission: self.permission, action: self.action, filter }
    }
}

/// The rules of `mqtt.acl_rules` that apply to a client (`user` `None`: anonymous), with
/// `%c` (client id) and `%u` (user name) put in. An allow rule whose name or id would put a
/// wildcard or level separator in its filter is left out (it would allow more than meant);
/// a deny rule keeps it (it denies more). A rule with `%u` does not apply to anonymous
/// clients.
pub fn configured_rules(rules: &[AclRuleConfig], user: Option<&str>, client_id: &str) -> Vec<Rule> {
    let mut out = Vec::new();
    for r in rules {
        let applies = (!r.anonymous || user.is_none())
            && r.user.as_deref().is_none_or(|u| Some(u) == user)
            && r.client_id.as_deref().is_none_or(|p| glob(p, client_id));
        if !applies {
            continue;
        }
        for t in &r.topics {
            let names = [("%c", Some(client_id)), ("%u", user)];
            let mut filter = t.clone();
            let mut usable = true;
            for (mark, value) in names.iter().filter(|(m, _)| t.contains(m)) {
                let Some(value) = value else {
                    usable = false;
                    break;
                };
                let unsafe_name = value.contains(['+', '#', '/']) || value.is_empty();
                usable &= !(unsafe_name && r.permission == Permission::Allow);
                filter = filter.replace(mark, value);
            }
            if usable {
                out.push(Rule { permission: r.permission, action: r.action, filter });
            }
        }
    }
    out
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod rule_tests {
    use super::*;

    #[test]
    fn client_id_patterns() {
        for (p, t, want) in [
            ("line-*", "line-7", true),
            ("line-*", "line-", true),
            ("line-*", "lin", false),
            ("*-sensor", "a-sensor", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "acb", false),
            ("exact", "exact", true),
            ("exact", "exact2", false),
            ("*", "", true),
            ("ab*ba", "aba", false),
        ] {
            assert_eq!(glob(p, t), want, "{p:?} {t:?}");
        }
    }

    #[test]
    fn configured_rules_apply_by_who_and_fill_in_names() {
        let cfg = |toml: &str| -> AclRuleConfig { toml::from_str(toml).unwrap() };
        let rules = [
            cfg(r#"permission = "allow"
topics = ["clients/%c/#", "users/%u/#"]"#),
            cfg(r#"permission = "deny"
action = "subscribe"
topics = ["secret/#"]
user = "viewer""#),
            cfg(r#"permission = "deny"
topics = ["lines/%c"]
client_id = "line-*""#),
            cfg(r#"permission = "allow"
topics = ["public/#"]
anonymous = true"#),
        ];
        let filters =
            |user, client| configured_rules(&rules, user, client).into_iter().map(|r| r.filter).collect::<Vec<_>>();
        assert_eq!(filters(Some("viewer"), "c1"), ["clients/c1/#", "users/viewer/#", "secret/#"]);
        assert_eq!(filters(Some("other"), "line-4"), ["clients/line-4/#", "users/other/#", "lines/line-4"]);
        // Anonymous: no %u rule, the anonymous-only one.
        assert_eq!(filters(None, "c1"), ["clients/c1/#", "public/#"]);
        // A wildcard in a name never widens an allow rule; it widens a deny rule.
        assert_eq!(filters(Some("#"), "line-#"), ["lines/line-#"]);
        let acl = Acl { rules: configured_rules(&rules, Some("viewer"), "c1"), ..Acl::default() };
        assert!(acl.may_publish("clients/c1/x") && !acl.may_publish("clients/c2/x"));
        assert!(!acl.may_subscribe("secret/a") && acl.withheld("secret/a"));
    }
}
