//! The `gridlinks config` commands and start-up refusals.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::process::Command;

fn gridlinks() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gridlinks"))
}

#[test]
fn config_default_prints_commented_toml_that_checks_ok() {
    let out = gridlinks().args(["config", "default"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("bind = \"0.0.0.0:8080\"") && text.contains("# "));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("g.toml");
    std::fs::write(&p, &text).unwrap();
    let out = gridlinks().args(["config", "check"]).arg(&p).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn config_check_rejects_unknown_fields_and_bad_values() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, "[storage]\nfsynk = true\n").unwrap();
    let out = gridlinks().args(["config", "check"]).arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fsynk"));
    std::fs::write(&p, "[http]\nbind = \"localhost\"\n").unwrap();
    let out = gridlinks().args(["config", "check"]).arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("http.bind"));
    std::fs::write(&p, "").unwrap();
    let out = gridlinks().args(["config", "check"]).arg(&p).env("GRIDLINKS_STORAGE_CACHE_MB", "many").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn first_start_without_password_generates_and_prints_one_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let run = || {
        let mut child = gridlinks()
            .args(["serve", "--data-dir"])
            .arg(&data)
            .args(["--http-bind", &format!("127.0.0.1:{port}")])
            .args(["--mqtt-bind", "127.0.0.1:0", "--coap-bind", "127.0.0.1:0"])
            .env_remove("GRIDLINKS_ADMIN_PASSWORD")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}/healthz");
        for _ in 0..200 {
            if ureq::get(&url).call().is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        child.wait().unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
        out
    };
    let first = run();
    let pw = first.split("'admin': ").nth(1).and_then(|r| r.split_whitespace().next()).expect(&first).to_owned();
    assert_eq!(pw.len(), 20);
    let second = run();
    assert!(!second.contains(&pw), "password printed again");
}
