//! A full disk, on a small tmpfs the test mounts for the data directory: writes are refused
//! with a clear "disk full" error, reads go on, nothing acknowledged is lost, the log stays
//! short, and writes come back by themselves once space is freed — whether GridLinks
//! stopped in time (its headroom, `storage.min_free_mb`) or the engine itself ran out of
//! space and had to be reopened.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::mqtt::*;
use common::*;

/// A tmpfs of `size_mb` MiB, unmounted on drop.
struct Tmpfs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mb: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("fs");
        std::fs::create_dir(&mnt).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(&mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs to fill it and needs the right to mount (root or CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { mnt, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

/// Fills the file system of `dir` with a file until at most `leave` bytes are free (0: until
/// a write fails for lack of space).
fn fill(dir: &Path, leave: u64) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 256 * 1024];
    loop {
        if leave > 0 && free_bytes(dir) <= leave {
            break;
        }
        if f.write_all(&chunk).and_then(|()| f.flush()).is_err() {
            break;
        }
    }
    let _ = f.sync_all();
    path
}

fn point(ts: i64) -> String {
    // ~1 KB per point, so the store grows noticeably.
    format!(r#"{{"ts":{ts},"values":{{"n":{ts},"pad":"{}"}}}}"#, "x".repeat(1000))
}

/// Posts point `ts`; its status and body.
fn post(s: &Server, ts: i64) -> (u16, String) {
    s.req("POST", "/api/v1/DISK_TOKEN/telemetry", None, Some(&point(ts)))
}

fn metric(s: &Server, name: &str) -> u64 {
    let (_, text) = s.req("GET", "/metrics", None, None);
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The whole story on one file system: load, fill, refusals, reads, free, recovery, restart.
fn disk_full_story(min_free_mb: &str) {
    let fs = Tmpfs::mount(48);
    let data = fs.mnt.join("data");
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("server.log");
    let env = [
        ("GRIDLINKS_STORAGE_MIN_FREE_MB", min_free_mb),
        ("GRIDLINKS_STORAGE_MEMTABLE_MB", "1"),
        ("GRIDLINKS_STORAGE_CACHE_MB", "4"),
        ("GRIDLINKS_LOG", "info,fjall=warn,lsm_tree=warn"),
    ];
    let mut s = Server::start_logged(&data, &env, &log);
    let jwt = s.login();
    let id = s.device(&jwt, "disk", "DISK_TOKEN");
    let mut acked = Vec::new();
    let mut ts = 0;
    for _ in 0..300 {
        ts += 1;
        assert_eq!(post(&s, ts).0, 200);
        acked.push(ts);
    }
    // Another program takes the space: below the headroom, or every last byte.
    let filler = fill(&fs.mnt, if min_free_mb == "0" { 0 } else { 2 * 1024 * 1024 });
    let deadline = Instant::now() + PATIENCE;
    let refusal = loop {
        ts += 1;
        let (st, body) = post(&s, ts);
        if st == 200 {
            acked.push(ts);
        } else {
            break (st, body);
        }
        assert!(Instant::now() < deadline, "writes were still taken on a full disk");
    };
    assert_eq!(refusal.0, 507, "{}", refusal.1);
    assert!(refusal.1.to_lowercase().contains("disk full"), "{}", refusal.1);
    // MQTT 5 says so too; reads go on; /healthz tells.
    let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("DISK_TOKEN"), 60);
    c.publish("v1/devices/me/telemetry", point(ts + 1).as_bytes(), QoS::AtLeastOnce, Some(1));
    match c.recv() {
        Some(Packet::PubAck(a)) => {
            assert_eq!(a.reason, reason::QUOTA_EXCEEDED, "{:?}", a.reason_string);
            assert!(a.reason_string.unwrap().to_lowercase().contains("disk full"));
        }
        other => panic!("expected PUBACK 0x97, got {other:?}"),
    }
    s.assert_all_stored(std::slice::from_ref(&id), std::slice::from_ref(&acked), "n");
    let (st, health) = s.req("GET", "/healthz", None, None);
    assert_eq!(st, 503);
    assert!(health.contains("DISK_FULL") || health.contains("FAILED"), "{health}");
    // Readiness includes the node's own storage (no shared services here: no backends).
    let (st, ready) = s.req("GET", "/readyz", None, None);
    assert_eq!(st, 503, "{ready}");
    assert!(ready.contains(r#""backends":{}"#), "{ready}");
    // A flood of refused writes does not flood the log.
    for _ in 0..1000 {
        ts += 1;
        assert_ne!(post(&s, ts).0, 200);
    }
    // Space comes back: writes resume by themselves, same process.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        ts += 1;
        let (st, body) = post(&s, ts);
        if st == 200 {
            acked.push(ts);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "writes did not resume after space was freed: {st} {body}\n{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..100 {
        ts += 1;
        assert_eq!(post(&s, ts).0, 200);
        acked.push(ts);
    }
    assert_eq!(s.req("GET", "/healthz", None, None).0, 200);
    assert_eq!(s.req("GET", "/readyz", None, None).0, 200);
    s.assert_all_stored(std::slice::from_ref(&id), std::slice::from_ref(&acked), "n");
    if min_free_mb == "0" {
        assert!(metric(&s, "gridlinks_storage_reopens_total") >= 1, "the engine failed, so the store was reopened");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = text.lines().count();
    assert!(lines < 40, "{lines} log lines:\n{text}");
    // Nothing acknowledged is lost across a crash either.
    s.kill9();
    let s = Server::start_on(&data, &[("GRIDLINKS_STORAGE_MIN_FREE_MB", min_free_mb)]);
    s.assert_all_stored(std::slice::from_ref(&id), std::slice::from_ref(&acked), "n");
}

#[test]
fn below_the_headroom_writes_are_refused_before_the_engine_fails() {
    disk_full_story("8");
}

#[test]
fn a_store_that_ran_out_of_space_is_reopened_once_space_returns() {
    disk_full_story("0");
}
