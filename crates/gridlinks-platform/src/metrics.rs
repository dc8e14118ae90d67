//! `GET /metrics`: the registry every subsystem adds its metrics to, and the encoders
//! they use. A subsystem keeps plain atomics and knows nothing of Prometheus; it registers a
//! [`Source`] that names, describes and reads them at scrape time (OpenMetrics text through
//! `prometheus-client`, each with `# HELP` and `# TYPE`). The storage writer's metrics are
//! registered here ([`StorageMetrics`]); each transport registers its own.
//!
//! Counter names are the exposed ones (`…_total`); the encoder adds that suffix itself, so
//! [`counter`] strips it before encoding.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gridlinks_storage::histogram::Snapshot;
use gridlinks_storage::writer::WriterStats;
use parking_lot::RwLock;
use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::DescriptorEncoder;
pub use prometheus_client::encoding::EncodeMetric;
use prometheus_client::encoding::NoLabelSet;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
pub use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::core::Core;

/// The `Content-Type` of the scrape response.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a subsystem exposes: read at every scrape.
pub trait Source: Send + Sync + 'static {
    /// Encodes every metric of the subsystem with its current value.
    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result;
}

/// Every registered [`Source`], in registration order.
#[derive(Default)]
pub struct Metrics {
    sources: RwLock<Vec<Arc<dyn Source>>>,
}

impl Metrics {
    /// Adds `source` to every scrape from now on.
    pub fn register(&self, source: Arc<dyn Source>) {
        self.sources.write().push(source);
    }

    /// The metrics text of one scrape.
    pub fn render(&self) -> Result<String, fmt::Error> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape(self.sources.read().clone())));
        let mut out = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// The sources of one scrape.
struct Scrape(Vec<Arc<dyn Source>>);

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Scrape")
    }
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        self.0.iter().try_for_each(|s| s.encode(&mut e))
    }
}

/// The storage writer's counters and histograms.
pub struct StorageMetrics(pub Core);

impl Source for StorageMetrics {
    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        storage(e, &self.0)
    }
}

/// The storage writer's counters and histograms.
fn storage(e: &mut DescriptorEncoder, st: &Core) -> fmt::Result {
    let w: &WriterStats = st.writer.stats();
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    counter(
        e,
        "gridlinks_storage_commits_total",
        "Group commits done (write rounds; each ends with one fsync when anything was written).",
        l(&w.commits),
    )?;
    counter(e, "gridlinks_storage_write_ops_total", "Write requests answered by the storage writer.", l(&w.ops))?;
    counter(e, "gridlinks_storage_records_total", "Time-series records written.", l(&w.records))?;
    counter(
        e,
        "gridlinks_storage_sync_seconds_total",
        "Seconds the storage writer spent in fsync.",
        l(&w.sync_nanos) as f64 / 1e9,
    )?;
    counter(
        e,
        "gridlinks_storage_overloaded_total",
        "Write requests refused because the write queue stayed full (storage overloaded).",
        l(&w.overloaded),
    )?;
    gauge(
        e,
        "gridlinks_storage_queue_depth",
        "Write requests waiting in the storage writer's queue.",
        st.writer.queued() as u64,
    )?;
    counter(
        e,
        "gridlinks_storage_refused_unhealthy_total",
        "Write requests refused because the disk was (nearly) full or the store had failed.",
        l(&w.refused_unhealthy),
    )?;
    counter(
        e,
        "gridlinks_storage_reopens_total",
        "Times the store was reopened after an engine failure.",
        l(&w.reopens),
    )?;
    gauge(e, "gridlinks_storage_health", "Storage health: 0 ok, 1 disk full, 2 failed.", st.store.health() as u64)?;
    gauge(e, "gridlinks_storage_bytes", "Bytes the store's files take on disk.", st.store.disk_bytes())?;
    histogram(
        e,
        "gridlinks_storage_commit_seconds",
        "Duration of one group commit round, from taking the batch to the end of its fsync.",
        &w.commit_nanos.snapshot(),
        1e-9,
    )?;
    histogram(
        e,
        "gridlinks_storage_commit_batch_ops",
        "Write requests per group commit.",
        &w.commit_batch_ops.snapshot(),
        1.0,
    )
}

/// One counter; `name` is the exposed name, ending in `_total`.
pub fn counter<N>(e: &mut DescriptorEncoder, name: &str, help: &str, value: N) -> fmt::Result
where
    ConstCounter<N>: EncodeMetric,
{
    debug_assert!(name.ends_with("_total"), "{name}");
    let c = ConstCounter::new(value);
    c.encode(e.encode_descriptor(name.strip_suffix("_total").unwrap_or(name), help, None, c.metric_type())?)
}

/// A counter with one label: a series per `(label value, count)`.
pub fn labelled_counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> fmt::Result {
    debug_assert!(name.ends_with("_total"), "{name}");
    let mut m = e.encode_descriptor(name.strip_suffix("_total").unwrap_or(name), help, None, MetricType::Counter)?;
    for &(v, n) in values {
        ConstCounter::new(n).encode(m.encode_family(&[(label, v)])?)?;
    }
    Ok(())
}

/// A gauge with one label: a series per `(label value, value)`.
pub fn labelled_gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for &(v, n) in values {
        ConstGauge::new(n as i64).encode(m.encode_family(&[(label, v)])?)?;
    }
    Ok(())
}

/// One gauge.
pub fn gauge<N>(e: &mut DescriptorEncoder, name: &str, help: &str, value: N) -> fmt::Result
where
    ConstGauge<N>: EncodeMetric,
{
    let g = ConstGauge::new(value);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One histogram from a storage snapshot, its bounds and sum multiplied by `scale` (e.g.
/// nanoseconds to seconds).
pub fn histogram(e: &mut DescriptorEncoder, name: &str, help: &str, s: &Snapshot, scale: f64) -> fmt::Result {
    let buckets: Vec<(f64, u64)> =
        s.buckets.iter().map(|&(bound, n)| (bound.map_or(f64::INFINITY, |b| b as f64 * scale), n)).collect();
    e.encode_descriptor(name, help, None, MetricType::Histogram)?.encode_histogram::<NoLabelSet>(
        s.sum as f64 * scale,
        s.count,
        &buckets,
        None,
    )
}

/// The value of a counter kept as an atomic.
pub fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}
