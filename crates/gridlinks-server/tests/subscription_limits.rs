//! Subscriptions as a flood: a session's subscriptions are bounded with a clear SUBACK
//! reason, and the memory of a huge routing table goes back when its client leaves.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::time::{Duration, Instant};

use common::mqtt::*;
use common::*;

const V3: ProtocolVersion = ProtocolVersion::V3_1_1;
const V5: ProtocolVersion = ProtocolVersion::V5;

/// One SUBSCRIBE with `filters` at QoS 0; the SUBACK.
fn subscribe(c: &mut Raw, packet_id: u16, filters: impl Iterator<Item = String>) -> SubAck {
    c.subscribe_qos(packet_id, &filters.collect::<Vec<_>>(), QoS::AtMostOnce)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn subscriptions_per_session_are_bounded() {
    let s = Server::start_env(&[
        ("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"),
        ("GRIDLINKS_MQTT_MAX_SUBSCRIPTIONS_PER_CLIENT", "100"),
    ]);
    let jwt = s.login();
    s.device(&jwt, "d", "SUB_TOKEN");
    let (mut app, _) = Raw::connect_as(s.mqtt_port, V5, "app", None);
    let ack = subscribe(&mut app, 1, (0..100).map(|i| format!("t/{i}")));
    assert!(ack.return_codes.iter().all(|c| *c == 0));
    let ack = subscribe(&mut app, 2, ["t/0".to_owned(), "t/new".to_owned()].into_iter());
    assert_eq!(ack.return_codes, [0, reason::QUOTA_EXCEEDED], "a filter it has is replaced; a new one is refused");
    assert!(ack.reason_string.unwrap().contains("max_subscriptions_per_client"));
    let (mut v3, _) = Raw::connect_as(s.mqtt_port, V3, "app3", None);
    let ack = subscribe(&mut v3, 1, (0..101).map(|i| format!("u/{i}")));
    assert_eq!(ack.return_codes[100], reason::V3_SUBSCRIPTION_FAILURE);
    // Devices too.
    let (mut dev, _) = Raw::connect(s.mqtt_port, V5, Some("SUB_TOKEN"), 60);
    let ack = subscribe(&mut dev, 1, (0..101).map(|i| format!("v1/devices/me/attributes/{i}")));
    assert_eq!(ack.return_codes[99], 0);
    assert_eq!(ack.return_codes[100], reason::QUOTA_EXCEEDED);
}

#[test]
fn the_routing_table_gives_its_memory_back_when_the_client_leaves() {
    let n = 100_000;
    let s = Server::start_env(&[
        ("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true"),
        ("GRIDLINKS_MQTT_MAX_SUBSCRIPTIONS_PER_CLIENT", "0"),
    ]);
    let pid = s.child.id();
    let baseline = rss_kib(pid);
    let (mut c, _) = Raw::connect_as(s.mqtt_port, V5, "flood", None);
    for batch in 0..n / 1000 {
        let ack = subscribe(
            &mut c,
            batch as u16 + 1,
            (batch * 1000..(batch + 1) * 1000).map(|i| format!("flood/{i}/level/{i}")),
        );
        assert!(ack.return_codes.iter().all(|c| *c == 0));
    }
    let peak = rss_kib(pid);
    let grown = peak.saturating_sub(baseline);
    assert!(grown > 20 * 1024, "{n} subscriptions should take memory: {baseline} -> {peak} KiB");
    c.disconnect();
    // Freed memory goes back to the OS within moments (mimalloc purges freed pages); the
    // wait ends as soon as it has, 60 s is a hang guard.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut now = rss_kib(pid);
    while now > baseline + grown / 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        now = rss_kib(pid);
    }
    eprintln!("RSS {baseline} KiB -> {peak} KiB with {n} subscriptions -> {now} KiB after the client left");
    assert!(
        now <= baseline + grown / 4,
        "RSS {baseline} KiB -> {peak} KiB with {n} subscriptions -> {now} KiB after the client left"
    );
}
