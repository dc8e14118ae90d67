//! Logins and their refresh tokens. Each login (ThingsBoard's `sessionId`) has exactly one
//! refresh token that works: its id (`jti`) is kept here, and a refresh replaces it. A
//! refresh token used a second time means it was copied: the whole login is ended, so
//! neither the thief's nor the owner's tokens work any more. Access tokens of an ended
//! login are refused too.
//!
//! A login also records the credentials stamp of the password it checked
//! ([`crate::auth::users::Entry::stamp`]): a password change gives the user a new stamp,
//! which ends every earlier login at once, whatever the clock says — even one whose check
//! of the old password finished after the change.
//!
//! Logins are shared settings (`login/{sessionId}` → `{"jti","exp","stamp"}`): they outlive a
//! restart, and with shared entities (`cluster.entities`) every node knows them, so a token
//! works on any node. A refresh is a compare-and-set ([`WriteOp::SwapSetting`]) under the
//! cluster's lock, so a refresh token used on two nodes at once still works only once.
//! When the store refuses writes (disk full), new logins go on in memory (so
//! administrators can still log in and read) and are forgotten by a restart.

use std::collections::HashMap;

use gridlinks_storage::{Store, StoreError, WriteOp, WriteOutcome, WriterHandle};
use gridlinks_types::Ts;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

const PREFIX: &str = "login/";
/// Most logins kept; expired ones, then the one that expires first, make room.
const MAX_LOGINS: usize = 1_000;
/// Tries of a compare-and-set that other writers keep beating before giving up.
const SWAP_TRIES: usize = 8;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Login {
    /// The one refresh token id that works.
    jti: String,
    /// When the login ends (its last refresh token expires), seconds.
    exp: i64,
    /// The user's credentials stamp when the login began (logins of releases before
    /// stamps have none: the empty stamp).
    #[serde(default)]
    stamp: String,
}

impl Login {
    fn encode(&self) -> Vec<u8> {
        // A struct of strings and an integer always encodes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    fn live(&self) -> bool {
        self.exp > Ts::now().0 / 1000
    }
}

/// Why a refresh was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No such login (ended, expired, or never started).
    Unknown,
    /// An earlier refresh token of the login: the login is ended now.
    Reused,
}

/// The logins in force.
pub struct Logins {
    store: Store,
    writer: WriterHandle,
    /// Logins the store could not take (it refused writes).
    memory: Mutex<HashMap<String, Login>>,
}

fn random_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn key(session_id: &str) -> String {
    format!("{PREFIX}{session_id}")
}

/// Whether a write failed because the store (or the shared database) refuses writes.
fn unwritable(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Db(_)
            | StoreError::Unavailable
            | StoreError::DiskFull(_)
            | StoreError::CommitFailed(_)
            | StoreError::Database(_)
    )
}

impl Logins {
    /// The logins of `store`, changed through `writer`. Logins kept in `meta` by versions
    /// before logins were shared are dropped (their users log in again).
    pub fn load(store: &Store, writer: &WriterHandle) -> Result<Self, StoreError> {
        let old = store.meta_prefix(PREFIX)?;
        if !old.is_empty() {
            tracing::info!(logins = old.len(), "logins of an earlier version ended: their users log in again");
        }
        for (k, _) in old {
            store.meta_delete(&k)?;
        }
        Ok(Self { store: store.clone(), writer: writer.clone(), memory: Mutex::new(HashMap::new()) })
    }

    fn stored(&self, session_id: &str) -> Result<Option<(Vec<u8>, Login)>, StoreError> {
        Ok(self.store.setting(&key(session_id))?.and_then(|raw| {
            let login = serde_json::from_slice(&raw).ok()?;
            Some((raw, login))
        }))
    }

    /// Whether login `session_id` is in force for a user whose credentials stamp is `stamp`.
    pub fn contains(&self, session_id: &str, stamp: &str) -> bool {
        let valid = |l: &Login| l.live() && l.stamp == stamp;
        if self.memory.lock().get(session_id).is_some_and(valid) {
            return true;
        }
        matches!(self.stored(session_id), Ok(Some((_, l))) if valid(&l))
    }

    /// Sets `session_id`'s login to `value` if it is `expect` now; whether it was.
    async fn swap(&self, session_id: &str, expect: Option<Vec<u8>>, value: Option<&Login>) -> Result<bool, StoreError> {
        let op = WriteOp::SwapSetting { name: key(session_id), expect, value: value.map(Login::encode) };
        match self.writer.submit(op).await? {
            WriteOutcome::Swapped(done) => Ok(done),
            _ => Err(StoreError::Corrupt("unexpected outcome of a setting swap")),
        }
    }

    /// Starts a login, of a password whose credentials stamp is `stamp`, whose refresh
    /// tokens live until `exp`: (session id, refresh token id).
    pub async fn start(&self, exp: i64, stamp: &str) -> Result<(String, String), StoreError> {
        let (session_id, jti) = (random_id(), random_id());
        let login = Login { jti: jti.clone(), exp, stamp: stamp.to_owned() };
        if let Err(e) = self.make_room().await {
            if !unwritable(&e) {
                return Err(e);
            }
        }
        match self.swap(&session_id, None, Some(&login)).await {
            Ok(true) => {}
            Ok(false) => return Err(StoreError::Corrupt("a new login id is taken")),
            Err(e) if unwritable(&e) => {
                crate::logging::warn_limited!(error = %e, "login not stored (storage refuses writes): it lasts until a restart");
                let mut memory = self.memory.lock();
                memory.retain(|_, l| l.live());
                if memory.len() >= MAX_LOGINS {
                    return Err(e);
                }
                memory.insert(session_id.clone(), login);
            }
            Err(e) => return Err(e),
        }
        Ok((session_id, jti))
    }

    /// Ends expired logins and, past [`MAX_LOGINS`], the ones that expire first.
    async fn make_room(&self) -> Result<(), StoreError> {
        let mut logins: Vec<(String, Vec<u8>, i64)> = Vec::new();
        for (k, raw) in self.store.settings_prefix(PREFIX)? {
            let exp = serde_json::from_slice::<Login>(&raw).map_or(0, |l| l.exp);
            logins.push((k[PREFIX.len()..].to_owned(), raw, exp));
        }
        let now = Ts::now().0 / 1000;
        logins.sort_unstable_by_key(|l| l.2);
        let expired = logins.iter().take_while(|l| l.2 <= now).count();
        let over = (logins.len() + 1).saturating_sub(MAX_LOGINS);
        for (session_id, raw, _) in logins.into_iter().take(expired.max(over)) {
            // Lost to a refresh or an end meanwhile: it is someone else's business now.
            self.swap(&session_id, Some(raw), None).await?;
        }
        Ok(())
    }

    /// Replaces login `session_id`'s refresh token `jti` by a new one (returned), valid until
    /// `exp`, if the login is of credentials stamp `stamp` (the user's now).
    pub async fn rotate(
        &self,
        session_id: &str,
        jti: &str,
        exp: i64,
        stamp: &str,
    ) -> Result<Result<String, Refused>, StoreError> {
        let next = random_id();
        {
            let mut memory = self.memory.lock();
            if let Some(l) = memory.get_mut(session_id) {
                if l.stamp != stamp {
                    return Ok(Err(Refused::Unknown));
                }
                if l.jti != jti {
                    memory.remove(session_id);
                    return Ok(Err(Refused::Reused));
                }
                l.jti = next.clone();
                l.exp = exp;
                return Ok(Ok(next));
            }
        }
        let Some((raw, login)) = self.stored(session_id)?.filter(|(_, l)| l.live() && l.stamp == stamp) else {
            return Ok(Err(Refused::Unknown));
        };
        if login.jti != jti {
            self.end(session_id).await?;
            return Ok(Err(Refused::Reused));
        }
        let rotated = Login { jti: next.clone(), exp, stamp: login.stamp };
        if self.swap(session_id, Some(raw), Some(&rotated)).await? {
            return Ok(Ok(next));
        }
        // Changed since it was read: refreshed with the same token elsewhere, or ended.
        self.end(session_id).await?;
        Ok(Err(Refused::Reused))
    }

    /// Ends login `session_id`.
    pub async fn end(&self, session_id: &str) -> Result<(), StoreError> {
        self.memory.lock().remove(session_id);
        for _ in 0..SWAP_TRIES {
            let Some(raw) = self.store.setting(&key(session_id))? else { return Ok(()) };
            if self.swap(session_id, Some(raw), None).await? {
                return Ok(());
            }
        }
        Err(StoreError::Overloaded)
    }

    /// Ends every login (the signing secret changed).
    pub async fn end_all(&self) -> Result<(), StoreError> {
        self.memory.lock().clear();
        for (k, _) in self.store.settings_prefix(PREFIX)? {
            self.end(&k[PREFIX.len()..]).await?;
        }
        Ok(())
    }
}
