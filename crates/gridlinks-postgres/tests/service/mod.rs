//! A PostgreSQL for one test: Debian's server on a free loopback port, started by
//! `scripts/services/postgres.sh` and stopped when dropped. Used by this crate's tests and
//! by `gridlinks-server`'s (which include this file by path).
#![allow(dead_code)] // each test file uses part of it

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

pub struct Postgres {
    dir: tempfile::TempDir,
    /// The connection URL (role and database `gridlinks`).
    pub url: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services/postgres.sh")
}

impl Postgres {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // The server runs as `postgres`: it must be able to reach its directory.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = Command::new(script()).arg("start").arg(dir.path().join("pg")).output().unwrap();
        assert!(out.status.success(), "postgres.sh start: {}", String::from_utf8_lossy(&out.stderr));
        let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        Self { dir, url }
    }

    /// The file holding the URL, as `cluster.postgres.url_file` wants it (mode 600).
    pub fn url_file(&self) -> PathBuf {
        self.dir.path().join("pg/url")
    }

    pub fn stop(&self) {
        Command::new(script()).arg("stop").arg(self.dir.path().join("pg")).status().unwrap();
    }

    /// Starts it again after [`Postgres::stop`], on the same port.
    pub fn restart(&self) {
        let st = Command::new(script()).arg("restart").arg(self.dir.path().join("pg")).status().unwrap();
        assert!(st.success(), "postgres.sh restart");
    }

    /// Starts running SQL as the server's superuser, without waiting for it.
    pub fn psql_background(&self, sql: &str) -> std::process::Child {
        Command::new(script()).arg("psql").arg(self.dir.path().join("pg")).arg(sql).spawn().unwrap()
    }

    /// Runs SQL as the server's superuser; the rows, unaligned.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(script()).arg("psql").arg(self.dir.path().join("pg")).arg(sql).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
