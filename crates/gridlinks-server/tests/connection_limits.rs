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

#[test]
fn http_connections_over_the_limit_get_a_clear_503() {
    let s = Server::start_env(&[("GRIDLINKS_HTTP_MAX_CONNECTIONS", "4")]);
    let port: u16 = s.base.rsplit(':').next().unwrap().parse().unwrap();
    let held: Vec<TcpStream> = (0..4).map(|_| tcp(port)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut over = tcp(port);
    let (answer, _) = until_closed(&mut over);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("http.max_connections"), "{answer}");
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.req("GET", "/healthz", None, None).0, 200);
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
