//! `lamp-tcp` against the real `gridlinks` binary: controllers log in and report through
//! the native decoder and the shipped script, at full speed and at a fixed rate; every
//! answered report is stored (the loss check reads the stored sequence numbers back).
//!
//! Nothing here depends on how fast the machine is: the counts checked are those of
//! reports sent and answered (however late), not of replies inside the phase's window.
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
            let (sent, answered, replies) =
                (run["sent"].as_u64().unwrap(), run["answered"].as_u64().unwrap(), run["replies"].as_u64().unwrap());
            // Every report was answered, each answer is a stored point, and the replies
            // counted inside the window are some of them.
            assert!(sent >= 20, "each controller reports at least once: {run}");
            assert_eq!(answered, sent, "{run}");
            assert!(replies <= answered, "{run}");
            assert_eq!(run["loss_check"]["missing"], 0, "{run}");
            assert_eq!(run["loss_check"]["points_acked"].as_u64().unwrap(), answered, "{run}");
            if rate == "400" {
                // 400/s for 1.5 s: 600 reports are due before the end, and each is sent
                // however late the machine gets to it (±1 for rounding at the boundary).
                assert!((590..=610).contains(&sent), "{run}");
            }
        }
    }
}
