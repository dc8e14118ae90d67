//! CoAP over DTLS (`coap.dtls_bind`) on the real binary with libcoap's OpenSSL client
//! (`coap-client-openssl`, which checks the server's certificate against the test CA): a
//! device by its access token, a device by its X.509 certificate on ThingsBoard's token-less
//! paths, a certificate no device holds and an expired one (4.01 naming why); and as an
//! attacker: plain CoAP and garbage on the DTLS port (no answer), a HelloVerifyRequest no
//! larger than the ClientHello it answers (no amplification for a forged address), and the
//! session bound (`coap.max_dtls_sessions`), with the plain CoAP port unaffected.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::net::UdpSocket;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::pki::Pki;
use common::*;

/// `coap-client-openssl` POSTs `body` to `path`, trusting the test CA, with `cert` (a file
/// stem) if given; what it says (the response payload, or the error code and text).
fn post(dir: &Path, port: u16, path: &str, body: &str, cert: Option<&str>) -> String {
    let mut c = Command::new("coap-client-openssl");
    c.current_dir(dir).args(["-m", "post", "-t", "json", "-e", body, "-R", "ca.pem", "-B", "20"]);
    if let Some(stem) = cert {
        c.args(["-c", &format!("{stem}.pem"), "-j", &format!("{stem}.key")]);
    }
    let out = c.arg(format!("coaps://localhost:{port}{path}")).output().expect("coap-client-openssl (make deps)");
    // libcoap writes a success's payload to stdout, an error code and its text to stderr.
    [out.stdout, out.stderr].concat().iter().map(|&b| b as char).collect::<String>().trim().to_owned()
}

/// A DTLS 1.2 ClientHello offering ECDHE-ECDSA-AES128-GCM-SHA256, with `cookie` (the
/// second ClientHello, message and record sequence 1) or without (the first).
fn client_hello(cookie: &[u8]) -> Vec<u8> {
    let seq = u8::from(!cookie.is_empty());
    let mut body = vec![0xfe, 0xfd];
    body.extend([7u8; 32]); // random
    body.push(0); // session id: empty
    body.push(cookie.len() as u8);
    body.extend(cookie);
    body.extend([0, 2, 0xc0, 0x2b, 1, 0]); // one suite, null compression
    let ext = [
        &[0x00, 0x0a, 0, 4, 0, 2, 0, 0x17][..], // supported_groups: secp256r1
        &[0x00, 0x0b, 0, 2, 1, 0],              // ec_point_formats: uncompressed
        &[0x00, 0x0d, 0, 4, 0, 2, 4, 3],        // signature_algorithms: ecdsa_secp256r1_sha256
    ]
    .concat();
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let len = (body.len() as u32).to_be_bytes();
    let mut hs = vec![1, len[1], len[2], len[3], 0, seq, 0, 0, 0, len[1], len[2], len[3]];
    hs.extend(body);
    let mut record = vec![22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, seq];
    record.extend((hs.len() as u16).to_be_bytes());
    record.extend(hs);
    record
}

/// A client socket on `port`.
fn socket(port: u16) -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(("127.0.0.1", port)).unwrap();
    s
}

/// Sends `datagram` on `s`; the answer, if one comes within `wait`.
fn exchange(s: &UdpSocket, datagram: &[u8], wait: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(wait)).unwrap();
    s.send(datagram).unwrap();
    let mut buf = [0u8; 4096];
    s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
}

/// The cookie of a HelloVerifyRequest (record header 13 bytes, handshake header 12, then
/// the version and the cookie's length).
fn cookie(hello_verify_request: &[u8]) -> Vec<u8> {
    assert_eq!((hello_verify_request[0], hello_verify_request[13]), (22, 3), "{hello_verify_request:?}");
    let len = usize::from(hello_verify_request[27]);
    hello_verify_request[28..28 + len].to_vec()
}

#[test]
fn devices_post_over_dtls_by_token_and_by_certificate() {
    let pki = Pki::new();
    let dir = pki.dir.path();
    let port = free_udp_port();
    let s = Server::start_env(&[
        ("GRIDLINKS_TLS_CERT_FILE", &pki.p("server.pem")),
        ("GRIDLINKS_TLS_KEY_FILE", &pki.p("server.key")),
        ("GRIDLINKS_COAP_DTLS_BIND", &format!("127.0.0.1:{port}")),
    ]);
    for (name, days) in [("dev", 2), ("stranger", 2), ("old", -1)] {
        pki.client_cert(name, days);
    }
    let jwt = s.login();
    let by_token = s.device(&jwt, "by-token", "DTLS-TOKEN");
    assert_eq!(post(dir, port, "/api/v1/DTLS-TOKEN/telemetry", r#"{"ts":1,"values":{"t":1}}"#, None), "");
    let by_cert = s.device(&jwt, "by-cert", "UNUSED-TOKEN");
    let pem = std::fs::read_to_string(dir.join("dev.pem")).unwrap();
    let cred = json!({"deviceId": {"entityType": "DEVICE", "id": by_cert}, "credentialsType": "X509_CERTIFICATE",
        "credentialsValue": pem});
    assert_eq!(s.json("POST", "/api/device/credentials", &jwt, Some(cred)).0, 200);
    assert_eq!(post(dir, port, "/api/v1/telemetry", r#"{"ts":2,"values":{"t":2}}"#, Some("dev")), "");
    assert_eq!(s.stored_timestamps(&jwt, &by_token, "t"), [1].into());
    assert_eq!(s.stored_timestamps(&jwt, &by_cert, "t"), [2].into());
    // A certificate no device holds, and an expired one: 4.01 saying why, nothing stored.
    let stranger = post(dir, port, "/api/v1/telemetry", r#"{"ts":3,"values":{"t":3}}"#, Some("stranger"));
    assert!(stranger.contains("4.01") && stranger.contains("no device has this client certificate"), "{stranger}");
    let old = post(dir, port, "/api/v1/telemetry", r#"{"ts":4,"values":{"t":4}}"#, Some("old"));
    assert!(old.contains("4.01") && old.contains("validity"), "{old}");
    // The token-less path without a certificate names no device.
    let anonymous = post(dir, port, "/api/v1/telemetry", r#"{"ts":5,"values":{"t":5}}"#, None);
    assert!(anonymous.contains("4."), "{anonymous}");
    assert_eq!(s.stored_timestamps(&jwt, &by_cert, "t"), [2].into());
}

#[test]
fn the_dtls_port_answers_strangers_little_and_bounds_its_sessions() {
    let pki = Pki::new();
    let port = free_udp_port();
    let s = Server::start_env(&[
        ("GRIDLINKS_TLS_CERT_FILE", &pki.p("server.pem")),
        ("GRIDLINKS_TLS_KEY_FILE", &pki.p("server.key")),
        ("GRIDLINKS_COAP_DTLS_BIND", &format!("127.0.0.1:{port}")),
        ("GRIDLINKS_COAP_MAX_DTLS_SESSIONS", "2"),
    ]);
    let (quiet, wait) = (Duration::from_millis(500), Duration::from_secs(10));
    // Plain CoAP and garbage on the DTLS port: no answer, no session.
    let coap_post = [0x40, 0x02, 0x12, 0x34, 0xb3, b'a', b'p', b'i'];
    assert_eq!(exchange(&socket(port), &coap_post, quiet), None);
    assert_eq!(exchange(&socket(port), &[22, 0xfe, 0xfd, 0xff, 0xff], quiet), None);
    // A ClientHello gets a HelloVerifyRequest no larger than itself, and no session: what
    // a forged address gets. Sent again with the cookie, it opens a session (the server's
    // flight answers it).
    let hello = client_hello(&[]);
    let mut open = Vec::new();
    for _ in 0..2 {
        let client = socket(port);
        let hvr = exchange(&client, &hello, wait).expect("a HelloVerifyRequest");
        assert!(hvr.len() <= hello.len(), "{} bytes answer {} bytes", hvr.len(), hello.len());
        let flight = exchange(&client, &client_hello(&cookie(&hvr)), wait).expect("the server's flight");
        assert_eq!((flight[0], flight[13]), (22, 2), "a ServerHello");
        open.push(client);
    }
    let (_, metrics) = s.req("GET", "/metrics", None, None);
    assert!(metrics.contains("gridlinks_coap_dtls_sessions 2"), "only the two with cookies: {metrics}");
    // Two handshakes pending: a third client gets nothing.
    assert_eq!(exchange(&socket(port), &hello, quiet), None, "past coap.max_dtls_sessions");
    let (_, metrics) = s.req("GET", "/metrics", None, None);
    assert!(metrics.contains("gridlinks_coap_dtls_refused_total 1"), "{metrics}");
    // The plain port serves on.
    let jwt = s.login();
    let id = s.device(&jwt, "plain", "PLAIN-TOKEN");
    let out = Command::new("coap-client-notls")
        .args(["-m", "post", "-t", "json", "-e", r#"{"ts":9,"values":{"t":9}}"#, "-B", "20"])
        .arg(format!("coap://127.0.0.1:{}/api/v1/PLAIN-TOKEN/telemetry", s.coap_port))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(s.stored_timestamps(&jwt, &id, "t"), [9].into());
}
