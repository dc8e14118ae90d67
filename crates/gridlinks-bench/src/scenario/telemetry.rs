//! `mqtt-telemetry`: N devices publish JSON telemetry as fast as acknowledgements allow,
//! or at a fixed total offered rate (`--rate`).
//!
//! Phases:
//! 1. **connect**: connections open at `--connect-rate`; each waits, idling with
//!    keep-alive pings, until every attempt has an outcome.
//! 2. **publish** (the measurement window): all connections start together; each keeps
//!    up to `--inflight` QoS 1 publishes unacknowledged, refilling the window as PUBACKs
//!    arrive (all refills of one read go out in one write; with `--rate` only what is
//!    due by then), until `--duration` ends or
//!    `--messages-per-device` are sent, then waits for its last acks. The window ends
//!    when every connection has its last ack; server CPU is read at both ends.
//! 3. **disconnect**: DISCONNECT on every connection, outside the window.
//!
//! PUBACK latency is from just before the write of a publish to the decode of its ack.
//! With `--rate` it is from the publish's scheduled time (less up to 2 ms of timer
//! lateness), so time spent waiting for a full window, i.e. for a server that falls
//! behind the offered load, counts (no coordinated omission).
//!
//! With `--provision` the devices are created first through the REST API. With
//! `--verify` or `--save-acks` each device records the `ts` of every acknowledged
//! publish and when its ack arrived; after phase 3 the loss check
//! ([`crate::loss_check`]) compares them with what the server stored.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bytes::{Bytes, BytesMut};
use gridlinks_codec::mqtt::{Packet, Publish, PublishProperties, QoS};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{idle_until, wait_for_some, ConnectPacer, Credentials, Progress, ProgressKind, Target};
use crate::cli::TelemetryArgs;
use crate::loss_check::{self, AckLog, DeviceAcks};
use crate::mqtt_client::{ConnectionError, MqttConnection};
use crate::proc_stats::ProcessStats;
use crate::report::{write_json, LatencySummary, Reasons, ServerCost, TelemetryReport};
use crate::rest_api::{self, RestClient};
use crate::stats::{Counters, LatencyRecorder, LatencyShards};

/// Default measurement window when neither --duration nor --messages-per-device is given.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// Latency histogram shards (see [`LatencyShards`]).
const LATENCY_SHARDS: usize = 32;

/// How late a scheduled publish may go out before the delay counts into its latency:
/// the granularity of tokio's timer (1 ms) plus a wake-up.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// Connect outcomes buffered between connection tasks and the collector.
const OUTCOME_CHANNEL: usize = 1024;

/// What every device does, fixed for the run.
#[derive(Debug)]
struct Plan {
    /// Topic published to.
    topic: String,
    /// QoS 0 or 1.
    qos: QoS,
    /// Unacknowledged publishes allowed (QoS 0: publishes per write).
    inflight: u16,
    /// Payload layout.
    payload: PayloadSpec,
    /// Stop after this many publishes per device.
    messages_per_device: Option<u64>,
    /// Give up on a connection that waits this long for an ack.
    ack_timeout: Duration,
    /// Device connections requested (spreads the send schedules).
    devices: usize,
    /// Time between two publishes of one device with `--rate`; `None`: as fast as
    /// acknowledgements allow.
    interval: Option<Duration>,
    /// Record the acknowledged publishes of each device (`--verify`, `--save-acks`).
    record_acks: bool,
}

/// The measurement window, announced to every connection at once.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// When publishing starts.
    start: Instant,
    /// No publish is started at or after this instant (`--duration`).
    stop_at: Option<Instant>,
}

/// How one device's run ended.
#[derive(Default)]
struct DeviceResult {
    /// Instant of the last ack (QoS 0: last write).
    last_ack: Option<Instant>,
    /// Why the connection was lost, if it was.
    lost: Option<String>,
    /// The connection, still open, for DISCONNECT after the window.
    conn: Option<MqttConnection>,
    /// Acknowledged publishes, when recorded.
    acks: AckLog,
}

/// Names of provisioned devices: `bench-<i>`.
pub fn provisioned_name(index: usize) -> String {
    format!("bench-{index}")
}

/// The device names the loss check looks up (`--provision` or `--device-names-file`),
/// when it runs; fails when it runs without them.
fn device_names(args: &TelemetryArgs) -> anyhow::Result<Option<Vec<String>>> {
    let checking = args.verify || args.save_acks.is_some();
    if args.provision {
        return Ok(Some((0..args.devices).map(provisioned_name).collect()));
    }
    if !checking {
        return Ok(None);
    }
    let Some(path) = &args.device_names_file else {
        anyhow::bail!("--verify and --save-acks need device names: --provision, or --tokens-file with --device-names-file");
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading device names file {}", path.display()))?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if names.len() < args.devices {
        anyhow::bail!(
            "{} has {} names but {} devices need one each",
            path.display(),
            names.len(),
            args.devices
        );
    }
    Ok(Some(names))
}

/// Runs the scenario and prints its report; the exit code says whether the loss check
/// (if it ran) passed.
pub async fn run(args: TelemetryArgs) -> anyhow::Result<std::process::ExitCode> {
    if (args.verify || args.save_acks.is_some()) && args.qos != 1 {
        anyhow::bail!("--verify and --save-acks need --qos 1 (QoS 0 has no acknowledgements)");
    }
    let names = device_names(&args)?;
    let api = if args.provision || args.verify {
        Some(args.api.target(if args.provision {
            "--provision"
        } else {
            "--verify"
        })?)
    } else {
        None
    };
    let mut target = Target::resolve(&args.target, args.devices).await?;
    if args.provision {
        let (api, names) = (
            api.clone().expect("checked above"),
            names.clone().expect("provisioned"),
        );
        eprintln!("provisioning {} devices through {}", names.len(), api.base);
        let tokens = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
            let tokens = rest_api::random_tokens(names.len())?;
            RestClient::login(&api)?.bulk_import(&names, &tokens)?;
            Ok(tokens)
        })
        .await??;
        target.credentials = Credentials::Tokens(tokens);
    }
    let target = Arc::new(target);
    let plan = Arc::new(Plan {
        topic: args.topic.clone(),
        qos: if args.qos == 0 {
            QoS::AtMostOnce
        } else {
            QoS::AtLeastOnce
        },
        inflight: args.inflight,
        payload: PayloadSpec {
            target_len: args.payload_bytes,
            with_ts: !args.no_ts,
        },
        messages_per_device: args.messages_per_device,
        ack_timeout: args.ack_timeout,
        devices: args.devices,
        interval: (args.rate > 0.0)
            .then(|| Duration::from_secs_f64(args.devices.max(1) as f64 / args.rate)),
        record_acks: names.is_some(),
    });
    let duration = match (args.duration, args.messages_per_device) {
        (Some(d), _) => Some(d),
        (None, Some(_)) => None,
        (None, None) => Some(DEFAULT_DURATION),
    };
    let me = ProcessStats::new(std::process::id()).context("reading own /proc")?;
    let counters = Arc::new(Counters::default());
    let latency = LatencyShards::new(LATENCY_SHARDS);
    let progress = Progress::start(
        ProgressKind::Telemetry,
        Arc::clone(&counters),
        target.server_stats.clone(),
        "connecting",
    );

    // Phase 1: connect.
    let (outcome_tx, mut outcome_rx) = mpsc::channel::<Result<(), String>>(OUTCOME_CHANNEL);
    let (window_tx, window_rx) = watch::channel::<Option<Window>>(None);
    let connect_started = Instant::now();
    let spawner = {
        let (target, plan, counters, latency) = (
            Arc::clone(&target),
            Arc::clone(&plan),
            Arc::clone(&counters),
            Arc::clone(&latency),
        );
        let (rate, count) = (args.connect_rate, args.devices);
        tokio::spawn(async move {
            let pacer = ConnectPacer::new(rate, target.max_pending);
            let mut devices = Vec::with_capacity(count);
            for index in 0..count {
                let permit = pacer.slot(index).await;
                let device = Device {
                    index,
                    target: Arc::clone(&target),
                    plan: Arc::clone(&plan),
                    counters: Arc::clone(&counters),
                    latency: latency.recorder(index),
                    acks: AckLog::default(),
                };
                let outcome_tx = outcome_tx.clone();
                let window_rx = window_rx.clone();
                devices.push(tokio::spawn(async move {
                    device.run(permit, outcome_tx, window_rx).await
                }));
            }
            devices
        })
    };
    let mut connect_failures = Reasons::new();
    for _ in 0..args.devices {
        match outcome_rx.recv().await {
            Some(Ok(())) => {}
            Some(Err(reason)) => *connect_failures.entry(reason).or_default() += 1,
            None => break,
        }
    }
    let connect_seconds = connect_started.elapsed().as_secs_f64();
    let devices = spawner.await.context("connection spawner panicked")?;

    // Phase 2: publish.
    let server_before = target.server_sample()?;
    let me_before = me.cpu_seconds()?;
    if let Some(s) = &server_before {
        progress.reset_peak(s.memory.rss_kib);
    }
    progress.set_phase("publishing");
    let window_start = Instant::now();
    window_tx.send_replace(Some(Window {
        start: window_start,
        stop_at: duration.map(|d| window_start + d),
    }));
    let mut lost = Reasons::new();
    let mut last_ack = window_start;
    let mut open = Vec::with_capacity(devices.len());
    let mut acks = Vec::with_capacity(devices.len());
    for device in devices {
        let result = device.await.context("device task panicked")?;
        acks.push(result.acks);
        if let Some(reason) = result.lost {
            *lost.entry(reason).or_default() += 1;
        }
        last_ack = last_ack.max(result.last_ack.unwrap_or(window_start));
        open.extend(result.conn);
    }
    let server_after = target.server_sample()?;
    let me_after = me.cpu_seconds()?;
    let window_seconds = (last_ack - window_start).as_secs_f64();

    // Phase 3: disconnect, outside the window.
    progress.set_phase("disconnecting");
    let mut closing = JoinSet::new();
    for conn in open {
        closing.spawn(conn.disconnect());
    }
    while closing.join_next().await.is_some() {}
    let rss_peak = server_after.map(|s| progress.peak(s.memory.rss_kib));
    drop(progress);

    let mut report = TelemetryReport {
        server: target.name(),
        mqtt_version: args.target.mqtt_version.label().into(),
        devices: args.devices,
        qos: args.qos,
        inflight: args.inflight,
        offered_rate: args.rate,
        payload_bytes: render_payload(&mut BytesMut::new(), &plan.payload, 0, 0).len(),
        connected: Counters::get(&counters.connected),
        connect_failures,
        connect_seconds,
        window_seconds,
        sent: Counters::get(&counters.sent),
        acked: Counters::get(&counters.acked),
        failed: Counters::get(&counters.failed),
        dropped: lost,
        puback: (plan.qos == QoS::AtLeastOnce)
            .then(|| LatencySummary::from_histogram(&latency.merged())),
        server_cost: match (server_before, server_after, &target.server_stats) {
            (Some(before), Some(after), Some(stats)) => Some(ServerCost {
                pid: stats.pid(),
                cpu_seconds: after.cpu_seconds - before.cpu_seconds,
                rss_peak_kib: rss_peak.unwrap_or(after.memory.rss_kib),
                rss_end_kib: after.memory.rss_kib,
                hwm_kib: after.memory.hwm_kib,
            }),
            _ => None,
        },
        generator_cpu_seconds: me_after - me_before,
        loss_check: None,
    };
    if let Some(names) = names {
        let devices: Vec<DeviceAcks> = names
            .into_iter()
            .zip(acks)
            .map(|(name, acks)| DeviceAcks { name, acks })
            .collect();
        if let Some(path) = &args.save_acks {
            loss_check::save(path, &devices)?;
        }
        if args.verify {
            let api = api.expect("checked above");
            let threads = usize::from(args.api.verify_threads);
            eprintln!("checking {} devices for lost points", devices.len());
            report.loss_check = Some(
                tokio::task::spawn_blocking(move || loss_check::check(&api, &devices, threads))
                    .await??,
            );
        }
    }
    print!("{}", report.human());
    if let Some(path) = &args.target.json {
        write_json(path, &report.to_json())?;
    }
    Ok(report
        .loss_check
        .as_ref()
        .map_or(std::process::ExitCode::SUCCESS, crate::exit_code))
}

/// One device connection.
struct Device {
    /// Connection index: picks client id, token and source address.
    index: usize,
    target: Arc<Target>,
    plan: Arc<Plan>,
    counters: Arc<Counters>,
    /// This connection's PUBACK latencies.
    latency: LatencyRecorder,
    /// Acknowledged publishes (filled only with `Plan::record_acks`).
    acks: AckLog,
}

impl Device {
    async fn run(
        mut self,
        permit: tokio::sync::OwnedSemaphorePermit,
        outcome: mpsc::Sender<Result<(), String>>,
        mut window_rx: watch::Receiver<Option<Window>>,
    ) -> DeviceResult {
        let connected = MqttConnection::connect(
            self.target.endpoint(self.index),
            &self.target.client_options(self.index),
        )
        .await;
        drop(permit);
        let mut conn = match connected {
            Ok(conn) => {
                Counters::add(&self.counters.connected, 1);
                let _ = outcome.send(Ok(())).await;
                conn
            }
            Err(e) => {
                Counters::add(&self.counters.connect_failed, 1);
                let _ = outcome.send(Err(e.reason())).await;
                return DeviceResult::default();
            }
        };
        drop(outcome);
        let pings = AtomicU64::new(0);
        let window = match idle_until(
            &mut conn,
            wait_for_some(&mut window_rx),
            self.target.ping_interval(),
            &pings,
        )
        .await
        {
            Ok(Some(window)) => window,
            Ok(None) => return DeviceResult::default(),
            Err(e) => {
                Counters::add(&self.counters.dropped, 1);
                return DeviceResult {
                    lost: Some(format!("before start: {}", e.reason())),
                    ..Default::default()
                };
            }
        };
        let outcome = match self.plan.qos {
            QoS::AtMostOnce => self.publish_qos0(&mut conn, window).await,
            _ => self.publish_qos1(&mut conn, window).await,
        };
        self.latency.flush();
        match outcome {
            Ok(last_ack) => DeviceResult {
                last_ack,
                lost: None,
                conn: Some(conn),
                acks: self.acks,
            },
            Err((last_ack, reason)) => {
                Counters::add(&self.counters.dropped, 1);
                DeviceResult {
                    last_ack,
                    lost: Some(reason),
                    conn: None,
                    acks: self.acks,
                }
            }
        }
    }

    /// True while this device may start another publish.
    fn may_send(&self, window: Window, now: Instant, sent: u64) -> bool {
        window.stop_at.is_none_or(|stop| now < stop)
            && self.plan.messages_per_device.is_none_or(|m| sent < m)
    }

    /// This device's send schedule with `--rate`: devices are spread evenly over one
    /// interval so the offered load is smooth rather than in bursts.
    fn schedule(&self, window: Window) -> Option<Schedule> {
        let interval = self.plan.interval?;
        let phase = self.index as f64 / self.plan.devices.max(1) as f64;
        Some(Schedule {
            next: window.start + interval.mul_f64(phase),
            interval,
        })
    }

    /// QoS 1 with a window of unacknowledged publishes. Returns the instant of the last
    /// ack, or why the connection ended early (its unacked publishes count as failed).
    async fn publish_qos1(
        &mut self,
        conn: &mut MqttConnection,
        window: Window,
    ) -> Result<Option<Instant>, (Option<Instant>, String)> {
        // An MQTT 5 server may allow fewer unacknowledged publishes than asked for.
        let limit = match conn.connack().properties.receive_maximum {
            Some(max) => self.plan.inflight.min(max),
            None => self.plan.inflight,
        };
        // Packet ids 1..=limit are reused: free ids on a stack; by id, the instant the
        // publish was due (sent, or scheduled with --rate) for its latency.
        let mut free: Vec<u16> = (1..=limit).rev().collect();
        let mut due_at: Vec<Option<Instant>> = vec![None; usize::from(limit) + 1];
        // By id, the `ts` of the publish in flight (recorded when its ack arrives).
        let mut ts_of: Vec<u64> = vec![0; usize::from(limit) + 1];
        let mut schedule = self.schedule(window);
        let mut packet = self.publish_template();
        let mut payload_buf = BytesMut::new();
        let mut sent = 0u64;
        let mut last_ts = 0u64;
        let mut last_ack = None;
        let is_v5 = conn.version().is_v5();
        // The ack timeout counts from the last send or ack. Its timer is re-armed lazily
        // (only when it fires early), not on every packet: timer churn per ack is
        // measurable at 100k acks/s.
        let mut last_progress = Instant::now();
        let ack_timer = tokio::time::sleep(self.plan.ack_timeout);
        tokio::pin!(ack_timer);
        loop {
            // Send whatever is due and fits the window, in one write.
            let now = Instant::now();
            let now_ms = unix_millis();
            let mut batch = 0u64;
            while self.may_send(window, now, sent)
                && schedule.as_ref().is_none_or(|s| s.next <= now)
            {
                let Some(id) = free.pop() else { break };
                // Lateness up to the timer's granularity is the generator's, not the
                // server's; beyond it the publish waited for a full window.
                let due = schedule
                    .as_mut()
                    .map_or(now, |s| now.min(s.advance() + TIMER_SLACK));
                // Every message of a device gets its own timestamp: a storage keyed by
                // (device, key, ts) would otherwise merge a burst into one point.
                last_ts = now_ms.max(last_ts + 1);
                self.fill(&mut packet, &mut payload_buf, Some(id), sent, last_ts);
                conn.queue(&packet)
                    .expect("telemetry PUBLISH always encodes");
                due_at[usize::from(id)] = Some(due);
                ts_of[usize::from(id)] = last_ts;
                sent += 1;
                batch += 1;
            }
            Counters::add(&self.counters.sent, batch);
            if batch > 0 {
                last_progress = now;
            }
            let unacked = (usize::from(limit) - free.len()) as u64;
            if let Err(e) = conn.flush().await {
                Counters::add(&self.counters.failed, unacked);
                return Err((last_ack, format!("io: {e}")));
            }
            let sending = self.may_send(window, Instant::now(), sent);
            if unacked == 0 && !sending {
                return Ok(last_ack);
            }
            // Wait for a packet, the next scheduled publish (if the window has room), or
            // the ack timeout (if anything is unacknowledged).
            let wake = match &schedule {
                Some(s) if sending && !free.is_empty() => Some(s.next),
                _ => None,
            };
            let first = tokio::select! {
                packet = conn.read_packet() => packet,
                _ = sleep_until_some(wake) => continue,
                _ = &mut ack_timer, if unacked > 0 => {
                    let deadline = last_progress + self.plan.ack_timeout;
                    if Instant::now() < deadline {
                        ack_timer.as_mut().reset(deadline);
                        continue;
                    }
                    Counters::add(&self.counters.failed, unacked);
                    return Err((last_ack, "no PUBACK within --ack-timeout".into()));
                }
            };
            let first = match first {
                Ok(packet) => packet,
                Err(e) => {
                    Counters::add(&self.counters.failed, unacked);
                    return Err((last_ack, e.reason()));
                }
            };
            // Take every packet already buffered before writing again.
            let received = Instant::now();
            let received_ms = if self.plan.record_acks {
                unix_millis()
            } else {
                0
            };
            let mut next = Some(first);
            let (mut acked, mut refused) = (0u64, 0u64);
            while let Some(packet) = next {
                match packet {
                    Packet::PubAck(ack) => {
                        let slot = due_at.get_mut(usize::from(ack.packet_id));
                        if let Some(due) = slot.and_then(Option::take) {
                            free.push(ack.packet_id);
                            if is_v5 && ack.reason >= 0x80 {
                                refused += 1;
                            } else {
                                acked += 1;
                                self.latency.record(received.saturating_duration_since(due));
                                if self.plan.record_acks {
                                    self.acks
                                        .push(ts_of[usize::from(ack.packet_id)], received_ms);
                                }
                            }
                        }
                    }
                    Packet::Disconnect(_) => {
                        let unacked = (usize::from(limit) - free.len()) as u64;
                        Counters::add(&self.counters.acked, acked);
                        Counters::add(&self.counters.failed, refused + unacked);
                        return Err((last_ack, ConnectionError::Closed.reason()));
                    }
                    _ => {} // PINGRESP or server-pushed messages: not measured here
                }
                next = match conn.try_decode() {
                    Ok(p) => p,
                    Err(e) => {
                        let unacked = (usize::from(limit) - free.len()) as u64;
                        Counters::add(&self.counters.acked, acked);
                        Counters::add(&self.counters.failed, refused + unacked);
                        return Err((last_ack, e.reason()));
                    }
                };
            }
            if acked + refused > 0 {
                last_progress = received;
            }
            if acked > 0 {
                last_ack = Some(received);
            }
            Counters::add(&self.counters.acked, acked);
            Counters::add(&self.counters.failed, refused);
        }
    }

    /// QoS 0: whatever is due (unpaced: `--inflight` publishes) in one write, as fast as
    /// the socket takes them. "Acked" means written.
    async fn publish_qos0(
        &mut self,
        conn: &mut MqttConnection,
        window: Window,
    ) -> Result<Option<Instant>, (Option<Instant>, String)> {
        let mut schedule = self.schedule(window);
        let mut packet = self.publish_template();
        let mut payload_buf = BytesMut::new();
        let mut sent = 0u64;
        let mut last_ts = 0u64;
        let mut last_write = None;
        loop {
            let now = Instant::now();
            let now_ms = unix_millis();
            let mut batch = 0u64;
            while batch < u64::from(self.plan.inflight)
                && self.may_send(window, now, sent)
                && schedule.as_ref().is_none_or(|s| s.next <= now)
            {
                if let Some(s) = schedule.as_mut() {
                    s.advance();
                }
                last_ts = now_ms.max(last_ts + 1);
                self.fill(&mut packet, &mut payload_buf, None, sent, last_ts);
                conn.queue(&packet)
                    .expect("telemetry PUBLISH always encodes");
                sent += 1;
                batch += 1;
            }
            Counters::add(&self.counters.sent, batch);
            if let Err(e) = conn.flush().await {
                Counters::add(&self.counters.failed, batch);
                return Err((last_write, format!("io: {e}")));
            }
            Counters::add(&self.counters.acked, batch);
            if batch > 0 {
                last_write = Some(Instant::now());
            }
            if !self.may_send(window, Instant::now(), sent) {
                return Ok(last_write);
            }
            if let Some(s) = &schedule {
                tokio::time::sleep_until(s.next).await;
            }
        }
    }

    /// The PUBLISH reused for every message of this device.
    fn publish_template(&self) -> Packet {
        Packet::Publish(Publish {
            dup: false,
            qos: self.plan.qos,
            retain: false,
            topic: self.plan.topic.clone(),
            packet_id: None,
            payload: Bytes::new(),
            properties: PublishProperties::default(),
        })
    }

    /// Sets packet id and a fresh payload for message `seq`.
    fn fill(
        &self,
        packet: &mut Packet,
        payload_buf: &mut BytesMut,
        id: Option<u16>,
        seq: u64,
        ts: u64,
    ) {
        if let Packet::Publish(p) = packet {
            p.packet_id = id;
            p.payload = render_payload(payload_buf, &self.plan.payload, seq, ts);
        }
    }
}

/// A device's next due publish with `--rate`.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    /// When the next publish is due.
    next: Instant,
    /// Time between two publishes of this device.
    interval: Duration,
}

impl Schedule {
    /// Returns the due instant and moves on to the next one.
    fn advance(&mut self) -> Instant {
        let due = self.next;
        self.next += self.interval;
        due
    }
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Milliseconds since the Unix epoch.
fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Layout of the telemetry payload.
#[derive(Debug, Clone, Copy)]
pub struct PayloadSpec {
    /// Pad with spaces up to this many bytes (a longer JSON is not cut).
    pub target_len: usize,
    /// `{"ts":..,"values":{..}}` (ThingsBoard's form with a timestamp) rather than the
    /// bare values object.
    pub with_ts: bool,
}

/// The JSON payload of message `seq`: five values that change with `seq`, e.g.
/// `{"ts":1700000000000,"values":{"temperature":21.5,"humidity":45,"pressure":1013,"battery":97,"seq":123}}`,
/// padded with spaces (valid JSON whitespace) before the last brace up to
/// `spec.target_len`. Written into `buf`, whose allocation is reused across messages.
pub fn render_payload(buf: &mut BytesMut, spec: &PayloadSpec, seq: u64, ts_ms: u64) -> Bytes {
    use std::fmt::Write as _;
    buf.reserve(spec.target_len.max(128));
    let temperature = 200 + seq % 100; // tenths of a degree: 20.0..=29.9
    let values = format_args!(
        "{{\"temperature\":{}.{},\"humidity\":{},\"pressure\":{},\"battery\":{},\"seq\":{}",
        temperature / 10,
        temperature % 10,
        40 + seq % 20,
        1000 + seq % 30,
        100 - seq % 50,
        seq
    );
    let _ = if spec.with_ts {
        write!(buf, "{{\"ts\":{ts_ms},\"values\":{values}}}")
    } else {
        write!(buf, "{values}")
    };
    // +1 for the closing brace written after the padding.
    while buf.len() + 1 < spec.target_len {
        buf.extend_from_slice(b" ");
    }
    buf.extend_from_slice(b"}");
    buf.split().freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(target_len: usize, with_ts: bool) -> PayloadSpec {
        PayloadSpec {
            target_len,
            with_ts,
        }
    }

    #[test]
    fn payload_is_padded_to_size_and_stays_valid_json() {
        let mut buf = BytesMut::new();
        let ts = 1_700_000_000_000;
        for seq in [0u64, 7, 123, 99_999] {
            let p = render_payload(&mut buf, &spec(120, true), seq, ts);
            assert_eq!(p.len(), 120, "{}", String::from_utf8_lossy(&p));
            let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
            assert_eq!(v["ts"], ts);
            let values = v["values"].as_object().unwrap();
            assert_eq!(values.len(), 5);
            assert_eq!(values["seq"], seq);
        }
        // The default --payload-bytes 100 is about the natural size with a timestamp.
        let natural = render_payload(&mut buf, &spec(0, true), 123, ts);
        assert_eq!(natural.len(), 103);
        assert_eq!(
            &natural[..],
            br#"{"ts":1700000000000,"values":{"temperature":22.3,"humidity":43,"pressure":1003,"battery":77,"seq":123}}"#
        );
    }

    #[test]
    fn payload_without_ts_is_the_bare_values_object() {
        let mut buf = BytesMut::new();
        let p = render_payload(&mut buf, &spec(100, false), 5, 0);
        assert_eq!(p.len(), 100);
        let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 5);
        assert_eq!(v["temperature"], 20.5);
        // Too small a target: never cut.
        let p = render_payload(&mut buf, &spec(10, false), 5, 0);
        assert!(p.len() > 10);
        serde_json::from_slice::<serde_json::Value>(&p).unwrap();
    }
}
