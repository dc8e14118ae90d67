//! `lamp-tcp` against the real `gridlinks` binary: controllers log in and report through
//! the native decoder and the shipped script, at full speed and at a fixed rate; every
//! answered report is stored (the loss check reads the stored sequence numbers back).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::run_scenario;

#[test]
fn both_decoders_answer_and_store_every_report() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protocols/lamp.js");
    for rate in ["0", "400"] {
        let args =
            ["lamp-tcp", "--controllers", "20", "--duration", "1500ms", "--rate", rate, "--verify", "--script", script];
        let (out, r) = run_scenario("lamp-tcp", &args);
        assert!(out.contains("LOSS CHECK PASSED"), "{out}");
        let runs = r["runs"].as_array().unwrap();
        assert_eq!(runs.iter().map(|r| r["decoder"].as_str().unwrap()).collect::<Vec<_>>(), ["native", "script"]);
        for run in runs {
            assert_eq!(run["controllers"], 20, "{run}");
            assert_eq!(run["failed"], 0, "{run}");
            let replies = run["replies"].as_u64().unwrap();
            assert!(replies > 0, "{run}");
            assert_eq!(run["loss_check"]["missing"], 0, "{run}");
            assert!(run["loss_check"]["points_acked"].as_u64().unwrap() >= replies, "{run}");
            if rate == "400" {
                // 400/s for 1.5 s: about 600 answered, whatever the machine.
                assert!((450..=650).contains(&replies), "{run}");
            }
        }
    }
}
