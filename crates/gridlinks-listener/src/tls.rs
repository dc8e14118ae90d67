//! TLS for every TCP listener (rustls with the *ring* provider): the server certificate
//! and key from PEM files, reloaded in place (SIGHUP) without touching open connections;
//! TLS 1.2 and 1.3; a bounded handshake; and, where a listener asks for it, client
//! certificates.
//!
//! Client certificates are asked for but not required, and not checked against a CA:
//! ThingsBoard's X.509 devices often carry self-signed certificates, named by their
//! fingerprint. What is checked here is that the client holds the certificate's key (the
//! handshake signature) and that the certificate is within its validity; what it grants is
//! decided by the transport, from [`ClientCert`] (its fingerprint, its subject CN).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gridlinks_thingsboard::x509;
use parking_lot::RwLock;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, PeerMisbehaved, ServerConfig, SignatureScheme,
};
use tokio::net::TcpStream;
pub use tokio_rustls::server::TlsStream;

/// A server certificate expiring within this is warned about at every (re)load.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 86_400);

/// Why the certificate or key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is unreadable or holds no usable certificate or key.
    #[error("{}: {why}", .path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

fn file_error(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.to_owned(), why: why.to_string() }
}

/// What a verified client certificate says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCert {
    /// ThingsBoard's fingerprint: SHA3-256 of the certificate's base64 text.
    pub fingerprint: String,
    /// The subject's common name.
    pub common_name: Option<String>,
    /// The certificate (DER) and the chain the client sent after it.
    pub chain: Vec<CertificateDer<'static>>,
}

/// The server certificate and key, shared by every TLS listener and replaced in place.
pub struct Certs {
    cert_file: PathBuf,
    key_file: PathBuf,
    key: RwLock<Arc<CertifiedKey>>,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for Certs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certs").field("cert_file", &self.cert_file).finish_non_exhaustive()
    }
}

impl Certs {
    /// Loads the certificate chain (PEM, leaf first) and its private key (PEM, PKCS#8,
    /// PKCS#1 or SEC1).
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = load_key(&provider, cert_file, key_file)?;
        Ok(Arc::new(Self {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            key: RwLock::new(key),
            provider,
        }))
    }

    /// Reads the files again; on error the certificate in use stays. New handshakes use
    /// the new certificate, open connections keep theirs.
    pub fn reload(&self) -> Result<(), TlsError> {
        let key = load_key(&self.provider, &self.cert_file, &self.key_file)?;
        *self.key.write() = key;
        tracing::info!(cert_file = %self.cert_file.display(), "TLS certificate reloaded");
        Ok(())
    }

    /// A handshake configuration over these certificates; `client_certs`: ask clients for
    /// theirs (see the module's description).
    pub fn acceptor(self: &Arc<Self>, client_certs: bool, handshake_timeout: Duration) -> Result<Acceptor, TlsError> {
        let builder = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| file_error(&self.cert_file, e))?;
        let builder = match client_certs {
            true => builder.with_client_cert_verifier(Arc::new(AnyClientCert {
                algorithms: self.provider.signature_verification_algorithms,
            })),
            false => builder.with_no_client_auth(),
        };
        let config = builder.with_cert_resolver(self.clone());
        Ok(Acceptor { inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)), handshake_timeout })
    }
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key.read().clone())
    }
}

fn load_key(provider: &CryptoProvider, cert_file: &Path, key_file: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs = read_certificates(cert_file)?;
    let info = x509::parse_der(&certs[0]).map_err(|e| file_error(cert_file, e))?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| file_error(key_file, e))?;
    let key = provider.key_provider.load_private_key(key).map_err(|e| file_error(key_file, e))?;
    let certified = CertifiedKey::new(certs, key);
    certified.keys_match().map_err(|e| file_error(key_file, format!("the key is not the certificate's: {e}")))?;
    let now = unix_now();
    let file = cert_file.display();
    if info.not_after < now {
        tracing::error!(cert_file = %file, "the TLS certificate has expired: clients will refuse it");
    } else if info.not_before > now {
        tracing::error!(cert_file = %file, "the TLS certificate is not valid yet: clients will refuse it");
    } else if info.not_after - now < EXPIRY_WARNING.as_secs() as i64 {
        let days = (info.not_after - now) / 86_400;
        tracing::warn!(cert_file = %file, days, "the TLS certificate expires soon; replace it and send SIGHUP");
    }
    Ok(Arc::new(certified))
}

/// The certificates of a PEM file (DER), at least one.
pub fn load_certificates(path: &Path) -> Result<Vec<Vec<u8>>, TlsError> {
    Ok(read_certificates(path)?.iter().map(|c| c.to_vec()).collect())
}

/// The certificates of a PEM file, at least one.
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no certificate in the file"));
    }
    Ok(certs)
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// A listener's TLS handshake.
#[derive(Clone)]
pub struct Acceptor {
    inner: tokio_rustls::TlsAcceptor,
    handshake_timeout: Duration,
}

/// Why a handshake failed (the client's business: logged at DEBUG).
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// It did not finish within the handshake timeout.
    #[error("TLS handshake timed out")]
    Timeout,
    /// A protocol error, a refused certificate or a closed connection.
    #[error("TLS handshake failed: {0}")]
    Failed(#[from] io::Error),
}

impl Acceptor {
    /// Runs the handshake on `stream`, within the handshake timeout; the session and the
    /// client's certificate, if it sent one.
    pub async fn accept(
        &self,
        stream: TcpStream,
    ) -> Result<(TlsStream<TcpStream>, Option<ClientCert>), HandshakeError> {
        let tls = tokio::time::timeout(self.handshake_timeout, self.inner.accept(stream))
            .await
            .map_err(|_| HandshakeError::Timeout)??;
        let cert = tls.get_ref().1.peer_certificates().and_then(|chain| {
            let leaf = chain.first()?;
            Some(ClientCert {
                fingerprint: x509::der_fingerprint(leaf),
                common_name: x509::parse_der(leaf).ok()?.common_name,
                chain: chain.iter().map(|c| c.clone().into_owned()).collect(),
            })
        });
        Ok((tls, cert))
    }
}

/// Asks for a client certificate, accepts any whose key the client holds and that is
/// within its validity.
#[derive(Debug)]
struct AnyClientCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let info = x509::parse_der(end_entity).map_err(|_| CertificateError::BadEncoding)?;
        let now = now.as_secs() as i64;
        if now > info.not_after {
            return Err(CertificateError::Expired.into());
        }
        if now < info.not_before {
            return Err(CertificateError::NotValidYet.into());
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_signature(&self.algorithms, message, cert, dss, false)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        use SignatureScheme as S;
        // TLS 1.3 has no PKCS#1 v1.5 nor SHA-1 signatures.
        if matches!(
            dss.scheme,
            S::RSA_PKCS1_SHA1 | S::RSA_PKCS1_SHA256 | S::RSA_PKCS1_SHA384 | S::RSA_PKCS1_SHA512 | S::ECDSA_SHA1_Legacy
        ) {
            return Err(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme.into());
        }
        verify_signature(&self.algorithms, message, cert, dss, true)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Checks the client's handshake signature with its certificate's key, by the key itself:
/// webpki's own check refuses version 1 certificates, which `openssl x509 -req` makes and
/// ThingsBoard accepts.
fn verify_signature(
    algorithms: &WebPkiSupportedAlgorithms,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let (key_algorithm, key) = x509::public_key(cert).map_err(|_| CertificateError::BadEncoding)?;
    let candidates = algorithms.mapping.iter().find(|(scheme, _)| *scheme == dss.scheme).map(|(_, algs)| *algs);
    let Some(candidates) = candidates else {
        return Err(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme.into());
    };
    // A TLS 1.3 scheme names the curve (the first candidate); a TLS 1.2 one does not: the
    // candidate for this key's algorithm.
    let candidates = if tls13 { &candidates[..candidates.len().min(1)] } else { candidates };
    let alg = candidates.iter().find(|alg| alg.public_key_alg_id().as_ref() == key_algorithm);
    // A scheme that does not fit the key is a bad signature too.
    match alg.map(|alg| alg.verify_signature(key, message, dss.signature())) {
        Some(Ok(())) => Ok(HandshakeSignatureValid::assertion()),
        _ => Err(CertificateError::BadSignature.into()),
    }
}
