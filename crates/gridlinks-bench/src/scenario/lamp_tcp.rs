//! `lamp-tcp`: single-lamp controllers over GridLinks' custom TCP protocol.
//!
//! For each decoder asked for (native, then the shipped script), the tool starts a fresh
//! GridLinks with one lamp listener (`auto_provision = true`) and:
//!
//! 1. **connect**: N controllers connect (paced) and log in; each login is answered once the
//!    device exists. Server RSS before and after gives the memory per connection.
//! 2. **report**: for `--duration`, every controller sends property reports (58-byte frames,
//!    sequence numbers from 2), as fast as replies allow (`--window` unanswered at most) or
//!    at `--rate` reports/s over all controllers. Each reply is checked (control code `81`,
//!    same sequence number); its latency is measured from the report's send time, or from
//!    its scheduled time at a fixed rate. At a fixed rate every report due within
//!    `--duration` is sent, however late, so the count sent follows from rate and duration.
//! 3. **drain**: controllers wait for their last replies, then close.
//! 4. **verify** (`--verify`): every answered sequence number must be stored, as the `seq`
//!    of device `lamp-{id}` (the server stamps reports itself, so the check reads values).
//!
//! Reports per second are answered reports over the report phase; per CPU-second, over the
//! server's CPU time in that phase (from /proc).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::BytesMut;
use gridlinks_framing::{Framer, FramingSpec, Next};
use gridlinks_protocols::lamp::{self, Report};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use tokio::time::Instant;

use super::ConnectPacer;
use crate::cli::{LampDecoder, LampTcpArgs};
use crate::loss_check::{self, AckLog, Acked, DeviceAcks, LossReport};
use crate::proc_stats::ProcessStats;
use crate::report::LatencySummary;
use crate::servers::{free_port, Binaries, ManagedServer};
use crate::stats::LatencyShards;

/// Longest wait for a reply before a controller gives up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes (connect + login) in progress at once.
const MAX_PENDING: usize = 256;

/// One decoder's run.
#[derive(Debug, Serialize)]
pub struct LampRun {
    /// `native` or `script`.
    pub decoder: String,
    /// Controllers logged in.
    pub controllers: usize,
    /// Controllers that failed (connect, login, a missing or wrong reply).
    pub failed: usize,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// Offered rate (0: as fast as replies allow).
    pub rate: f64,
    /// Seconds of the report phase.
    pub seconds: f64,
    /// Reports sent: at a fixed rate, every report due before the end of the phase,
    /// however late the machine gets to it, so the count follows from rate and duration.
    pub sent: u64,
    /// Reports answered within the report phase.
    pub replies: u64,
    /// Reports answered in all, including those answered after the phase's end.
    pub answered: u64,
    /// Answered reports per second.
    pub reports_per_second: f64,
    /// Server CPU seconds in the report phase.
    pub server_cpu_seconds: f64,
    /// Answered reports per server CPU-second.
    pub reports_per_cpu_second: f64,
    /// Server RSS growth per logged-in connection, KiB.
    pub rss_kib_per_connection: f64,
    /// Server RSS at the end of the report phase, MiB.
    pub rss_mib: f64,
    /// Report → reply latency.
    pub latency: LatencySummary,
    /// The loss check, with `--verify`.
    pub loss_check: Option<serde_json::Value>,
    #[serde(skip)]
    loss: Option<LossReport>,
}

/// Runs the scenario for each decoder and prints the results.
pub async fn run(mut args: LampTcpArgs) -> anyhow::Result<std::process::ExitCode> {
    if args.preset.is_some() {
        // The published test: 10,000 parallel controllers for 120 s.
        args.controllers = ((10_000.0 * args.scale).round() as usize).max(1);
        args.duration = Duration::from_secs_f64(120.0 * args.scale);
    }
    super::check_fd_limit(args.controllers)?;
    let bins = Binaries::with_gridlinks(args.server.gridlinks_bin.as_deref());
    let mut runs = Vec::new();
    for &decoder in &args.decoders {
        eprintln!("=== lamp-tcp, {} decoder: {} controllers", label(decoder), args.controllers);
        runs.push(run_one(&args, &bins, decoder).await?);
    }
    println!("{}", human(&args, &runs));
    if let Some(path) = &args.server.json {
        let doc = serde_json::json!({"scenario": "lamp-tcp", "runs": runs});
        crate::report::write_json(path, &doc)?;
    }
    let passed = runs.iter().all(|r| r.failed == 0 && r.loss.as_ref().is_none_or(LossReport::passed));
    Ok(crate::exit_code(passed))
}

fn label(d: LampDecoder) -> &'static str {
    match d {
        LampDecoder::Native => "native",
        LampDecoder::Script => "script",
    }
}

/// The server's configuration: one lamp listener on `port`.
fn config(args: &LampTcpArgs, port: u16, decoder: LampDecoder) -> anyhow::Result<String> {
    let script = match decoder {
        LampDecoder::Native => String::new(),
        LampDecoder::Script => {
            let path = match &args.script {
                Some(p) => std::fs::canonicalize(p).with_context(|| format!("--script {}", p.display()))?,
                None => find_script()?,
            };
            format!("script = {:?}\n", path.display().to_string())
        }
    };
    Ok(format!(
        "[mqtt]\nmax_connections = {}\n[http]\nmax_connections = 64\n\n[[tcp.listeners]]\nbind = \"127.0.0.1:{port}\"\nprotocol = \"lamp\"\nauto_provision = true\n{script}",
        args.controllers + 100
    ))
}

/// protocols/lamp.js: from the working directory up (a checkout), else beside the binary.
fn find_script() -> anyhow::Result<std::path::PathBuf> {
    let mut dir = std::env::current_dir()?;
    loop {
        let candidate = dir.join("protocols/lamp.js");
        if candidate.is_file() {
            return Ok(candidate);
        }
        if !dir.pop() {
            bail!("protocols/lamp.js not found in the working directory or above: run from a GridLinks checkout");
        }
    }
}

/// What every controller shares.
struct Shared {
    port: u16,
    sources: Vec<IpAddr>,
    pacer: ConnectPacer,
    /// Everyone logged in (or failed): the report phase starts.
    logged_in: Barrier,
    /// When the report phase starts and ends (set by the coordinator after the barrier).
    phase: tokio::sync::watch::Receiver<Option<(Instant, Instant)>>,
    latency: Arc<LatencyShards>,
    replies: AtomicU64,
    sent: AtomicU64,
    answered: AtomicU64,
    /// Seconds between two reports of one controller at a fixed rate (None: as fast as replies allow).
    period: Option<Duration>,
    window: usize,
    controllers: usize,
}

async fn run_one(args: &LampTcpArgs, bins: &Binaries, decoder: LampDecoder) -> anyhow::Result<LampRun> {
    let port = free_port()?;
    let server = ManagedServer::start_gridlinks_with(bins, &config(args, port, decoder)?, None)
        .await
        .context("starting gridlinks")?;
    let proc = ProcessStats::new(server.pid())?;
    let rss_before = proc.memory()?.rss_kib;
    let n = args.controllers;
    let (phase_tx, phase_rx) = tokio::sync::watch::channel(None);
    let shared = Arc::new(Shared {
        port,
        sources: args.server.sources.clone(),
        pacer: ConnectPacer::new(args.connect_rate, MAX_PENDING),
        logged_in: Barrier::new(n + 1),
        phase: phase_rx,
        latency: LatencyShards::new(16),
        replies: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        answered: AtomicU64::new(0),
        period: (args.rate > 0.0).then(|| Duration::from_secs_f64(n as f64 / args.rate)),
        window: usize::from(args.window),
        controllers: n,
    });
    let tasks: Vec<_> = (0..n).map(|i| tokio::spawn(controller(shared.clone(), i))).collect();
    shared.logged_in.wait().await;
    let rss_connected = proc.memory()?.rss_kib;
    let cpu_start = proc.cpu_seconds()?;
    let start = Instant::now() + Duration::from_millis(200);
    let end = start + args.duration;
    let _ = phase_tx.send(Some((start, end)));
    tokio::time::sleep_until(end).await;
    let cpu = proc.cpu_seconds()? - cpu_start;
    let replies = shared.replies.load(Ordering::Relaxed);
    let rss_end = proc.memory()?.rss_kib;
    let mut acks = Vec::with_capacity(n);
    let (mut failed, mut first_error) = (0, None);
    for t in tasks {
        let (device, outcome) = t.await?;
        if let Err(e) = outcome {
            failed += 1;
            first_error.get_or_insert(e);
        }
        acks.push(device);
    }
    let seconds = args.duration.as_secs_f64();
    let loss = if args.server.verify {
        let (base, password) = server.api().context("gridlinks has an API")?;
        let api = crate::rest_api::ApiTarget { base, user: "admin".into(), password };
        let by =
            Acked::SeqValue { start: loss_check::unix_millis() - 3_600_000, end: loss_check::unix_millis() + 60_000 };
        Some(tokio::task::spawn_blocking(move || loss_check::check_by(&api, &acks, 8, by)).await??)
    } else {
        None
    };
    server.stop().await?;
    Ok(LampRun {
        decoder: label(decoder).into(),
        controllers: n - failed,
        failed,
        first_error,
        rate: args.rate,
        seconds,
        sent: shared.sent.load(Ordering::Relaxed),
        replies,
        answered: shared.answered.load(Ordering::Relaxed),
        reports_per_second: replies as f64 / seconds,
        server_cpu_seconds: cpu,
        reports_per_cpu_second: if cpu > 0.0 { replies as f64 / cpu } else { 0.0 },
        rss_kib_per_connection: rss_connected.saturating_sub(rss_before) as f64 / n as f64,
        rss_mib: rss_end as f64 / 1024.0,
        latency: LatencySummary::from_histogram(&shared.latency.merged()),
        loss_check: loss.as_ref().map(LossReport::to_json),
        loss,
    })
}

/// One controller: connect, log in, report until the phase ends, drain. Returns its
/// answered sequence numbers (as the ack log's points) and how it ended.
async fn controller(shared: Arc<Shared>, index: usize) -> (DeviceAcks, Result<(), String>) {
    let id = index as u64 + 1;
    let address: [u8; 6] = id.to_be_bytes()[2..].try_into().expect("6 of 8 bytes");
    let mut acks = AckLog::default();
    let name = format!("lamp-{}", lamp::identity(&address));
    let logged_in = login(&shared, index, &address).await;
    shared.logged_in.wait().await;
    let outcome = match logged_in {
        Ok(conn) => report(&shared, index, &address, conn, &mut acks).await,
        Err(e) => Err(e),
    };
    (DeviceAcks { name, acks }, outcome.map_err(|e| format!("controller {id}: {e}")))
}

type Conn = (TcpStream, Framer, BytesMut);

async fn login(shared: &Shared, index: usize, address: &[u8; 6]) -> Result<Conn, String> {
    let _slot = shared.pacer.slot(index).await;
    let target = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), shared.port);
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    if !shared.sources.is_empty() {
        let source = shared.sources[index % shared.sources.len()];
        socket.bind(SocketAddr::new(source, 0)).map_err(|e| format!("bind {source}: {e}"))?;
    }
    let mut stream = tokio::time::timeout(REPLY_TIMEOUT, socket.connect(target))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream.write_all(&lamp::login_frame(address, 1)).await.map_err(|e| format!("login: {e}"))?;
    let mut framer = Framer::new(Arc::new(FramingSpec::lamp()));
    let mut buf = BytesMut::with_capacity(512);
    let reply = next_reply(&mut stream, &mut framer, &mut buf).await?;
    if reply != lamp::reply(lamp::LOGIN, address, 1) {
        return Err(format!("unexpected login reply {reply:02x?}"));
    }
    Ok((stream, framer, buf))
}

/// The next whole frame from the server.
async fn next_reply(stream: &mut TcpStream, framer: &mut Framer, buf: &mut BytesMut) -> Result<Vec<u8>, String> {
    loop {
        match framer.next(buf) {
            Next::Frame(f) => return Ok(f.to_vec()),
            Next::NeedMore => {}
            Next::Skipped(_, e) | Next::Lost(e) => return Err(format!("bad reply frame: {e}")),
        }
        match tokio::time::timeout(REPLY_TIMEOUT, stream.read_buf(buf)).await {
            Err(_) => return Err("no reply within 10 s".into()),
            Ok(Ok(0)) => return Err("connection closed by the server".into()),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Ok(Ok(_)) => {}
        }
    }
}

async fn report(
    shared: &Shared,
    index: usize,
    address: &[u8; 6],
    (mut stream, mut framer, mut buf): Conn,
    acks: &mut AckLog,
) -> Result<(), String> {
    let mut phase = shared.phase.clone();
    let (start, end) = super::wait_for_some(&mut phase).await.ok_or("the run was abandoned")?;
    let mut latency = shared.latency.recorder(index);
    // Fixed rate: controller i's k-th report is due at start + offset_i + k·period.
    let offset = shared.period.map(|p| p.mul_f64(index as f64 / shared.controllers as f64));
    let mut seq: u32 = 1;
    let mut sent: VecDeque<(u32, Instant)> = VecDeque::with_capacity(shared.window);
    tokio::time::sleep_until(start).await;
    let mut k = 0u32;
    loop {
        let now = Instant::now();
        let due = match (shared.period, offset) {
            (Some(p), Some(o)) => start + o + p * k,
            // As fast as replies allow: the first report is due at the start, so each
            // controller reports at least once however late its task runs.
            _ if k == 0 => start,
            _ => now,
        };
        // At a fixed rate every report due before the end is sent, late or not.
        let more = due < end;
        let may_send = more && sent.len() < shared.window.max(1) && due <= now;
        if may_send {
            seq += 1;
            k += 1;
            let r = Report {
                status: 1,
                voltage_cv: 22_000 + seq % 1000,
                energy_wh: seq,
                power_w: 40.0 + (seq % 10) as f32,
                dim: 100,
                temperature: 20,
            };
            stream.write_all(&lamp::report_frame(address, seq, &r)).await.map_err(|e| format!("write: {e}"))?;
            shared.sent.fetch_add(1, Ordering::Relaxed);
            sent.push_back((seq, due));
            continue;
        }
        if sent.is_empty() {
            if !more {
                break;
            }
            tokio::time::sleep_until(due).await;
            continue;
        }
        let reply = next_reply(&mut stream, &mut framer, &mut buf).await?;
        let (want, at) = sent.pop_front().expect("non-empty");
        if reply != lamp::reply(lamp::REPORT, address, want) {
            return Err(format!("unexpected reply to report {want}: {reply:02x?}"));
        }
        latency.record(at.elapsed());
        acks.push(u64::from(want), loss_check::unix_millis());
        shared.answered.fetch_add(1, Ordering::Relaxed);
        if Instant::now() <= end {
            shared.replies.fetch_add(1, Ordering::Relaxed);
        }
    }
    latency.flush();
    Ok(())
}

fn human(args: &LampTcpArgs, runs: &[LampRun]) -> String {
    let mut s = format!(
        "lamp-tcp: {} controllers, {} s, {}\n",
        args.controllers,
        args.duration.as_secs_f64(),
        if args.rate > 0.0 { format!("{} reports/s offered", args.rate) } else { "as fast as replies allow".into() }
    );
    s.push_str("decoder  reports/s   per CPU-s   p50 ms   p99 ms   RSS/conn KiB   failed   loss check\n");
    for r in runs {
        s.push_str(&format!(
            "{:<8} {:>9.0}   {:>9.0}   {:>6.2}   {:>6.2}   {:>12.1}   {:>6}   {}\n",
            r.decoder,
            r.reports_per_second,
            r.reports_per_cpu_second,
            r.latency.p50_us as f64 / 1000.0,
            r.latency.p99_us as f64 / 1000.0,
            r.rss_kib_per_connection,
            r.failed,
            r.loss.as_ref().map_or("not run".into(), LossReport::verdict),
        ));
        if let Some(e) = &r.first_error {
            s.push_str(&format!("         first failure: {e}\n"));
        }
    }
    s
}
