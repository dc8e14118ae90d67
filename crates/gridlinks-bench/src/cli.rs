//! Command-line options. The doc comment of each option is its `--help` text.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gridlinks_codec::mqtt::ProtocolVersion;
use serde::{Deserialize, Serialize};

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
    /// N devices post telemetry over HTTP/1.1 keep-alive (ThingsBoard device API).
    HttpTelemetry(HttpTelemetryArgs),
    /// Publisher groups -> subscriber groups through any MQTT broker: deliveries,
    /// end-to-end latency, broker cost (TBMQ-style fan-in / fan-out / point-to-point).
    Pubsub(PubsubArgs),
    /// The same scenario against GridLinks and peer brokers, each started by the tool on
    /// free loopback ports, side by side: `compare --against mosquitto mqtt-telemetry ...`.
    Compare(CompareArgs),
    /// Replay a published test (tb-2017, tb-2021, tbmq-fanin) against GridLinks and peers.
    Preset(PresetArgs),
    /// N devices post telemetry over CoAP (confirmable, one in flight each) to a GridLinks the
    /// tool starts, with retransmissions and the loss check.
    CoapTelemetry(CoapTelemetryArgs),
    /// N single-lamp controllers over GridLinks' custom TCP protocol: log in, then report
    /// properties, each report answered once durable; per decoder (native, script), each on
    /// a GridLinks the tool starts, with the loss check.
    LampTcp(LampTcpArgs),
    /// Devices provision themselves (ThingsBoard's `POST /api/v1/provision`) into P device
    /// profiles on a GridLinks the tool starts; every returned token is then used once.
    Provision(ProvisionArgs),
    /// Live telemetry over ThingsBoard's WebSocket API: devices post over HTTP, sessions
    /// subscribed to them receive each committed point; post → update latency, server CPU
    /// per update, RSS per session.
    WsTelemetry(WsTelemetryArgs),
    /// N devices download one firmware package at once over MQTT in chunks (ThingsBoard's
    /// `v2/fw/…` topics) from a GridLinks the tool starts; every byte compared.
    OtaDownload(OtaDownloadArgs),
    /// Tenant isolation under a flood: on a GridLinks the tool starts, a quiet tenant's
    /// devices publish at a fixed rate alone (phase A), then while a noisy tenant floods
    /// at a multiple of its telemetry rate limit (phase B); the quiet PUBACK p99 of both
    /// phases, the noisy tenant's refusals (0x97), and every acknowledged point checked.
    TenantFlood(TenantFloodArgs),
    /// Alarm rules: on a running GridLinks, probe devices (a profile whose rule raises an
    /// alarm at temperature > 50) publish a crossing value at QoS 1, one probe at a time;
    /// PUBACK -> the alarm in a REST answer (polled back to back), and its createdTime.
    AlarmLatency(AlarmLatencyArgs),
    /// Alarm queries: on a running GridLinks, N alarms created through POST /api/alarm,
    /// then the v2 list, the counts by status and a device's alarms timed; server RSS.
    AlarmList(AlarmListArgs),
    /// (Internal) one worker process of a `--workers` run: reads its job from stdin.
    #[command(hide = true)]
    Worker,
    /// Only the loss check: compare an acks file (`mqtt-telemetry --save-acks`) with
    /// what the server stored. Exit code 2 when acknowledged points are missing.
    Verify(VerifyArgs),
    /// Durability proof: start GridLinks, kill -9 it under MQTT or HTTP load and start it
    /// again on the same data, N times; then every acknowledged point must be stored.
    /// Exit code 2 when any is missing.
    CrashLoop(CrashLoopArgs),
}

/// What the scenarios that start their own GridLinks (`lamp-tcp`, `coap-telemetry`) share.
#[derive(Debug, Args, Clone)]
pub struct OwnServerArgs {
    /// Local source addresses to spread the devices' connections or sockets over, comma
    /// separated.
    #[arg(long, value_delimiter = ',')]
    pub sources: Vec<IpAddr>,
    /// Check through the REST API that every acknowledged message is stored.
    #[arg(long)]
    pub verify: bool,
    /// The gridlinks binary (default: next to this one, else on PATH).
    #[arg(long)]
    pub gridlinks_bin: Option<PathBuf>,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Options of `ota-download`.
#[derive(Debug, Args, Clone)]
pub struct OtaDownloadArgs {
    /// Devices downloading at once, each on its own MQTT connection.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub devices: usize,
    /// Package size, bytes.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub package_bytes: usize,
    /// Chunk size, bytes.
    #[arg(long, default_value_t = 16 * 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub chunk_bytes: usize,
    #[command(flatten)]
    pub server: OwnServerArgs,
}

/// Options of `coap-telemetry`.
#[derive(Debug, Args, Clone)]
pub struct CoapTelemetryArgs {
    /// Devices, each with its own UDP socket and token (provisioned through the REST API).
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub devices: usize,
    /// How long devices post.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub duration: Duration,
    /// Offered load: requests per second over all devices (0: as fast as ACKs allow).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    #[command(flatten)]
    pub server: OwnServerArgs,
}

/// Options of `provision`.
#[derive(Debug, Args, Clone)]
pub struct ProvisionArgs {
    /// Device profiles, each with its own provision key and secret.
    #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub profiles: usize,
    /// Devices provisioned into each profile.
    #[arg(long, default_value_t = 300, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub devices_per_profile: usize,
    /// HTTP/1.1 keep-alive connections, one request in flight on each.
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub connections: usize,
    /// Each profile in a tenant of its own, made by the system administrator with an
    /// administrator who then makes the profile.
    #[arg(long)]
    pub tenants: bool,
    #[command(flatten)]
    pub server: OwnServerArgs,
}

/// Options of `tenant-flood`.
#[derive(Debug, Args, Clone)]
pub struct TenantFloodArgs {
    /// `transportTenantTelemetryMsgRateLimit` of the tenant profile both tenants have:
    /// at most this many telemetry messages per second per tenant (the profile says
    /// "LIMIT:1").
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: u64,
    /// Devices of the quiet tenant, each on its own MQTT 5 connection.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub quiet_devices: usize,
    /// The quiet tenant's offered load in both phases: publishes per second over all its
    /// devices; must be below --limit.
    #[arg(long, default_value_t = 300.0)]
    pub quiet_rate: f64,
    /// Devices of the noisy tenant, each on its own MQTT 5 connection.
    #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub noisy_devices: usize,
    /// The noisy tenant's offered load in phase B as a multiple of --limit (publishes
    /// per second over all its devices).
    #[arg(long, default_value_t = 10.0)]
    pub flood_factor: f64,
    /// How long each phase publishes.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub duration: Duration,
    /// Most unacknowledged QoS 1 publishes per connection.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub inflight: u16,
    /// Isolation holds when the quiet PUBACK p99 of phase B is at most this fraction
    /// above phase A's (0.2: within 20%).
    #[arg(long, default_value_t = 0.2)]
    pub tolerance: f64,
    /// Local source addresses to spread the connections over, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub sources: Vec<IpAddr>,
    /// The gridlinks binary (default: next to this one, else on PATH).
    #[arg(long)]
    pub gridlinks_bin: Option<PathBuf>,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// How `ws-telemetry` receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// ThingsBoard's WebSocket API.
    Ws,
    /// The canonical MQTT topics.
    Mqtt,
    /// No receivers: posting alone, the baseline the other runs' server CPU is read against.
    None,
}

/// Options of `ws-telemetry`.
#[derive(Debug, Args)]
pub struct WsTelemetryArgs {
    /// Devices, each posting `--rate` messages per second.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub devices: usize,
    /// Messages per second per device.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// How long devices post.
    #[arg(long, value_parser = parse_duration, default_value = "20s")]
    pub duration: Duration,
    /// HTTP/1.1 keep-alive connections the devices post over.
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub connections: usize,
    /// One session subscribed to every device, instead of one session per device.
    #[arg(long)]
    pub one_session: bool,
    /// Receive through the WebSocket API (`ws`) or the canonical MQTT topics (`mqtt`).
    #[arg(long, value_enum, default_value_t = Via::Ws)]
    pub via: Via,
    #[command(flatten)]
    pub server: OwnServerArgs,
}

/// Which decoder the lamp listener uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum LampDecoder {
    /// The native Rust decoder.
    Native,
    /// The shipped QuickJS script (protocols/lamp.js).
    Script,
}

/// Options of `lamp-tcp`.
#[derive(Debug, Args, Clone)]
pub struct LampTcpArgs {
    /// Controllers, each on its own connection (device ids 000000000001, …).
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub controllers: usize,
    /// How long controllers report.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub duration: Duration,
    /// Offered load: reports per second over all controllers (0: as fast as replies allow).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Unanswered reports a controller may have in flight (as fast as replies allow).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub window: u16,
    /// Decoders to measure, each on a fresh server, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "native,script")]
    pub decoders: Vec<LampDecoder>,
    /// The lamp script (default: protocols/lamp.js in the working directory or above).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// The published test instead: `jetlinks` = 10,000 controllers for 120 s, times --scale.
    #[arg(long, value_parser = ["jetlinks"])]
    pub preset: Option<String>,
    /// Multiplies the preset's controllers and duration.
    #[arg(long, default_value_t = 1.0, requires = "preset")]
    pub scale: f64,
    /// New connections per second while controllers connect.
    #[arg(long, default_value_t = 2000.0)]
    pub connect_rate: f64,
    #[command(flatten)]
    pub server: OwnServerArgs,
}

/// How `crash-loop` devices send their points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// MQTT QoS 1, a window of unacknowledged publishes per device; a PUBACK is the ack.
    Mqtt,
    /// HTTP/1.1 keep-alive `POST /api/v1/{token}/telemetry`; a 200 is the ack.
    Http,
}

/// Options of `crash-loop`.
#[derive(Debug, Args)]
pub struct CrashLoopArgs {
    /// How devices send: mqtt or http.
    #[arg(long, value_enum, default_value_t = Transport::Mqtt)]
    pub transport: Transport,
    /// Kill-and-restart cycles.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..))]
    pub cycles: u32,
    /// Devices, each with its own connection and token (provisioned once).
    #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub devices: usize,
    /// When the server is killed, counted from the start of each cycle's load: a
    /// random delay in MIN..MAX (e.g. 2s..6s, drawn from --seed), or a fixed one (4s).
    #[arg(long, value_parser = parse_duration_range, default_value = "2s..6s")]
    pub kill_after: DurationRange,
    /// MQTT: most unacknowledged QoS 1 publishes per device (default 10).
    #[arg(long, alias = "inflight", value_parser = clap::value_parser!(u16).range(1..))]
    pub window: Option<u16>,
    /// Seed of the kill delays (default: random; the report prints it, so a run's
    /// delays can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
    /// GridLinks' data directory, the same for every cycle; must be empty or absent and
    /// is kept afterwards. Default: a temporary directory, removed after a passed run.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// MQTT: local source addresses to spread connections over, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub sources: Vec<IpAddr>,
    /// MQTT protocol version spoken.
    #[arg(long, value_enum, default_value_t = MqttVersion::V311)]
    pub mqtt_version: MqttVersion,
    /// Payload size in bytes (telemetry JSON with "ts", padded).
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// New connections per second when the devices (re)connect in each cycle (0: unpaced).
    #[arg(long, default_value_t = 2000.0)]
    pub connect_rate: f64,
    /// The gridlinks binary (default: next to this one, else on PATH).
    #[arg(long)]
    pub gridlinks_bin: Option<PathBuf>,
    /// REST calls of the final loss check in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub verify_threads: u16,
    /// Also forward every point to an HTTP sink (a receiver the tool runs on loopback,
    /// see `mqtt-telemetry --forward-http`), stop that receiver abruptly once in every
    /// cycle (--receiver-down), and check after the last restart that every acknowledged
    /// point of every cycle reached it.
    #[arg(long)]
    pub forward_http: bool,
    /// With --forward-http: in each cycle, a quarter of the way to the server's kill, the
    /// receiver stops (listener closed, open connections dropped, requests in progress
    /// unanswered) and starts again on the same port this much later.
    #[arg(long, value_parser = parse_duration, default_value = "2s", requires = "forward_http")]
    pub receiver_down: Duration,
    /// With --forward-http: events per POST (the sink's batchSize).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub forward_batch_size: u16,
    /// With --forward-http: how long after the last restart every acknowledged point may
    /// take to reach the sink.
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub forward_drain: Duration,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A range of durations, `MIN..MAX` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationRange {
    /// Shortest.
    pub min: Duration,
    /// Longest.
    pub max: Duration,
}

impl DurationRange {
    /// The point `fraction` (0..1) of the way from `min` to `max`.
    pub fn at(&self, fraction: f64) -> Duration {
        self.min + (self.max - self.min).mul_f64(fraction.clamp(0.0, 1.0))
    }
}

/// The server's ThingsBoard REST API, for `--provision` and the loss check.
#[derive(Debug, Args, Clone, Serialize, Deserialize)]
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
            anyhow::bail!("{needed_for} needs --api URL and --api-password (or GRIDLINKS_BENCH_API_PASSWORD)");
        };
        Ok(crate::rest_api::ApiTarget { base: base.clone(), user: self.api_user.clone(), password: password.clone() })
    }
}

/// Options of `alarm-latency`.
#[derive(Debug, Args)]
pub struct AlarmLatencyArgs {
    /// The server's REST API (the probe profile and devices are made through it, the
    /// alarms read from it).
    #[command(flatten)]
    pub api: ApiArgs,
    /// Server host name or address (MQTT).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Server MQTT port.
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// Probes: each raises the alarm once (and clears it after).
    #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub probes: usize,
    /// Probe devices `alarm-probe-<i>` (each its own MQTT connection), taken in turn.
    #[arg(long, default_value_t = 50, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub devices: usize,
    /// Time from the start of one probe to the start of the next (a probe that takes
    /// longer delays the next).
    #[arg(long, value_parser = parse_duration, default_value = "50ms")]
    pub interval: Duration,
    /// A probe whose alarm is not in a REST answer after this long counts as not seen.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Options of `alarm-list`.
#[derive(Debug, Args)]
pub struct AlarmListArgs {
    /// The server's REST API.
    #[command(flatten)]
    pub api: ApiArgs,
    /// Alarms created (POST /api/alarm), on a server without alarms of these devices.
    #[arg(long, default_value_t = 100_000)]
    pub alarms: usize,
    /// Devices `alarm-dev-<i>` the alarms are spread over: alarm k on device k % N, of
    /// type `bench-alarm-<k / N>`; severities in turn, every fourth created cleared.
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub devices: usize,
    /// Create calls in flight (one thread and keep-alive connection each).
    #[arg(long, default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub threads: usize,
    /// Timed requests of each query (after 5 untimed ones), one at a time.
    #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub requests: usize,
    /// Only time the queries: the alarms were created by an earlier run (the server
    /// restarted since, say).
    #[arg(long)]
    pub skip_create: bool,
    /// PID of the server process: its RSS before and after, its CPU while creating.
    #[arg(long, value_delimiter = ',')]
    pub server_pid: Vec<u32>,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
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
#[derive(Debug, Args, Clone, Serialize, Deserialize)]
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
    /// File with one access token per line, or CSV lines NAME,TOKEN (optional header
    /// `name,token`; the names serve --verify); connection i uses device i's token as MQTT
    /// user name with an empty password (ThingsBoard device authentication).
    #[arg(long, conflicts_with = "username")]
    pub tokens_file: Option<PathBuf>,
    /// One MQTT user name for every connection (e.g. for an anonymous Mosquitto).
    #[arg(long)]
    pub username: Option<String>,
    /// Password sent with --username.
    #[arg(long, requires = "username")]
    pub password: Option<String>,
    /// Speak MQTT over TLS (TLS 1.3 or 1.2), trusting the CA certificates in this PEM
    /// file: the server's certificate must chain to one of them (`--port` is then the
    /// server's TLS port, e.g. 8883). No client certificate; no session resumption, so
    /// every connection makes a full handshake as a device of its own would.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// With --tls-ca: the name the server's certificate must hold (a DNS name or an IP
    /// address of its subjectAltName).
    #[arg(long, default_value = "localhost", requires = "tls_ca")]
    pub tls_server_name: String,
    /// Time allowed for TCP connect plus TLS handshake (--tls-ca) plus CONNECT/CONNACK,
    /// e.g. 10s or 500ms.
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
    /// PID of the server process: its CPU time and memory are read from /proc. Several,
    /// comma-separated, are summed, each with the processes it started (a cluster: the
    /// GridLinks nodes, Kafka brokers, the PostgreSQL server and its backends).
    #[arg(long, value_delimiter = ',')]
    pub server_pid: Vec<u32>,
    /// Generator processes sharing the connections (`mqtt-telemetry`, `connect`), each
    /// within its own open-files limit: for more connections than one process may open.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub workers: usize,
    /// Set in a worker process: its connections are `offset..offset+N` of the run
    /// (tokens, names, client ids), and it syncs its phases with the parent.
    #[arg(skip)]
    pub worker_offset: Option<usize>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Where results go besides the summary on stdout.
#[derive(Debug, Args, Clone, Default, Serialize, Deserialize)]
pub struct OutputArgs {
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write a self-contained HTML report (charts over time) to this file.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

/// MQTT protocol versions the generator speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
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

impl TargetArgs {
    /// The MQTT version as reports print it, with `over TLS` when --tls-ca is given,
    /// e.g. `3.1.1 over TLS`.
    pub fn version_label(&self) -> String {
        let version = self.mqtt_version.label();
        match self.tls_ca {
            Some(_) => format!("{version} over TLS"),
            None => version.to_string(),
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
#[derive(Debug, Args, Clone, Serialize, Deserialize)]
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
    #[arg(long, default_value_t = 0.0, conflicts_with = "interval")]
    pub rate: f64,
    /// Offered load per device instead: one publish every INTERVAL (e.g. 1s, 800ms),
    /// devices spread evenly over it.
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Payload size in bytes: the JSON is padded with spaces up to this size (never cut).
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Payload from a template instead (text, or @FILE): {ts}, {seq}, {rand:MIN:MAX},
    /// {randf:MIN:MAX}, {str:N} are filled per message, e.g.
    /// '{"ts":{ts},"values":{"t":{randf:20:30},"seq":{seq}}}'. Padded to --payload-bytes.
    #[arg(long, conflicts_with = "no_ts")]
    pub payload_template: Option<String>,
    /// Devices start publishing spread evenly over this long (e.g. 30s) instead of all at once.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub ramp_up: Duration,
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
    /// With --provision: save this device profile first (ThingsBoard's DeviceProfile JSON,
    /// e.g. with alarm rules in profileData.alarms; it replaces the tenant's profile of the
    /// same name) and create the devices in it.
    #[arg(long)]
    pub device_profile: Option<PathBuf>,
    /// After the run, check through the REST API that every acknowledged point is
    /// stored (key `seq`); exit code 2 when any is missing. QoS 1 only.
    #[arg(long, conflicts_with = "no_ts")]
    pub verify: bool,
    /// While publishing, sample how long after its PUBACK a point becomes queryable
    /// through the REST API (about ten samples a second).
    #[arg(long, conflicts_with = "no_ts")]
    pub storage_lag: bool,
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
    #[command(flatten)]
    pub forward: ForwardArgs,
}

/// Data forwarding while the load runs (`mqtt-telemetry`, also inside `compare`): a sink
/// of the server (`POST /api/forwarding/sink`) that sends the devices' telemetry to a
/// receiver the tool runs, created after the devices are imported and before the load,
/// deleted after the run.
#[derive(Debug, Args, Clone, Default, Serialize, Deserialize)]
pub struct ForwardArgs {
    /// Forward the telemetry to an HTTP sink: the tool runs an HTTP receiver on loopback
    /// that answers every POST with 200 and records each event. Reports events received,
    /// every acknowledged message at the sink (exit code 2 when any is still missing after
    /// --forward-drain), duplicates, and the lag receive time - the message's `ts`. The
    /// server must allow loopback sinks (GRIDLINKS_FORWARDING_ALLOW_PRIVATE_ADDRESSES=true;
    /// `compare` starts GridLinks so). Needs --api and the device names (as --verify).
    #[arg(long, conflicts_with_all = ["forward_kafka", "forward_blackhole"])]
    pub forward_http: bool,
    /// Forward the telemetry to a Kafka sink at these bootstrap servers (host:port,...):
    /// the tool creates the topic `gridlinks-bench-forward-<random>` (--forward-partitions,
    /// one replica) and reads it from the beginning; otherwise as --forward-http.
    #[arg(long, value_name = "BOOTSTRAP", conflicts_with = "forward_blackhole")]
    pub forward_kafka: Option<String>,
    /// Forward the telemetry to a dead HTTP sink: a loopback listener that accepts
    /// connections and never answers. Measures ingest while the server's outbox grows
    /// (gridlinks_forward_outbox_entries at the window's end is reported).
    #[arg(long)]
    pub forward_blackhole: bool,
    /// HTTP sinks: events per POST (the sink's configuration.batchSize).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub forward_batch_size: u16,
    /// Kafka sinks: partitions of the topic the tool creates.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub forward_partitions: i32,
    /// After the last acknowledgement, how long to wait for every acknowledged message to
    /// reach the sink before counting the rest missing.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub forward_drain: Duration,
}

/// The kinds of sink `--forward-*` creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardSink {
    /// `--forward-http`.
    Http,
    /// `--forward-kafka BOOTSTRAP`.
    Kafka(String),
    /// `--forward-blackhole`.
    Blackhole,
}

impl ForwardArgs {
    /// The sink asked for, if any.
    pub fn sink(&self) -> Option<ForwardSink> {
        if self.forward_http {
            Some(ForwardSink::Http)
        } else if let Some(b) = &self.forward_kafka {
            Some(ForwardSink::Kafka(b.clone()))
        } else if self.forward_blackhole {
            Some(ForwardSink::Blackhole)
        } else {
            None
        }
    }
}

/// Which servers a comparison starts, and from where.
#[derive(Debug, Args, Clone)]
pub struct ServersArgs {
    /// Peers compared with GridLinks, comma separated (mosquitto, rumqttd).
    #[arg(long, value_delimiter = ',', value_enum)]
    pub against: Vec<crate::servers::ServerKind>,
    /// The full list of servers instead (e.g. mosquitto,rumqttd). Default: gridlinks,mosquitto.
    #[arg(long, value_delimiter = ',', value_enum, conflicts_with = "against")]
    pub servers: Vec<crate::servers::ServerKind>,
    /// The gridlinks binary (default: next to this one, else on PATH).
    #[arg(long)]
    pub gridlinks_bin: Option<PathBuf>,
    /// The mosquitto binary (default: on PATH, else /usr/sbin/mosquitto).
    #[arg(long)]
    pub mosquitto_bin: Option<PathBuf>,
    /// The rumqttd binary (default: on PATH, else ~/.cargo/bin/rumqttd).
    #[arg(long)]
    pub rumqttd_bin: Option<PathBuf>,
    /// GridLinks' devices in a tenant of their own (made by the system administrator),
    /// not the first tenant: the cost of tenants on the data path.
    #[arg(long)]
    pub tenant: bool,
    /// MQTT over TLS: a throwaway CA and server certificate (CN=localhost, EC P-256) are
    /// made with the `openssl` command; every server serves them on a TLS listener of its
    /// own and the scenario connects there, trusting that CA (gridlinks and mosquitto).
    #[arg(long)]
    pub tls: bool,
}

impl ServersArgs {
    /// The servers in order: gridlinks first, then the peers.
    pub fn list(&self) -> Vec<crate::servers::ServerKind> {
        use crate::servers::ServerKind;
        let mut list = if !self.servers.is_empty() {
            self.servers.clone()
        } else if !self.against.is_empty() {
            std::iter::once(ServerKind::Gridlinks).chain(self.against.iter().copied()).collect()
        } else {
            vec![ServerKind::Gridlinks, ServerKind::Mosquitto]
        };
        let mut seen = Vec::new();
        list.retain(|k| {
            let new = !seen.contains(k);
            seen.push(*k);
            new
        });
        list
    }

    /// Where the binaries are.
    pub fn binaries(&self) -> crate::servers::Binaries {
        let mut bins = crate::servers::Binaries::with_gridlinks(self.gridlinks_bin.as_deref());
        if let Some(p) = &self.mosquitto_bin {
            bins.mosquitto = p.clone();
        }
        if let Some(p) = &self.rumqttd_bin {
            bins.rumqttd = p.clone();
        }
        bins
    }
}

/// Options of `compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub servers: ServersArgs,
    /// Side-by-side results as JSON / HTML.
    #[command(flatten)]
    pub output: OutputArgs,
    /// The scenario and its options (its --port, --server-pid and credentials are set
    /// per server).
    #[command(subcommand)]
    pub scenario: crate::compare::Scenario,
}

/// Options of `preset`.
#[derive(Debug, Args)]
pub struct PresetArgs {
    /// tb-2017, tb-2021 or tbmq-fanin; `list` prints every preset with its steps.
    pub name: String,
    #[command(flatten)]
    pub servers: ServersArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Multiply the connection counts by this (e.g. 0.1 for a quick run).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Replace the steps' --duration (and the connect hold).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Extra options appended to every step's command line, e.g. "--sources 127.0.0.1,127.0.0.2".
    #[arg(long, allow_hyphen_values = true, num_args = 1)]
    pub step_args: Option<String>,
}

/// Options of `http-telemetry`.
#[derive(Debug, Args)]
pub struct HttpTelemetryArgs {
    /// The server: --api is also where devices post (POST {api}/api/v1/{token}/telemetry).
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Device connections (one request in flight on each).
    #[arg(long, default_value_t = 100)]
    pub devices: usize,
    /// Requests each device sends, then stops (instead of --duration).
    #[arg(long, conflicts_with = "duration")]
    pub messages_per_device: Option<u64>,
    /// How long devices post, e.g. 20s (default 10s unless --messages-per-device).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Offered load: total requests per second (0: as fast as responses allow).
    #[arg(long, default_value_t = 0.0, conflicts_with = "interval")]
    pub rate: f64,
    /// Offered load per device instead: one request every INTERVAL.
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Payload size in bytes (telemetry JSON with "ts", padded).
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Payload from a template instead (text, or @FILE); see `mqtt-telemetry --help`.
    #[arg(long)]
    pub payload_template: Option<String>,
    /// New connections per second while connecting (0: unpaced).
    #[arg(long, default_value_t = 2000.0)]
    pub connect_rate: f64,
    /// A request without response after this long fails and ends its device.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// Create the devices first through the REST API's bulk import (names `bench-<i>`).
    #[arg(long, conflicts_with = "tokens_file")]
    pub provision: bool,
    /// With --provision: save this device profile first (ThingsBoard's DeviceProfile JSON,
    /// e.g. with alarm rules) and create the devices in it; see `mqtt-telemetry --help`.
    #[arg(long)]
    pub device_profile: Option<PathBuf>,
    /// File with one access token per line, or CSV lines NAME,TOKEN (device i uses line i).
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Device names, one a line, matching --tokens-file (for --verify, --save-acks, --storage-lag).
    #[arg(long, requires = "tokens_file")]
    pub device_names_file: Option<PathBuf>,
    /// After the run, check that every point answered with 200 is stored; exit code 2 if not.
    #[arg(long)]
    pub verify: bool,
    /// Write the acknowledged timestamps per device name to this JSON file.
    #[arg(long)]
    pub save_acks: Option<PathBuf>,
    /// While posting, sample how long after its 200 a point becomes queryable.
    #[arg(long)]
    pub storage_lag: bool,
    /// PID of the server process: its CPU time and memory are read from /proc. Several,
    /// comma-separated, are summed, each with the processes it started (a cluster: the
    /// GridLinks nodes, Kafka brokers, the PostgreSQL server and its backends).
    #[arg(long, value_delimiter = ',')]
    pub server_pid: Vec<u32>,
}

/// Options of `pubsub`.
#[derive(Debug, Args, Clone, Serialize, Deserialize)]
pub struct PubsubArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Groups; group G publishes to PREFIX/G/CLIENT-ID, its subscribers read PREFIX/G/+.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub groups: usize,
    /// Publisher connections per group.
    #[arg(long, default_value_t = 10)]
    pub publishers: usize,
    /// Subscriber connections per group.
    #[arg(long, default_value_t = 1)]
    pub subscribers: usize,
    /// The subscribers of a group share one subscription ($share/gG/PREFIX/G/+) and
    /// split its messages (TBMQ's APPLICATION clients), instead of each getting all.
    #[arg(long)]
    pub shared: bool,
    /// Subscribers keep persistent sessions (clean start off; MQTT 5: session expiry 1 h):
    /// a broker that stores such sessions durably pays for that on every QoS 1 copy.
    #[arg(long)]
    pub persistent_subscribers: bool,
    /// Topic prefix.
    #[arg(long, default_value = "bench/pubsub")]
    pub topic_prefix: String,
    /// QoS of the publishes (0 or 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub pub_qos: u8,
    /// QoS of the subscriptions (0 or 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub sub_qos: u8,
    /// Most unacknowledged QoS 1 publishes per publisher (at QoS 0: publishes per write).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub inflight: u16,
    /// Offered load: total publishes per second over all publishers (0: as fast as
    /// acknowledgements allow).
    #[arg(long, default_value_t = 0.0, conflicts_with = "interval")]
    pub rate: f64,
    /// Offered load per publisher instead: one publish every INTERVAL.
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Payload size in bytes (tracker JSON with a send stamp, padded; 114 as in TBMQ's tests).
    #[arg(long, default_value_t = 114)]
    pub payload_bytes: usize,
    /// How long publishers publish, e.g. 20s (default 10s unless --messages-per-publisher).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Messages each publisher publishes, then stops (instead of --duration).
    #[arg(long, conflicts_with = "duration")]
    pub messages_per_publisher: Option<u64>,
    /// New connections per second while connecting (0: as fast as --max-pending allows).
    #[arg(long, default_value_t = 2000.0)]
    pub connect_rate: f64,
    /// A publisher that waits this long for any PUBACK gives up.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub ack_timeout: Duration,
    /// After the last publish ack, stop waiting for deliveries when none arrived for this long.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub drain_timeout: Duration,
}

/// Options of `connect`.
#[derive(Debug, Args, Clone, Serialize, Deserialize)]
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
    /// Create `bench-<i>` devices first through the REST API's bulk import and connect
    /// with their tokens (GridLinks and other ThingsBoard-style servers).
    #[arg(long, conflicts_with_all = ["tokens_file", "username"])]
    pub provision: bool,
    #[command(flatten)]
    pub api: ApiArgs,
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
    let value: f64 = number.trim().parse().map_err(|_| format!("not a duration: {s:?} (use e.g. 10s, 500ms, 2m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("not a duration: {s:?}"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// Parses "2s..6s" (see [`parse_duration`] for each end) or one duration ("4s", a
/// range of one value).
pub fn parse_duration_range(s: &str) -> Result<DurationRange, String> {
    let (min, max) = match s.split_once("..") {
        Some((min, max)) => (parse_duration(min)?, parse_duration(max)?),
        None => {
            let d = parse_duration(s)?;
            (d, d)
        }
    };
    if min > max {
        return Err(format!("{s:?}: the first duration is longer than the second"));
    }
    if min.is_zero() {
        return Err(format!("{s:?}: the load needs some time before the kill"));
    }
    Ok(DurationRange { min, max })
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
    fn duration_ranges_parse_and_interpolate() {
        let r = parse_duration_range("2s..6s").unwrap();
        assert_eq!((r.min, r.max), (Duration::from_secs(2), Duration::from_secs(6)));
        assert_eq!(r.at(0.5), Duration::from_secs(4));
        assert_eq!(r.at(2.0), Duration::from_secs(6));
        let fixed = parse_duration_range("1500ms").unwrap();
        assert_eq!((fixed.min, fixed.max), (Duration::from_millis(1500), Duration::from_millis(1500)));
        assert!(parse_duration_range("6s..2s").is_err());
        assert!(parse_duration_range("0s..2s").is_err());
        assert!(parse_duration_range("2s..").is_err());
        let cli = Cli::try_parse_from(["gridlinks-bench", "crash-loop", "--transport", "http"]).unwrap();
        let Command::CrashLoop(c) = cli.command else { panic!("wrong subcommand") };
        assert_eq!((c.transport, c.cycles, c.window), (Transport::Http, 12, None));
        assert_eq!(c.kill_after, parse_duration_range("2s..6s").unwrap());
        assert!(Cli::try_parse_from(["gridlinks-bench", "crash-loop", "--cycles", "0"]).is_err());
    }

    #[test]
    fn tokens_file_and_username_exclude_each_other() {
        let r = Cli::try_parse_from(["gridlinks-bench", "connect", "--tokens-file", "t", "--username", "u"]);
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
        let Command::MqttTelemetry(t) = cli.command else { panic!("wrong subcommand") };
        assert_eq!(t.target.sources.len(), 2);
        assert_eq!(t.duration, Some(Duration::from_secs(3)));
        assert_eq!((t.target.tls_ca, t.target.tls_server_name.as_str()), (None, "localhost"));
    }

    #[test]
    fn tls_server_name_needs_a_ca_and_compare_takes_tls() {
        let parse = |args: &[&str]| Cli::try_parse_from(["gridlinks-bench"].iter().chain(args));
        assert!(parse(&["mqtt-telemetry", "--tls-server-name", "h"]).is_err(), "a name without CA");
        let cli = parse(&["connect", "--tls-ca", "ca.pem", "--tls-server-name", "127.0.0.1"]).unwrap();
        let Command::Connect(c) = cli.command else { panic!("wrong subcommand") };
        assert_eq!(c.target.tls_ca, Some(PathBuf::from("ca.pem")));
        assert_eq!(c.target.version_label(), "3.1.1 over TLS");
        let cli = parse(&["compare", "--tls", "--against", "mosquitto", "mqtt-telemetry"]).unwrap();
        let Command::Compare(c) = cli.command else { panic!("wrong subcommand") };
        assert!(c.servers.tls);
        let cli = parse(&["compare", "mqtt-telemetry"]).unwrap();
        let Command::Compare(c) = cli.command else { panic!("wrong subcommand") };
        assert!(!c.servers.tls);
    }

    #[test]
    fn provision_replaces_tokens_and_names_need_tokens() {
        let parse = |args: &[&str]| Cli::try_parse_from(["gridlinks-bench", "mqtt-telemetry"].iter().chain(args));
        assert!(parse(&["--provision", "--tokens-file", "t"]).is_err());
        assert!(parse(&["--provision", "--username", "u"]).is_err());
        assert!(parse(&["--device-names-file", "n"]).is_err());
        assert!(parse(&["--verify", "--no-ts"]).is_err());
        let cli = parse(&["--provision", "--verify", "--api", "http://h:1", "--api-password", "pw"]).unwrap();
        let Command::MqttTelemetry(t) = cli.command else { panic!("wrong subcommand") };
        assert!(t.provision && t.verify);
        assert_eq!(t.api.api_user, "admin");
        let api = t.api.target("--verify").unwrap();
        assert!(format!("{api:?}").contains("<REDACTED>"));
        let cli = Cli::try_parse_from(["gridlinks-bench", "verify", "--acks", "a.json"]).unwrap();
        let Command::Verify(v) = cli.command else { panic!("wrong subcommand") };
        assert!(v.api.target("verify").is_err(), "no --api given");
    }
}
