//! `connect`: a connection storm, then every connection held idle.
//!
//! Phases:
//! 1. **connect**: N connections at `--rate` per second (0: as fast as `--max-pending`
//!    handshakes in flight allow); connects/s is successful CONNACKs over the time from
//!    the first attempt to the last outcome. Connections ping while waiting.
//! 2. **hold**: all connections idle for `--hold`, sending PINGREQ every 3/4 keep-alive,
//!    while the server's RSS is sampled once a second.
//! 3. **disconnect**: DISCONNECT on every connection.
//!
//! Server memory per connection is (RSS once all are connected − RSS before the first)
//! divided by the connections established.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::telemetry::{disconnect_all, provision, provisioned_name};
use super::{idle_until, wait_for_some, ConnectPacer, Credentials, Progress, ProgressKind, ProgressSources, Target};
use crate::cli::ConnectArgs;
use crate::figures;
use crate::mqtt_client::MqttConnection;
use crate::report::{ConnectReport, LatencySummary, Reasons, ServerMemory};
use crate::stats::{Counters, LatencyShards};

/// Connect outcomes buffered between connection tasks and the collector.
const OUTCOME_CHANNEL: usize = 1024;

/// CONNACK latency shards (see [`LatencyShards`]): one lock per connection.
const CONNACK_SHARDS: usize = 8;

/// What every connection task of a run shares.
struct Shared {
    target: Arc<Target>,
    counters: Arc<Counters>,
    /// PINGREQs sent during the hold.
    pings: Arc<AtomicU64>,
    /// CONNACK latencies, recorded by each connection before it counts as connected,
    /// so a timeline sample that sees a connection also sees its latency.
    connack: Arc<LatencyShards>,
}

/// How one held connection ended.
struct HoldResult {
    /// Why it was lost during the hold, if it was.
    lost: Option<String>,
    /// The connection, still open, for DISCONNECT.
    conn: Option<MqttConnection>,
}

/// Runs the scenario and prints its report.
pub async fn run(args: ConnectArgs) -> anyhow::Result<std::process::ExitCode> {
    figures::finish(&args.target.output, &measure(&args).await?, crate::settings::connect(&args))
}

/// Runs the scenario.
pub async fn measure(args: &ConnectArgs) -> anyhow::Result<ConnectReport> {
    if args.target.workers > 1 {
        return crate::workers::connect(args).await;
    }
    let mut target = Target::resolve(&args.target, args.connections).await?;
    if args.provision {
        let names = (0..args.connections).map(provisioned_name).collect();
        target.credentials = Credentials::Tokens(provision(args.api.target("--provision")?, names).await?);
    }
    let target = Arc::new(target);
    let counters = Arc::new(Counters::default());
    let pings = Arc::new(AtomicU64::new(0));
    let connack = LatencyShards::new(CONNACK_SHARDS);
    let progress = Progress::start(
        ProgressKind::Connect,
        ProgressSources {
            counters: Arc::clone(&counters),
            server: target.server_stats.clone(),
            ack_latency: Some(Arc::clone(&connack)),
            e2e_latency: None,
            keep_buckets: args.target.worker_offset.is_some(),
        },
        "connecting",
    );
    let server_before = target.server_sample()?;

    // Phase 1: connect.
    let (outcome_tx, mut outcome_rx) = mpsc::channel::<Result<(), String>>(OUTCOME_CHANNEL);
    let (hold_tx, hold_rx) = watch::channel::<Option<Instant>>(None);
    let started = Instant::now();
    let spawner = {
        let shared = Arc::new(Shared {
            target: Arc::clone(&target),
            counters: Arc::clone(&counters),
            pings: Arc::clone(&pings),
            connack: Arc::clone(&connack),
        });
        let (rate, count) = (args.rate, args.connections);
        tokio::spawn(async move {
            let pacer = ConnectPacer::new(rate, shared.target.max_pending);
            let mut tasks = Vec::with_capacity(count);
            for index in 0..count {
                let permit = pacer.slot(index).await;
                tasks.push(tokio::spawn(hold_one(
                    index,
                    Arc::clone(&shared),
                    permit,
                    outcome_tx.clone(),
                    hold_rx.clone(),
                )));
            }
            tasks
        })
    };
    let mut failures = Reasons::new();
    for _ in 0..args.connections {
        match outcome_rx.recv().await {
            Some(Ok(())) => {}
            Some(Err(reason)) => *failures.entry(reason).or_default() += 1,
            None => break,
        }
    }
    let connect_seconds = started.elapsed().as_secs_f64();
    let connack = connack.merged();
    let tasks = spawner.await?;
    crate::workers::sync(&args.target, "ready").await?;
    let server_connected = target.server_sample()?;

    // Phase 2: hold.
    if let Some(s) = &server_connected {
        progress.reset_peak(s.memory.rss_kib);
    }
    progress.set_phase("holding");
    let hold_started = Instant::now();
    hold_tx.send_replace(Some(hold_started + args.hold));
    let mut dropped = Reasons::new();
    let mut open = Vec::with_capacity(tasks.len());
    for task in tasks {
        let result = task.await?;
        if let Some(reason) = result.lost {
            *dropped.entry(reason).or_default() += 1;
        }
        open.extend(result.conn);
    }
    let hold_seconds = hold_started.elapsed().as_secs_f64();
    crate::workers::sync(&args.target, "done").await?;
    let server_end = target.server_sample()?;
    let hold_max = server_end.map(|s| progress.peak(s.memory.rss_kib));

    // Phase 3: disconnect.
    progress.set_phase("disconnecting");
    disconnect_all(open).await;
    let timeline = progress.finish();

    let server_memory = match (&target.server_stats, server_before, server_connected, server_end) {
        (Some(stats), Some(before), Some(connected), Some(end)) => Some(ServerMemory {
            pid: stats.pid(),
            rss_before_kib: before.memory.rss_kib,
            rss_connected_kib: connected.memory.rss_kib,
            rss_hold_max_kib: hold_max.unwrap_or(end.memory.rss_kib),
            rss_end_kib: end.memory.rss_kib,
            hwm_kib: end.memory.hwm_kib,
            connect_cpu_seconds: connected.cpu_seconds - before.cpu_seconds,
            hold_cpu_seconds: end.cpu_seconds - connected.cpu_seconds,
        }),
        _ => None,
    };
    let report = ConnectReport {
        server: target.name(),
        mqtt_version: target.version_label(args.target.mqtt_version),
        requested: args.connections,
        rate: args.rate,
        connected: Counters::get(&counters.connected),
        failures,
        connect_seconds,
        connack: LatencySummary::from_histogram(&connack),
        connack_histogram: Some(connack),
        hold_seconds,
        pings: pings.load(std::sync::atomic::Ordering::Relaxed),
        dropped,
        server_memory,
        timeline,
    };
    Ok(report)
}

/// Connects connection `index`, reports the outcome, then idles until the hold ends.
async fn hold_one(
    index: usize,
    shared: Arc<Shared>,
    permit: OwnedSemaphorePermit,
    outcome: mpsc::Sender<Result<(), String>>,
    mut hold_rx: watch::Receiver<Option<Instant>>,
) -> HoldResult {
    let Shared { target, counters, pings, connack } = &*shared;
    let started = Instant::now();
    let connected = MqttConnection::connect(target.endpoint(index), &target.client_options(index)).await;
    drop(permit);
    let mut conn = match connected {
        Ok(conn) => {
            connack.record(index, started.elapsed());
            Counters::add(&counters.connected, 1);
            let _ = outcome.send(Ok(())).await;
            conn
        }
        Err(e) => {
            Counters::add(&counters.connect_failed, 1);
            let _ = outcome.send(Err(e.reason())).await;
            return HoldResult { lost: None, conn: None };
        }
    };
    drop(outcome);
    let hold_over = async {
        if let Some(end) = wait_for_some(&mut hold_rx).await {
            tokio::time::sleep_until(end).await;
        }
    };
    match idle_until(&mut conn, hold_over, target.ping_interval(), pings).await {
        Ok(()) => HoldResult { lost: None, conn: Some(conn) },
        Err(e) => {
            Counters::add(&counters.dropped, 1);
            HoldResult { lost: Some(e.reason()), conn: None }
        }
    }
}
