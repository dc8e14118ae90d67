//! `tenant-flood`: tenant isolation under a flood (issue 33). On a GridLinks the tool
//! starts, the system administrator makes one tenant profile, `limited`, whose
//! `transportTenantTelemetryMsgRateLimit` is `--limit` messages a second, and two tenants
//! that both have it, `quiet` and `noisy`, each with an administrator who bulk-imports its
//! devices. Giving both tenants the same profile shows that the rate state belongs to the
//! tenant, not to the profile.
//!
//! After a warm-up, in which every device of both tenants publishes two messages, each
//! tenant at half its limit (so that first points and cold caches are not part of phase A
//! alone), two phases, each `--duration` long, each on freshly connected MQTT 5 devices
//! publishing QoS 1 telemetry on fixed schedules (the `mqtt-telemetry` fleet):
//! - **A, baseline**: the quiet devices alone, at `--quiet-rate` in total (below the limit);
//! - **B, flood**: the quiet devices as in A, and the noisy devices at `--flood-factor` ×
//!   `--limit` in total. A PUBACK whose reason code is 0x80 or more (0x97, quota exceeded,
//!   once the tenant's limit is spent) is a refusal: counted, not acknowledged, and the
//!   device goes on with its schedule.
//!
//! Quiet PUBACK latency counts from each publish's scheduled time, as with `mqtt-telemetry
//! --rate`. Server CPU is read from /proc over each phase, and the refusal counter from
//! `/metrics` before and after it. Isolation holds when the quiet p99 of B is at most
//! `--tolerance` above A's and no quiet publish went unacknowledged.
//!
//! Afterwards each tenant administrator's REST login looks up every acknowledged point of
//! its tenant by `ts`, warm-up included. For the noisy tenant, every stored point over the
//! whole range each device sent is counted too: no refused point may be stored, so the
//! stored count equals the acknowledged count. The exit code is
//! [`crate::loss_check::EXIT_LOSS`] when either check fails. The latency verdict is
//! reported but does not set the exit code, because it depends on the machine.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use gridlinks_codec::mqtt::{ProtocolVersion, QoS};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::telemetry::{disconnect_all, send_interval, Fleet, FleetResult, PayloadKind, PayloadSpec, Plan};
use super::telemetry::{Refusals, Topics};
use super::{Progress, ProgressKind, ProgressSources, Target};
use crate::cli::TenantFloodArgs;
use crate::loss_check::{self, AckLog, DeviceAcks, LossReport, SEQ_KEY};
use crate::proc_stats::ProcessStats;
use crate::report::{per_second, thousands, LatencySummary, Reasons};
use crate::rest_api::{random_tokens, ApiTarget, RestClient};
use crate::servers::{Binaries, ManagedServer};
use crate::stats::{Counters, LatencyShards};

/// Name of the tenant profile both tenants have.
const PROFILE: &str = "limited";

/// The profile field the flood runs into, as the profile and `/metrics` name it.
const LIMIT_FIELD: &str = "transportTenantTelemetryMsgRateLimit";

/// The refusal counter in `/metrics`, one series per limit field.
const REFUSALS_METRIC: &str = "gridlinks_tenant_limit_refusals_total";

/// Topic every device publishes to.
const TOPIC: &str = "v1/devices/me/telemetry";

/// Payload size, bytes: `mqtt-telemetry`'s default (five values and a `ts`).
const PAYLOAD_BYTES: usize = 100;

/// New connections per second while a phase connects (`mqtt-telemetry`'s default).
const CONNECT_RATE: f64 = 2000.0;

/// A device that waits this long for any PUBACK stops; its unanswered publishes are
/// counted as such.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// PUBACK latency histogram shards per tenant and phase.
const LATENCY_SHARDS: usize = 16;

/// REST calls in flight during the checks.
const CHECK_THREADS: usize = 8;

/// Messages each device publishes in the warm-up before phase A, so that each device's
/// first points (new series) and the server's cold caches are not part of phase A alone.
/// Each tenant sends them at half its limit ([`WARM_UP_SHARE`]), so none is refused.
const WARM_UP_MESSAGES: u64 = 2;

/// The warm-up's offered load per tenant, as a share of `--limit`.
const WARM_UP_SHARE: f64 = 0.5;

/// Time allowed for reading `/metrics`.
const METRICS_TIMEOUT: Duration = Duration::from_secs(10);

/// A tenant of the run: its administrator's login and its devices.
struct Tenant {
    /// `quiet` or `noisy`: the tenant's title, its devices' name prefix and client id prefix.
    label: &'static str,
    /// The tenant administrator, who made the devices and whose login the checks use.
    admin: ApiTarget,
    /// Device names, `{label}-{i}`.
    names: Vec<String>,
    /// Access token of each device (same index as `names`).
    tokens: Vec<String>,
}

/// One tenant's load in one phase, before it runs.
struct Load {
    /// Where its devices connect, with their tokens.
    target: Arc<Target>,
    /// What each device publishes, and how often.
    plan: Arc<Plan>,
    /// Offered load, publishes per second over all its devices.
    rate: f64,
    /// Its live counters (the progress line shows the quiet tenant's).
    counters: Arc<Counters>,
    /// PUBACK latency of its acknowledged publishes.
    latency: Arc<LatencyShards>,
}

impl Load {
    /// `target`'s devices publishing `rate` messages a second in total (0: as fast as
    /// acks allow), at most `messages` each, stamped from `first_ts` (ms) on.
    fn new(
        target: &Arc<Target>,
        devices: usize,
        rate: f64,
        messages: Option<u64>,
        inflight: u16,
        first_ts: u64,
    ) -> Self {
        let plan = Plan {
            topic: Topics::Same(TOPIC.into()),
            qos: QoS::AtLeastOnce,
            inflight,
            payload: PayloadSpec { target_len: PAYLOAD_BYTES, kind: PayloadKind::Telemetry, template: None },
            messages_per_device: messages,
            ack_timeout: ACK_TIMEOUT,
            devices,
            interval: send_interval(rate, None, devices),
            record_acks: true,
            lag_slots: None,
            ramp_up: Duration::ZERO,
            first_ts,
        };
        Load {
            target: Arc::clone(target),
            plan: Arc::new(plan),
            rate,
            counters: Arc::new(Counters::default()),
            latency: LatencyShards::new(LATENCY_SHARDS),
        }
    }

    /// Connects every device; fails when one cannot connect (the run would not be
    /// the load it claims).
    async fn connect(&self) -> anyhow::Result<Fleet> {
        let fleet = Fleet::connect(&self.target, &self.plan, &self.counters, &self.latency, CONNECT_RATE).await?;
        if !fleet.connect_failures.is_empty() {
            bail!("{} devices could not connect: {:?}", self.target.client_id_prefix, fleet.connect_failures);
        }
        Ok(fleet)
    }

    /// Its figures after publishing for `seconds` with `result`.
    fn figures(&self, result: &FleetResult, seconds: f64) -> TenantFigures {
        let sent = Counters::get(&self.counters.sent);
        let acked: u64 = result.acked.iter().sum();
        let refused: u64 = result.refusals.iter().map(|r| r.count).sum();
        TenantFigures {
            devices: self.plan.devices,
            offered_rate: self.rate,
            sent,
            acked,
            refused,
            unanswered: sent.saturating_sub(acked + refused),
            connections_lost: result.lost.clone(),
            acked_per_second: per_second(acked as f64, seconds),
            first_refusal: result.refusals.iter().find_map(|r| r.first.clone()),
            puback: LatencySummary::from_histogram(&self.latency.merged()),
        }
    }
}

/// One tenant's figures in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct TenantFigures {
    /// Devices publishing, each on its own connection.
    pub devices: usize,
    /// Offered load, publishes per second over all devices.
    pub offered_rate: f64,
    /// Publishes sent.
    pub sent: u64,
    /// Publishes acknowledged (PUBACK reason 0).
    pub acked: u64,
    /// Publishes refused in their PUBACK (reason 0x80 or more).
    pub refused: u64,
    /// Publishes neither acknowledged nor refused: their connection was lost, or no
    /// PUBACK came within 10 s.
    pub unanswered: u64,
    /// Connections lost in the phase, by reason.
    pub connections_lost: Reasons,
    /// Acknowledged publishes per second of the phase.
    pub acked_per_second: f64,
    /// The first refusal's reason code and reason string.
    pub first_refusal: Option<String>,
    /// PUBACK latency of the acknowledged publishes, from each one's scheduled time.
    pub puback: LatencySummary,
}

/// One phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseFigures {
    /// Seconds from the start of publishing until every device had its last answer.
    pub seconds: f64,
    /// The quiet tenant.
    pub quiet: TenantFigures,
    /// The noisy tenant (phase B only).
    pub noisy: Option<TenantFigures>,
    /// Server CPU seconds over the phase.
    pub server_cpu_seconds: f64,
    /// Server CPU over the phase, percent of one core.
    pub server_cpu_percent: f64,
    /// Growth of `gridlinks_tenant_limit_refusals_total{limit="transportTenantTelemetryMsgRateLimit"}`
    /// over the phase.
    pub refusal_counter: u64,
}

/// What one tenant did in one phase: its figures and what its devices were told.
struct TenantPhase {
    /// The figures.
    figures: TenantFigures,
    /// What its devices were told.
    told: Told,
}

/// What a tenant's devices were told in one phase or over the run, for the checks.
#[derive(Default)]
struct Told {
    /// Acknowledged points per device.
    acks: Vec<AckLog>,
    /// Refused points per device.
    refusals: Vec<Refusals>,
    /// The highest stamp any device sent.
    last_ts: u64,
}

impl Told {
    /// Appends a later phase's points, device by device.
    fn add(&mut self, later: Told) {
        if self.acks.is_empty() {
            *self = later;
            return;
        }
        for (acks, more) in self.acks.iter_mut().zip(later.acks) {
            acks.ts.extend(more.ts);
            acks.ack_ms.extend(more.ack_ms);
        }
        for (refusals, more) in self.refusals.iter_mut().zip(later.refusals) {
            refusals.count += more.count;
            refusals.ts.extend(more.ts);
            refusals.first = refusals.first.take().or(more.first);
        }
        self.last_ts = self.last_ts.max(later.last_ts);
    }

    /// The stamp the next phase starts from: above every stamp sent so far.
    fn next_ts(&self) -> u64 {
        self.last_ts + 1
    }
}

/// The noisy tenant's stored points against what its devices were told, over the whole
/// range each device sent (see [`StoredTally::of`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StoredTally {
    /// Acknowledged publishes.
    pub acked: u64,
    /// Refused publishes.
    pub refused: u64,
    /// Points stored between each device's first and last answered publish.
    pub stored: u64,
    /// Acknowledged, not stored: lost.
    pub acked_missing: u64,
    /// Refused, yet stored.
    pub refused_stored: u64,
    /// Stored, neither acknowledged nor refused: publishes that went unanswered.
    pub unanswered_stored: u64,
}

impl StoredTally {
    /// One device's tally from its acknowledged and refused stamps and the stamps stored
    /// over their range, each sorted ascending without repeats.
    pub fn of(acked: &[u64], refused: &[u64], stored: &[u64]) -> Self {
        let (mut acked_stored, mut refused_stored) = (0u64, 0u64);
        for ts in stored {
            if acked.binary_search(ts).is_ok() {
                acked_stored += 1;
            } else if refused.binary_search(ts).is_ok() {
                refused_stored += 1;
            }
        }
        StoredTally {
            acked: acked.len() as u64,
            refused: refused.len() as u64,
            stored: stored.len() as u64,
            acked_missing: acked.len() as u64 - acked_stored,
            refused_stored,
            unanswered_stored: stored.len() as u64 - acked_stored - refused_stored,
        }
    }

    /// Adds another device's tally.
    fn add(&mut self, other: &StoredTally) {
        self.acked += other.acked;
        self.refused += other.refused;
        self.stored += other.stored;
        self.acked_missing += other.acked_missing;
        self.refused_stored += other.refused_stored;
        self.unanswered_stored += other.unanswered_stored;
    }

    /// True when nothing acknowledged is missing and nothing refused is stored, so the
    /// stored count is the acknowledged count plus what unanswered publishes left.
    pub fn passed(&self) -> bool {
        self.acked_missing == 0 && self.refused_stored == 0
    }
}

/// The run's figures and verdicts.
#[derive(Debug, Serialize)]
pub struct TenantFloodRun {
    /// The profile field both tenants are limited by.
    pub limit_field: &'static str,
    /// Its value: telemetry messages per second per tenant.
    pub limit: u64,
    /// Seconds each phase publishes.
    pub duration_seconds: f64,
    /// The warm-up: both tenants, a few messages per device at half the limit.
    pub warm_up: PhaseFigures,
    /// Phase A: the quiet tenant alone.
    pub baseline: PhaseFigures,
    /// Phase B: the quiet tenant while the noisy one floods.
    pub flood: PhaseFigures,
    /// Quiet PUBACK p99 of phase B over phase A's.
    pub quiet_p99_ratio: f64,
    /// Largest ratio above 1 the latency verdict allows.
    pub tolerance: f64,
    /// The quiet p99 held within the tolerance.
    pub latency_within_tolerance: bool,
    /// Every quiet publish of both phases was acknowledged (none refused or unanswered).
    pub quiet_all_acknowledged: bool,
    /// Most points the limit lets the noisy tenant store in phase B: a full bucket of
    /// `limit`, then `limit` a second.
    pub noisy_allowed_at_most: u64,
    /// Every acknowledged quiet point, both phases, looked up.
    pub quiet_loss_check: Value,
    /// Every acknowledged noisy point looked up.
    pub noisy_loss_check: Value,
    /// The noisy tenant's stored points against its acknowledged and refused ones.
    pub noisy_stored: StoredTally,
    /// Nothing acknowledged missing, nothing refused stored.
    pub loss_passed: bool,
}

/// Runs the scenario and prints its figures.
pub async fn run(args: TenantFloodArgs) -> anyhow::Result<std::process::ExitCode> {
    let limit = args.limit as f64;
    if !(args.quiet_rate > 0.0 && args.quiet_rate < limit) {
        bail!("--quiet-rate must be above 0 and below --limit ({})", args.limit);
    }
    if !(args.flood_factor > 0.0 && args.tolerance >= 0.0) {
        bail!("--flood-factor must be above 0 and --tolerance not below 0");
    }
    let noisy_rate = args.flood_factor * limit;
    super::check_fd_limit(args.quiet_devices + args.noisy_devices)?;
    let bins = Binaries::with_gridlinks(args.gridlinks_bin.as_deref());
    let server = ManagedServer::start_gridlinks_with(&bins, "", None).await.context("starting gridlinks")?;
    let (base, password) = server.api().context("gridlinks has an API")?;
    let sys = ApiTarget { base: base.clone(), user: "sysadmin".into(), password };
    eprintln!(
        "tenant profile {PROFILE:?} ({LIMIT_FIELD} = \"{}:1\"), tenants quiet ({} devices) and noisy ({} devices)",
        args.limit, args.quiet_devices, args.noisy_devices
    );
    let (quiet, noisy) = {
        let (limit, q, n) = (args.limit, args.quiet_devices, args.noisy_devices);
        tokio::task::spawn_blocking(move || create_tenants(&sys, limit, q, n)).await??
    };
    let mqtt = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), server.mqtt_port());
    let proc = ProcessStats::new(server.pid())?;
    let quiet_target = Arc::new(target(mqtt, &args.sources, &quiet));
    let noisy_target = Arc::new(target(mqtt, &args.sources, &noisy));

    let (qd, nd, inflight) = (args.quiet_devices, args.noisy_devices, args.inflight);
    let (mut quiet_told, mut noisy_told) = (Told::default(), Told::default());
    let (warm, warm_rate) = (Some(WARM_UP_MESSAGES), WARM_UP_SHARE * limit);
    let quiet_w = Load::new(&quiet_target, qd, warm_rate, warm, inflight, 0);
    let noisy_w = Load::new(&noisy_target, nd, warm_rate, warm, inflight, 0);
    let (warm_up, q, n) = phase("warm-up", quiet_w, Some(noisy_w), None, &proc, &base).await?;
    quiet_told.add(q.told);
    noisy_told.add(n.context("the warm-up has the noisy tenant")?.told);

    let quiet_a = Load::new(&quiet_target, qd, args.quiet_rate, None, inflight, quiet_told.next_ts());
    let (a, q, _) = phase("A baseline", quiet_a, None, Some(args.duration), &proc, &base).await?;
    quiet_told.add(q.told);

    let quiet_b = Load::new(&quiet_target, qd, args.quiet_rate, None, inflight, quiet_told.next_ts());
    let noisy_b = Load::new(&noisy_target, nd, noisy_rate, None, inflight, noisy_told.next_ts());
    let (b, q, n) = phase("B flood", quiet_b, Some(noisy_b), Some(args.duration), &proc, &base).await?;
    quiet_told.add(q.told);
    noisy_told.add(n.context("phase B has the noisy tenant")?.told);

    eprintln!(
        "checking {} quiet and {} noisy devices for lost and stored points",
        quiet.names.len(),
        noisy.names.len()
    );
    let named = |names: &[String], acks: Vec<AckLog>| -> Vec<DeviceAcks> {
        names.iter().zip(acks).map(|(name, acks)| DeviceAcks { name: name.clone(), acks }).collect()
    };
    let quiet_devices = named(&quiet.names, quiet_told.acks);
    let noisy_devices = named(&noisy.names, noisy_told.acks);
    let refusals = noisy_told.refusals;
    let (quiet_loss, noisy_loss, noisy_stored) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let quiet_loss = loss_check::check(&quiet.admin, &quiet_devices, CHECK_THREADS)?;
        let noisy_loss = loss_check::check(&noisy.admin, &noisy_devices, CHECK_THREADS)?;
        let stored = stored_tally(&noisy.admin, &noisy_devices, &refusals)?;
        Ok((quiet_loss, noisy_loss, stored))
    })
    .await??;
    server.stop().await?;

    let (p99_a, p99_b) = (a.quiet.puback.p99_us, b.quiet.puback.p99_us);
    let ratio = if p99_a > 0 { p99_b as f64 / p99_a as f64 } else { f64::INFINITY };
    let quiet_all_acknowledged = [&a.quiet, &b.quiet].iter().all(|q| q.acked == q.sent && q.sent > 0);
    let loss_passed = quiet_loss.passed() && noisy_loss.passed() && noisy_stored.passed();
    let run = TenantFloodRun {
        limit_field: LIMIT_FIELD,
        limit: args.limit,
        duration_seconds: args.duration.as_secs_f64(),
        warm_up,
        noisy_allowed_at_most: allowed_at_most(args.limit, b.seconds),
        baseline: a,
        flood: b,
        quiet_p99_ratio: ratio,
        tolerance: args.tolerance,
        latency_within_tolerance: ratio <= 1.0 + args.tolerance,
        quiet_all_acknowledged,
        quiet_loss_check: quiet_loss.to_json(),
        noisy_loss_check: noisy_loss.to_json(),
        noisy_stored,
        loss_passed,
    };
    print!("{}", human(&run, &quiet_loss, &noisy_loss));
    if let Some(path) = &args.json {
        crate::report::write_json(path, &json!({"scenario": "tenant-flood", "run": run}))?;
    }
    Ok(crate::exit_code(loss_passed))
}

/// As the system administrator: the profile, both tenants with it and their
/// administrators, and each tenant's devices bulk-imported by its administrator.
fn create_tenants(sys: &ApiTarget, limit: u64, quiet: usize, noisy: usize) -> anyhow::Result<(Tenant, Tenant)> {
    let rest = RestClient::login(sys)?;
    let mut configuration = json!({"type": "DEFAULT"});
    configuration[LIMIT_FIELD] = format!("{limit}:1").into();
    let profile = rest
        .post_json("/api/tenantProfile", &json!({"name": PROFILE, "profileData": {"configuration": configuration}}))?;
    let profile_id = profile.get("id").filter(|id| id["id"].is_string()).context("the new profile has no id")?;
    let make = |label: &'static str, devices: usize| -> anyhow::Result<Tenant> {
        let admin = rest.tenant_admin(label, Some(profile_id), &format!("admin@{label}.test"), &sys.password)?;
        let names: Vec<String> = (0..devices).map(|i| format!("{label}-{i}")).collect();
        let tokens = random_tokens(devices)?;
        RestClient::login(&admin)?.bulk_import(&names, &tokens)?;
        Ok(Tenant { label, admin, names, tokens })
    };
    let (quiet, noisy) = (make("quiet", quiet)?, make("noisy", noisy)?);
    // The run means nothing unless both tenants have the limited profile.
    let tenants = rest.get_json("/api/tenants?pageSize=1000&page=0")?;
    for label in [quiet.label, noisy.label] {
        let tenant = tenants["data"].as_array().and_then(|all| all.iter().find(|t| t["title"] == label));
        let has = tenant.map(|t| &t["tenantProfileId"]);
        if has != Some(profile_id) {
            bail!("tenant {label} has tenant profile {has:?}, not {PROFILE:?} ({profile_id})");
        }
    }
    Ok((quiet, noisy))
}

/// MQTT 5 connections of `tenant`'s devices to `server`, device `i` with token `i`.
fn target(server: SocketAddr, sources: &[IpAddr], tenant: &Tenant) -> Target {
    Target::local_tokens(server, sources.to_vec(), ProtocolVersion::V5, tenant.tokens.clone(), tenant.label)
}

/// One phase: connects the loads' devices, publishes for `duration` (all devices at once;
/// `None`: until each has sent its message count), reads the server's CPU and refusal
/// counter around it, and disconnects. The figures, and what each tenant's devices were
/// told.
async fn phase(
    label: &'static str,
    quiet: Load,
    noisy: Option<Load>,
    duration: Option<Duration>,
    proc: &ProcessStats,
    base: &str,
) -> anyhow::Result<(PhaseFigures, TenantPhase, Option<TenantPhase>)> {
    eprintln!("phase {label}: connecting");
    let quiet_fleet = quiet.connect().await?;
    let noisy_fleet = match &noisy {
        Some(load) => Some(load.connect().await?),
        None => None,
    };
    let refusals_before = refusal_counter(base).await?;
    let progress = Progress::start(
        ProgressKind::Telemetry,
        ProgressSources {
            counters: Arc::clone(&quiet.counters),
            server: Some(proc.clone()),
            ack_latency: Some(Arc::clone(&quiet.latency)),
            e2e_latency: None,
            keep_buckets: false,
        },
        label,
    );
    let cpu_before = proc.cpu_seconds()?;
    let started = Instant::now();
    let noisy_run = async {
        match noisy_fleet {
            Some(fleet) => fleet.publish(duration).await.map(Some),
            None => Ok(None),
        }
    };
    let (quiet_result, noisy_result) = tokio::join!(quiet_fleet.publish(duration), noisy_run);
    let seconds = started.elapsed().as_secs_f64();
    let cpu = proc.cpu_seconds()? - cpu_before;
    drop(progress);
    let (mut quiet_result, mut noisy_result) = (quiet_result?, noisy_result?);
    let refusal_counter = refusal_counter(base).await?.saturating_sub(refusals_before);
    disconnect_all(std::mem::take(&mut quiet_result.open)).await;
    if let Some(r) = noisy_result.as_mut() {
        disconnect_all(std::mem::take(&mut r.open)).await;
    }
    let told = |load: &Load, result: FleetResult| TenantPhase {
        figures: load.figures(&result, seconds),
        told: Told { last_ts: result.last_ts, acks: result.acks, refusals: result.refusals },
    };
    let quiet = told(&quiet, quiet_result);
    let noisy = match (noisy, noisy_result) {
        (Some(load), Some(result)) => Some(told(&load, result)),
        _ => None,
    };
    let figures = PhaseFigures {
        seconds,
        quiet: quiet.figures.clone(),
        noisy: noisy.as_ref().map(|n| n.figures.clone()),
        server_cpu_seconds: cpu,
        server_cpu_percent: 100.0 * per_second(cpu, seconds),
        refusal_counter,
    };
    Ok((figures, quiet, noisy))
}

/// The refusal counter of [`LIMIT_FIELD`] in the server's `/metrics`.
async fn refusal_counter(base: &str) -> anyhow::Result<u64> {
    let url = format!("{base}/metrics");
    let text = tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
        let reply = ureq::get(&url).timeout(METRICS_TIMEOUT).call().with_context(|| format!("GET {url}"))?;
        Ok(reply.into_string()?)
    })
    .await??;
    refusal_count(&text, LIMIT_FIELD)
        .with_context(|| format!("/metrics has no {REFUSALS_METRIC}{{limit=\"{LIMIT_FIELD}\"}}"))
}

/// The value of `gridlinks_tenant_limit_refusals_total{limit="<field>"}` in a
/// Prometheus or OpenMetrics text; `None` when the series is not there.
fn refusal_count(metrics: &str, field: &str) -> Option<u64> {
    let series = format!("{REFUSALS_METRIC}{{limit=\"{field}\"}} ");
    let value = metrics.lines().find_map(|line| line.strip_prefix(&series))?;
    // A counter may be written as a float; a timestamp may follow.
    let value: f64 = value.split_whitespace().next()?.parse().ok()?;
    Some(value as u64)
}

/// Most messages a `limit:1` token bucket lets through in `seconds`: it starts full.
fn allowed_at_most(limit: u64, seconds: f64) -> u64 {
    limit + (limit as f64 * seconds).ceil() as u64
}

/// For each device, the points stored between its first and last answered publish
/// (`acks` acknowledged, `refusals` refused) against both. Blocking; [`CHECK_THREADS`]
/// devices at a time.
fn stored_tally(api: &ApiTarget, acks: &[DeviceAcks], refusals: &[Refusals]) -> anyhow::Result<StoredTally> {
    let n = acks.len().min(refusals.len());
    let tallies =
        loss_check::per_device(api, n, CHECK_THREADS, |client, i| device_tally(client, &acks[i], &refusals[i]))?;
    let mut total = StoredTally::default();
    for t in &tallies {
        total.add(t);
    }
    Ok(total)
}

/// One device's [`StoredTally`].
fn device_tally(client: &RestClient, device: &DeviceAcks, refused: &Refusals) -> anyhow::Result<StoredTally> {
    let sorted = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (acked, refused) = (sorted(&device.acks.ts), sorted(&refused.ts));
    let first = acked.first().into_iter().chain(refused.first()).min();
    let last = acked.last().into_iter().chain(refused.last()).max();
    let (Some(&first), Some(&last)) = (first, last) else { return Ok(StoredTally::default()) };
    let id = client.device_id(&device.name)?.with_context(|| format!("device {} is not found", device.name))?;
    let stored = client.timestamps(&id, SEQ_KEY, first, last + 1)?;
    Ok(StoredTally::of(&acked, &refused, &stored))
}

/// The human summary: the phases side by side, the verdicts, the checks.
fn human(run: &TenantFloodRun, quiet_loss: &LossReport, noisy_loss: &LossReport) -> String {
    let (w, a, b) = (&run.warm_up, &run.baseline, &run.flood);
    let ms = |us: u64| format!("{:.2} ms", us as f64 / 1000.0);
    let mut s = format!(
        "tenant-flood: both tenants have profile {PROFILE:?} with {} = \"{}:1\"; MQTT 5 QoS 1, {} s a phase\n\
         quiet: {} devices at {} msgs/s in both phases; noisy: {} devices at {} msgs/s in phase B\n\n\
         phase         quiet acked/s  p50        p99        p99.9       not acked  server CPU\n",
        run.limit_field,
        run.limit,
        run.duration_seconds,
        a.quiet.devices,
        a.quiet.offered_rate,
        b.noisy.as_ref().map_or(0, |n| n.devices),
        b.noisy.as_ref().map_or(0.0, |n| n.offered_rate),
    );
    for p in [a, b] {
        s.push_str(&format!(
            "{:<13} {:>13.0}  {:<10} {:<10} {:<10} {:>10}  {:.2} s ({:.0}%)\n",
            if p.noisy.is_some() { "B flood" } else { "A baseline" },
            p.quiet.acked_per_second,
            ms(p.quiet.puback.p50_us),
            ms(p.quiet.puback.p99_us),
            ms(p.quiet.puback.p999_us),
            thousands(p.quiet.unanswered + p.quiet.refused),
            p.server_cpu_seconds,
            p.server_cpu_percent,
        ));
    }
    let warm = [Some(&w.quiet), w.noisy.as_ref()].into_iter().flatten();
    let (warm_sent, warm_acked) = warm.fold((0, 0), |(sent, acked), t| (sent + t.sent, acked + t.acked));
    s.push_str(&format!(
        "warm-up        {} of {} publishes acknowledged{}\n",
        thousands(warm_acked),
        thousands(warm_sent),
        if warm_acked == warm_sent { "" } else { " (WARNING: the rest were refused or unanswered)" },
    ));
    s.push_str(&format!(
        "\nquiet p99 B/A  {:.2} (at most {:.2}): {}\n",
        run.quiet_p99_ratio,
        1.0 + run.tolerance,
        if run.latency_within_tolerance { "within" } else { "NOT within" },
    ));
    if let Some(n) = &b.noisy {
        s.push_str(&format!(
            "noisy (B)      sent {} of {} offered, acked {} ({:.0}/s; the limit allows at most {}; p50 {}, \
             p99 {}), refused {}, unanswered {}\n",
            thousands(n.sent),
            thousands((n.offered_rate * run.duration_seconds).round() as u64),
            thousands(n.acked),
            n.acked_per_second,
            thousands(run.noisy_allowed_at_most),
            ms(n.puback.p50_us),
            ms(n.puback.p99_us),
            thousands(n.refused),
            thousands(n.unanswered),
        ));
        s.push_str(&format!(
            "first refusal  {}\n",
            n.first_refusal.as_deref().unwrap_or("none: the flood was never refused (is the limit enforced?)")
        ));
        if n.acked > run.noisy_allowed_at_most {
            s.push_str("WARNING        the noisy tenant got more acknowledged than its limit allows\n");
        }
        if !n.connections_lost.is_empty() {
            s.push_str(&format!("noisy lost     {:?}\n", n.connections_lost));
        }
    }
    s.push_str(&format!(
        "refusal count  {} in A, {} in B ({REFUSALS_METRIC}{{limit=\"{}\"}})\n",
        thousands(a.refusal_counter),
        thousands(b.refusal_counter),
        run.limit_field,
    ));
    for p in [a, b] {
        if !p.quiet.connections_lost.is_empty() {
            s.push_str(&format!("quiet lost     {:?}\n", p.quiet.connections_lost));
        }
        if let Some(first) = &p.quiet.first_refusal {
            s.push_str(&format!("quiet refused  {} publishes, the first: {first}\n", thousands(p.quiet.refused)));
        }
    }
    s.push_str(&format!(
        "ISOLATION {}: quiet p99 {} within {:.0}%, {}\n\n",
        if run.latency_within_tolerance && run.quiet_all_acknowledged { "HELD" } else { "NOT SHOWN" },
        if run.latency_within_tolerance { "stayed" } else { "did not stay" },
        100.0 * run.tolerance,
        if run.quiet_all_acknowledged {
            "every quiet publish acknowledged"
        } else {
            "some quiet publishes were refused or unanswered"
        },
    ));
    s.push_str("quiet, A and B\n");
    s.push_str(&quiet_loss.human());
    s.push_str("noisy, B\n");
    s.push_str(&noisy_loss.human());
    let t = &run.noisy_stored;
    s.push_str(&format!(
        "noisy stored   {} points over the range sent: {} acknowledged ({} missing), {} of {} refused, {} unanswered\n",
        thousands(t.stored),
        thousands(t.acked - t.acked_missing),
        thousands(t.acked_missing),
        thousands(t.refused_stored),
        thousands(t.refused),
        thousands(t.unanswered_stored),
    ));
    s.push_str(if run.loss_passed {
        "LOSS CHECK PASSED: every acknowledged point stored, no refused point stored\n"
    } else {
        "LOSS CHECK FAILED\n"
    });
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_separates_acked_refused_and_unanswered_points() {
        let t = StoredTally::of(&[1, 3, 5], &[2, 4], &[1, 3, 5]);
        assert_eq!(
            t,
            StoredTally { acked: 3, refused: 2, stored: 3, acked_missing: 0, refused_stored: 0, unanswered_stored: 0 }
        );
        assert!(t.passed());
        let t = StoredTally::of(&[1, 3, 5], &[2, 4], &[1, 2, 5, 6]);
        assert_eq!((t.acked_missing, t.refused_stored, t.unanswered_stored), (1, 1, 1));
        assert!(!t.passed());
        let t = StoredTally::of(&[1], &[], &[1, 2]);
        assert_eq!(t.unanswered_stored, 1);
        assert!(t.passed(), "an unanswered publish may be stored");
        let mut sum = StoredTally::of(&[1], &[2], &[1]);
        sum.add(&StoredTally::of(&[7], &[8], &[8]));
        assert_eq!((sum.acked, sum.refused, sum.stored, sum.acked_missing, sum.refused_stored), (2, 2, 2, 1, 1));
    }

    #[test]
    fn phases_append_device_by_device() {
        let phase = |ts: u64, refused: Option<u64>| Told {
            acks: vec![AckLog { ts: vec![ts], ack_ms: vec![ts + 1] }, AckLog::default()],
            refusals: vec![
                Refusals::default(),
                Refusals {
                    count: u64::from(refused.is_some()),
                    ts: refused.into_iter().collect(),
                    first: refused.map(|r| format!("0x97 {r}")),
                },
            ],
            last_ts: ts,
        };
        let mut told = Told::default();
        told.add(phase(10, None));
        assert_eq!(told.next_ts(), 11);
        told.add(phase(20, Some(21)));
        told.add(phase(30, Some(31)));
        assert_eq!(told.acks[0], AckLog { ts: vec![10, 20, 30], ack_ms: vec![11, 21, 31] });
        assert_eq!(told.refusals[1].count, 2);
        assert_eq!(told.refusals[1].ts, [21, 31]);
        assert_eq!(told.refusals[1].first.as_deref(), Some("0x97 21"), "the first refusal is kept");
        assert_eq!(told.next_ts(), 31);
    }

    #[test]
    fn refusal_counter_is_read_by_its_limit_label() {
        let text = "# TYPE gridlinks_tenant_limit_refusals counter\n\
             gridlinks_tenant_limit_refusals_total{limit=\"transportTenantMsgRateLimit\"} 7\n\
             gridlinks_tenant_limit_refusals_total{limit=\"transportTenantTelemetryMsgRateLimit\"} 1234\n\
             # EOF\n";
        assert_eq!(refusal_count(text, LIMIT_FIELD), Some(1234));
        assert_eq!(refusal_count(text, "transportTenantMsgRateLimit"), Some(7));
        assert_eq!(refusal_count(text, "maxDevices"), None);
        let float = "gridlinks_tenant_limit_refusals_total{limit=\"transportTenantTelemetryMsgRateLimit\"} 5.0 1700\n";
        assert_eq!(refusal_count(float, LIMIT_FIELD), Some(5));
    }

    #[test]
    fn a_full_bucket_then_the_rate() {
        assert_eq!(allowed_at_most(500, 30.0), 15_500);
        assert_eq!(allowed_at_most(500, 30.001), 15_501);
    }
}
