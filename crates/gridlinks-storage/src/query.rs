//! Time-series history queries: raw points (`agg = NONE`) and aggregation into
//! fixed intervals (MIN, MAX, AVG, SUM, COUNT), as ThingsBoard's REST API answers them.

use std::collections::BTreeMap;

use gridlinks_types::{DeviceId, Ts, Value};

use crate::codec::{self, KeyId};
use crate::{Store, StoreError};

/// Aggregation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agg {
    /// Raw points.
    None,
    /// Smallest number per interval.
    Min,
    /// Largest number per interval.
    Max,
    /// Mean of the numbers per interval.
    Avg,
    /// Sum of the numbers per interval.
    Sum,
    /// Number of points (of any type) per interval.
    Count,
}

/// Sort order of the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Oldest first.
    Asc,
    /// Newest first.
    Desc,
}

/// A history query over `[start, end)`.
#[derive(Clone, Debug)]
pub struct HistoryQuery {
    /// Keys to return.
    pub keys: Vec<String>,
    /// Inclusive start.
    pub start: Ts,
    /// Exclusive end.
    pub end: Ts,
    /// Interval length in ms (aggregation only).
    pub interval: i64,
    /// Aggregation.
    pub agg: Agg,
    /// Most points (or intervals) per key.
    pub limit: usize,
    /// Order of the points.
    pub order: Order,
}

/// One key's points: its name and (ts, value) pairs in query order.
pub type KeySeries = (String, Vec<(Ts, Value)>);

/// Most intervals one aggregation query may produce.
pub const MAX_INTERVALS: i64 = 100_000;

/// One interval's aggregate of one key, as every time-series backend computes it: the
/// embedded store point by point ([`Acc::add`]), a database from its own aggregates. Its
/// [`Acc::result`] is the one place an aggregate becomes a value, so every backend answers
/// alike.
#[derive(Default, Debug, Clone, PartialEq)]
pub struct Acc {
    /// Points of any type.
    pub count: i64,
    /// Sum of the numbers as doubles, added in time order.
    pub sum: f64,
    /// Sum of the numbers as longs; `None` once it overflowed.
    pub long_sum: Option<i64>,
    /// Whether every number was a long.
    pub all_long: bool,
    /// Smallest number.
    pub min: Option<f64>,
    /// Largest number.
    pub max: Option<f64>,
    /// Numbers (longs and doubles).
    pub numbers: i64,
}

impl Acc {
    /// An empty accumulator. Not `Default`: a long sum starts at `Some(0)` and "all
    /// values are longs" at true.
    pub fn empty() -> Self {
        Self { long_sum: Some(0), all_long: true, ..Self::default() }
    }

    /// Takes in one point.
    pub fn add(&mut self, v: &Value) {
        self.count += 1;
        let Some(f) = v.as_f64() else { return };
        self.numbers += 1;
        self.sum += f;
        match v {
            Value::Long(i) => self.long_sum = self.long_sum.and_then(|s| s.checked_add(*i)),
            _ => self.all_long = false,
        }
        self.min = Some(self.min.map_or(f, |m| m.min(f)));
        self.max = Some(self.max.map_or(f, |m| m.max(f)));
    }

    /// The interval's value for `agg`, if it has one (MIN of text has none).
    pub fn result(&self, agg: Agg) -> Option<Value> {
        let num = |f: f64| {
            if self.all_long {
                Value::Long(f as i64)
            } else {
                Value::Double(f)
            }
        };
        match agg {
            Agg::Count => Some(Value::Long(self.count)),
            _ if self.numbers == 0 => None,
            Agg::Sum => Some(match (self.all_long, self.long_sum) {
                (true, Some(s)) => Value::Long(s),
                _ => Value::Double(self.sum),
            }),
            Agg::Avg => Some(Value::Double(self.sum / self.numbers as f64)),
            Agg::Min => self.min.map(num),
            Agg::Max => self.max.map(num),
            Agg::None => None,
        }
    }
}

/// Refuses an aggregation query whose interval is not positive or that would make more
/// than [`MAX_INTERVALS`] intervals.
pub fn check_intervals(q: &HistoryQuery) -> Result<(), StoreError> {
    if q.interval <= 0 {
        return Err(StoreError::Limit("interval must be positive".into()));
    }
    let span = q.end.0.saturating_sub(q.start.0);
    if span / q.interval >= MAX_INTERVALS {
        return Err(StoreError::Limit(format!(
            "too many intervals: (endTs - startTs) / interval must be below {MAX_INTERVALS}"
        )));
    }
    Ok(())
}

/// One key's aggregated points from its intervals' aggregates (interval `i` covers
/// `[start + i·interval, start + (i+1)·interval)`, cut at `end`): each at its interval's
/// middle, in the query's order, at most `limit`; intervals without a value left out.
pub fn intervals(q: &HistoryQuery, buckets: impl IntoIterator<Item = (i64, Acc)>) -> Vec<(Ts, Value)> {
    let mut points: Vec<(Ts, Value)> = buckets
        .into_iter()
        .filter_map(|(i, acc)| {
            let s = q.start.0 + i * q.interval;
            let e = (s + q.interval).min(q.end.0);
            acc.result(q.agg).map(|v| (Ts(s + (e - s) / 2), v))
        })
        .collect();
    points.sort_by_key(|p| p.0);
    if q.order == Order::Desc {
        points.reverse();
    }
    points.truncate(q.limit);
    points
}

impl Store {
    /// Answers a history query: for each requested key that has data, its points.
    pub fn history(&self, device: DeviceId, q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        let keys = self.key_ids(&q.keys);
        if keys.is_empty() || q.end <= q.start || q.limit == 0 {
            return Ok(Vec::new());
        }
        let lo = codec::ts_key(device, q.start);
        let hi = codec::ts_key(device, q.end);
        let engine = self.engine()?;
        let iter = engine.ks.ts.range(lo..hi);
        if q.agg == Agg::None {
            return self.raw(iter, &keys, q);
        }
        check_intervals(q)?;
        let mut buckets: Vec<BTreeMap<i64, Acc>> = keys.iter().map(|_| BTreeMap::new()).collect();
        for kv in iter {
            let (k, v) = kv.into_inner()?;
            let ts = codec::ts_of_key(&k)?;
            let bucket = (ts.0 - q.start.0) / q.interval;
            for (id, val) in codec::decode_ts_row(&v)? {
                if let Some(i) = keys.iter().position(|(kid, _)| *kid == id) {
                    buckets[i].entry(bucket).or_insert_with(Acc::empty).add(&val);
                }
            }
        }
        let mut out = Vec::new();
        for ((_, name), b) in keys.into_iter().zip(buckets) {
            let points = intervals(q, b);
            if !points.is_empty() {
                out.push((name, points));
            }
        }
        Ok(out)
    }

    fn raw(&self, iter: fjall::Iter, keys: &[(KeyId, String)], q: &HistoryQuery) -> Result<Vec<KeySeries>, StoreError> {
        let mut points: Vec<Vec<(Ts, Value)>> = keys.iter().map(|_| Vec::new()).collect();
        let mut visit = |kv: fjall::Guard| -> Result<bool, StoreError> {
            let (k, v) = kv.into_inner()?;
            let ts = codec::ts_of_key(&k)?;
            for (id, val) in codec::decode_ts_row(&v)? {
                if let Some(i) = keys.iter().position(|(kid, _)| *kid == id) {
                    if points[i].len() < q.limit {
                        points[i].push((ts, val));
                    }
                }
            }
            Ok(points.iter().all(|p| p.len() >= q.limit))
        };
        match q.order {
            Order::Asc => {
                for kv in iter {
                    if visit(kv)? {
                        break;
                    }
                }
            }
            Order::Desc => {
                for kv in iter.rev() {
                    if visit(kv)? {
                        break;
                    }
                }
            }
        }
        Ok(keys.iter().zip(points).filter(|(_, p)| !p.is_empty()).map(|((_, n), p)| (n.clone(), p)).collect())
    }
}
