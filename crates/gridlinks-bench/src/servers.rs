//! The servers `compare` and `crash-loop` start: GridLinks and peer brokers, each on
//! free loopback ports with a fresh temporary directory (data, config, log), stopped with
//! SIGTERM (SIGKILL after 10 s) when done, killed if dropped. `crash-loop` also kills
//! GridLinks with SIGKILL on purpose and starts it again on the same data
//! ([`ManagedServer::kill`], [`ManagedServer::start_again`]).
//!
//! To add a broker: a [`ServerKind`] variant, its binary in [`Binaries`], and a branch in
//! [`ManagedServer::start`] that writes its config for the given port and returns the
//! command line (see `docs/bench-tool.md`).
//!
//! With TLS files ([`ManagedServer::start_tls`], `compare --tls`) a server also gets an
//! MQTT-over-TLS listener on a free port of its own, beside its plaintext one.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use tokio::process::{Child, Command};

use crate::pki::TlsFiles;

/// How long a server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a server may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Log lines quoted when a server fails to start.
const LOG_TAIL: usize = 20;

/// How often a starting server is asked whether it is ready: also the resolution of the
/// restart-to-ready times `crash-loop` reports.
const READY_POLL: Duration = Duration::from_millis(10);

/// Temporary directories made by this process.
static DIRS: AtomicUsize = AtomicUsize::new(0);

/// A server the tool can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerKind {
    /// This project's server.
    Gridlinks,
    /// Eclipse Mosquitto (Debian package).
    Mosquitto,
    /// rumqttd, a Rust broker (`cargo install rumqttd`).
    Rumqttd,
}

impl ServerKind {
    /// Name in reports and on the command line.
    pub fn label(self) -> &'static str {
        match self {
            ServerKind::Gridlinks => "gridlinks",
            ServerKind::Mosquitto => "mosquitto",
            ServerKind::Rumqttd => "rumqttd",
        }
    }

    /// Whether [`ManagedServer::start_tls`] can give it an MQTT-over-TLS listener.
    pub fn serves_tls(self) -> bool {
        match self {
            ServerKind::Gridlinks | ServerKind::Mosquitto => true,
            // Not wired up: rumqttd's TLS listener is documented with a client
            // certificate for every client (`capath`), not the server-only TLS the
            // others are measured with.
            ServerKind::Rumqttd => false,
        }
    }

    /// What an acknowledgement from this server promises in `scenario`, as the tool
    /// starts it: a comparison's figures are only comparable knowing that GridLinks
    /// answers after a durable commit while the peers keep everything in memory.
    pub fn durability(self, scenario: &str) -> &'static str {
        match (self, scenario) {
            (ServerKind::Gridlinks, "pubsub") => {
                "stores every QoS 1 copy for a persistent subscriber session in its fsync'd store before \
                 the publisher's PUBACK; messages to clean sessions are relayed from memory, as a broker does"
            }
            (ServerKind::Gridlinks, "connect") => {
                "nothing to store in this scenario (devices and credentials are read from its store)"
            }
            (ServerKind::Gridlinks, _) => {
                "acknowledges after a durable commit: PUBACK or HTTP 200 once the point is in its fsync'd \
                 store (storage.fsync = true, the default), so a kill -9 or power loss right after the \
                 acknowledgement loses nothing"
            }
            (ServerKind::Mosquitto, _) => {
                "in memory (persistence false): nothing persisted; a restart loses every acknowledged \
                 message and session"
            }
            (ServerKind::Rumqttd, _) => {
                "in memory (rumqttd has no persistence): nothing persisted; a restart loses every \
                 acknowledged message and session"
            }
        }
    }
}

/// Where the server binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `gridlinks`.
    pub gridlinks: PathBuf,
    /// `mosquitto`.
    pub mosquitto: PathBuf,
    /// `rumqttd`.
    pub rumqttd: PathBuf,
}

impl Binaries {
    /// `gridlinks` next to the running executable, else on PATH; `mosquitto` on PATH,
    /// else /usr/sbin; `rumqttd` on PATH, else ~/.cargo/bin.
    pub fn discover() -> Self {
        let beside_me = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("gridlinks")))
            .filter(|p| p.is_file());
        let home_cargo = std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cargo/bin/rumqttd"))
            .unwrap_or_else(|| PathBuf::from("rumqttd"));
        Binaries {
            gridlinks: beside_me.or_else(|| on_path("gridlinks")).unwrap_or_else(|| PathBuf::from("gridlinks")),
            mosquitto: on_path("mosquitto").unwrap_or_else(|| PathBuf::from("/usr/sbin/mosquitto")),
            rumqttd: on_path("rumqttd").unwrap_or(home_cargo),
        }
    }

    /// [`discover`](Self::discover)ed, with `gridlinks` instead when given (`--gridlinks-bin`).
    pub fn with_gridlinks(gridlinks: Option<&Path>) -> Self {
        let mut bins = Self::discover();
        if let Some(bin) = gridlinks {
            bins.gridlinks = bin.to_path_buf();
        }
        bins
    }

    fn of(&self, kind: ServerKind) -> &Path {
        match kind {
            ServerKind::Gridlinks => &self.gridlinks,
            ServerKind::Mosquitto => &self.mosquitto,
            ServerKind::Rumqttd => &self.rumqttd,
        }
    }
}

/// `name` in a directory of PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// What to install when a binary is missing.
fn install_hint(kind: ServerKind) -> &'static str {
    match kind {
        ServerKind::Gridlinks => "build it (cargo build --release -p gridlinks-server) or pass --gridlinks-bin",
        ServerKind::Mosquitto => "apt-get install mosquitto, or pass --mosquitto-bin",
        ServerKind::Rumqttd => "cargo install rumqttd, or pass --rumqttd-bin",
    }
}

/// A free TCP port on 127.0.0.1 (bound and released), below Linux's ephemeral range
/// (32768-60999): the generator's own client sockets, and those of anything else running,
/// take ports from that range and could take it before the server binds it.
pub fn free_port() -> anyhow::Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    for _ in 0..1000 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        let port = 10_000 + (h.finish() % 22_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free port found in 10000-31999 on 127.0.0.1")
}

/// A free UDP port on 127.0.0.1, chosen like [`free_port`].
pub fn free_udp_port() -> anyhow::Result<u16> {
    for _ in 0..1000 {
        let port = free_port()?;
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free UDP port found")
}

/// Mosquitto's configuration: anonymous, in memory, no Nagle delay, queues large
/// enough that a benchmark measures throughput rather than drops. It logs to stderr
/// (the log file): as root, Mosquitto drops to its own user, which cannot write a file
/// in the tool's directory. With `tls`, a second listener speaks MQTT over TLS (see
/// [`mosquitto_tls_listener`]).
pub fn mosquitto_config(port: u16, tls: Option<(u16, &TlsFiles)>) -> String {
    let mut config = format!(
        "listener {port} 127.0.0.1\n\
         allow_anonymous true\n\
         persistence false\n\
         set_tcp_nodelay true\n\
         max_queued_messages 100000\n\
         log_dest stderr\n\
         connection_messages false\n"
    );
    if let Some((tls_port, files)) = tls {
        config.push_str(&mosquitto_tls_listener(tls_port, files));
    }
    config
}

/// Mosquitto's MQTT-over-TLS listener: the certificate and key GridLinks serves, the CA
/// that signed them, no client certificate asked for (as GridLinks: it asks but does not
/// require one). The global settings above apply to it too (`per_listener_settings` is
/// off). Mosquitto reads the files before it drops to its own user.
fn mosquitto_tls_listener(port: u16, files: &TlsFiles) -> String {
    format!(
        "\nlistener {port} 127.0.0.1\n\
         cafile {}\n\
         certfile {}\n\
         keyfile {}\n\
         require_certificate false\n",
        files.ca.display(),
        files.cert.display(),
        files.key.display()
    )
}

/// rumqttd's configuration (0.20): one MQTT 3.1.1 and one MQTT 5 listener on loopback,
/// limits raised for 20,000 connections and 256 KiB payloads, no console or metrics.
pub fn rumqttd_config(v4_port: u16, v5_port: u16) -> String {
    let listener = |section: &str, port: u16| {
        format!(
            "[{section}]\n\
             name = \"{section}\"\n\
             listen = \"127.0.0.1:{port}\"\n\
             next_connection_delay_ms = 0\n\
             [{section}.connections]\n\
             connection_timeout_ms = 60000\n\
             max_payload_size = 262144\n\
             max_inflight_count = 100\n\
             dynamic_filters = true\n"
        )
    };
    format!(
        "id = 0\n\n\
         [router]\n\
         id = 0\n\
         max_connections = 20010\n\
         max_outgoing_packet_count = 200\n\
         max_segment_size = 104857600\n\
         max_segment_count = 10\n\n\
         {}\n{}",
        listener("v4.1", v4_port),
        listener("v5.1", v5_port)
    )
}

/// A running server.
pub struct ManagedServer {
    kind: ServerKind,
    /// The command line, for restarts.
    command: Command,
    child: Child,
    pid: u32,
    dir: PathBuf,
    log: PathBuf,
    mqtt_port: u16,
    /// The MQTT-over-TLS port and the files it serves, when started with TLS.
    tls: Option<(u16, TlsFiles)>,
    api: Option<(String, String)>,
    version: String,
    /// Keep `dir` when dropped (see [`ManagedServer::keep_dir`]).
    keep_dir: bool,
}

impl ManagedServer {
    /// Starts `kind` on free loopback ports and waits until it accepts connections.
    pub async fn start(kind: ServerKind, bins: &Binaries) -> anyhow::Result<Self> {
        Self::start_on(kind, bins, None).await
    }

    /// [`start`](Self::start), with GridLinks' data in `data_dir` instead of the
    /// temporary directory (peers keep no data; a given `data_dir` is never removed).
    pub async fn start_on(kind: ServerKind, bins: &Binaries, data_dir: Option<&Path>) -> anyhow::Result<Self> {
        Self::start_configured(kind, bins, data_dir, None, None, None).await
    }

    /// [`start`](Self::start), with an MQTT-over-TLS listener too (on a free port of its
    /// own) serving `tls`' certificate and key; for kinds that
    /// [`serve_tls`](ServerKind::serves_tls) only.
    pub async fn start_tls(kind: ServerKind, bins: &Binaries, tls: &TlsFiles) -> anyhow::Result<Self> {
        Self::start_configured(kind, bins, None, None, None, Some(tls)).await
    }

    /// GridLinks with `config` (TOML) as its configuration file, and CoAP on UDP
    /// `coap_port` of 127.0.0.1 if given (off otherwise); the command line still sets the
    /// data directory, HTTP and MQTT ports.
    pub async fn start_gridlinks_with(bins: &Binaries, config: &str, coap_port: Option<u16>) -> anyhow::Result<Self> {
        Self::start_configured(ServerKind::Gridlinks, bins, None, Some(config), coap_port, None).await
    }

    async fn start_configured(
        kind: ServerKind,
        bins: &Binaries,
        data_dir: Option<&Path>,
        config: Option<&str>,
        coap_port: Option<u16>,
        tls_files: Option<&TlsFiles>,
    ) -> anyhow::Result<Self> {
        let bin = bins.of(kind);
        if !bin.is_file() {
            bail!("{} not found at {}: {}", kind.label(), bin.display(), install_hint(kind));
        }
        if tls_files.is_some() && !kind.serves_tls() {
            bail!("{} is not supported with TLS", kind.label());
        }
        let dir = std::env::temp_dir().join(format!(
            "gridlinks-bench-{}-{}-{}",
            kind.label(),
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = dir.join("server.log");
        let mqtt_port = free_port()?;
        let tls = match tls_files {
            Some(files) => Some((free_port()?, files.clone())),
            None => None,
        };
        let mut command = Command::new(bin);
        let mut api = None;
        match kind {
            ServerKind::Gridlinks => {
                let http_port = free_port()?;
                let password = crate::rest_api::random_tokens(1)?.remove(0);
                command
                    .arg("serve")
                    .arg("--data-dir")
                    .arg(data_dir.map_or_else(|| dir.join("data"), Path::to_path_buf))
                    .args(["--http-bind", &format!("127.0.0.1:{http_port}")])
                    .args(["--mqtt-bind", &format!("127.0.0.1:{mqtt_port}")])
                    .args(["--mqtt-ws-bind", ""])
                    .arg("--coap-bind")
                    .arg(coap_port.map(|p| format!("127.0.0.1:{p}")).unwrap_or_default())
                    .env("GRIDLINKS_ADMIN_PASSWORD", &password)
                    // The system administrator (user `sysadmin`) has the same password.
                    .env("GRIDLINKS_ADMIN_SYSADMIN_PASSWORD", &password)
                    // Pub/sub scenarios connect without credentials, as with the peers.
                    .env("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true")
                    // The default, set so that an inherited override cannot make the
                    // report's durability note (`ServerKind::durability`) untrue.
                    .env("GRIDLINKS_STORAGE_FSYNC", "true")
                    // `--forward-*`: the sink's receiver is the tool's, on loopback.
                    .env("GRIDLINKS_FORWARDING_ALLOW_PRIVATE_ADDRESSES", "true");
                api = Some((format!("http://127.0.0.1:{http_port}"), password));
                if let Some((tls_port, files)) = &tls {
                    command
                        .env("GRIDLINKS_MQTT_TLS_BIND", format!("127.0.0.1:{tls_port}"))
                        .env("GRIDLINKS_TLS_CERT_FILE", &files.cert)
                        .env("GRIDLINKS_TLS_KEY_FILE", &files.key);
                }
                if let Some(text) = config {
                    let path = dir.join("gridlinks.toml");
                    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
                    command.arg("--config").arg(path);
                }
            }
            ServerKind::Mosquitto => {
                let conf = dir.join("mosquitto.conf");
                let tls = tls.as_ref().map(|(port, files)| (*port, files));
                std::fs::write(&conf, mosquitto_config(mqtt_port, tls))?;
                command.arg("-c").arg(conf);
            }
            ServerKind::Rumqttd => {
                let conf = dir.join("rumqttd.toml");
                std::fs::write(&conf, rumqttd_config(mqtt_port, free_port()?))?;
                // -q: no banner; NO_COLOR: plain log lines.
                command.arg("-q").arg("-c").arg(conf).env("NO_COLOR", "1");
            }
        }
        let (child, pid) = spawn(&mut command, &log)?;
        let mut server = ManagedServer {
            kind,
            command,
            child,
            pid,
            dir,
            log,
            mqtt_port,
            tls,
            api,
            version: version_of(kind, bin).await,
            keep_dir: false,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    /// Stops the server and starts it again on the same ports and data (GridLinks after
    /// provisioning, so the run measures a server that did not just bulk-import).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.terminate().await?;
        self.start_again().await.map(drop)
    }

    /// SIGKILL (`kill -9`): the server gets no chance to flush, sync or close anything.
    /// Fails when it had already exited by itself.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} had exited by itself with {status} before the kill:\n{}", self.kind.label(), self.log_tail());
        }
        self.child.start_kill().context("sending SIGKILL")?;
        self.child.wait().await.context("reaping the killed server")?;
        Ok(())
    }

    /// Starts the server again after it exited or was killed, with the same command
    /// line (ports, data); how long it took from the spawn until it was ready
    /// (to [`READY_POLL`]).
    pub async fn start_again(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let (child, pid) = spawn(&mut self.command, &self.log)?;
        self.child = child;
        self.pid = pid;
        self.wait_ready().await?;
        Ok(started.elapsed())
    }

    /// SIGTERM, then SIGKILL after 10 s.
    async fn terminate(&mut self) -> anyhow::Result<()> {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.pid.to_string()]).status();
        if tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await.is_err() {
            self.child.kill().await?;
        }
        Ok(())
    }

    /// Waits until the MQTT ports (and for GridLinks `/healthz`) answer.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited with {status} while starting:\n{}", self.kind.label(), self.log_tail());
            }
            let mut mqtt_up = tokio::net::TcpStream::connect(("127.0.0.1", self.mqtt_port)).await.is_ok();
            if let Some((tls_port, _)) = &self.tls {
                mqtt_up = mqtt_up && tokio::net::TcpStream::connect(("127.0.0.1", *tls_port)).await.is_ok();
            }
            let api_up = match &self.api {
                Some((base, _)) => {
                    let url = format!("{base}/healthz");
                    tokio::task::spawn_blocking(move || ureq::get(&url).call().is_ok()).await?
                }
                None => true,
            };
            if mqtt_up && api_up {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} not ready within {} s:\n{}", self.kind.label(), START_TIMEOUT.as_secs(), self.log_tail());
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// The last lines of the server's log.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
    }

    /// Which server this is.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// Its MQTT 3.1.1/5 port on 127.0.0.1.
    pub fn mqtt_port(&self) -> u16 {
        self.mqtt_port
    }

    /// Its MQTT-over-TLS port on 127.0.0.1 and the files served there, when started
    /// with TLS.
    pub fn mqtt_tls(&self) -> Option<(u16, &TlsFiles)> {
        self.tls.as_ref().map(|(port, files)| (*port, files))
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// GridLinks only: REST API base URL and admin password.
    pub fn api(&self) -> Option<(String, String)> {
        self.api.clone()
    }

    /// Name and version, e.g. `mosquitto 2.0.11`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// SIGTERM, then SIGKILL after 10 s; removes the temporary directory unless
    /// `GRIDLINKS_BENCH_KEEP_SERVER_DIRS` is set.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.terminate().await
        // Drop removes the directory.
    }

    /// The temporary directory (data, config, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps the temporary directory when dropped (for a look at its data and log).
    pub fn keep_dir(&mut self) {
        self.keep_dir = true;
    }
}

impl Drop for ManagedServer {
    fn drop(&mut self) {
        // `kill_on_drop` ends a process still running.
        if !self.keep_dir && std::env::var_os("GRIDLINKS_BENCH_KEEP_SERVER_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept {}", self.dir.display());
        }
    }
}

/// Starts `command` with stdout and stderr into `log` (appended: a restart keeps the
/// earlier lines).
fn spawn(command: &mut Command, log: &Path) -> anyhow::Result<(Child, u32)> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let child = command
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .context("starting the server")?;
    let pid = child.id().context("server exited at once")?;
    Ok((child, pid))
}

/// Best effort: `gridlinks --version`, `rumqttd --version`, Mosquitto's `-h` banner.
async fn version_of(kind: ServerKind, bin: &Path) -> String {
    let flag = match kind {
        ServerKind::Mosquitto => "-h",
        ServerKind::Gridlinks | ServerKind::Rumqttd => "--version",
    };
    let out = Command::new(bin).arg(flag).stdin(Stdio::null()).output().await;
    let text = out
        .map(|o| {
            let mut t = String::from_utf8_lossy(&o.stdout).into_owned();
            t.push_str(&String::from_utf8_lossy(&o.stderr));
            t
        })
        .unwrap_or_default();
    // "mosquitto version 2.0.11", "gridlinks 0.1.0", "rumqttd 0.20.0"
    let version =
        text.split_whitespace().find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'));
    match version {
        Some(v) => format!("{} {v}", kind.label()),
        None => format!("{} (unknown version)", kind.label()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_name_the_port_and_loopback_only() {
        let m = mosquitto_config(1234, None);
        assert!(m.starts_with("listener 1234 127.0.0.1\n"), "{m}");
        assert!(m.contains("allow_anonymous true"));
        assert!(!m.contains("certfile") && m.matches("listener ").count() == 1, "{m}");
        let r = rumqttd_config(1883, 1884);
        assert!(r.contains("listen = \"127.0.0.1:1883\""), "{r}");
        assert!(r.contains("listen = \"127.0.0.1:1884\""), "{r}");
        assert!(!r.contains("0.0.0.0"), "{r}");
        assert!(!r.contains("[console]") && !r.contains("[prometheus]"));
    }

    #[test]
    fn mosquitto_gets_a_tls_listener_with_the_shared_files() {
        let files = TlsFiles {
            ca: PathBuf::from("/tmp/pki/ca.pem"),
            cert: PathBuf::from("/tmp/pki/server.pem"),
            key: PathBuf::from("/tmp/pki/server.key"),
        };
        let m = mosquitto_config(1234, Some((8883, &files)));
        assert!(m.starts_with("listener 1234 127.0.0.1\n"), "{m}");
        let tls = &m[m.find("\nlistener 8883 127.0.0.1\n").expect("a second listener")..];
        // Listener options follow their `listener` line.
        for line in [
            "cafile /tmp/pki/ca.pem",
            "certfile /tmp/pki/server.pem",
            "keyfile /tmp/pki/server.key",
            "require_certificate false",
        ] {
            assert!(tls.lines().any(|l| l == line), "{line} missing from {tls}");
        }
        assert!(m.contains("allow_anonymous true") && !m.contains("0.0.0.0"), "{m}");
        assert!(ServerKind::Gridlinks.serves_tls() && ServerKind::Mosquitto.serves_tls());
        assert!(!ServerKind::Rumqttd.serves_tls());
    }

    #[test]
    fn free_ports_are_nonzero() {
        assert_ne!(free_port().unwrap(), 0);
    }
}
