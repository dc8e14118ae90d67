//! X.509 device credentials as ThingsBoard keeps them: the certificate's PEM body with the
//! `BEGIN`/`END` lines and line breaks taken out, named by the SHA3-256 of that text (its
//! `credentialsId`). A TLS transport computes the same from the client certificate (base64
//! of its DER form), so the fingerprint finds the device.
//!
//! [`parse_der`] reads what the server needs from a client certificate (its validity and
//! subject common name) with a small DER reader: untrusted input, bounded and fuzzed.

use base64::Engine;
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

/// The fingerprint of a certificate in DER form: the SHA3-256 of its base64 text, as
/// [`fingerprint`] gives it for the same certificate in PEM.
pub fn der_fingerprint(der: &[u8]) -> String {
    sha3_hex(&base64::engine::general_purpose::STANDARD.encode(der))
}

/// What the server reads from a client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Start of validity, seconds since the Unix epoch.
    pub not_before: i64,
    /// End of validity, seconds since the Unix epoch.
    pub not_after: i64,
    /// The subject's common name (the last CN attribute), when it has one in a string type.
    pub common_name: Option<String>,
}

/// Why a DER certificate could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed X.509 certificate")]
pub struct BadDer;

/// One DER element: its tag and contents.
struct Tlv<'a> {
    tag: u8,
    value: &'a [u8],
}

/// Reads the element at the front of `input`; the rest after it.
fn tlv(input: &[u8]) -> Result<(Tlv<'_>, &[u8]), BadDer> {
    let (&tag, rest) = input.split_first().ok_or(BadDer)?;
    let (&first, mut rest) = rest.split_first().ok_or(BadDer)?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(BadDer);
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if rest.len() < len {
        return Err(BadDer);
    }
    let (value, rest) = rest.split_at(len);
    Ok((Tlv { tag, value }, rest))
}

/// Reads the element at the front of `input`, which must have `tag`.
fn expect(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), BadDer> {
    let (t, rest) = tlv(input)?;
    if t.tag != tag {
        return Err(BadDer);
    }
    Ok((t.value, rest))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// The common name attribute, 2.5.4.3.
const CN: &[u8] = &[0x55, 0x04, 0x03];

/// The parts of a certificate's `TBSCertificate` the server reads.
struct Tbs<'a> {
    validity: &'a [u8],
    subject: &'a [u8],
    spki: &'a [u8],
}

fn tbs(der: &[u8]) -> Result<Tbs<'_>, BadDer> {
    let (cert, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut rest = tbs;
    // [0] version, optional (absent in a version 1 certificate).
    if rest.first() == Some(&0xa0) {
        rest = tlv(rest)?.1;
    }
    let (_, rest) = expect(rest, 0x02)?; // serial number
    let (_, rest) = expect(rest, SEQUENCE)?; // signature algorithm
    let (_, rest) = expect(rest, SEQUENCE)?; // issuer
    let (validity, rest) = expect(rest, SEQUENCE)?;
    let (subject, rest) = expect(rest, SEQUENCE)?;
    let (spki, _) = expect(rest, SEQUENCE)?;
    Ok(Tbs { validity, subject, spki })
}

/// A certificate's public key: the contents of its `AlgorithmIdentifier` and the key
/// (the `subjectPublicKey` bits), as signature verifiers take them.
pub fn public_key(der: &[u8]) -> Result<(&[u8], &[u8]), BadDer> {
    let (algorithm, rest) = expect(tbs(der)?.spki, SEQUENCE)?;
    let (bits, _) = expect(rest, 0x03)?;
    // A key is a whole number of bytes: no unused bits.
    match bits.split_first() {
        Some((0, key)) => Ok((algorithm, key)),
        _ => Err(BadDer),
    }
}

/// Reads the validity and subject common name of a DER certificate (version 1 to 3).
pub fn parse_der(der: &[u8]) -> Result<CertInfo, BadDer> {
    let Tbs { validity, subject, .. } = tbs(der)?;
    let (from, after) = tlv(validity)?;
    let (to, _) = tlv(after)?;
    let mut common_name = None;
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (set, next) = expect(rdns, SET)?;
        rdns = next;
        let mut attrs = set;
        while !attrs.is_empty() {
            let (attr, next) = expect(attrs, SEQUENCE)?;
            attrs = next;
            let (oid, value) = expect(attr, OID)?;
            let (value, _) = tlv(value)?;
            // UTF8String, PrintableString, T61String, IA5String.
            if oid == CN && matches!(value.tag, 0x0c | 0x13 | 0x14 | 0x16) {
                common_name = Some(String::from_utf8_lossy(value.value).into_owned());
            }
        }
    }
    Ok(CertInfo { not_before: time(&from)?, not_after: time(&to)?, common_name })
}

/// A UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) as Unix seconds.
fn time(t: &Tlv<'_>) -> Result<i64, BadDer> {
    let digits = |s: &[u8]| -> Result<i64, BadDer> {
        s.iter()
            .try_fold(0i64, |acc, &c| if c.is_ascii_digit() { Ok(acc * 10 + i64::from(c - b'0')) } else { Err(BadDer) })
    };
    let (year, rest) = match (t.tag, t.value.len()) {
        (0x17, 13) => {
            let yy = digits(&t.value[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &t.value[2..])
        }
        (0x18, 15) => (digits(&t.value[..4])?, &t.value[4..]),
        _ => return Err(BadDer),
    };
    if rest[10] != b'Z' {
        return Err(BadDer);
    }
    let [month, day, hour, minute, second] = [0, 2, 4, 6, 8].map(|i| digits(&rest[i..i + 2]));
    let (month, day) = (month?, day?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return Err(BadDer);
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(days * 86_400 + hour? * 3600 + minute? * 60 + second?)
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

    /// Made by `openssl req -x509 -newkey ec … -subj "/O=Acme/CN=device-7" -days 10000`: a
    /// UTCTime start and a GeneralizedTime end (`openssl x509 -dates` gives both below).
    const CERT: &str = "MIIBmzCCAUGgAwIBAgIUNHnXmA3CIydXHEBZCTtFkRburHcwCgYIKoZIzj0EAwIwIjENMAsGA1UECgwEQWNtZTERMA8GA1UEAwwIZGV2aWNlLTcwIBcNMjYxMTI3MTYxMDE2WhgPMjA1NDA0MTQxNjEwMTZaMCIxDTALBgNVBAoMBEFjbWUxETAPBgNVBAMMCGRldmljZS03MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEpuQQMfMns2x6VMZ6a7Hhc2CdtL0t0wsxrbjdgms4bsuT7an3Jbof2QxUYuheu6sE7nIUM61ZPmthw8kU2xs13aNTMFEwHQYDVR0OBBYEFMxqhvtH6PbF4rKXRCd8OqB184CyMB8GA1UdIwQYMBaAFMxqhvtH6PbF4rKXRCd8OqB184CyMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIgSbvgyidPmZTMJDYT7ztIidx1Byq0t8QK1PucRJTE5XcCIQDGaQnt9k19+axuu+bLsT0zzFCLHBbBlD+SpLX0ufKuQA==";

    #[test]
    fn a_der_certificate_gives_its_validity_common_name_and_fingerprint() {
        use base64::Engine;
        let der = base64::engine::general_purpose::STANDARD.decode(CERT).unwrap();
        let info = parse_der(&der).unwrap();
        // notBefore=Nov 27 16:10:16 2026 GMT, notAfter=Apr 14 16:10:16 2054 GMT.
        assert_eq!((info.not_before, info.not_after), (1_795_795_816, 2_659_795_816));
        assert_eq!(info.common_name.as_deref(), Some("device-7"));
        // As ThingsBoard computes it from the PEM (and `fingerprint` does).
        assert_eq!(der_fingerprint(&der), "56020e5b5dfa3606c2afa324e7b9c64ea406087894d011b13c6b82b9b3680da2");
        assert_eq!(fingerprint(CERT).unwrap().1, der_fingerprint(&der));
        // Every truncation is refused, never a panic.
        for n in 0..der.len() {
            assert_eq!(parse_der(&der[..n]), Err(BadDer), "{n}");
        }
        assert_eq!(parse_der(b"\x30\x84\xff\xff\xff\xff"), Err(BadDer));
        // An EC P-256 key: id-ecPublicKey with prime256v1, and an uncompressed point.
        let (algorithm, key) = public_key(&der).unwrap();
        assert_eq!(
            algorithm,
            [
                &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01][..],
                &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]
            ]
            .concat()
        );
        assert_eq!((key.len(), key[0]), (65, 0x04));
    }
}
