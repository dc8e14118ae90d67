//! ThingsBoard's CoAP device API on the real binary, over real UDP: confirmable requests
//! answered in their ACK, non-confirmable ones with their own message, retransmissions
//! answered again without being stored twice, and every error code; the bounded exchange
//! store forgetting on a timer; answers to unverified endpoints within three times their
//! request (Echo, RFC 9175), with libcoap's client; messages RFC 7252 says to ignore,
//! reject or refuse.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::net::UdpSocket;
use std::time::Duration;

use coap_lite::{CoapOption, MessageClass, MessageType, Packet, RequestType, ResponseType};
use common::*;

struct Client {
    socket: UdpSocket,
}

impl Client {
    fn new(port: u16) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(("127.0.0.1", port)).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client { socket }
    }

    fn send(&self, p: &Packet) {
        self.socket.send(&p.to_bytes_unlimited().unwrap()).unwrap();
    }

    fn recv(&self) -> Packet {
        Packet::from_bytes(&self.recv_raw()).unwrap()
    }

    /// The next datagram, as it came.
    fn recv_raw(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 65_536];
        let n = self.socket.recv(&mut buf).unwrap();
        buf[..n].to_vec()
    }

    /// Verifies this endpoint's address: registers an observation of `path` (whose
    /// representation must be larger than three times the request, so that the answer is
    /// an Echo challenge), repeats it with the Echo value, then deregisters.
    fn verify(&self, path: &str, mid: u16) {
        let register = observe(mid, path, b"vf", 0);
        self.send(&register);
        let r = self.recv();
        assert_eq!(code(&r), ResponseType::Unauthorized, "an Echo challenge");
        let echo = r.get_first_option(ECHO).expect("an Echo option").clone();
        let mut again = observe(mid + 1, path, b"vf", 0);
        again.add_option(ECHO, echo);
        self.send(&again);
        assert_eq!(code(&self.recv()), ResponseType::Content);
        self.send(&observe(mid + 2, path, b"vf", 1));
        assert_eq!(code(&self.recv()), ResponseType::Content);
    }

    fn silent(&self) -> bool {
        self.socket.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut buf = [0u8; 2048];
        let quiet = self.socket.recv(&mut buf).is_err();
        self.socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        quiet
    }
}

/// The Echo option (RFC 9175).
const ECHO: CoapOption = CoapOption::Unknown(252);

fn request(kind: MessageType, method: RequestType, mid: u16, path: &str, body: &[u8]) -> Packet {
    let mut p = Packet::new();
    p.header.set_version(1);
    p.header.set_type(kind);
    p.header.code = MessageClass::Request(method);
    p.header.message_id = mid;
    p.set_token(vec![0xbe, 0xef, (mid >> 8) as u8, mid as u8]);
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        p.add_option(CoapOption::UriPath, seg.as_bytes().to_vec());
    }
    for q in query.split('&').filter(|s| !s.is_empty()) {
        p.add_option(CoapOption::UriQuery, q.as_bytes().to_vec());
    }
    p.payload = body.to_vec();
    p
}

fn code(p: &Packet) -> ResponseType {
    match p.header.code {
        MessageClass::Response(r) => r,
        other => panic!("not a response: {other:?}"),
    }
}

fn stored(s: &Server, jwt: &str, id: &str, key: &str) -> usize {
    let path = format!(
        "/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys={key}&startTs=0&endTs=9999999999999&limit=1000"
    );
    let (st, v) = s.json("GET", &path, jwt, None);
    assert_eq!(st, 200, "{v}");
    v[key].as_array().map_or(0, Vec::len)
}

#[test]
fn confirmable_and_non_confirmable_posts_are_stored_once_and_answered_after_the_commit() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "coap-1", "COAPTOKEN1");
    let c = Client::new(s.coap_port);

    // CON: the answer rides in the ACK (same message id and token).
    let req =
        request(MessageType::Confirmable, RequestType::Post, 0x1001, "/api/v1/COAPTOKEN1/telemetry", br#"{"t":21.5}"#);
    c.send(&req);
    let ack = c.recv();
    assert_eq!(ack.header.get_type(), MessageType::Acknowledgement);
    assert_eq!(ack.header.message_id, 0x1001);
    assert_eq!(ack.get_token(), req.get_token());
    assert_eq!(code(&ack), ResponseType::Created);
    assert_eq!(stored(&s, &jwt, &id, "t"), 1);

    // A retransmission (same message id) gets the same answer and is not stored again.
    c.send(&req);
    let again = c.recv();
    assert_eq!(again.to_bytes().unwrap(), ack.to_bytes().unwrap());
    assert_eq!(stored(&s, &jwt, &id, "t"), 1);

    // NON: answered with a NON of the server's own message id, the request's token.
    let non =
        request(MessageType::NonConfirmable, RequestType::Post, 0x1002, "/api/v1/COAPTOKEN1/telemetry", br#"{"u":1}"#);
    c.send(&non);
    let r = c.recv();
    assert_eq!(r.header.get_type(), MessageType::NonConfirmable);
    assert_eq!(r.get_token(), non.get_token());
    assert_eq!(code(&r), ResponseType::Created);
    assert_eq!(stored(&s, &jwt, &id, "u"), 1);

    // Client attributes, then both scopes read back.
    let attrs = request(
        MessageType::Confirmable,
        RequestType::Post,
        0x1003,
        "/api/v1/COAPTOKEN1/attributes",
        br#"{"fw":"v2"}"#,
    );
    c.send(&attrs);
    assert_eq!(code(&c.recv()), ResponseType::Created);
    let (st, _) = s.json(
        "POST",
        &format!("/api/plugins/telemetry/DEVICE/{id}/attributes/SHARED_SCOPE"),
        &jwt,
        Some(json!({"mode": "eco"})),
    );
    assert_eq!(st, 200);
    let get = request(
        MessageType::Confirmable,
        RequestType::Get,
        0x1004,
        "/api/v1/COAPTOKEN1/attributes?clientKeys=fw&sharedKeys=mode",
        b"",
    );
    c.send(&get);
    let r = c.recv();
    assert_eq!(code(&r), ResponseType::Content);
    let body: J = serde_json::from_slice(&r.payload).unwrap();
    assert_eq!(body, json!({"client": {"fw": "v2"}, "shared": {"mode": "eco"}}));
}

#[test]
fn bad_tokens_payloads_paths_methods_sizes_and_packets_get_clear_codes() {
    let s =
        Server::start_env(&[("GRIDLINKS_COAP_MAX_PAYLOAD_BYTES", "1024"), ("GRIDLINKS_COAP_MAX_OBSERVATIONS", "2")]);
    let jwt = s.login();
    s.device(&jwt, "coap-2", "COAPTOKEN2");
    let c = Client::new(s.coap_port);
    let con = |mid, method, path: &str, body: &[u8]| {
        c.send(&request(MessageType::Confirmable, method, mid, path, body));
        let r = c.recv();
        assert_eq!(r.header.message_id, mid);
        (code(&r), String::from_utf8_lossy(&r.payload).into_owned())
    };
    let (code1, why) = con(1, RequestType::Post, "/api/v1/WRONG/telemetry", br#"{"t":1}"#);
    assert_eq!(code1, ResponseType::Unauthorized, "{why}");
    let (code2, why) = con(2, RequestType::Post, "/api/v1/COAPTOKEN2/telemetry", b"{not json");
    assert_eq!(code2, ResponseType::BadRequest);
    assert!(why.contains("JSON"), "{why}");
    assert_eq!(con(3, RequestType::Post, "/api/v1/COAPTOKEN2/nothing", b"{}").0, ResponseType::NotFound);
    assert_eq!(con(4, RequestType::Get, "/nothing/at/all", b"").0, ResponseType::NotFound);
    assert_eq!(con(5, RequestType::Get, "/api/v1/COAPTOKEN2/telemetry", b"").0, ResponseType::MethodNotAllowed);
    let over = format!(r#"{{"k":"{}"}}"#, "x".repeat(1100));
    let (code6, why) = con(6, RequestType::Post, "/api/v1/COAPTOKEN2/telemetry", over.as_bytes());
    assert_eq!(code6, ResponseType::RequestEntityTooLarge);
    assert!(why.contains("coap.max_payload_bytes"), "{why}");
    // Not CoAP: a confirmable header with a 9-byte token (at most 8) gets a Reset; garbage nothing.
    c.socket.send(&[0x49, 0x02, 0x00, 0x07, 1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    let reset = c.recv();
    assert_eq!((reset.header.get_type(), reset.header.message_id), (MessageType::Reset, 7));
    c.socket.send(b"hello").unwrap();
    assert!(c.silent());
    // A CoAP ping (empty CON) is answered with a Reset.
    let mut ping = Packet::new();
    ping.header.set_version(1);
    ping.header.set_type(MessageType::Confirmable);
    ping.header.code = MessageClass::Empty;
    ping.header.message_id = 9;
    c.send(&ping);
    assert_eq!(c.recv().header.get_type(), MessageType::Reset);
    // The server still serves.
    assert_eq!(con(10, RequestType::Post, "/api/v1/COAPTOKEN2/telemetry", br#"{"ok":1}"#).0, ResponseType::Created);

    // Observations: a bad token registers nothing; past coap.max_observations a new one
    // gets 5.03 naming the setting, while re-registering an existing token still works.
    let watch = |mid, token: &[u8], path: &str, value| {
        c.send(&observe(mid, path, token, value));
        let r = c.recv();
        (code(&r), String::from_utf8_lossy(&r.payload).into_owned())
    };
    assert_eq!(watch(20, b"o0", "/api/v1/WRONG/rpc", 0).0, ResponseType::Unauthorized);
    assert_eq!(watch(21, b"o1", "/api/v1/COAPTOKEN2/rpc", 0).0, ResponseType::Content);
    assert_eq!(watch(22, b"o2", "/api/v1/COAPTOKEN2/attributes", 0).0, ResponseType::Content);
    let (full, why) = watch(23, b"o3", "/api/v1/COAPTOKEN2/rpc", 0);
    assert_eq!(full, ResponseType::ServiceUnavailable);
    assert!(why.contains("coap.max_observations"), "{why}");
    assert_eq!(watch(24, b"o1", "/api/v1/COAPTOKEN2/rpc", 0).0, ResponseType::Content);
    assert_eq!(watch(25, b"o1", "/api/v1/COAPTOKEN2/rpc", 7).0, ResponseType::BadOption);
    assert_eq!(metric(&s, "gridlinks_coap_observations"), "2");
}

/// A GET with Observe `value` (0 registers, 1 deregisters) and its own `token`.
fn observe(mid: u16, path: &str, token: &[u8], value: u32) -> Packet {
    let mut p = request(MessageType::Confirmable, RequestType::Get, mid, path, b"");
    p.set_token(token.to_vec());
    p.set_observe_value(value);
    p
}

fn empty(kind: MessageType, mid: u16) -> Packet {
    let mut p = Packet::new();
    p.header.set_version(1);
    p.header.set_type(kind);
    p.header.code = MessageClass::Empty;
    p.header.message_id = mid;
    p
}

fn observe_seq(p: &Packet) -> u32 {
    p.get_observe_value().expect("an Observe option").unwrap()
}

fn metric(s: &Server, name: &str) -> String {
    let (_, text) = s.req("GET", "/metrics", None, None);
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name} in {text}"));
    line.rsplit(' ').next().unwrap().to_owned()
}

#[test]
fn observed_attributes_and_rpc_reach_the_device_and_its_answers_complete_the_call() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "coap-obs", "OBSTOKEN");
    let other = s.device(&jwt, "coap-other", "OTHERTOKEN");
    let shared = format!("/api/plugins/telemetry/DEVICE/{id}/attributes/SHARED_SCOPE");
    assert_eq!(s.json("POST", &shared, &jwt, Some(json!({"mode": "eco"}))).0, 200);
    let c = Client::new(s.coap_port);

    // Registration: answered with the current shared attributes and an Observe value.
    c.send(&observe(0x2001, "/api/v1/OBSTOKEN/attributes", b"at", 0));
    let r = c.recv();
    assert_eq!((r.header.get_type(), code(&r)), (MessageType::Acknowledgement, ResponseType::Content));
    assert_eq!(serde_json::from_slice::<J>(&r.payload).unwrap(), json!({"mode": "eco"}));
    let mut seq = observe_seq(&r);
    assert_eq!(metric(&s, "gridlinks_coap_observations"), "1");

    // Each shared update arrives as a confirmable notification with a growing Observe value.
    for value in ["boost", "off"] {
        assert_eq!(s.json("POST", &shared, &jwt, Some(json!({"mode": value}))).0, 200);
        let n = c.recv();
        assert_eq!((n.header.get_type(), code(&n)), (MessageType::Confirmable, ResponseType::Content));
        assert_eq!(n.get_token(), b"at");
        assert_eq!(serde_json::from_slice::<J>(&n.payload).unwrap(), json!({"mode": value}));
        assert!(observe_seq(&n) > seq);
        seq = observe_seq(&n);
        c.send(&empty(MessageType::Acknowledgement, n.header.message_id));
    }
    // Another device's update is not this device's business.
    let theirs = format!("/api/plugins/telemetry/DEVICE/{other}/attributes/SHARED_SCOPE");
    assert_eq!(s.json("POST", &theirs, &jwt, Some(json!({"mode": "x"}))).0, 200);
    assert!(c.silent());

    // Server-side RPC: the observer of …/rpc receives it, its POST …/rpc/{id} answers it.
    c.send(&observe(0x2002, "/api/v1/OBSTOKEN/rpc", b"rp", 0));
    let r = c.recv();
    assert_eq!(code(&r), ResponseType::Content);
    assert!(r.get_observe_value().is_some());
    std::thread::scope(|scope| {
        let call = scope.spawn(|| {
            let body = json!({"method": "setDim", "params": {"level": 3}, "timeout": 10000});
            s.json("POST", &format!("/api/rpc/twoway/{id}"), &jwt, Some(body))
        });
        let n = c.recv();
        assert_eq!((n.header.get_type(), n.get_token()), (MessageType::Confirmable, &b"rp"[..]));
        let req: J = serde_json::from_slice(&n.payload).unwrap();
        assert_eq!((&req["method"], &req["params"]), (&json!("setDim"), &json!({"level": 3})));
        c.send(&empty(MessageType::Acknowledgement, n.header.message_id));
        let answer_path = format!("/api/v1/OBSTOKEN/rpc/{}", req["id"]);
        c.send(&request(MessageType::Confirmable, RequestType::Post, 0x2003, &answer_path, br#"{"done":true}"#));
        assert_eq!(code(&c.recv()), ResponseType::Created);
        assert_eq!(call.join().unwrap(), (200, json!({"done": true})));
    });

    // Deregistering (Observe 1, same token): the device is no longer reachable for RPC.
    c.send(&observe(0x2004, "/api/v1/OBSTOKEN/rpc", b"rp", 1));
    let r = c.recv();
    assert_eq!(code(&r), ResponseType::Content);
    assert!(r.get_observe_value().is_none(), "a deregistration's answer is not a notification");
    let oneway = json!({"method": "ping", "params": {}});
    assert_eq!(s.json("POST", &format!("/api/rpc/oneway/{id}"), &jwt, Some(oneway)).0, 409);

    // A Reset in answer to a notification ends that observation.
    assert_eq!(s.json("POST", &shared, &jwt, Some(json!({"mode": "reset-me"}))).0, 200);
    let n = c.recv();
    c.send(&empty(MessageType::Reset, n.header.message_id));
    wait_until("no observation", || metric(&s, "gridlinks_coap_observations") == "0");
    assert_eq!(s.json("POST", &shared, &jwt, Some(json!({"mode": "unheard"}))).0, 200);
    assert!(c.silent());

    // Deleting the device ends its observations with a final 4.04.
    c.send(&observe(0x2005, "/api/v1/OBSTOKEN/attributes", b"a2", 0));
    assert_eq!(code(&c.recv()), ResponseType::Content);
    assert_eq!(s.req("DELETE", &format!("/api/device/{id}"), Some(&jwt), None).0, 200);
    let end = c.recv();
    assert_eq!((end.get_token(), code(&end)), (&b"a2"[..], ResponseType::NotFound));
    wait_until("no observation", || metric(&s, "gridlinks_coap_observations") == "0");

    // Client-side RPC: the session limits, as ThingsBoard's SDK asks them.
    let ask = request(
        MessageType::Confirmable,
        RequestType::Post,
        0x2006,
        "/api/v1/OTHERTOKEN/rpc",
        br#"{"method":"getSessionLimits","params":{}}"#,
    );
    c.send(&ask);
    let r = c.recv();
    assert_eq!(code(&r), ResponseType::Content);
    assert_eq!(serde_json::from_slice::<J>(&r.payload).unwrap()["maxPayloadSize"], json!(16384));
    // GET …/rpc without Observe is refused with a reason.
    let (plain, why) = {
        c.send(&request(MessageType::Confirmable, RequestType::Get, 0x2007, "/api/v1/OTHERTOKEN/rpc", b""));
        let r = c.recv();
        (code(&r), String::from_utf8_lossy(&r.payload).into_owned())
    };
    assert_eq!(plain, ResponseType::BadRequest);
    assert!(why.contains("Observe"), "{why}");
}

/// A request carrying `block` as its Block1 or Block2 option.
fn with_block(mut p: Packet, option: CoapOption, num: u32, more: bool, szx: u8) -> Packet {
    let v = num << 4 | u32::from(more) << 3 | u32::from(szx);
    let bytes: Vec<u8> = v.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
    p.add_option(option, bytes);
    p
}

fn block_of(p: &Packet, option: CoapOption) -> (u32, bool, u8) {
    let v = p.get_first_option(option).unwrap_or_else(|| panic!("{option:?} in {p:?}"));
    let v = v.iter().fold(0u32, |v, b| v << 8 | u32::from(*b));
    (v >> 4, v & 8 != 0, (v & 7) as u8)
}

#[test]
fn bodies_and_answers_travel_in_blocks() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "coap-blocks", "BLOCKTOKEN");
    let c = Client::new(s.coap_port);
    let mut mid = 0x3000;
    let ask = |p: Packet| {
        c.send(&p);
        let r = c.recv();
        assert_eq!(r.header.message_id, p.header.message_id);
        r
    };
    let mut next = || {
        mid += 1;
        mid
    };

    // A telemetry body in 16-byte blocks: 2.31 Continue for each but the last, then 2.01.
    let body = br#"{"temperature":21.5,"humidity":40,"pressure":1013}"#;
    let blocks: Vec<&[u8]> = body.chunks(16).collect();
    for (n, chunk) in blocks.iter().enumerate() {
        let more = n + 1 < blocks.len();
        let p = request(MessageType::Confirmable, RequestType::Post, next(), "/api/v1/BLOCKTOKEN/telemetry", chunk);
        let r = ask(with_block(p, CoapOption::Block1, n as u32, more, 0));
        let want = if more { ResponseType::Continue } else { ResponseType::Created };
        assert_eq!(code(&r), want, "block {n}");
        assert_eq!(block_of(&r, CoapOption::Block1), (n as u32, more, 0));
    }
    assert_eq!(stored(&s, &jwt, &id, "pressure"), 1);

    // A block out of order: 4.08; a body past coap.max_payload_bytes: 4.13 with Size1.
    let p = request(MessageType::Confirmable, RequestType::Post, next(), "/api/v1/BLOCKTOKEN/attributes", &[b'x'; 16]);
    assert_eq!(code(&ask(with_block(p, CoapOption::Block1, 2, true, 0))), ResponseType::RequestEntityIncomplete);
    let p = request(MessageType::Confirmable, RequestType::Post, next(), "/api/v1/BLOCKTOKEN/telemetry", &[b'x'; 256]);
    let r = ask(with_block(p, CoapOption::Block1, 64, true, 4));
    assert_eq!(code(&r), ResponseType::RequestEntityTooLarge);
    assert_eq!(r.get_first_option(CoapOption::Size1), Some(&16384u32.to_be_bytes()[2..].to_vec()));
    // A block bigger than its size exponent says: 4.00.
    let p = request(MessageType::Confirmable, RequestType::Post, next(), "/api/v1/BLOCKTOKEN/telemetry", &[b'x'; 40]);
    assert_eq!(code(&ask(with_block(p, CoapOption::Block1, 0, false, 0))), ResponseType::BadRequest);

    // Attributes larger than one block: read in 1,024-byte blocks, or smaller ones asked for.
    let many: serde_json::Map<String, J> = (0..40).map(|i| (format!("key{i:02}"), json!("v".repeat(40)))).collect();
    let shared = format!("/api/plugins/telemetry/DEVICE/{id}/attributes/SHARED_SCOPE");
    assert_eq!(s.json("POST", &shared, &jwt, Some(J::Object(many.clone()))).0, 200);
    // A 1,024-byte block is larger than three times its request: the endpoint proves its
    // address first (Echo), once.
    c.verify("/api/v1/BLOCKTOKEN/attributes", 0x3800);
    let whole = json!({"shared": many});
    for szx in [None, Some(2u8)] {
        let mut got = Vec::new();
        let mut etag = None;
        for n in 0.. {
            let p = request(MessageType::Confirmable, RequestType::Get, next(), "/api/v1/BLOCKTOKEN/attributes", b"");
            let p = match szx {
                Some(szx) => with_block(p, CoapOption::Block2, n, false, szx),
                None if n == 0 => p,
                None => with_block(p, CoapOption::Block2, n, false, 6),
            };
            let r = ask(p);
            assert_eq!(code(&r), ResponseType::Content);
            let (num, more, size) = block_of(&r, CoapOption::Block2);
            assert_eq!((num, size), (n, szx.unwrap_or(6)));
            assert!(r.payload.len() <= 16 << size);
            let tag = r.get_first_option(CoapOption::ETag).cloned();
            assert!(etag.is_none() || etag == tag, "one representation, one ETag");
            etag = tag;
            got.extend_from_slice(&r.payload);
            if !more {
                break;
            }
        }
        assert_eq!(serde_json::from_slice::<J>(&got).unwrap(), whole);
    }
    let p = request(MessageType::Confirmable, RequestType::Get, next(), "/api/v1/BLOCKTOKEN/attributes", b"");
    assert_eq!(code(&ask(with_block(p, CoapOption::Block2, 99, false, 6))), ResponseType::BadOption);
}

/// A confirmable POST of `body` to `path` with the extra `options` (number, value).
fn post_with(mid: u16, path: &str, options: &[(u16, &[u8])], body: &[u8]) -> Packet {
    let mut p = request(MessageType::Confirmable, RequestType::Post, mid, path, body);
    for (n, v) in options {
        p.add_option(CoapOption::from(*n), v.to_vec());
    }
    p
}

fn count(s: &Server, name: &str) -> u64 {
    metric(s, name).parse().unwrap()
}

#[test]
fn unknown_versions_format_errors_critical_options_and_content_formats_are_handled_as_rfc_7252_says() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "coap-rfc", "RFCTOKEN");
    let c = Client::new(s.coap_port);
    let path = "/api/v1/RFCTOKEN/telemetry";

    // Version 0 (the header's first two bits), otherwise a good telemetry post: ignored,
    // not answered, not stored (RFC 7252 §3).
    let mut v0 = post_with(0x4001, path, &[], br#"{"v0":1}"#).to_bytes().unwrap();
    v0[0] &= 0x3f;
    c.socket.send(&v0).unwrap();
    assert!(c.silent(), "a version-0 message is ignored");

    // An unrecognized critical option (9, odd): 4.02 for a CON, a Reset for a NON; nothing
    // stored either way (§5.4.1).
    c.send(&post_with(0x4002, path, &[(9, b"")], br#"{"crit":1}"#));
    let r = c.recv();
    assert_eq!((r.header.message_id, code(&r)), (0x4002, ResponseType::BadOption));
    assert!(String::from_utf8_lossy(&r.payload).contains("option 9"), "{r:?}");
    let mut non = post_with(0x4003, path, &[(9, b"")], br#"{"crit":2}"#);
    non.header.set_type(MessageType::NonConfirmable);
    c.send(&non);
    let r = c.recv();
    assert_eq!((r.header.get_type(), r.header.message_id), (MessageType::Reset, 0x4003));
    // An unknown elective option (even) is ignored.
    c.send(&post_with(0x4004, path, &[(2048, b"x")], br#"{"elective":1}"#));
    assert_eq!(code(&c.recv()), ResponseType::Created);

    // A payload marker with nothing after it is a format error: a Reset for a CON, silence
    // for a NON (§3, §4.2, §4.3).
    let mut empty = post_with(0x4005, path, &[], b"").to_bytes().unwrap();
    empty.push(0xff);
    c.socket.send(&empty).unwrap();
    let r = c.recv();
    assert_eq!((r.header.get_type(), r.header.message_id), (MessageType::Reset, 0x4005));
    empty[0] = (empty[0] & !0x30) | 0x10;
    c.socket.send(&empty).unwrap();
    assert!(c.silent(), "a malformed NON is ignored");

    // Content-Format: CBOR (60) and octet-stream (42) get 4.15; JSON (50), text (0) or none
    // are read as JSON.
    let cbor = [0xa1, 0x61, b'c', 0x01]; // {"c": 1}
    c.send(&post_with(0x4006, path, &[(12, &[60])], &cbor));
    assert_eq!(code(&c.recv()), ResponseType::UnsupportedContentFormat);
    c.send(&post_with(0x4007, "/api/v1/RFCTOKEN/attributes", &[(12, &[42])], br#"{"a":1}"#));
    assert_eq!(code(&c.recv()), ResponseType::UnsupportedContentFormat);
    c.send(&post_with(0x4008, path, &[(12, &[50])], br#"{"json":1}"#));
    assert_eq!(code(&c.recv()), ResponseType::Created);
    c.send(&post_with(0x4009, path, &[(12, &[0])], br#"{"text":1}"#));
    assert_eq!(code(&c.recv()), ResponseType::Created);
    // A GET asking for an answer in CBOR: 4.06.
    let mut get = request(MessageType::Confirmable, RequestType::Get, 0x400a, "/api/v1/RFCTOKEN/attributes", b"");
    get.add_option(CoapOption::Accept, vec![60]);
    c.send(&get);
    assert_eq!(code(&c.recv()), ResponseType::NotAcceptable);

    for key in ["v0", "crit", "c", "a"] {
        assert_eq!(stored(&s, &jwt, &id, key), 0, "{key} must not be stored");
    }
    let (_, attrs) = s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes"), &jwt, None);
    assert_eq!(attrs, json!([]), "nothing of the refused attributes post");
    for key in ["elective", "json", "text"] {
        assert_eq!(stored(&s, &jwt, &id, key), 1, "{key}");
    }
    // Version 0, the NON with option 9, the two empty payloads.
    assert_eq!(count(&s, "gridlinks_coap_malformed_total"), 4);
}

#[test]
fn the_exchange_store_keeps_each_endpoints_share_and_forgets_on_a_timer() {
    // The lifetime is long enough for the exchanges below to be made well within it on a
    // busy machine (they are answered without storage work), short enough to wait for.
    let s = Server::start_env(&[
        ("GRIDLINKS_COAP_EXCHANGE_LIFETIME", "10"),
        ("GRIDLINKS_COAP_MAX_EXCHANGES_PER_PEER", "50"),
        ("GRIDLINKS_COAP_MAX_EXCHANGES", "80"),
    ]);
    let jwt = s.login();
    let id = s.device(&jwt, "coap-store", "STORETOKEN");
    let (a, b) = (Client::new(s.coap_port), Client::new(s.coap_port));
    let post = |c: &Client, mid: u16, token: &str| {
        let body = format!(r#"{{"ts":{mid},"values":{{"n":{mid}}}}}"#);
        c.send(&request(
            MessageType::Confirmable,
            RequestType::Post,
            mid,
            &format!("/api/v1/{token}/telemetry"),
            body.as_bytes(),
        ));
        let r = c.recv();
        assert_eq!(r.header.message_id, mid);
        r
    };

    // 200 exchanges from one endpoint: it keeps 50 (its oldest answered ones are forgotten).
    for mid in 1..=200 {
        assert_eq!(code(&post(&a, mid, "NOSUCHTOKEN")), ResponseType::Unauthorized);
        assert!(count(&s, "gridlinks_coap_exchanges") <= 50);
    }
    assert_eq!(count(&s, "gridlinks_coap_exchanges"), 50);
    assert_eq!(count(&s, "gridlinks_coap_exchanges_evicted_total"), 150);
    // Acknowledged writes are stored, and the latest are remembered: a retransmission gets
    // the same answer and stores nothing new.
    let ack = post(&a, 201, "STORETOKEN");
    assert_eq!(code(&ack), ResponseType::Created);
    a.send(&request(MessageType::Confirmable, RequestType::Post, 201, "/api/v1/STORETOKEN/telemetry", br#"{"n":-1}"#));
    assert_eq!(a.recv().to_bytes().unwrap(), ack.to_bytes().unwrap());
    assert_eq!(count(&s, "gridlinks_coap_duplicates_total"), 1);
    assert_eq!(stored(&s, &jwt, &id, "n"), 1);
    // GETs are served again when repeated, so they take no room.
    for mid in 300..400 {
        a.send(&request(MessageType::Confirmable, RequestType::Get, mid, "/api/v1/STORETOKEN/attributes", b""));
        assert_eq!(code(&a.recv()), ResponseType::Content);
    }
    assert_eq!(count(&s, "gridlinks_coap_exchanges"), 50);

    // Another endpoint has its own share, within the total of 80.
    for mid in 1..=40 {
        post(&b, mid, "NOSUCHTOKEN");
    }
    assert_eq!(count(&s, "gridlinks_coap_exchanges"), 80);

    // With no request at all, everything is forgotten once the lifetime has passed.
    wait_until("the exchange store drains", || count(&s, "gridlinks_coap_exchanges") == 0);
    // Forgotten: the same message id is a new request.
    let requests = count(&s, "gridlinks_coap_requests_total");
    post(&b, 40, "NOSUCHTOKEN");
    assert_eq!(count(&s, "gridlinks_coap_requests_total"), requests + 1);
}

/// The shared attributes of `id`: 40 keys of 40 characters (more than one 1,024-byte block).
fn large_attributes(s: &Server, jwt: &str, id: &str) -> J {
    let many: serde_json::Map<String, J> = (0..40).map(|i| (format!("key{i:02}"), json!("v".repeat(40)))).collect();
    let shared = format!("/api/plugins/telemetry/DEVICE/{id}/attributes/SHARED_SCOPE");
    assert_eq!(s.json("POST", &shared, jwt, Some(J::Object(many.clone()))).0, 200);
    J::Object(many)
}

#[test]
fn answers_to_unverified_endpoints_stay_within_three_times_their_request() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "coap-amp", "AMPTOKEN");
    let many = large_attributes(&s, &jwt, &id);
    let c = Client::new(s.coap_port);
    let ask = |raw: &[u8]| {
        c.socket.send(raw).unwrap();
        let r = c.recv_raw();
        assert!(r.len() <= 3 * raw.len(), "{} bytes answered to {} bytes: {r:x?}", r.len(), raw.len());
        Packet::from_bytes(&r).unwrap()
    };

    // Tiny requests with no credentials: codes without diagnostic text.
    assert_eq!(code(&ask(&[0x40, 0x01, 0x00, 0x01])), ResponseType::NotFound);
    assert_eq!(code(&ask(&[0x41, 0x02, 0x00, 0x02, 0x07])), ResponseType::NotFound);
    assert_eq!(code(&ask(&[0x40, 0x03, 0x00, 0x03])), ResponseType::NotFound);
    let bad_token = request(MessageType::Confirmable, RequestType::Post, 4, "/api/v1/X/telemetry", b"{}");
    let r = ask(&bad_token.to_bytes().unwrap());
    assert_eq!(code(&r), ResponseType::Unauthorized);
    assert!(r.get_first_option(ECHO).is_none(), "an error is cut if need be, never challenged");

    // A GET whose whole answer is 38 times the request: within the limit all the same,
    // as small Block2 blocks or as 4.01 with an Echo option.
    let get = request(MessageType::Confirmable, RequestType::Get, 5, "/api/v1/AMPTOKEN/attributes", b"");
    let r = ask(&get.to_bytes().unwrap());
    let blocked = code(&r) == ResponseType::Content && r.get_first_option(CoapOption::Block2).is_some();
    assert!(blocked || r.get_first_option(ECHO).is_some(), "{r:?}");

    // An observation's first answer (the shared attributes, whole) is challenged.
    let path = "/api/v1/AMPTOKEN/attributes";
    let reg = observe(6, path, b"am", 0);
    let challenge = ask(&reg.to_bytes().unwrap());
    assert_eq!(code(&challenge), ResponseType::Unauthorized);
    let echo = challenge.get_first_option(ECHO).expect("an Echo option").clone();
    assert_eq!(metric(&s, "gridlinks_coap_observations"), "0", "not registered");
    // Another endpoint cannot use this endpoint's Echo value.
    let other = Client::new(s.coap_port);
    let mut stolen = observe(7, path, b"am", 0);
    stolen.add_option(ECHO, echo.clone());
    other.send(&stolen);
    let r = other.recv();
    assert_eq!(code(&r), ResponseType::Unauthorized);
    assert_ne!(r.get_first_option(ECHO), Some(&echo));
    // Repeated with the Echo value: registered, answered whole; the endpoint is verified.
    let mut repeated = observe(8, path, b"am", 0);
    repeated.add_option(ECHO, echo);
    c.send(&repeated);
    let r = c.recv();
    assert_eq!(code(&r), ResponseType::Content);
    assert_eq!(serde_json::from_slice::<J>(&r.payload).unwrap(), many);
    c.send(&observe(9, path, b"am", 1));
    assert_eq!(code(&c.recv()), ResponseType::Content);
    assert_eq!(metric(&s, "gridlinks_coap_verified_peers"), "1");
    // Verified: the GET is answered in 1,024-byte blocks.
    let mut body = Vec::new();
    for n in 0.. {
        let next = request(MessageType::Confirmable, RequestType::Get, 10 + n as u16, path, b"");
        c.send(&with_block(next, CoapOption::Block2, n, false, 6));
        let r = c.recv();
        assert_eq!(code(&r), ResponseType::Content);
        body.extend_from_slice(&r.payload);
        if !block_of(&r, CoapOption::Block2).1 {
            break;
        }
        assert_eq!(r.payload.len(), 1024);
    }
    assert_eq!(serde_json::from_slice::<J>(&body).unwrap(), json!({"shared": many}));
    // Verified: errors carry their diagnostic text again.
    c.socket.send(&[0x40, 0x01, 0x00, 0x20]).unwrap();
    assert!(!c.recv().payload.is_empty());

    // A telemetry post from an endpoint never verified is answered at once (no Echo).
    let fresh = Client::new(s.coap_port);
    fresh.send(&request(MessageType::Confirmable, RequestType::Post, 1, "/api/v1/AMPTOKEN/telemetry", br#"{"t":1}"#));
    let r = fresh.recv();
    assert_eq!((code(&r), r.get_first_option(ECHO)), (ResponseType::Created, None));
    assert_eq!(stored(&s, &jwt, &id, "t"), 1);
    assert!(count(&s, "gridlinks_coap_echo_challenges_total") >= 2);
}

#[test]
fn libcoap_reads_a_large_answer_from_an_unverified_endpoint() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "coap-libcoap", "LIBCOAPAMP");
    let many = large_attributes(&s, &jwt, &id);
    let out = std::process::Command::new("coap-client-notls")
        .args(["-B", "30", "-m", "get"])
        .arg(format!("coap://127.0.0.1:{}/api/v1/LIBCOAPAMP/attributes", s.coap_port))
        .output()
        .expect("coap-client-notls (apt-get install libcoap3-bin; make deps)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(serde_json::from_str::<J>(stdout.trim()).unwrap(), json!({"shared": many}));
}
