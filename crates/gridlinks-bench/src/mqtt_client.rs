//! One MQTT client connection on the sans-IO codec.
//!
//! The connection owns its read buffer, so [`MqttConnection::read_packet`] is
//! cancel-safe inside `select!` (bytes read but not yet decoded stay in the buffer).
//! Writes are batched: callers [`queue`](MqttConnection::queue) any number of packets
//! and [`flush`](MqttConnection::flush) them in one `write_all`, which is how a window
//! of publishes goes out in one system call.
//!
//! With [`ClientOptions::tls`] the connection speaks MQTT over TLS (rustls, the same
//! *ring* provider as the server): the socket is then a [`Stream::Tls`], and a flush
//! also pushes out what rustls still holds encrypted.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use gridlinks_codec::mqtt::{
    decode, encode, reason, ConnAck, Connect, ConnectProperties, DecodeError, Disconnect, EncodeError, Packet,
    ProtocolVersion,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Largest packet the client accepts from the server. Servers send this generator
/// only acks, pings and CONNACKs, so anything near this is a broken peer.
pub const MAX_INCOMING_PACKET: usize = 1 << 20;

/// Initial read-buffer capacity; acks are 4 bytes, so idle connections stay small.
const READ_BUFFER_START: usize = 256;

/// How long [`MqttConnection::disconnect`] waits for the server to close after DISCONNECT
/// (the server closing first keeps TIME_WAIT off the client's ephemeral ports).
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Where a connection goes and from which local address.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    /// Server address.
    pub server: SocketAddr,
    /// Local address to bind before connecting (port chosen by the OS); `None` lets the
    /// OS choose the address too.
    pub source: Option<IpAddr>,
}

/// What goes into CONNECT.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Client identifier, unique per connection (brokers drop the older of two equal ids).
    pub client_id: String,
    /// User name (a device access token for ThingsBoard-style servers).
    pub username: Option<String>,
    /// Password; `None` leaves the password flag unset.
    pub password: Option<Bytes>,
    /// Keep-alive sent in CONNECT.
    pub keep_alive: Duration,
    /// Protocol version of the connection.
    pub version: ProtocolVersion,
    /// Time allowed for TCP connect plus CONNECT/CONNACK.
    pub connect_timeout: Duration,
    /// A persistent session: clean start off and, in MQTT 5, this session expiry (s).
    pub session_expiry: Option<u32>,
    /// Speak TLS first (MQTT over TLS); `None`: plain TCP.
    pub tls: Option<TlsClient>,
}

/// How a connection speaks TLS: whom it trusts and which name it expects. Cloned into
/// every connection's [`ClientOptions`]; the clones share one `ClientConfig`.
#[derive(Debug, Clone)]
pub struct TlsClient {
    /// Trusts the CA certificates of one file; no client certificate; no session
    /// resumption (see [`TlsClient::trusting`]).
    config: Arc<rustls::ClientConfig>,
    /// Checked against the server certificate's subjectAltName (DNS name or IP address).
    server_name: ServerName<'static>,
    /// What the first completed handshake negotiated, for reports (`TLSv1_3,
    /// TLS13_AES_256_GCM_SHA384, X25519`); shared by the clones.
    negotiated: Arc<OnceLock<String>>,
}

/// Why the TLS settings could not be built.
#[derive(Debug)]
pub enum TlsSetupError {
    /// The CA file is unreadable, not PEM, or holds no certificate rustls accepts.
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// `--tls-server-name` is neither a DNS name nor an IP address.
    ServerName(String),
    /// The crypto provider refused the protocol versions (a build without TLS 1.2/1.3).
    Config(rustls::Error),
}

impl fmt::Display for TlsSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsSetupError::CaFile { path, why } => write!(f, "TLS CA file {}: {why}", path.display()),
            TlsSetupError::ServerName(name) => write!(f, "TLS server name {name:?} is not a DNS name or IP address"),
            TlsSetupError::Config(e) => write!(f, "TLS client configuration: {e}"),
        }
    }
}

impl std::error::Error for TlsSetupError {}

impl TlsClient {
    /// Trusts the CA certificates in `ca_file` (PEM) and expects `server_name` in the
    /// server's certificate. TLS 1.3 and 1.2, the *ring* provider (the server's).
    ///
    /// Session resumption is off: each connection stands for a device of its own, which
    /// would make a full handshake, and a resumed one would hide most of the server's
    /// handshake cost from a connection storm.
    pub fn trusting(ca_file: &Path, server_name: &str) -> Result<Self, TlsSetupError> {
        let ca_error = |why: String| TlsSetupError::CaFile { path: ca_file.to_path_buf(), why };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_file).map_err(|e| ca_error(e.to_string()))? {
            let cert = cert.map_err(|e| ca_error(e.to_string()))?;
            roots.add(cert).map_err(|e| ca_error(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(ca_error("no CERTIFICATE in it".into()));
        }
        let server_name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| TlsSetupError::ServerName(server_name.to_owned()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsSetupError::Config)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.resumption = rustls::client::Resumption::disabled();
        Ok(TlsClient { config: Arc::new(config), server_name, negotiated: Arc::new(OnceLock::new()) })
    }

    /// What the first completed handshake negotiated (version, cipher suite, key
    /// exchange), e.g. `TLSv1_3, TLS13_AES_256_GCM_SHA384, X25519`; `None` before one.
    pub fn negotiated(&self) -> Option<&str> {
        self.negotiated.get().map(String::as_str)
    }

    /// The TLS handshake on a connected socket.
    async fn handshake(&self, tcp: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        let tls = TlsConnector::from(Arc::clone(&self.config)).connect(self.server_name.clone(), tcp).await?;
        if self.negotiated.get().is_none() {
            let session = tls.get_ref().1;
            let mut parts = Vec::with_capacity(3);
            parts.extend(session.protocol_version().map(|v| format!("{v:?}")));
            parts.extend(session.negotiated_cipher_suite().map(|s| format!("{:?}", s.suite())));
            parts.extend(session.negotiated_key_exchange_group().map(|g| format!("{:?}", g.name())));
            let _ = self.negotiated.set(parts.join(", "));
        }
        Ok(tls)
    }
}

/// Why a connection could not be established. [`ConnectError::reason`] is the key the
/// reports count failures by.
#[derive(Debug)]
pub enum ConnectError {
    /// Binding the source address or the TCP connect failed.
    Tcp(io::Error),
    /// The TLS handshake failed (e.g. a certificate the CA did not sign, a name it
    /// does not hold, the server closing mid-handshake).
    Tls(io::Error),
    /// The connection broke during the CONNECT/CONNACK exchange.
    Handshake(io::Error),
    /// The server closed the connection instead of answering CONNECT.
    ClosedBeforeConnAck,
    /// No CONNACK within the connect timeout.
    Timeout,
    /// The server answered with a refusing CONNACK.
    Refused {
        /// 3.x return code or MQTT 5 reason code.
        code: u8,
        /// Version the code belongs to.
        version: ProtocolVersion,
    },
    /// The server's answer was not a valid CONNACK.
    Protocol(String),
}

impl ConnectError {
    /// A short stable description to count failures by, e.g. `CONNACK 0x05 not authorized`
    /// or `tcp: connection refused`.
    pub fn reason(&self) -> String {
        match self {
            ConnectError::Tcp(e) => format!("tcp: {}", io_kind(e)),
            ConnectError::Tls(e) => format!("tls: {}", io_kind(e)),
            ConnectError::Handshake(e) => format!("handshake io: {}", io_kind(e)),
            ConnectError::ClosedBeforeConnAck => "closed before CONNACK".into(),
            ConnectError::Timeout => "timeout waiting for CONNACK".into(),
            ConnectError::Refused { code, version } => {
                format!("CONNACK {code:#04x} {}", connack_code_name(*version, *code))
            }
            ConnectError::Protocol(what) => format!("protocol: {what}"),
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason())
    }
}

impl std::error::Error for ConnectError {}

/// Why an established connection stopped working.
#[derive(Debug)]
pub enum ConnectionError {
    /// Socket read or write failed.
    Io(io::Error),
    /// The server sent bytes that are not a valid packet.
    Decode(DecodeError),
    /// The server closed the connection (possibly after a DISCONNECT).
    Closed,
}

impl ConnectionError {
    /// A short stable description to count disconnections by.
    pub fn reason(&self) -> String {
        match self {
            ConnectionError::Io(e) => format!("io: {}", io_kind(e)),
            ConnectionError::Decode(e) => format!("bad packet from server: {e}"),
            ConnectionError::Closed => "closed by server".into(),
        }
    }
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason())
    }
}

impl std::error::Error for ConnectionError {}

impl From<io::Error> for ConnectionError {
    fn from(e: io::Error) -> Self {
        ConnectionError::Io(e)
    }
}

/// An io error as counted in reports: the OS message with its errno, e.g.
/// "Connection refused (os error 111)", which stays the same across occurrences.
fn io_kind(e: &io::Error) -> String {
    e.to_string()
}

/// Names of CONNACK codes, for failure reports.
fn connack_code_name(version: ProtocolVersion, code: u8) -> &'static str {
    if version.is_v5() {
        match code {
            reason::UNSPECIFIED_ERROR => "unspecified error",
            reason::MALFORMED_PACKET => "malformed packet",
            reason::PROTOCOL_ERROR => "protocol error",
            reason::IMPLEMENTATION_SPECIFIC_ERROR => "implementation specific error",
            reason::UNSUPPORTED_PROTOCOL_VERSION => "unsupported protocol version",
            reason::CLIENT_IDENTIFIER_NOT_VALID => "client identifier not valid",
            reason::BAD_USER_NAME_OR_PASSWORD => "bad user name or password",
            reason::NOT_AUTHORIZED => "not authorized",
            reason::SERVER_UNAVAILABLE => "server unavailable",
            reason::SERVER_BUSY => "server busy",
            reason::BANNED => "banned",
            reason::QUOTA_EXCEEDED => "quota exceeded",
            reason::CONNECTION_RATE_EXCEEDED => "connection rate exceeded",
            _ => "refused",
        }
    } else {
        match code {
            reason::V3_UNACCEPTABLE_PROTOCOL_VERSION => "unacceptable protocol version",
            reason::V3_IDENTIFIER_REJECTED => "identifier rejected",
            reason::V3_SERVER_UNAVAILABLE => "server unavailable",
            reason::V3_BAD_USERNAME_OR_PASSWORD => "bad user name or password",
            reason::V3_NOT_AUTHORIZED => "not authorized",
            _ => "refused",
        }
    }
}

/// The socket of a connection: plain TCP, or TLS over it (boxed: rustls' state is a
/// few KiB, the plain variant a few bytes).
enum Stream {
    /// MQTT over TCP.
    Plain(TcpStream),
    /// MQTT over TLS.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// Writes all of `buf`; over TLS also flushes, so that nothing stays encrypted in
    /// rustls' buffer until the next write.
    async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.write_all(buf).await,
            Stream::Tls(s) => {
                s.write_all(buf).await?;
                s.flush().await
            }
        }
    }
}

// Reads through `AsyncReadExt::read_buf`. Cancel-safe either way: tokio-rustls keeps
// decrypted bytes in the session until a `poll_read` hands them out.
impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

/// An established MQTT connection (CONNACK accepted).
pub struct MqttConnection {
    /// The socket; TCP_NODELAY is set, as acks are latency-measured.
    stream: Stream,
    /// Bytes read but not yet decoded; owned here so reads are cancel-safe.
    rbuf: BytesMut,
    /// Packets queued by `queue` and not yet flushed.
    wbuf: BytesMut,
    /// Version negotiated in CONNECT; the codec needs it for every packet.
    version: ProtocolVersion,
    /// The server's CONNACK (MQTT 5 properties such as Receive Maximum).
    connack: ConnAck,
}

impl MqttConnection {
    /// Connects over TCP from `endpoint.source` (then TLS with `opts.tls`), sends CONNECT
    /// and waits for CONNACK, all within `opts.connect_timeout`. A refusing CONNACK is an
    /// error.
    pub async fn connect(endpoint: Endpoint, opts: &ClientOptions) -> Result<Self, ConnectError> {
        match tokio::time::timeout(opts.connect_timeout, Self::handshake(endpoint, opts)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout),
        }
    }

    async fn handshake(endpoint: Endpoint, opts: &ClientOptions) -> Result<Self, ConnectError> {
        let tcp = tcp_connect(endpoint).await.map_err(ConnectError::Tcp)?;
        tcp.set_nodelay(true).map_err(ConnectError::Tcp)?;
        let stream = match &opts.tls {
            None => Stream::Plain(tcp),
            Some(tls) => Stream::Tls(Box::new(tls.handshake(tcp).await.map_err(ConnectError::Tls)?)),
        };
        let mut conn = MqttConnection {
            stream,
            rbuf: BytesMut::with_capacity(READ_BUFFER_START),
            wbuf: BytesMut::new(),
            version: opts.version,
            connack: ConnAck { session_present: false, code: 0, properties: Default::default() },
        };
        let connect = Packet::Connect(Box::new(Connect {
            protocol: opts.version,
            client_id: opts.client_id.clone(),
            keep_alive: u16::try_from(opts.keep_alive.as_secs()).unwrap_or(u16::MAX),
            clean_start: opts.session_expiry.is_none(),
            username: opts.username.clone(),
            password: opts.password.clone(),
            will: None,
            properties: ConnectProperties {
                session_expiry_interval: opts.session_expiry.filter(|_| opts.version.is_v5()),
                ..ConnectProperties::default()
            },
        }));
        conn.queue(&connect).map_err(|e| ConnectError::Protocol(format!("cannot encode CONNECT: {e}")))?;
        conn.flush().await.map_err(ConnectError::Handshake)?;
        match conn.read_packet().await {
            Ok(Packet::ConnAck(ack)) => {
                let accepted = if opts.version.is_v5() {
                    ack.code == reason::SUCCESS
                } else {
                    ack.code == reason::V3_CONNECTION_ACCEPTED
                };
                if !accepted {
                    return Err(ConnectError::Refused { code: ack.code, version: opts.version });
                }
                conn.connack = ack;
                Ok(conn)
            }
            Ok(other) => Err(ConnectError::Protocol(format!("{} instead of CONNACK", other.name()))),
            Err(ConnectionError::Closed) => Err(ConnectError::ClosedBeforeConnAck),
            Err(ConnectionError::Io(e)) => Err(ConnectError::Handshake(e)),
            Err(ConnectionError::Decode(e)) => Err(ConnectError::Protocol(e.to_string())),
        }
    }

    /// The server's CONNACK.
    pub fn connack(&self) -> &ConnAck {
        &self.connack
    }

    /// The protocol version of this connection.
    pub fn version(&self) -> ProtocolVersion {
        self.version
    }

    /// Appends `packet` to the write buffer; nothing is sent until [`flush`](Self::flush).
    pub fn queue(&mut self, packet: &Packet) -> Result<(), EncodeError> {
        encode(packet, self.version, &mut self.wbuf)
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> io::Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// A packet already in the read buffer, without touching the socket.
    pub fn try_decode(&mut self) -> Result<Option<Packet>, ConnectionError> {
        decode(&mut self.rbuf, self.version, MAX_INCOMING_PACKET).map_err(ConnectionError::Decode)
    }

    /// The next packet from the server. Cancel-safe: a cancelled call loses no bytes.
    pub async fn read_packet(&mut self) -> Result<Packet, ConnectionError> {
        loop {
            if let Some(packet) = self.try_decode()? {
                return Ok(packet);
            }
            if self.rbuf.capacity() - self.rbuf.len() < 64 {
                self.rbuf.reserve(READ_BUFFER_START);
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(ConnectionError::Closed);
            }
        }
    }

    /// Sends DISCONNECT and waits briefly for the server to close, so the TIME_WAIT
    /// state stays on the server side. Errors are ignored: the connection is done.
    pub async fn disconnect(mut self) {
        let disconnect = Packet::Disconnect(Disconnect {
            reason: reason::SUCCESS,
            session_expiry_interval: None,
            reason_string: None,
            server_reference: None,
        });
        if self.queue(&disconnect).is_err() || self.flush().await.is_err() {
            return;
        }
        let _ = tokio::time::timeout(CLOSE_WAIT, async { while self.read_packet().await.is_ok() {} }).await;
    }
}

/// TCP connect, bound to the endpoint's source address when it has one.
async fn tcp_connect(endpoint: Endpoint) -> io::Result<TcpStream> {
    let socket = match endpoint.server {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(ip) = endpoint.source {
        // Lets the OS hand out ports whose earlier connections are still in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    socket.connect(endpoint.server).await
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use rustls::pki_types::PrivateKeyDer;
    use tokio::net::TcpListener;

    use super::*;
    use crate::pki::{ThrowawayPki, SERVER_NAME};

    /// A one-connection MQTT-over-TLS server on 127.0.0.1 serving the PKI's certificate:
    /// reads CONNECT, answers CONNACK accepted, then PUBACKs whatever it is sent.
    async fn tls_server(pki: &ThrowawayPki) -> SocketAddr {
        let files = pki.files();
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(&files.cert).unwrap().map(Result::unwrap).collect();
        let key = PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                // A handshake the client refuses ends here; the next client is accepted.
                let Ok(mut tls) = acceptor.accept(tcp).await else { continue };
                let mut buf = BytesMut::new();
                let version = ProtocolVersion::V3_1_1;
                loop {
                    match decode(&mut buf, version, MAX_INCOMING_PACKET).unwrap() {
                        Some(Packet::Connect(_)) => {
                            let mut out = BytesMut::new();
                            let ack = ConnAck { session_present: false, code: 0, properties: Default::default() };
                            encode(&Packet::ConnAck(ack), version, &mut out).unwrap();
                            tls.write_all(&out).await.unwrap();
                            tls.flush().await.unwrap();
                        }
                        Some(Packet::Disconnect(_)) => break,
                        Some(_) => {}
                        None => {
                            if tls.read_buf(&mut buf).await.unwrap() == 0 {
                                break;
                            }
                        }
                    }
                }
            }
        });
        addr
    }

    fn options(tls: &TlsClient) -> ClientOptions {
        ClientOptions {
            client_id: "tls-test".into(),
            username: None,
            password: None,
            keep_alive: Duration::from_secs(60),
            version: ProtocolVersion::V3_1_1,
            connect_timeout: Duration::from_secs(10),
            session_expiry: None,
            tls: Some(tls.clone()),
        }
    }

    /// The client trusts the CA, checks the name, and speaks MQTT over the TLS stream; a
    /// name the certificate does not hold fails the handshake with a `tls: …` reason.
    #[tokio::test]
    async fn connects_over_tls_and_refuses_a_wrong_name() {
        if std::process::Command::new("openssl").arg("version").output().is_err() {
            eprintln!("openssl not installed: skipped");
            return;
        }
        let pki = ThrowawayPki::create().await.unwrap();
        let server = tls_server(&pki).await;
        let endpoint = Endpoint { server, source: None };

        let tls = TlsClient::trusting(&pki.files().ca, SERVER_NAME).unwrap();
        assert_eq!(tls.negotiated(), None);
        let conn = MqttConnection::connect(endpoint, &options(&tls)).await.unwrap();
        assert_eq!(conn.connack().code, 0);
        conn.disconnect().await;
        let negotiated = tls.negotiated().unwrap();
        assert!(negotiated.starts_with("TLSv1_3, TLS13_"), "{negotiated}");

        let by_ip = TlsClient::trusting(&pki.files().ca, "127.0.0.1").unwrap();
        MqttConnection::connect(endpoint, &options(&by_ip)).await.unwrap().disconnect().await;

        let wrong = TlsClient::trusting(&pki.files().ca, "other.test").unwrap();
        let e = MqttConnection::connect(endpoint, &options(&wrong)).await.err().unwrap();
        assert!(matches!(e, ConnectError::Tls(_)), "{e:?}");
        assert!(e.reason().starts_with("tls: ") && e.reason().contains("certificate"), "{}", e.reason());

        // The server certificate is no CA: trusting it alone verifies nothing.
        let not_a_ca = TlsClient::trusting(&pki.files().cert, SERVER_NAME).unwrap();
        let e = MqttConnection::connect(endpoint, &options(&not_a_ca)).await.err().unwrap();
        assert!(e.reason().starts_with("tls: "), "{}", e.reason());
    }

    #[test]
    fn tls_settings_need_a_pem_ca_and_a_valid_name() {
        let dir = std::env::temp_dir().join(format!("gl-bench-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = TlsClient::trusting(&empty, "localhost").unwrap_err();
        assert!(matches!(e, TlsSetupError::CaFile { .. }), "{e}");
        assert!(TlsClient::trusting(&dir.join("absent.pem"), "localhost").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
