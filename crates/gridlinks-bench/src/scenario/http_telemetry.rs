//! `http-telemetry`: N devices post telemetry over HTTP/1.1 keep-alive to the
//! ThingsBoard device API (`POST /api/v1/{token}/telemetry`), one request in flight per
//! connection, as fast as responses allow or at `--rate`/`--interval`.
//!
//! The same payloads, phases, loss check and storage-lag sampling as `mqtt-telemetry`:
//! an `HTTP 200` is the acknowledgement. Any other status counts as failed, by status.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::telemetry::{
    check_losses_of, device_names_of, device_profile_of, provision_into, render_payload, send_interval, template,
    PayloadKind, PayloadSpec,
};
use super::{wait_for_some, ConnectPacer, Progress, ProgressKind, ProgressSources};
use crate::cli::HttpTelemetryArgs;
use crate::figures;
use crate::loss_check::{unix_micros, unix_millis, AckLog};
use crate::proc_stats::ProcessStats;
use crate::report::{LatencySummary, Reasons, ServerCost, TelemetryReport};
use crate::stats::{Counters, LatencyRecorder, LatencyShards};
use crate::storage_lag::{LagSampler, LagSlots};

/// Largest response head (status line and headers) accepted.
const MAX_HEAD: usize = 16 * 1024;

/// Largest response body accepted.
const MAX_BODY: usize = 1 << 20;

/// How late a scheduled request may go out before the delay counts into its latency.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// Latency histogram shards.
const LATENCY_SHARDS: usize = 32;

/// Runs the scenario and prints its report; exit code 2 when the loss check fails.
pub async fn run(args: HttpTelemetryArgs) -> anyhow::Result<std::process::ExitCode> {
    figures::finish(&args.output, &measure(&args).await?, crate::settings::http_telemetry(&args))
}

/// What every device does.
pub(crate) struct Plan {
    /// Devices (spreads the send schedules).
    pub devices: usize,
    /// `host:port` for the Host header.
    pub host: String,
    /// Where devices connect.
    pub server: SocketAddr,
    /// Payload layout.
    pub payload: PayloadSpec,
    /// Time between two requests of one device; `None`: as fast as responses allow.
    pub interval: Option<Duration>,
    /// Stop after this many requests per device.
    pub messages_per_device: Option<u64>,
    /// A request without response after this long ends its device.
    pub timeout: Duration,
    /// Record the acknowledged points of each device.
    pub record_acks: bool,
    /// Where devices leave their latest acknowledged point (`--storage-lag`).
    pub lag_slots: Option<Arc<LagSlots>>,
    /// Every request is stamped at least this (ms; see the MQTT plan's `first_ts`).
    pub first_ts: u64,
}

/// How one device's run ended.
#[derive(Default)]
struct DeviceResult {
    last_ack: Option<Instant>,
    lost: Option<String>,
    acks: AckLog,
    refused: Reasons,
    /// The highest stamp sent (answered or not).
    last_ts: u64,
}

/// The start and optional end of the posting window, announced to every device at once.
type Window = (Instant, Option<Instant>);

/// The keep-alive connections of a run, connected and waiting for the start signal.
pub(crate) struct HttpFleet {
    /// One task per device.
    devices: Vec<tokio::task::JoinHandle<DeviceResult>>,
    /// Announces the window.
    window_tx: watch::Sender<Option<Window>>,
    /// Failed connection attempts by reason.
    pub connect_failures: Reasons,
    /// Seconds from the first attempt to the last outcome.
    pub connect_seconds: f64,
}

/// What the devices did in their window.
pub(crate) struct HttpFleetResult {
    /// When the window started.
    pub start: Instant,
    /// The last 200 (the window's end).
    pub last_ack: Instant,
    /// Devices that ended early, by reason.
    pub lost: Reasons,
    /// Requests answered with another status than 200, by status.
    pub refused: Reasons,
    /// Acknowledged points per device (with `Plan::record_acks`).
    pub acks: Vec<AckLog>,
    /// The highest stamp any device sent (answered or not).
    pub last_ts: u64,
}

impl HttpFleet {
    /// Opens one connection per token (device `i` posts with `tokens[i]`) at
    /// `connect_rate` per second and waits until each attempt has its outcome.
    pub async fn connect(
        plan: &Arc<Plan>,
        tokens: Vec<String>,
        counters: &Arc<Counters>,
        latency: &Arc<LatencyShards>,
        connect_rate: f64,
    ) -> HttpFleet {
        let started = Instant::now();
        let (outcome_tx, mut outcome_rx) = mpsc::channel::<Result<(), String>>(1024);
        let (window_tx, window_rx) = watch::channel::<Option<Window>>(None);
        let pacer = ConnectPacer::new(connect_rate, 64);
        let mut devices = Vec::with_capacity(plan.devices);
        for (index, token) in tokens.into_iter().take(plan.devices).enumerate() {
            let permit = pacer.slot(index).await;
            let device = Device {
                index,
                path: format!("/api/v1/{token}/telemetry"),
                plan: Arc::clone(plan),
                counters: Arc::clone(counters),
                latency: latency.recorder(index),
            };
            let (outcome_tx, window_rx) = (outcome_tx.clone(), window_rx.clone());
            devices.push(tokio::spawn(async move {
                let stream = connect(device.plan.server).await;
                drop(permit);
                device.run(stream, outcome_tx, window_rx).await
            }));
        }
        drop(outcome_tx);
        let mut connect_failures = Reasons::new();
        while let Some(outcome) = outcome_rx.recv().await {
            if let Err(reason) = outcome {
                *connect_failures.entry(reason).or_default() += 1;
            }
        }
        HttpFleet { devices, window_tx, connect_failures, connect_seconds: started.elapsed().as_secs_f64() }
    }

    /// Starts the window on every device at once and waits until each has its last
    /// response (or lost its connection).
    pub async fn post(self, duration: Option<Duration>) -> anyhow::Result<HttpFleetResult> {
        let start = Instant::now();
        self.window_tx.send_replace(Some((start, duration.map(|d| start + d))));
        let mut out = HttpFleetResult {
            start,
            last_ack: start,
            lost: Reasons::new(),
            refused: Reasons::new(),
            acks: Vec::with_capacity(self.devices.len()),
            last_ts: 0,
        };
        for device in self.devices {
            let result = device.await.context("device task panicked")?;
            if let Some(reason) = result.lost {
                *out.lost.entry(reason).or_default() += 1;
            }
            for (reason, n) in result.refused {
                *out.refused.entry(reason).or_default() += n;
            }
            out.last_ack = out.last_ack.max(result.last_ack.unwrap_or(start));
            out.last_ts = out.last_ts.max(result.last_ts);
            out.acks.push(result.acks);
        }
        Ok(out)
    }
}

/// Runs the scenario.
pub async fn measure(args: &HttpTelemetryArgs) -> anyhow::Result<TelemetryReport> {
    let api = args.api.target("http-telemetry")?;
    let names = device_names_of(
        args.devices,
        args.provision,
        args.verify || args.save_acks.is_some() || args.storage_lag,
        args.device_names_file.as_deref(),
        args.tokens_file.as_deref(),
    )?;
    let profile = device_profile_of(args.device_profile.as_deref(), args.provision)?;
    let tokens = if args.provision {
        provision_into(api.clone(), names.clone().context("provisioned names")?, profile).await?
    } else {
        let path = args.tokens_file.as_ref().context("give --provision or --tokens-file")?;
        super::read_devices(path, args.devices)?.tokens
    };
    let url = args.api.api.clone().unwrap_or_default();
    let host = url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let server = tokio::net::lookup_host(host.as_str())
        .await
        .with_context(|| format!("resolving {host}"))?
        .next()
        .with_context(|| format!("{host} has no address"))?;
    super::check_fd_limit(args.devices)?;
    let server_stats = super::server_stats(&args.server_pid)?;
    let lag_slots = LagSlots::new(args.devices);
    let plan = Arc::new(Plan {
        devices: args.devices,
        host: host.clone(),
        server,
        payload: PayloadSpec {
            target_len: args.payload_bytes,
            kind: PayloadKind::Telemetry,
            template: template(
                args.payload_template.as_deref(),
                args.verify || args.save_acks.is_some() || args.storage_lag,
            )?,
        },
        interval: send_interval(args.rate, args.interval, args.devices),
        messages_per_device: args.messages_per_device,
        timeout: args.timeout,
        record_acks: names.is_some(),
        lag_slots: args.storage_lag.then(|| Arc::clone(&lag_slots)),
        first_ts: 0,
    });
    let duration = super::window_duration(args.duration, args.messages_per_device);
    let me = ProcessStats::own().context("reading own /proc")?;
    let counters = Arc::new(Counters::default());
    let latency = LatencyShards::new(LATENCY_SHARDS);
    let progress = Progress::start(
        ProgressKind::Telemetry,
        ProgressSources {
            counters: Arc::clone(&counters),
            server: server_stats.clone(),
            ack_latency: Some(Arc::clone(&latency)),
            e2e_latency: None,
            keep_buckets: false,
        },
        "connecting",
    );

    // Phase 1: connect.
    let fleet = HttpFleet::connect(&plan, tokens, &counters, &latency, args.connect_rate).await;
    let (connect_failures, connect_seconds) = (fleet.connect_failures.clone(), fleet.connect_seconds);

    // Phase 2: post.
    let server_before = match &server_stats {
        Some(s) => Some(s.sample()?),
        None => None,
    };
    let me_before = me.cpu_seconds()?;
    if let Some(s) = &server_before {
        progress.reset_peak(s.memory.rss_kib);
    }
    progress.set_phase("posting");
    let lag_sampler = match &names {
        Some(names) if args.storage_lag => Some(LagSampler::start(api.clone(), names.clone(), Arc::clone(&lag_slots))),
        _ => None,
    };
    let HttpFleetResult { start, last_ack, mut lost, refused, acks, .. } = fleet.post(duration).await?;
    let server_after = match &server_stats {
        Some(s) => Some(s.sample()?),
        None => None,
    };
    let me_after = me.cpu_seconds()?;
    let storage_lag = match lag_sampler {
        Some(sampler) => Some(sampler.finish().await?),
        None => None,
    };
    let rss_peak = server_after.map(|s| progress.peak(s.memory.rss_kib));
    let timeline = progress.finish();
    for (reason, n) in refused {
        *lost.entry(format!("refused: {reason}")).or_default() += n;
    }
    let mut report = TelemetryReport {
        scenario: "http-telemetry",
        server: url,
        protocol: "HTTP/1.1".into(),
        devices: args.devices,
        qos: 1,
        inflight: 1,
        offered_rate: plan.interval.map_or(0.0, |i| args.devices as f64 / i.as_secs_f64()),
        payload_bytes: render_payload(&mut BytesMut::new(), &plan.payload, 0, 0).len(),
        connected: Counters::get(&counters.connected),
        connect_failures,
        connect_seconds,
        window_seconds: (last_ack - start).as_secs_f64(),
        sent: Counters::get(&counters.sent),
        acked: Counters::get(&counters.acked),
        failed: Counters::get(&counters.failed),
        dropped: lost,
        puback: Some(LatencySummary::from_histogram(&latency.merged())),
        latency_histogram: None,
        server_cost: ServerCost::between(server_stats.as_ref(), server_before, server_after, rss_peak),
        generator_cpu_seconds: me_after - me_before,
        loss_check: None,
        storage_lag,
        forwarding: None,
        timeline,
    };
    if let Some(names) = names {
        report.loss_check =
            check_losses_of(&args.api, args.verify, args.save_acks.as_deref(), Some(api), names, acks).await?;
    }
    Ok(report)
}

/// A TCP connection to the server with TCP_NODELAY.
async fn connect(server: SocketAddr) -> io::Result<TcpStream> {
    let socket = match server {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    let stream = socket.connect(server).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// One device's keep-alive connection.
struct Device {
    index: usize,
    /// Request path with the device's token.
    path: String,
    plan: Arc<Plan>,
    counters: Arc<Counters>,
    latency: LatencyRecorder,
}

impl Device {
    async fn run(
        mut self,
        stream: io::Result<TcpStream>,
        outcome: mpsc::Sender<Result<(), String>>,
        mut window_rx: watch::Receiver<Option<Window>>,
    ) -> DeviceResult {
        let mut result = DeviceResult::default();
        let mut stream = match stream {
            Ok(s) => {
                Counters::add(&self.counters.connected, 1);
                let _ = outcome.send(Ok(())).await;
                s
            }
            Err(e) => {
                Counters::add(&self.counters.connect_failed, 1);
                let _ = outcome.send(Err(format!("tcp: {e}"))).await;
                return result;
            }
        };
        drop(outcome);
        let Some((start, stop_at)) = wait_for_some(&mut window_rx).await else {
            return result;
        };
        let plan = Arc::clone(&self.plan);
        let phase = self.index as f64 / plan.devices.max(1) as f64;
        let mut next_due = plan.interval.map(|i| start + i.mul_f64(phase));
        let mut rbuf = BytesMut::with_capacity(1024);
        let mut wbuf = BytesMut::with_capacity(512);
        let mut payload_buf = BytesMut::new();
        let mut sent = 0u64;
        let mut last_ts = plan.first_ts.saturating_sub(1);
        loop {
            let now = Instant::now();
            if stop_at.is_some_and(|stop| now >= stop) || plan.messages_per_device.is_some_and(|m| sent >= m) {
                break;
            }
            // Latency counts from the scheduled time (less the timer's slack) with
            // --rate/--interval, so a slow server cannot hide behind a late send.
            let due = match (next_due, plan.interval) {
                (Some(due), Some(interval)) => {
                    tokio::time::sleep_until(due).await;
                    next_due = Some(due + interval);
                    due + TIMER_SLACK
                }
                _ => now,
            };
            last_ts = unix_millis().max(last_ts + 1);
            let payload = render_payload(&mut payload_buf, &plan.payload, sent, last_ts);
            wbuf.clear();
            wbuf.extend_from_slice(
                format!(
                    "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    self.path,
                    plan.host,
                    payload.len()
                )
                .as_bytes(),
            );
            wbuf.extend_from_slice(&payload);
            sent += 1;
            Counters::add(&self.counters.sent, 1);
            let sent_at = Instant::now().min(due);
            let exchange = async {
                stream.write_all(&wbuf).await?;
                read_response(&mut stream, &mut rbuf).await
            };
            let response = match tokio::time::timeout(plan.timeout, exchange).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    Counters::add(&self.counters.failed, 1);
                    Counters::add(&self.counters.dropped, 1);
                    result.lost = Some(format!("io: {e}"));
                    break;
                }
                Err(_) => {
                    Counters::add(&self.counters.failed, 1);
                    Counters::add(&self.counters.dropped, 1);
                    result.lost = Some("no response within --timeout".into());
                    break;
                }
            };
            let received = Instant::now();
            if response.status == 200 {
                self.latency.record(received.saturating_duration_since(sent_at));
                Counters::add(&self.counters.acked, 1);
                result.last_ack = Some(received);
                if plan.record_acks {
                    result.acks.push(last_ts, unix_millis());
                }
                if let Some(lag) = &plan.lag_slots {
                    lag.set(self.index, last_ts, unix_micros());
                }
            } else {
                Counters::add(&self.counters.failed, 1);
                *result.refused.entry(format!("HTTP {}", response.status)).or_default() += 1;
            }
            if response.close {
                Counters::add(&self.counters.dropped, 1);
                result.lost = Some("server closed the connection".into());
                break;
            }
        }
        result.last_ts = last_ts;
        self.latency.flush();
        result
    }
}

/// What matters of a response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Response {
    pub(crate) status: u16,
    /// `Connection: close`.
    pub(crate) close: bool,
    /// Bytes of body (the last bytes of the response).
    pub(crate) body_len: usize,
}

/// Reads one response (head and Content-Length body) into `buf`, consuming it.
pub(crate) async fn read_response(stream: &mut TcpStream, buf: &mut BytesMut) -> io::Result<Response> {
    let (response, len) = next_response(stream, buf).await?;
    buf.advance(len);
    Ok(response)
}

/// [`read_response`], and its body.
pub(crate) async fn read_response_body(stream: &mut TcpStream, buf: &mut BytesMut) -> io::Result<(Response, Vec<u8>)> {
    let (response, len) = next_response(stream, buf).await?;
    let body = buf[len - response.body_len..len].to_vec();
    buf.advance(len);
    Ok((response, body))
}

/// Reads until `buf` starts with a whole response; it and its length, not consumed.
async fn next_response(stream: &mut TcpStream, buf: &mut BytesMut) -> io::Result<(Response, usize)> {
    loop {
        if let Some(found) = parse_response(buf)? {
            return Ok(found);
        }
        if buf.len() > MAX_HEAD + MAX_BODY {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "response too large"));
        }
        buf.reserve(1024);
        if stream.read_buf(buf).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "server closed the connection"));
        }
    }
}

/// A complete response at the start of `buf` and its length, `None` if incomplete.
fn parse_response(buf: &[u8]) -> io::Result<Option<(Response, usize)>> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            return Err(bad("response head too large"));
        }
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad("response head not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or_else(|| bad("bad status line"))?;
    let (mut length, mut close) = (0usize, status_line.starts_with("HTTP/1.0"));
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().map_err(|_| bad("bad Content-Length"))?;
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(bad("chunked responses are not supported"));
        }
    }
    if length > MAX_BODY {
        return Err(bad("response body too large"));
    }
    let total = head_end + 4 + length;
    if buf.len() < total {
        return Ok(None);
    }
    Ok(Some((Response { status, close, body_len: length }, total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_with_and_without_body() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\ndate: x\r\n\r\nHTTP/1.1 503";
        let (r, len) = parse_response(ok).unwrap().unwrap();
        assert_eq!(r, Response { status: 200, close: false, body_len: 0 });
        assert_eq!(&ok[len..], b"HTTP/1.1 503");
        let busy = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy!";
        let (r, len) = parse_response(busy).unwrap().unwrap();
        assert_eq!(r, Response { status: 503, close: true, body_len: 5 });
        assert_eq!(len, busy.len());
        // Incomplete head or body: wait for more.
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").unwrap().is_none());
        assert!(parse_response(&busy[..busy.len() - 1]).unwrap().is_none());
        // Garbage is an error, not a hang.
        assert!(parse_response(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(parse_response(&vec![b'a'; MAX_HEAD + 1]).is_err());
    }
}
