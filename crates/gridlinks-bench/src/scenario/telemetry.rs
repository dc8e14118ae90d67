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
use std::time::Duration;

use anyhow::Context as _;
use bytes::{Bytes, BytesMut};
use gridlinks_codec::mqtt::{Packet, Publish, PublishProperties, QoS};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::{idle_until, wait_for_some, ConnectPacer, Credentials, Progress, ProgressKind, ProgressSources, Target};
use crate::cli::{ApiArgs, ForwardSink, TelemetryArgs};
use crate::figures;
use crate::forward::Forwarding;
use crate::loss_check::{self, unix_micros, unix_millis, AckLog, DeviceAcks};
use crate::mqtt_client::{ConnectionError, MqttConnection};
use crate::proc_stats::ProcessStats;
use crate::report::{LatencySummary, Reasons, ServerCost, TelemetryReport};
use crate::rest_api::{self, ApiTarget, RestClient};
use crate::stats::{Counters, LatencyRecorder, LatencyShards};
use crate::storage_lag::{LagSampler, LagSlots};
use crate::template::Template;

/// Latency histogram shards (see [`LatencyShards`]).
const LATENCY_SHARDS: usize = 32;

/// How late a scheduled publish may go out before the delay counts into its latency:
/// the granularity of tokio's timer (1 ms) plus a wake-up.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// Connect outcomes buffered between connection tasks and the collector.
const OUTCOME_CHANNEL: usize = 1024;

/// What every device does, fixed for the run.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Topic published to.
    pub topic: Topics,
    /// QoS 0 or 1.
    pub qos: QoS,
    /// Unacknowledged publishes allowed (QoS 0: publishes per write).
    pub inflight: u16,
    /// Payload layout.
    pub payload: PayloadSpec,
    /// Stop after this many publishes per device.
    pub messages_per_device: Option<u64>,
    /// Give up on a connection that waits this long for an ack.
    pub ack_timeout: Duration,
    /// Device connections requested (spreads the send schedules).
    pub devices: usize,
    /// Time between two publishes of one device with `--rate`; `None`: as fast as
    /// acknowledgements allow.
    pub interval: Option<Duration>,
    /// Record the acknowledged publishes of each device (`--verify`, `--save-acks`).
    pub record_acks: bool,
    /// Where devices leave their latest acknowledged point (`--storage-lag`).
    pub lag_slots: Option<Arc<LagSlots>>,
    /// Devices start publishing spread over this long (`--ramp-up`).
    pub ramp_up: Duration,
    /// Every publish is stamped at least this (ms; `crash-loop`: past every stamp sent in
    /// earlier cycles, so a point stays identified by device and `ts` across restarts).
    pub first_ts: u64,
}

/// The measurement window, announced to every connection at once.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// When publishing starts.
    start: Instant,
    /// No publish is started at or after this instant (`--duration`).
    stop_at: Option<Instant>,
}

impl Window {
    /// When a device whose next publish is due at `next` wakes: then, or at the window's
    /// end if that comes first. A device publishing every few seconds would otherwise
    /// sleep past the end, and the window (msgs/s, server CPU) would last up to one
    /// interval longer than `--duration`.
    fn wake_for(&self, next: Instant) -> Instant {
        self.stop_at.map_or(next, |stop| next.min(stop))
    }
}

/// How one device's run ended.
#[derive(Default)]
struct DeviceResult {
    /// Publishes acknowledged (QoS 0: written).
    acked: u64,
    /// Instant of the last ack (QoS 0: last write).
    last_ack: Option<Instant>,
    /// Why the connection was lost, if it was.
    lost: Option<String>,
    /// The connection, still open, for DISCONNECT after the window.
    conn: Option<MqttConnection>,
    /// Acknowledged publishes, when recorded.
    acks: AckLog,
    /// The highest stamp sent (acknowledged or not).
    last_ts: u64,
    /// Publishes the server refused in their PUBACK.
    refusals: Refusals,
}

/// The publishes an MQTT 5 server refused in their PUBACK (reason code 0x80 or more):
/// not acknowledged, so neither counted as acked nor recorded for the loss check.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Refusals {
    /// How many.
    pub count: u64,
    /// The `ts` of each, in PUBACK order (with `Plan::record_acks` only).
    pub ts: Vec<u64>,
    /// The first one's reason code and, after a space, the server's reason string (for
    /// GridLinks' rate limits, e.g. `0x97 … reached: transportTenantTelemetryMsgRateLimit
    /// = "500:1"`).
    pub first: Option<String>,
}

impl Refusals {
    /// Counts the refusal of the publish stamped `ts` with `reason` (and the server's
    /// reason string); keeps `ts` when `record` is set.
    fn push(&mut self, reason: u8, reason_string: Option<&str>, ts: u64, record: bool) {
        self.count += 1;
        if record {
            self.ts.push(ts);
        }
        if self.first.is_none() {
            self.first = Some(match reason_string {
                Some(text) => format!("{reason:#04x} {text}"),
                None => format!("{reason:#04x}"),
            });
        }
    }
}

/// Names of provisioned devices: `bench-<i>`.
pub fn provisioned_name(index: usize) -> String {
    format!("bench-{index}")
}

/// The device names the loss check and the storage-lag sampler look up: `bench-<i>`
/// with `--provision`, else read from `names_file`; `None` when nothing needs them.
pub(crate) fn device_names_of(
    devices: usize,
    provision: bool,
    needed: bool,
    names_file: Option<&std::path::Path>,
    tokens_file: Option<&std::path::Path>,
) -> anyhow::Result<Option<Vec<String>>> {
    if provision {
        return Ok(Some((0..devices).map(provisioned_name).collect()));
    }
    if !needed {
        return Ok(None);
    }
    if let Some(path) = names_file {
        return Ok(Some(super::read_lines(path, devices, "names")?));
    }
    let csv_names = match tokens_file {
        Some(path) => super::read_devices(path, devices)?.names,
        None => None,
    };
    match csv_names {
        Some(names) => Ok(Some(names)),
        None => anyhow::bail!(
            "--verify, --save-acks and --storage-lag need device names: --provision, a \
             NAME,TOKEN CSV as --tokens-file, or --device-names-file"
        ),
    }
}

/// Topics the devices publish to.
#[derive(Debug)]
pub(crate) enum Topics {
    /// Every device the same topic.
    Same(String),
    /// Device `i` publishes to entry `i`.
    Each(Vec<String>),
}

impl Topics {
    fn of(&self, index: usize) -> &str {
        match self {
            Topics::Same(topic) => topic,
            Topics::Each(topics) => &topics[index],
        }
    }
}

/// The publishing connections of a run, connected and waiting for the start signal.
pub(crate) struct Fleet {
    /// One task per device.
    devices: Vec<JoinHandle<DeviceResult>>,
    /// Announces the measurement window.
    window_tx: watch::Sender<Option<Window>>,
    /// Failed connection attempts by reason.
    pub connect_failures: Reasons,
    /// Seconds from the first attempt to the last outcome.
    pub connect_seconds: f64,
}

/// What the fleet did in its window.
pub(crate) struct FleetResult {
    /// When the window started.
    pub start: Instant,
    /// The last ack (QoS 0: last write); the window's end.
    pub last_ack: Instant,
    /// Connections lost in the window, by reason.
    pub lost: Reasons,
    /// Acknowledged publishes per device.
    pub acked: Vec<u64>,
    /// Acknowledged points per device (with `Plan::record_acks`).
    pub acks: Vec<AckLog>,
    /// Connections still open, for DISCONNECT.
    pub open: Vec<MqttConnection>,
    /// The highest stamp any device sent (acknowledged or not).
    pub last_ts: u64,
    /// Publishes refused in their PUBACK, per device.
    pub refusals: Vec<Refusals>,
}

impl Fleet {
    /// Connects `plan.devices` devices (connection indices `0..plan.devices`) at
    /// `connect_rate` per second and waits until each attempt has its outcome.
    pub async fn connect(
        target: &Arc<Target>,
        plan: &Arc<Plan>,
        counters: &Arc<Counters>,
        latency: &Arc<LatencyShards>,
        connect_rate: f64,
    ) -> anyhow::Result<Fleet> {
        let (outcome_tx, mut outcome_rx) = mpsc::channel::<Result<(), String>>(OUTCOME_CHANNEL);
        let (window_tx, window_rx) = watch::channel::<Option<Window>>(None);
        let started = Instant::now();
        let count = plan.devices;
        let spawner = {
            let (target, plan, counters, latency) =
                (Arc::clone(target), Arc::clone(plan), Arc::clone(counters), Arc::clone(latency));
            tokio::spawn(async move {
                let pacer = ConnectPacer::new(connect_rate, target.max_pending);
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
                        acked: 0,
                        last_ts: plan.first_ts.saturating_sub(1),
                        refusals: Refusals::default(),
                    };
                    let outcome_tx = outcome_tx.clone();
                    let window_rx = window_rx.clone();
                    devices.push(tokio::spawn(async move { device.run(permit, outcome_tx, window_rx).await }));
                }
                devices
            })
        };
        let mut connect_failures = Reasons::new();
        for _ in 0..count {
            match outcome_rx.recv().await {
                Some(Ok(())) => {}
                Some(Err(reason)) => *connect_failures.entry(reason).or_default() += 1,
                None => break,
            }
        }
        let connect_seconds = started.elapsed().as_secs_f64();
        let devices = spawner.await.context("connection spawner panicked")?;
        Ok(Fleet { devices, window_tx, connect_failures, connect_seconds })
    }

    /// Starts the window on every connection at once and waits until each device has
    /// its last ack (or lost its connection).
    pub async fn publish(self, duration: Option<Duration>) -> anyhow::Result<FleetResult> {
        let start = Instant::now();
        self.window_tx.send_replace(Some(Window { start, stop_at: duration.map(|d| start + d) }));
        let mut out = FleetResult {
            start,
            last_ack: start,
            lost: Reasons::new(),
            acked: Vec::with_capacity(self.devices.len()),
            acks: Vec::with_capacity(self.devices.len()),
            open: Vec::with_capacity(self.devices.len()),
            last_ts: 0,
            refusals: Vec::with_capacity(self.devices.len()),
        };
        for device in self.devices {
            let result = device.await.context("device task panicked")?;
            out.acked.push(result.acked);
            out.acks.push(result.acks);
            if let Some(reason) = result.lost {
                *out.lost.entry(reason).or_default() += 1;
            }
            out.last_ack = out.last_ack.max(result.last_ack.unwrap_or(start));
            out.last_ts = out.last_ts.max(result.last_ts);
            out.refusals.push(result.refusals);
            out.open.extend(result.conn);
        }
        Ok(out)
    }
}

/// Sends DISCONNECT on every connection, concurrently.
pub(crate) async fn disconnect_all(open: Vec<MqttConnection>) {
    let mut closing = JoinSet::new();
    for conn in open {
        closing.spawn(conn.disconnect());
    }
    while closing.join_next().await.is_some() {}
}

/// Runs the scenario and prints its report; the exit code says whether the loss check
/// (if it ran) passed.
pub async fn run(args: TelemetryArgs) -> anyhow::Result<std::process::ExitCode> {
    figures::finish(&args.target.output, &measure(&args).await?, crate::settings::telemetry(&args))
}

/// Runs the scenario: provisioning, connect, publish window, disconnect, loss check.
pub async fn measure(args: &TelemetryArgs) -> anyhow::Result<TelemetryReport> {
    if (args.verify || args.save_acks.is_some()) && args.qos != 1 {
        anyhow::bail!("--verify and --save-acks need --qos 1 (QoS 0 has no acknowledgements)");
    }
    let forward = args.forward.sink();
    if let Some(sink) = &forward {
        if args.target.workers > 1 {
            anyhow::bail!("--forward-* runs in one generator process: leave out --workers");
        }
        if args.qos != 1 && *sink != ForwardSink::Blackhole {
            anyhow::bail!(
                "--forward-http and --forward-kafka need --qos 1: acknowledged messages are checked at the sink"
            );
        }
        if args.no_ts {
            anyhow::bail!("--forward-* needs the payload's ts (leave out --no-ts)");
        }
    }
    if args.target.workers > 1 {
        return crate::workers::telemetry(args).await;
    }
    // A worker process has connections offset..offset+devices of the run.
    let offset = args.target.worker_offset.unwrap_or(0);
    let names = device_names_of(
        offset + args.devices,
        args.provision,
        args.verify || args.save_acks.is_some() || args.storage_lag || forward.is_some(),
        args.device_names_file.as_deref(),
        args.target.tokens_file.as_deref(),
    )?
    .map(|all| all[offset..offset + args.devices].to_vec());
    let api = if args.provision || args.verify || args.storage_lag || forward.is_some() {
        Some(args.api.target(if args.provision {
            "--provision"
        } else if args.verify {
            "--verify"
        } else if args.storage_lag {
            "--storage-lag"
        } else {
            "--forward-*"
        })?)
    } else {
        None
    };
    let profile = device_profile_of(args.device_profile.as_deref(), args.provision)?;
    let mut target = Target::resolve(&args.target, args.devices).await?;
    if args.provision {
        let (api, names) =
            (api.clone().context("--provision needs --api")?, names.clone().context("provisioned names")?);
        target.credentials = Credentials::Tokens(provision_into(api, names, profile).await?);
    }
    let target = Arc::new(target);
    let lag_slots = LagSlots::new(args.devices);
    let plan = Arc::new(Plan {
        topic: Topics::Same(args.topic.clone()),
        qos: if args.qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce },
        inflight: args.inflight,
        payload: PayloadSpec {
            target_len: args.payload_bytes,
            kind: if args.no_ts { PayloadKind::Values } else { PayloadKind::Telemetry },
            template: template(
                args.payload_template.as_deref(),
                args.verify || args.save_acks.is_some() || args.storage_lag || forward.is_some(),
            )?,
        },
        messages_per_device: args.messages_per_device,
        ack_timeout: args.ack_timeout,
        devices: args.devices,
        interval: send_interval(args.rate, args.interval, args.devices),
        record_acks: names.is_some(),
        lag_slots: args.storage_lag.then(|| Arc::clone(&lag_slots)),
        ramp_up: args.ramp_up,
        first_ts: 0,
    });
    let duration = super::window_duration(args.duration, args.messages_per_device);
    let me = ProcessStats::own().context("reading own /proc")?;
    let counters = Arc::new(Counters::default());
    let latency = LatencyShards::new(LATENCY_SHARDS);
    // The sink after the devices exist (imported above, or by `compare` before the
    // server's restart) and before any load: every message of the window is forwarded.
    let forward_lag = LatencyShards::new(LATENCY_SHARDS);
    let mut forwarding = match forward {
        Some(sink) => {
            let api = api.clone().context("--forward-* needs --api")?;
            Some(Forwarding::start(sink, &args.forward, api, Arc::clone(&counters), Arc::clone(&forward_lag)).await?)
        }
        None => None,
    };
    let receiving = forwarding.as_ref().is_some_and(|f| !f.is_blackhole());
    let progress = Progress::start(
        if receiving { ProgressKind::Pubsub } else { ProgressKind::Telemetry },
        ProgressSources {
            counters: Arc::clone(&counters),
            server: target.server_stats.clone(),
            ack_latency: Some(Arc::clone(&latency)),
            e2e_latency: receiving.then(|| Arc::clone(&forward_lag)),
            keep_buckets: args.target.worker_offset.is_some(),
        },
        "connecting",
    );

    // Phase 1: connect.
    let fleet = Fleet::connect(&target, &plan, &counters, &latency, args.connect_rate).await?;
    let (connect_failures, connect_seconds) = (fleet.connect_failures.clone(), fleet.connect_seconds);
    crate::workers::sync(&args.target, "ready").await?;

    // Phase 2: publish, with the storage-lag sampler alongside.
    let server_before = target.server_sample()?;
    let me_before = me.cpu_seconds()?;
    if let Some(s) = &server_before {
        progress.reset_peak(s.memory.rss_kib);
    }
    progress.set_phase("publishing");
    let lag_sampler = match (&api, &names) {
        (Some(api), Some(names)) if args.storage_lag => {
            Some(LagSampler::start(api.clone(), names.clone(), Arc::clone(&lag_slots)))
        }
        _ => None,
    };
    let result = fleet.publish(duration).await?;
    crate::workers::sync(&args.target, "done").await?;
    let server_after = target.server_sample()?;
    let me_after = me.cpu_seconds()?;
    let window_seconds = (result.last_ack - result.start).as_secs_f64();
    if let Some(f) = forwarding.as_mut() {
        f.mark_window_end().await;
    }
    let storage_lag = match lag_sampler {
        Some(sampler) => Some(sampler.finish().await?),
        None => None,
    };

    // Phase 3: disconnect, outside the window.
    progress.set_phase("disconnecting");
    disconnect_all(result.open).await;
    let rss_peak = server_after.map(|s| progress.peak(s.memory.rss_kib));
    // Phase 4: the sink gets what is still on its way (the timeline goes on meanwhile).
    let forwarding = match (forwarding, &names) {
        (Some(f), Some(names)) => {
            progress.set_phase("forward drain");
            Some(f.finish(names, &result.acks, result.start, result.last_ack).await?)
        }
        _ => None,
    };
    let timeline = progress.finish();

    let merged = latency.merged();
    let mut report = TelemetryReport {
        scenario: "mqtt-telemetry",
        server: target.name(),
        protocol: format!("MQTT {}", target.version_label(args.target.mqtt_version)),
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
        dropped: result.lost,
        puback: (plan.qos == QoS::AtLeastOnce).then(|| LatencySummary::from_histogram(&merged)),
        latency_histogram: Some(merged),
        server_cost: ServerCost::between(target.server_stats.as_ref(), server_before, server_after, rss_peak),
        generator_cpu_seconds: me_after - me_before,
        loss_check: None,
        storage_lag,
        forwarding,
        timeline,
    };
    if let Some(names) = names {
        report.loss_check =
            check_losses_of(&args.api, args.verify, args.save_acks.as_deref(), api, names, result.acks).await?;
    }
    Ok(report)
}

/// Time between two publishes of one device: `--interval`, or `--rate` (total) spread
/// over the devices; `None`: as fast as acknowledgements allow.
pub(crate) fn send_interval(total_rate: f64, interval: Option<Duration>, devices: usize) -> Option<Duration> {
    interval
        .filter(|i| !i.is_zero())
        .or_else(|| (total_rate > 0.0).then(|| Duration::from_secs_f64(devices.max(1) as f64 / total_rate)))
}

/// Creates the devices through the REST API's bulk import; their fresh tokens.
pub(crate) async fn provision(api: ApiTarget, names: Vec<String>) -> anyhow::Result<Vec<String>> {
    provision_into(api, names, None).await
}

/// [`provision`], the devices in the device profile `profile` (`--device-profile`: saved
/// first, replacing the tenant's profile of its name) when one is given.
pub(crate) async fn provision_into(
    api: ApiTarget,
    names: Vec<String>,
    profile: Option<serde_json::Value>,
) -> anyhow::Result<Vec<String>> {
    eprintln!("provisioning {} devices through {}", names.len(), api.base);
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        let tokens = rest_api::random_tokens(names.len())?;
        let rest = RestClient::login(&api)?;
        let profile = match &profile {
            Some(p) => {
                let name = rest.save_device_profile(p)?;
                let rules = p["profileData"]["alarms"].as_array().map_or(0, Vec::len);
                eprintln!("device profile {name} saved ({rules} alarm rules); the devices are created in it");
                Some(name)
            }
            None => None,
        };
        rest.bulk_import_typed(&names, &tokens, profile.as_deref())?;
        Ok(tokens)
    })
    .await?
}

/// `--device-profile`: the profile read from its file, `None` without the option; fails
/// when given without `--provision` (`provision`: whether this process provisions).
pub(crate) fn device_profile_of(
    path: Option<&std::path::Path>,
    provision: bool,
) -> anyhow::Result<Option<serde_json::Value>> {
    match path {
        None => Ok(None),
        Some(_) if !provision => anyhow::bail!("--device-profile needs --provision (it creates the devices in it)"),
        Some(path) => Ok(Some(rest_api::read_device_profile(path)?)),
    }
}

/// `--save-acks` and `--verify` after a run.
pub(crate) async fn check_losses_of(
    api_args: &ApiArgs,
    verify: bool,
    save_acks: Option<&std::path::Path>,
    api: Option<ApiTarget>,
    names: Vec<String>,
    acks: Vec<AckLog>,
) -> anyhow::Result<Option<loss_check::LossReport>> {
    let devices: Vec<DeviceAcks> = names.into_iter().zip(acks).map(|(name, acks)| DeviceAcks { name, acks }).collect();
    if let Some(path) = save_acks {
        loss_check::save(path, &devices)?;
    }
    if !verify {
        return Ok(None);
    }
    let api = api.context("--verify needs --api")?;
    let threads = usize::from(api_args.verify_threads);
    eprintln!("checking {} devices for lost points", devices.len());
    let report = tokio::task::spawn_blocking(move || loss_check::check(&api, &devices, threads)).await??;
    Ok(Some(report))
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
    /// How many publishes were acknowledged.
    acked: u64,
    /// The stamp of the latest publish (the next one gets a higher one).
    last_ts: u64,
    /// Publishes refused in their PUBACK.
    refusals: Refusals,
}

impl Device {
    async fn run(
        mut self,
        permit: tokio::sync::OwnedSemaphorePermit,
        outcome: mpsc::Sender<Result<(), String>>,
        mut window_rx: watch::Receiver<Option<Window>>,
    ) -> DeviceResult {
        let connected =
            MqttConnection::connect(self.target.endpoint(self.index), &self.target.client_options(self.index)).await;
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
        let window =
            match idle_until(&mut conn, wait_for_some(&mut window_rx), self.target.ping_interval(), &pings).await {
                Ok(Some(window)) => window,
                Ok(None) => return DeviceResult::default(),
                Err(e) => {
                    Counters::add(&self.counters.dropped, 1);
                    return DeviceResult { lost: Some(format!("before start: {}", e.reason())), ..Default::default() };
                }
            };
        // With --ramp-up, device i starts i/N of the way through it.
        let mut window = window;
        if !self.plan.ramp_up.is_zero() {
            window.start += self.plan.ramp_up.mul_f64(self.index as f64 / self.plan.devices.max(1) as f64);
            let begin = tokio::time::sleep_until(window.start);
            if let Err(e) = idle_until(&mut conn, begin, self.target.ping_interval(), &pings).await {
                Counters::add(&self.counters.dropped, 1);
                return DeviceResult { lost: Some(format!("during ramp-up: {}", e.reason())), ..Default::default() };
            }
        }
        let outcome = match self.plan.qos {
            QoS::AtMostOnce => self.publish_qos0(&mut conn, window).await,
            _ => self.publish_qos1(&mut conn, window).await,
        };
        self.latency.flush();
        match outcome {
            Ok(last_ack) => DeviceResult {
                acked: self.acked,
                last_ack,
                lost: None,
                conn: Some(conn),
                acks: self.acks,
                last_ts: self.last_ts,
                refusals: self.refusals,
            },
            Err((last_ack, reason)) => {
                Counters::add(&self.counters.dropped, 1);
                DeviceResult {
                    acked: self.acked,
                    last_ack,
                    lost: Some(reason),
                    conn: None,
                    acks: self.acks,
                    last_ts: self.last_ts,
                    refusals: self.refusals,
                }
            }
        }
    }

    /// Counts `n` acknowledged publishes.
    fn count_acked(&mut self, n: u64) {
        self.acked += n;
        Counters::add(&self.counters.acked, n);
    }

    /// True while this device may start another publish.
    fn may_send(&self, window: Window, now: Instant, sent: u64) -> bool {
        window.stop_at.is_none_or(|stop| now < stop) && self.plan.messages_per_device.is_none_or(|m| sent < m)
    }

    /// This device's send schedule with `--rate`: devices are spread evenly over one
    /// interval so the offered load is smooth rather than in bursts.
    fn schedule(&self, window: Window) -> Option<Schedule> {
        let interval = self.plan.interval?;
        let phase = self.index as f64 / self.plan.devices.max(1) as f64;
        Some(Schedule { next: window.start + interval.mul_f64(phase), interval })
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
            let now_stamp = self.plan.payload.kind.stamp_now();
            let mut batch = 0u64;
            while self.may_send(window, now, sent) && schedule.as_ref().is_none_or(|s| s.next <= now) {
                let Some(id) = free.pop() else { break };
                // Lateness up to the timer's granularity is the generator's, not the
                // server's; beyond it the publish waited for a full window.
                let due = schedule.as_mut().map_or(now, |s| now.min(s.advance() + TIMER_SLACK));
                // Every message of a device gets its own timestamp: a storage keyed by
                // (device, key, ts) would otherwise merge a burst into one point.
                self.last_ts = now_stamp.max(self.last_ts + 1);
                self.fill(&mut packet, &mut payload_buf, Some(id), sent, self.last_ts);
                conn.queue(&packet).expect("telemetry PUBLISH always encodes");
                due_at[usize::from(id)] = Some(due);
                ts_of[usize::from(id)] = self.last_ts;
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
            // Wait for a packet, the next scheduled publish (if the window has room) or
            // the window's end if that comes first, or the ack timeout (if anything is
            // unacknowledged).
            let wake = match &schedule {
                Some(s) if sending && !free.is_empty() => Some(window.wake_for(s.next)),
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
            let received_ms = if self.plan.record_acks { unix_millis() } else { 0 };
            let mut next = Some(first);
            let (mut acked, mut refused, mut max_acked_ts) = (0u64, 0u64, 0u64);
            while let Some(packet) = next {
                match packet {
                    Packet::PubAck(ack) => {
                        let slot = due_at.get_mut(usize::from(ack.packet_id));
                        if let Some(due) = slot.and_then(Option::take) {
                            free.push(ack.packet_id);
                            if is_v5 && ack.reason >= 0x80 {
                                refused += 1;
                                let ts = ts_of[usize::from(ack.packet_id)];
                                let record = self.plan.record_acks;
                                self.refusals.push(ack.reason, ack.reason_string.as_deref(), ts, record);
                            } else {
                                acked += 1;
                                self.latency.record(received.saturating_duration_since(due));
                                let ts = ts_of[usize::from(ack.packet_id)];
                                max_acked_ts = max_acked_ts.max(ts);
                                if self.plan.record_acks {
                                    self.acks.push(ts, received_ms);
                                }
                            }
                        }
                    }
                    Packet::Disconnect(_) => {
                        let unacked = (usize::from(limit) - free.len()) as u64;
                        self.count_acked(acked);
                        Counters::add(&self.counters.failed, refused + unacked);
                        return Err((last_ack, ConnectionError::Closed.reason()));
                    }
                    _ => {} // PINGRESP or server-pushed messages: not measured here
                }
                next = match conn.try_decode() {
                    Ok(p) => p,
                    Err(e) => {
                        let unacked = (usize::from(limit) - free.len()) as u64;
                        self.count_acked(acked);
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
                if let Some(lag) = &self.plan.lag_slots {
                    lag.set(self.index, max_acked_ts, unix_micros());
                }
            }
            self.count_acked(acked);
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
        let mut last_write = None;
        loop {
            let now = Instant::now();
            let now_stamp = self.plan.payload.kind.stamp_now();
            let mut batch = 0u64;
            while batch < u64::from(self.plan.inflight)
                && self.may_send(window, now, sent)
                && schedule.as_ref().is_none_or(|s| s.next <= now)
            {
                if let Some(s) = schedule.as_mut() {
                    s.advance();
                }
                self.last_ts = now_stamp.max(self.last_ts + 1);
                self.fill(&mut packet, &mut payload_buf, None, sent, self.last_ts);
                conn.queue(&packet).expect("telemetry PUBLISH always encodes");
                sent += 1;
                batch += 1;
            }
            Counters::add(&self.counters.sent, batch);
            if let Err(e) = conn.flush().await {
                Counters::add(&self.counters.failed, batch);
                return Err((last_write, format!("io: {e}")));
            }
            self.count_acked(batch);
            if batch > 0 {
                last_write = Some(Instant::now());
            }
            if !self.may_send(window, Instant::now(), sent) {
                return Ok(last_write);
            }
            if let Some(s) = &schedule {
                tokio::time::sleep_until(window.wake_for(s.next)).await;
            }
        }
    }

    /// The PUBLISH reused for every message of this device.
    fn publish_template(&self) -> Packet {
        Packet::Publish(Publish {
            dup: false,
            qos: self.plan.qos,
            retain: false,
            topic: self.plan.topic.of(self.index).to_owned(),
            packet_id: None,
            payload: Bytes::new(),
            properties: PublishProperties::default(),
        })
    }

    /// Sets packet id and a fresh payload for message `seq`.
    fn fill(&self, packet: &mut Packet, payload_buf: &mut BytesMut, id: Option<u16>, seq: u64, ts: u64) {
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

/// Layout of the telemetry payload.
#[derive(Debug, Clone)]
pub struct PayloadSpec {
    /// Pad with spaces up to this many bytes (a longer JSON is not cut).
    pub target_len: usize,
    /// What the JSON holds.
    pub kind: PayloadKind,
    /// `--payload-template`, instead of the built-in JSON of `kind` (stamped in ms).
    pub template: Option<Arc<Template>>,
}

/// The `--payload-template` (text, or `@FILE`), parsed; the loss check and storage lag
/// (`checked`) need its `{ts}` and `{seq}`.
pub(crate) fn template(arg: Option<&str>, checked: bool) -> anyhow::Result<Option<Arc<Template>>> {
    let Some(arg) = arg else { return Ok(None) };
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading payload template {path}"))?,
        None => arg.to_string(),
    };
    let template = Template::parse(&text).map_err(anyhow::Error::msg)?;
    if checked && !template.has_ts_and_seq() {
        anyhow::bail!(
            "--verify, --save-acks and --storage-lag need a payload template with {{ts}} and \
             a \"seq\":{{seq}} value, e.g. '{{\"ts\":{{ts}},\"values\":{{\"seq\":{{seq}}}}}}'"
        );
    }
    Ok(Some(Arc::new(template)))
}

/// The JSON a publish carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// ThingsBoard telemetry with a timestamp in ms: `{"ts":..,"values":{..,"seq":N}}`.
    Telemetry,
    /// The bare values object (the server stamps the time).
    Values,
    /// A vehicle tracker (TBMQ's performance tests) stamped with its send time in µs,
    /// for end-to-end latency: `{"ts":<µs>,"seq":N,"lat":..,"long":..,"speed":..,"fuel":..,"batLvl":..}`.
    Tracker,
}

impl PayloadKind {
    /// The stamp a message sent now carries: ms for telemetry, µs for trackers.
    pub fn stamp_now(self) -> u64 {
        match self {
            PayloadKind::Tracker => unix_micros(),
            PayloadKind::Telemetry | PayloadKind::Values => unix_millis(),
        }
    }
}

/// The JSON payload of message `seq` stamped `stamp` (see [`PayloadKind`]), with
/// values that change with `seq`, e.g.
/// `{"ts":1700000000000,"values":{"temperature":21.5,"humidity":45,"pressure":1013,"battery":97,"seq":123}}`,
/// padded with spaces (valid JSON whitespace) before the last brace up to
/// `spec.target_len`. Written into `buf`, whose allocation is reused across messages.
pub fn render_payload(buf: &mut BytesMut, spec: &PayloadSpec, seq: u64, stamp: u64) -> Bytes {
    use std::fmt::Write as _;
    buf.reserve(spec.target_len.max(128));
    if let Some(template) = &spec.template {
        template.render(buf, seq, stamp);
        // Trailing whitespace after a JSON value is still valid JSON.
        while buf.len() < spec.target_len {
            buf.extend_from_slice(b" ");
        }
        return buf.split().freeze();
    }
    let _ = match spec.kind {
        PayloadKind::Tracker => write!(
            buf,
            "{{\"ts\":{stamp},\"seq\":{seq},\"lat\":{:.6},\"long\":{:.6},\"speed\":{},\"fuel\":{},\"batLvl\":{}",
            50.4 + (seq % 1000) as f64 * 1e-5,
            30.5 + (seq % 997) as f64 * 1e-5,
            seq % 120,
            100 - seq % 90,
            100 - seq % 50,
        ),
        PayloadKind::Telemetry | PayloadKind::Values => {
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
            if spec.kind == PayloadKind::Telemetry {
                write!(buf, "{{\"ts\":{stamp},\"values\":{values}}}")
            } else {
                write!(buf, "{values}")
            }
        }
    };
    // +1 for the closing brace written after the padding.
    while buf.len() + 1 < spec.target_len {
        buf.extend_from_slice(b" ");
    }
    buf.extend_from_slice(b"}");
    buf.split().freeze()
}

/// The stamp of a [`PayloadKind::Tracker`] payload (its first field), `None` when the
/// payload does not start with one.
pub fn tracker_stamp(payload: &[u8]) -> Option<u64> {
    let rest = payload.strip_prefix(b"{\"ts\":")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(target_len: usize, with_ts: bool) -> PayloadSpec {
        PayloadSpec {
            template: None,
            target_len,
            kind: if with_ts { PayloadKind::Telemetry } else { PayloadKind::Values },
        }
    }

    #[test]
    fn tracker_payload_carries_its_stamp_and_the_tbmq_fields() {
        let mut buf = BytesMut::new();
        let spec = PayloadSpec { target_len: 114, kind: PayloadKind::Tracker, template: None };
        let stamp = 1_700_000_000_123_456;
        let p = render_payload(&mut buf, &spec, 42, stamp);
        assert_eq!(p.len(), 114, "{}", String::from_utf8_lossy(&p));
        let v: serde_json::Value = serde_json::from_slice(&p).unwrap();
        for key in ["lat", "long", "speed", "fuel", "batLvl"] {
            assert!(v[key].is_number(), "{key} in {v}");
        }
        assert_eq!(v["seq"], 42);
        assert_eq!(tracker_stamp(&p), Some(stamp));
        assert_eq!(tracker_stamp(b"{\"temperature\":1}"), None);
        assert_eq!(tracker_stamp(b"{\"ts\":x}"), None);
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
