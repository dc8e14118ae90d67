//! What the tool's tests share: the real `gridlinks` server started on free loopback
//! ports in its own data directory, and the bench binary run against it.
//!
//! The server binary comes from `GRIDLINKS_BIN`, by default `gridlinks` in the target
//! directory the test was built into (`cargo build -p gridlinks-server --bin gridlinks`,
//! or `cargo test --workspace`, puts it there).

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gridlinks_bench::rest_api::{ApiTarget, RestClient};
use serde_json::Value;

pub const BENCH: &str = env!("CARGO_BIN_EXE_gridlinks-bench");
pub const PASSWORD: &str = "pw";

/// The server binary: `GRIDLINKS_BIN`, else `<target>/debug/gridlinks` next to this
/// test's `deps/` directory. Panics naming `GRIDLINKS_BIN` when it does not exist.
pub fn server_bin() -> PathBuf {
    let path = match std::env::var_os("GRIDLINKS_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("test binary path");
            // <target>/debug/deps/loss_check-HASH -> <target>/debug/gridlinks
            exe.parent().and_then(Path::parent).expect("test binary lives in <target>/<profile>/deps").join("gridlinks")
        }
    };
    assert!(
        path.is_file(),
        "gridlinks server binary not found at {}: build it (cargo build -p gridlinks-server \
         --bin gridlinks) or set GRIDLINKS_BIN to its path",
        path.display()
    );
    path
}

/// A free local port, outside the ephemeral range that client sockets use.
pub fn free_port() -> u16 {
    gridlinks_bench::servers::free_port().unwrap()
}

/// A running `gridlinks serve` in its own data directory; killed on drop.
pub struct Server {
    child: Child,
    pub dir: PathBuf,
    pub http: u16,
    pub mqtt: u16,
}

impl Server {
    pub fn start(name: &str) -> Server {
        Self::start_with(name, &[])
    }

    /// [`Server::start`] with these environment variables (configuration overrides).
    pub fn start_with(name: &str, env: &[(&str, &str)]) -> Server {
        let bin = server_bin();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("loss-check-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (http, mqtt) = (free_port(), free_port());
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = Command::new(&bin)
            .args(["serve", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--http-bind", &format!("127.0.0.1:{http}")])
            .args(["--mqtt-bind", &format!("127.0.0.1:{mqtt}")])
            .args(["--coap-bind", ""])
            .args(["--mqtt-ws-bind", ""])
            .env("GRIDLINKS_ADMIN_PASSWORD", PASSWORD)
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut server = Server { child, dir, http, mqtt };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("{}/healthz", self.api());
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("server exited with {status}: {}", self.log());
            }
            if ureq::get(&url).call().is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("server not ready within 30 s: {}", self.log());
    }

    pub fn api(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn client(&self) -> RestClient {
        RestClient::login(&ApiTarget { base: self.api(), user: "admin".into(), password: PASSWORD.into() }).unwrap()
    }

    /// Runs the bench binary with `args` plus this server's MQTT and REST options.
    pub fn bench(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(BENCH);
        cmd.args(args).args(["--api", &self.api(), "--api-password", PASSWORD]).stdin(Stdio::null());
        if matches!(args[0], "mqtt-telemetry" | "alarm-latency") {
            cmd.args(["--port", &self.mqtt.to_string()]);
        }
        output(cmd, args)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the bench binary with `args` alone (the tool starts its own servers).
pub fn run_bench(args: &[&str]) -> Output {
    let mut cmd = Command::new(BENCH);
    cmd.args(args).stdin(Stdio::null());
    output(cmd, args)
}

/// Runs the bench binary with `args` and its temporary directory (where it starts
/// servers) set to `tmp`.
pub fn run_bench_in(tmp: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(BENCH);
    cmd.args(args).env("TMPDIR", tmp).stdin(Stdio::null());
    output(cmd, args)
}

/// Runs `cmd` (the bench binary with `args`) and shows its output in the test log.
fn output(mut cmd: Command, args: &[&str]) -> Output {
    let out = cmd.output().unwrap();
    eprintln!(
        "--- gridlinks-bench {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the scenario `args` against the built `gridlinks`, its JSON report in a fresh
/// scratch directory `name`; asserts it exits 0. Its stdout and its report.
pub fn run_scenario(name: &str, args: &[&str]) -> (String, Value) {
    let json = scratch(name).join("result.json");
    let bin = server_bin();
    let mut all = args.to_vec();
    all.extend(["--gridlinks-bin", bin.to_str().unwrap(), "--json", json.to_str().unwrap()]);
    let out = run_bench(&all);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    (stdout(&out), read_json(&json))
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
