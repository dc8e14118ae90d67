//! `ota-download` against the real `gridlinks` binary: devices download a package in
//! chunks over MQTT and every byte matches.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::run_scenario;

#[test]
fn every_device_gets_the_whole_package() {
    let args = ["ota-download", "--devices", "12", "--package-bytes", "50000", "--chunk-bytes", "4096"];
    let (text, run) = run_scenario("ota-download", &args);
    assert_eq!((run["devices"].as_u64(), run["complete"].as_u64()), (Some(12), Some(12)), "{run}");
    assert!(run["first_error"].is_null(), "{run}");
    // 13 chunks per device, each timed.
    assert_eq!(run["chunk_latency"]["count"], 12 * 13, "{run}");
    assert!(text.contains("complete 12/12"), "{text}");
}
