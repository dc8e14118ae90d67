//! The loss check against the real `gridlinks` server: a clean run passes with every
//! acknowledged point found; points deleted through the REST API fail the check with
//! exit code 2 and exactly the deleted count missing.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::{read_json, stdout, Server};
use gridlinks_bench::loss_check::{self, SEQ_KEY};

#[test]
fn clean_run_passes_with_every_acked_point_found() {
    let server = Server::start("clean");
    let json = server.dir.join("result.json");
    let out = server.bench(&[
        "mqtt-telemetry",
        "--devices",
        "50",
        "--duration",
        "3s",
        "--provision",
        "--verify",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("LOSS CHECK PASSED"));
    let result = read_json(&json);
    let check = &result["loss_check"];
    assert_eq!(result["connected"], 50);
    assert_eq!(result["failed"], 0);
    assert!(result["acked"].as_u64().unwrap() > 0);
    assert_eq!(check["passed"], true);
    assert_eq!(check["devices_checked"], 50);
    assert_eq!(check["points_acked"], result["acked"]);
    assert_eq!(check["points_found"], result["acked"]);
    assert_eq!(check["missing"], 0);
    assert_eq!(check["devices_not_found"], 0);
}

#[test]
fn deleted_points_fail_the_check() {
    let server = Server::start("deleted");
    let acks = server.dir.join("acks.json");
    let out = server.bench(&[
        "mqtt-telemetry",
        "--devices",
        "5",
        "--duration",
        "2s",
        "--provision",
        "--save-acks",
        acks.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!stdout(&out).contains("LOSS CHECK"), "no check without --verify");

    // Nothing deleted yet: the saved acks verify clean.
    let out = server.bench(&["verify", "--acks", acks.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("LOSS CHECK PASSED"));

    // Delete a slice of two devices' points through the real REST API, counting what
    // actually went (stored before minus stored after).
    let devices = loss_check::load(&acks).unwrap();
    let client = server.client();
    let mut deleted = 0;
    for (device, (from, to)) in [(1usize, (10usize, 17usize)), (3, (0, 4))] {
        let ts = &devices[device].acks.ts;
        assert!(ts.len() > to, "device {device} acked only {} points", ts.len());
        let id = client.device_id(&devices[device].name).unwrap().unwrap();
        let (first, end) = (ts[0], ts[ts.len() - 1] + 1);
        let before = client.timestamps(&id, SEQ_KEY, first, end).unwrap().len();
        client.delete_timeseries(&id, SEQ_KEY, ts[from], ts[to]).unwrap();
        let after = client.timestamps(&id, SEQ_KEY, first, end).unwrap().len();
        assert!(after < before, "the delete removed nothing from device {device}");
        deleted += (before - after) as u64;
    }

    let json = server.dir.join("verify.json");
    let out = server.bench(&["verify", "--acks", acks.to_str().unwrap(), "--json", json.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "missing points exit with 2");
    assert!(stdout(&out).contains(&format!("LOSS CHECK FAILED: {deleted} acknowledged points missing")));
    let check = &read_json(&json)["loss_check"];
    assert_eq!(check["passed"], false);
    assert_eq!(check["missing"], deleted);
    let acked: u64 = devices.iter().map(|d| d.acks.ts.len() as u64).sum();
    assert_eq!(check["points_acked"], acked);
    assert_eq!(check["points_found"], acked - deleted);
    let examples = check["missing_examples"].as_array().unwrap();
    assert_eq!(examples.len(), 10.min(deleted as usize));
    assert_eq!(examples[0]["device"], devices[1].name.as_str());
    assert_eq!(examples[0]["ts"], devices[1].acks.ts[10]);
}
