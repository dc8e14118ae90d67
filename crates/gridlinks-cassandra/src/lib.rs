//! Cassandra as GridLinks' shared time-series store, for the largest clusters: the schema
//! (a partition per device, key and month; TTL), idempotent writes, deletes, and the REST
//! queries (latest, history, aggregation), behind the storage crate's [`Shared`] seam,
//! giving its conformance suite's answers.
//!
//! Schema (ThingsBoard's `ts_kv_cf` / `ts_kv_partitions_cf` / `ts_kv_latest_cf` shape):
//!
//! | table | primary key | holds |
//! |---|---|---|
//! | `gl_ts_kv` | ((device, key, month), ts) | every point, with the TTL of `ttl_days` |
//! | `gl_ts_kv_partitions` | ((device, key), month) | the months a key has points in, so a read visits only those |
//! | `gl_ts_kv_latest` | ((device), key) | the newest point of each key |
//!
//! A value is a type tag (`vtype`) and one typed column; the other columns are left unset,
//! never written as null: a null is a tombstone in Cassandra, and reads over many of them
//! slow down and at last fail. A point written again with another type keeps the old
//! column, which the tag makes stale.
//!
//! Writes are per partition (no multi-partition batches), many in flight, routed by token
//! to a replica (prepared statements, the driver's token-aware policy), at `LOCAL_QUORUM`.
//! A write is idempotent (a redelivered batch stores each point once). The latest values
//! of a device are read before they are replaced, and replaced (in one unlogged batch:
//! they share the device's partition) only by points at least as new;
//! the storage writers write each device from one Kafka partition at a time, so two writes
//! of one device do not race.
//!
//! The driver runs on a small runtime of its own; the store's calls block on it (they are
//! made from blocking threads, as the PostgreSQL store's are). Any failure is
//! [`StoreError::Database`] (HTTP 503, retried by the storage writers); the driver
//! reconnects by itself.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use futures_util::future::Either;
use futures_util::{stream, StreamExt, TryStreamExt};
use gridlinks_storage::query::{self, Acc, Agg, HistoryQuery, KeySeries, Order};
use gridlinks_storage::timeseries::{month_of, Shared};
use gridlinks_storage::{DeleteTelemetry, StoreError, Timeseries};
use gridlinks_types::{DeviceId, Ts, TsRecord, Value};
use parking_lot::Mutex;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::MaybeUnset;
use uuid::Uuid;

/// How long making a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one request may take (retries included) before it fails with 503.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes in flight at once from one call.
const IN_FLIGHT: usize = 256;

/// (device, key, month) partitions known to be listed in `gl_ts_kv_partitions`; the set is
/// emptied when it reaches this size (a partition then listed again costs one write).
const KNOWN_PARTITIONS: usize = 200_000;

/// Where and how.
#[derive(Clone, Debug)]
pub struct CassandraSettings {
    /// Contact points, `host:port`.
    pub contact_points: Vec<String>,
    /// Keyspace, made if missing (checked by the caller: letters, digits, `_`).
    pub keyspace: String,
    /// Replication factor of a new keyspace.
    pub replication_factor: u16,
    /// Days a point is kept; 0: forever.
    pub ttl_days: u32,
}

fn db(e: impl std::fmt::Display) -> StoreError {
    StoreError::Database(format!("cassandra: {e}"))
}

/// The statements, prepared once.
struct Statements {
    insert_point: PreparedStatement,
    insert_partition: PreparedStatement,
    insert_latest: PreparedStatement,
    latest_all: PreparedStatement,
    latest_of: PreparedStatement,
    latest_ts_of: PreparedStatement,
    months: PreparedStatement,
    points_asc: PreparedStatement,
    points_desc: PreparedStatement,
    delete_points: PreparedStatement,
    delete_latest: PreparedStatement,
}

/// The time series in Cassandra.
pub struct CassandraTimeseries {
    /// The driver's runtime, shut down when the store is dropped.
    rt: Option<tokio::runtime::Runtime>,
    /// What the store's calls block on.
    handle: tokio::runtime::Handle,
    session: Session,
    st: Statements,
    /// TTL of a point in seconds (0: none).
    ttl: i32,
    /// Partitions known to be listed in `gl_ts_kv_partitions` (at most [`KNOWN_PARTITIONS`]).
    known: Mutex<HashSet<(Uuid, String, i64)>>,
}

/// A point as read: `ts`, then [`VALUE_COLUMNS`].
type PointRow = (i64, i8, Option<bool>, Option<i64>, Option<f64>, Option<String>, Option<String>);
/// A latest value as read: `key, ts`, then [`VALUE_COLUMNS`].
type LatestRow = (String, i64, i8, Option<bool>, Option<i64>, Option<f64>, Option<String>, Option<String>);

/// A value as its tag and columns to bind (all but its own left unset).
type Bound<'a> = (i8, MaybeUnset<bool>, MaybeUnset<i64>, MaybeUnset<f64>, MaybeUnset<&'a str>, MaybeUnset<&'a str>);

fn bind(v: &Value) -> Bound<'_> {
    use MaybeUnset::{Set, Unset};
    match v {
        Value::Bool(b) => (0, Set(*b), Unset, Unset, Unset, Unset),
        Value::Long(l) => (1, Unset, Set(*l), Unset, Unset, Unset),
        Value::Double(d) => (2, Unset, Unset, Set(*d), Unset, Unset),
        Value::Str(s) => (3, Unset, Unset, Unset, Set(s.as_str()), Unset),
        Value::Json(j) => (4, Unset, Unset, Unset, Unset, Set(j.as_str())),
    }
}

/// The value of [`VALUE_COLUMNS`] as read.
fn value(
    tag: i8,
    b: Option<bool>,
    l: Option<i64>,
    d: Option<f64>,
    s: Option<String>,
    j: Option<String>,
) -> Result<Value, StoreError> {
    let missing = || db(format!("a row of type {tag} lacks its value"));
    Ok(match tag {
        0 => Value::Bool(b.ok_or_else(missing)?),
        1 => Value::Long(l.ok_or_else(missing)?),
        2 => Value::Double(d.ok_or_else(missing)?),
        3 => Value::Str(s.ok_or_else(missing)?),
        4 => Value::Json(j.ok_or_else(missing)?),
        _ => return Err(db(format!("unknown value type {tag}"))),
    })
}

/// The columns every point and latest read selects, after its leading ones.
const VALUE_COLUMNS: &str = "vtype, bool_v, long_v, dbl_v, str_v, json_v";

fn schema(ks: &str, rf: u16) -> Vec<String> {
    let values = "vtype tinyint, bool_v boolean, long_v bigint, dbl_v double, str_v text, json_v text";
    vec![
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = \
             {{'class': 'NetworkTopologyStrategy', 'replication_factor': {rf}}}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {ks}.gl_ts_kv (device uuid, key text, month bigint, ts bigint, {values}, \
             PRIMARY KEY ((device, key, month), ts)) WITH CLUSTERING ORDER BY (ts ASC)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {ks}.gl_ts_kv_partitions (device uuid, key text, month bigint, \
             PRIMARY KEY ((device, key), month))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {ks}.gl_ts_kv_latest (device uuid, key text, ts bigint, {values}, \
             PRIMARY KEY (device, key))"
        ),
    ]
}

impl CassandraTimeseries {
    /// Connects to the contact points and makes the keyspace and tables if missing.
    pub fn open(s: &CassandraSettings) -> Result<Self, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cassandra")
            .enable_all()
            .build()
            .map_err(db)?;
        let (session, st) = rt.block_on(connect(s))?;
        let ttl = i32::try_from(u64::from(s.ttl_days) * 86_400).unwrap_or(i32::MAX);
        Ok(Self { handle: rt.handle().clone(), rt: Some(rt), session, st, ttl, known: Mutex::new(HashSet::new()) })
    }

    fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }

    /// The months (ascending) in which `key` has points, within `[start, end)`.
    async fn months(&self, device: DeviceId, key: &str, start: i64, end: i64) -> Result<Vec<i64>, StoreError> {
        if end <= start {
            return Ok(Vec::new());
        }
        let (first, last) = (month_of(start), month_of(end - 1));
        let r = self.session.execute_unpaged(&self.st.months, (device.0, key, first, last)).await.map_err(db)?;
        let rows = r.into_rows_result().map_err(db)?;
        rows.rows::<(i64,)>().map_err(db)?.map(|m| m.map(|m| m.0).map_err(db)).collect()
    }

    /// Streams the points of `key` in `[start, end)`, in `order`, to `f`, until it returns
    /// false or `limit` points went by.
    async fn points(
        &self,
        device: DeviceId,
        key: &str,
        (start, end): (i64, i64),
        order: Order,
        limit: usize,
        mut f: impl FnMut(i64, Value) -> bool,
    ) -> Result<(), StoreError> {
        let mut months = self.months(device, key, start, end).await?;
        let stmt = if order == Order::Desc {
            months.reverse();
            &self.st.points_desc
        } else {
            &self.st.points_asc
        };
        let mut left = limit;
        for m in months {
            let cql_limit = i32::try_from(left).unwrap_or(i32::MAX);
            let pager = self.session.execute_iter(stmt.clone(), (device.0, key, m, start, end, cql_limit)).await;
            let mut rows = pager.map_err(db)?.rows_stream::<PointRow>().map_err(db)?;
            while let Some((ts, tag, b, l, d, s, j)) = rows.try_next().await.map_err(db)? {
                left -= 1;
                if !f(ts, value(tag, b, l, d, s, j)?) || left == 0 {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn raw(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        let mut out = Vec::new();
        for key in &q.keys {
            let mut points = Vec::new();
            self.points(device, key, (q.start.0, q.end.0), q.order, q.limit, |ts, v| {
                points.push((Ts(ts), v));
                true
            })
            .await?;
            if !points.is_empty() {
                out.push((key.clone(), points));
            }
        }
        Ok(out)
    }

    /// Aggregates in the node: every point of the range streamed once, in time order (the
    /// double sum added as the embedded store adds), into one [`Acc`] per interval.
    async fn aggregate(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        query::check_intervals(q)?;
        let mut out = Vec::new();
        for key in &q.keys {
            let mut buckets: BTreeMap<i64, Acc> = BTreeMap::new();
            self.points(device, key, (q.start.0, q.end.0), Order::Asc, usize::MAX, |ts, v| {
                buckets.entry((ts - q.start.0) / q.interval).or_insert_with(Acc::empty).add(&v);
                true
            })
            .await?;
            let points = query::intervals(q, buckets);
            if !points.is_empty() {
                out.push((key.clone(), points));
            }
        }
        Ok(out)
    }

    /// The stored latest times of `keys` of a device.
    async fn latest_ts(&self, device: DeviceId, keys: &[&str]) -> Result<HashMap<String, i64>, StoreError> {
        let r = self.session.execute_unpaged(&self.st.latest_ts_of, (device.0, keys)).await.map_err(db)?;
        let rows = r.into_rows_result().map_err(db)?;
        rows.rows::<(String, i64)>().map_err(db)?.map(|row| row.map_err(db)).collect()
    }

    async fn write_batch(&self, batch: &[(DeviceId, &[TsRecord])]) -> Result<(), StoreError> {
        // Each point once: the last of equal (device, key, ts) wins.
        let mut points: BTreeMap<(Uuid, &str, i64), &Value> = BTreeMap::new();
        for (device, records) in batch {
            for r in *records {
                for (k, v) in &r.values {
                    points.insert((device.0, k.as_str(), r.ts.0), v);
                }
            }
        }
        // The newest point of each (device, key): in key order, the last one seen.
        let mut newest: BTreeMap<Uuid, BTreeMap<&str, (i64, &Value)>> = BTreeMap::new();
        for (&(d, k, ts), v) in &points {
            newest.entry(d).or_default().insert(k, (ts, v));
        }
        let new_partitions: Vec<(Uuid, &str, i64)> = {
            let known = self.known.lock();
            let all: HashSet<(Uuid, &str, i64)> = points.keys().map(|&(d, k, ts)| (d, k, month_of(ts))).collect();
            all.into_iter().filter(|&(d, k, m)| !known.contains(&(d, k.to_owned(), m))).collect()
        };
        let st = &self.st;
        let writes = points.iter().map(|(&(d, k, ts), v)| {
            let (tag, b, l, f, s, j) = bind(v);
            let values = (d, k, month_of(ts), ts, tag, b, l, f, s, j, self.ttl);
            async move { self.session.execute_unpaged(&st.insert_point, values).await.map(drop) }
        });
        let listed = new_partitions.iter().map(|&(d, k, m)| async move {
            self.session.execute_unpaged(&st.insert_partition, (d, k, m)).await.map(drop)
        });
        // Points and their months' listing first: a latest value read names a stored point.
        stream::iter(writes.map(Either::Left).chain(listed.map(Either::Right)))
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<()>()
            .await
            .map_err(db)?;
        {
            let mut known = self.known.lock();
            if known.len() + new_partitions.len() > KNOWN_PARTITIONS {
                known.clear();
            }
            known.extend(new_partitions.iter().map(|&(d, k, m)| (d, k.to_owned(), m)));
        }
        // Latest values: per device, read what is stored, replace what is older.
        stream::iter(newest.iter().map(|(&d, keys)| async move {
            let names: Vec<&str> = keys.keys().copied().collect();
            let stored = self.latest_ts(DeviceId(d), &names).await?;
            let newer: Vec<_> = keys
                .iter()
                .filter(|(&k, &(ts, _))| stored.get(k).is_none_or(|&old| old <= ts))
                .map(|(&k, &(ts, v))| {
                    let (tag, b, l, f, s, j) = bind(v);
                    (d, k, ts, tag, b, l, f, s, j)
                })
                .collect();
            // One request for all of them: they share the device's partition, so an
            // unlogged batch is applied as one write there.
            let mut batch = Batch::new(BatchType::Unlogged);
            batch.set_is_idempotent(true);
            for _ in &newer {
                batch.append_statement(st.insert_latest.clone());
            }
            if !newer.is_empty() {
                self.session.batch(&batch, newer).await.map_err(db)?;
            }
            Ok::<(), StoreError>(())
        }))
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<()>()
        .await
    }

    async fn delete_telemetry(&self, d: &DeleteTelemetry) -> Result<(), StoreError> {
        // `[start, end)`, as the inclusive `[start, last]` a range delete takes; the
        // open-ended delete includes i64::MAX itself.
        let (start, end) = d.range.map_or((i64::MIN, i64::MAX), |(s, e)| (s.0, e.0));
        let last = if d.range.is_some() { end - 1 } else { end };
        let st = &self.st;
        for key in &d.keys {
            for m in self.months(d.device, key, start, end).await? {
                // A month's partition holds only that month: the bounds need no cutting.
                self.session
                    .execute_unpaged(&st.delete_points, (d.device.0, key.as_str(), m, start, last))
                    .await
                    .map_err(db)?;
            }
            if !d.delete_latest {
                continue;
            }
            let stored = self.latest_ts(d.device, &[key.as_str()]).await?;
            let Some(&ts) = stored.get(key.as_str()) else { continue };
            let in_range = d.range.is_none_or(|(s, e)| ts >= s.0 && ts < e.0);
            if !in_range {
                continue;
            }
            self.session.execute_unpaged(&st.delete_latest, (d.device.0, key.as_str())).await.map_err(db)?;
            if d.rewrite_latest {
                let mut newest = None;
                self.points(d.device, key, (i64::MIN, i64::MAX), Order::Desc, 1, |ts, v| {
                    newest = Some((ts, v));
                    false
                })
                .await?;
                if let Some((ts, v)) = newest {
                    let (tag, b, l, f, s, j) = bind(&v);
                    let values = (d.device.0, key.as_str(), ts, tag, b, l, f, s, j);
                    self.session.execute_unpaged(&st.insert_latest, values).await.map_err(db)?;
                }
            }
        }
        Ok(())
    }
}

async fn connect(s: &CassandraSettings) -> Result<(Session, Statements), StoreError> {
    let profile = ExecutionProfile::builder().request_timeout(Some(REQUEST_TIMEOUT)).build();
    let session = SessionBuilder::new()
        .known_nodes(&s.contact_points)
        .connection_timeout(CONNECT_TIMEOUT)
        .default_execution_profile_handle(profile.into_handle())
        .build()
        .await
        .map_err(db)?;
    let ks = &s.keyspace;
    for ddl in schema(ks, s.replication_factor) {
        session.query_unpaged(ddl, ()).await.map_err(db)?;
    }
    session.await_schema_agreement().await.map_err(db)?;
    let prepare = |cql: String| {
        let session = &session;
        async move {
            let mut p = session.prepare(cql).await.map_err(db)?;
            p.set_is_idempotent(true);
            Ok::<_, StoreError>(p)
        }
    };
    let select_points = |order: &str| {
        format!(
            "SELECT ts, {VALUE_COLUMNS} FROM {ks}.gl_ts_kv WHERE device = ? AND key = ? AND month = ? \
             AND ts >= ? AND ts < ? ORDER BY ts {order} LIMIT ?"
        )
    };
    let st = Statements {
        insert_point: prepare(format!(
            "INSERT INTO {ks}.gl_ts_kv (device, key, month, ts, {VALUE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             USING TTL ?"
        ))
        .await?,
        insert_partition: prepare(format!(
            "INSERT INTO {ks}.gl_ts_kv_partitions (device, key, month) VALUES (?, ?, ?)"
        ))
        .await?,
        insert_latest: prepare(format!(
            "INSERT INTO {ks}.gl_ts_kv_latest (device, key, ts, {VALUE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))
        .await?,
        latest_all: prepare(format!("SELECT key, ts, {VALUE_COLUMNS} FROM {ks}.gl_ts_kv_latest WHERE device = ?"))
            .await?,
        latest_of: prepare(format!(
            "SELECT key, ts, {VALUE_COLUMNS} FROM {ks}.gl_ts_kv_latest WHERE device = ? AND key IN ?"
        ))
        .await?,
        latest_ts_of: prepare(format!("SELECT key, ts FROM {ks}.gl_ts_kv_latest WHERE device = ? AND key IN ?"))
            .await?,
        months: prepare(format!(
            "SELECT month FROM {ks}.gl_ts_kv_partitions WHERE device = ? AND key = ? AND month >= ? AND month <= ?"
        ))
        .await?,
        points_asc: prepare(select_points("ASC")).await?,
        points_desc: prepare(select_points("DESC")).await?,
        delete_points: prepare(format!(
            "DELETE FROM {ks}.gl_ts_kv WHERE device = ? AND key = ? AND month = ? AND ts >= ? AND ts <= ?"
        ))
        .await?,
        delete_latest: prepare(format!("DELETE FROM {ks}.gl_ts_kv_latest WHERE device = ? AND key = ?")).await?,
    };
    Ok((session, st))
}

impl Drop for CassandraTimeseries {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which must not happen on an async runtime's thread.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Timeseries for CassandraTimeseries {
    fn latest(&self, device: DeviceId, keys: Option<&[String]>) -> Result<Vec<(String, Ts, Value)>, StoreError> {
        let st = &self.st;
        let mut out = self.block_on(async {
            let r = match keys {
                Some(k) => self.session.execute_unpaged(&st.latest_of, (device.0, k)).await,
                None => self.session.execute_unpaged(&st.latest_all, (device.0,)).await,
            };
            let rows = r.map_err(db)?.into_rows_result().map_err(db)?;
            rows.rows::<LatestRow>()
                .map_err(db)?
                .map(|row| {
                    let (k, ts, tag, b, l, d, s, j) = row.map_err(db)?;
                    Ok((k, Ts(ts), value(tag, b, l, d, s, j)?))
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })?;
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn history(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        if q.keys.is_empty() || q.end <= q.start || q.limit == 0 {
            return Ok(Vec::new());
        }
        if q.agg == Agg::None {
            self.block_on(self.raw(device, q))
        } else {
            self.block_on(self.aggregate(device, q))
        }
    }
}

impl Shared for CassandraTimeseries {
    fn name(&self) -> &'static str {
        "cassandra"
    }

    fn ping(&self) -> Result<(), StoreError> {
        self.block_on(self.session.query_unpaged("SELECT release_version FROM system.local", ())).map(drop).map_err(db)
    }

    /// Cassandra's text holds any string.
    fn storable(&self, _records: &[TsRecord]) -> Result<(), StoreError> {
        Ok(())
    }

    fn write(&self, batch: &[(DeviceId, &[TsRecord])]) -> Result<(), StoreError> {
        self.block_on(self.write_batch(batch))
    }

    fn delete(&self, d: &DeleteTelemetry) -> Result<(), StoreError> {
        self.block_on(self.delete_telemetry(d))
    }
}
