//! Command-line options. The doc comment of each option is its `--help` text.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gridlinks_codec::mqtt::ProtocolVersion;

/// Load generator for GridLinks and other MQTT servers.
#[derive(Debug, Parser)]
#[command(name = "gridlinks-bench", version, about)]
pub struct Cli {
    /// Worker threads of the generator's runtime (default: one per CPU).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

/// The scenarios.
// Parsed once per process: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// N devices publish ~100-byte JSON telemetry as fast as acknowledgements allow.
    MqttTelemetry(TelemetryArgs),
    /// Connection storm at a rate, then all connections held idle; server memory per connection.
    Connect(ConnectArgs),
    /// Only the loss check: compare an acks file (`mqtt-telemetry --save-acks`) with
    /// what the server stored. Exit code 2 when acknowledged points are missing.
    Verify(VerifyArgs),
}

/// The server's ThingsBoard REST API, for `--provision` and the loss check.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// Base URL of the REST API, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub api: Option<String>,
    /// Administrator user name for POST /api/auth/login.
    #[arg(long, default_value = "admin")]
    pub api_user: String,
    /// Administrator password.
    #[arg(long, env = "GRIDLINKS_BENCH_API_PASSWORD", hide_env_values = true)]
    pub api_password: Option<String>,
    /// REST calls of the loss check in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub verify_threads: u16,
}

impl ApiArgs {
    /// The API target; fails when --api or --api-password is missing.
    pub fn target(&self, needed_for: &str) -> anyhow::Result<crate::rest_api::ApiTarget> {
        let (Some(base), Some(password)) = (&self.api, &self.api_password) else {
            anyhow::bail!(
                "{needed_for} needs --api URL and --api-password (or GRIDLINKS_BENCH_API_PASSWORD)"
            );
        };
        Ok(crate::rest_api::ApiTarget {
            base: base.clone(),
            user: self.api_user.clone(),
            password: password.clone(),
        })
    }
}

/// Options of `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Acks file written by `mqtt-telemetry --save-acks`.
    #[arg(long)]
    pub acks: PathBuf,
    #[command(flatten)]
    pub api: ApiArgs,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Where to connect, as whom, and what to observe; shared by every scenario.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Server host name or address.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Server MQTT port.
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// Local source addresses to spread connections over, comma separated (each address
    /// gives ~28k ephemeral ports), e.g. 127.0.0.1,127.0.0.2. Default: chosen by the OS.
    #[arg(long, value_delimiter = ',')]
    pub sources: Vec<IpAddr>,
    /// MQTT protocol version spoken.
    #[arg(long, value_enum, default_value_t = MqttVersion::V311)]
    pub mqtt_version: MqttVersion,
    /// Client ids are `PREFIX-INDEX`, one per connection.
    #[arg(long, default_value = "bench")]
    pub client_id_prefix: String,
    /// File with one access token per line; connection i uses line i as MQTT user name
    /// with an empty password (ThingsBoard device authentication).
    #[arg(long, conflicts_with = "username")]
    pub tokens_file: Option<PathBuf>,
    /// One MQTT user name for every connection (e.g. for an anonymous Mosquitto).
    #[arg(long)]
    pub username: Option<String>,
    /// Password sent with --username.
    #[arg(long, requires = "username")]
    pub password: Option<String>,
    /// Time allowed for TCP connect plus CONNECT/CONNACK, e.g. 10s or 500ms.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub connect_timeout: Duration,
    /// Most handshakes (TCP connect to CONNACK) in progress at once; bounds the SYN
    /// burst so a storm measures the server, not its listen backlog (Mosquitto listens
    /// with a backlog of 100; an overflow shows as ~1 s CONNACK latency, the SYN retry).
    #[arg(long, default_value_t = 64)]
    pub max_pending: usize,
    /// MQTT keep-alive in seconds sent in CONNECT; a PINGREQ goes out when a connection
    /// has sent nothing for 3/4 of it.
    #[arg(long, default_value_t = 60)]
    pub keep_alive: u16,
    /// PID of the server process: its CPU time and memory are read from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// MQTT protocol versions the generator speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MqttVersion {
    /// MQTT 3.1.1.
    #[value(name = "3.1.1")]
    V311,
    /// MQTT 5.0.
    #[value(name = "5")]
    V5,
}

impl MqttVersion {
    /// The version as reports print it.
    pub fn label(self) -> &'static str {
        match self {
            MqttVersion::V311 => "3.1.1",
            MqttVersion::V5 => "5",
        }
    }
}

impl From<MqttVersion> for ProtocolVersion {
    fn from(v: MqttVersion) -> Self {
        match v {
            MqttVersion::V311 => ProtocolVersion::V3_1_1,
            MqttVersion::V5 => ProtocolVersion::V5,
        }
    }
}

/// Options of `mqtt-telemetry`.
#[derive(Debug, Args)]
pub struct TelemetryArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Device connections.
    #[arg(long, default_value_t = 100)]
    pub devices: usize,
    /// Messages each device publishes, then stops (instead of --duration).
    #[arg(long, conflicts_with = "duration")]
    pub messages_per_device: Option<u64>,
    /// How long devices publish, e.g. 20s (default 10s unless --messages-per-device).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// QoS of the publishes: 1 (acknowledged, latency measured) or 0.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub qos: u8,
    /// Most unacknowledged QoS 1 publishes per connection (at QoS 0: publishes per write).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub inflight: u16,
    /// Offered load: total publishes per second, spread evenly over the devices (0: as
    /// fast as acknowledgements allow). Latency is then measured from each publish's
    /// scheduled time (less up to 2 ms of timer lateness), so a server that falls
    /// behind the offered load shows it in the percentiles.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Payload size in bytes: the JSON is padded with spaces up to this size (never cut).
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Leave out the "ts" field: payload is the bare values object.
    #[arg(long)]
    pub no_ts: bool,
    /// Topic published to.
    #[arg(long, default_value = "v1/devices/me/telemetry")]
    pub topic: String,
    /// New connections per second while connecting (0: as fast as --max-pending allows).
    #[arg(long, default_value_t = 2000.0)]
    pub connect_rate: f64,
    /// A connection that waits this long for any PUBACK counts its unacknowledged
    /// publishes as failed and stops.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub ack_timeout: Duration,
    /// Create the devices first through the REST API's bulk import: names `bench-<i>`,
    /// fresh random access tokens (instead of --tokens-file or --username).
    #[arg(long, conflicts_with_all = ["tokens_file", "username"])]
    pub provision: bool,
    /// After the run, check through the REST API that every acknowledged point is
    /// stored (key `seq`); exit code 2 when any is missing. QoS 1 only.
    #[arg(long, conflicts_with = "no_ts")]
    pub verify: bool,
    /// Write the acknowledged timestamps per device name to this JSON file, for
    /// `gridlinks-bench verify --acks`. QoS 1 only.
    #[arg(long, conflicts_with = "no_ts")]
    pub save_acks: Option<PathBuf>,
    /// Device names, one a line, matching --tokens-file line by line (for --verify and
    /// --save-acks without --provision).
    #[arg(long, requires = "tokens_file")]
    pub device_names_file: Option<PathBuf>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Options of `connect`.
#[derive(Debug, Args)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Connections to open.
    #[arg(long, default_value_t = 1000)]
    pub connections: usize,
    /// New connections per second (0: as fast as --max-pending allows).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// How long all connections are held idle after the last one connected, e.g. 30s.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub hold: Duration,
}

/// Parses "10", "10s", "1.5s", "500ms" or "2m" (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (use e.g. 10s, 500ms, 2m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("not a duration: {s:?}"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn tokens_file_and_username_exclude_each_other() {
        let r = Cli::try_parse_from([
            "gridlinks-bench",
            "connect",
            "--tokens-file",
            "t",
            "--username",
            "u",
        ]);
        assert!(r.is_err());
        let cli = Cli::try_parse_from([
            "gridlinks-bench",
            "mqtt-telemetry",
            "--sources",
            "127.0.0.1,127.0.0.2",
            "--duration",
            "3s",
        ])
        .unwrap();
        let Command::MqttTelemetry(t) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(t.target.sources.len(), 2);
        assert_eq!(t.duration, Some(Duration::from_secs(3)));
    }

    #[test]
    fn provision_replaces_tokens_and_names_need_tokens() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["gridlinks-bench", "mqtt-telemetry"].iter().chain(args))
        };
        assert!(parse(&["--provision", "--tokens-file", "t"]).is_err());
        assert!(parse(&["--provision", "--username", "u"]).is_err());
        assert!(parse(&["--device-names-file", "n"]).is_err());
        assert!(parse(&["--verify", "--no-ts"]).is_err());
        let cli = parse(&[
            "--provision",
            "--verify",
            "--api",
            "http://h:1",
            "--api-password",
            "pw",
        ])
        .unwrap();
        let Command::MqttTelemetry(t) = cli.command else {
            panic!("wrong subcommand")
        };
        assert!(t.provision && t.verify);
        assert_eq!(t.api.api_user, "admin");
        let api = t.api.target("--verify").unwrap();
        assert!(format!("{api:?}").contains("<REDACTED>"));
        let cli = Cli::try_parse_from(["gridlinks-bench", "verify", "--acks", "a.json"]).unwrap();
        let Command::Verify(v) = cli.command else {
            panic!("wrong subcommand")
        };
        assert!(v.api.target("verify").is_err(), "no --api given");
    }
}
