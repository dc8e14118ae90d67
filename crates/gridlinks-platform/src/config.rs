//! The one typed configuration tree: embedded defaults, then a TOML file, then
//! `GRIDLINKS_*` environment variables, then command-line flags (later wins).
//!
//! Every field has an environment variable named after its path: `http.bind` is
//! `GRIDLINKS_HTTP_BIND`, top-level `data_dir` is `GRIDLINKS_DATA_DIR`.

use std::path::{Path, PathBuf};

use gridlinks_broker::acl::{Action, Permission};
use serde::{Deserialize, Serialize};

/// Milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    /// As a std duration.
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
}

/// Seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Seconds(pub u64);

impl Seconds {
    /// As a std duration.
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_secs(self.0)
    }
}

/// File descriptors kept for listeners, journals, logging and administration (besides
/// `storage.max_open_files` and `http.max_connections`) when the MQTT connection limit is
/// derived from the open-files limit.
pub const FD_RESERVE: usize = 256;

/// The whole configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory holding all stored data.
    pub data_dir: PathBuf,
    /// Seconds of silence after which TCP keepalive probes a peer, on every listener
    /// (then every 10 s, 3 times); 0 turns TCP keepalive off.
    pub tcp_keepalive_idle: Seconds,
    /// HTTP listener (REST API and HTTP device API).
    pub http: HttpConfig,
    /// MQTT listener.
    pub mqtt: MqttConfig,
    /// Devices' own binary protocols over TCP.
    pub tcp: TcpConfig,
    /// ThingsBoard's CoAP device API.
    pub coap: CoapConfig,
    /// Server-side RPC.
    pub rpc: RpcConfig,
    /// OTA packages (firmware and software updates).
    pub ota: OtaConfig,
    /// Device activity (`active`, `lastActivityTime`, …).
    pub activity: ActivityConfig,
    /// Device-profile alarm rules.
    pub alarms: AlarmsConfig,
    /// ThingsBoard's WebSocket API (`/api/ws`).
    pub ws: WsConfig,
    /// The notification center: delivery of alarm and device-activity notifications.
    pub notifications: NotificationsConfig,
    /// Data forwarding: tenants' sinks for committed data and alarm changes.
    pub forwarding: ForwardingConfig,
    /// The administrator account.
    pub admin: AdminConfig,
    /// JWT sessions of the REST API.
    pub auth: AuthConfig,
    /// The embedded store and its group commit.
    pub storage: StorageConfig,
    /// Bounds on what devices may send.
    pub limits: LimitsConfig,
    /// Scale-out: where data is committed and stored when several nodes share it.
    pub cluster: ClusterConfig,
    /// The TLS listeners' certificate.
    pub tls: TlsConfig,
    /// `/metrics`: where and for whom.
    pub metrics: MetricsConfig,
    /// Log output.
    pub log: LogConfig,
}

/// Who may read `/metrics`, and where.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// A listen address of its own for `/metrics` (then the main HTTP listener has none);
    /// empty: served by the main HTTP listener.
    pub bind: String,
    /// When set, a scrape must send `Authorization: Bearer {token}` (401 otherwise).
    pub token: String,
}

/// Log output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (human-readable lines) or `json` (one JSON object per line).
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text }
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (timestamp, level, target, message, fields).
    Json,
}

/// The certificate and key of every TLS listener (`http.tls_bind`, `mqtt.tls_bind`,
/// `mqtt.wss_bind`, custom TCP listeners with `tls = true`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the server certificate, then its chain; re-read on SIGHUP.
    pub cert_file: PathBuf,
    /// PEM file with the certificate's private key; re-read on SIGHUP.
    pub key_file: PathBuf,
    /// Longest TLS handshake; the connection is closed after it.
    pub handshake_timeout: Millis,
    /// PEM file of CA certificates that issue MQTT application clients' certificates: a
    /// client whose certificate chains to one logs in as the credential named by its CN
    /// (no password). Empty: none.
    pub client_ca_file: PathBuf,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            handshake_timeout: Millis(10_000),
            client_ca_file: PathBuf::new(),
        }
    }
}

impl Config {
    /// Whether any listener speaks TLS.
    pub fn tls_used(&self) -> bool {
        !self.http.tls_bind.is_empty()
            || !self.mqtt.tls_bind.is_empty()
            || !self.mqtt.wss_bind.is_empty()
            || !self.coap.dtls_bind.is_empty()
            || self.tcp.listeners.iter().any(|l| l.tls)
    }
}

/// HTTP listener settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Listen address.
    pub bind: String,
    /// Listen address of HTTPS (the same API, console and WebSocket API over TLS, with
    /// `tls.cert_file`); empty: off.
    pub tls_bind: String,
    /// Largest request body (telemetry, attributes, REST calls), bytes.
    pub max_body_bytes: usize,
    /// Largest bulk-import request body, bytes.
    pub max_import_bytes: usize,
    /// Largest `pageSize` accepted by paged listings.
    pub max_page_size: usize,
    /// Longest wait for a complete request header, and for the next request on an idle
    /// keep-alive connection; the connection is closed after it.
    pub header_read_timeout: Millis,
    /// Longest time to receive a request body (408 after it).
    pub body_read_timeout: Millis,
    /// Most simultaneous HTTP connections (at the bound a new one replaces the longest-idle
    /// one; 503 when all are busy); 0: a sixteenth of the open-files limit (at least 64).
    pub max_connections: usize,
    /// Most simultaneous HTTP connections from one address (same rule); 0: no bound.
    pub max_connections_per_address: usize,
    /// Addresses `max_connections_per_address` does not apply to (a reverse proxy on this
    /// host speaks for many clients).
    pub unbounded_addresses: Vec<std::net::IpAddr>,
    /// A device's long poll (`GET /api/v1/{token}/rpc`, `…/attributes/updates`) without a
    /// `timeout` waits this long (ThingsBoard's `transport.http.request_timeout`).
    pub long_poll_timeout: Millis,
    /// Longest long poll; a larger `timeout` is cut to it (ThingsBoard's
    /// `max_request_timeout`).
    pub max_long_poll_timeout: Millis,
    /// Most long polls waiting at once on this node (503 past it).
    pub max_long_polls: usize,
    /// Most long polls of one device waiting at once (429 past it).
    pub max_long_polls_per_device: usize,
    /// How long a device's poll session stays registered after its last poll ended, so an
    /// RPC call or attribute change between two polls waits for the next one.
    pub long_poll_linger: Millis,
    /// The HTTPS listener asks clients for a certificate (not required), and the device
    /// API's paths without a token (`/api/v1/telemetry`, …) name the device by it
    /// (X509_CERTIFICATE credentials). Off by default: browsers asked for a certificate may
    /// prompt their user (or, headless, wait) before they show the console.
    pub tls_client_certs: bool,
}

/// MQTT listener settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// Listen address.
    pub bind: String,
    /// Listen address of MQTT over WebSocket (path `/mqtt`); empty: off.
    pub ws_bind: String,
    /// Listen address of MQTT over TLS (8883 by convention); empty: off. Clients may
    /// present a certificate: a device's X509_CERTIFICATE credentials.
    pub tls_bind: String,
    /// Listen address of MQTT over secure WebSocket (`wss://…/mqtt`); empty: off.
    pub wss_bind: String,
    /// Whether the `wss://` listener asks clients for a certificate (devices may then log
    /// in by theirs). Off by default: browsers, the usual `wss://` clients, ask their user
    /// to pick one when a server asks (and a headless one never answers).
    pub wss_client_certs: bool,
    /// Largest MQTT packet accepted, bytes (checked before the body is read).
    pub max_packet_size: usize,
    /// QoS 1/2 publishes a client may have unacknowledged (MQTT 5 Receive Maximum).
    pub receive_maximum: u16,
    /// New MQTT connections (TCP, TLS) per second from one source address; 0: no bound.
    pub max_connects_per_address: u32,
    /// How many of them may come at once (the bucket's size).
    pub connect_burst_per_address: u32,
    /// Loopback addresses (a proxy or tools on the host) are not bounded.
    pub connect_rate_exempt_loopback: bool,
    /// Keep MQTT 5 clients that exceed the Receive Maximum connected and stop reading
    /// (backpressure, as for 3.1.1) instead of disconnecting them with 0x93.
    pub receive_maximum_lenient: bool,
    /// After a publish refused by a rate limit of the tenant profile (PUBACK/PUBREC 0x97),
    /// read nothing more from that connection for about this long (0.5–1.5×, spread so that
    /// connections refused together do not come back together): the excess waits in the
    /// client's socket and in-flight window instead of costing a read, a check and a
    /// refusal each. 0: refuse every excess message as it comes (ThingsBoard's way).
    pub rate_limit_pause: Millis,
    /// Most simultaneous MQTT connections (TCP and WebSocket together); 0: the process's
    /// open-files limit less a reserve for storage, HTTP and administration.
    pub max_connections: usize,
    /// Most simultaneous connections with one device token, application user name or custom
    /// TCP protocol identity.
    pub max_connections_per_credential: usize,
    /// Most subscriptions one session (device or client) may hold; 0: unbounded.
    pub max_subscriptions_per_client: usize,
    /// Time a new connection has to send CONNECT.
    pub connect_timeout: Millis,
    /// Messages queued for one connection (attribute updates, RPC) before it is closed as too slow.
    pub outbound_queue: usize,
    /// Most PUBLISH packets per second one connection may send (0: no limit).
    pub rate_limit_messages: u32,
    /// Accept clients without credentials as pub/sub clients (not devices), outside the
    /// device-API topics.
    pub allow_anonymous: bool,
    /// Messages queued for one pub/sub client before backpressure: past it, QoS 0 copies
    /// are dropped and publishers of QoS 1/2 copies wait; also the queue bound of an
    /// offline persistent session.
    pub client_outbound_queue: usize,
    /// Messages queued for one pub/sub client (publishers waiting on it) at which it is
    /// disconnected as too slow; at least `client_outbound_queue`.
    pub client_queue_hard_limit: usize,
    /// Longest session expiry interval granted, seconds (MQTT 3.1.1 clean-session-0 clients
    /// get this; 4294967295 = never expire).
    pub max_session_expiry: u32,
    /// Longest keep alive an MQTT 5 client may use, seconds: one asking more, or none (0),
    /// is told this one in CONNACK (Server Keep Alive) and held to it; 0: what the client
    /// asks. MQTT 3.1.1 clients cannot be told and keep theirs (as in Mosquitto).
    pub max_keep_alive: u16,
    /// At the queue bound of an offline persistent session: `drop_new` or `drop_oldest`.
    pub offline_queue_full: String,
    /// Topic filters anonymous clients may publish to (never the device API's `v1/...`).
    pub anonymous_publish: Vec<String>,
    /// Topic filters anonymous clients may subscribe within.
    pub anonymous_subscribe: Vec<String>,
    /// Ordered allow/deny rules for pub/sub clients, read before each client's own ACL
    /// (the first that matches decides).
    pub acl_rules: Vec<AclRuleConfig>,
    /// What a publish outside a client's ACL gets.
    pub deny_action: DenyAction,
    /// Send MQTT 5 clients that allow them (Topic Alias Maximum in CONNECT) our topic
    /// aliases: each topic once, then a 2-byte alias.
    pub topic_aliases_out: bool,
    /// MQTT 5 Response Information given to a pub/sub client that asks for it: a topic
    /// prefix (`%c` = its client id) it may then publish and subscribe under; empty: none.
    pub response_information: String,
}

/// One access rule of `[[mqtt.acl_rules]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRuleConfig {
    /// `allow` or `deny`.
    pub permission: Permission,
    /// `publish`, `subscribe` or `all`.
    #[serde(default = "default_acl_action")]
    pub action: Action,
    /// Topic filters; `%c` is the client id, `%u` the user name.
    pub topics: Vec<String>,
    /// Only for this user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Only for client ids matching this pattern (`*` matches any run of characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Only for anonymous clients.
    #[serde(default)]
    pub anonymous: bool,
}

fn default_acl_action() -> Action {
    Action::All
}

/// What a publish outside a client's ACL gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenyAction {
    /// MQTT 5: PUBACK/PUBREC 0x87 with a reason string, the connection stays; MQTT 3.1.1,
    /// which cannot be told, is disconnected. No client takes a refusal for delivery.
    Reason,
    /// As Mosquitto and EMQX: MQTT 5 as `reason`; MQTT 3.1.1 gets a plain PUBACK and the
    /// message is dropped.
    Ignore,
    /// Every version is disconnected (MQTT 5 with DISCONNECT 0x87).
    Disconnect,
}

/// CoAP listener settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoapConfig {
    /// UDP listen address; empty: off.
    pub bind: String,
    /// Largest request payload, bytes (4.13 above it), whether in one message or in blocks.
    pub max_payload_bytes: usize,
    /// Most live observations (RFC 7641) at once; past it a registration gets 5.03.
    pub max_observations: usize,
    /// How long a request's message id is remembered, to answer its retransmissions
    /// without processing them again (RFC 7252's EXCHANGE_LIFETIME, 247 s). Forgotten on a
    /// timer. Clients retransmit within 45 s (MAX_TRANSMIT_SPAN), so a shorter one is safe
    /// with RFC-default clients.
    pub exchange_lifetime: Seconds,
    /// Most exchanges remembered per client endpoint (address and port); a new one forgets
    /// the endpoint's oldest answered exchange, and when all are still in progress the
    /// request gets 5.03.
    pub max_exchanges_per_peer: usize,
    /// Most exchanges remembered in total; past it the oldest are forgotten.
    pub max_exchanges: usize,
    /// Largest answer to an endpoint not yet verified, as a multiple of its request's size
    /// (RFC 7252 §11.3): a larger answer becomes 4.01 with an Echo option (RFC 9175) that
    /// the client repeats to verify its address; errors lose their diagnostic text. 0: off.
    pub amplification_factor: usize,
    /// How long an endpoint stays verified after it repeated an Echo value.
    pub verified_lifetime: Seconds,
    /// Most verified endpoints remembered; past it the oldest are forgotten (asked again).
    pub max_verified_peers: usize,
    /// UDP listen address of CoAP over DTLS (`coaps://`, with `tls.cert_file`); empty: off.
    pub dtls_bind: String,
    /// Most DTLS sessions at once (handshakes included); past it a new one gets no answer.
    pub max_dtls_sessions: usize,
    /// A DTLS session without a datagram for this long is dropped (the device's next
    /// message starts a new handshake).
    pub dtls_idle_timeout: Seconds,
}

impl Default for CoapConfig {
    fn default() -> Self {
        Self {
            bind: "0.0.0.0:5683".into(),
            max_payload_bytes: 16 * 1024,
            max_observations: 100_000,
            exchange_lifetime: Seconds(247),
            max_exchanges_per_peer: 256,
            max_exchanges: 100_000,
            amplification_factor: 3,
            verified_lifetime: Seconds(3600),
            max_verified_peers: 100_000,
            dtls_bind: String::new(),
            max_dtls_sessions: 10_000,
            dtls_idle_timeout: Seconds(600),
        }
    }
}

/// Custom TCP protocols: listeners, the protocols defined in configuration, and the bounds
/// every such connection keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpConfig {
    /// One listener per port, each speaking one protocol (`[[tcp.listeners]]`).
    pub listeners: Vec<TcpListenerConfig>,
    /// Protocols defined here (`[tcp.protocols.NAME]`): framing and a decoder script.
    /// `lamp` (the single-lamp controller) is built in.
    pub protocols: std::collections::BTreeMap<String, ProtocolConfig>,
    /// Time a new connection has to send a frame naming its device.
    pub login_timeout: Millis,
    /// Seconds without a frame after which a connection is closed; 0: never.
    pub idle_timeout: Seconds,
    /// CPU time a decoder script may use on one frame (its thread's, not the wall clock's).
    pub script_timeout: Millis,
    /// Most memory a decoder script may hold (per script and script thread), MiB.
    pub script_memory_mb: usize,
    /// Threads decoder scripts run on (never the threads serving connections); 0: one per
    /// CPU.
    pub script_threads: usize,
}

/// One custom-protocol TCP listener.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpListenerConfig {
    /// Listen address.
    pub bind: String,
    /// The protocol spoken: `lamp` or a name from `[tcp.protocols]`. It also names the
    /// identities devices are registered with.
    pub protocol: String,
    /// Create a device on first login of an unknown identity (named `{protocol}-{identity}`);
    /// otherwise only devices registered with this protocol identity may connect.
    #[serde(default)]
    pub auto_provision: bool,
    /// Decode with this script instead of the protocol's own decoder (for `lamp`: the
    /// native one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<PathBuf>,
    /// Type of the devices created by `auto_provision`; the protocol's name when empty.
    #[serde(default)]
    pub device_type: String,
    /// Most devices with an identity of this protocol: past it `auto_provision` creates
    /// none (the login is refused), so strangers cannot fill the device table.
    #[serde(default = "default_max_devices")]
    pub max_devices: usize,
    /// Only a login frame (one the decoder marks `login`) binds a connection to its device;
    /// frames before it are rejected. Default: on for `lamp`, off for scripted protocols
    /// (whose scripts may mark logins or let any frame that names a device bind it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_login: Option<bool>,
    /// Speak TLS (with `tls.cert_file`) instead of plain TCP.
    #[serde(default)]
    pub tls: bool,
}

impl TcpListenerConfig {
    /// Whether only a login frame binds a connection (`require_login`, by protocol default).
    pub fn require_login(&self) -> bool {
        self.require_login.unwrap_or(self.protocol == "lamp")
    }
}

fn default_max_devices() -> usize {
    100_000
}

/// A protocol defined in configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtocolConfig {
    /// Where frames begin and end (`{ kind = "fixed" | "delimiter" | "length_field", … }`).
    pub framing: gridlinks_framing::FramingSpec,
    /// The decoder script (JavaScript defining `decode(frame, session)`).
    pub script: PathBuf,
}

/// Server-side RPC (ThingsBoard's `/api/plugins/rpc` and `/api/rpc`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RpcConfig {
    /// Timeout when the request has no `timeout`.
    pub default_timeout: Millis,
    /// Smallest timeout honoured.
    pub min_timeout: Millis,
    /// With several nodes: how long a call for a device that is not connected to this
    /// node waits for another node to say it delivered the request, before it is answered
    /// 409 (device not connected).
    pub remote_wait: Millis,
}

/// Device activity, as ThingsBoard's device state service keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActivityConfig {
    /// Keep it at all.
    pub enabled: bool,
    /// A device silent this long is inactive, unless its `inactivityTimeout` attribute says
    /// otherwise (ThingsBoard's `defaultInactivityTimeoutInSec`, 600 s).
    pub inactivity_timeout: Millis,
    /// How often activity is checked and what changed is written.
    pub check_interval: Millis,
    /// Most often one device's `lastActivityTime` is written.
    pub persist_interval: Millis,
}

impl Default for ActivityConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            inactivity_timeout: Millis(600_000),
            check_interval: Millis(1_000),
            persist_interval: Millis(60_000),
        }
    }
}

/// Device-profile alarm rules (docs/alarms.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlarmsConfig {
    /// How often the rule states (`DURATION` and `REPEATING` progress) that changed are
    /// written: a crash loses at most this much progress (a clean stop none).
    pub rule_state_interval: Millis,
}

impl Default for AlarmsConfig {
    fn default() -> Self {
        Self { rule_state_interval: Millis(10_000) }
    }
}

/// Data forwarding (docs/forwarding.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForwardingConfig {
    /// Most entries the outbox holds; past it the oldest are dropped (and counted) so that
    /// a dead sink cannot fill the disk.
    pub outbox_max_entries: u64,
    /// Most outbox entries one delivery takes.
    pub batch_max_entries: usize,
    /// How long a sink waits for more entries before it delivers a batch that is not full
    /// (fewer, larger deliveries under load, for at most this much more lag); 0: at once.
    pub linger: Millis,
    /// The wait before the first retry of a failed delivery; each next one waits twice as
    /// long (at most 60 s).
    pub retry_delay: Millis,
    /// How long one delivery (a POST, a batch of publishes or of Kafka records) may take.
    pub timeout: Millis,
    /// Sinks one tenant may have.
    pub max_sinks_per_tenant: usize,
    /// Whether sinks may reach loopback, private and link-local addresses (off: a tenant
    /// cannot make the server probe its own network).
    pub allow_private_addresses: bool,
}

impl Default for ForwardingConfig {
    fn default() -> Self {
        Self {
            outbox_max_entries: 10_000_000,
            batch_max_entries: 1000,
            linger: Millis(10),
            retry_delay: Millis(1_000),
            timeout: Millis(10_000),
            max_sinks_per_tenant: 10,
            allow_private_addresses: false,
        }
    }
}

/// The notification center's deliveries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotificationsConfig {
    /// Tries of one delivery before it is logged as failed.
    pub max_attempts: u32,
    /// The wait before the first retry; each next one waits twice as long (at most 5 min).
    pub retry_delay: Millis,
    /// How long one webhook or SMTP exchange may take.
    pub timeout: Millis,
    /// Notifications one rule may send per minute; more are logged as rate-limited.
    pub per_rule_per_minute: u32,
    /// Whether webhooks and SMTP may reach loopback, private and link-local addresses
    /// (off: a tenant cannot make the server probe its own network).
    pub allow_private_addresses: bool,
    /// The SMTP server e-mail goes through (no host: e-mail is not sent, and says so in the
    /// delivery log).
    pub smtp: SmtpConfig,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            retry_delay: Millis(2_000),
            timeout: Millis(10_000),
            per_rule_per_minute: 60,
            allow_private_addresses: false,
            smtp: SmtpConfig::default(),
        }
    }
}

/// An SMTP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpConfig {
    /// Host name or address; empty: no e-mail.
    pub host: String,
    /// Port (587 for STARTTLS, 465 for TLS, 25 for none).
    pub port: u16,
    /// `starttls`, `tls` or `none` (plain text: only for a relay on a trusted network).
    pub security: String,
    /// The sender address.
    pub from: String,
    /// The login, if the server wants one.
    pub username: String,
    /// A file holding the password (readable by its owner only), if the server wants one.
    pub password_file: PathBuf,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        Self {
            host: String::new(),
            port: 587,
            security: "starttls".into(),
            from: String::new(),
            username: String::new(),
            password_file: PathBuf::new(),
        }
    }
}

/// OTA packages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtaConfig {
    /// Largest package, bytes (the upload request may be this plus its multipart framing).
    pub max_package_bytes: usize,
}

impl Default for OtaConfig {
    fn default() -> Self {
        Self { max_package_bytes: 64 * 1024 * 1024 }
    }
}

/// ThingsBoard's WebSocket API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WsConfig {
    /// Most subscriptions one session holds; more are refused with an error update.
    pub max_subscriptions: usize,
    /// Most subscriptions of all of one user's sessions.
    pub max_subscriptions_per_user: usize,
    /// Most subscriptions of all the sessions of one tenant's users.
    pub max_subscriptions_per_tenant: usize,
    /// Most sessions one user holds at once; more are refused and closed.
    pub max_sessions_per_user: usize,
    /// Updates queued for one session; a session that falls this far behind is closed
    /// (ThingsBoard: 1,000).
    pub queue: usize,
    /// Largest message a client may send, bytes.
    pub max_message_bytes: usize,
    /// A ping goes out when the session has been quiet this long, seconds.
    pub ping_interval: Seconds,
    /// A session that sends nothing (not even a pong) for this long is closed, seconds
    /// (ThingsBoard: 90).
    pub idle_timeout: Seconds,
    /// A session of `/api/ws` that has not authenticated (`authCmd`) this long after it
    /// opened is closed, seconds.
    pub auth_timeout: Seconds,
    /// An `ENTITY_COUNT` subscription's count is taken again this often, and sent when it
    /// changed, seconds.
    pub count_refresh: Seconds,
}

impl Default for WsConfig {
    fn default() -> Self {
        Self {
            max_subscriptions: 1_000,
            max_subscriptions_per_user: 10_000,
            max_subscriptions_per_tenant: 100_000,
            max_sessions_per_user: 32,
            queue: 1_000,
            max_message_bytes: 65_536,
            ping_interval: Seconds(30),
            idle_timeout: Seconds(90),
            auth_timeout: Seconds(10),
            count_refresh: Seconds(5),
        }
    }
}

/// Administrator account.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// User name for `POST /api/auth/login`.
    pub user: String,
    /// Password; empty means: use the one stored in the data directory, generating
    /// and printing one on first start.
    pub password: String,
    /// The system administrator's user name (manages tenants).
    pub sysadmin_user: String,
    /// The system administrator's password; empty as for `password`.
    pub sysadmin_password: String,
}

/// JWT settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// HMAC secret for tokens given inline; empty (the default) means the secret file.
    pub jwt_secret: String,
    /// File holding the HMAC secret (created 0600 with a random secret if missing; rotate it
    /// with `gridlinks admin rotate-secret`); empty means `{data_dir}/jwt.secret`.
    pub jwt_secret_file: PathBuf,
    /// Threads that check and hash passwords (argon2), at idle CPU priority.
    pub password_threads: usize,
    /// Failed logins (per source address and per user name) before delays start.
    pub login_free_attempts: u32,
    /// Longest delay imposed after failed logins (it doubles from 1 s).
    pub login_max_delay: Seconds,
    /// Lifetime of an access token.
    pub token_ttl: Seconds,
    /// Lifetime of a refresh token.
    pub refresh_ttl: Seconds,
    /// Answer another tenant's entity ids as ids that do not exist (404), so that a tenant
    /// learns nothing of other tenants; `false`: 403, as ThingsBoard answers.
    pub hide_other_tenants: bool,
}

/// Storage settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// fsync each group commit before acknowledging (`false`: written to the OS only).
    pub fsync: bool,
    /// Block cache, MiB.
    pub cache_mb: u64,
    /// Memtable of the time-series keyspace, MiB (applies to a new data directory).
    pub memtable_mb: u64,
    /// Write requests that may queue before writers wait (backpressure).
    pub queue_capacity: usize,
    /// Most write requests in one group commit.
    pub max_batch_ops: usize,
    /// How long a write waits for queue space before the client gets 503.
    pub enqueue_timeout: Millis,
    /// Most distinct telemetry key names.
    pub max_keys: usize,
    /// Most table files the store keeps open at once (counts against the open-files limit).
    pub max_open_files: usize,
    /// MiB the data directory's file system must keep free: below it, writes are refused
    /// (disk full) before the store runs out of space; 0 turns the check off.
    pub min_free_mb: u64,
}

/// Bounds on device input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Longest telemetry or attribute key, bytes.
    pub max_key_len: usize,
    /// Most values in one request.
    pub max_values_per_request: usize,
    /// Most devices one gateway may create or adopt (and own) through the gateway API.
    pub max_devices_per_gateway: usize,
    /// Whether a gateway may adopt a device of its tenant that no gateway owns (made over
    /// REST, say) the first time it names it, as ThingsBoard's gateways do; a device profile's
    /// `"gatewayAdoption": "ALLOW"` or `"REFUSE"` decides for its devices. A device another
    /// gateway owns is never taken over.
    pub gateway_adopts_devices: bool,
    /// Most devices one tenant may have, however made (REST, bulk import, provisioning,
    /// gateways, TCP listeners); 0: no bound.
    pub max_devices_per_tenant: usize,
    /// Most devices provisioned per minute through one device profile's provision key
    /// (`/api/v1/provision`, MQTT and CoAP provisioning), as a bucket that refills evenly
    /// over the minute; 0: no bound.
    pub max_provisions_per_minute: u32,
}

/// Where acknowledged device data is committed before it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueBackend {
    /// This node's store: the group commit is the commit.
    Embedded,
    /// A Kafka topic (acks=all); storage writers consume it.
    Kafka,
}

/// Where time series are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeseriesBackend {
    /// This node's store.
    Embedded,
    /// Cassandra 5 (tested; ScyllaDB speaks the same protocol, untested).
    Cassandra,
    /// PostgreSQL.
    Postgres,
}

/// Where entities live: devices, credentials, attributes, MQTT clients and ACLs, sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntitiesBackend {
    /// This node's store.
    Embedded,
    /// PostgreSQL.
    Postgres,
}

/// Scale-out settings. All `embedded` (the default) is one node with no external service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Where acknowledged device data is committed.
    pub queue: QueueBackend,
    /// Where time series are stored.
    pub timeseries: TimeseriesBackend,
    /// Where entities live.
    pub entities: EntitiesBackend,
    /// This node's name, unique in the cluster (Kafka client and consumer-group member ids).
    pub node_id: String,
    /// How often the shared services (Kafka, PostgreSQL) are probed: while one does not
    /// answer, `/readyz` is 503 and the node refuses new work (MQTT CONNECT, device data)
    /// with the reason, and takes it again by itself at the first probe that answers.
    pub probe_interval: Millis,
    /// With `entities = "postgres"`: how often the node applies what other nodes changed
    /// (it also does before each of its own entity writes).
    pub entities_poll: Millis,
    /// With several nodes: how long a client's CONNECT waits for the node holding its
    /// persistent session to let it go (a node that died never does: the session is then
    /// taken as stored).
    pub session_handoff: Millis,
    /// Kafka, when `queue = "kafka"`.
    pub kafka: KafkaConfig,
    /// PostgreSQL, when `timeseries` or `entities` is `postgres`.
    pub postgres: PostgresConfig,
    /// Cassandra, when `timeseries = "cassandra"`.
    pub cassandra: CassandraConfig,
}

impl ClusterConfig {
    /// Whether this node is one of several that share entities through Kafka and
    /// PostgreSQL: live delivery, RPC and shared subscriptions then cross nodes on Kafka.
    pub fn several_nodes(&self) -> bool {
        self.queue == QueueBackend::Kafka && self.entities == EntitiesBackend::Postgres
    }
}

/// Kafka settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Brokers to bootstrap from, `host:port`.
    pub bootstrap_servers: Vec<String>,
    /// Prefix of every topic and consumer group GridLinks uses.
    pub topic_prefix: String,
    /// Partitions of the telemetry topic (created if missing); devices are spread over them
    /// by id, so one device's messages stay in order.
    pub partitions: u32,
    /// Replicas of each partition.
    pub replication_factor: u16,
    /// Replicas that must hold a message before the producer's `acks=all` is answered.
    pub min_insync_replicas: u16,
    /// How long a message may wait for Kafka's acknowledgement before the device is told
    /// it failed (and may retry).
    pub produce_timeout: Millis,
    /// Most records the storage writers may be behind (produced, not yet stored). Past it,
    /// device data waits (up to `produce_timeout`) for them to catch up, then is refused as
    /// overloaded: acknowledged data stays queryable within seconds under any load.
    pub max_lag: u64,
}

/// PostgreSQL settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// A file holding the connection URL (`postgres://user:password@host:port/db`), kept
    /// out of the configuration so the password is never in a file others read or in logs.
    pub url_file: PathBuf,
    /// Connections in the pool.
    pub pool_size: u32,
}

/// Cassandra settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CassandraConfig {
    /// Contact points, `host:port`.
    pub contact_points: Vec<String>,
    /// Keyspace (created if missing).
    pub keyspace: String,
    /// Replication factor of a new keyspace.
    pub replication_factor: u16,
    /// Days a time-series point is kept (Cassandra TTL); 0 keeps points forever.
    pub ttl_days: u32,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            queue: QueueBackend::Embedded,
            timeseries: TimeseriesBackend::Embedded,
            entities: EntitiesBackend::Embedded,
            node_id: String::new(),
            probe_interval: Millis(1_000),
            entities_poll: Millis(250),
            session_handoff: Millis(3_000),
            kafka: KafkaConfig::default(),
            postgres: PostgresConfig::default(),
            cassandra: CassandraConfig::default(),
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            bootstrap_servers: vec!["127.0.0.1:9092".into()],
            topic_prefix: "gridlinks.".into(),
            partitions: 12,
            replication_factor: 3,
            min_insync_replicas: 2,
            produce_timeout: Millis(10_000),
            max_lag: 100_000,
        }
    }
}

impl Default for PostgresConfig {
    fn default() -> Self {
        Self { url_file: PathBuf::new(), pool_size: 16 }
    }
}

impl Default for CassandraConfig {
    fn default() -> Self {
        Self {
            contact_points: vec!["127.0.0.1:9042".into()],
            keyspace: "gridlinks".into(),
            replication_factor: 3,
            ttl_days: 0,
        }
    }
}

/// Whether `s` is made of ASCII letters, digits and the bytes in `extra` only.
fn name_chars(s: &str, extra: &[u8]) -> bool {
    s.bytes().all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

impl ClusterConfig {
    /// Whether the combination is one GridLinks can run, and each backend named is
    /// configured: `Err` names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        use {EntitiesBackend as E, QueueBackend as Q, TimeseriesBackend as T};
        match (self.queue, self.timeseries, self.entities) {
            (Q::Embedded, T::Embedded, E::Embedded) => return Ok(()),
            (Q::Embedded, _, _) => {
                return Err(
                    "cluster.timeseries and cluster.entities other than embedded need cluster.queue = \"kafka\": \
                            nodes share data only through Kafka"
                        .into(),
                )
            }
            (Q::Kafka, T::Embedded, E::Postgres) => {
                return Err(
                    "cluster.entities = \"postgres\" needs a shared cluster.timeseries (cassandra or postgres): \
                            nodes sharing devices must share their telemetry"
                        .into(),
                )
            }
            (Q::Kafka, ..) => {}
        }
        if self.node_id.is_empty() || self.node_id.len() > 64 || !name_chars(&self.node_id, b"._-") {
            return Err(
                "cluster.node_id must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-' and unique per node".into(),
            );
        }
        if self.probe_interval.0 < 100 || self.entities_poll.0 < 10 {
            return Err(
                "cluster.probe_interval must be at least 100 ms and cluster.entities_poll at least 10 ms".into()
            );
        }
        let k = &self.kafka;
        if k.bootstrap_servers.is_empty() {
            return Err("cluster.kafka.bootstrap_servers must name at least one broker".into());
        }
        if k.topic_prefix.is_empty() || !name_chars(&k.topic_prefix, b"._-") {
            return Err("cluster.kafka.topic_prefix must be non-empty and of A-Z, a-z, 0-9, '.', '_', '-'".into());
        }
        if k.partitions == 0
            || k.replication_factor == 0
            || k.min_insync_replicas == 0
            || k.produce_timeout.0 == 0
            || k.max_lag == 0
        {
            return Err("cluster.kafka.partitions, replication_factor, min_insync_replicas, produce_timeout and max_lag must be at least 1".into());
        }
        if k.min_insync_replicas > k.replication_factor {
            return Err("cluster.kafka.min_insync_replicas must not exceed cluster.kafka.replication_factor".into());
        }
        let postgres = self.timeseries == T::Postgres || self.entities == E::Postgres;
        if postgres && (self.postgres.url_file.as_os_str().is_empty() || self.postgres.pool_size == 0) {
            return Err(
                "cluster.postgres.url_file must name the file holding the connection URL, and pool_size be at least 1"
                    .into(),
            );
        }
        if self.timeseries == T::Cassandra {
            let c = &self.cassandra;
            if c.contact_points.is_empty() || c.replication_factor == 0 {
                return Err(
                    "cluster.cassandra.contact_points must name a node and replication_factor be at least 1".into()
                );
            }
            if c.keyspace.is_empty() || c.keyspace.len() > 48 || !name_chars(&c.keyspace, b"_") {
                return Err("cluster.cassandra.keyspace must be 1 to 48 characters of A-Z, a-z, 0-9 and '_'".into());
            }
        }
        Ok(())
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            tcp_keepalive_idle: Seconds(60),
            http: HttpConfig::default(),
            mqtt: MqttConfig::default(),
            tcp: TcpConfig::default(),
            coap: CoapConfig::default(),
            rpc: RpcConfig::default(),
            ota: OtaConfig::default(),
            activity: ActivityConfig::default(),
            alarms: AlarmsConfig::default(),
            ws: WsConfig::default(),
            notifications: NotificationsConfig::default(),
            forwarding: ForwardingConfig::default(),
            admin: AdminConfig::default(),
            auth: AuthConfig::default(),
            storage: StorageConfig::default(),
            limits: LimitsConfig::default(),
            cluster: ClusterConfig::default(),
            tls: TlsConfig::default(),
            metrics: MetricsConfig::default(),
            log: LogConfig::default(),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            bind: "0.0.0.0:8080".into(),
            tls_bind: String::new(),
            max_body_bytes: 64 * 1024,
            max_import_bytes: 64 * 1024 * 1024,
            max_page_size: 10_000,
            header_read_timeout: Millis(30_000),
            body_read_timeout: Millis(30_000),
            max_connections: 0,
            max_connections_per_address: 64,
            unbounded_addresses: vec![std::net::Ipv4Addr::LOCALHOST.into(), std::net::Ipv6Addr::LOCALHOST.into()],
            long_poll_timeout: Millis(60_000),
            max_long_poll_timeout: Millis(300_000),
            max_long_polls: 10_000,
            max_long_polls_per_device: 4,
            long_poll_linger: Millis(10_000),
            tls_client_certs: false,
        }
    }
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            bind: "0.0.0.0:1883".into(),
            ws_bind: "0.0.0.0:8083".into(),
            tls_bind: String::new(),
            wss_bind: String::new(),
            wss_client_certs: false,
            max_packet_size: 64 * 1024,
            receive_maximum: 64,
            max_connections: 0,
            max_connections_per_credential: 16,
            max_subscriptions_per_client: 1_000,
            connect_timeout: Millis(10_000),
            outbound_queue: 64,
            rate_limit_messages: 0,
            allow_anonymous: false,
            client_outbound_queue: 1_000,
            client_queue_hard_limit: 100_000,
            max_session_expiry: 7 * 24 * 3600,
            max_keep_alive: 0,
            offline_queue_full: "drop_new".into(),
            anonymous_publish: vec!["#".into()],
            anonymous_subscribe: vec!["#".into()],
            acl_rules: Vec::new(),
            deny_action: DenyAction::Reason,
            response_information: "responses/%c".into(),
            topic_aliases_out: true,
            receive_maximum_lenient: false,
            rate_limit_pause: Millis(1000),
            max_connects_per_address: 100,
            connect_burst_per_address: 1000,
            connect_rate_exempt_loopback: true,
        }
    }
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            listeners: Vec::new(),
            protocols: std::collections::BTreeMap::new(),
            login_timeout: Millis(10_000),
            idle_timeout: Seconds(300),
            script_timeout: Millis(20),
            script_memory_mb: 16,
            script_threads: 0,
        }
    }
}

impl Default for RpcConfig {
    fn default() -> Self {
        Self { default_timeout: Millis(10_000), min_timeout: Millis(5_000), remote_wait: Millis(1_000) }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            user: "admin".into(),
            password: String::new(),
            sysadmin_user: "sysadmin".into(),
            sysadmin_password: String::new(),
        }
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt_secret: String::new(),
            jwt_secret_file: PathBuf::new(),
            password_threads: 1,
            login_free_attempts: 5,
            login_max_delay: Seconds(300),
            token_ttl: Seconds(9000),
            refresh_ttl: Seconds(604_800),
            hide_other_tenants: true,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            fsync: true,
            cache_mb: 64,
            memtable_mb: 32,
            queue_capacity: 8192,
            max_batch_ops: 4096,
            enqueue_timeout: Millis(5000),
            max_keys: 1_000_000,
            max_open_files: 256,
            min_free_mb: 64,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_key_len: 255,
            max_values_per_request: 10_000,
            max_devices_per_gateway: 10_000,
            gateway_adopts_devices: true,
            max_devices_per_tenant: 1_000_000,
            max_provisions_per_minute: 60,
        }
    }
}

/// The default configuration as commented TOML (`gridlinks config default`).
pub const DEFAULT_TOML: &str = include_str!("default_config.toml");

/// A configuration problem, reported to the user verbatim.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// Which file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML is invalid or has an unknown field or a bad value.
    #[error("invalid configuration{where_}: {message}")]
    Invalid {
        /// Where the problem came from (file or environment).
        where_: String,
        /// What is wrong.
        message: String,
    },
    /// A value fails a semantic check.
    #[error("invalid configuration: {0}")]
    Value(String),
}

impl Config {
    /// Loads defaults ← `file` ← environment (`vars`), and validates the result.
    pub fn load(file: Option<&Path>, vars: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
                // Parse into the typed tree first so unknown fields are reported against the file.
                let typed: Config = toml::from_str(&text).map_err(|e| ConfigError::Invalid {
                    where_: format!(" in {}", path.display()),
                    message: e.to_string(),
                })?;
                to_table(&typed)?
            }
            None => to_table(&Config::default())?,
        };
        let defaults = to_table(&Config::default())?;
        let vars: std::collections::HashMap<String, String> = vars.into_iter().collect();
        apply_env(&mut table, &defaults, "GRIDLINKS", &vars)?;
        let cfg: Config = table.try_into().map_err(|e: toml::de::Error| ConfigError::Invalid {
            where_: " from environment".into(),
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The MQTT connection limit in force: `mqtt.max_connections`, or when that is 0 the
    /// open-files limit less the HTTP connection limit, `storage.max_open_files` and
    /// [`FD_RESERVE`] (at least 1).
    pub fn mqtt_max_connections(&self) -> usize {
        if self.mqtt.max_connections > 0 {
            return self.mqtt.max_connections;
        }
        open_files_limit().saturating_sub(self.http_max_connections() + self.storage.max_open_files + FD_RESERVE).max(1)
    }

    /// The HTTP connection limit in force: `http.max_connections`, or when that is 0 an
    /// sixteenth of the open-files limit (at least 64).
    pub fn http_max_connections(&self) -> usize {
        match self.http.max_connections {
            0 => (open_files_limit() / 16).max(64),
            n => n,
        }
    }

    /// Semantic checks the types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Value(m));
        for (name, addr) in [
            ("http.bind", &self.http.bind),
            ("mqtt.bind", &self.mqtt.bind),
            ("mqtt.ws_bind", &self.mqtt.ws_bind),
            ("coap.bind", &self.coap.bind),
            ("http.tls_bind", &self.http.tls_bind),
            ("mqtt.tls_bind", &self.mqtt.tls_bind),
            ("mqtt.wss_bind", &self.mqtt.wss_bind),
            ("metrics.bind", &self.metrics.bind),
        ] {
            let may_be_off = !matches!(name, "http.bind" | "mqtt.bind");
            if addr.parse::<std::net::SocketAddr>().is_err() && !(may_be_off && addr.is_empty()) {
                return bad(format!("{name} = {addr:?} is not a socket address like 0.0.0.0:8080"));
            }
        }
        if self.tls_used() && (self.tls.cert_file.as_os_str().is_empty() || self.tls.key_file.as_os_str().is_empty()) {
            return bad("a TLS listener needs tls.cert_file and tls.key_file".into());
        }
        if self.admin.sysadmin_user.is_empty() || self.admin.sysadmin_user.eq_ignore_ascii_case(&self.admin.user) {
            return bad("admin.sysadmin_user must not be empty nor admin.user".into());
        }
        if self.admin.user.is_empty() {
            return bad("admin.user must not be empty".into());
        }
        if self.http.max_body_bytes < 64 {
            return bad("http.max_body_bytes must be at least 64".into());
        }
        if self.http.max_page_size == 0 {
            return bad("http.max_page_size must be at least 1".into());
        }
        if self.mqtt.max_packet_size < 64
            || self.mqtt.receive_maximum == 0
            || self.mqtt.max_connections_per_credential == 0
            || self.mqtt.outbound_queue == 0
            || self.mqtt.client_outbound_queue == 0
        {
            return bad("mqtt.max_packet_size must be at least 64 and mqtt.receive_maximum, mqtt.max_connections_per_credential, mqtt.outbound_queue, mqtt.client_outbound_queue at least 1".into());
        }
        if self.auth.password_threads == 0 || self.auth.login_max_delay.0 == 0 {
            return bad("auth.password_threads and auth.login_max_delay must be at least 1".into());
        }
        if !self.auth.jwt_secret.is_empty() && self.auth.jwt_secret.len() < 16 {
            return bad("auth.jwt_secret must be at least 16 bytes (or empty, to use the secret file)".into());
        }
        if self.http.header_read_timeout.0 == 0 || self.http.body_read_timeout.0 == 0 {
            return bad("http.header_read_timeout and http.body_read_timeout must be at least 1".into());
        }
        if self.mqtt.client_queue_hard_limit < self.mqtt.client_outbound_queue {
            return bad("mqtt.client_queue_hard_limit must be at least mqtt.client_outbound_queue".into());
        }
        if !matches!(self.mqtt.offline_queue_full.as_str(), "drop_new" | "drop_oldest") {
            return bad(format!(
                "mqtt.offline_queue_full must be drop_new or drop_oldest, not {:?}",
                self.mqtt.offline_queue_full
            ));
        }
        for f in self.mqtt.anonymous_publish.iter().chain(&self.mqtt.anonymous_subscribe) {
            if gridlinks_broker::topic::validate_filter(f).is_err() {
                return bad(format!("mqtt.anonymous_publish / anonymous_subscribe: {f:?} is not a valid topic filter"));
            }
        }
        for f in self.mqtt.acl_rules.iter().flat_map(|r| &r.topics) {
            if gridlinks_broker::topic::validate_filter(&f.replace("%c", "c").replace("%u", "u")).is_err() {
                return bad(format!("mqtt.acl_rules: {f:?} is not a valid topic filter"));
            }
        }
        if self.storage.memtable_mb == 0 {
            return bad("storage.memtable_mb must be at least 1".into());
        }
        if self.storage.queue_capacity == 0 || self.storage.max_batch_ops == 0 {
            return bad("storage.queue_capacity and storage.max_batch_ops must be at least 1".into());
        }
        if self.limits.max_key_len == 0 || self.limits.max_values_per_request == 0 {
            return bad("limits.* must be at least 1".into());
        }
        if self.tcp.login_timeout.0 == 0 || self.tcp.script_timeout.0 == 0 || self.tcp.script_memory_mb == 0 {
            return bad("tcp.login_timeout, tcp.script_timeout and tcp.script_memory_mb must be at least 1".into());
        }
        for (name, p) in &self.tcp.protocols {
            if name == "lamp" {
                return bad("tcp.protocols.lamp: lamp is built in; name your protocol otherwise".into());
            }
            if let Err(e) = gridlinks_types::check_protocol_name(name) {
                return bad(format!("tcp.protocols: {e}"));
            }
            if let Err(e) = p.framing.validate() {
                return bad(format!("tcp.protocols.{name}.framing: {e}"));
            }
        }
        for l in &self.tcp.listeners {
            if l.bind.parse::<std::net::SocketAddr>().is_err() {
                return bad(format!("tcp.listeners: bind = {:?} is not a socket address like 0.0.0.0:1886", l.bind));
            }
            if l.protocol != "lamp" && !self.tcp.protocols.contains_key(&l.protocol) {
                return bad(format!(
                    "tcp.listeners ({}): protocol {:?} is neither lamp nor defined in [tcp.protocols]",
                    l.bind, l.protocol
                ));
            }
        }
        self.cluster.validate().map_err(ConfigError::Value)?;
        if self.cluster.entities == EntitiesBackend::Postgres
            && self.auth.jwt_secret.is_empty()
            && self.auth.jwt_secret_file.as_os_str().is_empty()
        {
            return bad("cluster.entities = \"postgres\" needs auth.jwt_secret or auth.jwt_secret_file, the same on every node: a session signed by one node must be valid on the others".into());
        }
        Ok(())
    }
}

/// The process's soft open-files limit (RLIMIT_NOFILE); 1,024 if it cannot be read.
pub fn open_files_limit() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass and reads nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}

fn to_table(cfg: &Config) -> Result<toml::Table, ConfigError> {
    toml::Table::try_from(cfg).map_err(|e| ConfigError::Value(e.to_string()))
}

/// Overrides every leaf of `table` whose environment variable is set, parsing the
/// variable as the type the default has.
fn apply_env(
    table: &mut toml::Table,
    defaults: &toml::Table,
    prefix: &str,
    vars: &std::collections::HashMap<String, String>,
) -> Result<(), ConfigError> {
    for (key, default) in defaults {
        let name = format!("{prefix}_{}", key.to_uppercase());
        if let toml::Value::Table(sub_defaults) = default {
            if let Some(toml::Value::Table(sub)) = table.get_mut(key) {
                apply_env(sub, sub_defaults, &name, vars)?;
            }
            continue;
        }
        let Some(raw) = vars.get(&name) else { continue };
        let invalid = |what: &str| ConfigError::Invalid {
            where_: format!(" in environment variable {name}"),
            message: format!("{raw:?} is not {what}"),
        };
        let value = match default {
            toml::Value::String(_) => toml::Value::String(raw.clone()),
            toml::Value::Integer(_) => toml::Value::Integer(raw.trim().parse().map_err(|_| invalid("an integer"))?),
            toml::Value::Boolean(_) => toml::Value::Boolean(raw.trim().parse().map_err(|_| invalid("true or false"))?),
            toml::Value::Float(_) => toml::Value::Float(raw.trim().parse().map_err(|_| invalid("a number"))?),
            // A list of strings, comma-separated.
            toml::Value::Array(_) => toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.to_owned()))
                    .collect(),
            ),
            _ => return Err(invalid("supported for this setting")),
        };
        table.insert(key.clone(), value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
        for (k, v) in t {
            let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match v {
                toml::Value::Table(sub) => leaves(sub, &p, out),
                _ => out.push(p),
            }
        }
    }

    #[test]
    fn cluster_combinations_are_checked() {
        let check = |vars: &[(&str, &str)]| {
            let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            Config::load(None, vars).map(|c| c.cluster).map_err(|e| e.to_string())
        };
        assert_eq!(check(&[]).unwrap(), ClusterConfig::default());
        let e = check(&[("GRIDLINKS_CLUSTER_TIMESERIES", "postgres")]).unwrap_err();
        assert!(e.contains("need cluster.queue = \"kafka\""), "{e}");
        let e = check(&[("GRIDLINKS_CLUSTER_QUEUE", "kafka")]).unwrap_err();
        assert!(e.contains("cluster.node_id"), "{e}");
        let kafka = [("GRIDLINKS_CLUSTER_QUEUE", "kafka"), ("GRIDLINKS_CLUSTER_NODE_ID", "node-1")];
        // Kafka in front of one node's own store.
        assert_eq!(check(&kafka).unwrap().queue, QueueBackend::Kafka);
        let mix = [kafka[0], kafka[1], ("GRIDLINKS_CLUSTER_TIMESERIES", "cassandra")];
        assert!(check(&mix).is_ok(), "shared time series, entities on the node");
        let devices_only = [
            kafka[0],
            kafka[1],
            ("GRIDLINKS_CLUSTER_ENTITIES", "postgres"),
            ("GRIDLINKS_CLUSTER_POSTGRES_URL_FILE", "/run/pg.url"),
        ];
        assert!(check(&devices_only).unwrap_err().contains("needs a shared cluster.timeseries"));
        let shared = [
            kafka[0],
            kafka[1],
            ("GRIDLINKS_CLUSTER_TIMESERIES", "cassandra"),
            ("GRIDLINKS_CLUSTER_ENTITIES", "postgres"),
        ];
        assert!(check(&shared).unwrap_err().contains("cluster.postgres.url_file"));
        let full = [shared[0], shared[1], shared[2], shared[3], ("GRIDLINKS_CLUSTER_POSTGRES_URL_FILE", "/run/pg.url")];
        // Sessions signed by one node must be valid on the others: one JWT secret for all.
        assert!(check(&full).unwrap_err().contains("auth.jwt_secret"));
        let full = [full[0], full[1], full[2], full[3], full[4], ("GRIDLINKS_AUTH_JWT_SECRET", "0123456789abcdef")];
        let c = check(&full).unwrap();
        assert_eq!((c.timeseries, c.entities), (TimeseriesBackend::Cassandra, EntitiesBackend::Postgres));
        let e = check(&[kafka[0], kafka[1], ("GRIDLINKS_CLUSTER_KAFKA_MIN_INSYNC_REPLICAS", "4")]).unwrap_err();
        assert!(e.contains("must not exceed"), "{e}");
        let e = check(&[kafka[0], ("GRIDLINKS_CLUSTER_NODE_ID", "a b")]).unwrap_err();
        assert!(e.contains("cluster.node_id"), "{e}");
        let e = check(&[("GRIDLINKS_CLUSTER_QUEUE", "zookeeper")]).unwrap_err();
        assert!(e.contains("GRIDLINKS") || e.contains("queue"), "{e}");
    }

    #[test]
    fn default_toml_documents_every_field_and_matches_defaults() {
        let parsed: Config = toml::from_str(DEFAULT_TOML).unwrap();
        assert_eq!(parsed, Config::default());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        leaves(&toml::from_str(DEFAULT_TOML).unwrap(), "", &mut a);
        leaves(&to_table(&Config::default()).unwrap(), "", &mut b);
        a.sort();
        b.sort();
        assert_eq!(a, b, "default_config.toml must list every field");
        // Every field line is preceded by a comment.
        let lines: Vec<&str> = DEFAULT_TOML.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains(" = ") && !l.starts_with('#') {
                assert!(lines[i - 1].starts_with('#'), "field without comment: {l}");
            }
        }
    }

    #[test]
    fn tcp_listeners_and_protocols() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(Some(&file), Vec::new())
        };
        let c = load(
            r#"
            [[tcp.listeners]]
            bind = "0.0.0.0:1886"
            protocol = "lamp"
            auto_provision = true
            [[tcp.listeners]]
            bind = "0.0.0.0:1887"
            protocol = "meter"
            [tcp.protocols.meter]
            framing = { kind = "delimiter", delimiter = "0d0a", max_frame = 256 }
            script = "meter.js"
            "#,
        )
        .unwrap();
        assert_eq!(c.tcp.listeners.len(), 2);
        assert!(c.tcp.listeners[0].auto_provision && !c.tcp.listeners[1].auto_provision);
        assert_eq!(c.tcp.protocols["meter"].script, PathBuf::from("meter.js"));
        let err = |text: &str| load(text).unwrap_err().to_string();
        let unknown = err("[[tcp.listeners]]\nbind = \"0.0.0.0:1\"\nprotocol = \"nope\"");
        assert!(unknown.contains("neither lamp nor defined"), "{unknown}");
        let bad_bind = err("[[tcp.listeners]]\nbind = \"x\"\nprotocol = \"lamp\"");
        assert!(bad_bind.contains("socket address"), "{bad_bind}");
        let framing = err("[tcp.protocols.m]\nframing = { kind = \"fixed\", length = 0 }\nscript = \"m.js\"");
        assert!(framing.contains("tcp.protocols.m.framing"), "{framing}");
        let name = err("[tcp.protocols.Big]\nframing = { kind = \"fixed\", length = 4 }\nscript = \"m.js\"");
        assert!(name.contains("protocol name"), "{name}");
    }

    #[test]
    fn env_overrides_and_errors() {
        let env =
            |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let c = Config::load(
            None,
            env(&[
                ("GRIDLINKS_DATA_DIR", "/tmp/x"),
                ("GRIDLINKS_HTTP_BIND", "127.0.0.1:1"),
                ("GRIDLINKS_STORAGE_FSYNC", "false"),
                ("GRIDLINKS_STORAGE_ENQUEUE_TIMEOUT", "7"),
                ("GRIDLINKS_ADMIN_PASSWORD", "pw"),
                ("GRIDLINKS_MQTT_ANONYMOUS_SUBSCRIBE", "a/#, b/+"),
            ]),
        )
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.http.bind, "127.0.0.1:1");
        assert!(!c.storage.fsync);
        assert_eq!(c.storage.enqueue_timeout, Millis(7));
        assert_eq!(c.admin.password, "pw");
        assert_eq!(c.mqtt.anonymous_subscribe, ["a/#", "b/+"]);
        let e = Config::load(None, env(&[("GRIDLINKS_STORAGE_CACHE_MB", "lots")])).unwrap_err();
        assert!(e.to_string().contains("GRIDLINKS_STORAGE_CACHE_MB"), "{e}");
        let e = Config::load(None, env(&[("GRIDLINKS_HTTP_BIND", "nope")])).unwrap_err();
        assert!(e.to_string().contains("http.bind"), "{e}");
    }

    #[test]
    fn unknown_file_field_is_rejected_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "[http]\nbindd = \"1\"\n").unwrap();
        let e = Config::load(Some(&p), Vec::new()).unwrap_err().to_string();
        assert!(e.contains("bindd"), "{e}");
    }
}
