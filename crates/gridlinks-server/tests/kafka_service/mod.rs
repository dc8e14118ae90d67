//! Kafka brokers for one test: KRaft, from the Apache jars on Maven Central, started by
//! `scripts/services/kafka.sh` on free loopback ports, stopped when dropped. Used by
//! `kafka.rs` and `cluster_features.rs`.
#![allow(dead_code)] // each test file uses part of it

use std::path::{Path, PathBuf};
use std::process::Command;

/// Kafka brokers under a temporary directory, stopped when dropped.
pub struct Kafka {
    dir: tempfile::TempDir,
    bootstrap: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/kafka.sh")
}

impl Kafka {
    pub fn start(brokers: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(script()).arg("start").arg(dir.path()).arg(brokers.to_string()).output().unwrap();
        assert!(out.status.success(), "kafka.sh start: {}", String::from_utf8_lossy(&out.stderr));
        let bootstrap = String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim().to_owned();
        Self { dir, bootstrap }
    }

    pub fn run(&self, what: &[&str]) {
        let st = Command::new(script()).arg(what[0]).arg(self.dir.path()).args(&what[1..]).status().unwrap();
        assert!(st.success(), "kafka.sh {what:?}");
    }

    /// The environment of a gridlinks node committing to this Kafka (one broker: one replica).
    pub fn env(&self, node: &str) -> Vec<(&'static str, String)> {
        vec![
            ("GRIDLINKS_CLUSTER_QUEUE", "kafka".into()),
            ("GRIDLINKS_CLUSTER_NODE_ID", node.into()),
            ("GRIDLINKS_CLUSTER_KAFKA_BOOTSTRAP_SERVERS", self.bootstrap.clone()),
            ("GRIDLINKS_CLUSTER_KAFKA_PARTITIONS", "4".into()),
            ("GRIDLINKS_CLUSTER_KAFKA_REPLICATION_FACTOR", "1".into()),
            ("GRIDLINKS_CLUSTER_KAFKA_MIN_INSYNC_REPLICAS", "1".into()),
            ("GRIDLINKS_CLUSTER_KAFKA_PRODUCE_TIMEOUT", "3000".into()),
        ]
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(self.dir.path()).status();
    }
}
