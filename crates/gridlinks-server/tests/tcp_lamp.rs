//! Custom TCP protocols on the real binary: the lamp controller over `[[tcp.listeners]]`,
//! natively and through the shipped script, with real sockets — the issue's frames byte for
//! byte, replies only after the commit, bad CRCs and garbage counted and skipped, split and
//! pipelined frames, unknown identities refused, frames for another device rejected.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use gridlinks_protocols::lamp::{self, Report};

const LOGIN_HEX: &str = "68230068000000002000002226130007500100020802034C4F43373930302D4331454C36313000A35116";
const REPORT_HEX: &str = "68330068010000001300000e0000002001011003112700010fce590000003b400000dd242a426400000000000000000000000014000000f01216";
/// Every lamp reply: 12 payload bytes in a frame.
const REPLY_LEN: usize = 19;

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect()
}

/// A server with a native lamp listener (auto_provision) and a scripted one (registered
/// devices only).
struct Lamp {
    server: Server,
    native: u16,
    script: u16,
    _cfg: tempfile::TempDir,
}

fn start() -> Lamp {
    start_with("")
}

/// [`start`], with `extra` TOML appended to the configuration (in `cfg`'s directory).
fn start_with(extra: &str) -> Lamp {
    start_tcp("", extra)
}

/// [`start_with`], with `tcp_keys` in the `[tcp]` table.
fn start_tcp(tcp_keys: &str, extra: &str) -> Lamp {
    let cfg = tempfile::tempdir().unwrap();
    let (native, script) = (free_port(), free_port());
    let js = concat!(env!("CARGO_MANIFEST_DIR"), "/../../protocols/lamp.js");
    let path = cfg.path().join("gridlinks.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[tcp]
login_timeout = 1000
{tcp_keys}

[[tcp.listeners]]
bind = "127.0.0.1:{native}"
protocol = "lamp"
auto_provision = true

[[tcp.listeners]]
bind = "127.0.0.1:{script}"
protocol = "lamp"
script = "{js}"
{extra}
"#
        ),
    )
    .unwrap();
    let server = Server::start_env(&[("GRIDLINKS_CONFIG", path.to_str().unwrap())]);
    Lamp { server, native, script, _cfg: cfg }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn replies(s: &mut TcpStream, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            let mut r = vec![0; REPLY_LEN];
            s.read_exact(&mut r).unwrap();
            r
        })
        .collect()
}

/// Nothing more arrives within a moment (a rejected frame is not answered).
fn silent(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Err(e) => assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{e}"),
        Ok(n) => panic!("expected silence, read {n} bytes"),
    }
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
}

fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

fn metric(s: &Server, name: &str) -> f64 {
    let (_, text) = s.req("GET", "/metrics", None, None);
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name}"))
        .parse()
        .unwrap()
}

fn device_named(s: &Server, jwt: &str, name: &str) -> J {
    let (st, d) = s.json("GET", &format!("/api/tenant/devices?deviceName={name}"), jwt, None);
    assert_eq!(st, 200, "{name}: {d}");
    d
}

fn latest(s: &Server, jwt: &str, id: &str, keys: &str) -> J {
    let path = format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys={keys}&useStrictDataTypes=true");
    let (st, v) = s.json("GET", &path, jwt, None);
    assert_eq!(st, 200, "{v}");
    v
}

#[test]
fn the_sample_frames_byte_for_byte_with_auto_provisioning() {
    let l = start();
    let jwt = l.server.login();

    // The login: answered `80`, address and sequence echoed, accepted.
    let mut c = connect(l.native);
    c.write_all(&unhex(LOGIN_HEX)).unwrap();
    let want = lamp::frame(&unhex("800000002000002226130000"));
    assert_eq!(replies(&mut c, 1), vec![want]);
    let d = device_named(&l.server, &jwt, "lamp-000000200000");
    assert_eq!(d["type"], "lamp");
    assert_eq!(d["protocolIdentity"], json!({"protocol": "lamp", "id": "000000200000"}));
    let id = d["id"]["id"].as_str().unwrap().to_owned();
    let (_, attrs) =
        l.server.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/CLIENT_SCOPE"), &jwt, None);
    let attr = |k: &str| attrs.as_array().unwrap().iter().find(|a| a["key"] == k).map(|a| a["value"].clone());
    assert_eq!(attr("model"), Some(json!("LOC7900-C1EL610")));
    assert_eq!(attr("firmwareVersion"), Some(json!("1.00")));

    // The report, from another controller on its own connection after its login.
    let mut r = connect(l.native);
    r.write_all(&lamp::login_frame(&[0, 0, 0, 0x13, 0, 0], 13)).unwrap();
    r.write_all(&unhex(REPORT_HEX)).unwrap();
    assert_eq!(replies(&mut r, 2)[1], lamp::frame(&unhex("810000001300000e00000000")));
    let rid = device_named(&l.server, &jwt, "lamp-000000130000")["id"]["id"].as_str().unwrap().to_owned();
    let v = latest(&l.server, &jwt, &rid, "voltage,power,energy,dim,temperature,status,seq");
    let value = |k: &str| v[k][0]["value"].clone();
    assert_eq!(value("voltage"), json!(229.9));
    assert_eq!(value("power"), json!(42.536));
    assert_eq!(value("energy"), json!(16443));
    assert_eq!(value("dim"), json!(100));
    assert_eq!(value("temperature"), json!(20));
    assert_eq!(value("status"), json!(15));
    assert_eq!(value("seq"), json!(14));
    assert_eq!(metric(&l.server, "gridlinks_tcp_logins_total"), 2.0);
    assert_eq!(metric(&l.server, "gridlinks_tcp_frames_total"), 3.0);
}

/// `require_login` (on by default for `lamp`): a report before any login is rejected and
/// creates nothing; after the login it is taken. Off, a report's identity logs it in.
#[test]
fn lamp_reports_before_a_login_are_rejected_unless_require_login_is_off() {
    let lenient = free_port();
    let l = start_with(&format!(
        "[[tcp.listeners]]\nbind = \"127.0.0.1:{lenient}\"\nprotocol = \"lamp\"\nauto_provision = true\nrequire_login = false\n"
    ));
    let jwt = l.server.login();
    let addr = [0, 0, 0, 0, 0, 0x42];
    let r = Report { status: 0, voltage_cv: 1, energy_wh: 1, power_w: 1.0, dim: 1, temperature: 1 };
    let mut c = connect(l.native);
    c.write_all(&lamp::report_frame(&addr, 1, &r)).unwrap();
    silent(&mut c);
    assert_eq!(metric(&l.server, "gridlinks_tcp_rejected_total"), 1.0);
    let (st, _) = l.server.json("GET", "/api/tenant/devices?deviceName=lamp-000000000042", &jwt, None);
    assert_eq!(st, 404, "a report before login created no device");
    // The same connection logs in, and its report is then taken.
    c.write_all(&[lamp::login_frame(&addr, 2), lamp::report_frame(&addr, 3, &r)].concat()).unwrap();
    let got = replies(&mut c, 2);
    assert_eq!(got, vec![lamp::reply(lamp::LOGIN, &addr, 2), lamp::reply(lamp::REPORT, &addr, 3)]);
    // The scripted lamp listener marks logins the same way.
    let scripted = [0, 0, 0, 0, 0, 0x43];
    let id = l.server.device(&jwt, "pole-43", "POLE43");
    let cred = json!({"deviceId": {"id": id, "entityType": "DEVICE"}, "credentialsType": "PROTOCOL_IDENTITY", "credentialsId": "000000000043", "credentialsValue": "lamp"});
    assert_eq!(l.server.json("POST", "/api/device/credentials", &jwt, Some(cred)).0, 200);
    let mut s = connect(l.script);
    s.write_all(&lamp::report_frame(&scripted, 1, &r)).unwrap();
    silent(&mut s);
    assert_eq!(metric(&l.server, "gridlinks_tcp_rejected_total"), 2.0);
    s.write_all(&lamp::login_frame(&scripted, 2)).unwrap();
    assert_eq!(replies(&mut s, 1), vec![lamp::reply(lamp::LOGIN, &scripted, 2)]);
    // With require_login = false the report's identity logs the connection in.
    let mut o = connect(lenient);
    o.write_all(&lamp::report_frame(&[0, 0, 0, 0, 0, 0x44], 1, &r)).unwrap();
    assert_eq!(replies(&mut o, 1), vec![lamp::reply(lamp::REPORT, &[0, 0, 0, 0, 0, 0x44], 1)]);
    assert_eq!(device_named(&l.server, &jwt, "lamp-000000000044")["type"], "lamp");
}

/// A decoder script that makes a regular expression backtrack on device text (no login
/// needed: decoding comes first) is stopped by the time limit and closes only its own
/// connection: HTTP, MQTT, the native listener and the script listener keep serving, even
/// with a single script thread and several such frames at once.
#[test]
fn a_backtracking_script_stalls_only_its_own_connection() {
    let dir = tempfile::tempdir().unwrap();
    let js = dir.path().join("redos.js");
    std::fs::write(
        &js,
        r#"
        function frame(b) { const nl = b.indexOf(10); return nl < 0 ? 0 : nl + 1; }
        function decode(f) {
          const line = String.fromCharCode.apply(null, f.subarray(0, f.length - 1));
          if (/^(a+)+$/.test(line)) return { identity: "all-a", telemetry: { a: 1 } };
          const ok = "OK\n";
          return { identity: line, telemetry: { ok: 1 }, replies: [Array.from(ok, function (c) { return c.charCodeAt(0); })] };
        }"#,
    )
    .unwrap();
    let port = free_port();
    let l = start_tcp(
        "script_threads = 1",
        &format!(
            "[[tcp.listeners]]\nbind = \"127.0.0.1:{port}\"\nprotocol = \"redos\"\nauto_provision = true\n\n\
             [tcp.protocols.redos]\nframing = {{ kind = \"script\", max_frame = 128 }}\nscript = {:?}\n",
            js.display().to_string()
        ),
    );
    let evil = [&[b'a'; 42][..], b"b\n"].concat();
    let mut attackers: Vec<TcpStream> = (0..3).map(|_| connect(port)).collect();
    for a in &mut attackers {
        a.write_all(&evil).unwrap();
    }
    // Everything else answers meanwhile.
    let (st, _) = l.server.req("GET", "/healthz", None, None);
    assert_eq!(st, 200);
    let jwt = l.server.login();
    let token = "REDOS-NEIGHBOUR";
    l.server.device(&jwt, "neighbour", token);
    assert_eq!(l.server.telemetry(token, r#"{"t":1}"#), 200);
    let (mut mqtt, _) = mqtt::Raw::connect(l.server.mqtt_port, mqtt::ProtocolVersion::V3_1_1, Some(token), 60);
    mqtt.publish("v1/devices/me/telemetry", br#"{"t":2}"#, mqtt::QoS::AtLeastOnce, Some(1));
    assert!(matches!(mqtt.recv(), Some(mqtt::Packet::PubAck(_))));
    let mut lamp_conn = connect(l.native);
    lamp_conn.write_all(&lamp::login_frame(&[0, 0, 0, 0, 0, 0x51], 1)).unwrap();
    assert_eq!(replies(&mut lamp_conn, 1)[0][4], 0x80);
    // Each attacker's frame runs into the time limit and closes its connection.
    for a in &mut attackers {
        assert!(closed(a));
    }
    assert!(metric(&l.server, "gridlinks_tcp_decode_errors_total") >= 3.0);
    // The script listener still serves honest devices.
    let mut honest = connect(port);
    honest.write_all(b"meter-1\n").unwrap();
    let mut ok = [0u8; 3];
    honest.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"OK\n");
}

#[test]
fn bad_crc_garbage_split_and_pipelined_frames() {
    let l = start();
    let jwt = l.server.login();
    let addr = [0, 0, 0, 0, 0, 7];
    let report = |seq: u32| {
        let r = Report { status: 1, voltage_cv: 22000 + seq, energy_wh: seq, power_w: 10.5, dim: 50, temperature: 21 };
        lamp::report_frame(&addr, seq, &r)
    };
    let mut c = connect(l.native);
    // Login, three reports and a bad-CRC report, all in one write.
    let mut bad = report(99);
    bad[30] ^= 0xff;
    let burst = [lamp::login_frame(&addr, 1), report(2), report(3), bad, report(4)].concat();
    c.write_all(&burst).unwrap();
    let got = replies(&mut c, 4);
    let seqs: Vec<u8> = got.iter().map(|r| r[11]).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4], "replies in order, none for the bad CRC");
    assert_eq!(got[0][4], 0x80);
    assert!(got[1..].iter().all(|r| r[4] == 0x81));
    // Garbage, an absurd length, then a report one byte per write.
    c.write_all(b"\x00\xffgarbage\x68\xff\xff\x68\x00\x00").unwrap();
    for b in report(5) {
        c.write_all(&[b]).unwrap();
        c.flush().unwrap();
    }
    assert_eq!(replies(&mut c, 1)[0][11], 5);
    silent(&mut c);
    // At least: the bad CRC, the garbage, the absurd length.
    let bad = metric(&l.server, "gridlinks_tcp_bad_frames_total");
    assert!(bad >= 3.0, "{bad}");
    let id = device_named(&l.server, &jwt, "lamp-000000000007")["id"]["id"].as_str().unwrap().to_owned();
    let path = format!(
        "/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=seq,energy&startTs=0&endTs=9999999999999&limit=100&useStrictDataTypes=true"
    );
    let (_, v) = l.server.json("GET", &path, &jwt, None);
    let values =
        |k: &str| -> Vec<i64> { v[k].as_array().unwrap().iter().map(|p| p["value"].as_i64().unwrap()).collect() };
    let mut seqs = values("seq");
    seqs.sort();
    // Each report at its own timestamp (none merged), the bad-CRC frame's reading nowhere.
    assert_eq!(seqs, vec![2, 3, 4, 5], "{v}");
    assert!(!values("energy").contains(&99), "{v}");
}

#[test]
fn frames_for_another_device_are_rejected_and_unknown_identities_refused() {
    let l = start();
    let jwt = l.server.login();
    let (me, other) = ([0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 2]);
    let r = Report { status: 0, voltage_cv: 1, energy_wh: 1, power_w: 1.0, dim: 1, temperature: 1 };
    let mut c = connect(l.native);
    c.write_all(&lamp::login_frame(&me, 1)).unwrap();
    replies(&mut c, 1);
    // A report naming another controller, on my connection: rejected, not answered.
    c.write_all(&lamp::report_frame(&other, 2, &r)).unwrap();
    silent(&mut c);
    assert_eq!(metric(&l.server, "gridlinks_tcp_rejected_total"), 1.0);
    let (st, _) = l.server.json("GET", "/api/tenant/devices?deviceName=lamp-000000000002", &jwt, None);
    assert_eq!(st, 404, "no device was created for the foreign identity");
    // My own report still goes through.
    c.write_all(&lamp::report_frame(&me, 3, &r)).unwrap();
    assert_eq!(replies(&mut c, 1)[0][11], 3);

    // The scripted listener has no auto_provision: an unknown identity is refused, closed.
    let mut s = connect(l.script);
    s.write_all(&lamp::login_frame(&[9, 9, 9, 9, 9, 9], 1)).unwrap();
    assert!(closed(&mut s));
    assert_eq!(metric(&l.server, "gridlinks_tcp_logins_refused_total"), 1.0);

    // Registered with its protocol identity, the device logs in and reports through the script.
    let id = l.server.device(&jwt, "pole-17", "POLE17");
    let body = json!({"deviceId": {"id": id, "entityType": "DEVICE"}, "credentialsType": "PROTOCOL_IDENTITY", "credentialsId": "090909090909", "credentialsValue": "lamp"});
    let (st, cred) = l.server.json("POST", "/api/device/credentials", &jwt, Some(body.clone()));
    assert_eq!(st, 200, "{cred}");
    assert_eq!(
        (cred["credentialsType"].as_str(), cred["credentialsId"].as_str()),
        (Some("PROTOCOL_IDENTITY"), Some("090909090909"))
    );
    // No second device may take the same identity.
    let twin = l.server.device(&jwt, "pole-18", "POLE18");
    let (st, e) = l.server.json("POST", "/api/device/credentials", &jwt, Some(json!({"deviceId": {"id": twin}, "credentialsType": "PROTOCOL_IDENTITY", "credentialsId": "090909090909", "credentialsValue": "lamp"})));
    assert_eq!(st, 400, "{e}");
    let mut s = connect(l.script);
    let addr = [9, 9, 9, 9, 9, 9];
    s.write_all(&[lamp::login_frame(&addr, 1), lamp::report_frame(&addr, 2, &r)].concat()).unwrap();
    let got = replies(&mut s, 2);
    assert_eq!(got, vec![lamp::reply(lamp::LOGIN, &addr, 1), lamp::reply(lamp::REPORT, &addr, 2)]);
    let v = latest(&l.server, &jwt, &id, "voltage,seq");
    assert_eq!((v["voltage"][0]["value"].clone(), v["seq"][0]["value"].clone()), (json!(0.01), json!(2)));
    // Its access token still works beside the identity.
    assert_eq!(l.server.telemetry("POLE17", r#"{"t":1}"#), 200);
}

#[test]
fn a_silent_connection_is_closed_after_the_login_timeout() {
    let l = start();
    let mut c = connect(l.native);
    let started = std::time::Instant::now();
    assert!(closed(&mut c));
    // Closed, not timed out (the read gives up after 10 s); a busy machine may be slow.
    assert!(started.elapsed() < Duration::from_secs(9), "{:?}", started.elapsed());
    assert_eq!(metric(&l.server, "gridlinks_tcp_timeouts_total"), 1.0);
    // A flood of garbage is skipped without holding it: the server answers the next frame.
    let mut g = connect(l.native);
    let junk = vec![0x55u8; 1 << 20];
    g.write_all(&junk).unwrap();
    g.write_all(&lamp::login_frame(&[0, 0, 0, 0, 0, 3], 1)).unwrap();
    assert_eq!(replies(&mut g, 1)[0][4], 0x80);
}

/// A protocol defined only in configuration: lines `ID,TEMP`, cut by the script's own
/// `frame` hook and decoded by it, answered `OK ID`.
#[test]
fn a_protocol_from_configuration_with_a_scripted_framing_hook() {
    let dir = tempfile::tempdir().unwrap();
    let js = dir.path().join("lines.js");
    std::fs::write(
        &js,
        r#"
        function frame(b) { const nl = b.indexOf(10); return nl < 0 ? 0 : nl + 1; }
        function decode(f, session) {
          const line = String.fromCharCode.apply(null, f.subarray(0, f.length - 1));
          if (line === "spin") for (;;) {}
          const parts = line.split(",");
          if (parts.length !== 2) throw new Error("expected ID,TEMP, got " + line);
          const ok = "OK " + parts[0] + "\n";
          return { identity: parts[0], telemetry: { temperature: parseFloat(parts[1]) },
                   replies: [Array.from(ok, function (c) { return c.charCodeAt(0); })] };
        }"#,
    )
    .unwrap();
    let port = free_port();
    let l = start_with(&format!(
        "[[tcp.listeners]]\nbind = \"127.0.0.1:{port}\"\nprotocol = \"lines\"\nauto_provision = true\n\n\
         [tcp.protocols.lines]\nframing = {{ kind = \"script\", max_frame = 64 }}\nscript = {:?}\n",
        js.display().to_string()
    ));
    let jwt = l.server.login();
    let mut c = connect(port);
    c.write_all(b"s-1,21.5\ns-1,22\nnot a reading\ns-1,").unwrap();
    c.write_all(b"23.25\n").unwrap();
    let mut got = vec![0u8; 3 * 7];
    c.read_exact(&mut got).unwrap();
    assert_eq!(got, b"OK s-1\nOK s-1\nOK s-1\n");
    assert_eq!(metric(&l.server, "gridlinks_tcp_decode_errors_total"), 1.0);
    let d = device_named(&l.server, &jwt, "lines-s-1");
    assert_eq!(d["type"], "lines");
    let id = d["id"]["id"].as_str().unwrap().to_owned();
    let path = format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=temperature&startTs=0&endTs=9999999999999&limit=10&useStrictDataTypes=true");
    let (_, v) = l.server.json("GET", &path, &jwt, None);
    let mut temps: Vec<f64> =
        v["temperature"].as_array().unwrap().iter().map(|p| p["value"].as_f64().unwrap()).collect();
    temps.sort_by(f64::total_cmp);
    assert_eq!(temps, vec![21.5, 22.0, 23.25]);
    // A frame that runs the script into its time limit closes its connection.
    let mut spin = connect(port);
    spin.write_all(b"s-2,1\nspin\n").unwrap();
    let mut ok = vec![0u8; 7];
    spin.read_exact(&mut ok).unwrap();
    assert_eq!(ok, b"OK s-2\n");
    assert!(closed(&mut spin));
    // A line longer than max_frame cannot be followed: the connection is closed.
    c.write_all(&[b'x'; 100]).unwrap();
    assert!(closed(&mut c));
}

/// Server-side RPC reaches a lamp as a dimming command; the controller's answer completes
/// the call. A method the protocol has no frame for is counted, not sent. Deleting the
/// device closes its connection.
#[test]
fn server_side_rpc_dims_a_lamp_and_its_answer_completes_the_call() {
    let l = start();
    let jwt = l.server.login();
    let addr = [0, 0, 0, 0, 0, 9];
    let mut c = connect(l.native);
    c.write_all(&lamp::login_frame(&addr, 1)).unwrap();
    replies(&mut c, 1);
    let id = device_named(&l.server, &jwt, "lamp-000000000009")["id"]["id"].as_str().unwrap().to_owned();
    let rpc = format!("/api/plugins/rpc/twoway/{id}");
    let (status, answer) = std::thread::scope(|s| {
        let call = s.spawn(|| {
            l.server.json("POST", &rpc, &jwt, Some(json!({"method": "setDim", "params": {"dim": 40}, "timeout": 5000})))
        });
        let mut cmd = vec![0u8; REPLY_LEN];
        c.read_exact(&mut cmd).unwrap();
        let seq = u32::from_le_bytes(cmd[11..15].try_into().unwrap());
        assert_eq!(cmd, lamp::command(&addr, seq, 40));
        let mut ok = vec![0x90];
        ok.extend_from_slice(&addr);
        ok.extend_from_slice(&seq.to_le_bytes());
        ok.push(0);
        c.write_all(&lamp::frame(&ok)).unwrap();
        call.join().unwrap()
    });
    assert_eq!((status, answer), (200, json!({"result": "ok"})));
    assert_eq!(metric(&l.server, "gridlinks_tcp_downlinks_total"), 1.0);
    // A method the lamp has no frame for: delivered to the session, not sent, counted.
    let (st, _) = l.server.json(
        "POST",
        &format!("/api/plugins/rpc/oneway/{id}"),
        &jwt,
        Some(json!({"method": "reboot", "params": {}})),
    );
    assert_eq!(st, 200);
    silent(&mut c);
    assert_eq!(metric(&l.server, "gridlinks_tcp_downlink_errors_total"), 1.0);
    // Reports still flow; deleting the device closes its connection.
    let (st, _) = l.server.req("DELETE", &format!("/api/device/{id}"), Some(&jwt), None);
    assert_eq!(st, 200);
    assert!(closed(&mut c));
}

/// One identity may hold at most `mqtt.max_connections_per_credential` connections.
#[test]
fn connections_per_identity_are_bounded() {
    let l = start_with("[mqtt]\nmax_connections_per_credential = 1\n");
    let addr = [0, 0, 0, 0, 0, 5];
    let mut first = connect(l.native);
    first.write_all(&lamp::login_frame(&addr, 1)).unwrap();
    replies(&mut first, 1);
    let mut second = connect(l.native);
    second.write_all(&lamp::login_frame(&addr, 1)).unwrap();
    assert!(closed(&mut second));
    assert_eq!(metric(&l.server, "gridlinks_tcp_logins_refused_total"), 1.0);
    // Once the first is gone (the server notices when it will), the identity may connect
    // again.
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut third = connect(l.native);
        third.write_all(&lamp::login_frame(&addr, 2)).unwrap();
        let mut reply = vec![0; REPLY_LEN];
        if third.read_exact(&mut reply).is_ok() {
            assert_eq!(reply[4], 0x80);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the identity's slot was never given back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `auto_provision` stops at the listener's `max_devices`.
#[test]
fn auto_provisioning_stops_at_max_devices() {
    let port = free_port();
    let l = start_with(&format!(
        "[[tcp.listeners]]\nbind = \"127.0.0.1:{port}\"\nprotocol = \"lamp\"\nauto_provision = true\nmax_devices = 1\n"
    ));
    let mut a = connect(port);
    a.write_all(&lamp::login_frame(&[0, 0, 0, 0, 0, 0x21], 1)).unwrap();
    assert_eq!(replies(&mut a, 1)[0][4], 0x80);
    let mut b = connect(port);
    b.write_all(&lamp::login_frame(&[0, 0, 0, 0, 0, 0x22], 1)).unwrap();
    assert!(closed(&mut b));
    let jwt = l.server.login();
    let (st, _) = l.server.json("GET", "/api/tenant/devices?deviceName=lamp-000000000022", &jwt, None);
    assert_eq!(st, 404);
}

/// Custom TCP listeners share MQTT's bound on new connections per address: past the
/// burst a connection is closed before it is read (its login gets no answer); counted.
#[test]
fn new_connections_per_address_are_rate_limited_on_custom_tcp_too() {
    let l = start_with(
        "[mqtt]\nmax_connects_per_address = 1\nconnect_burst_per_address = 2\nconnect_rate_exempt_loopback = false\n",
    );
    let mut answered = 0;
    let refused = (0..100).any(|_| {
        let mut c = connect(l.native);
        let _ = c.write_all(&unhex(LOGIN_HEX));
        let mut reply = [0u8; REPLY_LEN];
        match c.read_exact(&mut reply) {
            Ok(()) => {
                answered += 1;
                false
            }
            Err(_) => true,
        }
    });
    assert!(refused && answered >= 2, "the burst of 2 is answered, then one is refused ({answered} answered)");
    let (_, metrics) = l.server.req("GET", "/metrics", None, None);
    let n = metrics.lines().find_map(|l| l.strip_prefix("gridlinks_tcp_over_connect_rate_total ")).unwrap();
    assert!(n.parse::<u64>().unwrap() >= 1, "{n}");
}
