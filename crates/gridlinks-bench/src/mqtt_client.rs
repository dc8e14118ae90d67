//! One MQTT client connection on the sans-IO codec.
//!
//! The connection owns its read buffer, so [`MqttConnection::read_packet`] is
//! cancel-safe inside `select!` (bytes read but not yet decoded stay in the buffer).
//! Writes are batched: callers [`queue`](MqttConnection::queue) any number of packets
//! and [`flush`](MqttConnection::flush) them in one `write_all`, which is how a window
//! of publishes goes out in one system call.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use gridlinks_codec::mqtt::{
    decode, encode, reason, ConnAck, Connect, ConnectProperties, DecodeError, Disconnect, EncodeError, Packet,
    ProtocolVersion,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

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
}

/// Why a connection could not be established. [`ConnectError::reason`] is the key the
/// reports count failures by.
#[derive(Debug)]
pub enum ConnectError {
    /// Binding the source address or the TCP connect failed.
    Tcp(io::Error),
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

/// An established MQTT connection (CONNACK accepted).
pub struct MqttConnection {
    /// The socket; TCP_NODELAY is set, as acks are latency-measured.
    stream: TcpStream,
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
    /// Connects over TCP from `endpoint.source`, sends CONNECT and waits for CONNACK, all
    /// within `opts.connect_timeout`. A refusing CONNACK is an error.
    pub async fn connect(endpoint: Endpoint, opts: &ClientOptions) -> Result<Self, ConnectError> {
        match tokio::time::timeout(opts.connect_timeout, Self::handshake(endpoint, opts)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout),
        }
    }

    async fn handshake(endpoint: Endpoint, opts: &ClientOptions) -> Result<Self, ConnectError> {
        let stream = tcp_connect(endpoint).await.map_err(ConnectError::Tcp)?;
        stream.set_nodelay(true).map_err(ConnectError::Tcp)?;
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
