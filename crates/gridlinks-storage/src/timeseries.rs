//! The time-series seam: what the REST and WebSocket APIs read of telemetry (latest
//! values, history, aggregation), served by the embedded [`Store`] or by a shared database
//! (`gridlinks-postgres`, `gridlinks-cassandra`: [`Shared`]). Every backend gives the same
//! answers: [`conformance::run`] is the one suite each of them passes, and
//! [`conformance::run_batches`] the one every shared database passes too.

use gridlinks_types::{DeviceId, Ts, TsRecord, Value};

use crate::query::{HistoryQuery, KeySeries};
use crate::{DeleteTelemetry, Store, StoreError};

/// Reads of stored telemetry.
pub trait Timeseries: Send + Sync {
    /// The latest value of each of `keys` (all keys: `None`) the device has, sorted by key.
    fn latest(&self, device: DeviceId, keys: Option<&[String]>) -> Result<Vec<(String, Ts, Value)>, StoreError>;

    /// For each key of the query that has points in its range, its points or intervals.
    fn history(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError>;

    /// The device's time-series keys (those with a latest value), sorted.
    fn ts_keys(&self, device: DeviceId) -> Result<Vec<String>, StoreError> {
        Ok(self.latest(device, None)?.into_iter().map(|(k, _, _)| k).collect())
    }
}

/// A time-series database the nodes of a cluster share: written by the storage writers
/// (consuming Kafka) in batches, read and deleted in by every node. Its calls block.
pub trait Shared: Timeseries {
    /// `postgresql` or `cassandra`: names it in logs, errors and `/readyz`.
    fn name(&self) -> &'static str;

    /// Whether it answers.
    fn ping(&self) -> Result<(), StoreError>;

    /// Whether it can hold the records at all (checked before they are acknowledged: a
    /// write it refuses for good would otherwise be retried forever).
    fn storable(&self, records: &[TsRecord]) -> Result<(), StoreError>;

    /// Stores the records of many devices, durably, before returning. Idempotent: a batch
    /// written again (a redelivery from Kafka) stores each point once; each key's latest
    /// value only moves forward in time.
    fn write(&self, batch: &[(DeviceId, &[TsRecord])]) -> Result<(), StoreError>;

    /// Deletes telemetry, durably, before returning.
    fn delete(&self, d: &DeleteTelemetry) -> Result<(), StoreError>;
}

impl Timeseries for Store {
    fn latest(&self, device: DeviceId, keys: Option<&[String]>) -> Result<Vec<(String, Ts, Value)>, StoreError> {
        Store::latest(self, device, keys)
    }

    fn history(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        Store::history(self, device, q)
    }
}

/// The month (`year * 12 + month - 1`) of a time in ms: the unit the shared backends
/// partition time series by.
pub fn month_of(ts: i64) -> i64 {
    let days = ts.div_euclid(86_400_000);
    let (y, m, _) = civil(days);
    y * 12 + m - 1
}

/// The first ms of a month (`year * 12 + month - 1`).
pub fn month_start(month: i64) -> i64 {
    let (y, m) = (month.div_euclid(12), month.rem_euclid(12) + 1);
    days_from_civil(y, m) * 86_400_000
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The first day of a month as days since 1970-01-01.
fn days_from_civil(y: i64, m: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The suite every time-series backend passes: one data set written, then every kind of
/// read and delete checked against answers worked out by hand (not against another
/// backend), so each backend is checked on its own.
pub mod conformance {
    use gridlinks_types::{DeviceId, Ts, TsRecord, Value};

    use super::Timeseries;
    use crate::query::{Agg, HistoryQuery, Order};
    use crate::{DeleteTelemetry, StoreError};

    /// How the suite writes: through whatever path the backend is written by.
    pub trait Writes {
        /// Stores telemetry of a device, durably, before returning.
        fn write(&self, device: DeviceId, records: Vec<TsRecord>) -> Result<(), StoreError>;
        /// Deletes telemetry, durably, before returning.
        fn delete(&self, d: DeleteTelemetry) -> Result<(), StoreError>;
    }

    fn rec(ts: i64, values: &[(&str, Value)]) -> TsRecord {
        TsRecord { ts: Ts(ts), values: values.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect() }
    }

    fn query(keys: &[&str], range: (i64, i64), agg: Agg, interval: i64, limit: usize, order: Order) -> HistoryQuery {
        HistoryQuery {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            start: Ts(range.0),
            end: Ts(range.1),
            interval,
            agg,
            limit,
            order,
        }
    }

    fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: got {got:?}, want {want:?}"))
        }
    }

    fn points(p: &[(i64, Value)]) -> Vec<(Ts, Value)> {
        p.iter().map(|(t, v)| (Ts(*t), v.clone())).collect()
    }

    impl<T: super::Shared> Writes for T {
        fn write(&self, device: DeviceId, records: Vec<TsRecord>) -> Result<(), StoreError> {
            super::Shared::write(self, &[(device, &records)])
        }
        fn delete(&self, d: DeleteTelemetry) -> Result<(), StoreError> {
            super::Shared::delete(self, &d)
        }
    }

    /// Runs the suite on two devices that hold no telemetry yet: the first mismatch, if any.
    pub fn run(ts: &dyn Timeseries, w: &dyn Writes, a: DeviceId, b: DeviceId) -> Result<(), String> {
        let e = |e: StoreError| e.to_string();
        // Out of order, one point redelivered, every value type.
        w.write(a, vec![rec(1000, &[("t", Value::Long(1)), ("s", Value::Str("a".into()))])]).map_err(e)?;
        w.write(a, vec![rec(2000, &[("t", Value::Double(2.5)), ("b", Value::Bool(true))])]).map_err(e)?;
        w.write(a, vec![rec(3000, &[("t", Value::Long(4)), ("j", Value::Json(r#"{"x":1}"#.into()))])]).map_err(e)?;
        w.write(a, vec![rec(2500, &[("t", Value::Long(3))]), rec(1000, &[("t", Value::Long(1))])]).map_err(e)?;
        w.write(b, vec![rec(1000, &[("t", Value::Long(100))])]).map_err(e)?;
        w.write(b, vec![rec(5000, &[("big", Value::Long(i64::MAX))]), rec(5001, &[("big", Value::Long(1))])])
            .map_err(e)?;

        // Latest values.
        let latest = ts.latest(a, None).map_err(e)?;
        same(
            "latest of a",
            latest,
            vec![
                ("b".into(), Ts(2000), Value::Bool(true)),
                ("j".into(), Ts(3000), Value::Json(r#"{"x":1}"#.into())),
                ("s".into(), Ts(1000), Value::Str("a".into())),
                ("t".into(), Ts(3000), Value::Long(4)),
            ],
        )?;
        let some = ts.latest(a, Some(&["t".into(), "nope".into()])).map_err(e)?;
        same("latest of a, t and an unknown key", some, vec![("t".into(), Ts(3000), Value::Long(4))])?;
        same("keys of a", ts.ts_keys(a).map_err(e)?, vec!["b".to_owned(), "j".into(), "s".into(), "t".into()])?;
        same(
            "latest of b, t",
            ts.latest(b, Some(&["t".into()])).map_err(e)?,
            vec![("t".into(), Ts(1000), Value::Long(100))],
        )?;
        same("latest of a device without data", ts.latest(DeviceId::new_random(), None).map_err(e)?, vec![])?;

        // Raw points: per key, end exclusive, limit per key, either order.
        let t_all = points(&[
            (1000, Value::Long(1)),
            (2000, Value::Double(2.5)),
            (2500, Value::Long(3)),
            (3000, Value::Long(4)),
        ]);
        let h = ts.history(a, &query(&["t"], (0, 10_000), Agg::None, 0, 100, Order::Asc)).map_err(e)?;
        same("raw t", h, vec![("t".into(), t_all.clone())])?;
        let h = ts.history(a, &query(&["t"], (0, 10_000), Agg::None, 0, 2, Order::Desc)).map_err(e)?;
        same("raw t, newest 2", h, vec![("t".into(), points(&[(3000, Value::Long(4)), (2500, Value::Long(3))]))])?;
        let h = ts.history(a, &query(&["t"], (2000, 3000), Agg::None, 0, 100, Order::Asc)).map_err(e)?;
        same(
            "raw t in [2000, 3000)",
            h,
            vec![("t".into(), points(&[(2000, Value::Double(2.5)), (2500, Value::Long(3))]))],
        )?;
        let h = ts.history(a, &query(&["s", "none", "t"], (0, 10_000), Agg::None, 0, 1, Order::Asc)).map_err(e)?;
        same(
            "raw s, none, t: one each, keys in the asked order",
            h,
            vec![
                ("s".into(), points(&[(1000, Value::Str("a".into()))])),
                ("t".into(), points(&[(1000, Value::Long(1))])),
            ],
        )?;
        let h = ts.history(a, &query(&["t"], (5000, 5000), Agg::None, 0, 100, Order::Asc)).map_err(e)?;
        same("an empty range", h, vec![])?;

        // Aggregation: [0, 2000) holds 1; [2000, 4000) holds 2.5, 3 and 4.
        let agg = |keys: &[&str], agg: Agg, limit: usize, order: Order| {
            ts.history(a, &query(keys, (0, 4000), agg, 2000, limit, order)).map_err(e)
        };
        for (name, f, want) in [
            ("AVG", Agg::Avg, [Value::Double(1.0), Value::Double(9.5 / 3.0)]),
            ("SUM", Agg::Sum, [Value::Long(1), Value::Double(9.5)]),
            ("MIN", Agg::Min, [Value::Long(1), Value::Double(2.5)]),
            ("MAX", Agg::Max, [Value::Long(1), Value::Double(4.0)]),
            ("COUNT", Agg::Count, [Value::Long(1), Value::Long(3)]),
        ] {
            let [first, second] = want;
            same(
                name,
                agg(&["t"], f, 100, Order::Asc)?,
                vec![("t".into(), points(&[(1000, first), (3000, second.clone())]))],
            )?;
            same(
                &format!("{name}, newest 1"),
                agg(&["t"], f, 1, Order::Desc)?,
                vec![("t".into(), points(&[(3000, second)]))],
            )?;
        }
        same(
            "COUNT of text",
            agg(&["s"], Agg::Count, 100, Order::Asc)?,
            vec![("s".into(), points(&[(1000, Value::Long(1))]))],
        )?;
        same("MIN of text: no value", agg(&["s", "b"], Agg::Min, 100, Order::Asc)?, vec![])?;
        let big = ts.history(b, &query(&["big"], (0, 10_000), Agg::Sum, 10_000, 100, Order::Asc)).map_err(e)?;
        same(
            "SUM past i64::MAX becomes a double",
            big,
            vec![("big".into(), points(&[(5000, Value::Double(i64::MAX as f64 + 1.0))]))],
        )?;
        let cut = ts.history(a, &query(&["t"], (0, 3000), Agg::Count, 2000, 100, Order::Asc)).map_err(e)?;
        same(
            "an interval cut at the end",
            cut,
            vec![("t".into(), points(&[(1000, Value::Long(1)), (2500, Value::Long(2))]))],
        )?;
        for (interval, what) in [(0, "interval must be positive"), (1, "too many intervals")] {
            match ts.history(a, &query(&["t"], (0, 1_000_000), Agg::Avg, interval, 100, Order::Asc)) {
                Err(StoreError::Limit(m)) if m.contains(what) => {}
                other => return Err(format!("interval {interval}: got {other:?}, want a limit error ({what})")),
            }
        }

        // Deletes: points only; then points and the latest value, the newest remaining
        // point promoted; then a whole key and its latest value.
        let del =
            |keys: &[&str], range: Option<(i64, i64)>, delete_latest: bool, rewrite_latest: bool| DeleteTelemetry {
                device: a,
                keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                range: range.map(|(s, e)| (Ts(s), Ts(e))),
                delete_latest,
                rewrite_latest,
            };
        let raw_t = || ts.history(a, &query(&["t"], (0, 10_000), Agg::None, 0, 100, Order::Asc)).map_err(e);
        w.delete(del(&["t"], Some((2000, 2600)), false, false)).map_err(e)?;
        same(
            "t after deleting [2000, 2600)",
            raw_t()?,
            vec![("t".into(), points(&[(1000, Value::Long(1)), (3000, Value::Long(4))]))],
        )?;
        same(
            "latest t kept",
            ts.latest(a, Some(&["t".into()])).map_err(e)?,
            vec![("t".into(), Ts(3000), Value::Long(4))],
        )?;
        w.delete(del(&["t"], Some((2900, 4000)), true, true)).map_err(e)?;
        same("t after deleting [2900, 4000)", raw_t()?, vec![("t".into(), points(&[(1000, Value::Long(1))]))])?;
        same(
            "latest t promoted",
            ts.latest(a, Some(&["t".into()])).map_err(e)?,
            vec![("t".into(), Ts(1000), Value::Long(1))],
        )?;
        w.delete(del(&["s"], None, true, false)).map_err(e)?;
        same("keys of a after deleting s", ts.ts_keys(a).map_err(e)?, vec!["b".to_owned(), "j".into(), "t".into()])?;
        let s = ts.history(a, &query(&["s"], (0, 10_000), Agg::None, 0, 100, Order::Asc)).map_err(e)?;
        same("s after deleting it", s, vec![])?;
        same(
            "b untouched",
            ts.latest(b, Some(&["t".into()])).map_err(e)?,
            vec![("t".into(), Ts(1000), Value::Long(100))],
        )?;
        Ok(())
    }

    /// The batch writes of a shared database: one batch of two devices written twice (a
    /// redelivery), each with two values at one time (the last one kept), points in
    /// three months (now, 62 days back, 1990), then an older point (not the latest
    /// value) and a new type at the latest time. `now` is the newest time written.
    pub fn run_batches(db: &dyn super::Shared, a: DeviceId, b: DeviceId, now: i64) -> Result<(), String> {
        let e = |e: StoreError| e.to_string();
        let (old, ancient) = (now - 62 * 86_400_000, 631_152_000_000);
        let recs = |v: i64| {
            vec![
                rec(now, &[("x", Value::Long(v))]),
                rec(now, &[("x", Value::Long(v + 1))]),
                rec(ancient, &[("x", Value::Long(v))]),
                rec(old, &[("x", Value::Str("old".into()))]),
            ]
        };
        let (ra, rb) = (recs(1), recs(10));
        for _ in 0..2 {
            db.write(&[(a, &ra), (b, &rb)]).map_err(e)?;
        }
        let all = |d, limit, order| {
            let q = query(&["x"], (i64::MIN, i64::MAX), Agg::None, 0, limit, order);
            db.history(d, &q).map_err(e)
        };
        let want =
            |v: i64| points(&[(now, Value::Long(v + 1)), (old, Value::Str("old".into())), (ancient, Value::Long(v))]);
        same("a batch written twice, newest first", all(a, 100, Order::Desc)?, vec![("x".into(), want(1))])?;
        same("the other device", all(b, 100, Order::Desc)?, vec![("x".into(), want(10))])?;
        same(
            "the oldest 2, across months",
            all(b, 2, Order::Asc)?,
            vec![("x".into(), points(&[(ancient, Value::Long(10)), (old, Value::Str("old".into()))]))],
        )?;
        same(
            "the last of equal times is latest",
            db.latest(a, None).map_err(e)?,
            vec![("x".into(), Ts(now), Value::Long(2))],
        )?;
        db.write(&[(a, &[rec(now - 1, &[("x", Value::Long(-1))])])]).map_err(e)?;
        db.write(&[(a, &[rec(now, &[("x", Value::Bool(true))])])]).map_err(e)?;
        same(
            "an older point is not latest; a new type at one time is",
            db.latest(a, None).map_err(e)?,
            vec![("x".into(), Ts(now), Value::Bool(true))],
        )?;
        same(
            "the new type in history",
            all(a, 1, Order::Desc)?,
            vec![("x".into(), points(&[(now, Value::Bool(true))]))],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_and_their_bounds() {
        // 2026-11-24T00:00:00Z
        let ts = 1_795_478_400_000;
        let m = month_of(ts);
        assert_eq!((m.div_euclid(12), m.rem_euclid(12) + 1), (2026, 11));
        assert_eq!(month_start(m), 1_793_491_200_000); // 2026-11-01
        assert_eq!(month_start(m + 2), 1_798_761_600_000); // 2027-01-01
        assert_eq!(month_of(0), 1970 * 12);
        assert_eq!(month_of(-1), 1969 * 12 + 11);
        for m in [0, 1970 * 12, 2000 * 12 + 1, 2024 * 12 + 1] {
            assert_eq!(month_of(month_start(m)), m);
            assert_eq!(month_of(month_start(m + 1) - 1), m);
        }
    }
}
