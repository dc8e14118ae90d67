//! `provision` against the real `gridlinks` binary: devices provision themselves into
//! several profiles (each in its own tenant, too), and every returned token works.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::{read_json, run_bench, scratch, server_bin, stdout};

#[test]
fn every_device_provisions_and_its_token_works() {
    provision(&[]);
}

#[test]
fn every_device_provisions_into_its_tenant_and_its_token_works() {
    let run = provision(&["--tenants"]);
    assert_eq!(run["tenants"], true, "{run}");
}

fn provision(extra: &[&str]) -> serde_json::Value {
    let dir = scratch(if extra.is_empty() { "provision" } else { "provision-tenants" });
    let json = dir.join("result.json");
    let bin = server_bin();
    let mut args = vec![
        "provision",
        "--profiles",
        "3",
        "--devices-per-profile",
        "20",
        "--connections",
        "4",
        "--gridlinks-bin",
        bin.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = run_bench(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let run = read_json(&json)["run"].clone();
    assert_eq!((run["devices"].as_u64(), run["provisioned"].as_u64()), (Some(60), Some(60)), "{run}");
    assert_eq!(run["tokens_working"], 60, "{run}");
    assert_eq!(run["refused"], 0, "{run}");
    assert!(run["devices_per_second"].as_f64().unwrap() > 0.0, "{run}");
    run
}
