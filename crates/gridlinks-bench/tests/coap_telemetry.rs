//! `coap-telemetry` against the real `gridlinks` binary: devices post over CoAP, at full
//! speed and at a fixed rate, and every acknowledged point is stored.
//!
//! Nothing here depends on how fast the machine is: the counts checked are those of
//! requests sent and answered (however late), not of answers inside the load's window.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::run_scenario;

#[test]
fn every_acknowledged_coap_post_is_stored() {
    for rate in ["0", "300"] {
        let args = ["coap-telemetry", "--devices", "20", "--duration", "1500ms", "--rate", rate, "--verify"];
        let (out, r) = run_scenario("coap-telemetry", &args);
        assert!(out.contains("LOSS CHECK PASSED"), "{out}");
        let run = &r["run"];
        assert_eq!(run["failed"], 0, "{run}");
        let (sent, answered, acked) =
            (run["sent"].as_u64().unwrap(), run["answered"].as_u64().unwrap(), run["acked"].as_u64().unwrap());
        // Every request was answered, each answer is a stored point, and the answers
        // counted inside the window are some of them.
        assert_eq!(answered, sent, "{run}");
        assert!(acked <= answered, "{run}");
        assert_eq!(run["loss_check"]["missing"], 0, "{run}");
        assert_eq!(run["loss_check"]["points_acked"].as_u64().unwrap(), answered, "{run}");
        if rate == "300" {
            // 300/s for 1.5 s: 450 requests are due before the end, and each is sent
            // however late the machine gets to it (±1 for rounding at the boundary).
            assert!((440..=460).contains(&sent), "{run}");
        } else {
            assert!(sent >= 20, "each device sends at least once: {run}");
        }
    }
}
