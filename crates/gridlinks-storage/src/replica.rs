//! Shared entities: the rows of the entity keyspaces (devices and their indexes, profiles,
//! documents, credentials, attributes, broker rows) kept for every node in a [`Replica`]
//! (PostgreSQL, `cluster.entities = "postgres"`), each node holding a full copy in its own
//! store so that authentication, ACL checks and reads cost no network round trip.
//!
//! **State, not operations, is replicated.** A node runs a write's checks against its copy
//! and ships the rows the write changed; other nodes copy the rows. Nodes of different
//! versions (a rolling upgrade) therefore agree as long as the row encoding is the same,
//! which the on-disk format already requires.
//!
//! **One writer at a time, cluster-wide.** Before a write that changes shared rows the writer
//! takes the replica's lock ([`Replica::lock`]) and applies what other nodes changed since
//! its version `seen`: its checks (a name or token taken, a gateway's device count) see
//! every committed change. It then publishes its rows ([`Replica::publish`], which ends the
//! lock) and only after that commits them locally, with the new version, in one batch. A
//! publish that fails leaves nothing behind; a node that dies between publish and local
//! commit gets its own rows back from the replica at the next catch-up. Versions are
//! given under the lock, so they grow in commit order and a reader that has applied every
//! version up to `seen` has missed nothing.
//!
//! Rows other nodes change reach a node at its next write or at its next
//! [`crate::WriteOp::CatchUp`] (sent on a timer by the server).

use fjall::{Keyspace, UserKey, UserValue};

use crate::{Engine, Store, StoreError};

/// `meta` key of the last replica version applied to this store (u64 BE).
pub(crate) const SEEN_KEY: &str = "replica_seen";

/// The shared keyspaces, by their number in a [`Row`]. The numbers are part of the
/// replica's format: never reuse or reorder them.
pub(crate) const SHARED: [&str; 11] = [
    "devices",
    "names",
    "gateways",
    "tokens",
    "identities",
    "profiles",
    "docs",
    "basic",
    "attrs",
    "broker",
    "settings",
];

/// One row of a shared keyspace as a write left it: `value` `None` when it was removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Which keyspace (an index into the shared keyspaces' list).
    pub space: i16,
    /// The row's key.
    pub key: Vec<u8>,
    /// Its value; `None`: removed.
    pub value: Option<Vec<u8>>,
}

/// Where shared rows are kept for every node: an ordered, versioned set of rows.
pub trait Replica: Send + 'static {
    /// Takes the cluster's write lock (held until [`Replica::publish`] or
    /// [`Replica::release`]) and returns the rows changed after version `seen`, with the
    /// version they bring a node to.
    fn lock(&mut self, seen: u64) -> Result<(Vec<Row>, u64), StoreError>;
    /// Stores `rows` under the lock taken by [`Replica::lock`] and ends it; the version
    /// after them.
    fn publish(&mut self, rows: &[Row]) -> Result<u64, StoreError>;
    /// Ends the lock without a change (nothing happens without one).
    fn release(&mut self);
    /// The rows changed after version `seen` and the version they bring a node to, without
    /// the lock.
    fn changes(&mut self, seen: u64) -> Result<(Vec<Row>, u64), StoreError>;
}

/// A store's replica and how far the store has followed it.
pub(crate) struct Follower {
    replica: Box<dyn Replica>,
    /// The last version applied to the store.
    seen: u64,
    /// The lock is held (between `lock` and `publish`/`release`).
    locked: bool,
}

// A bit each in `Store::apply`'s mask of changed keyspaces.
const _: () = assert!(SHARED.len() <= 32);

/// The number of a shared keyspace (`None`: the node's own, e.g. `ts`, `meta`).
fn space_of(ks: &Keyspace) -> Option<i16> {
    space_of_name(ks.name())
}

fn space_of_name(name: &str) -> Option<i16> {
    SHARED.iter().position(|s| *s == name).and_then(|i| i16::try_from(i).ok())
}

fn keyspace(engine: &Engine, space: i16) -> Result<&Keyspace, StoreError> {
    let ks = &engine.ks;
    Ok(match usize::try_from(space).ok().and_then(|i| SHARED.get(i)).copied() {
        Some("devices") => &ks.devices,
        Some("names") => &ks.names,
        Some("gateways") => &ks.gateways,
        Some("tokens") => &ks.tokens,
        Some("identities") => &ks.identities,
        Some("profiles") => &ks.profiles,
        Some("docs") => &ks.docs,
        Some("basic") => &ks.basic,
        Some("attrs") => &ks.attrs,
        Some("broker") => &ks.broker,
        Some("settings") => &ks.settings,
        _ => return Err(StoreError::Corrupt("replica row of an unknown keyspace")),
    })
}

/// A write batch that records the shared rows it changes, so they can be published
/// before the batch is committed ([`Batch::commit`]).
pub(crate) struct Batch {
    inner: fjall::OwnedWriteBatch,
    meta: Keyspace,
    rows: Vec<Row>,
}

impl Batch {
    pub fn new(engine: &Engine) -> Self {
        Self { inner: engine.db.batch(), meta: engine.ks.meta.clone(), rows: Vec::new() }
    }

    pub fn insert<K: Into<UserKey>, V: Into<UserValue>>(&mut self, ks: &Keyspace, key: K, value: V) {
        let (key, value) = (key.into(), value.into());
        if let Some(space) = space_of(ks) {
            self.rows.push(Row { space, key: key.to_vec(), value: Some(value.to_vec()) });
        }
        self.inner.insert(ks, key, value);
    }

    pub fn remove<K: Into<UserKey>>(&mut self, ks: &Keyspace, key: K) {
        let key = key.into();
        if let Some(space) = space_of(ks) {
            self.rows.push(Row { space, key: key.to_vec(), value: None });
        }
        self.inner.remove(ks, key);
    }

    /// Publishes the shared rows under the lock the writer took ([`Store::replica_begin`])
    /// and then commits the batch with the new version; without a replica, or without
    /// shared rows, commits it.
    pub fn commit(mut self, store: &Store) -> Result<(), StoreError> {
        let mut follower = store.inner.follower.lock();
        let Some(f) = follower.as_mut().filter(|_| !self.rows.is_empty()) else {
            return Ok(self.inner.commit()?);
        };
        if !f.locked {
            return Err(StoreError::Corrupt("shared rows written without the replica's lock"));
        }
        f.locked = false;
        let version = f.replica.publish(&self.rows)?;
        self.inner.insert(&self.meta, SEEN_KEY, version.to_be_bytes().to_vec());
        self.inner.commit()?;
        f.seen = version;
        Ok(())
    }
}

impl Store {
    /// Makes this store follow `replica` (from the version it last applied). Only before
    /// its writer starts.
    pub fn attach_replica(&self, replica: Box<dyn Replica>) -> Result<(), StoreError> {
        let seen = match self.engine()?.ks.meta.get(SEEN_KEY)? {
            Some(v) => <[u8; 8]>::try_from(&*v).map(u64::from_be_bytes).map_err(|_| StoreError::Corrupt("seen"))?,
            None => 0,
        };
        *self.inner.follower.lock() = Some(Follower { replica, seen, locked: false });
        Ok(())
    }

    /// Whether the store follows a replica.
    pub fn replicated(&self) -> bool {
        self.inner.follower.lock().is_some()
    }

    /// Takes the replica's lock, if there is a replica and the lock is not held, and
    /// applies what other nodes changed; whether anything was applied.
    pub(crate) fn replica_begin(&self) -> Result<bool, StoreError> {
        let mut follower = self.inner.follower.lock();
        let Some(f) = follower.as_mut().filter(|f| !f.locked) else { return Ok(false) };
        let (rows, version) = f.replica.lock(f.seen)?;
        f.locked = true;
        let applied = self.apply(&rows, version, f.seen);
        if applied.is_err() {
            f.replica.release();
            f.locked = false;
        }
        if let Ok(true) = applied {
            f.seen = version;
        }
        applied
    }

    /// Ends the lock if a write took it and published nothing.
    pub(crate) fn replica_release(&self) {
        if let Some(f) = self.inner.follower.lock().as_mut().filter(|f| f.locked) {
            f.replica.release();
            f.locked = false;
        }
    }

    /// Applies what other nodes changed, without the lock; whether anything was applied.
    pub(crate) fn replica_catch_up(&self) -> Result<bool, StoreError> {
        let mut follower = self.inner.follower.lock();
        let Some(f) = follower.as_mut() else { return Ok(false) };
        let (rows, version) = f.replica.changes(f.seen)?;
        let applied = self.apply(&rows, version, f.seen)?;
        if applied {
            f.seen = version;
        }
        Ok(applied)
    }

    /// Writes rows another node changed, and `version` as the one seen, in one commit;
    /// readers' caches of tokens and profiles are dropped. Whether there was anything.
    fn apply(&self, rows: &[Row], version: u64, seen: u64) -> Result<bool, StoreError> {
        if version <= seen {
            return Ok(false);
        }
        let engine = self.engine()?;
        let mut batch = engine.db.batch();
        let mut spaces = 0u32;
        for r in rows {
            let ks = keyspace(&engine, r.space)?;
            spaces |= 1 << r.space;
            match &r.value {
                Some(v) => batch.insert(ks, r.key.clone(), v.clone()),
                None => batch.remove(ks, r.key.clone()),
            }
        }
        batch.insert(&engine.ks.meta, SEEN_KEY, version.to_be_bytes().to_vec());
        // Only rows of devices drop the caches of device records and tokens, and only
        // profile rows the profiles' (other shared rows, such as attributes and documents,
        // change often: rule states, activity).
        let mask = |names: &[&str]| names.iter().filter_map(|n| space_of_name(n)).fold(0u32, |m, i| m | 1 << i);
        let devices =
            spaces & mask(&["devices", "names", "gateways", "tokens", "identities", "basic", "profiles"]) != 0;
        let commit = || {
            if !devices {
                return Ok(batch.commit()?);
            }
            let tokens = &self.inner.tokens;
            let mut map = tokens.map.write();
            batch.commit()?;
            map.clear();
            tokens.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            Ok(())
        };
        // Profiles' lock, then the tokens' (the order a device transaction's commit takes).
        if spaces & mask(&["profiles"]) != 0 {
            self.change_profiles(commit)?;
        } else {
            commit()?;
        }
        for (i, g) in self.inner.remote_generations.iter().enumerate() {
            if spaces & (1 << i) != 0 {
                g.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        }
        Ok(true)
    }

    /// How many times other nodes' rows changed shared keyspace `name` (`docs`, `broker`,
    /// …): a node's cache of a keyspace (users and API keys) reloads when it
    /// changes. Always 0 for a name that is not shared, and without a replica.
    pub fn remote_generation(&self, name: &str) -> u64 {
        space_of_name(name)
            .and_then(|i| self.inner.remote_generations.get(usize::try_from(i).ok()?))
            .map_or(0, |g| g.load(std::sync::atomic::Ordering::Acquire))
    }
}
