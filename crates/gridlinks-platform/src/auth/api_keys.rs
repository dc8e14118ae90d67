//! API keys (ThingsBoard 4.3): long-lived credentials for automation, sent as
//! `X-Authorization: ApiKey <value>`. A key is `glk_` + its id (32 hex digits) + 40 random
//! alphanumerics (about 238 random bits); only its SHA-256 is stored (a `DocKind::ApiKey`
//! document) and kept in memory, so checking a key costs a hash, no storage read. A key
//! stops working when it is deleted, disabled or past its expiration time.

use std::collections::HashMap;

use gridlinks_storage::{DocKind, DocRecord, Store, StoreError};
use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// What a key's value starts with.
const PREFIX: &str = "glk_";

/// A key as kept in memory.
#[derive(Clone, Copy)]
struct Entry {
    hash: [u8; 32],
    enabled: bool,
    /// Ms since epoch; 0: never.
    expires: i64,
    /// Whose it is.
    user: Uuid,
}

/// The live API keys by id.
#[derive(Default)]
pub struct ApiKeys {
    keys: RwLock<HashMap<Uuid, Entry>>,
}

/// A key's fields in its stored document.
pub fn doc(hash: &str, description: &str, expiration: i64, enabled: bool, user: Uuid) -> serde_json::Value {
    serde_json::json!({"hash": hash, "description": description, "expirationTime": expiration, "enabled": enabled,
        "userId": user})
}

fn entry(d: &DocRecord) -> Option<Entry> {
    let hex = d.doc.get("hash")?.as_str()?;
    let mut hash = [0u8; 32];
    for (i, b) in hash.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Entry {
        hash,
        enabled: d.doc.get("enabled").and_then(serde_json::Value::as_bool).unwrap_or(true),
        expires: d.doc.get("expirationTime").and_then(serde_json::Value::as_i64).unwrap_or(0),
        user: d.doc.get("userId")?.as_str()?.parse().ok()?,
    })
}

/// A fresh key for `id`: its value (shown once) and the hex SHA-256 to store.
pub fn generate(id: Uuid) -> (String, String) {
    let secret: String = (0..2).map(|_| gridlinks_storage::generate_token()).collect();
    let value = format!("{PREFIX}{}{secret}", id.simple());
    let hash = hex(&Sha256::digest(value.as_bytes()));
    (value, hash)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ApiKeys {
    /// The keys stored in `store`.
    pub fn load(store: &Store) -> Result<Self, StoreError> {
        let keys = Self { keys: RwLock::new(HashMap::new()) };
        keys.reload(store)?;
        Ok(keys)
    }

    /// Reads every key again (other nodes changed some), the map locked meanwhile.
    pub fn reload(&self, store: &Store) -> Result<(), StoreError> {
        let mut locked = self.keys.write();
        *locked = store.docs(DocKind::ApiKey)?.iter().filter_map(|d| Some((d.id, entry(d)?))).collect();
        Ok(())
    }

    /// Takes in a key as stored (after a create or change).
    pub fn put(&self, d: &DocRecord) {
        if let Some(e) = entry(d) {
            self.keys.write().insert(d.id, e);
        }
    }

    /// Forgets a deleted key.
    pub fn remove(&self, id: Uuid) {
        self.keys.write().remove(&id);
    }

    /// The user whose live key at `now` (ms since epoch) `value` is. The hashes are
    /// compared in constant time.
    pub fn check(&self, value: &str, now: i64) -> Option<Uuid> {
        let id = value.strip_prefix(PREFIX).and_then(|v| v.get(..32)).and_then(|h| Uuid::try_parse(h).ok())?;
        let e = self.keys.read().get(&id).copied()?;
        let given: [u8; 32] = Sha256::digest(value.as_bytes()).into();
        let same = given.iter().zip(e.hash).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        (same && e.enabled && (e.expires == 0 || now < e.expires)).then_some(e.user)
    }

    /// Forgets every key of a deleted user.
    pub fn remove_user(&self, user: Uuid) {
        self.keys.write().retain(|_, e| e.user != user);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report
    use super::*;

    #[test]
    fn only_the_generated_value_of_a_live_key_passes() {
        let keys = ApiKeys::default();
        let id = Uuid::new_v4();
        let user = Uuid::new_v4();
        let (value, hash) = generate(id);
        assert!(value.starts_with(PREFIX) && value.len() == 4 + 32 + 40, "{value}");
        let record = |enabled: bool, expires: i64| DocRecord {
            id,
            created_time: 0,
            title: "k".into(),
            doc: doc(&hash, "k", expires, enabled, user),
        };
        assert!(keys.check(&value, 1).is_none(), "not stored yet");
        keys.put(&record(true, 0));
        assert_eq!(keys.check(&value, 1), Some(user));
        let mut wrong = value.clone();
        wrong.pop();
        wrong.push('!');
        assert!(keys.check(&wrong, 1).is_none());
        assert!(keys.check("glk_nothing", 1).is_none());
        assert!(keys.check("", 1).is_none());
        keys.put(&record(false, 0));
        assert!(keys.check(&value, 1).is_none(), "disabled");
        keys.put(&record(true, 100));
        assert!(keys.check(&value, 99).is_some() && keys.check(&value, 100).is_none(), "expired at its time");
        keys.remove(id);
        assert!(keys.check(&value, 1).is_none(), "deleted");
    }
}
