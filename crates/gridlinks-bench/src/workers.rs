//! `--workers N`: one `mqtt-telemetry` or `connect` run spread over N generator
//! processes, for more connections than one process may open (the open-files limit is
//! per process).
//!
//! The parent provisions the devices (if asked), starts N copies of itself as
//! `gridlinks-bench worker` and sends each its job on stdin: the scenario's options with
//! its slice of the connections (`worker_offset`, `devices`/`connections`). The phases
//! stay in step over the pipes: each worker prints `ready` once connected and waits; the
//! parent, when all are ready, reads the server's CPU and memory and answers `go`; each
//! prints `done` at the end of its window (before disconnecting) and waits; the parent
//! reads the server again and answers `bye`; each then prints its result as one JSON
//! line. The parent adds the counts, merges the latency histograms and runs the loss
//! check over all workers' acknowledgements. Only the first worker prints progress.
//! Each worker's result carries its per-second timeline with each second's latency
//! histogram, and the parent merges them into the run's timeline
//! ([`Timeline::merge`]); the server's CPU and memory per second are not in it (the
//! workers do not watch the server).

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::cli::{ConnectArgs, OutputArgs, TargetArgs, TelemetryArgs};
use crate::loss_check::{self, DeviceAcks};
use crate::proc_stats::{ProcessStats, Sample};
use crate::report::{ConnectReport, LatencySummary, Reasons, ServerCost, ServerMemory, TelemetryReport};
use crate::scenario::{self, telemetry};
use crate::stats::{buckets, new_histogram, Buckets};
use crate::timeline::Timeline;

/// A worker's job.
// One per worker process: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
pub enum Job {
    /// Its slice of an `mqtt-telemetry` run.
    Telemetry(TelemetryArgs),
    /// Its slice of a `connect` run.
    Connect(ConnectArgs),
}

/// What a worker reports back.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WorkerResult {
    connected: u64,
    connect_failures: Reasons,
    connect_seconds: f64,
    window_seconds: f64,
    sent: u64,
    acked: u64,
    failed: u64,
    dropped: Reasons,
    pings: u64,
    generator_cpu_seconds: f64,
    /// Latency histogram (PUBACK or CONNACK) as (µs, count) pairs.
    latency: Buckets,
    /// One sample a second, with each second's latency buckets.
    timeline: Timeline,
}

/// (offset, count) of each of `workers` slices of `total` connections; empty slices
/// (more workers than connections) are left out.
pub fn slices(total: usize, workers: usize) -> Vec<(usize, usize)> {
    let workers = workers.max(1);
    (0..workers)
        .map(|i| {
            let (from, to) = (total * i / workers, total * (i + 1) / workers);
            (from, to - from)
        })
        .filter(|&(_, count)| count > 0)
        .collect()
}

/// `gridlinks-bench worker`: runs the job read from stdin and prints its result.
pub async fn worker_main() -> anyhow::Result<std::process::ExitCode> {
    let job: Job = serde_json::from_str(&read_line().await?).context("reading the job")?;
    let result = match job {
        Job::Telemetry(args) => {
            scenario::QUIET.store(args.target.worker_offset.unwrap_or(0) > 0, Ordering::Relaxed);
            let r = telemetry::measure(&args).await?;
            WorkerResult {
                connected: r.connected,
                connect_failures: r.connect_failures,
                connect_seconds: r.connect_seconds,
                window_seconds: r.window_seconds,
                sent: r.sent,
                acked: r.acked,
                failed: r.failed,
                dropped: r.dropped,
                pings: 0,
                generator_cpu_seconds: r.generator_cpu_seconds,
                latency: r.latency_histogram.as_ref().map(buckets).unwrap_or_default(),
                timeline: r.timeline,
            }
        }
        Job::Connect(args) => {
            scenario::QUIET.store(args.target.worker_offset.unwrap_or(0) > 0, Ordering::Relaxed);
            let r = scenario::connect::measure(&args).await?;
            WorkerResult {
                connected: r.connected,
                connect_failures: r.failures,
                connect_seconds: r.connect_seconds,
                window_seconds: r.hold_seconds,
                dropped: r.dropped,
                pings: r.pings,
                latency: r.connack_histogram.as_ref().map(buckets).unwrap_or_default(),
                timeline: r.timeline,
                ..Default::default()
            }
        }
    };
    println!("{}", serde_json::to_string(&result)?);
    Ok(std::process::ExitCode::SUCCESS)
}

/// In a worker process: tells the parent that `phase` is reached and waits for its
/// answer. Does nothing in a process of its own.
pub async fn sync(target: &TargetArgs, phase: &str) -> anyhow::Result<()> {
    if target.worker_offset.is_none() {
        return Ok(());
    }
    println!("{phase}");
    read_line().await.map(drop)
}

/// One line of stdin, without its newline; an error at end of input (the parent died).
async fn read_line() -> anyhow::Result<String> {
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line)? == 0 {
            bail!("stdin closed: the parent process is gone");
        }
        Ok(line.trim_end().to_string())
    })
    .await?
}

/// The workers of a run, in step.
struct Workers {
    children: Vec<(Child, ChildStdin, Lines<BufReader<ChildStdout>>)>,
}

impl Workers {
    /// Starts one worker per job.
    async fn spawn(jobs: Vec<Job>) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating gridlinks-bench")?;
        let mut children = Vec::with_capacity(jobs.len());
        for job in jobs {
            let mut child = Command::new(&exe)
                .arg("worker")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .context("starting a worker")?;
            let mut stdin = child.stdin.take().context("worker stdin")?;
            let stdout = child.stdout.take().context("worker stdout")?;
            let mut line = serde_json::to_string(&job)?;
            line.push('\n');
            stdin.write_all(line.as_bytes()).await?;
            children.push((child, stdin, BufReader::new(stdout).lines()));
        }
        Ok(Workers { children })
    }

    /// Waits until every worker printed `phase`.
    async fn expect(&mut self, phase: &str) -> anyhow::Result<()> {
        for (i, (_, _, lines)) in self.children.iter_mut().enumerate() {
            match lines.next_line().await? {
                Some(line) if line == phase => {}
                Some(other) => bail!("worker {i} said {other:?} instead of {phase:?}"),
                None => bail!("worker {i} ended before {phase:?} (its error is above)"),
            }
        }
        Ok(())
    }

    /// Answers every worker.
    async fn tell(&mut self, word: &str) -> anyhow::Result<()> {
        for (_, stdin, _) in &mut self.children {
            stdin.write_all(format!("{word}\n").as_bytes()).await?;
        }
        Ok(())
    }

    /// Every worker's result line; waits for them to exit.
    async fn results(self) -> anyhow::Result<Vec<WorkerResult>> {
        let mut out = Vec::with_capacity(self.children.len());
        for (i, (mut child, stdin, mut lines)) in self.children.into_iter().enumerate() {
            drop(stdin);
            let line = lines.next_line().await?.with_context(|| format!("worker {i} ended without a result"))?;
            out.push(serde_json::from_str(&line).context("reading a worker's result")?);
            let status = child.wait().await?;
            if !status.success() {
                bail!("worker {i} exited with {status}");
            }
        }
        Ok(out)
    }
}

/// The server's highest RSS while a phase runs, sampled once a second.
struct RssPeak {
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssPeak {
    fn start(server: Option<ProcessStats>) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&peak);
        let task = tokio::spawn(async move {
            let Some(server) = server else { return };
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                if let Ok(s) = server.sample() {
                    seen.fetch_max(s.memory.rss_kib, Ordering::Relaxed);
                }
            }
        });
        RssPeak { peak, task }
    }

    fn finish(self, last: Option<&Sample>) -> u64 {
        self.task.abort();
        let peak = self.peak.load(Ordering::Relaxed);
        last.map_or(peak, |s| peak.max(s.memory.rss_kib))
    }
}

fn sample(server: &Option<ProcessStats>) -> anyhow::Result<Option<Sample>> {
    server.as_ref().map(|s| s.sample().context("reading server /proc")).transpose()
}

/// The options every worker shares: one process's worth, no output files, no server.
fn worker_target(target: &TargetArgs, offset: usize) -> TargetArgs {
    let mut t = target.clone();
    t.workers = 1;
    t.worker_offset = Some(offset);
    t.server_pid = Vec::new();
    t.output = OutputArgs::default();
    t
}

/// The workers' results added up (`latency` left empty, `timeline` merged second by
/// second), and their merged latency.
fn merge(results: Vec<WorkerResult>) -> anyhow::Result<(WorkerResult, LatencySummary)> {
    let mut h = new_histogram();
    let mut m = WorkerResult::default();
    let mut timelines = Vec::with_capacity(results.len());
    for r in results {
        timelines.push(r.timeline);
        m.connected += r.connected;
        m.connect_seconds = m.connect_seconds.max(r.connect_seconds);
        m.window_seconds = m.window_seconds.max(r.window_seconds);
        m.sent += r.sent;
        m.acked += r.acked;
        m.failed += r.failed;
        m.pings += r.pings;
        m.generator_cpu_seconds += r.generator_cpu_seconds;
        for (reason, n) in r.connect_failures {
            *m.connect_failures.entry(reason).or_default() += n;
        }
        for (reason, n) in r.dropped {
            *m.dropped.entry(reason).or_default() += n;
        }
        for (value, count) in r.latency {
            h.record_n(value, count).context("worker latency out of range")?;
        }
    }
    m.timeline = Timeline::merge(&timelines);
    Ok((m, LatencySummary::from_histogram(&h)))
}

/// `mqtt-telemetry --workers N`.
pub async fn telemetry(args: &TelemetryArgs) -> anyhow::Result<TelemetryReport> {
    if args.storage_lag {
        bail!("--storage-lag samples within one process: leave out --workers");
    }
    let checking = args.verify || args.save_acks.is_some();
    let names = telemetry::device_names_of(
        args.devices,
        args.provision,
        checking,
        args.device_names_file.as_deref(),
        args.target.tokens_file.as_deref(),
    )?;
    let dir = std::env::temp_dir().join(format!("gridlinks-bench-workers-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = telemetry_in(args, names, checking, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn telemetry_in(
    args: &TelemetryArgs,
    names: Option<Vec<String>>,
    checking: bool,
    dir: &std::path::Path,
) -> anyhow::Result<TelemetryReport> {
    let mut base = args.clone();
    base.verify = false;
    if args.provision {
        let api = args.api.target("--provision")?;
        let names = names.clone().context("provisioned names")?;
        let profile = telemetry::device_profile_of(args.device_profile.as_deref(), true)?;
        let tokens = telemetry::provision_into(api, names.clone(), profile).await?;
        let (tokens_file, names_file) = (dir.join("tokens"), dir.join("names"));
        std::fs::write(&tokens_file, tokens.join("\n"))?;
        std::fs::write(&names_file, names.join("\n"))?;
        base.provision = false;
        base.device_profile = None;
        base.target.tokens_file = Some(tokens_file);
        base.device_names_file = Some(names_file);
    }
    let slices = slices(args.devices, args.target.workers);
    let acks_file = |i: usize| dir.join(format!("acks-{i}.json"));
    let jobs = slices
        .iter()
        .enumerate()
        .map(|(i, &(offset, count))| {
            let mut a = base.clone();
            a.target = worker_target(&base.target, offset);
            a.devices = count;
            a.save_acks = checking.then(|| acks_file(i));
            Job::Telemetry(a)
        })
        .collect();
    let server = crate::scenario::server_stats(&args.target.server_pid)?;
    let mut workers = Workers::spawn(jobs).await?;
    workers.expect("ready").await?;
    let before = sample(&server)?;
    let peak = RssPeak::start(server.clone());
    workers.tell("go").await?;
    workers.expect("done").await?;
    let after = sample(&server)?;
    let rss_peak = peak.finish(after.as_ref());
    workers.tell("bye").await?;
    let (m, latency) = merge(workers.results().await?)?;
    let mut report = TelemetryReport {
        scenario: "mqtt-telemetry",
        server: format!("{}:{}", args.target.host, args.target.port),
        protocol: format!("MQTT {}", args.target.version_label()),
        devices: args.devices,
        qos: args.qos,
        inflight: args.inflight,
        offered_rate: args.rate,
        payload_bytes: args.payload_bytes,
        connected: m.connected,
        connect_failures: m.connect_failures,
        connect_seconds: m.connect_seconds,
        window_seconds: m.window_seconds,
        sent: m.sent,
        acked: m.acked,
        failed: m.failed,
        dropped: m.dropped,
        puback: (args.qos == 1).then_some(latency),
        server_cost: ServerCost::between(server.as_ref(), before, after, Some(rss_peak)),
        generator_cpu_seconds: m.generator_cpu_seconds,
        timeline: m.timeline,
        ..Default::default()
    };
    if checking {
        let mut devices: Vec<DeviceAcks> = Vec::with_capacity(args.devices);
        for i in 0..slices.len() {
            devices.extend(loss_check::load(&acks_file(i))?);
        }
        let api = if args.verify { Some(args.api.target("--verify")?) } else { None };
        report.loss_check = telemetry::check_losses_of(
            &args.api,
            args.verify,
            args.save_acks.as_deref(),
            api,
            devices.iter().map(|d| d.name.clone()).collect(),
            devices.into_iter().map(|d| d.acks).collect(),
        )
        .await?;
    }
    Ok(report)
}

/// `connect --workers N`.
pub async fn connect(args: &ConnectArgs) -> anyhow::Result<ConnectReport> {
    let dir = std::env::temp_dir().join(format!("gridlinks-bench-workers-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = connect_in(args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn connect_in(args: &ConnectArgs, dir: &std::path::Path) -> anyhow::Result<ConnectReport> {
    let mut base = args.clone();
    if args.provision {
        let names = (0..args.connections).map(telemetry::provisioned_name).collect();
        let tokens = telemetry::provision(args.api.target("--provision")?, names).await?;
        let tokens_file = dir.join("tokens");
        std::fs::write(&tokens_file, tokens.join("\n"))?;
        base.provision = false;
        base.target.tokens_file = Some(tokens_file);
    }
    let jobs = slices(args.connections, args.target.workers)
        .into_iter()
        .map(|(offset, count)| {
            let mut a = base.clone();
            a.target = worker_target(&base.target, offset);
            a.connections = count;
            // Each worker paces its share of the rate.
            a.rate = args.rate * count as f64 / args.connections.max(1) as f64;
            Job::Connect(a)
        })
        .collect();
    let server = crate::scenario::server_stats(&args.target.server_pid)?;
    let before = sample(&server)?;
    let mut workers = Workers::spawn(jobs).await?;
    workers.expect("ready").await?;
    let connected = sample(&server)?;
    let peak = RssPeak::start(server.clone());
    workers.tell("go").await?;
    workers.expect("done").await?;
    let end = sample(&server)?;
    let hold_max = peak.finish(end.as_ref());
    workers.tell("bye").await?;
    let (m, connack) = merge(workers.results().await?)?;
    let server_memory = match (&server, before, connected, end) {
        (Some(s), Some(before), Some(connected), Some(end)) => Some(ServerMemory {
            pid: s.pid(),
            rss_before_kib: before.memory.rss_kib,
            rss_connected_kib: connected.memory.rss_kib,
            rss_hold_max_kib: hold_max,
            rss_end_kib: end.memory.rss_kib,
            hwm_kib: end.memory.hwm_kib,
            connect_cpu_seconds: connected.cpu_seconds - before.cpu_seconds,
            hold_cpu_seconds: end.cpu_seconds - connected.cpu_seconds,
        }),
        _ => None,
    };
    Ok(ConnectReport {
        server: format!("{}:{}", args.target.host, args.target.port),
        mqtt_version: args.target.version_label(),
        requested: args.connections,
        rate: args.rate,
        connected: m.connected,
        failures: m.connect_failures,
        connect_seconds: m.connect_seconds,
        connack,
        hold_seconds: m.window_seconds,
        pings: m.pings,
        dropped: m.dropped,
        server_memory,
        timeline: m.timeline,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_every_connection_once() {
        assert_eq!(slices(10, 3), [(0, 3), (3, 3), (6, 4)]);
        assert_eq!(slices(2, 4), [(0, 1), (1, 1)]);
        let total: usize = slices(40_001, 3).iter().map(|s| s.1).sum();
        assert_eq!(total, 40_001);
    }

    #[test]
    fn merged_results_add_counts_and_histograms() {
        let r = |acked, latency: Vec<(u64, u64)>| WorkerResult {
            connected: 5,
            acked,
            sent: acked,
            latency,
            window_seconds: acked as f64,
            ..Default::default()
        };
        let (m, latency) = merge(vec![r(10, vec![(1000, 10)]), r(30, vec![(3000, 30)])]).unwrap();
        assert_eq!((m.connected, m.acked, m.sent), (10, 40, 40));
        assert_eq!(m.window_seconds, 30.0);
        assert_eq!(latency.count, 40);
        assert!(latency.p50_us >= 2990 && latency.p50_us <= 3010, "{latency:?}");
    }
}
