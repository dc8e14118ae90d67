//! The throwaway PKI of `compare --tls`: a CA and one server certificate it signed, made
//! with the `openssl` command in a temporary directory of the run and removed with it.
//! Every server of the comparison serves the same certificate and key, and the generator
//! trusts the CA, so the servers differ in their TLS stacks only.
//!
//! The server certificate is for `CN=localhost` with subjectAltName `DNS:localhost` and
//! `IP:127.0.0.1`, on an EC P-256 key (ECDSA with SHA-256: what a device fleet's server
//! would use today, and cheap for both sides of the handshake).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{bail, Context as _};
use tokio::process::Command;

/// Days the certificates are valid: a run needs minutes; a day of margin covers a
/// skewed clock.
const VALID_DAYS: &str = "2";

/// The name the server certificate holds and the generator checks (`--tls-server-name`).
pub const SERVER_NAME: &str = "localhost";

/// PKIs made by this process.
static PKIS: AtomicUsize = AtomicUsize::new(0);

/// openssl's configuration: the certificates' extensions, so that nothing depends on the
/// machine's openssl.cnf. rustls (webpki) wants a v3 CA with `CA:TRUE` and a server
/// certificate whose subjectAltName holds the name connected to.
const OPENSSL_CNF: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = gridlinks-bench

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

/// The PEM files a TLS listener serves and a client trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate the generator trusts (`--tls-ca`; Mosquitto's `cafile`).
    pub ca: PathBuf,
    /// The server certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

/// A CA and a server certificate in a temporary directory, removed when dropped (kept
/// with `GRIDLINKS_BENCH_KEEP_SERVER_DIRS`, as the servers' directories are).
#[derive(Debug)]
pub struct ThrowawayPki {
    /// The temporary directory.
    dir: PathBuf,
    /// The files in it.
    files: TlsFiles,
}

impl ThrowawayPki {
    /// Makes the CA and the server certificate with `openssl` in a new temporary directory.
    pub async fn create() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "gridlinks-bench-pki-{}-{}",
            std::process::id(),
            PKIS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // Owned from here: an error below removes the directory.
        let pki = ThrowawayPki {
            files: TlsFiles { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") },
            dir,
        };
        std::fs::write(pki.dir.join("openssl.cnf"), OPENSSL_CNF)?;
        for step in commands(&pki.dir) {
            openssl(&pki.dir, &step).await?;
        }
        // Mosquitto started as root drops to its own user before it reads the key: the
        // key must be readable by others (it is a throwaway test key, in a directory that
        // is removed after the run).
        std::fs::set_permissions(&pki.files.key, std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("making {} readable", pki.files.key.display()))?;
        Ok(pki)
    }

    /// The CA, certificate and key.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

impl Drop for ThrowawayPki {
    fn drop(&mut self) {
        if std::env::var_os("GRIDLINKS_BENCH_KEEP_SERVER_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("kept {}", self.dir.display());
        }
    }
}

/// The `openssl` command lines, run in `dir` in this order: CA key, self-signed CA
/// certificate, server key, its request, the request signed by the CA.
fn commands(dir: &Path) -> Vec<Vec<String>> {
    let cnf = dir.join("openssl.cnf").display().to_string();
    let p256 = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"];
    let line = |parts: &[&str]| parts.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    let with = |base: &[&str], file: &str| {
        let mut l = line(base);
        l.push(file.into());
        l
    };
    vec![
        with(&p256, "ca.key"),
        line(&[
            "req",
            "-x509",
            "-new",
            "-config",
            &cnf,
            "-key",
            "ca.key",
            "-sha256",
            "-days",
            VALID_DAYS,
            "-subj",
            "/CN=gridlinks-bench throwaway CA",
            "-extensions",
            "ca_ext",
            "-out",
            "ca.pem",
        ]),
        with(&p256, "server.key"),
        line(&["req", "-new", "-config", &cnf, "-key", "server.key", "-subj", "/CN=localhost", "-out", "server.csr"]),
        line(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-sha256",
            "-days",
            VALID_DAYS,
            "-extfile",
            &cnf,
            "-extensions",
            "server_ext",
            "-out",
            "server.pem",
        ]),
    ]
}

/// Runs `openssl ARGS` in `dir`; fails with its output when it fails.
async fn openssl(dir: &Path, args: &[String]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("running openssl (needed by --tls: apt-get install openssl): {e}"))?;
    if !out.status.success() {
        bail!(
            "openssl {} failed with {}:\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_certificate_is_signed_by_the_ca_for_localhost() {
        let steps = commands(Path::new("/tmp/pki"));
        let last = steps.last().unwrap().join(" ");
        assert!(last.starts_with("x509 -req -in server.csr -CA ca.pem -CAkey ca.key"), "{last}");
        assert!(last.contains("-extensions server_ext") && last.ends_with("-out server.pem"), "{last}");
        assert!(steps.iter().all(|s| s[0] != "genpkey" || s.join(" ").contains("ec_paramgen_curve:P-256")));
        assert!(OPENSSL_CNF.contains("subjectAltName = DNS:localhost, IP:127.0.0.1"));
        assert!(steps.iter().any(|s| s.join(" ").contains("-subj /CN=localhost")));
    }

    /// Makes the PKI with the real `openssl` and checks that the generator's TLS client
    /// accepts the CA file (skipped where openssl is missing).
    #[tokio::test]
    async fn openssl_makes_a_pki_the_client_trusts() {
        if std::process::Command::new("openssl").arg("version").output().is_err() {
            eprintln!("openssl not installed: skipped");
            return;
        }
        let pki = ThrowawayPki::create().await.unwrap();
        let files = pki.files().clone();
        for f in [&files.ca, &files.cert, &files.key] {
            assert!(std::fs::read_to_string(f).unwrap().starts_with("-----BEGIN "), "{}", f.display());
        }
        let mode = std::fs::metadata(&files.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o044, 0o044, "Mosquitto's own user reads the key");
        crate::mqtt_client::TlsClient::trusting(&files.ca, SERVER_NAME).unwrap();
        let dir = pki.dir.clone();
        drop(pki);
        assert!(!dir.exists(), "removed when dropped");
    }
}
