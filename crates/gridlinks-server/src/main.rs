//! `gridlinks`: the server binary. It owns the command line, logging and the order of
//! things ([`serve`]: configuration, then the platform, then the transports, then ordered
//! shutdown) and nothing else: what the server does lives in `gridlinks-platform` and the
//! transport crates, which this binary only composes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// glibc malloc took ~20% of server CPU under MQTT load (measured with perf); mimalloc's
/// thread-local free lists fit the many small, short-lived allocations of the data path.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use gridlinks_platform::auth::secret;
use gridlinks_platform::config::{Config, LogFormat, DEFAULT_TOML};

mod serve;

/// The log filter without `GRIDLINKS_LOG`: the storage engine's own INFO lines (one per
/// keyspace at every start) are noise to an operator.
const DEFAULT_LOG: &str = "info,fjall=warn,lsm_tree=warn";

#[derive(Parser)]
#[command(name = "gridlinks", version, about = "GridLinks IoT data-collection server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve {
        /// Configuration file (TOML); defaults are embedded.
        #[arg(long, short, env = "GRIDLINKS_CONFIG")]
        config: Option<PathBuf>,
        /// Data directory (overrides `data_dir`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// HTTP listen address (overrides `http.bind`).
        #[arg(long)]
        http_bind: Option<String>,
        /// MQTT listen address (overrides `mqtt.bind`).
        #[arg(long)]
        mqtt_bind: Option<String>,
        /// MQTT over WebSocket listen address (overrides `mqtt.ws_bind`; "" turns it off).
        #[arg(long)]
        mqtt_ws_bind: Option<String>,
        /// CoAP (UDP) listen address (overrides `coap.bind`; "" turns it off).
        #[arg(long)]
        coap_bind: Option<String>,
    },
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Administration of a data directory.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Writes a new random JWT signing secret to the secret file (`auth.jwt_secret_file`,
    /// default `{data_dir}/jwt.secret`). A running server reads it within 2 s: every
    /// session is logged out.
    RotateSecret {
        /// Configuration file (TOML), as given to `serve`.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Data directory (overrides `data_dir`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the full default configuration, every field commented.
    Default,
    /// Validate a configuration file (with the environment applied); exit 1 if invalid.
    Check {
        /// The file to check.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    // Everything the server creates (data files, the secret file, directories) is private to
    // its user: 0600 files, 0700 directories.
    // SAFETY: umask only sets this process's file-creation mask.
    unsafe {
        libc::umask(0o077);
    }
    // No transparent huge pages: the allocator asks for them, and the first touch of one
    // zeroes 2 MiB in the page fault — a 7 ms stall of the storage writer was traced to it
    // (docs/benchmarks.md, issue 13). Idle memory is smaller without them too.
    // SAFETY: PR_SET_THP_DISABLE only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Admin { command: AdminCommand::RotateSecret { config, data_dir } } => {
            let cfg = match load(config.as_deref(), data_dir) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if !cfg.auth.jwt_secret.is_empty() {
                eprintln!("gridlinks: the JWT secret is given inline (auth.jwt_secret / GRIDLINKS_AUTH_JWT_SECRET); change it there");
                return ExitCode::FAILURE;
            }
            let path = secret::path(&cfg);
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
                eprintln!("gridlinks: {} does not exist", dir.display());
                return ExitCode::FAILURE;
            }
            match secret::write(&path, &secret::generate()) {
                Ok(()) => {
                    println!(
                        "New JWT secret written to {}. A running server logs every session out within 2 s.",
                        path.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gridlinks: cannot write {}: {e}", path.display());
                    ExitCode::FAILURE
                }
            }
        }
        Command::Config { command: ConfigCommand::Default } => {
            print!("{DEFAULT_TOML}");
            ExitCode::SUCCESS
        }
        Command::Config { command: ConfigCommand::Check { file } } => match Config::load(Some(&file), std::env::vars())
        {
            Ok(_) => {
                println!("{}: OK", file.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                ExitCode::FAILURE
            }
        },
        Command::Serve { config, data_dir, http_bind, mqtt_bind, mqtt_ws_bind, coap_bind } => {
            let mut cfg = match load(config.as_deref(), data_dir) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if let Some(b) = http_bind {
                cfg.http.bind = b;
            }
            if let Some(b) = mqtt_bind {
                cfg.mqtt.bind = b;
            }
            if let Some(b) = mqtt_ws_bind {
                cfg.mqtt.ws_bind = b;
            }
            if let Some(b) = coap_bind {
                cfg.coap.bind = b;
            }
            if let Err(e) = cfg.validate() {
                eprintln!("gridlinks: {e}");
                return ExitCode::FAILURE;
            }
            let logs = tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("GRIDLINKS_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG)),
                )
                .with_writer(std::io::stderr);
            match cfg.log.format {
                LogFormat::Json => logs.json().init(),
                LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
            }
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .on_thread_park(release_idle_memory)
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("gridlinks: cannot start runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(serve::serve(cfg, shutdown_signal())) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("gridlinks: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The configuration from `file` and the environment, with `--data-dir` applied; on error
/// it is printed and the exit code returned.
fn load(file: Option<&std::path::Path>, data_dir: Option<PathBuf>) -> Result<Config, ExitCode> {
    let mut cfg = Config::load(file, std::env::vars()).map_err(|e| {
        eprintln!("gridlinks: {e}");
        ExitCode::FAILURE
    })?;
    if let Some(d) = data_dir {
        cfg.data_dir = d;
    }
    Ok(cfg)
}

/// Called when a runtime worker goes idle: at most once a second per worker, mimalloc gives
/// the pages freed since back to the OS. Without it, memory freed in a burst (a client
/// with many subscriptions leaving, a load peak) stays resident until that worker
/// allocates again, which an idle server may never do.
fn release_idle_memory() {
    use std::cell::Cell;
    use std::time::{Duration, Instant};
    thread_local!(static LAST: Cell<Option<Instant>> = const { Cell::new(None) });
    LAST.with(|last| {
        if last.get().is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            last.set(Some(Instant::now()));
            // SAFETY: mi_collect only tidies the calling thread's heap; any thread may call it.
            unsafe { libmimalloc_sys::mi_collect(false) };
        }
    });
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return ctrl_c.await.unwrap_or(()),
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
