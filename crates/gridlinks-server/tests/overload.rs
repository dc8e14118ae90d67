//! Overload is a clear 503 with Retry-After, never a silent drop: every 200 is stored.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::time::Duration;

use common::*;

#[test]
fn full_queue_answers_503_and_every_200_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    // A one-slot queue, one request per commit, no waiting for space: overload is easy to reach.
    // No device activity: its writes (the device turning active) would meet the full queue
    // too, and the refusal counter would count them beside the test's own.
    let s = Server::start_on(
        &tmp.path().join("data"),
        &[
            ("GRIDLINKS_STORAGE_QUEUE_CAPACITY", "1"),
            ("GRIDLINKS_STORAGE_MAX_BATCH_OPS", "1"),
            ("GRIDLINKS_STORAGE_ENQUEUE_TIMEOUT", "0"),
            ("GRIDLINKS_ACTIVITY_ENABLED", "false"),
        ],
    );
    let jwt = s.login();
    let id = s.device(&jwt, "busy", "BUSY");
    let workers: Vec<_> = (0..32)
        .map(|w| {
            let base = s.base.clone();
            std::thread::spawn(move || {
                let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
                let (mut ok, mut busy) = (Vec::new(), 0);
                for i in 0..40 {
                    let ts = w * 1000 + i + 1;
                    match agent
                        .post(&format!("{base}/api/v1/BUSY/telemetry"))
                        .send_string(&format!(r#"{{"ts":{ts},"values":{{"v":{ts}}}}}"#))
                    {
                        Ok(r) => {
                            assert_eq!(r.status(), 200);
                            ok.push(ts);
                        }
                        Err(ureq::Error::Status(503, r)) => {
                            assert_eq!(r.header("Retry-After"), Some("1"));
                            let body: J = serde_json::from_str(&r.into_string().unwrap()).unwrap();
                            assert!(body["message"].as_str().unwrap().contains("overloaded"), "{body}");
                            busy += 1;
                        }
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
                (ok, busy)
            })
        })
        .collect();
    let mut acked = Vec::new();
    let mut busy = 0;
    for w in workers {
        let (ok, b) = w.join().unwrap();
        acked.extend(ok);
        busy += b;
    }
    assert!(busy > 0, "the server was never overloaded; the test proves nothing");
    assert!(!acked.is_empty());
    s.assert_all_stored(&[id], &[acked.clone()], "v");
    let (_, m) = s.req("GET", "/metrics", None, None);
    assert!(m.contains(&format!("gridlinks_storage_overloaded_total {busy}")), "{m}");
    eprintln!("overload: {} acked and stored, {busy} refused with 503", acked.len());
}
