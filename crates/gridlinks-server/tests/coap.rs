//! ThingsBoard's CoAP device API on the real binary, over real UDP: confirmable requests
//! answered in their ACK, non-confirmable ones with their own message, retransmissions
//! answered again without being stored twice, and every error code.
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
        let mut buf = [0u8; 2048];
        let n = self.socket.recv(&mut buf).unwrap();
        Packet::from_bytes(&buf[..n]).unwrap()
    }

    fn silent(&self) -> bool {
        self.socket.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut buf = [0u8; 2048];
        let quiet = self.socket.recv(&mut buf).is_err();
        self.socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        quiet
    }
}

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
    let s = Server::start_env(&[("GRIDLINKS_COAP_MAX_PAYLOAD_BYTES", "1024")]);
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
}
