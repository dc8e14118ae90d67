//! X.509 device credentials as ThingsBoard keeps them: the certificate's PEM body with the
//! `BEGIN`/`END` lines and line breaks taken out, named by the SHA3-256 of that text (its
//! `credentialsId`). A TLS transport computes the same from the client certificate (base64
//! of its DER form), so the fingerprint finds the device.

use sha3::{Digest, Sha3_256};

/// Longest certificate text accepted, bytes.
pub const MAX_CERT_LEN: usize = 16 * 1024;

/// Why a certificate was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// Empty, too long, or not base64 once the PEM lines are taken out.
    #[error("credentialsValue must be a PEM certificate (base64 between BEGIN/END CERTIFICATE lines), at most {MAX_CERT_LEN} bytes")]
    NotPem,
}

/// ThingsBoard's `certTrimNewLines`: the PEM text without its BEGIN/END lines and line
/// breaks.
pub fn trim(pem: &str) -> String {
    pem.replace("-----BEGIN CERTIFICATE-----", "").replace("-----END CERTIFICATE-----", "").replace(['\n', '\r'], "")
}

/// The trimmed certificate and its fingerprint (lower-case hex SHA3-256 of the trimmed
/// text, ThingsBoard's `credentialsId`).
pub fn fingerprint(pem: &str) -> Result<(String, String), CertError> {
    let cert = trim(pem);
    let base64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=');
    if cert.is_empty() || cert.len() > MAX_CERT_LEN || !cert.chars().all(base64) {
        return Err(CertError::NotPem);
    }
    let hex = sha3_hex(&cert);
    Ok((cert, hex))
}

/// Lower-case hex SHA3-256 of `text` (ThingsBoard's `EncryptionUtil.getSha3Hash`).
pub fn sha3_hex(text: &str) -> String {
    Sha3_256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_lines_and_breaks_are_trimmed_and_hashed_with_sha3() {
        let pem = "-----BEGIN CERTIFICATE-----\r\nTUlJQg==\nQUJD\n-----END CERTIFICATE-----\n";
        let (cert, id) = fingerprint(pem).unwrap();
        assert_eq!(cert, "TUlJQg==QUJD");
        // SHA3-256("TUlJQg==QUJD"), as ThingsBoard's EncryptionUtil.getSha3Hash gives it.
        assert_eq!(id, "00b152cc25250420dd9c200022cd0ce522d13694e66c3c48f91e7ce165561b55");
        assert_eq!(fingerprint("TUlJQg==QUJD").unwrap().1, id, "the same certificate without its PEM lines");
        assert_ne!(fingerprint("TUlJQg==QUJE").unwrap().1, id);
        for bad in ["", "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----", "not base64!", "a b"] {
            assert_eq!(fingerprint(bad), Err(CertError::NotPem), "{bad:?}");
        }
        assert_eq!(fingerprint(&"A".repeat(MAX_CERT_LEN + 1)), Err(CertError::NotPem));
    }
}
