//! A blocking raw MQTT test client on the project's own codec, for protocol edge cases
//! (reason codes, malformed and oversize packets, silence).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
pub use gridlinks_codec::mqtt::*;

pub struct Raw {
    pub stream: TcpStream,
    pub version: ProtocolVersion,
    buf: BytesMut,
}

pub fn connect_packet(version: ProtocolVersion, token: Option<&str>, keep_alive: u16) -> Packet {
    Packet::Connect(Box::new(Connect {
        protocol: version,
        client_id: "raw-test".into(),
        keep_alive,
        clean_start: true,
        username: token.map(String::from),
        password: None,
        will: None,
        properties: ConnectProperties::default(),
    }))
}

/// A normal DISCONNECT (reason 0, no properties).
pub fn disconnect_packet() -> Packet {
    Packet::Disconnect(Disconnect {
        reason: 0,
        session_expiry_interval: None,
        reason_string: None,
        server_reference: None,
    })
}

/// A PUBLISH without properties.
pub fn publish_packet(topic: &str, payload: &[u8], qos: QoS, packet_id: Option<u16>) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id,
        payload: Bytes::copy_from_slice(payload),
        properties: PublishProperties::default(),
    })
}

impl Raw {
    pub fn open(port: u16, version: ProtocolVersion) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Self { stream, version, buf: BytesMut::new() }
    }

    /// Opens and CONNECTs; returns the client and the CONNACK.
    pub fn connect(port: u16, version: ProtocolVersion, token: Option<&str>, keep_alive: u16) -> (Self, ConnAck) {
        Self::connect_with(port, version, "raw-test", token, keep_alive)
    }

    /// Opens and CONNECTs with client id `client_id` (keep-alive 60 s).
    pub fn connect_as(port: u16, version: ProtocolVersion, client_id: &str, token: Option<&str>) -> (Self, ConnAck) {
        Self::connect_with(port, version, client_id, token, 60)
    }

    /// Opens and CONNECTs as application `user` with `password`.
    pub fn login(port: u16, version: ProtocolVersion, client_id: &str, user: &str, password: &str) -> (Self, ConnAck) {
        Self::connect_custom(port, version, |c| {
            c.client_id = client_id.into();
            c.username = Some(user.into());
            c.password = Some(Bytes::copy_from_slice(password.as_bytes()));
        })
    }

    fn connect_with(
        port: u16,
        version: ProtocolVersion,
        client_id: &str,
        token: Option<&str>,
        keep_alive: u16,
    ) -> (Self, ConnAck) {
        Self::connect_custom(port, version, |c| {
            c.client_id = client_id.into();
            c.username = token.map(String::from);
            c.keep_alive = keep_alive;
        })
    }

    /// Opens and sends [`connect_packet`] (no token, keep-alive 60 s) as changed by `f`.
    pub fn connect_custom(port: u16, version: ProtocolVersion, f: impl FnOnce(&mut Connect)) -> (Self, ConnAck) {
        let mut c = Self::open(port, version);
        let mut connect = connect_packet(version, None, 60);
        if let Packet::Connect(c) = &mut connect {
            f(c);
        }
        c.send(&connect);
        match c.recv() {
            Some(Packet::ConnAck(a)) => (c, a),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    pub fn send(&mut self, p: &Packet) {
        self.try_send(p).unwrap();
    }

    pub fn try_send(&mut self, p: &Packet) -> std::io::Result<()> {
        let mut out = BytesMut::new();
        encode(p, self.version, &mut out).map_err(|e| std::io::Error::other(e.to_string()))?;
        self.stream.write_all(&out)
    }

    /// The next packet; Err when the connection broke or timed out, Ok(None) on close.
    pub fn try_recv(&mut self) -> std::io::Result<Option<Packet>> {
        loop {
            if let Some(p) =
                decode(&mut self.buf, self.version, 1 << 24).map_err(|e| std::io::Error::other(e.to_string()))?
            {
                return Ok(Some(p));
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk)? {
                0 => return Ok(None),
                n => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// The next packet, or None when the server closed the connection.
    pub fn recv(&mut self) -> Option<Packet> {
        loop {
            if let Some(p) = decode(&mut self.buf, self.version, 1 << 24).unwrap() {
                return Some(p);
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                    panic!("no packet from the server within the read timeout")
                }
                Err(_) => return None,
            }
        }
    }

    /// Waits until the server closes the socket (optionally after a DISCONNECT); returns
    /// the DISCONNECT if one came, and how long it took.
    pub fn expect_close(&mut self) -> (Option<Disconnect>, Duration) {
        let started = Instant::now();
        let mut disconnect = None;
        while let Some(p) = self.recv() {
            match p {
                Packet::Disconnect(d) => disconnect = Some(d),
                other => panic!("expected the connection to close, got {other:?}"),
            }
        }
        (disconnect, started.elapsed())
    }

    /// Sends a normal DISCONNECT and waits for the server to close.
    pub fn disconnect(&mut self) {
        self.send(&disconnect_packet());
        self.expect_close();
    }

    pub fn publish(&mut self, topic: &str, payload: &[u8], qos: QoS, packet_id: Option<u16>) {
        self.send(&publish_packet(topic, payload, qos, packet_id));
    }

    /// A plain PUBACK (reason 0) of `packet_id`.
    pub fn ack(&mut self, packet_id: u16) {
        self.send(&Packet::PubAck(PubResp { packet_id, reason: 0, reason_string: None, user_properties: Vec::new() }));
    }

    /// The topic of the next PUBLISH, acknowledged if it has a packet id (other packets
    /// are passed over); panics if the connection closes.
    pub fn next_topic(&mut self) -> String {
        loop {
            match self.recv() {
                Some(Packet::Publish(p)) => {
                    if let Some(id) = p.packet_id {
                        self.ack(id);
                    }
                    return p.topic;
                }
                Some(_) => continue,
                None => panic!("the connection closed"),
            }
        }
    }

    /// Subscribes `filters` at QoS 1.
    pub fn subscribe(&mut self, packet_id: u16, filters: &[&str]) -> SubAck {
        self.subscribe_qos(packet_id, filters, QoS::AtLeastOnce)
    }

    pub fn subscribe_qos(&mut self, packet_id: u16, filters: &[impl AsRef<str>], qos: QoS) -> SubAck {
        self.send(&Packet::Subscribe(Subscribe {
            packet_id,
            filters: filters
                .iter()
                .map(|f| SubscriptionRequest {
                    filter: f.as_ref().to_owned(),
                    qos,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                })
                .collect(),
            subscription_identifier: None,
            user_properties: Vec::new(),
        }));
        match self.recv() {
            Some(Packet::SubAck(a)) => a,
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }
}

/// Encodes packets back to back, as one write would carry them.
pub fn bytes_of(version: ProtocolVersion, packets: &[Packet]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for p in packets {
        encode(p, version, &mut out).unwrap();
    }
    out.to_vec()
}

/// A raw MQTT client over WebSocket (`ws://127.0.0.1:port/mqtt`, subprotocol `mqtt`):
/// each `send_raw` is one binary WebSocket message.
pub struct WsRaw {
    ws: tungstenite::WebSocket<std::net::TcpStream>,
    version: ProtocolVersion,
    buf: BytesMut,
}

impl WsRaw {
    pub fn open(port: u16, version: ProtocolVersion) -> Self {
        use tungstenite::client::IntoClientRequest;
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = format!("ws://127.0.0.1:{port}/mqtt").into_client_request().unwrap();
        req.headers_mut().insert("Sec-WebSocket-Protocol", "mqtt".parse().unwrap());
        let (ws, _) = tungstenite::client(req, stream).unwrap();
        Self { ws, version, buf: BytesMut::new() }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.ws.send(tungstenite::Message::Binary(bytes.to_vec().into())).unwrap();
    }

    /// The next packet, or None when the server closed the connection.
    pub fn recv(&mut self) -> Option<Packet> {
        loop {
            if let Some(p) = decode(&mut self.buf, self.version, 1 << 24).unwrap() {
                return Some(p);
            }
            match self.ws.read() {
                Ok(tungstenite::Message::Binary(b)) => self.buf.extend_from_slice(&b),
                Ok(tungstenite::Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}
