//! `compare` and `preset`: the same scenario against several servers, each started by
//! the tool on free loopback ports ([`crate::servers`]), one after the other, printed
//! side by side with ratios.
//!
//! A scenario is aimed at a started server by [`aim`]: port, server pid, and for
//! GridLinks devices with their own tokens and the REST API; peers are driven
//! anonymously, without the GridLinks-only loss check and storage lag. With `--tls`
//! every server serves MQTT over TLS with the same certificate ([`crate::pki`]) and the
//! scenario connects to that port, trusting the run's CA.
//! Presets ([`PRESETS`]) are named lists of such scenarios, replaying published tests
//! scaled to one machine.

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use serde_json::Value;

use crate::cli::{ConnectArgs, OutputArgs, PubsubArgs, TelemetryArgs};
use crate::figures::{self, comparison_table, RunResult};
use crate::html::{Page, Table};
use crate::pki::TlsFiles;
use crate::report::{self, ConnectReport, PubsubReport, TelemetryReport};
use crate::rest_api::{ApiTarget, RestClient};
use crate::scenario;
use crate::scenario::telemetry::{device_profile_of, provision_into, provisioned_name};
use crate::servers::{Binaries, ManagedServer, ServerKind};

/// A scenario that can run against any MQTT server.
// Parsed once per step: boxing the large variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Subcommand)]
pub enum Scenario {
    /// See `gridlinks-bench mqtt-telemetry --help`.
    MqttTelemetry(TelemetryArgs),
    /// See `gridlinks-bench pubsub --help`.
    Pubsub(PubsubArgs),
    /// See `gridlinks-bench connect --help`.
    Connect(ConnectArgs),
}

/// Parses a scenario command line such as `["mqtt-telemetry", "--devices", "10"]`.
#[derive(Debug, Parser)]
#[command(name = "scenario", no_binary_name = true)]
struct ScenarioLine {
    #[command(subcommand)]
    scenario: Scenario,
}

impl Scenario {
    /// Parses one scenario command line.
    pub fn parse(args: &[&str]) -> anyhow::Result<Self> {
        ScenarioLine::try_parse_from(args)
            .map(|line| line.scenario)
            .map_err(|e| anyhow::anyhow!("bad scenario {args:?}: {e}"))
    }

    /// Multiplies the connection counts by `scale` (at least one of each).
    pub fn scale(&mut self, scale: f64) {
        let scaled = |n: usize| ((n as f64 * scale).round() as usize).max(1);
        match self {
            Scenario::MqttTelemetry(a) => {
                // A fixed total --rate stays per device.
                a.rate *= scaled(a.devices) as f64 / a.devices.max(1) as f64;
                a.devices = scaled(a.devices);
            }
            Scenario::Pubsub(a) => {
                a.rate *= scaled(a.publishers) as f64 / a.publishers.max(1) as f64;
                a.publishers = scaled(a.publishers);
            }
            Scenario::Connect(a) => a.connections = scaled(a.connections),
        }
    }

    /// Replaces a `--duration` (scenarios that count messages keep their count).
    pub fn set_duration(&mut self, duration: std::time::Duration) {
        match self {
            Scenario::MqttTelemetry(a) if a.duration.is_some() => a.duration = Some(duration),
            Scenario::Pubsub(a) if a.duration.is_some() => a.duration = Some(duration),
            Scenario::Connect(a) => a.hold = duration,
            _ => {}
        }
    }

    /// The `--json`/`--html` given after the scenario's name (`compare mqtt-telemetry
    /// ... --json F`): the comparison writes them when it was given none of its own.
    pub fn output(&self) -> &OutputArgs {
        match self {
            Scenario::MqttTelemetry(a) => &a.target.output,
            Scenario::Pubsub(a) => &a.target.output,
            Scenario::Connect(a) => &a.target.output,
        }
    }

    /// What the scenario was asked to do, for the report's settings.
    pub fn settings(&self) -> crate::settings::Settings {
        match self {
            Scenario::MqttTelemetry(a) => crate::settings::telemetry(a),
            Scenario::Pubsub(a) => crate::settings::pubsub(a),
            Scenario::Connect(a) => crate::settings::connect(a),
        }
    }

    /// Whether it connects over TLS (`--tls-ca`; see [`Scenario::use_tls`]).
    pub fn tls(&self) -> bool {
        self.target().tls_ca.is_some()
    }

    /// Connect over TLS trusting `files.ca` (`compare --tls`): [`aim`] then picks each
    /// server's TLS port, and the report's settings say TLS.
    pub fn use_tls(&mut self, files: &TlsFiles) {
        let target = self.target_mut();
        target.tls_ca = Some(files.ca.clone());
        target.tls_server_name = crate::pki::SERVER_NAME.into();
    }

    /// Where and how it connects.
    fn target(&self) -> &crate::cli::TargetArgs {
        match self {
            Scenario::MqttTelemetry(a) => &a.target,
            Scenario::Pubsub(a) => &a.target,
            Scenario::Connect(a) => &a.target,
        }
    }

    fn target_mut(&mut self) -> &mut crate::cli::TargetArgs {
        match self {
            Scenario::MqttTelemetry(a) => &mut a.target,
            Scenario::Pubsub(a) => &mut a.target,
            Scenario::Connect(a) => &mut a.target,
        }
    }

    /// The subcommand name.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::MqttTelemetry(_) => "mqtt-telemetry",
            Scenario::Pubsub(_) => "pubsub",
            Scenario::Connect(_) => "connect",
        }
    }
}

/// Points `scenario` at the started `server`. For GridLinks the devices are created
/// first through the REST API (tokens and names into files in the server's directory)
/// and the server restarted, so the run measures a server that did not just
/// bulk-import (the same as a long-running one); the loss check and storage lag use the
/// API. Peers are driven anonymously, without those checks. With `tenant`, GridLinks'
/// devices are made in a tenant of their own by its administrator. A server started
/// with TLS is driven on its TLS port, trusting the CA of its certificate.
pub async fn aim(scenario: &Scenario, server: &mut ManagedServer, tenant: bool) -> anyhow::Result<Scenario> {
    let mut s = scenario.clone();
    let devices = match &s {
        Scenario::MqttTelemetry(a) => a.devices,
        Scenario::Connect(a) => a.connections,
        // Pub/sub clients connect without credentials (GridLinks runs with
        // mqtt.allow_anonymous, see servers.rs).
        Scenario::Pubsub(_) => 0,
    };
    let api = server.api().filter(|_| devices > 0);
    if let Some((base, password)) = api {
        let names: Vec<String> = (0..devices).map(provisioned_name).collect();
        let mut api = ApiTarget { base: base.clone(), user: "admin".into(), password: password.clone() };
        if tenant {
            let sys = ApiTarget { user: "sysadmin".into(), ..api.clone() };
            api = tokio::task::spawn_blocking(move || {
                RestClient::login(&sys)?.tenant_admin("bench-tenant", None, "admin@bench-tenant.test", &sys.password)
            })
            .await??;
        }
        let user = api.user.clone();
        let profile = match &s {
            Scenario::MqttTelemetry(a) => device_profile_of(a.device_profile.as_deref(), true)?,
            _ => None,
        };
        let tokens = provision_into(api, names.clone(), profile).await?;
        let (tokens_file, names_file) = (server.dir().join("tokens"), server.dir().join("names"));
        std::fs::write(&tokens_file, tokens.join("\n"))?;
        std::fs::write(&names_file, names.join("\n"))?;
        server.restart().await.context("restarting after provisioning")?;
        let api = |a: &mut crate::cli::ApiArgs| {
            a.api = Some(base.clone());
            a.api_user = user.clone();
            a.api_password = Some(password.clone());
        };
        match &mut s {
            Scenario::MqttTelemetry(a) => {
                a.provision = false;
                a.device_profile = None;
                a.target.username = None;
                a.target.tokens_file = Some(tokens_file);
                a.device_names_file = Some(names_file);
                api(&mut a.api);
            }
            Scenario::Connect(a) => {
                a.provision = false;
                a.target.username = None;
                a.target.tokens_file = Some(tokens_file);
                api(&mut a.api);
            }
            Scenario::Pubsub(_) => {}
        }
    } else {
        match &mut s {
            Scenario::MqttTelemetry(a) => {
                a.provision = false;
                a.device_profile = None;
                a.target.tokens_file = None;
                a.device_names_file = None;
                a.verify = false;
                a.storage_lag = false;
                a.save_acks = None;
            }
            Scenario::Connect(a) => {
                a.provision = false;
                a.target.tokens_file = None;
            }
            Scenario::Pubsub(_) => {}
        }
    }
    let target = s.target_mut();
    target.host = "127.0.0.1".into();
    target.port = server.mqtt_port();
    if let Some((tls_port, files)) = server.mqtt_tls() {
        target.port = tls_port;
        target.tls_ca = Some(files.ca.clone());
        target.tls_server_name = crate::pki::SERVER_NAME.into();
    } else {
        target.tls_ca = None;
    }
    target.server_pid = vec![server.pid()];
    target.output = OutputArgs::default();
    Ok(s)
}

/// The result of one scenario on one server.
// A few per run: boxing the large variants would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Outcome {
    /// `mqtt-telemetry`.
    Telemetry(TelemetryReport),
    /// `pubsub`.
    Pubsub(PubsubReport),
    /// `connect`.
    Connect(ConnectReport),
}

impl Outcome {
    /// As a result for tables and charts.
    pub fn result(&self) -> &dyn RunResult {
        match self {
            Outcome::Telemetry(r) => r,
            Outcome::Pubsub(r) => r,
            Outcome::Connect(r) => r,
        }
    }

    fn human(&self) -> String {
        self.result().human()
    }

    fn to_json(&self) -> Value {
        self.result().to_json()
    }

    /// False when a loss or delivery check failed.
    pub fn passed(&self) -> bool {
        self.result().passed()
    }
}

/// Runs `scenario` against the server `target` was aimed at.
pub async fn measure(scenario: &Scenario) -> anyhow::Result<Outcome> {
    Ok(match scenario {
        Scenario::MqttTelemetry(a) => Outcome::Telemetry(scenario::telemetry::measure(a).await?),
        Scenario::Pubsub(a) => Outcome::Pubsub(scenario::pubsub::measure(a).await?),
        Scenario::Connect(a) => Outcome::Connect(scenario::connect::measure(a).await?),
    })
}

/// One step of a comparison: its title, the scenario it ran and each server's run.
#[derive(Debug)]
pub struct Step {
    /// Heading of the step's tables and charts.
    pub title: String,
    /// The scenario as given (before [`aim`] pointed it at each server).
    pub scenario: Scenario,
    /// One per server, in order.
    pub runs: Vec<Run>,
}

/// One server's part of a comparison.
#[derive(Debug)]
pub struct Run {
    /// Which server.
    pub kind: ServerKind,
    /// Its name and version.
    pub version: String,
    /// What it did, or why it did not run.
    pub outcome: Result<Outcome, String>,
}

/// Runs `scenario` against each server in turn (started fresh, stopped after); with
/// `tls`, each serves MQTT over TLS with these files and the scenario connects there.
pub async fn compare(
    servers: &[ServerKind],
    scenario: &Scenario,
    bins: &Binaries,
    tenant: bool,
    tls: Option<&TlsFiles>,
) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    for &kind in servers {
        eprintln!("--- {}: starting", kind.label());
        let started = match tls {
            Some(files) => ManagedServer::start_tls(kind, bins, files).await,
            None => ManagedServer::start(kind, bins).await,
        };
        let mut server = started.with_context(|| format!("starting {}", kind.label()))?;
        let version = server.version().to_string();
        let aimed = aim(scenario, &mut server, tenant).await?;
        let port = aimed.target().port;
        let over = if aimed.tls() { " over TLS" } else { "" };
        eprintln!("--- {version}: {}{over} on port {port}", scenario.name());
        let outcome = measure(&aimed).await;
        server.stop().await.with_context(|| format!("stopping {}", kind.label()))?;
        let outcome = outcome.map_err(|e| format!("{e:#}"));
        match &outcome {
            Ok(o) => print!("{}", o.human()),
            Err(e) => println!("== {}: failed: {e}", kind.label()),
        }
        runs.push(Run { kind, version, outcome });
    }
    Ok(runs)
}

/// Fails when `--tls` is asked of a server that cannot serve it, or the scenario names a
/// CA of its own (the servers' certificates are made by `--tls`); before any starts.
pub fn check_tls(servers: &[ServerKind], tls: bool, scenario: &Scenario) -> anyhow::Result<()> {
    if scenario.tls() {
        anyhow::bail!(
            "{}: --tls-ca is set per server; give `compare --tls`, which makes the certificates",
            scenario.name()
        );
    }
    let unable: Vec<&str> = servers.iter().filter(|k| !k.serves_tls()).map(|k| k.label()).collect();
    if tls && !unable.is_empty() {
        anyhow::bail!(
            "--tls: {} cannot be started with TLS yet; compare gridlinks and mosquitto (e.g. --against mosquitto)",
            unable.join(", ")
        );
    }
    Ok(())
}

/// A comparison's title for a scenario: `mqtt-telemetry`, or `mqtt-telemetry over TLS`.
pub fn scenario_title(scenario: &Scenario) -> String {
    if scenario.tls() {
        format!("{} over TLS", scenario.name())
    } else {
        scenario.name().to_string()
    }
}

/// The side-by-side table of the runs that produced a result.
pub fn table(title: &str, runs: &[Run]) -> Table {
    let done: Vec<(&str, &dyn RunResult)> =
        runs.iter().filter_map(|r| r.outcome.as_ref().ok().map(|o| (r.kind.label(), o.result()))).collect();
    comparison_table(title, &done)
}

/// A table as aligned text.
pub fn text_table(table: &Table) -> String {
    let mut widths: Vec<usize> = table.header.iter().map(|h| h.chars().count()).collect();
    for row in &table.rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = format!("== {} ==\n", table.title);
    for row in std::iter::once(&table.header).chain(&table.rows) {
        for (i, cell) in row.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i == 0 {
                let _ = write!(out, "{cell:<w$}");
            } else {
                let _ = write!(out, "  {cell:>w$}");
            }
        }
        out.push('\n');
    }
    out
}

/// The JSON of one step of a comparison ([`crate::report::json::StepJson`]).
pub fn runs_json(title: &str, runs: &[Run]) -> report::json::StepJson {
    report::json::StepJson {
        title: title.into(),
        runs: runs
            .iter()
            .map(|r| report::json::RunJson {
                server: r.kind.label().into(),
                version: r.version.clone(),
                result: r.outcome.as_ref().map(Outcome::to_json).ok(),
                error: r.outcome.as_ref().err().cloned(),
            })
            .collect(),
    }
}

/// Servers, results and charts of one comparison, for the HTML page.
fn page_parts(title: &str, runs: &[Run]) -> (Vec<Table>, Vec<crate::html::Chart>) {
    let mut servers = Table {
        title: format!("{title}: servers"),
        header: vec!["server".into(), "version".into(), "outcome".into()],
        rows: Vec::new(),
    };
    for r in runs {
        servers.rows.push(vec![
            r.kind.label().into(),
            r.version.clone(),
            match &r.outcome {
                Ok(o) if o.passed() => "ran".into(),
                Ok(_) => "ran: LOSS/DELIVERY CHECK FAILED".into(),
                Err(e) => e.clone(),
            },
        ]);
    }
    let timelines: Vec<(&str, &crate::timeline::Timeline)> =
        runs.iter().filter_map(|r| r.outcome.as_ref().ok().map(|o| (r.kind.label(), o.result().timeline()))).collect();
    let ack = runs.iter().find_map(|r| r.outcome.as_ref().ok()).map_or("PUBACK", |o| o.result().ack_name());
    let mut charts = figures::charts(&timelines, ack);
    for c in &mut charts {
        c.title = format!("{title}: {}", c.title);
    }
    (vec![servers, table(title, runs)], charts)
}

/// Prints the comparisons' tables and writes `--json`/`--html`; the exit code is 2 when
/// a GridLinks run failed its loss or delivery check. A peer's failed check (e.g. a
/// broker dropping acknowledged QoS 1 messages under overload) is a finding about the
/// peer: it shows in its summary and the table, and does not fail the comparison.
pub fn finish(
    title: &str,
    subtitle: &str,
    steps: &[Step],
    output: &OutputArgs,
) -> anyhow::Result<std::process::ExitCode> {
    let mut human = String::new();
    let mut page = Page {
        title: title.into(),
        subtitle: subtitle.into(),
        settings: settings_tables(steps),
        durability: durability(steps),
        ..Default::default()
    };
    for Step { title: step, runs, .. } in steps {
        human.push('\n');
        human.push_str(&text_table(&table(step, runs)));
        let (tables, charts) = page_parts(step, runs);
        page.tables.extend(tables);
        page.charts.extend(charts);
    }
    let json = report::json::value(&report::json::ComparisonJson {
        title: title.into(),
        steps: steps.iter().map(|s| runs_json(&s.title, &s.runs)).collect(),
    });
    report::emit(output, &human, &json, || page)?;
    let passed = !steps
        .iter()
        .flat_map(|s| &s.runs)
        .filter(|r| r.kind == ServerKind::Gridlinks)
        .any(|r| r.outcome.as_ref().is_ok_and(|o| !o.passed()));
    Ok(crate::exit_code(passed))
}

/// The settings of a comparison: each step's scenario (a column per step), the machine,
/// and every server with its version.
fn settings_tables(steps: &[Step]) -> Vec<Table> {
    let columns: Vec<(String, crate::settings::Settings)> =
        steps.iter().map(|s| (s.title.clone(), s.scenario.settings())).collect();
    let mut servers: Vec<(String, String)> = Vec::new();
    for run in steps.iter().flat_map(|s| &s.runs) {
        if !servers.iter().any(|(name, _)| name == run.kind.label()) {
            servers.push((run.kind.label().into(), run.version.clone()));
        }
    }
    figures::settings_tables(&columns, &servers)
}

/// What each server's acknowledgement promises in the comparison's scenario.
fn durability(steps: &[Step]) -> Vec<(String, String)> {
    let mut notes: Vec<(String, String)> = Vec::new();
    for step in steps {
        for run in &step.runs {
            let note = run.kind.durability(step.scenario.name());
            let label = run.kind.label();
            if !notes.iter().any(|(name, n)| name == label && n == note) {
                notes.push((label.into(), note.into()));
            }
        }
    }
    notes
}

/// A published test replayed on one machine.
pub struct Preset {
    /// Name on the command line.
    pub name: &'static str,
    /// What it replays and how it was scaled.
    pub about: &'static str,
    /// Steps: title and scenario command line.
    pub steps: &'static [(&'static str, &'static [&'static str])],
}

/// The presets.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "tb-2017",
        about: "ThingsBoard's 2017 MQTT test: ~100-byte JSON telemetry at QoS 1, every device \
                publishing 1 msg/s, then 2 msg/s. Scaled to 10,000 devices for 60 s per step \
                (one 2-core machine runs generator and server).",
        steps: &[
            (
                "tb-2017: 10,000 devices x 1 msg/s",
                &[
                    "mqtt-telemetry",
                    "--devices",
                    "10000",
                    "--interval",
                    "1s",
                    "--duration",
                    "60s",
                    "--qos",
                    "1",
                    "--payload-bytes",
                    "100",
                    "--verify",
                    "--storage-lag",
                ],
            ),
            (
                "tb-2017: 10,000 devices x 2 msg/s",
                &[
                    "mqtt-telemetry",
                    "--devices",
                    "10000",
                    "--interval",
                    "500ms",
                    "--duration",
                    "60s",
                    "--qos",
                    "1",
                    "--payload-bytes",
                    "100",
                    "--verify",
                    "--storage-lag",
                ],
            ),
        ],
    },
    Preset {
        name: "tb-2021",
        about: "ThingsBoard's 2021 test of 30,000 devices sending 10 messages each, scaled to \
                18,500 devices (the 20,000 open-files limit per process, less what each server \
                keeps for itself): ~256-byte payload \
                every 800 ms, then 1 KB every 1,400 ms, with the storage lag that test needed \
                a schema change for.",
        steps: &[
            (
                "tb-2021: 18,500 devices x 10 msgs, 256 B every 800 ms",
                &[
                    "mqtt-telemetry",
                    "--devices",
                    "18500",
                    "--interval",
                    "800ms",
                    "--messages-per-device",
                    "10",
                    "--payload-bytes",
                    "256",
                    "--qos",
                    "1",
                    "--verify",
                    "--storage-lag",
                ],
            ),
            (
                "tb-2021: 18,500 devices x 10 msgs, 1 KB every 1,400 ms",
                &[
                    "mqtt-telemetry",
                    "--devices",
                    "18500",
                    "--interval",
                    "1400ms",
                    "--messages-per-device",
                    "10",
                    "--payload-bytes",
                    "1024",
                    "--qos",
                    "1",
                    "--verify",
                    "--storage-lag",
                ],
            ),
        ],
    },
    Preset {
        name: "tbmq-fanin",
        about: "TBMQ's fan-in test: publisher groups, each read by one APPLICATION-style \
                subscriber, 114-byte tracker payload, QoS 1. Scaled to 10 groups of 100 \
                publishers at 10 msg/s each, then 10 publishers -> 1 subscriber saturating.",
        steps: &[
            (
                "tbmq-fanin: 10 x (100 publishers -> 1 subscriber), 10,000 msg/s offered",
                &[
                    "pubsub",
                    "--groups",
                    "10",
                    "--publishers",
                    "100",
                    "--subscribers",
                    "1",
                    "--interval",
                    "100ms",
                    "--duration",
                    "30s",
                    "--pub-qos",
                    "1",
                    "--sub-qos",
                    "1",
                    "--payload-bytes",
                    "114",
                ],
            ),
            (
                "tbmq-fanin: 10 publishers -> 1 subscriber, saturating",
                &[
                    "pubsub",
                    "--groups",
                    "1",
                    "--publishers",
                    "10",
                    "--subscribers",
                    "1",
                    "--duration",
                    "20s",
                    "--pub-qos",
                    "1",
                    "--sub-qos",
                    "1",
                    "--payload-bytes",
                    "114",
                ],
            ),
        ],
    },
];

/// The preset named `name`.
pub fn preset(name: &str) -> anyhow::Result<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name).with_context(|| {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        format!("no preset {name:?}; there are {}", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_step_parses() {
        for p in PRESETS {
            assert!(!p.steps.is_empty(), "{}", p.name);
            for (title, line) in p.steps {
                let s = Scenario::parse(line).unwrap_or_else(|e| panic!("{title}: {e}"));
                assert!(title.starts_with(p.name), "{title}");
                if let Scenario::MqttTelemetry(a) = &s {
                    assert!(a.verify && a.storage_lag, "{title}");
                }
            }
        }
        assert!(preset("tb-2021").is_ok());
        assert!(preset("nope").is_err());
    }

    #[test]
    fn scaling_keeps_the_per_device_rate() {
        let mut s = Scenario::parse(&["mqtt-telemetry", "--devices", "1000", "--rate", "2000"]).unwrap();
        s.scale(0.01);
        let Scenario::MqttTelemetry(a) = &s else { panic!("wrong scenario") };
        assert_eq!(a.devices, 10);
        assert_eq!(a.rate, 20.0);
        let mut s = Scenario::parse(&["connect", "--connections", "10"]).unwrap();
        s.scale(0.001);
        let Scenario::Connect(a) = &s else { panic!("wrong scenario") };
        assert_eq!(a.connections, 1, "never scaled to nothing");
    }

    #[test]
    fn text_tables_align_columns() {
        let t = Table {
            title: "t".into(),
            header: vec!["figure".into(), "a".into()],
            rows: vec![vec!["msgs/s".into(), "1,000".into()]],
        };
        assert_eq!(text_table(&t), "== t ==\nfigure      a\nmsgs/s  1,000\n");
    }

    #[test]
    fn tls_is_refused_for_servers_without_it_and_named_in_titles() {
        use ServerKind::*;
        let mut s = Scenario::parse(&["mqtt-telemetry", "--devices", "10"]).unwrap();
        assert!(check_tls(&[Gridlinks, Mosquitto], true, &s).is_ok());
        assert!(check_tls(&[Gridlinks, Rumqttd], false, &s).is_ok());
        let e = check_tls(&[Gridlinks, Mosquitto, Rumqttd], true, &s).unwrap_err().to_string();
        assert!(e.contains("rumqttd") && !e.contains("mosquitto,"), "{e}");
        assert!(!s.tls());
        assert_eq!(scenario_title(&s), "mqtt-telemetry");
        let files = TlsFiles { ca: "/p/ca.pem".into(), cert: "/p/server.pem".into(), key: "/p/server.key".into() };
        s.use_tls(&files);
        assert!(s.tls());
        assert_eq!(scenario_title(&s), "mqtt-telemetry over TLS");
        let settings = s.settings();
        assert!(settings.iter().any(|(n, v)| n == "transport" && v.starts_with("TLS")), "{settings:?}");
        let own_ca = Scenario::parse(&["connect", "--tls-ca", "ca.pem"]).unwrap();
        assert!(check_tls(&[Gridlinks], true, &own_ca).is_err(), "the CA comes from --tls");
    }
}
