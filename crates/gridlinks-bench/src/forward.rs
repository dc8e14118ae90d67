//! Data forwarding under load: `mqtt-telemetry --forward-http | --forward-kafka BOOTSTRAP |
//! --forward-blackhole` and `crash-loop --forward-http`.
//!
//! The tool runs the sink's other end itself and makes the server send there:
//!
//! * **HTTP**: a receiver on a free loopback port (hyper, HTTP/1.1, keep-alive) answers
//!   every POST with 200 once it has parsed the body (a JSON array of events) and
//!   recorded each event; anything else gets 400;
//! * **Kafka**: a topic `gridlinks-bench-forward-<random>` created with rdkafka's admin
//!   client (test brokers do not create topics), read from the beginning of every
//!   partition by a consumer thread;
//! * **blackhole**: a loopback listener that accepts connections and never reads or
//!   answers: a sink that is down without refusing (each POST waits for the server's
//!   `forwarding.timeout`).
//!
//! The sink (`POST /api/forwarding/sink`, events `TELEMETRY` only) is created after the
//! devices are imported and before the load starts, and deleted at the end, so a server
//! that keeps running is not left retrying a sink that is gone.
//!
//! A telemetry event is identified by (`deviceName`, `ts`): the bench stamps every message
//! of a device with its own strictly increasing `ts` (ms), the time it was written to the
//! socket. Each first arrival is recorded with its lag, receive time − `ts` (µs clock of
//! the same machine; `ts` is whole ms, so a lag reads up to 1 ms long), a repeat counts as
//! a duplicate (forwarding is at least once). After the run every acknowledged message
//! must arrive within `--forward-drain`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::cli::{ForwardArgs, ForwardSink};
use crate::loss_check::{unix_micros, AckLog};
use crate::report::{thousands, LatencySummary};
use crate::rest_api::{ApiTarget, RestClient};
use crate::stats::{Counters, LatencyShards};

/// Largest lag the histogram tracks, µs (one hour; a run with outages may be long).
const MAX_LAG_MICROS: u64 = 3_600_000_000;

/// Missing messages listed by name and `ts` in a report.
const EXAMPLES: usize = 5;

/// How often the drain looks whether everything arrived.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// The path the HTTP sink posts to.
const HTTP_PATH: &str = "/gridlinks-bench/ingest";

/// One forwarded event as the receivers read it; the other fields are ignored.
#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    ts: Option<u64>,
    #[serde(rename = "deviceName", default)]
    device_name: Option<String>,
}

/// What the sink's other end received, shared by its connection tasks or consumer thread.
pub struct Arrivals {
    inner: Mutex<Inner>,
    /// The run's counters: `received` counts first arrivals (the progress line and the
    /// timeline's deliveries per second).
    counters: Arc<Counters>,
    /// First-arrival lags for the timeline's per-second end-to-end latency.
    lag_shards: Arc<LatencyShards>,
}

struct Inner {
    /// Per device name: per `ts`, how many times it arrived.
    by_device: HashMap<String, HashMap<u64, u32>>,
    /// Every event received, of any type, repeats included.
    events: u64,
    /// Telemetry events with a device name and `ts`, repeats included.
    telemetry: u64,
    /// Distinct (device, ts) received.
    unique: u64,
    /// Bodies or records that were not the events expected.
    malformed: u64,
    /// First arrivals whose `ts` was later than their arrival.
    stamped_ahead: u64,
    /// Lag of each first arrival, µs.
    lag: Histogram<u64>,
    /// When the latest first arrival came.
    last_new: Option<Instant>,
}

impl Arrivals {
    /// An empty record counting into `counters.received` and `lag_shards`.
    pub fn new(counters: Arc<Counters>, lag_shards: Arc<LatencyShards>) -> Arc<Self> {
        let lag = Histogram::new_with_bounds(1, MAX_LAG_MICROS, 3).expect("static histogram bounds are valid");
        Arc::new(Arrivals {
            inner: Mutex::new(Inner {
                by_device: HashMap::new(),
                events: 0,
                telemetry: 0,
                unique: 0,
                malformed: 0,
                stamped_ahead: 0,
                lag,
                last_new: None,
            }),
            counters,
            lag_shards,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records events received at `now_us` (µs since the epoch).
    fn record(&self, events: impl IntoIterator<Item = Event>, now_us: u64) {
        let now = Instant::now();
        let mut new = 0;
        let mut inner = self.lock();
        for e in events {
            inner.events += 1;
            let (Some(name), Some(ts)) = (e.device_name, e.ts) else { continue };
            if e.kind != "TELEMETRY" {
                continue;
            }
            inner.telemetry += 1;
            let times = match inner.by_device.get_mut(&name) {
                Some(device) => device.entry(ts).or_insert(0),
                None => inner.by_device.entry(name).or_default().entry(ts).or_insert(0),
            };
            *times += 1;
            if *times == 1 {
                let stamp_us = ts.saturating_mul(1000);
                if stamp_us > now_us {
                    inner.stamped_ahead += 1;
                }
                let lag = now_us.saturating_sub(stamp_us).clamp(1, MAX_LAG_MICROS);
                inner.unique += 1;
                inner.lag.saturating_record(lag);
                inner.last_new = Some(now);
                self.lag_shards.record(new as usize, Duration::from_micros(lag));
                new += 1;
            }
        }
        drop(inner);
        Counters::add(&self.counters.received, new);
    }

    fn malformed(&self) {
        self.lock().malformed += 1;
    }

    /// Distinct telemetry messages received so far.
    pub fn unique(&self) -> u64 {
        self.lock().unique
    }

    /// The acknowledged messages (device `names[i]`'s `acks[i].ts`) not received: how
    /// many, the first few, and how many of the received ones were acknowledged.
    fn compare(&self, names: &[String], acks: &[AckLog]) -> (u64, Vec<(String, u64)>, u64) {
        let inner = self.lock();
        let (mut missing, mut examples, mut matched) = (0u64, Vec::new(), 0u64);
        for (name, log) in names.iter().zip(acks) {
            let got = inner.by_device.get(name);
            for &ts in &log.ts {
                if got.is_some_and(|g| g.contains_key(&ts)) {
                    matched += 1;
                } else {
                    missing += 1;
                    if examples.len() < EXAMPLES {
                        examples.push((name.clone(), ts));
                    }
                }
            }
        }
        (missing, examples, matched)
    }
}

/// The HTTP receiver: answers every POST of a JSON array with 200 once its events are
/// recorded. It can be stopped abruptly and started again on the same port.
pub struct HttpReceiver {
    port: u16,
    arrivals: Arc<Arrivals>,
    /// The accept loop, which owns the connection tasks (aborting it drops them all).
    task: Mutex<Option<JoinHandle<()>>>,
}

impl HttpReceiver {
    /// Listens on a free loopback port.
    pub async fn start(arrivals: Arc<Arrivals>) -> anyhow::Result<Arc<Self>> {
        let port = crate::servers::free_port()?;
        let receiver = Arc::new(HttpReceiver { port, arrivals, task: Mutex::new(None) });
        receiver.resume().await?;
        Ok(receiver)
    }

    /// The URL the sink posts to.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}{HTTP_PATH}", self.port)
    }

    /// Stops at once, as a killed process would: the listener is closed (new connections
    /// are refused), open connections are dropped and requests in progress stay
    /// unanswered. What was recorded is kept.
    pub async fn stop(&self) {
        let task = self.task.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    /// Starts listening (again) on its port.
    pub async fn resume(&self) -> anyhow::Result<()> {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                // The port was just closed: try again for a while.
                Err(_) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("binding the HTTP receiver to port {}", self.port)),
            }
        };
        let task = tokio::spawn(serve_http(listener, Arc::clone(&self.arrivals)));
        let old = self.task.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).replace(task);
        if let Some(old) = old {
            old.abort();
        }
        Ok(())
    }
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
            task.abort();
        }
    }
}

/// The accept loop: one task per connection, all aborted when this task is.
async fn serve_http(listener: TcpListener, arrivals: Arc<Arrivals>) {
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let arrivals = Arc::clone(&arrivals);
                    connections.spawn(async move {
                        let service = service_fn(move |req| answer(req, Arc::clone(&arrivals)));
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = http1::Builder::new().serve_connection(io, service).await;
                    });
                }
                // Out of descriptors, say: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One request: a POST of a JSON array of events gets 200 once recorded.
async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    arrivals: Arc<Arrivals>,
) -> Result<hyper::Response<http_body_util::Full<Bytes>>, std::convert::Infallible> {
    use http_body_util::BodyExt as _;
    let status = if req.method() != hyper::Method::POST {
        405
    } else {
        match req.into_body().collect().await {
            Ok(body) => {
                let now = unix_micros();
                match serde_json::from_slice::<Vec<Event>>(&body.to_bytes()) {
                    Ok(events) => {
                        arrivals.record(events, now);
                        200
                    }
                    Err(_) => {
                        arrivals.malformed();
                        400
                    }
                }
            }
            Err(_) => 400,
        }
    };
    let mut response = hyper::Response::new(http_body_util::Full::new(Bytes::new()));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_REQUEST);
    Ok(response)
}

/// A listener that accepts connections and never answers (a hung sink).
struct Blackhole {
    port: u16,
    task: JoinHandle<()>,
}

impl Blackhole {
    async fn start() -> anyhow::Result<Self> {
        let port = crate::servers::free_port()?;
        let listener = TcpListener::bind(("127.0.0.1", port)).await.context("binding the blackhole")?;
        let task = tokio::spawn(async move {
            // Held open, never read: the peer's request sits in the socket buffers.
            let mut held = Vec::new();
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
        Ok(Blackhole { port, task })
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The Kafka topic and the thread that reads it.
struct KafkaReader {
    bootstrap: String,
    topic: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KafkaReader {
    /// Creates the topic and starts reading every partition from the beginning.
    async fn start(bootstrap: &str, partitions: i32, arrivals: Arc<Arrivals>) -> anyhow::Result<Self> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::config::ClientConfig;
        use rdkafka::consumer::{BaseConsumer, Consumer as _};
        use rdkafka::{Offset, TopicPartitionList};

        let suffix = crate::rest_api::random_tokens(1)?.remove(0);
        let topic = format!("gridlinks-bench-forward-{}", suffix.trim_start_matches("bench-"));
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .with_context(|| format!("Kafka admin client for {bootstrap}"))?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let created = tokio::time::timeout(
            Duration::from_secs(60),
            admin.create_topics(&[NewTopic::new(&topic, partitions, TopicReplication::Fixed(1))], &options),
        )
        .await
        .with_context(|| format!("creating topic {topic} at {bootstrap}: no answer within 60 s"))?
        .with_context(|| format!("creating topic {topic} at {bootstrap}"))?;
        for result in created {
            if let Err((name, code)) = result {
                bail!("creating topic {name} at {bootstrap}: {code}");
            }
        }
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", format!("{topic}-reader"))
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            // Lag is measured at the consumer: the broker answers a fetch within 10 ms
            // even with nothing new, rather than the default 500.
            .set("fetch.wait.max.ms", "10")
            .create()
            .with_context(|| format!("Kafka consumer for {bootstrap}"))?;
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions {
            assignment.add_partition_offset(&topic, p, Offset::Beginning).context("assigning a partition")?;
        }
        consumer.assign(&assignment).with_context(|| format!("assigning the partitions of {topic}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("forward-kafka-reader".into())
                .spawn(move || read_kafka(&consumer, &stop, &arrivals))
                .context("starting the Kafka reader thread")?
        };
        Ok(KafkaReader { bootstrap: bootstrap.to_owned(), topic, stop, thread: Some(thread) })
    }

    /// Stops reading and deletes the topic (best effort).
    async fn finish(mut self) {
        use rdkafka::admin::{AdminClient, AdminOptions};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::config::ClientConfig;
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        let admin: Result<AdminClient<DefaultClientContext>, _> =
            ClientConfig::new().set("bootstrap.servers", &self.bootstrap).create();
        if let Ok(admin) = admin {
            let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
            let _ = tokio::time::timeout(Duration::from_secs(15), admin.delete_topics(&[&self.topic], &options)).await;
        }
    }
}

impl Drop for KafkaReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The consumer thread: every record's event, with the time it was polled.
fn read_kafka(consumer: &rdkafka::consumer::BaseConsumer, stop: &AtomicBool, arrivals: &Arrivals) {
    use rdkafka::Message as _;
    let mut complained = false;
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let now = unix_micros();
                match message.payload().map(serde_json::from_slice::<Event>) {
                    Some(Ok(event)) => arrivals.record([event], now),
                    _ => arrivals.malformed(),
                }
            }
            Some(Err(e)) if !complained => {
                eprintln!("forwarding: the Kafka reader: {e}");
                complained = true;
            }
            Some(Err(_)) | None => {}
        }
    }
}

/// The receiving end of the run's sink.
enum Receiver {
    Http(Arc<HttpReceiver>),
    Kafka(KafkaReader),
    Blackhole(Blackhole),
}

/// The sink's delivery statistics as the server shows them (`GET
/// /api/forwarding/sink/{id}`, `stats`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, Deserialize)]
pub struct SinkStats {
    /// `deliveredEvents`: events the server counts as delivered.
    pub delivered_events: u64,
    /// `failedAttempts`: deliveries tried and failed (each retried).
    pub failed_attempts: u64,
    /// `droppedEntries`: outbox entries dropped before this sink sent them (a full outbox).
    pub dropped_entries: u64,
    /// `pendingEntries`: outbox entries the sink has not passed yet.
    pub pending_entries: u64,
    /// `lastLagMs`: commit to delivery of the last entry delivered.
    pub last_lag_ms: i64,
    /// `lastError`, if any.
    pub last_error: Option<String>,
}

impl SinkStats {
    fn from_json(stats: &Value) -> Self {
        let n = |k: &str| stats[k].as_u64().unwrap_or(0);
        SinkStats {
            delivered_events: n("deliveredEvents"),
            failed_attempts: n("failedAttempts"),
            dropped_entries: n("droppedEntries"),
            pending_entries: n("pendingEntries"),
            last_lag_ms: stats["lastLagMs"].as_i64().unwrap_or(0),
            last_error: stats["lastError"].as_str().map(str::to_owned),
        }
    }
}

/// What forwarding did in a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardingReport {
    /// `http`, `kafka` or `blackhole`.
    pub sink: String,
    /// Where the sink sent: the receiver's URL, or `BOOTSTRAP topic T`.
    pub target: String,
    /// Every event received, of any type, repeats included.
    pub events_received: u64,
    /// Distinct telemetry messages (device, ts) received.
    pub unique_received: u64,
    /// Messages acknowledged in the run (each must arrive).
    pub acked: u64,
    /// Acknowledged messages that had not arrived when the drain ended; `None` for the
    /// blackhole (nothing can arrive).
    pub missing: Option<u64>,
    /// The first few missing (device, ts).
    pub missing_examples: Vec<(String, u64)>,
    /// Telemetry events received more than once (at least once: a batch sent again).
    pub duplicates: u64,
    /// Distinct messages received that were not acknowledged (in flight at the end, or
    /// of other devices of the tenant).
    pub unacked_received: u64,
    /// Bodies or records that were not JSON events.
    pub malformed: u64,
    /// Distinct messages whose `ts` was later than their arrival: their devices sent
    /// more than one message a millisecond, so the tool's stamps ran ahead of the clock
    /// (as fast as acks allow, `crash-loop`) and the lag means nothing.
    pub stamped_ahead: u64,
    /// From the end of the load (the last ack; `crash-loop`: the last restart) until every
    /// acknowledged message had arrived; `None` when some never did.
    pub drain_seconds: Option<f64>,
    /// The longest the drain waited.
    pub drain_timeout_seconds: f64,
    /// Distinct messages received per second, from the start of the load to the last
    /// first arrival.
    pub received_per_second: f64,
    /// Receive time − the message's `ts` of each first arrival.
    pub lag: LatencySummary,
    /// `gridlinks_forward_outbox_entries` at the end of the load window.
    pub outbox_entries_window_end: Option<u64>,
    /// The same after the drain (before the sink was deleted).
    pub outbox_entries_end: Option<u64>,
    /// The sink's statistics after the drain.
    pub sink_stats: Option<SinkStats>,
    /// Times the receiver was stopped and started again (`crash-loop`).
    pub receiver_outages: u32,
    /// Failed deliveries the server had counted right after each outage, summed (shows the
    /// outages were felt; the server's count starts again at each restart).
    pub outage_failed_attempts: u64,
}

impl ForwardingReport {
    /// False when acknowledged messages never reached the sink.
    pub fn passed(&self) -> bool {
        self.missing.is_none_or(|m| m == 0)
    }

    /// The summary lines.
    pub fn human(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "forwarding     {} sink -> {}", self.sink, self.target);
        if let Some(missing) = self.missing {
            let _ = writeln!(
                s,
                "forwarded      {} events received, {} distinct messages of {} acknowledged: {} missing, \
                 {} duplicates, {} not acknowledged{}",
                thousands(self.events_received),
                thousands(self.unique_received),
                thousands(self.acked),
                thousands(missing),
                thousands(self.duplicates),
                thousands(self.unacked_received),
                if self.malformed > 0 { format!(", {} malformed", thousands(self.malformed)) } else { String::new() },
            );
            let _ = writeln!(
                s,
                "sink rate      {} msg/s received; {}",
                thousands(self.received_per_second as u64),
                match self.drain_seconds {
                    Some(d) => format!("all acknowledged messages there {d:.2} s after the end of the load"),
                    None => format!("not all there after {:.0} s", self.drain_timeout_seconds),
                },
            );
            if self.stamped_ahead > 0 {
                let _ = writeln!(
                    s,
                    "forward lag    not measured: {} messages were stamped after their arrival (devices sent \
                     more than one a millisecond, so their ts ran ahead of the clock)",
                    thousands(self.stamped_ahead)
                );
            } else {
                let _ = writeln!(s, "forward lag    receive - ts: {}", self.lag.line());
            }
        } else {
            let _ = writeln!(s, "forwarded      nothing can arrive (a sink that never answers)");
        }
        if self.receiver_outages > 0 {
            let _ = writeln!(
                s,
                "receiver       stopped and started again {} times; the server counted {} failed deliveries by the \
                 end of the outages",
                self.receiver_outages,
                thousands(self.outage_failed_attempts)
            );
        }
        let outbox = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), thousands);
        let _ = writeln!(
            s,
            "outbox         {} entries at the end of the load window, {} at the end",
            outbox(self.outbox_entries_window_end),
            outbox(self.outbox_entries_end),
        );
        if let Some(st) = &self.sink_stats {
            let _ = writeln!(
                s,
                "sink stats     delivered {} events, {} failed attempts, {} dropped, {} pending, last lag {} ms{}",
                thousands(st.delivered_events),
                thousands(st.failed_attempts),
                thousands(st.dropped_entries),
                thousands(st.pending_entries),
                st.last_lag_ms,
                st.last_error.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default(),
            );
        }
        if !self.missing_examples.is_empty() {
            let listed: Vec<String> = self.missing_examples.iter().map(|(d, ts)| format!("{d}/{ts}")).collect();
            let more = self.missing.unwrap_or(0) > listed.len() as u64;
            let _ = writeln!(s, "missing        {}{}", listed.join(" "), if more { " ..." } else { "" });
        }
        if let Some(missing) = self.missing {
            if missing == 0 {
                s.push_str("FORWARDING CHECK PASSED: every acknowledged message reached the sink\n");
            } else {
                let _ = writeln!(
                    s,
                    "FORWARDING CHECK FAILED: {} acknowledged messages never reached the sink",
                    thousands(missing)
                );
            }
        }
        s
    }
}

/// A run's sink: created on the server, its receiver running.
pub struct Forwarding {
    kind: &'static str,
    target: String,
    arrivals: Arc<Arrivals>,
    receiver: Receiver,
    rest: RestClient,
    sink_id: String,
    drain: Duration,
    outbox_window_end: Option<u64>,
    outages: u32,
    outage_failures: u64,
}

/// Reads one sink's statistics (see [`Forwarding::stats_reader`]).
pub struct SinkStatsReader {
    rest: RestClient,
    sink_id: String,
}

impl SinkStatsReader {
    /// The sink's statistics now, `None` when the server does not answer.
    pub async fn read(&self) -> Option<SinkStats> {
        let (rest, id) = (self.rest.clone(), self.sink_id.clone());
        let sink = tokio::task::spawn_blocking(move || rest.get_json(&format!("/api/forwarding/sink/{id}")));
        Some(SinkStats::from_json(&sink.await.ok()?.ok()?["stats"]))
    }
}

impl Forwarding {
    /// Starts the receiver of `sink` and creates the sink on the server behind `api`.
    pub async fn start(
        sink: ForwardSink,
        args: &ForwardArgs,
        api: ApiTarget,
        counters: Arc<Counters>,
        lag_shards: Arc<LatencyShards>,
    ) -> anyhow::Result<Self> {
        let arrivals = Arrivals::new(counters, lag_shards);
        let (kind, receiver, target, configuration) = match sink {
            ForwardSink::Http => {
                let r = HttpReceiver::start(Arc::clone(&arrivals)).await?;
                let url = r.url();
                let config = json!({"url": url, "batchSize": args.forward_batch_size});
                ("http", Receiver::Http(r), format!("{url} (batchSize {})", args.forward_batch_size), config)
            }
            ForwardSink::Kafka(bootstrap) => {
                let r = KafkaReader::start(&bootstrap, args.forward_partitions, Arc::clone(&arrivals)).await?;
                let target = format!("{bootstrap} topic {} ({} partitions)", r.topic, args.forward_partitions);
                let config = json!({"bootstrapServers": bootstrap, "topic": r.topic});
                ("kafka", Receiver::Kafka(r), target, config)
            }
            ForwardSink::Blackhole => {
                let b = Blackhole::start().await?;
                let url = format!("http://127.0.0.1:{}{HTTP_PATH}", b.port);
                let config = json!({"url": url, "batchSize": args.forward_batch_size});
                ("blackhole", Receiver::Blackhole(b), format!("{url} (accepts, never answers)"), config)
            }
        };
        let body = json!({
            "name": format!("gridlinks-bench-{kind}-{}", std::process::id()),
            "type": if kind == "kafka" { "KAFKA" } else { "HTTP" },
            "configuration": configuration,
            "filter": {"events": ["TELEMETRY"]},
        });
        let (rest, sink_id) = tokio::task::spawn_blocking(move || -> anyhow::Result<(RestClient, String)> {
            let rest = RestClient::login(&api)?;
            let created = rest.post_json("/api/forwarding/sink", &body).context(
                "creating the data sink (a loopback sink needs the server started with \
                 GRIDLINKS_FORWARDING_ALLOW_PRIVATE_ADDRESSES=true)",
            )?;
            let id = created["id"]["id"].as_str().context("the new sink has no id")?.to_owned();
            Ok((rest, id))
        })
        .await??;
        eprintln!("forwarding: {kind} sink {sink_id} -> {target}");
        Ok(Forwarding {
            kind,
            target,
            arrivals,
            receiver,
            rest,
            sink_id,
            drain: args.forward_drain,
            outbox_window_end: None,
            outages: 0,
            outage_failures: 0,
        })
    }

    /// An HTTP sink for `crash-loop`, whose receiver [`Forwarding::http_receiver`] stops
    /// and starts.
    pub async fn start_http(
        api: ApiTarget,
        batch_size: u16,
        drain: Duration,
        counters: Arc<Counters>,
    ) -> anyhow::Result<Self> {
        let args = ForwardArgs {
            forward_http: true,
            forward_batch_size: batch_size,
            forward_drain: drain,
            ..Default::default()
        };
        Self::start(ForwardSink::Http, &args, api, counters, LatencyShards::new(4)).await
    }

    /// The HTTP receiver, when the sink is one.
    pub fn http_receiver(&self) -> Option<Arc<HttpReceiver>> {
        match &self.receiver {
            Receiver::Http(r) => Some(Arc::clone(r)),
            _ => None,
        }
    }

    /// Reads the sink's statistics from the server, later (`crash-loop`: right after a
    /// receiver outage).
    pub fn stats_reader(&self) -> SinkStatsReader {
        SinkStatsReader { rest: self.rest.clone(), sink_id: self.sink_id.clone() }
    }

    /// Counts one stop and restart of the receiver, and the failed deliveries the server
    /// counted by then (`None`: it could not be asked).
    pub fn count_outage(&mut self, failed_attempts: Option<u64>) {
        self.outages += 1;
        self.outage_failures += failed_attempts.unwrap_or(0);
    }

    /// Whether nothing can arrive (the blackhole).
    pub fn is_blackhole(&self) -> bool {
        matches!(self.receiver, Receiver::Blackhole(_))
    }

    /// Reads `gridlinks_forward_outbox_entries` now as the end of the load window.
    pub async fn mark_window_end(&mut self) {
        self.outbox_window_end = self.outbox_entries().await;
    }

    /// `gridlinks_forward_outbox_entries` from `/metrics`, if readable.
    async fn outbox_entries(&self) -> Option<u64> {
        let rest = self.rest.clone();
        let text = tokio::task::spawn_blocking(move || rest.get_text("/metrics")).await.ok()?.ok()?;
        metric(&text, "gridlinks_forward_outbox_entries")
    }

    /// Waits until every acknowledged message (device `names[i]`, `acks[i].ts`) arrived
    /// or the drain timeout passed (counted from `load_end`), reads the sink's statistics,
    /// deletes the sink and stops the receiver. `load_start`: when the load began.
    pub async fn finish(
        self,
        names: &[String],
        acks: &[AckLog],
        load_start: Instant,
        load_end: Instant,
    ) -> anyhow::Result<ForwardingReport> {
        let acked: u64 = acks.iter().map(|a| a.ts.len() as u64).sum();
        let blackhole = self.is_blackhole();
        let mut drain_seconds = None;
        if !blackhole {
            let deadline = load_end + self.drain;
            loop {
                // The full comparison only once enough arrived to possibly cover it.
                if self.arrivals.unique() >= acked && self.arrivals.compare(names, acks).0 == 0 {
                    let last = self.arrivals.lock().last_new.unwrap_or(load_end);
                    drain_seconds = Some(last.saturating_duration_since(load_end).as_secs_f64());
                    break;
                }
                if Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(DRAIN_POLL).await;
            }
        }
        let outbox_end = self.outbox_entries().await;
        let (rest, id) = (self.rest.clone(), self.sink_id.clone());
        let stats = tokio::task::spawn_blocking(move || -> anyhow::Result<Value> {
            let sink = rest.get_json(&format!("/api/forwarding/sink/{id}"))?;
            rest.delete(&format!("/api/forwarding/sink/{id}"))?;
            Ok(sink["stats"].clone())
        })
        .await?
        .context("reading and deleting the data sink")?;
        match self.receiver {
            Receiver::Http(r) => r.stop().await,
            Receiver::Kafka(k) => k.finish().await,
            Receiver::Blackhole(b) => drop(b),
        }
        let (missing, missing_examples, matched) = self.arrivals.compare(names, acks);
        let inner = self.arrivals.lock();
        let span = inner.last_new.map_or(0.0, |t| t.saturating_duration_since(load_start).as_secs_f64());
        Ok(ForwardingReport {
            sink: self.kind.to_owned(),
            target: self.target.clone(),
            events_received: inner.events,
            unique_received: inner.unique,
            acked,
            missing: (!blackhole).then_some(missing),
            missing_examples,
            duplicates: inner.telemetry - inner.unique,
            unacked_received: inner.unique.saturating_sub(matched),
            malformed: inner.malformed,
            stamped_ahead: inner.stamped_ahead,
            drain_seconds,
            drain_timeout_seconds: self.drain.as_secs_f64(),
            received_per_second: crate::report::per_second(inner.unique as f64, span),
            lag: LatencySummary::from_histogram(&inner.lag),
            outbox_entries_window_end: self.outbox_window_end,
            outbox_entries_end: outbox_end,
            sink_stats: Some(SinkStats::from_json(&stats)),
            receiver_outages: self.outages,
            outage_failed_attempts: self.outage_failures,
        })
    }
}

/// The value of an unlabelled metric in Prometheus' text format.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse::<f64>().ok().map(|v| v as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrivals() -> Arc<Arrivals> {
        Arrivals::new(Arc::new(Counters::default()), LatencyShards::new(2))
    }

    fn telemetry(name: &str, ts: u64) -> Event {
        Event { kind: "TELEMETRY".into(), ts: Some(ts), device_name: Some(name.into()) }
    }

    #[test]
    fn arrivals_count_first_arrivals_repeats_and_missing_acks() {
        let a = arrivals();
        let base = 1_700_000_000_000u64;
        a.record([telemetry("d0", base), telemetry("d0", base + 1), telemetry("d1", base)], (base + 5) * 1000);
        // A batch sent again, and an attribute event (not telemetry).
        let attr = Event { kind: "ATTRIBUTES".into(), ts: Some(base), device_name: Some("d0".into()) };
        a.record([telemetry("d0", base), attr], (base + 9) * 1000);
        assert_eq!(a.unique(), 3);
        assert_eq!(a.counters.received.load(Ordering::Relaxed), 3);
        let acks = |ts: &[u64]| AckLog { ts: ts.to_vec(), ack_ms: ts.to_vec() };
        let names = ["d0".to_owned(), "d1".to_owned()];
        let (missing, examples, matched) = a.compare(&names, &[acks(&[base, base + 1, base + 2]), acks(&[base])]);
        assert_eq!((missing, matched), (1, 3));
        assert_eq!(examples, vec![("d0".to_owned(), base + 2)]);
        let inner = a.lock();
        assert_eq!((inner.events, inner.telemetry), (5, 4));
        // Lags of first arrivals only: 5 ms, 4 ms, 5 ms.
        assert_eq!(inner.lag.len(), 3);
        assert!(inner.lag.max() >= 5000 && inner.lag.max() < 5100, "{}", inner.lag.max());
    }

    #[test]
    fn metrics_are_read_from_the_text_format() {
        let text = "# HELP gridlinks_forward_outbox_entries Entries.\n\
                    # TYPE gridlinks_forward_outbox_entries gauge\n\
                    gridlinks_forward_outbox_entries_total 9\n\
                    gridlinks_forward_outbox_entries 1234\n";
        assert_eq!(metric(text, "gridlinks_forward_outbox_entries"), Some(1234));
        assert_eq!(metric(text, "gridlinks_missing"), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_http_receiver_records_posted_events_and_can_be_stopped_and_resumed() {
        let a = arrivals();
        let r = HttpReceiver::start(Arc::clone(&a)).await.unwrap();
        let url = r.url();
        let post = move |body: &'static str| {
            let url = url.clone();
            tokio::task::spawn_blocking(move || match ureq::post(&url).send_string(body) {
                Ok(r) => r.status(),
                Err(ureq::Error::Status(code, _)) => code,
                Err(_) => 0,
            })
        };
        let body = r#"[{"seq":1,"type":"TELEMETRY","ts":1700000000000,"deviceName":"d0","values":{"t":1}}]"#;
        assert_eq!(post(body).await.unwrap(), 200);
        assert_eq!(post("not json").await.unwrap(), 400);
        r.stop().await;
        assert_eq!(post(body).await.unwrap(), 0, "refused while stopped");
        r.resume().await.unwrap();
        assert_eq!(post(body).await.unwrap(), 200);
        assert_eq!(a.unique(), 1);
        let inner = a.lock();
        assert_eq!((inner.telemetry, inner.malformed), (2, 1));
    }
}
