//! `coap-telemetry` against the real `gridlinks` binary: devices post over CoAP, at full
//! speed and at a fixed rate, and every acknowledged point is stored.
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
        let acked = run["acked"].as_u64().unwrap();
        assert_eq!(run["loss_check"]["missing"], 0, "{run}");
        assert!(run["loss_check"]["points_acked"].as_u64().unwrap() >= acked, "{run}");
        if rate == "300" {
            // 300/s for 1.5 s: about 450, whatever the machine.
            assert!((350..=470).contains(&acked), "{run}");
        } else {
            assert!(acked > 0, "{run}");
        }
    }
}
