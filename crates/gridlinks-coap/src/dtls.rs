//! CoAP over DTLS 1.2 (`coaps://`, RFC 7252 §9; `coap.dtls_bind`): OpenSSL's DTLS (the
//! system libssl, through the `openssl` crate), one session per peer on the DTLS socket,
//! driven without I/O of its own: a datagram goes in, the datagrams to send back and the
//! CoAP messages it carried come out ([`Dtls::input`]); a CoAP message goes in sealed for
//! its peer ([`Dtls::seal`]). The CoAP server above it is the plain one, unchanged.
//!
//! - The server certificate is `tls.cert_file`/`tls.key_file` (re-read by [`Dtls::reload`]).
//! - A client proves its address before the server keeps anything for it or sends its
//!   certificate: a ClientHello without a valid cookie is answered statelessly with a
//!   HelloVerifyRequest (RFC 6347 §4.2.1, OpenSSL's `DTLSv1_listen`) no larger than itself,
//!   so forged source addresses take no session and get no amplification.
//! - A client certificate is asked for, not required; any is taken (devices' certificates
//!   are often self-signed, and are known by their fingerprint, as over MQTT): the
//!   handshake proves the client holds its key. [`Dtls::client_cert`] gives it to the CoAP
//!   layer, which logs the device in by it.
//! - Bounded: at most `coap.max_dtls_sessions` sessions; a handshake must finish within
//!   `tls.handshake_timeout`, and a session idle for `coap.dtls_idle_timeout` is dropped
//!   ([`Dtls::sweep`]). A new session past the bound is refused (no answer); a datagram that
//!   breaks its session's protocol ends it.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslStream, SslVerifyMode,
};
use parking_lot::{Mutex, RwLock};

/// The largest datagram a session writes (a path MTU every network carries, less headers).
const MTU: u32 = 1200;
/// The largest CoAP message read out of one record.
const MAX_RECORD: usize = 16 * 1024;

/// Why DTLS cannot start.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {why}")]
pub struct DtlsError {
    file: String,
    why: String,
}

/// Datagrams between OpenSSL and the socket: what came in and waits to be read, and what
/// OpenSSL wrote (each write one datagram).
#[derive(Default)]
struct Pipe {
    inbox: VecDeque<Vec<u8>>,
    outbox: Vec<Vec<u8>>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(d) = self.inbox.pop_front() else { return Err(io::ErrorKind::WouldBlock.into()) };
        let n = d.len().min(buf.len());
        buf[..n].copy_from_slice(&d[..n]);
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outbox.push(buf.to_vec());
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One peer's session.
struct Session {
    stream: SslStream<Pipe>,
    started: Instant,
    last: Instant,
    established: bool,
}

/// What one datagram gave.
#[derive(Default)]
pub struct Input {
    /// Datagrams to send back to the peer (handshake flights, alerts).
    pub replies: Vec<Vec<u8>>,
    /// CoAP messages it carried.
    pub messages: Vec<Vec<u8>>,
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct DtlsMetrics {
    /// Handshakes completed.
    pub handshakes: AtomicU64,
    /// Sessions ended by a failed handshake or a protocol error.
    pub failures: AtomicU64,
    /// New sessions refused: `coap.max_dtls_sessions` were open.
    pub refused: AtomicU64,
    /// Sessions open now.
    pub sessions: AtomicU64,
}

/// The DTLS sessions of one socket.
pub struct Dtls {
    ctx: RwLock<SslContext>,
    files: (PathBuf, PathBuf),
    sessions: Mutex<HashMap<SocketAddr, Session>>,
    max_sessions: usize,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    /// Counters.
    pub metrics: Arc<DtlsMetrics>,
}

impl Dtls {
    /// Sessions with the certificate and key in these PEM files.
    pub fn new(
        cert_file: PathBuf,
        key_file: PathBuf,
        max_sessions: usize,
        handshake_timeout: Duration,
        idle_timeout: Duration,
    ) -> Result<Self, DtlsError> {
        let ctx = context(&cert_file, &key_file)?;
        Ok(Self {
            ctx: RwLock::new(ctx),
            files: (cert_file, key_file),
            sessions: Mutex::default(),
            max_sessions,
            handshake_timeout,
            idle_timeout,
            metrics: Arc::default(),
        })
    }

    /// Reads the certificate and key again: new sessions get them, open ones keep theirs.
    /// A bad file keeps the ones in use.
    pub fn reload(&self) -> Result<(), DtlsError> {
        *self.ctx.write() = context(&self.files.0, &self.files.1)?;
        Ok(())
    }

    /// Takes a datagram from `peer`.
    pub fn input(&self, peer: SocketAddr, datagram: &[u8]) -> Input {
        let now = Instant::now();
        let mut out = Input::default();
        let mut sessions = self.sessions.lock();
        if !sessions.contains_key(&peer) {
            // Only a handshake record opens a session (content type 22).
            if datagram.first() != Some(&22) {
                return out;
            }
            if sessions.len() >= self.max_sessions {
                self.metrics.refused.fetch_add(1, Ordering::Relaxed);
                return out;
            }
            match self.listen(peer, datagram, now) {
                Ok((Some(session), _)) => {
                    sessions.insert(peer, session);
                    self.metrics.sessions.store(sessions.len() as u64, Ordering::Relaxed);
                }
                Ok((None, replies)) => {
                    out.replies = replies;
                    return out;
                }
                Err(_) => {
                    self.metrics.failures.fetch_add(1, Ordering::Relaxed);
                    return out;
                }
            }
            // The ClientHello is the session's first record now.
            let Some(s) = sessions.get_mut(&peer) else { return out };
            let alive = self.drive(s, &mut out);
            out.replies.append(&mut s.stream.get_mut().outbox);
            if !alive {
                sessions.remove(&peer);
                self.metrics.sessions.store(sessions.len() as u64, Ordering::Relaxed);
            }
            return out;
        }
        let Some(s) = sessions.get_mut(&peer) else { return out };
        s.last = now;
        s.stream.get_mut().inbox.push_back(datagram.to_vec());
        let alive = self.drive(s, &mut out);
        out.replies.append(&mut s.stream.get_mut().outbox);
        if !alive {
            sessions.remove(&peer);
            self.metrics.sessions.store(sessions.len() as u64, Ordering::Relaxed);
        }
        out
    }

    /// OpenSSL's stateless cookie exchange on `peer`'s first datagram: a session when it
    /// is a ClientHello with a valid cookie; else the HelloVerifyRequest to send, if any.
    fn listen(
        &self,
        peer: SocketAddr,
        datagram: &[u8],
        now: Instant,
    ) -> Result<(Option<Session>, Vec<Vec<u8>>), ErrorStack> {
        let mut ssl = Ssl::new(&self.ctx.read())?;
        ssl.set_ex_data(peer_index()?, peer);
        ssl.set_mtu(MTU)?;
        ssl.set_accept_state();
        let mut pipe = Pipe::default();
        pipe.inbox.push_back(datagram.to_vec());
        let mut stream = SslStream::new(ssl, pipe)?;
        match listen(stream.ssl()) {
            1 => Ok((Some(Session { stream, started: now, last: now, established: false }), Vec::new())),
            0 => Ok((None, std::mem::take(&mut stream.get_mut().outbox))),
            _ => Err(ErrorStack::get()),
        }
    }

    /// Moves `s` on with what its inbox holds; false when the session is over.
    fn drive(&self, s: &mut Session, out: &mut Input) -> bool {
        if !s.established {
            match s.stream.do_handshake() {
                Ok(()) => {
                    s.established = true;
                    self.metrics.handshakes.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.code() == ErrorCode::WANT_READ => return true,
                Err(e) => {
                    tracing::debug!(error = %e, "DTLS handshake failed");
                    self.metrics.failures.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
        let mut buf = vec![0u8; MAX_RECORD];
        loop {
            match s.stream.ssl_read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => out.messages.push(buf[..n].to_vec()),
                Err(e) if e.code() == ErrorCode::WANT_READ => return true,
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => return false,
                Err(e) => {
                    tracing::debug!(error = %e, "DTLS session ended");
                    self.metrics.failures.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
    }

    /// `message` sealed for `peer`'s established session, as datagrams to send; `None`
    /// when it has none.
    pub fn seal(&self, peer: SocketAddr, message: &[u8]) -> Option<Vec<Vec<u8>>> {
        let mut sessions = self.sessions.lock();
        let s = sessions.get_mut(&peer).filter(|s| s.established)?;
        s.stream.ssl_write(message).ok()?;
        Some(std::mem::take(&mut s.stream.get_mut().outbox))
    }

    /// The certificate (DER) `peer` presented in its session's handshake, if any.
    pub fn client_cert(&self, peer: SocketAddr) -> Option<Vec<u8>> {
        let sessions = self.sessions.lock();
        let s = sessions.get(&peer).filter(|s| s.established)?;
        s.stream.ssl().peer_certificate()?.to_der().ok()
    }

    /// Drops handshakes older than `tls.handshake_timeout` and sessions idle for
    /// `coap.dtls_idle_timeout`.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut sessions = self.sessions.lock();
        sessions.retain(|_, s| {
            if s.established {
                now.duration_since(s.last) < self.idle_timeout
            } else {
                now.duration_since(s.started) < self.handshake_timeout
            }
        });
        self.metrics.sessions.store(sessions.len() as u64, Ordering::Relaxed);
    }
}

/// `DTLSv1_listen` on `ssl` (which the `openssl` crate does not wrap): 1 when its read
/// buffer held a ClientHello with a valid cookie (the handshake goes on from it), 0 when
/// not (a HelloVerifyRequest may have been written), below 0 on an error.
fn listen(ssl: &openssl::ssl::SslRef) -> i32 {
    use foreign_types::ForeignTypeRef;
    extern "C" {
        fn DTLSv1_listen(s: *mut openssl_sys::SSL, client: *mut std::ffi::c_void) -> std::os::raw::c_int;
        fn BIO_ADDR_new() -> *mut std::ffi::c_void;
        fn BIO_ADDR_free(a: *mut std::ffi::c_void);
    }
    // SAFETY: `ssl` is a live SSL object with both BIOs set (the stream's); the address is
    // allocated here, written by the call (or cleared) and freed here.
    unsafe {
        let client = BIO_ADDR_new();
        if client.is_null() {
            return -1;
        }
        let r = DTLSv1_listen(ssl.as_ptr(), client);
        BIO_ADDR_free(client);
        r
    }
}

/// Where a session's `Ssl` keeps its peer's address (for the cookie).
fn peer_index() -> Result<Index<Ssl, SocketAddr>, ErrorStack> {
    static INDEX: std::sync::OnceLock<Result<Index<Ssl, SocketAddr>, ErrorStack>> = std::sync::OnceLock::new();
    INDEX.get_or_init(Ssl::new_ex_index).clone()
}

/// The cookie of `ssl`'s peer: a keyed hash of its address under a secret of this process.
fn cookie(ssl: &openssl::ssl::SslRef) -> Option<[u8; 32]> {
    static SECRET: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let secret = SECRET.get_or_init(|| {
        let mut s = [0u8; 32];
        // Without randomness the cookie is still a keyed hash, merely a guessable one.
        let _ = openssl::rand::rand_bytes(&mut s);
        s
    });
    let peer = ssl.ex_data(peer_index().ok()?)?;
    let mut h = openssl::sha::Sha256::new();
    h.update(secret);
    h.update(peer.to_string().as_bytes());
    Some(h.finish())
}

fn context(cert_file: &std::path::Path, key_file: &std::path::Path) -> Result<SslContext, DtlsError> {
    let err = |file: &std::path::Path| {
        let file = file.display().to_string();
        move |e: ErrorStack| DtlsError { file, why: e.to_string() }
    };
    let mut b = SslContextBuilder::new(SslMethod::dtls_server()).map_err(err(cert_file))?;
    b.set_min_proto_version(Some(openssl::ssl::SslVersion::DTLS1_2)).map_err(err(cert_file))?;
    b.set_certificate_chain_file(cert_file).map_err(err(cert_file))?;
    b.set_private_key_file(key_file, SslFiletype::PEM).map_err(err(key_file))?;
    b.check_private_key().map_err(err(key_file))?;
    b.set_options(SslOptions::COOKIE_EXCHANGE | SslOptions::NO_QUERY_MTU | SslOptions::NO_RENEGOTIATION);
    // An idle session keeps no record buffers (OpenSSL's are ~16 KiB each way).
    b.set_mode(openssl::ssl::SslMode::RELEASE_BUFFERS);
    b.set_cookie_generate_cb(|ssl, out| {
        let c = cookie(ssl).ok_or_else(ErrorStack::get)?;
        let n = c.len().min(out.len());
        out[..n].copy_from_slice(&c[..n]);
        Ok(n)
    });
    b.set_cookie_verify_cb(|ssl, given| cookie(ssl).is_some_and(|c| c.as_slice() == given));
    // Any client certificate: the handshake proves its key, the CoAP layer its validity
    // and whose it is.
    b.set_verify_callback(SslVerifyMode::PEER, |_, _| true);
    Ok(b.build())
}
