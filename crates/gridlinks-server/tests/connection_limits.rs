//! Connections as an abusive or broken client would hold them: idle keep-alive sockets,
//! half-sent requests (slowloris), trickled bodies, silent WebSocket sockets, one token
//! opening connection after connection, more connections than the process has files for.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::mqtt::*;
use common::*;

const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

fn tcp(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads until the server closes the socket; what it sent and how long that took.
fn until_closed(s: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
        assert!(started.elapsed() < Duration::from_secs(9), "the server kept the socket open");
    }
    (String::from_utf8_lossy(&out).into_owned(), started.elapsed())
}

#[test]
fn idle_slow_and_silent_http_connections_are_closed() {
    let s = Server::start_env(&[
        ("GRIDLINKS_HTTP_HEADER_READ_TIMEOUT", "600"),
        ("GRIDLINKS_HTTP_BODY_READ_TIMEOUT", "600"),
        ("GRIDLINKS_MQTT_CONNECT_TIMEOUT", "600"),
    ]);
    busy_device(&s);
    let port: u16 = s.base.rsplit(':').next().unwrap().parse().unwrap();
    // An idle keep-alive connection, after one request.
    let mut idle = tcp(port);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (answer, took) = until_closed(&mut idle);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(took >= Duration::from_millis(500), "closed after {took:?}, before the idle timeout");
    // 200 slowloris sockets: half a header each, then silence.
    let mut slow: Vec<TcpStream> = (0..200).map(|_| tcp(port)).collect();
    for c in &mut slow {
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
    }
    for c in &mut slow {
        until_closed(c);
    }
    // A body that never completes: 408, then closed.
    let mut trickle = tcp(port);
    trickle.write_all(b"POST /api/v1/TOKEN/telemetry HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"t\":").unwrap();
    let (answer, _) = until_closed(&mut trickle);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // A WebSocket socket that never asks for the upgrade.
    let mut ws = tcp(s.ws_port);
    until_closed(&mut ws);
    // The server still answers.
    assert_eq!(s.req("GET", "/healthz", None, None).0, 200);
}

/// A connection to the HTTP port from source address `src` (any 127.x.y.z is this host).
fn tcp_from(src: &str, port: u16) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&format!("{src}:0").parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    sock.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into()).unwrap();
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// A connection that made one request and keeps the connection (idle keep-alive).
fn idle_from(src: &str, port: u16) -> TcpStream {
    let mut c = tcp_from(src, port);
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let answer = response_head(&mut c);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    c
}

/// A device whose token `busy_from` and the trickling body use: an unknown token is
/// answered 401 before its body is read.
fn busy_device(s: &Server) {
    s.device(&s.login(), "busy", "TOKEN");
}

/// A connection in the middle of a request: its handler is waiting for the body (the
/// `100 Continue` says the handler runs).
fn busy_from(src: &str, port: u16) -> TcpStream {
    let mut c = tcp_from(src, port);
    c.write_all(b"POST /api/v1/TOKEN/telemetry HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n").unwrap();
    let answer = response_head(&mut c);
    assert!(answer.starts_with("HTTP/1.1 100"), "{answer}");
    c
}

fn healthz_from(src: &str, port: u16) -> String {
    let mut c = tcp_from(src, port);
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    response_head(&mut c)
}

/// At `http.max_connections` a new connection takes the place of the longest-idle one;
/// only when every connection is in the middle of a request is it refused with a 503 that
/// names the setting.
#[test]
fn http_connections_at_the_limit_replace_idle_ones_and_get_503_only_when_all_are_busy() {
    let s = Server::start_env(&[("GRIDLINKS_HTTP_MAX_CONNECTIONS", "4")]);
    busy_device(&s);
    let port: u16 = s.base.rsplit(':').next().unwrap().parse().unwrap();
    let mut busy: Vec<TcpStream> = (0..4).map(|_| busy_from("127.0.0.1", port)).collect();
    let answer = healthz_from("127.0.0.1", port);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("http.max_connections"), "{answer}");
    // One request completes (its body is short: 400); its connection is idle now, and the
    // next connection takes its place.
    busy[0].write_all(&[b' '; 100]).unwrap();
    let answer = response_head(&mut busy[0]);
    assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
    assert!(healthz_from("127.0.0.1", port).starts_with("HTTP/1.1 200"));
    let (_, _) = until_closed(&mut busy[0]);
}

/// One address holding idle keep-alive connections by the hundred locks nobody out: the
/// connections beyond the bounds make way (an issue's probe: 520 idle connections from one
/// address got every other client 503). An address whose connections are all busy gets
/// 503 at `http.max_connections_per_address`, and other addresses still get served.
#[test]
fn one_address_cannot_lock_others_out_of_http() {
    let s = Server::start_env(&[
        ("GRIDLINKS_HTTP_MAX_CONNECTIONS", "16"),
        ("GRIDLINKS_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "3"),
    ]);
    busy_device(&s);
    let port: u16 = s.base.rsplit(':').next().unwrap().parse().unwrap();
    // Idle keep-alive connections from one address, far past both bounds.
    let idle: Vec<TcpStream> = (0..40).map(|_| idle_from("127.0.0.2", port)).collect();
    assert!(healthz_from("127.0.0.3", port).starts_with("HTTP/1.1 200"));
    // The address keeps at most 3 of them: the older ones were closed.
    let mut closed = 0;
    for mut c in idle {
        c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        if matches!(c.read(&mut [0u8; 1]), Ok(0)) {
            closed += 1;
        }
    }
    assert!(closed >= 37, "only {closed} of 40 idle connections were closed");
    // Busy connections are not closed: the address's next one is refused, others served.
    let _busy: Vec<TcpStream> = (0..3).map(|_| busy_from("127.0.0.4", port)).collect();
    let answer = healthz_from("127.0.0.4", port);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("http.max_connections_per_address"), "{answer}");
    assert!(healthz_from("127.0.0.5", port).starts_with("HTTP/1.1 200"));
    // Loopback (a reverse proxy on this host) is not bound per address.
    let _local: Vec<TcpStream> = (0..5).map(|_| busy_from("127.0.0.1", port)).collect();
    assert!(healthz_from("127.0.0.1", port).starts_with("HTTP/1.1 200"));
}

#[test]
fn server_side_sockets_use_tcp_keepalive() {
    let s = Server::start_env(&[("GRIDLINKS_TCP_KEEPALIVE_IDLE", "7")]);
    let jwt = s.login();
    s.device(&jwt, "ka", "KA_TOKEN");
    // Keep-alive 0: only TCP keepalive would notice this client vanishing.
    let (_held, ack) = Raw::connect(s.mqtt_port, V3, Some("KA_TOKEN"), 0);
    assert_eq!(ack.code, 0);
    let out = std::process::Command::new("ss")
        .args(["-tnoH", "state", "established", &format!("( sport = :{} )", s.mqtt_port)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("timer:(keepalive,"), "no keepalive timer on the server's socket: {text}");
    // The first probe is due within the configured 7 s, not the system's 2 hours.
    assert!(!text.contains("min,"), "{text}");
}

/// One credential cannot take every connection.
#[test]
fn connections_per_credential_are_bounded() {
    let s = Server::start_env(&[("GRIDLINKS_MQTT_MAX_CONNECTIONS_PER_CREDENTIAL", "3")]);
    let jwt = s.login();
    s.device(&jwt, "d", "ONE_TOKEN");
    s.device(&jwt, "e", "OTHER_TOKEN");
    let mut held: Vec<Raw> =
        (0..3).map(|i| Raw::connect_as(s.mqtt_port, V5, &format!("c{i}"), Some("ONE_TOKEN")).0).collect();
    let (_, ack) = Raw::connect_as(s.mqtt_port, V5, "c3", Some("ONE_TOKEN"));
    assert_eq!(ack.code, reason::QUOTA_EXCEEDED);
    assert!(ack.properties.reason_string.unwrap().contains("max_connections_per_credential"));
    assert_eq!(Raw::connect_as(s.mqtt_port, V3, "c4", Some("ONE_TOKEN")).1.code, reason::V3_SERVER_UNAVAILABLE);
    // Other devices are not affected; a closed connection frees its place.
    assert_eq!(Raw::connect_as(s.mqtt_port, V5, "o", Some("OTHER_TOKEN")).1.code, 0);
    let mut gone = held.pop().unwrap();
    gone.disconnect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Raw::connect_as(s.mqtt_port, V5, "c5", Some("ONE_TOKEN")).1.code != 0 {
        assert!(Instant::now() < deadline, "the closed connection's place was not freed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The MQTT connection limit is derived from the open-files limit; past it clients are
/// told why, and HTTP (`/healthz`) keeps working.
#[test]
fn the_mqtt_limit_follows_the_open_files_limit_and_leaves_room_for_http() {
    // 1,100 files less http.max_connections (64 here) and the 512 reserve: 524 connections.
    let s = Server::start_with_nofile(
        &[("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"), ("GRIDLINKS_HTTP_MAX_CONNECTIONS", "64")],
        1100,
    );
    let limit = 1100 - 64 - 512;
    let held: Vec<Raw> = (0..limit)
        .map(|i| {
            let (c, ack) = Raw::connect_as(s.mqtt_port, V3, &format!("c{i}"), None);
            assert_eq!(ack.code, 0, "connection {i}");
            c
        })
        .collect();
    let (_, ack) = Raw::connect_as(s.mqtt_port, V5, "over", None);
    assert_eq!(ack.code, reason::QUOTA_EXCEEDED);
    assert!(ack.properties.reason_string.unwrap().contains("mqtt.max_connections"));
    assert_eq!(Raw::connect_as(s.mqtt_port, V3, "over3", None).1.code, reason::V3_SERVER_UNAVAILABLE);
    for _ in 0..20 {
        assert_eq!(s.req("GET", "/healthz", None, None).0, 200);
    }
    let (_, metrics) = s.req("GET", "/metrics", None, None);
    assert!(
        metrics.lines().any(|l| l.starts_with("gridlinks_mqtt_over_limit_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
    drop(held);
}

/// New connections per source address (`mqtt.max_connects_per_address`, its burst): past
/// them a client is told why in CONNACK (MQTT 5: 0x9F with the setting's name; 3.1.1:
/// 0x03) and closed; another address is not affected (loopback is exempt by default, so
/// the test counts it).
#[test]
fn new_connections_per_address_are_rate_limited() {
    use common::mqtt::*;
    let s = Server::start_env(&[
        ("GRIDLINKS_MQTT_MAX_CONNECTS_PER_ADDRESS", "1"),
        ("GRIDLINKS_MQTT_CONNECT_BURST_PER_ADDRESS", "3"),
        ("GRIDLINKS_MQTT_CONNECT_RATE_EXEMPT_LOOPBACK", "false"),
        ("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"),
    ]);
    // Connect until refused: the burst of 3 comes in, then at most one more per second
    // passes (a busy machine may take seconds over it; the bound allows for that).
    let started = Instant::now();
    let mut held = Vec::new();
    let refusal = loop {
        let (c, ack) = Raw::connect_as(s.mqtt_port, ProtocolVersion::V5, &format!("burst-{}", held.len()), None);
        if ack.code != 0 {
            break ack;
        }
        held.push(c);
        assert!(held.len() < 100, "never refused");
    };
    assert!(held.len() >= 3, "the burst is admitted: {}", held.len());
    assert!(held.len() as u64 <= 3 + started.elapsed().as_secs() + 1, "{} admitted", held.len());
    assert_eq!(refusal.code, reason::CONNECTION_RATE_EXCEEDED);
    assert!(refusal.properties.reason_string.unwrap_or_default().contains("mqtt.max_connects_per_address"));
    let v3 = loop {
        let (_, ack) = Raw::connect_as(s.mqtt_port, ProtocolVersion::V3_1_1, "over-3", None);
        if ack.code != 0 {
            break ack.code;
        }
    };
    assert_eq!(v3, reason::V3_SERVER_UNAVAILABLE);
    let (_, metrics) = s.req("GET", "/metrics", None, None);
    let refused = metrics.lines().find_map(|l| l.strip_prefix("gridlinks_mqtt_over_connect_rate_total ")).unwrap();
    assert!(refused.parse::<u64>().unwrap() >= 2, "{refused}");
    // The connections admitted are served.
    held[0].publish("anywhere/x", b"1", QoS::AtLeastOnce, Some(1));
    assert!(matches!(held[0].recv(), Some(Packet::PubAck(_))));
}
