//! PostgreSQL as GridLinks' shared time-series store, for clusters smaller than the ones
//! Cassandra is for: the schema (partitioned by month), idempotent batch writes, deletes,
//! and the REST queries (latest, history, aggregation) in SQL, behind the storage crate's
//! [`Timeseries`] seam, giving its conformance suite's answers. Also the replica of the
//! shared entities ([`PgReplica`], module `entities`).
//!
//! Schema (ThingsBoard's `ts_kv` / `ts_kv_latest` shape, one typed column per value type):
//!
//! | table | key | holds |
//! |---|---|---|
//! | `gl_ts_kv` | (device, key, ts) | every point; `PARTITION BY RANGE (ts)`, one partition per month made on demand, `gl_ts_kv_default` for the rest |
//! | `gl_ts_kv_latest` | (device, key) | the newest point of each key |
//!
//! A write is one transaction: the points are upserted (a point written twice, as after a
//! redelivery from Kafka, is stored once) and each key's latest value is replaced only by
//! a point at least as new. Months are given their partition when first written, for
//! months from [`PAST_MONTHS`] back to [`FUTURE_MONTHS`] ahead; points outside that go to
//! the default partition, so a device sending odd timestamps cannot make thousands of
//! tables.
//!
//! Connections come from a small pool ([`Pool`]); one that fails is dropped and a new one
//! made on next use, so the store recovers by itself once the server is back. Any failure
//! of the database is [`StoreError::Database`] (HTTP 503, retried by the storage writers).

use std::collections::{BTreeMap, HashMap, HashSet};

use gridlinks_storage::query::{self, Acc, Agg, HistoryQuery, KeySeries, Order};
use gridlinks_storage::timeseries::Shared;
use gridlinks_storage::timeseries::{month_of, month_start};
use gridlinks_storage::{DeleteTelemetry, StoreError, Timeseries};
use gridlinks_types::{DeviceId, Ts, TsRecord, Value};
use parking_lot::{Condvar, Mutex};
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Transaction};

mod entities;
pub use entities::PgReplica;

/// How long making a connection may take, unless the URL says otherwise.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long one statement may run, unless the URL sets `options`: a server that hangs
/// (or a query that would run for minutes) fails the request with 503 instead of holding a
/// pooled connection and a storage writer forever.
pub const STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Months back from now that get their own partition when written.
pub const PAST_MONTHS: i64 = 36;
/// Months ahead of now that get their own partition when written.
pub const FUTURE_MONTHS: i64 = 2;

fn db(e: postgres::Error) -> StoreError {
    StoreError::Database(format!("postgresql: {e}"))
}

/// The connection settings of `url`, with [`CONNECT_TIMEOUT`] and [`STATEMENT_TIMEOUT`]
/// unless it sets them. The error names no part of the URL (it holds the password).
fn config(url: &str) -> Result<postgres::Config, String> {
    let mut c = url.parse::<postgres::Config>().map_err(|_| "the connection URL does not parse".to_owned())?;
    if c.get_connect_timeout().is_none() {
        c.connect_timeout(CONNECT_TIMEOUT);
    }
    if c.get_options().is_none() {
        c.options(&format!("-c statement_timeout={}", STATEMENT_TIMEOUT.as_millis()));
    }
    Ok(c)
}

/// A bounded pool of connections to one database.
pub struct Pool {
    config: Result<postgres::Config, String>,
    size: usize,
    idle: Mutex<(Vec<Client>, usize)>,
    freed: Condvar,
}

/// Closes blocking clients. Each closes its connection on a runtime of its own, which
/// must not start on a thread of an async runtime (a node shutting down, or failing to
/// start, drops them there): off such a thread first.
fn close(clients: Vec<Client>) {
    let in_runtime = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if in_runtime {
        tokio::task::block_in_place(move || drop(clients));
    } else {
        drop(clients);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        close(std::mem::take(&mut self.idle.get_mut().0));
    }
}

impl Pool {
    /// A pool of at most `size` connections to `url` (made when first needed; a server
    /// that does not answer fails a connection after [`CONNECT_TIMEOUT`] unless the URL
    /// sets `connect_timeout`, and a statement after [`STATEMENT_TIMEOUT`] unless it sets
    /// `options`).
    pub fn new(url: &str, size: usize) -> Self {
        Self { config: config(url), size: size.max(1), idle: Mutex::new((Vec::new(), 0)), freed: Condvar::new() }
    }

    /// Runs `f` on a connection: an idle one, a new one while fewer than `size` are open,
    /// or the next one given back. A connection `f` left broken is dropped.
    pub fn with<T>(&self, f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>) -> Result<T, StoreError> {
        let idle = {
            let mut g = self.idle.lock();
            loop {
                if let Some(c) = g.0.pop() {
                    break Some(c);
                }
                if g.1 < self.size {
                    g.1 += 1;
                    break None;
                }
                self.freed.wait(&mut g);
            }
        };
        let made = match (idle, &self.config) {
            (Some(c), _) => Ok(c),
            (None, Ok(config)) => config.connect(NoTls).map_err(db),
            (None, Err(e)) => Err(StoreError::Database(format!("postgresql: {e}"))),
        };
        let mut c = match made {
            Ok(c) => c,
            Err(e) => {
                self.give_back(None);
                return Err(e);
            }
        };
        let out = f(&mut c);
        self.give_back((!c.is_closed()).then_some(c));
        out.map_err(db)
    }

    fn give_back(&self, c: Option<Client>) {
        let mut g = self.idle.lock();
        match c {
            Some(c) => g.0.push(c),
            None => g.1 -= 1,
        }
        self.freed.notify_one();
    }
}

/// The time series in PostgreSQL.
pub struct PgTimeseries {
    pool: Pool,
    /// Months (as `year * 12 + month - 1`) known to have their partition.
    months: Mutex<HashSet<i64>>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS gl_ts_kv (
    device uuid NOT NULL, key text NOT NULL, ts bigint NOT NULL,
    bool_v boolean, long_v bigint, dbl_v double precision, str_v text, json_v text,
    PRIMARY KEY (device, key, ts)
) PARTITION BY RANGE (ts);
CREATE TABLE IF NOT EXISTS gl_ts_kv_default PARTITION OF gl_ts_kv DEFAULT;
CREATE TABLE IF NOT EXISTS gl_ts_kv_latest (
    device uuid NOT NULL, key text NOT NULL, ts bigint NOT NULL,
    bool_v boolean, long_v bigint, dbl_v double precision, str_v text, json_v text,
    PRIMARY KEY (device, key)
);";

/// A value as its five typed columns.
type Columns = (Option<bool>, Option<i64>, Option<f64>, Option<String>, Option<String>);

fn columns(v: &Value) -> Columns {
    match v {
        Value::Bool(b) => (Some(*b), None, None, None, None),
        Value::Long(l) => (None, Some(*l), None, None, None),
        Value::Double(d) => (None, None, Some(*d), None, None),
        Value::Str(s) => (None, None, None, Some(s.clone()), None),
        Value::Json(j) => (None, None, None, None, Some(j.clone())),
    }
}

/// The value of a row's typed columns, from column `at` on.
fn value(row: &Row, at: usize) -> Result<Value, postgres::Error> {
    Ok(if let Some(b) = row.try_get::<_, Option<bool>>(at)? {
        Value::Bool(b)
    } else if let Some(l) = row.try_get::<_, Option<i64>>(at + 1)? {
        Value::Long(l)
    } else if let Some(d) = row.try_get::<_, Option<f64>>(at + 2)? {
        Value::Double(d)
    } else if let Some(s) = row.try_get::<_, Option<String>>(at + 3)? {
        Value::Str(s)
    } else {
        Value::Json(row.try_get::<_, Option<String>>(at + 4)?.unwrap_or_default())
    })
}

impl PgTimeseries {
    /// Connects to `url` with at most `pool_size` connections and makes the schema if it
    /// is missing.
    pub fn open(url: &str, pool_size: usize) -> Result<Self, StoreError> {
        let pool = Pool::new(url, pool_size);
        pool.with(|c| c.batch_execute(SCHEMA))?;
        Ok(Self { pool, months: Mutex::new(HashSet::new()) })
    }

    /// Makes the partitions the months of `records` need (within the window).
    fn partitions(
        &self,
        tx: &mut Transaction<'_>,
        months: impl IntoIterator<Item = i64>,
    ) -> Result<(), postgres::Error> {
        let now = month_of(Ts::now().0);
        for m in months {
            if m < now - PAST_MONTHS || m > now + FUTURE_MONTHS || self.months.lock().contains(&m) {
                continue;
            }
            let (y, mo) = (m.div_euclid(12), m.rem_euclid(12) + 1);
            let sql = format!(
                "CREATE TABLE IF NOT EXISTS gl_ts_kv_{y:04}_{mo:02} PARTITION OF gl_ts_kv FOR VALUES FROM ({}) TO ({})",
                month_start(m),
                month_start(m + 1)
            );
            // A month whose rows already sit in the default partition keeps them there.
            tx.batch_execute("SAVEPOINT part")?;
            match tx.batch_execute(&sql) {
                Ok(()) => tx.batch_execute("RELEASE SAVEPOINT part")?,
                Err(e) => {
                    tracing::warn!(error = %e, month = format!("{y:04}-{mo:02}"), "partition not made; the month's points go to the default partition");
                    tx.batch_execute("ROLLBACK TO SAVEPOINT part")?;
                }
            }
            self.months.lock().insert(m);
        }
        Ok(())
    }

    fn raw(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        let order = if q.order == Order::Desc { "DESC" } else { "ASC" };
        let sql = format!(
            "SELECT ts, bool_v, long_v, dbl_v, str_v, json_v FROM gl_ts_kv
             WHERE device = $1 AND key = $2 AND ts >= $3 AND ts < $4 ORDER BY ts {order} LIMIT $5"
        );
        let limit = i64::try_from(q.limit).unwrap_or(i64::MAX);
        self.pool.with(|c| {
            let stmt = c.prepare(&sql)?;
            let mut out = Vec::new();
            for key in &q.keys {
                let rows = c.query(&stmt, &[&device.0, key, &q.start.0, &q.end.0, &limit])?;
                let points = rows
                    .iter()
                    .map(|r| Ok((Ts(r.try_get(0)?), value(r, 1)?)))
                    .collect::<Result<Vec<_>, postgres::Error>>()?;
                if !points.is_empty() {
                    out.push((key.clone(), points));
                }
            }
            Ok(out)
        })
    }

    fn aggregate(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        query::check_intervals(q)?;
        // Per interval, what `Acc` holds: the double sum added in time order (as the
        // embedded store adds), the long sum exactly (numeric: an overflow shows as text
        // that is no i64).
        let sql = "SELECT (ts - $3) / $5 AS i, count(*),
                          count(long_v) + count(dbl_v), count(dbl_v) = 0,
                          sum(coalesce(dbl_v, long_v::float8) ORDER BY ts), sum(long_v)::text,
                          min(coalesce(dbl_v, long_v::float8)), max(coalesce(dbl_v, long_v::float8))
                   FROM gl_ts_kv WHERE device = $1 AND key = $2 AND ts >= $3 AND ts < $4
                   GROUP BY i";
        self.pool.with(|c| {
            let stmt = c.prepare(sql)?;
            let mut out = Vec::new();
            for key in &q.keys {
                let rows = c.query(&stmt, &[&device.0, key, &q.start.0, &q.end.0, &q.interval])?;
                let mut buckets = Vec::with_capacity(rows.len());
                for r in rows {
                    let long_sum: Option<String> = r.try_get(5)?;
                    let acc = Acc {
                        count: r.try_get(1)?,
                        numbers: r.try_get(2)?,
                        all_long: r.try_get(3)?,
                        sum: r.try_get::<_, Option<f64>>(4)?.unwrap_or(0.0),
                        long_sum: long_sum.map_or(Some(0), |s| s.parse().ok()),
                        min: r.try_get(6)?,
                        max: r.try_get(7)?,
                    };
                    buckets.push((r.try_get::<_, i64>(0)?, acc));
                }
                let points = query::intervals(q, buckets);
                if !points.is_empty() {
                    out.push((key.clone(), points));
                }
            }
            Ok(out)
        })
    }
}

/// Points as the eight column arrays `unnest` takes.
struct Rows {
    devices: Vec<uuid::Uuid>,
    keys: Vec<String>,
    ts: Vec<i64>,
    bools: Vec<Option<bool>>,
    longs: Vec<Option<i64>>,
    doubles: Vec<Option<f64>>,
    strs: Vec<Option<String>>,
    jsons: Vec<Option<String>>,
}

impl Rows {
    fn of<'a>(points: impl Iterator<Item = (uuid::Uuid, &'a str, i64, &'a Value)>) -> Self {
        let mut r = Rows {
            devices: Vec::new(),
            keys: Vec::new(),
            ts: Vec::new(),
            bools: Vec::new(),
            longs: Vec::new(),
            doubles: Vec::new(),
            strs: Vec::new(),
            jsons: Vec::new(),
        };
        for (d, k, ts, v) in points {
            let (b, l, f, s, j) = columns(v);
            r.devices.push(d);
            r.keys.push(k.to_owned());
            r.ts.push(ts);
            r.bools.push(b);
            r.longs.push(l);
            r.doubles.push(f);
            r.strs.push(s);
            r.jsons.push(j);
        }
        r
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [&self.devices, &self.keys, &self.ts, &self.bools, &self.longs, &self.doubles, &self.strs, &self.jsons]
    }
}

impl Timeseries for PgTimeseries {
    fn latest(&self, device: DeviceId, keys: Option<&[String]>) -> Result<Vec<(String, Ts, Value)>, StoreError> {
        let mut out = self.pool.with(|c| {
            let rows = match keys {
                Some(k) => c.query(
                    "SELECT key, ts, bool_v, long_v, dbl_v, str_v, json_v FROM gl_ts_kv_latest
                     WHERE device = $1 AND key = ANY($2)",
                    &[&device.0, &k],
                )?,
                None => c.query(
                    "SELECT key, ts, bool_v, long_v, dbl_v, str_v, json_v FROM gl_ts_kv_latest WHERE device = $1",
                    &[&device.0],
                )?,
            };
            rows.iter().map(|r| Ok((r.try_get(0)?, Ts(r.try_get(1)?), value(r, 2)?))).collect::<Result<Vec<_>, _>>()
        })?;
        // By key as bytes, as the embedded store sorts (not by the database's collation).
        out.sort_by(|a: &(String, Ts, Value), b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn history(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        if q.keys.is_empty() || q.end <= q.start || q.limit == 0 {
            return Ok(Vec::new());
        }
        if q.agg == Agg::None {
            self.raw(device, q)
        } else {
            self.aggregate(device, q)
        }
    }
}

impl Shared for PgTimeseries {
    fn name(&self) -> &'static str {
        "postgresql"
    }

    /// Whether the database answers (`SELECT 1` on a pooled connection).
    fn ping(&self) -> Result<(), StoreError> {
        self.pool.with(|c| c.batch_execute("SELECT 1"))
    }

    /// PostgreSQL's text cannot hold NUL (U+0000), which a JSON string value may carry.
    fn storable(&self, records: &[TsRecord]) -> Result<(), StoreError> {
        let nul = |t: &str| t.contains('\0');
        let bad = records.iter().flat_map(|r| &r.values).any(|(k, v)| {
            nul(k)
                || match v {
                    Value::Str(t) | Value::Json(t) => nul(t),
                    _ => false,
                }
        });
        if bad {
            Err(StoreError::Invalid("PostgreSQL text cannot hold NUL (U+0000): the points were not stored".into()))
        } else {
            Ok(())
        }
    }

    /// Stores the records of many devices in one transaction: each point once (the last
    /// of equal (device, key, ts) wins), each key's latest value moved forward only.
    fn write(&self, batch: &[(DeviceId, &[TsRecord])]) -> Result<(), StoreError> {
        let mut points: BTreeMap<(uuid::Uuid, &str, i64), &Value> = BTreeMap::new();
        for (device, records) in batch {
            for r in *records {
                for (k, v) in &r.values {
                    points.insert((device.0, k.as_str(), r.ts.0), v);
                }
            }
        }
        if points.is_empty() {
            return Ok(());
        }
        let mut latest: HashMap<(uuid::Uuid, &str), (i64, &Value)> = HashMap::new();
        for (&(d, k, ts), v) in &points {
            // In (device, key, ts) order: the last one seen is the newest.
            latest.insert((d, k), (ts, v));
        }
        let months: HashSet<i64> = points.keys().map(|p| month_of(p.2)).collect();
        let rows = Rows::of(points.iter().map(|(&(d, k, ts), v)| (d, k, ts, *v)));
        let newest = Rows::of(latest.iter().map(|(&(d, k), &(ts, v))| (d, k, ts, v)));
        self.pool.with(|c| {
            let mut tx = c.transaction()?;
            self.partitions(&mut tx, months.iter().copied())?;
            tx.execute(
                "INSERT INTO gl_ts_kv (device, key, ts, bool_v, long_v, dbl_v, str_v, json_v)
                 SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::boolean[], $5::bigint[],
                                      $6::float8[], $7::text[], $8::text[])
                 ON CONFLICT (device, key, ts) DO UPDATE SET bool_v = excluded.bool_v, long_v = excluded.long_v,
                     dbl_v = excluded.dbl_v, str_v = excluded.str_v, json_v = excluded.json_v",
                &rows.params(),
            )?;
            tx.execute(
                "INSERT INTO gl_ts_kv_latest (device, key, ts, bool_v, long_v, dbl_v, str_v, json_v)
                 SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::boolean[], $5::bigint[],
                                      $6::float8[], $7::text[], $8::text[])
                 ON CONFLICT (device, key) DO UPDATE SET ts = excluded.ts, bool_v = excluded.bool_v,
                     long_v = excluded.long_v, dbl_v = excluded.dbl_v, str_v = excluded.str_v, json_v = excluded.json_v
                 WHERE gl_ts_kv_latest.ts <= excluded.ts",
                &newest.params(),
            )?;
            tx.commit()
        })
    }

    /// Deletes points of some keys of a device (in a range, or all), and, if asked, their
    /// latest values in that range, promoting the newest remaining point if asked.
    fn delete(&self, d: &DeleteTelemetry) -> Result<(), StoreError> {
        let (start, end) = d.range.map_or((i64::MIN, i64::MAX), |(s, e)| (s.0, e.0));
        // The open-ended delete includes i64::MAX itself.
        let end_op = if d.range.is_some() { "<" } else { "<=" };
        self.pool.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute(
                &format!("DELETE FROM gl_ts_kv WHERE device = $1 AND key = ANY($2) AND ts >= $3 AND ts {end_op} $4"),
                &[&d.device.0, &d.keys, &start, &end],
            )?;
            if d.delete_latest {
                let gone = tx.query(
                    &format!(
                        "DELETE FROM gl_ts_kv_latest WHERE device = $1 AND key = ANY($2) AND ts >= $3 AND ts {end_op} $4
                         RETURNING key"
                    ),
                    &[&d.device.0, &d.keys, &start, &end],
                )?;
                if d.rewrite_latest {
                    for row in gone {
                        let key: String = row.try_get(0)?;
                        tx.execute(
                            "INSERT INTO gl_ts_kv_latest (device, key, ts, bool_v, long_v, dbl_v, str_v, json_v)
                             SELECT device, key, ts, bool_v, long_v, dbl_v, str_v, json_v FROM gl_ts_kv
                             WHERE device = $1 AND key = $2 ORDER BY ts DESC LIMIT 1",
                            &[&d.device.0, &key],
                        )?;
                    }
                }
            }
            tx.commit()
        })
    }
}
