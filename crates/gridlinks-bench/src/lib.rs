//! The GridLinks load generator: drives an MQTT server (GridLinks, Mosquitto, any
//! broker) or GridLinks' HTTP device API with many device connections, reports what the
//! server delivered and what it cost (so results hold while generator and server share
//! a small machine), and proves for GridLinks that no acknowledged point was lost.
//!
//! It speaks MQTT through the project's own sans-IO codec (`gridlinks-codec`), one
//! tokio task per connection on a multi-threaded runtime. Connections can be spread
//! over several local source addresses (`--sources 127.0.0.1,127.0.0.2`) so that one
//! process opens more connections than one address has ephemeral ports.
//!
//! Every figure that depends on the server's own cost comes from `/proc/PID` of the
//! server process (`--server-pid`): CPU seconds over the measurement window (so
//! "messages per server CPU-second" does not depend on how much CPU the generator
//! took) and resident memory.
//!
//! # Layout
//!
//! ```text
//! cli.rs               command-line options of each subcommand (clap)
//! mqtt_client.rs       one async MQTT client connection: TCP connect from a chosen source
//!                      address, TLS over it (`--tls-ca`), CONNECT/CONNACK handshake,
//!                      cancel-safe packet reads, batched writes; typed connect-failure
//!                      reasons
//! scenario/
//!   mod.rs             what the scenarios share: target and credentials, connect pacing,
//!                      the per-second progress line and timeline sampling
//!   telemetry.rs       `mqtt-telemetry`: N devices publish JSON telemetry with a window of
//!                      unacknowledged QoS 1 publishes (the `Fleet` of publishers, payloads)
//!   http_telemetry.rs  `http-telemetry`: the same over HTTP/1.1 keep-alive
//!   connect.rs         `connect`: connection storm at a rate, then N idle connections held
//!   pubsub.rs          `pubsub`: publisher groups -> subscriber groups, end-to-end latency,
//!                      deliveries expected vs received
//!   tenant_flood.rs    `tenant-flood`: a quiet tenant's PUBACK latency alone and while a
//!                      noisy tenant floods past its rate limit; refusals and the loss check
//!   alarms.rs          `alarm-latency`: PUBACK -> the alarm a rule raises, through REST;
//!                      `alarm-list`: N alarms created, list and count queries timed
//! template.rs          `--payload-template` placeholders
//! stats.rs             live counters shared by connection tasks, sharded latency histograms
//! timeline.rs          one sample a second of a run (JSON `timeline`, HTML charts),
//!                      merged across worker processes
//! proc_stats.rs        server CPU seconds and memory from /proc/PID/{stat,status}; fd limit
//! report.rs            the results of each scenario: human summary, JSON, output files
//! figures.rs           headline figures of each result, comparison tables, charts
//! html.rs              the self-contained HTML page (inline SVG charts, CSS-only
//!                      legend toggles, a line style per server)
//! rest_api.rs          the ThingsBoard REST calls: login, bulk import (`--provision`),
//!                      device lookup, timeseries read and delete (blocking, `ureq`)
//! loss_check.rs        `--verify` and `verify`: acknowledged timestamps against stored
//!                      ones; missing points fail the run with exit code 2
//! storage_lag.rs       `--storage-lag`: ack -> queryable through the REST API
//! forward.rs           `--forward-http|kafka|blackhole`: the sink's receiving end (an
//!                      HTTP receiver, a Kafka topic and reader, a listener that never
//!                      answers), the sink made through REST, arrivals against acks, lag
//! servers.rs           GridLinks, Mosquitto and rumqttd started on free loopback ports,
//!                      and what each one's acknowledgement promises (durability)
//! pki.rs               `compare --tls`: a throwaway CA and server certificate (openssl)
//! settings.rs          what a run was asked to do and where it ran, for the report
//! compare.rs           `compare` and `preset`: one scenario against several servers,
//!                      side by side; the presets
//! crash_loop.rs        `crash-loop`: kill -9 GridLinks under MQTT or HTTP load and restart
//!                      it on the same data, N cycles; every acknowledged point checked
//! workers.rs           `--workers N`: one run over N generator processes, in step
//! ```

pub mod cli;
pub mod compare;
pub mod crash_loop;
pub mod figures;
pub mod forward;
pub mod html;
pub mod loss_check;
pub mod mqtt_client;
pub mod pki;
pub mod proc_stats;
pub mod report;
pub mod rest_api;
pub mod scenario;
pub mod servers;
pub mod settings;
pub mod stats;
pub mod storage_lag;
pub mod template;
pub mod timeline;
pub mod workers;

/// Runs the subcommand the command line names, on a multi-threaded runtime. The exit
/// code is [`loss_check::EXIT_LOSS`] when the loss check finds missing points.
pub fn run(cli: cli::Cli) -> anyhow::Result<std::process::ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(threads) = cli.threads {
        builder.worker_threads(threads);
    }
    let runtime = builder.build()?;
    runtime.block_on(async move {
        match cli.command {
            cli::Command::MqttTelemetry(args) => scenario::telemetry::run(args).await,
            cli::Command::Connect(args) => scenario::connect::run(args).await,
            cli::Command::HttpTelemetry(args) => scenario::http_telemetry::run(args).await,
            cli::Command::Pubsub(args) => scenario::pubsub::run(args).await,
            cli::Command::Compare(args) => compare_cmd(args).await,
            cli::Command::Preset(args) => preset_cmd(args).await,
            cli::Command::Worker => workers::worker_main().await,
            cli::Command::Verify(args) => verify(args).await,
            cli::Command::CrashLoop(args) => crash_loop::run(args).await,
            cli::Command::LampTcp(args) => scenario::lamp_tcp::run(args).await,
            cli::Command::CoapTelemetry(args) => scenario::coap_telemetry::run(args).await,
            cli::Command::Provision(args) => scenario::provision::run(args).await,
            cli::Command::WsTelemetry(args) => scenario::ws_telemetry::run(args).await,
            cli::Command::OtaDownload(args) => scenario::ota_download::run(args).await,
            cli::Command::TenantFlood(args) => scenario::tenant_flood::run(args).await,
            cli::Command::AlarmLatency(args) => scenario::alarms::latency(args).await,
            cli::Command::AlarmList(args) => scenario::alarms::list(args).await,
        }
    })
}

/// `compare`: one scenario, several servers.
async fn compare_cmd(args: cli::CompareArgs) -> anyhow::Result<std::process::ExitCode> {
    // `--json`/`--html` after the scenario name would otherwise be dropped silently
    // (each server's run writes no file of its own).
    let given = args.scenario.output();
    let output = cli::OutputArgs {
        json: args.output.json.clone().or_else(|| given.json.clone()),
        html: args.output.html.clone().or_else(|| given.html.clone()),
    };
    let servers = args.servers.list();
    compare::check_tls(&servers, args.servers.tls, &args.scenario)?;
    let pki = tls_pki(args.servers.tls).await?;
    let mut scenario = args.scenario.clone();
    if let Some(pki) = &pki {
        scenario.use_tls(pki.files());
    }
    let tls = pki.as_ref().map(pki::ThrowawayPki::files);
    let runs = compare::compare(&servers, &scenario, &args.servers.binaries(), args.servers.tenant, tls).await?;
    let title = "gridlinks-bench compare";
    let names: Vec<&str> = servers.iter().map(|k| k.label()).collect();
    let name = compare::scenario_title(&scenario);
    compare::finish(
        title,
        &format!("{name} against {}", names.join(", ")),
        &[compare::Step { title: format!("{name} ({})", names.join(" vs ")), scenario, runs }],
        &output,
    )
}

/// `preset`: the steps of a preset, each compared across the servers.
async fn preset_cmd(args: cli::PresetArgs) -> anyhow::Result<std::process::ExitCode> {
    if args.name == "list" {
        for p in compare::PRESETS {
            println!("{}: {}", p.name, p.about);
            for (title, line) in p.steps {
                println!("  {title}\n    gridlinks-bench {}", line.join(" "));
            }
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let preset = compare::preset(&args.name)?;
    let extra: Vec<&str> = args.step_args.as_deref().map(|s| s.split_whitespace().collect()).unwrap_or_default();
    let servers = args.servers.list();
    let pki = tls_pki(args.servers.tls).await?;
    let tls = pki.as_ref().map(pki::ThrowawayPki::files);
    let bins = args.servers.binaries();
    let mut steps = Vec::new();
    for (title, line) in preset.steps {
        let mut line = line.to_vec();
        line.extend(&extra);
        let mut scenario = compare::Scenario::parse(&line)?;
        if args.scale != 1.0 {
            scenario.scale(args.scale);
        }
        if let Some(d) = args.duration {
            scenario.set_duration(d);
        }
        compare::check_tls(&servers, args.servers.tls, &scenario)?;
        if let Some(files) = tls {
            scenario.use_tls(files);
        }
        eprintln!("=== {title}");
        let runs = compare::compare(&servers, &scenario, &bins, args.servers.tenant, tls).await?;
        let title = if tls.is_some() { format!("{title} (over TLS)") } else { title.to_string() };
        steps.push(compare::Step { title, scenario, runs });
    }
    compare::finish(
        &format!("gridlinks-bench preset {}", preset.name),
        &format!("{} (scale {})", preset.about, args.scale),
        &steps,
        &args.output,
    )
}

/// `--tls` of `compare` and `preset`: the run's certificates, removed when dropped.
async fn tls_pki(tls: bool) -> anyhow::Result<Option<pki::ThrowawayPki>> {
    if !tls {
        return Ok(None);
    }
    let pki = pki::ThrowawayPki::create().await.map_err(|e| e.context("making the certificates of --tls"))?;
    Ok(Some(pki))
}

/// `verify`: the loss check alone, from an acks file.
async fn verify(args: cli::VerifyArgs) -> anyhow::Result<std::process::ExitCode> {
    let api = args.api.target("verify")?;
    let devices = loss_check::load(&args.acks)?;
    let threads = usize::from(args.api.verify_threads);
    let report = tokio::task::spawn_blocking(move || loss_check::check(&api, &devices, threads)).await??;
    print!("{}", report.human());
    if let Some(path) = &args.json {
        let doc = report::json::VerifyJson { scenario: "verify".into(), loss_check: (&report).into() };
        report::write_json(path, &report::json::value(&doc))?;
    }
    Ok(exit_code(report.passed()))
}

/// Exit code of a run: 0, or [`loss_check::EXIT_LOSS`] when a loss or delivery check failed.
pub fn exit_code(passed: bool) -> std::process::ExitCode {
    if passed {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(loss_check::EXIT_LOSS)
    }
}
