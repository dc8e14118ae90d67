//! `crash-loop`: the durability proof. GridLinks acknowledges a point only after its
//! commit; so however often the server dies, every acknowledged point must be stored.
//!
//! The tool starts GridLinks itself ([`ManagedServer`]) on free loopback ports and one
//! data directory, provisions the devices once, then runs N cycles of:
//!
//! 1. connect every device (MQTT, or HTTP keep-alive) and send points as fast as
//!    acknowledgements allow ([`Fleet`] / [`HttpFleet`]), each device's points stamped
//!    with increasing `ts` that continue across cycles, so a point is identified by
//!    (device, ts); every acknowledged point is recorded;
//! 2. a random delay into the load (`--kill-after`, drawn from `--seed`), SIGKILL;
//!    the clients see their connections break, which ends the cycle's load (points in
//!    flight were never acknowledged and are not counted);
//! 3. start the server again on the same data, timing spawn to `/healthz` 200.
//!
//! After the last cycle's restart the loss check ([`loss_check::check`]) reads every
//! device's stored timestamps through the REST API and compares them with all the
//! acknowledged ones of every cycle: any missing fails the run (exit code 2). A cycle
//! that acknowledged nothing proves nothing and fails the run too (exit code 1).

use std::fmt::Write as _;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use gridlinks_codec::mqtt::QoS;
use serde_json::Value;
use tokio::time::Instant;

use crate::cli::{CrashLoopArgs, DurationRange, MqttVersion, Transport};
use crate::forward::{Forwarding, ForwardingReport};
use crate::loss_check::{self, AckLog, DeviceAcks, LossReport};
use crate::proc_stats::ProcessStats;
use crate::report::{self, per_second, thousands, LatencySummary, Reasons};
use crate::rest_api::ApiTarget;
use crate::scenario::http_telemetry::{self, HttpFleet};
use crate::scenario::telemetry::{
    self, disconnect_all, provision, provisioned_name, Fleet, PayloadKind, PayloadSpec, Topics,
};
use crate::scenario::{Progress, ProgressKind, ProgressSources, Target};
use crate::servers::{Binaries, ManagedServer, ServerKind};
use crate::stats::{Counters, LatencyShards};
use crate::template::Rng;

/// Unacknowledged publishes per MQTT device when `--window` is not given.
const DEFAULT_WINDOW: u16 = 10;

/// The load of a cycle stops by itself this long after the planned kill, should the
/// kill not end it.
const LOAD_LIMIT_AFTER_KILL: Duration = Duration::from_secs(30);

/// How long past its planned time the kill waits for the cycle's first acknowledgement
/// (less than [`LOAD_LIMIT_AFTER_KILL`], so the load still runs when it comes).
const FIRST_ACK_PATIENCE: Duration = Duration::from_secs(25);

/// A connection that waits this long for an acknowledgement gives up.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Latency histogram shards.
const LATENCY_SHARDS: usize = 32;

/// Topic of the MQTT devices (ThingsBoard device telemetry).
const TOPIC: &str = "v1/devices/me/telemetry";

/// What every cycle shares.
struct Setup {
    transport: Transport,
    devices: usize,
    /// MQTT window.
    window: u16,
    mqtt_version: MqttVersion,
    sources: Vec<IpAddr>,
    connect_rate: f64,
    payload: PayloadSpec,
    /// The devices' access tokens, device `i` the `i`th.
    tokens: Vec<String>,
}

/// One cycle: load, kill, restart.
#[derive(Debug, Clone, PartialEq)]
pub struct CycleReport {
    /// 1-based.
    pub cycle: u32,
    /// The drawn delay from the start of the load to SIGKILL.
    pub kill_after: Duration,
    /// Devices connected for the load.
    pub connected: u64,
    /// Devices that could not connect, by reason.
    pub connect_failures: Reasons,
    /// Seconds to connect every device.
    pub connect_seconds: f64,
    /// Seconds from the start of the load to SIGKILL.
    pub load_seconds: f64,
    /// Points sent.
    pub sent: u64,
    /// Points acknowledged (PUBACK / HTTP 200), each recorded for the loss check.
    pub acked: u64,
    /// Acknowledgement latency.
    pub ack_latency: LatencySummary,
    /// Why devices stopped sending, by reason (the kill: connection closed or reset).
    pub ended: Reasons,
    /// HTTP requests answered with another status than 200, by status. Refusing MQTT 5
    /// PUBACKs are not told apart: they are in `sent - acked` with the publishes in
    /// flight at the kill.
    pub refused: Reasons,
    /// Seconds from the restart after this cycle's kill to `/healthz` 200: the recovery.
    pub restart_to_ready: f64,
}

impl CycleReport {
    /// Acknowledged points per second of load.
    pub fn acked_per_second(&self) -> f64 {
        per_second(self.acked as f64, self.load_seconds)
    }

    /// The cycle as JSON ([`crate::report::json::CycleJson`]).
    pub fn to_json(&self) -> Value {
        report::json::value(&report::json::CycleJson::from(self))
    }
}

/// What a crash loop found.
#[derive(Debug, Clone)]
pub struct CrashLoopReport {
    /// `mqtt` or `http`.
    pub transport: &'static str,
    /// `MQTT 3.1.1 QoS 1, window 10` or `HTTP/1.1 keep-alive`.
    pub protocol: String,
    /// Server name and version.
    pub server: String,
    /// Devices.
    pub devices: usize,
    /// Bytes per payload.
    pub payload_bytes: usize,
    /// The range the kill delays were drawn from.
    pub kill_after: DurationRange,
    /// Seed of the kill delays.
    pub seed: u64,
    /// GridLinks' data directory.
    pub data_dir: PathBuf,
    /// Each cycle.
    pub cycles: Vec<CycleReport>,
    /// Every acknowledged point of every cycle against what is stored after the last
    /// restart.
    pub loss_check: LossReport,
    /// With `--forward-http`: every acknowledged point of every cycle against what the
    /// sink received by the end of the drain.
    pub forwarding: Option<ForwardingReport>,
}

impl CrashLoopReport {
    /// Cycles that acknowledged nothing (a setup failure: they prove nothing).
    pub fn cycles_without_acks(&self) -> Vec<u32> {
        self.cycles.iter().filter(|c| c.acked == 0).map(|c| c.cycle).collect()
    }

    /// True when no acknowledged point is missing (stored, and at the sink with
    /// `--forward-http`) and every cycle acknowledged some.
    pub fn passed(&self) -> bool {
        self.checks_passed() && self.cycles_without_acks().is_empty()
    }

    /// True when no acknowledged point is missing from the store or the sink.
    pub fn checks_passed(&self) -> bool {
        self.loss_check.passed() && self.forwarding.as_ref().is_none_or(ForwardingReport::passed)
    }

    /// Acknowledged points of all cycles.
    pub fn acked(&self) -> u64 {
        self.cycles.iter().map(|c| c.acked).sum()
    }

    /// Seconds of load of all cycles.
    pub fn load_seconds(&self) -> f64 {
        self.cycles.iter().map(|c| c.load_seconds).sum()
    }

    /// (min, mean, max) restart-to-ready seconds; zeros without cycles.
    pub fn restart_to_ready(&self) -> (f64, f64, f64) {
        let times = self.cycles.iter().map(|c| c.restart_to_ready);
        let Some(first) = times.clone().next() else {
            return (0.0, 0.0, 0.0);
        };
        let (min, max) = times.clone().fold((first, first), |(lo, hi), t| (lo.min(t), hi.max(t)));
        (min, times.sum::<f64>() / self.cycles.len() as f64, max)
    }

    /// The human summary: settings, a line per cycle, totals, the loss check's verdict.
    pub fn human(&self) -> String {
        let (min, max) = (self.kill_after.min.as_secs_f64(), self.kill_after.max.as_secs_f64());
        let delays = if min == max {
            format!("{min:.2} s of load")
        } else {
            format!("{min:.2}-{max:.2} s of load (--seed {} repeats these delays)", self.seed)
        };
        let mut s = format!(
            "crash-loop     kill -9 under {} load: {} cycles, {} devices, {}\n\
             kill after     {delays}\n\
             data dir       {}\n",
            self.protocol,
            self.cycles.len(),
            thousands(self.devices as u64),
            self.server,
            self.data_dir.display(),
        );
        s.push_str("cycle  connected  load s      acked    acked/s  ack p99 ms  restart->ready s\n");
        for c in &self.cycles {
            let _ = writeln!(
                s,
                "{:>5}  {:>9}  {:>6.2}  {:>9}  {:>9}  {:>10.1}  {:>16.3}{}",
                c.cycle,
                thousands(c.connected),
                c.load_seconds,
                thousands(c.acked),
                thousands(c.acked_per_second().round() as u64),
                c.ack_latency.p99_us as f64 / 1000.0,
                c.restart_to_ready,
                cycle_notes(c),
            );
        }
        let (min, mean, max) = self.restart_to_ready();
        let _ = writeln!(
            s,
            "total             {:>7.2}  {:>9}  {:>9}  restart->ready min {:.3} s, mean {:.3} s, max {:.3} s",
            self.load_seconds(),
            thousands(self.acked()),
            thousands(per_second(self.acked() as f64, self.load_seconds()).round() as u64),
            min,
            mean,
            max,
        );
        if let Some(f) = &self.forwarding {
            s.push_str(&f.human());
        }
        s.push_str(&self.loss_check.human());
        let idle = self.cycles_without_acks();
        if !idle.is_empty() {
            let _ = writeln!(s, "CRASH LOOP FAILED: cycles {idle:?} acknowledged nothing (the setup proves nothing)");
        }
        s
    }

    /// The JSON result ([`crate::report::json::CrashLoopJson`]).
    pub fn to_json(&self) -> Value {
        report::json::value(&report::json::CrashLoopJson::from(self))
    }
}

/// Failures worth a note after a cycle's line.
fn cycle_notes(c: &CycleReport) -> String {
    let mut notes = Vec::new();
    let failed: u64 = c.connect_failures.values().sum();
    if failed > 0 {
        notes.push(format!("{failed} failed to connect"));
    }
    let refused: u64 = c.refused.values().sum();
    if refused > 0 {
        notes.push(format!("{refused} refused"));
    }
    if notes.is_empty() {
        String::new()
    } else {
        format!("  ({})", notes.join(", "))
    }
}

/// Runs `crash-loop` and prints its report. Exit code 2 when acknowledged points are
/// missing; an error (exit code 1) when a cycle acknowledged nothing.
pub async fn run(args: CrashLoopArgs) -> anyhow::Result<std::process::ExitCode> {
    if args.transport == Transport::Http {
        if !args.sources.is_empty() {
            bail!("--sources applies to --transport mqtt only");
        }
        if args.window.is_some() {
            bail!("--window applies to --transport mqtt only (HTTP has one request in flight per device)");
        }
    }
    if let Some(dir) = &args.data_dir {
        check_empty(dir)?;
    }
    crate::scenario::check_fd_limit(args.devices)?;
    let seed = args.seed.unwrap_or_else(random_seed);
    let bins = Binaries::with_gridlinks(args.gridlinks_bin.as_deref());
    let mut server = ManagedServer::start_on(ServerKind::Gridlinks, &bins, args.data_dir.as_deref())
        .await
        .context("starting gridlinks")?;
    let outcome = crash_loop(&args, seed, &mut server).await;
    let report = match outcome {
        Ok(report) => report,
        Err(e) => {
            server.keep_dir();
            return Err(e.context(format!("crash loop stopped (server log kept in {})", server.dir().display())));
        }
    };
    print!("{}", report.human());
    if let Some(path) = &args.json {
        report::write_json(path, &report.to_json())?;
    }
    if !report.passed() {
        server.keep_dir();
        eprintln!("kept the server's log and data: {} (data in {})", server.dir().display(), report.data_dir.display());
    }
    server.stop().await?;
    let idle = report.cycles_without_acks();
    if report.checks_passed() && !idle.is_empty() {
        bail!("cycles {idle:?} acknowledged nothing: check the server log and the options");
    }
    Ok(crate::exit_code(report.checks_passed()))
}

/// Fails unless `dir` is absent or an empty directory: the proof starts from an empty store.
fn check_empty(dir: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!("--data-dir {} is not empty: crash-loop starts from an empty store", dir.display());
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("reading --data-dir {}", dir.display())),
    }
}

/// A seed from the process's random hasher keys.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(loss_check::unix_micros());
    h.finish()
}

/// Provisioning, the cycles and the final check on the started `server`.
async fn crash_loop(args: &CrashLoopArgs, seed: u64, server: &mut ManagedServer) -> anyhow::Result<CrashLoopReport> {
    let (base, password) = server.api().context("gridlinks has a REST API")?;
    let api = ApiTarget { base, user: "admin".into(), password };
    let names: Vec<String> = (0..args.devices).map(provisioned_name).collect();
    let tokens = provision(api.clone(), names.clone()).await?;
    let window = args.window.unwrap_or(DEFAULT_WINDOW);
    let setup = Setup {
        transport: args.transport,
        devices: args.devices,
        window,
        mqtt_version: args.mqtt_version,
        sources: args.sources.clone(),
        connect_rate: args.connect_rate,
        payload: PayloadSpec { target_len: args.payload_bytes, kind: PayloadKind::Telemetry, template: None },
        tokens,
    };
    let mut rng = Rng::new(seed);
    let mut acks: Vec<AckLog> = vec![AckLog::default(); args.devices];
    let mut cycles = Vec::with_capacity(args.cycles as usize);
    let mut forwarding = match args.forward_http {
        true => Some(
            Forwarding::start_http(api.clone(), args.forward_batch_size, args.forward_drain, Arc::default()).await?,
        ),
        false => None,
    };
    let started = Instant::now();
    // Stamps of the next cycle start past every stamp sent so far.
    let mut first_ts = 0u64;
    for cycle in 1..=args.cycles {
        let delay = args.kill_after.at(rng.unit());
        eprintln!("cycle {cycle}/{}: load, kill -9 after {:.2} s", args.cycles, delay.as_secs_f64());
        let outage =
            forwarding.as_ref().and_then(|f| Some((f.http_receiver()?, f.stats_reader()))).map(|(receiver, stats)| {
                let (at, down) = (delay / 4, args.receiver_down);
                tokio::spawn(async move {
                    tokio::time::sleep(at).await;
                    receiver.stop().await;
                    eprintln!("cycle {cycle}: the sink's receiver stopped, {:.2} s down", down.as_secs_f64());
                    tokio::time::sleep(down).await;
                    receiver.resume().await?;
                    // What the server counted meanwhile (nothing if it was killed first).
                    anyhow::Ok(stats.read().await.map(|s| s.failed_attempts))
                })
            });
        let load = match setup.transport {
            Transport::Mqtt => mqtt_cycle(&setup, server, first_ts, delay).await?,
            Transport::Http => http_cycle(&setup, server, first_ts, delay).await?,
        };
        let restart_to_ready =
            server.start_again().await.with_context(|| format!("restarting after the kill of cycle {cycle}"))?;
        if let (Some(outage), Some(f)) = (outage, forwarding.as_mut()) {
            f.count_outage(outage.await.context("the receiver outage task")??);
        }
        eprintln!(
            "cycle {cycle}/{}: {} points acknowledged in {:.2} s; ready {:.3} s after the restart",
            args.cycles,
            thousands(load.acked()),
            load.load_seconds,
            restart_to_ready.as_secs_f64()
        );
        first_ts = first_ts.max(load.last_ts + 1);
        let acked = load.acked();
        for (all, more) in acks.iter_mut().zip(load.acks) {
            all.ts.extend(more.ts);
            all.ack_ms.extend(more.ack_ms);
        }
        cycles.push(CycleReport {
            cycle,
            kill_after: delay,
            connected: load.connected,
            connect_failures: load.connect_failures,
            connect_seconds: load.connect_seconds,
            load_seconds: load.load_seconds,
            sent: load.sent,
            acked,
            ack_latency: load.ack_latency,
            ended: load.ended,
            refused: load.refused,
            restart_to_ready: restart_to_ready.as_secs_f64(),
        });
    }
    let forwarding = match forwarding {
        Some(f) => {
            eprintln!(
                "waiting for every acknowledged point at the sink (at most {:.0} s)",
                args.forward_drain.as_secs_f64()
            );
            Some(f.finish(&names, &acks, started, Instant::now()).await?)
        }
        None => None,
    };
    let devices: Vec<DeviceAcks> = names.into_iter().zip(acks).map(|(name, acks)| DeviceAcks { name, acks }).collect();
    eprintln!("checking {} devices for lost points", thousands(devices.len() as u64));
    let threads = usize::from(args.verify_threads);
    let loss_check = tokio::task::spawn_blocking(move || loss_check::check(&api, &devices, threads)).await??;
    Ok(CrashLoopReport {
        transport: match args.transport {
            Transport::Mqtt => "mqtt",
            Transport::Http => "http",
        },
        protocol: match args.transport {
            Transport::Mqtt => {
                format!("MQTT {} QoS 1 (window {window})", args.mqtt_version.label())
            }
            Transport::Http => "HTTP/1.1 keep-alive".into(),
        },
        server: server.version().to_string(),
        devices: args.devices,
        payload_bytes: telemetry::render_payload(&mut bytes::BytesMut::new(), &setup.payload, 0, 0).len(),
        kill_after: args.kill_after,
        seed,
        data_dir: args.data_dir.clone().unwrap_or_else(|| server.dir().join("data")),
        cycles,
        loss_check,
        forwarding,
    })
}

/// What the devices did in one cycle.
struct CycleLoad {
    connected: u64,
    connect_failures: Reasons,
    connect_seconds: f64,
    load_seconds: f64,
    sent: u64,
    ack_latency: LatencySummary,
    ended: Reasons,
    refused: Reasons,
    /// Acknowledged points per device.
    acks: Vec<AckLog>,
    /// The highest stamp sent.
    last_ts: u64,
}

impl CycleLoad {
    fn acked(&self) -> u64 {
        self.acks.iter().map(|a| a.ts.len() as u64).sum()
    }
}

/// Runs `load` (a fleet's window, which starts when first polled) and sends SIGKILL
/// `delay` after its start, and not before the first acknowledgement (`acked` > 0;
/// waiting at most [`FIRST_ACK_PATIENCE`] more, and not once the load has ended): a
/// cycle that acknowledged nothing proves nothing, and a busy machine may take longer
/// than `delay` to answer at all. The load's result and when the kill went out.
async fn under_kill<T>(
    server: &mut ManagedServer,
    delay: Duration,
    acked: &AtomicU64,
    load: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, Instant)> {
    let start = Instant::now();
    let ended = AtomicBool::new(false);
    let load = async {
        let result = load.await;
        ended.store(true, Ordering::Relaxed);
        result
    };
    let kill = async {
        tokio::time::sleep_until(start + delay).await;
        let give_up = Instant::now() + FIRST_ACK_PATIENCE;
        while Counters::get(acked) == 0 && !ended.load(Ordering::Relaxed) && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let at = Instant::now();
        server.kill().await.map(|()| at)
    };
    let (load, killed_at) = tokio::join!(load, kill);
    let killed_at = killed_at.context("killing the server")?;
    Ok((load?, killed_at))
}

/// The per-second progress line of a cycle (server CPU while it lives).
fn progress(counters: &Arc<Counters>, latency: &Arc<LatencyShards>, pid: u32) -> Progress {
    Progress::start(
        ProgressKind::Telemetry,
        ProgressSources {
            counters: Arc::clone(counters),
            server: ProcessStats::new(pid).ok(),
            ack_latency: Some(Arc::clone(latency)),
            e2e_latency: None,
            keep_buckets: false,
        },
        "connecting",
    )
}

/// One MQTT cycle: connect, publish QoS 1 until the kill.
async fn mqtt_cycle(
    setup: &Setup,
    server: &mut ManagedServer,
    first_ts: u64,
    delay: Duration,
) -> anyhow::Result<CycleLoad> {
    let target = Arc::new(Target::local_tokens(
        SocketAddr::from(([127, 0, 0, 1], server.mqtt_port())),
        setup.sources.clone(),
        setup.mqtt_version.into(),
        setup.tokens.clone(),
        "bench",
    ));
    let plan = Arc::new(telemetry::Plan {
        topic: Topics::Same(TOPIC.into()),
        qos: QoS::AtLeastOnce,
        inflight: setup.window,
        payload: setup.payload.clone(),
        messages_per_device: None,
        ack_timeout: ACK_TIMEOUT,
        devices: setup.devices,
        interval: None,
        record_acks: true,
        lag_slots: None,
        ramp_up: Duration::ZERO,
        first_ts,
    });
    let counters = Arc::new(Counters::default());
    let latency = LatencyShards::new(LATENCY_SHARDS);
    let progress = progress(&counters, &latency, server.pid());
    let fleet = Fleet::connect(&target, &plan, &counters, &latency, setup.connect_rate).await?;
    let (connect_failures, connect_seconds) = (fleet.connect_failures.clone(), fleet.connect_seconds);
    progress.set_phase("publishing");
    let (result, killed_at) =
        under_kill(server, delay, &counters.acked, fleet.publish(Some(delay + LOAD_LIMIT_AFTER_KILL))).await?;
    progress.finish();
    // Only devices whose window ended before the kill could still be connected.
    disconnect_all(result.open).await;
    Ok(CycleLoad {
        connected: Counters::get(&counters.connected),
        connect_failures,
        connect_seconds,
        load_seconds: killed_at.saturating_duration_since(result.start).as_secs_f64(),
        sent: Counters::get(&counters.sent),
        ack_latency: LatencySummary::from_histogram(&latency.merged()),
        ended: result.lost,
        refused: Reasons::new(),
        acks: result.acks,
        last_ts: result.last_ts,
    })
}

/// One HTTP cycle: connect, post until the kill.
async fn http_cycle(
    setup: &Setup,
    server: &mut ManagedServer,
    first_ts: u64,
    delay: Duration,
) -> anyhow::Result<CycleLoad> {
    let (base, _) = server.api().context("gridlinks has a REST API")?;
    let host = base.trim_start_matches("http://").to_string();
    let address: SocketAddr = host.parse().with_context(|| format!("the API address {host} is not IP:PORT"))?;
    let plan = Arc::new(http_telemetry::Plan {
        devices: setup.devices,
        host,
        server: address,
        payload: setup.payload.clone(),
        interval: None,
        messages_per_device: None,
        timeout: ACK_TIMEOUT,
        record_acks: true,
        lag_slots: None,
        first_ts,
    });
    let counters = Arc::new(Counters::default());
    let latency = LatencyShards::new(LATENCY_SHARDS);
    let progress = progress(&counters, &latency, server.pid());
    let fleet = HttpFleet::connect(&plan, setup.tokens.clone(), &counters, &latency, setup.connect_rate).await;
    let (connect_failures, connect_seconds) = (fleet.connect_failures.clone(), fleet.connect_seconds);
    progress.set_phase("posting");
    let (result, killed_at) =
        under_kill(server, delay, &counters.acked, fleet.post(Some(delay + LOAD_LIMIT_AFTER_KILL))).await?;
    progress.finish();
    Ok(CycleLoad {
        connected: Counters::get(&counters.connected),
        connect_failures,
        connect_seconds,
        load_seconds: killed_at.saturating_duration_since(result.start).as_secs_f64(),
        sent: Counters::get(&counters.sent),
        ack_latency: LatencySummary::from_histogram(&latency.merged()),
        ended: result.lost,
        refused: result.refused,
        acks: result.acks,
        last_ts: result.last_ts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle(n: u32, acked: u64, load: f64, ready: f64) -> CycleReport {
        CycleReport {
            cycle: n,
            kill_after: Duration::from_secs_f64(load),
            connected: 10,
            connect_failures: Reasons::new(),
            connect_seconds: 0.01,
            load_seconds: load,
            sent: acked + 10,
            acked,
            ack_latency: LatencySummary::default(),
            ended: Reasons::from([("closed by server".to_string(), 10)]),
            refused: Reasons::new(),
            restart_to_ready: ready,
        }
    }

    fn report(cycles: Vec<CycleReport>, missing: u64) -> CrashLoopReport {
        CrashLoopReport {
            transport: "mqtt",
            protocol: "MQTT 3.1.1 QoS 1 (window 10)".into(),
            server: "gridlinks 0.1.0".into(),
            devices: 10,
            payload_bytes: 100,
            kill_after: DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(2) },
            seed: 7,
            data_dir: PathBuf::from("/tmp/d"),
            cycles,
            loss_check: LossReport { missing, ..Default::default() },
            forwarding: None,
        }
    }

    #[test]
    fn totals_add_the_cycles_and_the_verdict_needs_acks_in_every_cycle() {
        let r = report(vec![cycle(1, 1000, 2.0, 0.2), cycle(2, 3000, 2.0, 0.4)], 0);
        assert!(r.passed());
        assert_eq!(r.acked(), 4000);
        let (min, mean, max) = r.restart_to_ready();
        assert_eq!((min, max), (0.2, 0.4));
        assert!((mean - 0.3).abs() < 1e-9);
        let j = r.to_json();
        assert_eq!(j["totals"]["acked_per_second"], 1000.0);
        assert_eq!(j["cycles"][1]["acked_per_second"], 1500.0);
        assert_eq!(j["passed"], true);
        let text = r.human();
        assert!(text.contains("--seed 7"), "{text}");
        assert!(text.ends_with("LOSS CHECK PASSED\n"), "{text}");

        let idle = report(vec![cycle(1, 1000, 2.0, 0.2), cycle(2, 0, 2.0, 0.4)], 0);
        assert_eq!(idle.cycles_without_acks(), vec![2]);
        assert!(!idle.passed());
        assert!(idle.human().contains("CRASH LOOP FAILED: cycles [2]"));

        let lost = report(vec![cycle(1, 1000, 2.0, 0.2)], 3);
        assert!(!lost.passed());
        assert_eq!(lost.to_json()["totals"]["missing"], 3);
    }

    #[test]
    fn kill_delays_repeat_with_the_seed() {
        let range = DurationRange { min: Duration::from_secs(2), max: Duration::from_secs(6) };
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..12).map(|_| range.at(rng.unit())).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
        assert!(draw(42).iter().all(|d| (range.min..=range.max).contains(d)));
    }

    #[test]
    fn only_an_empty_or_absent_data_dir_is_taken() {
        let dir = std::env::temp_dir().join(format!("crash-loop-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(check_empty(&dir).is_ok(), "absent");
        std::fs::create_dir_all(&dir).unwrap();
        assert!(check_empty(&dir).is_ok(), "empty");
        std::fs::write(dir.join("x"), "").unwrap();
        assert!(check_empty(&dir).is_err(), "not empty");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
