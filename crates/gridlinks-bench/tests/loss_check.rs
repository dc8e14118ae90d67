//! The loss check against the real `gridlinks` server: a clean run passes with every
//! acknowledged point found; points deleted through the REST API fail the check with
//! exit code 2 and exactly the deleted count missing.
//!
//! The server binary comes from `GRIDLINKS_BIN`, by default `gridlinks` in the target
//! directory this test was built into (`cargo build -p gridlinks-server --bin gridlinks`,
//! or `cargo test --workspace`, puts it there).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gridlinks_bench::loss_check::{self, SEQ_KEY};
use gridlinks_bench::rest_api::{ApiTarget, RestClient};
use serde_json::Value;

const BENCH: &str = env!("CARGO_BIN_EXE_gridlinks-bench");
const PASSWORD: &str = "pw";

/// The server binary: `GRIDLINKS_BIN`, else `<target>/debug/gridlinks` next to this
/// test's `deps/` directory. Panics naming `GRIDLINKS_BIN` when it does not exist.
fn server_bin() -> PathBuf {
    let path = match std::env::var_os("GRIDLINKS_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("test binary path");
            // <target>/debug/deps/loss_check-HASH -> <target>/debug/gridlinks
            exe.parent()
                .and_then(Path::parent)
                .expect("test binary lives in <target>/<profile>/deps")
                .join("gridlinks")
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

/// A free local port (bound and released; a race with other processes is unlikely).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `gridlinks serve` in its own data directory; killed on drop.
struct Server {
    child: Child,
    dir: PathBuf,
    http: u16,
    mqtt: u16,
}

impl Server {
    fn start(name: &str) -> Server {
        let bin = server_bin();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("loss-check-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (http, mqtt) = (free_port(), free_port());
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = Command::new(&bin)
            .args(["serve", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--http-bind", &format!("127.0.0.1:{http}")])
            .args(["--mqtt-bind", &format!("127.0.0.1:{mqtt}")])
            .env("GRIDLINKS_ADMIN_PASSWORD", PASSWORD)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut server = Server {
            child,
            dir,
            http,
            mqtt,
        };
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

    fn api(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn client(&self) -> RestClient {
        RestClient::login(&ApiTarget {
            base: self.api(),
            user: "admin".into(),
            password: PASSWORD.into(),
        })
        .unwrap()
    }

    /// Runs the bench binary with `args` plus this server's MQTT and REST options.
    fn bench(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(BENCH);
        cmd.args(args)
            .args(["--api", &self.api(), "--api-password", PASSWORD])
            .stdin(Stdio::null());
        if args[0] == "mqtt-telemetry" {
            cmd.args(["--port", &self.mqtt.to_string()]);
        }
        let out = cmd.output().unwrap();
        eprintln!(
            "--- gridlinks-bench {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
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

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

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
    assert!(
        !stdout(&out).contains("LOSS CHECK"),
        "no check without --verify"
    );

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
        assert!(
            ts.len() > to,
            "device {device} acked only {} points",
            ts.len()
        );
        let id = client.device_id(&devices[device].name).unwrap().unwrap();
        let (first, end) = (ts[0], ts[ts.len() - 1] + 1);
        let before = client.timestamps(&id, SEQ_KEY, first, end).unwrap().len();
        client
            .delete_timeseries(&id, SEQ_KEY, ts[from], ts[to])
            .unwrap();
        let after = client.timestamps(&id, SEQ_KEY, first, end).unwrap().len();
        assert!(
            after < before,
            "the delete removed nothing from device {device}"
        );
        deleted += (before - after) as u64;
    }

    let json = server.dir.join("verify.json");
    let out = server.bench(&[
        "verify",
        "--acks",
        acks.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "missing points exit with 2");
    assert!(stdout(&out).contains(&format!(
        "LOSS CHECK FAILED: {deleted} acknowledged points missing"
    )));
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
