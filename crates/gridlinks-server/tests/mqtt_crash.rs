//! kill -9 under MQTT load: every PUBACKed point is present after restart.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::mqtt::*;
use common::*;

const DEVICES: usize = 16;
const WINDOW: u16 = 8;

/// Publishes QoS 1 with up to WINDOW in flight until the connection dies, counting
/// PUBACKs in `acks`; returns the timestamps whose PUBACK arrived.
fn publisher(port: u16, token: String, stop: Arc<AtomicBool>, acks: Arc<AtomicUsize>) -> Vec<i64> {
    let (mut c, ack) = Raw::connect(port, ProtocolVersion::V3_1_1, Some(&token), 60);
    assert_eq!(ack.code, 0);
    c.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut in_flight: HashMap<u16, i64> = HashMap::new();
    let mut acked = Vec::new();
    let mut ts = 0i64;
    let mut pid: u16 = 0;
    'outer: loop {
        while in_flight.len() < usize::from(WINDOW) && !stop.load(Ordering::Relaxed) {
            ts += 1;
            pid = pid % 60000 + 1;
            let body = format!(r#"{{"ts":{ts},"values":{{"seq":{ts}}}}}"#);
            let p = publish_packet("v1/devices/me/telemetry", body.as_bytes(), QoS::AtLeastOnce, Some(pid));
            if c.try_send(&p).is_err() {
                break 'outer;
            }
            in_flight.insert(pid, ts);
        }
        match c.try_recv() {
            Ok(Some(Packet::PubAck(a))) => {
                if let Some(ts) = in_flight.remove(&a.packet_id) {
                    acked.push(ts);
                    acks.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(Some(other)) => panic!("unexpected {other:?}"),
            Ok(None) | Err(_) => break,
        }
        if stop.load(Ordering::Relaxed) && in_flight.is_empty() {
            break;
        }
    }
    acked
}

#[test]
fn kill_9_under_mqtt_load_loses_no_puback_point() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    let ids: Vec<String> = (0..DEVICES).map(|d| s.device(&jwt, &format!("m{d}"), &format!("MQ{d}"))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicUsize::new(0));
    let port = s.mqtt_port;
    let workers: Vec<_> = (0..DEVICES)
        .map(|d| {
            let (stop, acks) = (stop.clone(), acks.clone());
            std::thread::spawn(move || publisher(port, format!("MQ{d}"), stop, acks))
        })
        .collect();
    // Killed under load once a good number of PUBACKs arrived (a count, not a guessed
    // time, so a slow machine only takes longer).
    wait_until("2,000 PUBACKs", || acks.load(Ordering::Relaxed) > 2_000);
    s.kill9();
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<Vec<i64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let total: usize = acked.iter().map(Vec::len).sum();
    assert!(total > 500, "only {total} PUBACKs before the kill");
    let s = Server::start_on(&dir, &[]);
    s.assert_all_stored(&ids, &acked, "seq");
    eprintln!("kill -9 under MQTT load: all {total} PUBACKed points present after restart");
}

#[test]
fn sigterm_with_mqtt_clients_acks_in_flight_and_says_goodbye() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let jwt = s.login();
    let ids: Vec<String> = (0..4).map(|d| s.device(&jwt, &format!("t{d}"), &format!("MQ{d}"))).collect();
    let (mut idle, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("MQ0"), 60);
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicUsize::new(0));
    let port = s.mqtt_port;
    let workers: Vec<_> = (0..4)
        .map(|d| {
            let (stop, acks) = (stop.clone(), acks.clone());
            std::thread::spawn(move || publisher(port, format!("MQ{d}"), stop, acks))
        })
        .collect();
    wait_until("PUBACKs from every publisher's first window", || {
        acks.load(Ordering::Relaxed) > 4 * usize::from(WINDOW)
    });
    let started = std::time::Instant::now();
    let status = s.sigterm();
    stop.store(true, Ordering::Relaxed);
    assert!(status.success(), "exit status {status}");
    // A hang guard: the drain is bounded, but a busy machine may take a while.
    assert!(started.elapsed() < PATIENCE, "shutdown took {:?}", started.elapsed());
    let (d, _) = idle.expect_close();
    assert_eq!(d.map(|d| d.reason), Some(0x8B), "MQTT 5 clients are told the server is shutting down");
    let acked: Vec<Vec<i64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let s = Server::start_on(&dir, &[]);
    s.assert_all_stored(&ids, &acked, "seq");
}
