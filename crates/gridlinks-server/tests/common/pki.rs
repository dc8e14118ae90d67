//! Test certificates made by the openssl command line: a CA, the server's signed by it, and
//! clients' (self-signed, expired, or signed by another CA).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Test certificates: a CA, the server's (CN localhost, for 127.0.0.1) signed by it, and
/// devices' self-signed ones.
pub struct Pki {
    pub dir: tempfile::TempDir,
}

pub fn openssl(dir: &Path, args: &[&str]) {
    let st = Command::new("openssl").current_dir(dir).args(args).stderr(Stdio::null()).status().unwrap();
    assert!(st.success(), "openssl {args:?}");
}

impl Pki {
    pub fn new() -> Self {
        let pki = Pki { dir: tempfile::tempdir().unwrap() };
        let d = pki.dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        openssl(
            d,
            &[
                &["req", "-x509"],
                &ec[..],
                &["-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=GridLinks test CA", "-days", "90"],
            ]
            .concat(),
        );
        pki.server_cert("server", "localhost");
        pki.ca("apps-ca");
        pki
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn p(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_owned()
    }

    /// `{name}.pem` and `{name}.key`: a server certificate with common name `cn`.
    pub fn server_cert(&self, name: &str, cn: &str) {
        self.issue(name, cn, "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
    }

    /// `{name}.pem` and `{name}.key`: a client certificate with common name `cn` signed by
    /// the CA `{ca}.pem`; `{name}-chain.pem` holds it and the CA's.
    pub fn signed_client_cert(&self, name: &str, cn: &str, ca: &str) {
        self.issue(name, cn, ca, "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n");
        let chain = [
            std::fs::read_to_string(self.path(&format!("{name}.pem"))).unwrap(),
            std::fs::read_to_string(self.path(&format!("{ca}.pem"))).unwrap(),
        ]
        .concat();
        std::fs::write(self.path(&format!("{name}-chain.pem")), chain).unwrap();
    }

    /// `{name}.pem` and `{name}.key`: a certificate for `cn` signed by the CA `{ca}`, with
    /// the X.509 extensions `ext` (openssl's extension file syntax).
    pub fn issue(&self, name: &str, cn: &str, ca: &str, ext: &str) {
        let d = self.dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        let (key, csr, pem, ext_file) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        std::fs::write(d.join(&ext_file), ext).unwrap();
        openssl(
            d,
            &[&["req", "-new"], &ec[..], &["-keyout", &key, "-out", &csr, "-subj", &format!("/CN={cn}")]].concat(),
        );
        let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
        let sign = ["x509", "-req", "-in", &csr, "-CA", &ca_pem, "-CAkey", &ca_key, "-CAcreateserial", "-days", "90"];
        openssl(d, &[&sign[..], &["-extfile", &ext_file, "-out", &pem]].concat());
    }

    /// `{name}.pem` and `{name}.key`: a CA certificate.
    pub fn ca(&self, name: &str) -> String {
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
        openssl(
            self.dir.path(),
            &[
                &["req", "-x509"],
                &ec[..],
                &["-keyout", &key, "-out", &pem, "-subj", &format!("/CN={name}"), "-days", "30"],
            ]
            .concat(),
        );
        std::fs::read_to_string(self.path(&pem)).unwrap()
    }

    /// `{name}.pem` and `{name}.key`: a self-signed client certificate (`days` -1: it
    /// expired yesterday).
    pub fn client_cert(&self, name: &str, days: i32) -> String {
        let d = self.dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        let (key, csr, pem) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"));
        openssl(
            d,
            &[&["req", "-new"], &ec[..], &["-keyout", &key, "-out", &csr, "-subj", &format!("/CN={name}")]].concat(),
        );
        openssl(d, &["x509", "-req", "-in", &csr, "-signkey", &key, "-days", &days.to_string(), "-out", &pem]);
        std::fs::read_to_string(self.path(&pem)).unwrap()
    }
}
