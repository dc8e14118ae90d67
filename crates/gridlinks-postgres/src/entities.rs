//! Shared entities in PostgreSQL (`cluster.entities = "postgres"`): the replica of the
//! storage crate's shared rows ([`gridlinks_storage::replica`]).
//!
//! | table | key | holds |
//! |---|---|---|
//! | `gl_entity` | (space, key) | each shared row's latest value (`NULL`: removed) and the version that wrote it |
//! | `gl_entity_head` | one row | the last version given |
//!
//! The cluster's write lock is a transaction-scoped advisory lock: a node takes it, reads
//! the rows of versions after its own, writes its rows under the next version and commits,
//! which releases it. Versions are therefore given in commit order, and a node that has
//! read every row up to version N has missed no change at or below N. Removed rows stay as
//! `NULL` rows so that other nodes learn of the removal.

use gridlinks_storage::replica::{Replica, Row};
use gridlinks_storage::StoreError;
use postgres::{Client, NoTls};

use crate::db;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS gl_entity (
    space smallint NOT NULL, key bytea NOT NULL, value bytea, version bigint NOT NULL,
    PRIMARY KEY (space, key)
);
CREATE INDEX IF NOT EXISTS gl_entity_by_version ON gl_entity (version);
CREATE TABLE IF NOT EXISTS gl_entity_head (one boolean PRIMARY KEY DEFAULT true CHECK (one), version bigint NOT NULL);
INSERT INTO gl_entity_head (version) VALUES (0) ON CONFLICT DO NOTHING;";

/// The advisory lock's key: `hashtext('gridlinks.entities')` spelled out, so that every
/// node locks the same one.
const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('gridlinks.entities'))";

/// The replica on one dedicated connection (a lock is held across calls), made again after
/// it broke.
pub struct PgReplica {
    config: Result<postgres::Config, String>,
    client: Option<Client>,
}

impl PgReplica {
    /// Connects to `url` and makes the tables if they are missing.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let mut r = Self { config: crate::config(url), client: None };
        r.client()?.batch_execute(SCHEMA).map_err(db)?;
        Ok(r)
    }

    fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let config = self.config.as_ref().map_err(|e| StoreError::Database(format!("postgresql: {e}")))?;
            self.client = Some(config.connect(NoTls).map_err(db)?);
        }
        self.client.as_mut().ok_or(StoreError::Database("postgresql: no connection".into()))
    }

    /// Runs `f`; on failure the transaction is rolled back (or the broken connection
    /// dropped).
    fn run<T>(&mut self, f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>) -> Result<T, StoreError> {
        let c = self.client()?;
        let out = f(c);
        if out.is_err() && c.batch_execute("ROLLBACK").is_err() {
            self.client = None;
        }
        out.map_err(db)
    }

    /// [`PgReplica::run`], once more on a new connection if the one it used had broken (the
    /// server restarted since): for `f` that start from nothing.
    fn retried<T>(&mut self, f: impl Fn(&mut Client) -> Result<T, postgres::Error>) -> Result<T, StoreError> {
        match self.run(&f) {
            Err(_) if self.client.is_none() => self.run(f),
            out => out,
        }
    }
}

impl Drop for PgReplica {
    fn drop(&mut self) {
        crate::close(self.client.take().into_iter().collect());
    }
}

/// The rows of versions after `seen` and the highest version among them (`seen` if none).
fn since(c: &mut Client, seen: u64) -> Result<(Vec<Row>, u64), postgres::Error> {
    let seen = i64::try_from(seen).unwrap_or(i64::MAX);
    let mut version = seen;
    let mut rows = Vec::new();
    for r in
        c.query("SELECT space, key, value, version FROM gl_entity WHERE version > $1 ORDER BY version", &[&seen])?
    {
        version = version.max(r.try_get(3)?);
        rows.push(Row { space: r.try_get(0)?, key: r.try_get(1)?, value: r.try_get(2)? });
    }
    Ok((rows, u64::try_from(version).unwrap_or(0)))
}

impl Replica for PgReplica {
    fn lock(&mut self, seen: u64) -> Result<(Vec<Row>, u64), StoreError> {
        self.retried(|c| {
            c.batch_execute(&format!("BEGIN; {LOCK}"))?;
            since(c, seen)
        })
    }

    fn publish(&mut self, rows: &[Row]) -> Result<u64, StoreError> {
        // A batch may write a key twice (removed, then written again): the last one counts.
        let mut last: Vec<&Row> = Vec::with_capacity(rows.len());
        let mut at = std::collections::HashMap::new();
        for r in rows {
            match at.get(&(r.space, &r.key)) {
                Some(&i) => last[i] = r,
                None => {
                    at.insert((r.space, &r.key), last.len());
                    last.push(r);
                }
            }
        }
        let spaces: Vec<i16> = last.iter().map(|r| r.space).collect();
        let keys: Vec<&[u8]> = last.iter().map(|r| r.key.as_slice()).collect();
        let values: Vec<Option<&[u8]>> = last.iter().map(|r| r.value.as_deref()).collect();
        self.run(|c| {
            let version: i64 =
                c.query_one("UPDATE gl_entity_head SET version = version + 1 RETURNING version", &[])?.try_get(0)?;
            c.execute(
                "INSERT INTO gl_entity (space, key, value, version) \
                 SELECT s, k, v, $4 FROM unnest($1::smallint[], $2::bytea[], $3::bytea[]) AS u(s, k, v) \
                 ON CONFLICT (space, key) DO UPDATE SET value = excluded.value, version = excluded.version",
                &[&spaces, &keys, &values, &version],
            )?;
            c.batch_execute("COMMIT")?;
            Ok(u64::try_from(version).unwrap_or(0))
        })
    }

    fn release(&mut self) {
        if self.client.as_mut().is_some_and(|c| c.batch_execute("ROLLBACK").is_err()) {
            self.client = None;
        }
    }

    fn changes(&mut self, seen: u64) -> Result<(Vec<Row>, u64), StoreError> {
        self.retried(|c| since(c, seen))
    }
}
