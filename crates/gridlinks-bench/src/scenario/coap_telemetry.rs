//! `coap-telemetry`: N devices post ThingsBoard telemetry over CoAP (confirmable POSTs to
//! `/api/v1/{token}/telemetry`) to a GridLinks the tool starts, each device with its own
//! UDP socket and one request in flight, as fast as ACKs allow or at `--rate` in total.
//!
//! Each payload is `{"ts":T,"values":{"seq":N}}` with a timestamp unique per device, so the
//! loss check (`--verify`) finds every acknowledged point by its `ts`. A request without an
//! answer within 2 s is retransmitted with the same message id (RFC 7252's
//! ACK_TIMEOUT, doubling, at most 4 times); the server's deduplication must store it once.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use coap_lite::{CoapOption, MessageClass, MessageType, Packet, RequestType, ResponseType};
use serde::Serialize;
use tokio::net::UdpSocket;
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::cli::CoapTelemetryArgs;
use crate::loss_check::{self, AckLog, DeviceAcks, LossReport};
use crate::proc_stats::ProcessStats;
use crate::report::LatencySummary;
use crate::rest_api::{random_tokens, ApiTarget, RestClient};
use crate::servers::{free_udp_port, Binaries, ManagedServer};
use crate::stats::LatencyShards;

/// First retransmission timeout (RFC 7252 ACK_TIMEOUT); it doubles per retransmission.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// Retransmissions before a request counts as failed (MAX_RETRANSMIT).
const MAX_RETRANSMIT: u32 = 4;

/// The run's figures.
#[derive(Debug, Serialize)]
pub struct CoapRun {
    /// Devices.
    pub devices: usize,
    /// Devices that stopped on an error (a 4.xx/5.xx, or no answer after retransmissions).
    pub failed: usize,
    /// The first such error.
    pub first_error: Option<String>,
    /// Offered rate (0: as fast as ACKs allow).
    pub rate: f64,
    /// Seconds of the load.
    pub seconds: f64,
    /// Requests sent (first transmissions): at a fixed rate, every request due before the
    /// end of the load, however late the machine gets to it; so the count follows from
    /// the rate and duration alone.
    pub sent: u64,
    /// Requests answered 2.01 within the load.
    pub acked: u64,
    /// Requests answered 2.01 in all, including those answered after the load's end.
    pub answered: u64,
    /// Retransmissions sent.
    pub retransmissions: u64,
    /// Answered requests per second.
    pub msgs_per_second: f64,
    /// Server CPU seconds during the load.
    pub server_cpu_seconds: f64,
    /// Answered requests per server CPU-second.
    pub msgs_per_cpu_second: f64,
    /// Request → response latency.
    pub latency: LatencySummary,
    /// The loss check, with `--verify`.
    pub loss_check: Option<serde_json::Value>,
    #[serde(skip)]
    loss: Option<LossReport>,
}

/// What every device task shares.
struct Shared {
    port: u16,
    sources: Vec<IpAddr>,
    start: Barrier,
    phase: tokio::sync::watch::Receiver<Option<(Instant, Instant)>>,
    latency: Arc<LatencyShards>,
    acked: AtomicU64,
    sent: AtomicU64,
    answered: AtomicU64,
    retransmissions: AtomicU64,
    period: Option<Duration>,
    devices: usize,
}

/// Runs the scenario and prints its figures.
pub async fn run(args: CoapTelemetryArgs) -> anyhow::Result<std::process::ExitCode> {
    super::check_fd_limit(args.devices)?;
    let bins = Binaries::with_gridlinks(args.server.gridlinks_bin.as_deref());
    let port = free_udp_port()?;
    let server = ManagedServer::start_gridlinks_with(&bins, "", Some(port)).await.context("starting gridlinks")?;
    let (base, password) = server.api().context("gridlinks has an API")?;
    let api = ApiTarget { base, user: "admin".into(), password };
    let n = args.devices;
    let names: Vec<String> = (0..n).map(|i| format!("coap-{i}")).collect();
    let tokens = random_tokens(n)?;
    {
        let (api, names, tokens) = (api.clone(), names.clone(), tokens.clone());
        tokio::task::spawn_blocking(move || RestClient::login(&api)?.bulk_import(&names, &tokens)).await??;
    }
    let proc = ProcessStats::new(server.pid())?;
    let (phase_tx, phase_rx) = tokio::sync::watch::channel(None);
    let shared = Arc::new(Shared {
        port,
        sources: args.server.sources.clone(),
        start: Barrier::new(n + 1),
        phase: phase_rx,
        latency: LatencyShards::new(16),
        acked: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        answered: AtomicU64::new(0),
        retransmissions: AtomicU64::new(0),
        period: (args.rate > 0.0).then(|| Duration::from_secs_f64(n as f64 / args.rate)),
        devices: n,
    });
    let tasks: Vec<_> =
        tokens.into_iter().enumerate().map(|(i, token)| tokio::spawn(device(shared.clone(), i, token))).collect();
    shared.start.wait().await;
    let cpu_start = proc.cpu_seconds()?;
    let start = Instant::now() + Duration::from_millis(200);
    let end = start + args.duration;
    let _ = phase_tx.send(Some((start, end)));
    tokio::time::sleep_until(end).await;
    let cpu = proc.cpu_seconds()? - cpu_start;
    let acked = shared.acked.load(Ordering::Relaxed);
    let (mut failed, mut first_error, mut devices) = (0, None, Vec::with_capacity(n));
    for (t, name) in tasks.into_iter().zip(names) {
        let (acks, outcome) = t.await?;
        if let Err(e) = outcome {
            failed += 1;
            first_error.get_or_insert(e);
        }
        devices.push(DeviceAcks { name, acks });
    }
    let loss = if args.server.verify {
        Some(tokio::task::spawn_blocking(move || loss_check::check(&api, &devices, 8)).await??)
    } else {
        None
    };
    server.stop().await?;
    let seconds = args.duration.as_secs_f64();
    let run = CoapRun {
        devices: n,
        failed,
        first_error,
        rate: args.rate,
        seconds,
        sent: shared.sent.load(Ordering::Relaxed),
        acked,
        answered: shared.answered.load(Ordering::Relaxed),
        retransmissions: shared.retransmissions.load(Ordering::Relaxed),
        msgs_per_second: acked as f64 / seconds,
        server_cpu_seconds: cpu,
        msgs_per_cpu_second: if cpu > 0.0 { acked as f64 / cpu } else { 0.0 },
        latency: LatencySummary::from_histogram(&shared.latency.merged()),
        loss_check: loss.as_ref().map(LossReport::to_json),
        loss,
    };
    println!(
        "coap-telemetry: {} devices, {} s, {}\n\
         msgs/s {:.0}  per server CPU-s {:.0}  p50 {:.2} ms  p99 {:.2} ms  retransmissions {}  failed {}  {}",
        n,
        seconds,
        if args.rate > 0.0 { format!("{} msgs/s offered", args.rate) } else { "as fast as ACKs allow".into() },
        run.msgs_per_second,
        run.msgs_per_cpu_second,
        run.latency.p50_us as f64 / 1000.0,
        run.latency.p99_us as f64 / 1000.0,
        run.retransmissions,
        run.failed,
        run.loss.as_ref().map_or("loss check not run".into(), LossReport::verdict),
    );
    if let Some(e) = &run.first_error {
        println!("first failure: {e}");
    }
    if let Some(path) = &args.server.json {
        crate::report::write_json(path, &serde_json::json!({"scenario": "coap-telemetry", "run": run}))?;
    }
    Ok(crate::exit_code(run.failed == 0 && run.loss.as_ref().is_none_or(LossReport::passed)))
}

/// One device: its acknowledged points, and how it ended.
async fn device(shared: Arc<Shared>, index: usize, token: String) -> (AckLog, Result<(), String>) {
    let mut acks = AckLog::default();
    let socket = bind(&shared, index).await;
    shared.start.wait().await;
    let outcome = match socket {
        Ok(socket) => post_loop(&shared, index, &token, &socket, &mut acks).await,
        Err(e) => Err(e),
    };
    (acks, outcome.map_err(|e| format!("device {index}: {e}")))
}

async fn bind(shared: &Shared, index: usize) -> Result<UdpSocket, String> {
    let source = shared.sources.get(index % shared.sources.len().max(1)).copied();
    let local = SocketAddr::new(source.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)), 0);
    let socket = UdpSocket::bind(local).await.map_err(|e| format!("bind {local}: {e}"))?;
    socket.connect(("127.0.0.1", shared.port)).await.map_err(|e| e.to_string())?;
    Ok(socket)
}

async fn post_loop(
    shared: &Shared,
    index: usize,
    token: &str,
    socket: &UdpSocket,
    acks: &mut AckLog,
) -> Result<(), String> {
    let mut phase = shared.phase.clone();
    let (start, end) = super::wait_for_some(&mut phase).await.ok_or("the run was abandoned")?;
    let mut latency = shared.latency.recorder(index);
    let offset = shared.period.map(|p| p.mul_f64(index as f64 / shared.devices as f64));
    let mut mid = (index as u16).wrapping_mul(7919);
    let (mut seq, mut last_ts) = (0u64, 0u64);
    let mut buf = [0u8; 1500];
    tokio::time::sleep_until(start).await;
    loop {
        let due = match (shared.period, offset) {
            (Some(p), Some(o)) => start + o + p.mul_f64(seq as f64),
            // As fast as ACKs allow: the first request is due at the start, so each
            // device sends at least one however late its task runs.
            _ if seq == 0 => start,
            _ => Instant::now(),
        };
        if due >= end {
            break;
        }
        tokio::time::sleep_until(due).await;
        seq += 1;
        mid = mid.wrapping_add(1);
        let ts = loss_check::unix_millis().max(last_ts + 1);
        last_ts = ts;
        let request = post(mid, token, &format!(r#"{{"ts":{ts},"values":{{"seq":{seq}}}}}"#))?;
        shared.sent.fetch_add(1, Ordering::Relaxed);
        let mut timeout = ACK_TIMEOUT;
        let mut tries = 0;
        let response = loop {
            socket.send(&request).await.map_err(|e| format!("send: {e}"))?;
            match tokio::time::timeout(timeout, recv_for(socket, mid, &mut buf)).await {
                Ok(r) => break r?,
                Err(_) if tries < MAX_RETRANSMIT => {
                    tries += 1;
                    timeout *= 2;
                    shared.retransmissions.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => return Err(format!("no answer to request {seq} after {MAX_RETRANSMIT} retransmissions")),
            }
        };
        if response != ResponseType::Created {
            return Err(format!("request {seq} answered {response:?}"));
        }
        latency.record(due.elapsed());
        acks.push(ts, loss_check::unix_millis());
        shared.answered.fetch_add(1, Ordering::Relaxed);
        if Instant::now() <= end {
            shared.acked.fetch_add(1, Ordering::Relaxed);
        }
    }
    latency.flush();
    Ok(())
}

/// A confirmable POST of `body` to `/api/v1/{token}/telemetry`.
fn post(mid: u16, token: &str, body: &str) -> Result<Vec<u8>, String> {
    let mut p = Packet::new();
    p.header.set_version(1);
    p.header.set_type(MessageType::Confirmable);
    p.header.code = MessageClass::Request(RequestType::Post);
    p.header.message_id = mid;
    p.set_token(mid.to_be_bytes().to_vec());
    for seg in ["api", "v1", token, "telemetry"] {
        p.add_option(CoapOption::UriPath, seg.as_bytes().to_vec());
    }
    p.payload = body.as_bytes().to_vec();
    p.to_bytes().map_err(|e| format!("encoding: {e:?}"))
}

/// The response code for request `mid` (whose token is `mid` too): piggybacked in its ACK,
/// or a separate response carrying its token after an empty ACK. Other datagrams are skipped.
async fn recv_for(socket: &UdpSocket, mid: u16, buf: &mut [u8]) -> Result<ResponseType, String> {
    loop {
        let n = socket.recv(buf).await.map_err(|e| format!("receive: {e}"))?;
        let Ok(p) = Packet::from_bytes(&buf[..n]) else { continue };
        let MessageClass::Response(code) = p.header.code else { continue };
        let ours = match p.header.get_type() {
            MessageType::Acknowledgement => p.header.message_id == mid,
            _ => p.get_token() == mid.to_be_bytes(),
        };
        if ours {
            return Ok(code);
        }
    }
}
