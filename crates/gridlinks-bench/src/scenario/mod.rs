//! The load scenarios and what they share: the resolved target with per-connection
//! credentials and source addresses, connect pacing, idling with keep-alive pings, and
//! the once-a-second progress line on stderr.

pub mod alarms;
pub mod coap_telemetry;
pub mod connect;
pub mod http_telemetry;
pub mod lamp_tcp;
pub mod ota_download;
pub mod provision;
pub mod pubsub;
pub mod telemetry;
pub mod tenant_flood;
pub mod ws_telemetry;

use std::borrow::Cow;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use gridlinks_codec::mqtt::{Packet, ProtocolVersion};
use hdrhistogram::Histogram;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cli::TargetArgs;
use crate::mqtt_client::{ClientOptions, ConnectionError, Endpoint, MqttConnection, TlsClient};
use crate::proc_stats::{self, ProcessStats};
use crate::report::{mib, per_second, thousands, LatencySummary};
use crate::stats::{buckets, new_histogram, Buckets, Counters, LatencyShards};
use crate::timeline::{Sample, Timeline};

/// Set in worker processes other than the first: no progress line (the first worker's
/// stands for all).
pub static QUIET: AtomicBool = AtomicBool::new(false);

/// File descriptors the generator needs besides its connections (stdio, epoll, the
/// runtime's wakers, files it reads).
const FD_HEADROOM: u64 = 64;

/// How connections authenticate.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// No user name.
    Anonymous,
    /// The same user name (and password) on every connection.
    Shared {
        /// MQTT user name.
        username: String,
        /// MQTT password, if any.
        password: Option<Bytes>,
    },
    /// Connection `i` uses token `i` as user name, without password.
    Tokens(Vec<String>),
}

/// A resolved target: where, from where, as whom.
#[derive(Debug)]
pub struct Target {
    /// Server address.
    pub server: SocketAddr,
    /// Local addresses connections are spread over (round robin); empty: OS chooses.
    pub sources: Vec<IpAddr>,
    /// Protocol version of every connection.
    pub version: ProtocolVersion,
    /// Authentication.
    pub credentials: Credentials,
    /// Client ids are `{prefix}-{index}`.
    pub client_id_prefix: String,
    /// TCP connect + CONNACK deadline.
    pub connect_timeout: Duration,
    /// Keep-alive sent in CONNECT.
    pub keep_alive: Duration,
    /// Handshakes in progress at most.
    pub max_pending: usize,
    /// Server process to observe.
    pub server_stats: Option<ProcessStats>,
    /// Index of this process's first connection in the run (`--workers`): connection
    /// `i` here is connection `offset + i` of the run (token, client id, source).
    pub offset: usize,
    /// MQTT over TLS (`--tls-ca`); `None`: plain TCP.
    pub tls: Option<TlsClient>,
}

impl Target {
    /// Plain-TCP connections to a server the tool started (`server`), connection `i` with
    /// token `i` of `tokens` and client id `{client_id_prefix}-{i}`: a 10 s connect
    /// deadline, a 60 s keep-alive and 64 handshakes at most in progress (`mqtt-telemetry`'s
    /// defaults).
    pub fn local_tokens(
        server: SocketAddr,
        sources: Vec<IpAddr>,
        version: ProtocolVersion,
        tokens: Vec<String>,
        client_id_prefix: &str,
    ) -> Self {
        Self {
            server,
            sources,
            version,
            credentials: Credentials::Tokens(tokens),
            client_id_prefix: client_id_prefix.to_owned(),
            connect_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(60),
            max_pending: 64,
            server_stats: None,
            offset: 0,
            tls: None,
        }
    }

    /// Resolves the options for a run of `connections` connections: looks the host up,
    /// reads the tokens file, checks the fd limit and the ephemeral-port supply.
    pub async fn resolve(args: &TargetArgs, connections: usize) -> anyhow::Result<Self> {
        let offset = args.worker_offset.unwrap_or(0);
        let server = tokio::net::lookup_host((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("resolving {}", args.host))?
            .find(|addr| match args.sources.first() {
                Some(src) => src.is_ipv4() == addr.is_ipv4(),
                None => true,
            })
            .with_context(|| format!("{} has no address of the sources' family", args.host))?;
        let credentials = match (&args.tokens_file, &args.username) {
            (Some(path), _) => Credentials::Tokens(read_devices(path, offset + connections)?.tokens),
            (None, Some(username)) => {
                Credentials::Shared { username: username.clone(), password: args.password.clone().map(Bytes::from) }
            }
            (None, None) => Credentials::Anonymous,
        };
        check_fd_limit(connections)?;
        warn_if_ports_short(connections, args.sources.len());
        let server_stats = server_stats(&args.server_pid)?;
        let tls = match &args.tls_ca {
            Some(ca) => Some(TlsClient::trusting(ca, &args.tls_server_name)?),
            None => None,
        };
        Ok(Target {
            server,
            sources: args.sources.clone(),
            version: args.mqtt_version.into(),
            credentials,
            client_id_prefix: args.client_id_prefix.clone(),
            connect_timeout: args.connect_timeout,
            keep_alive: Duration::from_secs(args.keep_alive.into()),
            max_pending: args.max_pending.max(1),
            server_stats,
            offset,
            tls,
        })
    }

    /// Where connection `index` connects from.
    pub fn endpoint(&self, index: usize) -> Endpoint {
        let index = self.offset + index;
        Endpoint {
            server: self.server,
            source: if self.sources.is_empty() { None } else { Some(self.sources[index % self.sources.len()]) },
        }
    }

    /// CONNECT contents of connection `index`.
    pub fn client_options(&self, index: usize) -> ClientOptions {
        let index = self.offset + index;
        let (username, password) = match &self.credentials {
            Credentials::Anonymous => (None, None),
            Credentials::Shared { username, password } => (Some(username.clone()), password.clone()),
            Credentials::Tokens(tokens) => (Some(tokens[index].clone()), None),
        };
        ClientOptions {
            client_id: format!("{}-{index}", self.client_id_prefix),
            username,
            password,
            keep_alive: self.keep_alive,
            version: self.version,
            connect_timeout: self.connect_timeout,
            session_expiry: None,
            tls: self.tls.clone(),
        }
    }

    /// How often an otherwise silent connection sends PINGREQ: 3/4 of the keep-alive,
    /// so a server that allows exactly the keep-alive never times it out.
    pub fn ping_interval(&self) -> Duration {
        if self.keep_alive.is_zero() {
            // No keep-alive: never ping (a year is "never" for a benchmark).
            Duration::from_secs(365 * 24 * 3600)
        } else {
            self.keep_alive * 3 / 4
        }
    }

    /// `host:port` for reports.
    pub fn name(&self) -> String {
        self.server.to_string()
    }

    /// The MQTT version as reports print it: `3.1.1`, or over TLS with what the first
    /// handshake negotiated, e.g. `3.1.1 over TLS (TLSv1_3, TLS13_AES_256_GCM_SHA384,
    /// X25519)`.
    pub fn version_label(&self, version: crate::cli::MqttVersion) -> String {
        match self.tls.as_ref().map(TlsClient::negotiated) {
            None => version.label().to_string(),
            Some(None) => format!("{} over TLS", version.label()),
            Some(Some(negotiated)) => format!("{} over TLS ({negotiated})", version.label()),
        }
    }

    /// A server sample, when a server pid was given.
    pub fn server_sample(&self) -> anyhow::Result<Option<proc_stats::Sample>> {
        match &self.server_stats {
            Some(s) => Ok(Some(s.sample().context("reading server /proc")?)),
            None => Ok(None),
        }
    }
}

/// How long the publishing window lasts: `--duration`, or until each connection sent
/// its message count (`None`), or 10 s when neither is given.
pub(crate) fn window_duration(duration: Option<Duration>, count: Option<u64>) -> Option<Duration> {
    match (duration, count) {
        (Some(d), _) => Some(d),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(10)),
    }
}

/// The non-empty lines of `path`, trimmed; fails when there are fewer than `needed`
/// (`what` names them in the message).
pub(crate) fn read_lines(path: &std::path::Path, needed: usize, what: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {what} file {}", path.display()))?;
    let lines: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    if lines.len() < needed {
        bail!("{} has {} {what} but {needed} connections need one each", path.display(), lines.len());
    }
    Ok(lines)
}

/// The devices of a tokens file: one access token a line, or CSV lines `NAME,TOKEN`
/// (more columns are ignored; a first line `name,token` is a header).
#[derive(Debug, PartialEq)]
pub(crate) struct DevicesFile {
    /// Token of each device, in file order.
    pub tokens: Vec<String>,
    /// Names, when the file is CSV.
    pub names: Option<Vec<String>>,
}

/// Reads a tokens file; fails when it has fewer than `needed` devices.
pub(crate) fn read_devices(path: &std::path::Path, needed: usize) -> anyhow::Result<DevicesFile> {
    let mut lines = read_lines(path, needed, "tokens")?;
    if lines.first().is_some_and(|l| l.replace(' ', "").eq_ignore_ascii_case("name,token")) {
        lines.remove(0);
        if lines.len() < needed {
            bail!("{} has {} devices but {needed} are needed", path.display(), lines.len());
        }
    }
    if !lines.iter().any(|l| l.contains(',')) {
        return Ok(DevicesFile { tokens: lines, names: None });
    }
    let mut names = Vec::with_capacity(lines.len());
    let mut tokens = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let mut fields = line.split(',').map(str::trim);
        match (fields.next(), fields.next()) {
            (Some(name), Some(token)) if !name.is_empty() && !token.is_empty() => {
                names.push(name.to_string());
                tokens.push(token.to_string());
            }
            _ => bail!("{} line {}: expected NAME,TOKEN", path.display(), i + 1),
        }
    }
    Ok(DevicesFile { tokens, names: Some(names) })
}

/// Fails early when the open-files limit cannot hold `connections` sockets.
pub(crate) fn check_fd_limit(connections: usize) -> anyhow::Result<()> {
    if let Some(limit) = proc_stats::open_files_limit() {
        let needed = connections as u64 + FD_HEADROOM;
        if needed > limit {
            bail!(
                "open-files limit is {limit} but {connections} connections need about {needed}: \
                 raise `ulimit -n` or use fewer connections"
            );
        }
    }
    Ok(())
}

/// Warns when the connections exceed the ephemeral ports of the source addresses.
fn warn_if_ports_short(connections: usize, sources: usize) {
    let Ok(range) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return;
    };
    let mut it = range.split_whitespace().filter_map(|s| s.parse::<usize>().ok());
    if let (Some(lo), Some(hi)) = (it.next(), it.next()) {
        let ports = (hi.saturating_sub(lo) + 1) * sources.max(1);
        if connections > ports {
            eprintln!(
                "warning: {connections} connections but only ~{ports} ephemeral ports on {} \
                 source address(es): add --sources 127.0.0.2,127.0.0.3,...",
                sources.max(1)
            );
        }
    }
}

/// Hands out connection slots at a steady rate, with a cap on handshakes in progress.
pub struct ConnectPacer {
    /// When connection 0 was due.
    start: Instant,
    /// Time between two connection starts; zero: unpaced.
    gap: Duration,
    /// One permit per handshake in progress.
    pending: Arc<Semaphore>,
}

impl ConnectPacer {
    /// `rate` connections per second (0 or less: unpaced), at most `max_pending` at once.
    pub fn new(rate: f64, max_pending: usize) -> Self {
        ConnectPacer {
            start: Instant::now(),
            gap: if rate > 0.0 { Duration::from_secs_f64(1.0 / rate) } else { Duration::ZERO },
            pending: Arc::new(Semaphore::new(max_pending)),
        }
    }

    /// Waits until connection `index` is due and a handshake slot is free; the permit is
    /// released when dropped (after CONNACK or failure).
    pub async fn slot(&self, index: usize) -> OwnedSemaphorePermit {
        if !self.gap.is_zero() {
            tokio::time::sleep_until(self.start + self.gap.mul_f64(index as f64)).await;
        }
        Arc::clone(&self.pending).acquire_owned().await.expect("the pacer's semaphore is never closed")
    }
}

/// Keeps `conn` alive (reading whatever the server sends, PINGREQ every `ping_every` of
/// silence) until `until` completes. Counts PINGREQs in `pings`.
pub async fn idle_until<F: Future>(
    conn: &mut MqttConnection,
    until: F,
    ping_every: Duration,
    pings: &AtomicU64,
) -> Result<F::Output, ConnectionError> {
    tokio::pin!(until);
    let mut next_ping = Instant::now() + ping_every;
    loop {
        let event = tokio::select! {
            out = &mut until => return Ok(out),
            packet = conn.read_packet() => Some(packet),
            _ = tokio::time::sleep_until(next_ping) => None,
        };
        match event {
            Some(Ok(Packet::Disconnect(_))) => return Err(ConnectionError::Closed),
            Some(Ok(_)) => {} // PINGRESP, or anything else a server may push
            Some(Err(e)) => return Err(e),
            None => {
                conn.queue(&Packet::PingReq).expect("PINGREQ always encodes");
                conn.flush().await?;
                pings.fetch_add(1, Ordering::Relaxed);
                next_ping = Instant::now() + ping_every;
            }
        }
    }
}

/// Waits until the watch holds `Some` value and returns it; `None` if the sender is gone.
pub async fn wait_for_some<T: Clone>(rx: &mut watch::Receiver<Option<T>>) -> Option<T> {
    rx.wait_for(Option::is_some).await.ok().and_then(|v| v.clone())
}

/// What the progress line shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressKind {
    /// Connections and publish counters.
    Telemetry,
    /// Connections only.
    Connect,
    /// Connections, publish counters and deliveries to subscribers.
    Pubsub,
}

/// What the progress task observes.
pub struct ProgressSources {
    /// The run's counters.
    pub counters: Arc<Counters>,
    /// The server process, with `--server-pid`.
    pub server: Option<ProcessStats>,
    /// Acknowledgement latencies (PUBACK, CONNACK, HTTP response), for per-second
    /// percentiles.
    pub ack_latency: Option<Arc<LatencyShards>>,
    /// End-to-end latencies (publish to delivery), for per-second percentiles.
    pub e2e_latency: Option<Arc<LatencyShards>>,
    /// Keep each second's latency histogram in the timeline too (a worker process:
    /// its parent merges them with the other workers').
    pub keep_buckets: bool,
}

/// The per-second progress line on stderr and the timeline it samples, until
/// [`Progress::finish`] or drop.
pub struct Progress {
    /// The printing task.
    task: JoinHandle<()>,
    /// Phase shown at the start of the line.
    phase: watch::Sender<&'static str>,
    /// Highest server VmRSS seen since the last [`Progress::reset_peak`], KiB.
    rss_peak: Arc<AtomicU64>,
    /// One sample a second.
    timeline: Arc<Mutex<Timeline>>,
}

impl Progress {
    /// Starts sampling and printing once a second.
    pub fn start(kind: ProgressKind, sources: ProgressSources, phase: &'static str) -> Self {
        let (phase_tx, phase_rx) = watch::channel(phase);
        let rss_peak = Arc::new(AtomicU64::new(0));
        let timeline = Arc::new(Mutex::new(Timeline::default()));
        let task =
            tokio::spawn(sample_every_second(kind, sources, phase_rx, Arc::clone(&rss_peak), Arc::clone(&timeline)));
        Progress { task, phase: phase_tx, rss_peak, timeline }
    }

    /// Changes the phase shown.
    pub fn set_phase(&self, phase: &'static str) {
        self.phase.send_replace(phase);
    }

    /// Starts a new peak from `rss_kib`.
    pub fn reset_peak(&self, rss_kib: u64) {
        self.rss_peak.store(rss_kib, Ordering::Relaxed);
    }

    /// Highest RSS seen since the last reset, including `rss_kib` seen by the caller.
    pub fn peak(&self, rss_kib: u64) -> u64 {
        self.rss_peak.fetch_max(rss_kib, Ordering::Relaxed).max(rss_kib)
    }

    /// Stops sampling; the samples taken.
    pub fn finish(self) -> Timeline {
        self.task.abort();
        let timeline = self.timeline.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        timeline.clone()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Interval percentiles of a sharded histogram: each call returns what was recorded
/// since the previous one.
struct IntervalLatency {
    shards: Arc<LatencyShards>,
    previous: Histogram<u64>,
}

impl IntervalLatency {
    fn new(shards: Arc<LatencyShards>) -> Self {
        IntervalLatency { shards, previous: new_histogram() }
    }

    /// The values recorded since the last call.
    fn next(&mut self) -> Histogram<u64> {
        let now = self.shards.merged();
        let mut delta = now.clone();
        // `previous` is a snapshot of the same, only growing, counts.
        let _ = delta.subtract(&self.previous);
        self.previous = now;
        delta
    }
}

/// The summary of one interval's latencies and, when kept, its buckets.
fn interval(latency: Option<&mut IntervalLatency>, keep_buckets: bool) -> (Option<LatencySummary>, Option<Buckets>) {
    match latency.map(IntervalLatency::next) {
        Some(h) => (Some(LatencySummary::from_histogram(&h)), keep_buckets.then(|| buckets(&h))),
        None => (None, None),
    }
}

/// The progress task: a line on stderr and a timeline sample every second.
async fn sample_every_second(
    kind: ProgressKind,
    sources: ProgressSources,
    phase: watch::Receiver<&'static str>,
    peak: Arc<AtomicU64>,
    timeline: Arc<Mutex<Timeline>>,
) {
    let counters = sources.counters;
    let mut ack_latency = sources.ack_latency.map(IntervalLatency::new);
    let mut e2e_latency = sources.e2e_latency.map(IntervalLatency::new);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await;
    let mut last: (Instant, u64, u64, Option<f64>) = (Instant::now(), 0, 0, None);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let dt = (now - last.0).as_secs_f64();
        // Counters before latencies: the scenarios record a latency before they count
        // its event, so a sample has the latency of every event it counts, apart from
        // values still in a connection's batch (at most `stats::FLUSH_EVERY` old).
        let acked = Counters::get(&counters.acked);
        let received = Counters::get(&counters.received);
        let connected = Counters::get(&counters.connected);
        let connect_failed = Counters::get(&counters.connect_failed);
        let sent = Counters::get(&counters.sent);
        let failed = Counters::get(&counters.failed);
        let (ack, ack_buckets) = interval(ack_latency.as_mut(), sources.keep_buckets);
        let (e2e, e2e_buckets) = interval(e2e_latency.as_mut(), sources.keep_buckets);
        let mut sample = Sample {
            t: (now - started).as_secs_f64(),
            phase: Cow::Borrowed(*phase.borrow()),
            connected,
            connect_failed,
            sent,
            acked,
            failed,
            received,
            acked_per_second: per_second(acked.saturating_sub(last.1) as f64, dt),
            received_per_second: per_second(received.saturating_sub(last.2) as f64, dt),
            ack_latency: ack,
            e2e_latency: e2e,
            server_cpu_percent: None,
            server_rss_kib: None,
            ack_buckets,
            e2e_buckets,
        };
        let mut line = format!(
            "[{:>4}s] {:<13} conns {} ok {} failed {} lost",
            started.elapsed().as_secs(),
            sample.phase,
            thousands(sample.connected),
            thousands(sample.connect_failed),
            thousands(Counters::get(&counters.dropped)),
        );
        if kind != ProgressKind::Connect {
            line.push_str(&format!(
                " | sent {} acked {} ({}/s) failed {}",
                thousands(sample.sent),
                thousands(acked),
                thousands(sample.acked_per_second as u64),
                thousands(sample.failed),
            ));
        }
        if kind == ProgressKind::Pubsub {
            line.push_str(&format!(
                " | received {} ({}/s)",
                thousands(received),
                thousands(sample.received_per_second as u64),
            ));
        }
        let mut cpu = last.3;
        if let Some(Ok(s)) = sources.server.as_ref().map(ProcessStats::sample) {
            peak.fetch_max(s.memory.rss_kib, Ordering::Relaxed);
            sample.server_rss_kib = Some(s.memory.rss_kib);
            if let Some(before) = last.3 {
                let percent = 100.0 * (s.cpu_seconds - before) / dt;
                sample.server_cpu_percent = Some(percent);
                line.push_str(&format!(" | server cpu {percent:.0}%"));
            }
            line.push_str(&format!(" rss {}", mib(s.memory.rss_kib)));
            cpu = Some(s.cpu_seconds);
        }
        if !QUIET.load(Ordering::Relaxed) {
            eprintln!("{line}");
        }
        timeline.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).samples.push(sample);
        last = (now, acked, received, cpu);
    }
}

/// The observed server processes (`--server-pid`), if any.
pub(crate) fn server_stats(pids: &[u32]) -> anyhow::Result<Option<ProcessStats>> {
    if pids.is_empty() {
        return Ok(None);
    }
    Ok(Some(ProcessStats::group(pids).with_context(|| format!("reading /proc of the server's processes {pids:?}"))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_files_are_plain_or_csv_with_names() {
        let dir = std::env::temp_dir().join(format!("gl-bench-devices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("plain");
        std::fs::write(&plain, "t1\nt2\n\n").unwrap();
        assert_eq!(
            read_devices(&plain, 2).unwrap(),
            DevicesFile { tokens: vec!["t1".into(), "t2".into()], names: None }
        );
        assert!(read_devices(&plain, 3).is_err(), "too few devices");
        let csv = dir.join("csv");
        std::fs::write(&csv, "name,token\nmeter-1, tok1 ,extra\nmeter-2,tok2\n").unwrap();
        let d = read_devices(&csv, 2).unwrap();
        assert_eq!(d.tokens, ["tok1", "tok2"]);
        assert_eq!(d.names.unwrap(), ["meter-1", "meter-2"]);
        assert!(read_devices(&csv, 3).is_err(), "the header is not a device");
        std::fs::write(&csv, "a,b\nc\n").unwrap();
        assert!(read_devices(&csv, 1).is_err(), "a CSV line without token");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
