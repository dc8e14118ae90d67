//! Logins and their refresh tokens. Each login (ThingsBoard's `sessionId`) has exactly one
//! refresh token that works: its id (`jti`) is kept here, and a refresh replaces it. A
//! refresh token used a second time means it was copied: the whole login is ended, so
//! neither the thief's nor the owner's tokens work any more. Access tokens of an ended
//! login are refused too.
//!
//! Logins are kept in the store's `meta` (`login/{sessionId}` → `{"jti","exp"}`), so a
//! refresh token used before a restart cannot be used again after it. When the store
//! refuses writes (disk full), logins go on in memory (so administrators can still log in
//! and read), and are forgotten by a restart.

use std::collections::HashMap;

use gridlinks_storage::{Store, StoreError};
use gridlinks_types::Ts;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

const PREFIX: &str = "login/";
/// Most logins kept; the one that expires first makes room.
const MAX_LOGINS: usize = 1_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Login {
    /// The one refresh token id that works.
    jti: String,
    /// When the login ends (its last refresh token expires), seconds.
    exp: i64,
}

/// Why a refresh was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No such login (ended, expired, or never started here).
    Unknown,
    /// An earlier refresh token of the login: the login is ended now.
    Reused,
}

/// The logins in force.
pub struct Logins {
    map: Mutex<HashMap<String, Login>>,
    store: Store,
}

fn random_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

impl Logins {
    /// Loads the stored logins, forgetting expired ones.
    pub fn load(store: &Store) -> Result<Self, StoreError> {
        let now = Ts::now().0 / 1000;
        let mut map = HashMap::new();
        for (key, value) in store.meta_prefix(PREFIX)? {
            match serde_json::from_slice::<Login>(&value) {
                Ok(l) if l.exp > now => {
                    map.insert(key[PREFIX.len()..].to_owned(), l);
                }
                _ => store.meta_delete(&key)?,
            }
        }
        Ok(Self { map: Mutex::new(map), store: store.clone() })
    }

    /// Whether login `session_id` is in force.
    pub fn contains(&self, session_id: &str) -> bool {
        self.map.lock().contains_key(session_id)
    }

    /// Starts a login whose refresh tokens live until `exp`: (session id, refresh token id).
    pub async fn start(&self, exp: i64) -> Result<(String, String), StoreError> {
        let (session_id, jti) = (random_id(), random_id());
        let login = Login { jti: jti.clone(), exp };
        let evicted = {
            let mut map = self.map.lock();
            let evicted = (map.len() >= MAX_LOGINS)
                .then(|| map.iter().min_by_key(|(_, l)| l.exp).map(|(k, _)| k.clone()))
                .flatten();
            if let Some(k) = &evicted {
                map.remove(k);
            }
            map.insert(session_id.clone(), login.clone());
            evicted
        };
        if let Some(k) = evicted {
            self.forget(k).await?;
        }
        self.save(&session_id, &login).await?;
        Ok((session_id, jti))
    }

    /// Replaces login `session_id`'s refresh token `jti` by a new one (returned), valid until `exp`.
    pub async fn rotate(&self, session_id: &str, jti: &str, exp: i64) -> Result<Result<String, Refused>, StoreError> {
        let next = random_id();
        let outcome = {
            let mut map = self.map.lock();
            match map.get_mut(session_id) {
                None => Err(Refused::Unknown),
                Some(l) if l.jti != jti => {
                    map.remove(session_id);
                    Err(Refused::Reused)
                }
                Some(l) => {
                    l.jti = next.clone();
                    l.exp = exp;
                    Ok(l.clone())
                }
            }
        };
        match outcome {
            Ok(login) => {
                self.save(session_id, &login).await?;
                Ok(Ok(next))
            }
            Err(Refused::Reused) => {
                self.forget(session_id.to_owned()).await?;
                Ok(Err(Refused::Reused))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    /// Ends login `session_id`.
    pub async fn end(&self, session_id: &str) -> Result<(), StoreError> {
        if self.map.lock().remove(session_id).is_some() {
            self.forget(session_id.to_owned()).await?;
        }
        Ok(())
    }

    /// Ends every login (the signing secret changed).
    pub async fn end_all(&self) -> Result<(), StoreError> {
        let all: Vec<String> = self.map.lock().drain().map(|(k, _)| k).collect();
        for k in all {
            self.forget(k).await?;
        }
        Ok(())
    }

    async fn save(&self, session_id: &str, login: &Login) -> Result<(), StoreError> {
        let (store, key) = (self.store.clone(), format!("{PREFIX}{session_id}"));
        let value = serde_json::to_vec(login).map_err(|_| StoreError::Corrupt("login encode"))?;
        let r =
            tokio::task::spawn_blocking(move || store.meta_put(&key, &value)).await.map_err(|_| StoreError::Closed)?;
        Self::in_memory_if_unwritable(r)
    }

    async fn forget(&self, session_id: String) -> Result<(), StoreError> {
        let store = self.store.clone();
        let r = tokio::task::spawn_blocking(move || store.meta_delete(&format!("{PREFIX}{session_id}")))
            .await
            .map_err(|_| StoreError::Closed)?;
        Self::in_memory_if_unwritable(r)
    }

    /// A login that cannot be stored because the store refuses writes lives in memory.
    fn in_memory_if_unwritable(r: Result<(), StoreError>) -> Result<(), StoreError> {
        match r {
            Err(e @ (StoreError::Db(_) | StoreError::Unavailable)) => {
                crate::logging::warn_limited!(error = %e, "login not stored (storage refuses writes): it lasts until a restart");
                Ok(())
            }
            r => r,
        }
    }
}
