//! Durability: kill -9 in the middle of concurrent ingest loses no acknowledged point;
//! SIGTERM drains in order and loses nothing.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

const CLIENTS: usize = 16;

/// Posts increasing timestamps from `first_ts` on from CLIENTS devices until `stop`,
/// counting answers in `acks`; returns per-device the timestamps that got 200.
fn load(
    base: &str,
    first_ts: i64,
    stop: Arc<AtomicBool>,
    acks: Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<Vec<i64>>> {
    (0..CLIENTS)
        .map(|c| {
            let base = base.to_owned();
            let stop = stop.clone();
            let acks = acks.clone();
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build();
                let mut acked = Vec::new();
                let mut ts = first_ts;
                while !stop.load(Ordering::Relaxed) {
                    let body = format!(r#"{{"ts":{ts},"values":{{"seq":{ts},"c":{c}}}}}"#);
                    match agent.post(&format!("{base}/api/v1/CRASH{c}/telemetry")).send_string(&body) {
                        Ok(r) if r.status() == 200 => {
                            acked.push(ts);
                            acks.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) | Err(_) => {
                            // The server is gone (or refused): this point is not acknowledged.
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                    ts += 1;
                }
                acked
            })
        })
        .collect()
}

fn provision(s: &Server) -> (String, Vec<String>) {
    let jwt = s.login();
    let ids = (0..CLIENTS).map(|c| s.device(&jwt, &format!("crash-{c}"), &format!("CRASH{c}"))).collect();
    (jwt, ids)
}

#[test]
fn kill_9_under_load_loses_no_acknowledged_point() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let (_, ids) = provision(&s);
    let mut all: Vec<Vec<i64>> = vec![Vec::new(); CLIENTS];
    // Twice: the second round appends to the journal that the first restart recovered
    // (and cut back to its last whole batch), and must land where the next recovery reads.
    for round in 0..2 {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(AtomicUsize::new(0));
        let workers = load(&s.base, 1 + round * 1_000_000, stop.clone(), acks.clone());
        // Killed under load: once a good number of points are acknowledged (a count,
        // not a guessed time, so a slow machine only takes longer).
        wait_until("1,000 acknowledged points", || acks.load(Ordering::Relaxed) > 1_000);
        s.kill9();
        stop.store(true, Ordering::Relaxed);
        let acked: Vec<Vec<i64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let n: usize = acked.iter().map(Vec::len).sum();
        assert!(n > 100, "round {round}: load generator got only {n} acks before the kill");
        for (a, b) in all.iter_mut().zip(acked) {
            a.extend(b);
        }
        s = Server::start_on(&dir, &[]);
    }
    s.assert_all_stored(&ids, &all, "seq");
    let n: usize = all.iter().map(Vec::len).sum();
    eprintln!("kill -9 twice: all {n} acknowledged points present after the restarts");
}

#[test]
fn sigterm_drains_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &[]);
    let (_, ids) = provision(&s);
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicUsize::new(0));
    let workers = load(&s.base, 1, stop.clone(), acks.clone());
    wait_until("50 acknowledged points", || acks.load(Ordering::Relaxed) > 50);
    let status = s.sigterm();
    stop.store(true, Ordering::Relaxed);
    assert!(status.success(), "gridlinks exited with {status} on SIGTERM");
    let acked: Vec<Vec<i64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let n: usize = acked.iter().map(Vec::len).sum();
    assert!(n > 50);
    let s = Server::start_on(&dir, &[]);
    s.assert_all_stored(&ids, &acked, "seq");
}
