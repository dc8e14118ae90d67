//! A Cassandra node for one test: Apache Cassandra 5 from its Maven Central jars on free
//! loopback ports, started by `scripts/services/cassandra.sh` and stopped when dropped.
//! Used by this crate's tests and by `gridlinks-server`'s (which include this file by path).
#![allow(dead_code)] // each test file uses part of it

use std::path::PathBuf;
use std::process::Command;

pub struct Cassandra {
    dir: tempfile::TempDir,
    /// The CQL contact point, `127.0.0.1:port`.
    pub contact: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/cassandra.sh")
}

impl Cassandra {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(script()).arg("start").arg(dir.path().join("node")).output().unwrap();
        assert!(out.status.success(), "cassandra.sh start: {}", String::from_utf8_lossy(&out.stderr));
        let contact = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        Self { dir, contact }
    }

    fn run(&self, what: &str) {
        let st = Command::new(script()).arg(what).arg(self.dir.path().join("node")).status().unwrap();
        assert!(st.success(), "cassandra.sh {what}");
    }

    /// Kills the node at once (kill -9).
    pub fn kill(&self) {
        self.run("kill");
    }

    /// Starts it again after [`Cassandra::kill`], with its data, on the same ports.
    pub fn restart(&self) {
        self.run("restart");
    }
}

impl Drop for Cassandra {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(self.dir.path().join("node")).status();
    }
}
