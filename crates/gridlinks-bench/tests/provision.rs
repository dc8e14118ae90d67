//! `provision` against the real `gridlinks` binary: devices provision themselves into
//! several profiles (each in its own tenant, too), and every returned token works.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::run_scenario;

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
    let mut args = vec!["provision", "--profiles", "3", "--devices-per-profile", "20", "--connections", "4"];
    args.extend_from_slice(extra);
    let name = if extra.is_empty() { "provision" } else { "provision-tenants" };
    let run = run_scenario(name, &args).1["run"].clone();
    assert_eq!((run["devices"].as_u64(), run["provisioned"].as_u64()), (Some(60), Some(60)), "{run}");
    assert_eq!(run["tokens_working"], 60, "{run}");
    assert_eq!(run["refused"], 0, "{run}");
    assert!(run["devices_per_second"].as_f64().unwrap() > 0.0, "{run}");
    run
}
