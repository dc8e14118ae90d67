//! TLS on every TCP listener, on the real binary with real clients: mosquitto_pub and
//! mosquitto_sub over MQTT/TLS (a device token; a device's X.509 certificate), curl over
//! HTTPS, a rustls client on a custom TCP listener with `tls = true`; certificates made by
//! the openssl command line. As an attacker: garbage before the ClientHello, a handshake
//! that never finishes, an expired or unknown client certificate, another device's
//! certificate without its key, a renegotiation request; and the certificate reloaded on
//! SIGHUP (a bad file keeps the old one) with open connections kept.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::pki::Pki;
use common::*;
use serde_json::json;

/// A server with HTTPS, MQTT over TLS and a TLS lamp listener, on `pki`'s certificate.
struct Tls {
    s: Server,
    https: u16,
    mqtts: u16,
    lamp: u16,
    _cfg: tempfile::TempDir,
}

fn start(pki: &Pki) -> Tls {
    let cfg = tempfile::tempdir().unwrap();
    let (https, mqtts, lamp) = (free_port(), free_port(), free_port());
    let path = cfg.path().join("gridlinks.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[http]
tls_bind = "127.0.0.1:{https}"
tls_client_certs = true
[mqtt]
tls_bind = "127.0.0.1:{mqtts}"
[tls]
cert_file = "{cert}"
key_file = "{key}"
handshake_timeout = 1000
client_ca_file = "{apps_ca}"
[[tcp.listeners]]
bind = "127.0.0.1:{lamp}"
protocol = "lamp"
auto_provision = true
tls = true
"#,
            cert = pki.p("server.pem"),
            key = pki.p("server.key"),
            apps_ca = pki.p("apps-ca.pem"),
        ),
    )
    .unwrap();
    let s = Server::start_env(&[("GRIDLINKS_CONFIG", path.to_str().unwrap())]);
    Tls { s, https, mqtts, lamp, _cfg: cfg }
}

/// mosquitto_pub over TLS with `args`: whether it published (QoS 1: PUBACK received).
fn mosquitto_pub(pki: &Pki, port: u16, args: &[&str]) -> bool {
    Command::new("mosquitto_pub")
        .args(["-h", "localhost", "-p", &port.to_string(), "--cafile", &pki.p("ca.pem"), "-q", "1"])
        .args(["-t", "v1/devices/me/telemetry"])
        .args(args)
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// curl over HTTPS to `path` (`-X method`, `-d body` when given) with `args` (e.g. a client
/// certificate): the HTTP status, or 0 when no answer came (a refused handshake), and the body.
fn curl(pki: &Pki, port: u16, method: &str, path: &str, body: Option<&str>, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--cacert", &pki.p("ca.pem"), "-X", method, "-w", "\n%{http_code}"])
        .args(body.map(|b| ["-H", "Content-Type: application/json", "-d", b]).iter().flatten())
        .args(args)
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// The common name of the certificate the server presents on `port` (openssl s_client).
fn served_cn(pki: &Pki, port: u16) -> String {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-CAfile",
            &pki.p("ca.pem"),
            "-verify_return_error",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("subject=CN = "))
        .unwrap_or_else(|| panic!("no subject in {text}"))
        .to_owned()
}

/// Whether the server closes `s` (EOF or reset) before the test's long read timeout.
fn closed_by_server(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // an alert
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn mqtt_over_tls_by_token_and_by_x509_certificate() {
    let pki = Pki::new();
    let t = start(&pki);
    let jwt = t.s.login();
    let by_token = t.s.device(&jwt, "tls-token", "TLSTOKEN1");
    assert!(mosquitto_pub(&pki, t.mqtts, &["-u", "TLSTOKEN1", "-m", r#"{"ts":1,"values":{"t":1}}"#]));
    wait_until("the token device's point", || t.s.stored_timestamps(&jwt, &by_token, "t").len() == 1);

    // A device with X.509 credentials logs in by its certificate alone, whatever its
    // user name says (another device's token here).
    let pem = pki.client_cert("meter-1", 2);
    let by_cert = t.s.device(&jwt, "tls-cert", "TLSCERTTOKEN");
    let body = json!({"deviceId": {"entityType": "DEVICE", "id": by_cert}, "credentialsType": "X509_CERTIFICATE",
        "credentialsValue": pem});
    assert_eq!(t.s.json("POST", "/api/device/credentials", &jwt, Some(body)).0, 200);
    let cert = ["--cert", &pki.p("meter-1.pem"), "--key", &pki.p("meter-1.key")];
    assert!(mosquitto_pub(&pki, t.mqtts, &[&cert[..], &["-m", r#"{"ts":2,"values":{"x":5}}"#]].concat()));
    assert!(mosquitto_pub(
        &pki,
        t.mqtts,
        &[&cert[..], &["-u", "TLSTOKEN1", "-m", r#"{"ts":3,"values":{"x":6}}"#]].concat()
    ));
    wait_until("both points under the certificate's device", || t.s.stored_timestamps(&jwt, &by_cert, "x").len() == 2);
    assert!(t.s.stored_timestamps(&jwt, &by_token, "x").is_empty(), "the user name did not pick the device");

    // A certificate no device has is refused (not authorized), even with a good token; an
    // expired one fails the handshake.
    pki.client_cert("stranger", 2);
    let stranger = ["--cert", &pki.p("stranger.pem"), "--key", &pki.p("stranger.key")];
    assert!(!mosquitto_pub(
        &pki,
        t.mqtts,
        &[&stranger[..], &["-u", "TLSTOKEN1", "-m", r#"{"ts":4,"values":{"t":9}}"#]].concat()
    ));
    let expired_pem = pki.client_cert("expired", -1);
    let expired = ["--cert", &pki.p("expired.pem"), "--key", &pki.p("expired.key")];
    // Even once it is the device's credential.
    let body = json!({"deviceId": {"entityType": "DEVICE", "id": by_token}, "credentialsType": "X509_CERTIFICATE",
        "credentialsValue": expired_pem});
    assert_eq!(t.s.json("POST", "/api/device/credentials", &jwt, Some(body)).0, 200);
    assert!(!mosquitto_pub(&pki, t.mqtts, &[&expired[..], &["-m", r#"{"ts":5,"values":{"t":9}}"#]].concat()));
    // Another device's certificate (it is no secret) with a key that is not its own: the
    // handshake signature does not verify, nothing is connected.
    let connect = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04abcd";
    let mut impostor = tls_client_with(&pki, t.mqtts, Some(("meter-1", "stranger")));
    let _ = impostor.write_all(connect);
    let mut connack = [0u8; 4];
    assert!(impostor.read_exact(&mut connack).is_err(), "answered: {connack:02x?}");
    // With its own key, the same client is the device.
    let mut owner = tls_client_with(&pki, t.mqtts, Some(("meter-1", "meter-1")));
    owner.write_all(connect).unwrap();
    owner.read_exact(&mut connack).unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0]);
    drop(owner);
    // Plain MQTT on the TLS port: garbage before a ClientHello, closed.
    let mut plain = TcpStream::connect(("127.0.0.1", t.mqtts)).unwrap();
    plain.write_all(connect).unwrap();
    assert!(closed_by_server(plain));
    assert!(t.s.stored_timestamps(&jwt, &by_token, "t").len() == 1, "nothing else was stored");
    // Still serving.
    assert!(mosquitto_pub(&pki, t.mqtts, &[&cert[..], &["-m", r#"{"ts":6,"values":{"x":7}}"#]].concat()));
    let text = ureq::get(&format!("{}/metrics", t.s.base)).call().unwrap().into_string().unwrap();
    let refused = text.lines().find_map(|l| l.strip_prefix("gridlinks_mqtt_tls_handshakes_refused_total ")).unwrap();
    assert!(refused.parse::<u64>().unwrap() >= 3, "{refused}");
}

/// The HTTP device API over HTTPS by a device's X.509 certificate (`http.tls_client_certs`):
/// the token-less paths name the device by the certificate (curl `--cert --key`); a token
/// path is still its token's; an unknown certificate, an expired one, none at all, or plain
/// HTTP are refused and nothing is stored.
#[test]
fn https_device_api_by_x509_certificate() {
    let pki = Pki::new();
    let t = start(&pki);
    let jwt = t.s.login();
    let pem = pki.client_cert("lamp-1", 2);
    let lamp = t.s.device(&jwt, "https-cert", "HTTPSCERTTOKEN");
    let body = json!({"deviceId": {"entityType": "DEVICE", "id": lamp}, "credentialsType": "X509_CERTIFICATE",
        "credentialsValue": pem});
    assert_eq!(t.s.json("POST", "/api/device/credentials", &jwt, Some(body)).0, 200);
    let other = t.s.device(&jwt, "https-token", "HTTPSTOKEN2");
    let cert = ["--cert", &pki.p("lamp-1.pem"), "--key", &pki.p("lamp-1.key")];

    let post = |path: &str, body: &str, args: &[&str]| curl(&pki, t.https, "POST", path, Some(body), args);
    assert_eq!(post("/api/v1/telemetry", r#"{"ts":1,"values":{"x":1}}"#, &cert).0, 200);
    assert_eq!(post("/api/v1/attributes", r#"{"firmware":"v1.2"}"#, &cert).0, 200);
    let (st, attrs) = curl(&pki, t.https, "GET", "/api/v1/attributes?clientKeys=firmware", None, &cert);
    assert_eq!(
        (st, serde_json::from_str::<serde_json::Value>(&attrs).unwrap()),
        (200, json!({"client": {"firmware": "v1.2"}}))
    );
    let (st, limits) = post("/api/v1/rpc", r#"{"method":"getSessionLimits","params":{}}"#, &cert);
    assert_eq!(st, 200, "{limits}");
    // A token path is its token's device, whatever certificate the connection has.
    assert_eq!(post("/api/v1/HTTPSTOKEN2/telemetry", r#"{"ts":2,"values":{"x":2}}"#, &cert).0, 200);
    wait_until("the certificate's point", || t.s.stored_timestamps(&jwt, &lamp, "x") == [1].into());
    wait_until("the token's point", || t.s.stored_timestamps(&jwt, &other, "x") == [2].into());

    // Refused: a certificate no device has, none at all, plain HTTP; an expired one fails
    // the handshake.
    pki.client_cert("stranger", 2);
    let stranger = ["--cert", &pki.p("stranger.pem"), "--key", &pki.p("stranger.key")];
    let (st, why) = post("/api/v1/telemetry", r#"{"ts":3,"values":{"x":3}}"#, &stranger);
    assert_eq!(st, 401, "{why}");
    assert!(why.contains("X509_CERTIFICATE"), "{why}");
    assert_eq!(post("/api/v1/telemetry", r#"{"ts":4,"values":{"x":4}}"#, &[]).0, 401);
    assert_eq!(t.s.req("POST", "/api/v1/telemetry", None, Some(r#"{"ts":5,"values":{"x":5}}"#)).0, 401);
    pki.client_cert("expired", -1);
    let expired = ["--cert", &pki.p("expired.pem"), "--key", &pki.p("expired.key")];
    assert_eq!(post("/api/v1/telemetry", r#"{"ts":6,"values":{"x":6}}"#, &expired).0, 0);
    assert_eq!(t.s.stored_timestamps(&jwt, &lamp, "x"), [1].into(), "nothing refused was stored");
    assert_eq!(t.s.stored_timestamps(&jwt, &other, "x"), [2].into());
}

/// A TLS 1.2 client asking to renegotiate (openssl s_client's `R`) gets no new handshake
/// (rustls does not renegotiate), and the server serves on.
#[test]
fn renegotiation_is_refused() {
    let pki = Pki::new();
    let t = start(&pki);
    let jwt = t.s.login();
    t.s.device(&jwt, "after-renegotiation", "RENEGTOKEN");
    let mut client = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{}", t.mqtts), "-tls1_2", "-msg"])
        .args(["-CAfile", &pki.p("ca.pem"), "-servername", "localhost"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // s_client reads its commands once connected; what it says goes to both streams.
    let mut stdin = client.stdin.take().unwrap();
    stdin.write_all(b"R\n").unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    drop(stdin);
    let _ = client.kill();
    let done = client.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&[done.stdout, done.stderr].concat()).into_owned();
    assert!(out.contains("RENEGOTIATING"), "{out}");
    let server_hellos = out.lines().filter(|l| l.starts_with("<<<") && l.ends_with(", ServerHello")).count();
    assert_eq!(server_hellos, 1, "one handshake only: {out}");
    assert!(mosquitto_pub(&pki, t.mqtts, &["-u", "RENEGTOKEN", "-m", r#"{"ts":1,"values":{"v":1}}"#]));
}

#[test]
fn https_serves_the_api_and_bounds_the_handshake() {
    let pki = Pki::new();
    let t = start(&pki);
    let credentials = json!({"username": "admin", "password": ADMIN_PASSWORD}).to_string();
    let (st, body) = curl(&pki, t.https, "POST", "/api/auth/login", Some(&credentials), &[]);
    assert_eq!(st, 200, "{body}");
    let login: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(login["token"].is_string(), "{login}");
    // Plain HTTP on the HTTPS port: no answer in clear text, closed.
    let mut plain = TcpStream::connect(("127.0.0.1", t.https)).unwrap();
    plain.write_all(b"GET /api/noauth/healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(closed_by_server(plain));
    // A handshake that never finishes (nothing sent; half a ClientHello) is closed after
    // tls.handshake_timeout, on every TLS listener.
    for port in [t.https, t.mqtts, t.lamp] {
        assert!(closed_by_server(TcpStream::connect(("127.0.0.1", port)).unwrap()), "{port}");
        let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
        half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]).unwrap();
        assert!(closed_by_server(half), "{port}");
    }
    assert_eq!(t.s.req("GET", "/healthz", None, None).0, 200);
}

/// Presents a certificate, signing the handshake with whatever key it was given.
#[derive(Debug)]
struct Present(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for Present {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A rustls client trusting the test CA, presenting `pki`'s `{cert}.pem` signed with
/// `{key}.key` if given.
fn tls_client(pki: &Pki, port: u16) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    tls_client_with(pki, port, None)
}

fn tls_client_with(
    pki: &Pki,
    port: u16,
    cert_and_key: Option<(&str, &str)>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(pki.path("ca.pem")).unwrap();
    for c in rustls_pemfile_certs(&ca) {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match cert_and_key {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = rustls_pemfile_certs(&std::fs::read(pki.path(&format!("{cert}.pem"))).unwrap());
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(pki.path(&format!("{key}.key"))).unwrap();
            let key = provider.key_provider.load_private_key(key).unwrap();
            builder.with_client_cert_resolver(Arc::new(Present(Arc::new(rustls::sign::CertifiedKey::new(certs, key)))))
        }
    };
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem).map(Result::unwrap).collect()
}

#[test]
fn a_custom_tcp_listener_speaks_tls() {
    let pki = Pki::new();
    let t = start(&pki);
    let unhex =
        |h: &str| (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect::<Vec<u8>>();
    let login = unhex("68230068000000002000002226130007500100020802034C4F43373930302D4331454C36313000A35116");
    let mut c = tls_client(&pki, t.lamp);
    c.write_all(&login).unwrap();
    let mut reply = [0u8; 19];
    c.read_exact(&mut reply).unwrap();
    assert_eq!((reply[0], reply[18]), (0x68, 0x16), "a lamp reply frame: {reply:02x?}");
    let jwt = t.s.login();
    let (st, page) = t.s.json("GET", "/api/tenant/devices?pageSize=10&page=0&textSearch=lamp", &jwt, None);
    assert_eq!(st, 200);
    assert_eq!(page["data"].as_array().unwrap().len(), 1, "{page}");
}

#[test]
fn sighup_reloads_the_certificate_and_keeps_open_connections() {
    let pki = Pki::new();
    let mut t = start(&pki);
    let jwt = t.s.login();
    let id = t.s.device(&jwt, "tls-sub", "TLSSUBTOKEN");
    assert_eq!(served_cn(&pki, t.mqtts), "localhost");
    // A device subscribed over TLS before the reload.
    let sub = Command::new("mosquitto_sub")
        .args(["-h", "localhost", "-p", &t.mqtts.to_string(), "--cafile", &pki.p("ca.pem"), "-u", "TLSSUBTOKEN"])
        .args(["-t", "v1/devices/me/attributes", "-C", "1", "-W", "60"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let subscribed = || {
        let (_, v) =
            t.s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/SERVER_SCOPE"), &jwt, None);
        v.as_array().is_some_and(|a| a.iter().any(|kv| kv["key"] == "active" && kv["value"] == true))
    };
    wait_until("the subscriber connected", subscribed);
    std::thread::sleep(Duration::from_millis(500)); // its SUBSCRIBE follows the CONNECT

    // A new certificate (another common name) in place of the old one, then SIGHUP.
    pki.server_cert("next", "127.0.0.1");
    std::fs::copy(pki.path("next.pem"), pki.path("server.pem")).unwrap();
    std::fs::copy(pki.path("next.key"), pki.path("server.key")).unwrap();
    let hup = |pid: u32| assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success());
    hup(t.s.pid());
    wait_until("new handshakes get the new certificate", || served_cn(&pki, t.mqtts) == "127.0.0.1");
    assert_eq!(served_cn(&pki, t.https), "127.0.0.1");

    // A bad file keeps the certificate in use.
    std::fs::write(pki.path("server.pem"), "not a certificate").unwrap();
    hup(t.s.pid());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(served_cn(&pki, t.mqtts), "127.0.0.1");
    assert!(t.s.child.try_wait().unwrap().is_none(), "still running");

    // The connection made before the reload still gets its attribute update.
    let body = json!({"reloaded": true});
    let path = format!("/api/plugins/telemetry/DEVICE/{id}/attributes/SHARED_SCOPE");
    assert_eq!(t.s.json("POST", &path, &jwt, Some(body)).0, 200);
    let out = sub.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), r#"{"reloaded":true}"#);
}

/// ThingsBoard's X509_CERTIFICATE_CHAIN provisioning: a device profile holds a CA
/// certificate; a client whose certificate that CA signed becomes the profile's device named
/// by its CN (through the profile's pattern) on its first connection. A certificate that
/// merely sends the (public) CA certificate along, unsigned by it, gets nothing.
#[test]
fn a_certificate_signed_by_a_profiles_ca_provisions_its_device() {
    let pki = Pki::new();
    let t = start(&pki);
    let jwt = t.s.login();
    let fleet_ca = pki.ca("fleet-ca");
    let profile = json!({"name": "fleet", "type": "DEFAULT", "transportType": "DEFAULT", "profileData": {
        "configuration": {"type": "DEFAULT"}, "transportConfiguration": {"type": "DEFAULT"},
        "provisionConfiguration": {"type": "X509_CERTIFICATE_CHAIN", "provisionDeviceSecret": fleet_ca,
            "certificateRegExPattern": "meter-(.*)", "allowCreateNewDevicesByX509Certificate": true}}});
    let (st, saved) = t.s.json("POST", "/api/deviceProfile", &jwt, Some(profile));
    assert_eq!(st, 200, "{saved}");
    assert_eq!(saved["provisionType"], "X509_CERTIFICATE_CHAIN");
    assert_eq!(
        saved["provisionDeviceKey"].as_str().map(str::len),
        Some(64),
        "the CA certificate's fingerprint: {saved}"
    );

    pki.signed_client_cert("m7", "meter-CA-7", "fleet-ca");
    let cert = ["--cert", &pki.p("m7-chain.pem"), "--key", &pki.p("m7.key")];
    assert!(mosquitto_pub(&pki, t.mqtts, &[&cert[..], &["-m", r#"{"ts":10,"values":{"v":1}}"#]].concat()));
    let (st, page) = t.s.json("GET", "/api/tenant/devices?pageSize=10&page=0&textSearch=CA-7", &jwt, None);
    assert_eq!(st, 200);
    let device = &page["data"][0];
    assert_eq!(
        (device["name"].as_str(), device["deviceProfileId"]["id"] == saved["id"]["id"]),
        (Some("CA-7"), true),
        "{page}"
    );
    let id = device["id"]["id"].as_str().unwrap().to_owned();
    let (_, creds) = t.s.json("GET", &format!("/api/device/{id}/credentials"), &jwt, None);
    assert_eq!(creds["credentialsType"], "X509_CERTIFICATE", "{creds}");
    wait_until("the provisioned device's point", || t.s.stored_timestamps(&jwt, &id, "v").len() == 1);
    // Connecting again is the same device (found by its certificate now).
    assert!(mosquitto_pub(&pki, t.mqtts, &[&cert[..], &["-m", r#"{"ts":11,"values":{"v":2}}"#]].concat()));
    wait_until("the second point", || t.s.stored_timestamps(&jwt, &id, "v").len() == 2);
    // Over HTTPS the same: a device the chain provisions, here the one already made.
    let (st, why) = curl(&pki, t.https, "POST", "/api/v1/telemetry", Some(r#"{"ts":12,"values":{"v":3}}"#), &cert);
    assert_eq!(st, 200, "{why}");
    wait_until("the HTTPS point", || t.s.stored_timestamps(&jwt, &id, "v").len() == 3);
    pki.signed_client_cert("m6", "meter-CA-6", "fleet-ca");
    let six = ["--cert", &pki.p("m6-chain.pem"), "--key", &pki.p("m6.key")];
    assert_eq!(curl(&pki, t.https, "POST", "/api/v1/telemetry", Some(r#"{"ts":1,"values":{"v":1}}"#), &six).0, 200);

    // A self-made certificate that sends the CA's along: not signed by it, nothing made.
    pki.client_cert("meter-CA-8", 2);
    let forged = [std::fs::read_to_string(pki.path("meter-CA-8.pem")).unwrap(), fleet_ca].concat();
    std::fs::write(pki.path("forged-chain.pem"), forged).unwrap();
    let forged = ["--cert", &pki.p("forged-chain.pem"), "--key", &pki.p("meter-CA-8.key")];
    assert!(!mosquitto_pub(&pki, t.mqtts, &[&forged[..], &["-m", r#"{"ts":12,"values":{"v":3}}"#]].concat()));
    // Another CA's certificate: no profile, nothing made.
    pki.ca("other-ca");
    pki.signed_client_cert("m9", "meter-CA-9", "other-ca");
    let other = ["--cert", &pki.p("m9-chain.pem"), "--key", &pki.p("m9.key")];
    assert!(!mosquitto_pub(&pki, t.mqtts, &[&other[..], &["-m", r#"{"ts":13,"values":{"v":4}}"#]].concat()));
    let (_, page) = t.s.json("GET", "/api/tenant/devices?pageSize=10&page=0&textSearch=CA-", &jwt, None);
    let names: Vec<&str> = page["data"].as_array().unwrap().iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names.len(), 2, "only CA-7 and CA-6 (made over HTTPS): {page}");
}

/// Application clients by certificate: one issued by `tls.client_ca_file`'s CA logs in as
/// the MQTT client credential its CN names, without a password, within that credential's
/// ACL; the same CN from another issuer, or a CN no credential has, is refused.
#[test]
fn an_application_client_logs_in_by_a_certificate_its_ca_issued() {
    let pki = Pki::new();
    let t = start(&pki);
    let jwt = t.s.login();
    let cred =
        json!({"username": "dashboard", "password": "unused-Pw-1", "publish": ["apps/#"], "subscribe": ["apps/#"]});
    assert_eq!(t.s.json("POST", "/api/mqtt/clients", &jwt, Some(cred)).0, 200);
    let publish = |cert: &str, key: &str, topic: &str| {
        Command::new("mosquitto_pub")
            .args(["-h", "localhost", "-p", &t.mqtts.to_string(), "--cafile", &pki.p("ca.pem"), "-q", "1"])
            .args(["--cert", &pki.p(cert), "--key", &pki.p(key), "-i", "dash-1", "-t", topic, "-m", "hi"])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    pki.signed_client_cert("dash", "dashboard", "apps-ca");
    assert!(publish("dash-chain.pem", "dash.key", "apps/x"), "the CA's certificate for the credential's name");
    assert!(!publish("dash-chain.pem", "dash.key", "elsewhere/x"), "outside the credential's ACL");
    pki.client_cert("dashboard", 2); // self-made, the same CN
    assert!(!publish("dashboard.pem", "dashboard.key", "apps/x"), "another issuer");
    pki.signed_client_cert("stranger-app", "nobody", "apps-ca");
    assert!(!publish("stranger-app-chain.pem", "stranger-app.key", "apps/x"), "no credential of that name");

    // SIGHUP reads the client CA file again: another CA in its place, and its certificates
    // log in, the old CA's no more. A bad file keeps the CAs in use.
    pki.ca("apps-ca-2");
    pki.signed_client_cert("dash2", "dashboard", "apps-ca-2");
    assert!(!publish("dash2-chain.pem", "dash2.key", "apps/x"), "not a client CA yet");
    std::fs::copy(pki.path("apps-ca-2.pem"), pki.path("apps-ca.pem")).unwrap();
    let hup = || assert!(Command::new("kill").args(["-HUP", &t.s.pid().to_string()]).status().unwrap().success());
    hup();
    wait_until("the new client CA is read", || publish("dash2-chain.pem", "dash2.key", "apps/x"));
    assert!(!publish("dash-chain.pem", "dash.key", "apps/x"), "the old CA no more");
    std::fs::write(pki.path("apps-ca.pem"), "not a certificate").unwrap();
    hup();
    std::thread::sleep(Duration::from_millis(500));
    assert!(publish("dash2-chain.pem", "dash2.key", "apps/x"), "the CAs in use stay");
}
