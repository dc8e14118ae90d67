//! Bad input gets a clear 4xx and leaves stored data untouched.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

#[test]
fn bad_input_is_refused_clearly_and_harms_nothing() {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "victim", "GOOD");
    assert_eq!(s.telemetry("GOOD", r#"{"ts":1000,"values":{"t":1}}"#), 200);
    let base = format!("/api/plugins/telemetry/DEVICE/{id}");
    let snapshot = |s: &Server| {
        let (_, h) =
            s.json("GET", &format!("{base}/values/timeseries?keys=t&startTs=0&endTs=9999999999999"), &jwt, None);
        let (_, k) = s.json("GET", &format!("{base}/keys/timeseries"), &jwt, None);
        let (_, a) = s.json("GET", &format!("{base}/values/attributes"), &jwt, None);
        let (_, d) = s.json("GET", "/api/tenant/devices?pageSize=100&page=0", &jwt, None);
        (h, k, a, d["totalElements"].clone())
    };
    let before = snapshot(&s);

    let message = |body: &str| serde_json::from_str::<J>(body).unwrap()["message"].as_str().unwrap().to_owned();
    let tel = |token: &str, body: &str| s.req("POST", &format!("/api/v1/{token}/telemetry"), None, Some(body));

    // Wrong or missing token.
    assert_eq!(tel("WRONG", r#"{"t":2}"#).0, 401);
    assert_eq!(s.req("POST", "/api/v1//telemetry", None, Some(r#"{"t":2}"#)).0, 401);
    // Malformed JSON and wrong shapes say what is wrong.
    let (st, b) = tel("GOOD", r#"{"t":"#);
    assert!(st == 400 && message(&b).contains("invalid JSON"), "{b}");
    let (st, b) = tel("GOOD", "[1,2]");
    assert!(st == 400 && message(&b).contains("array element 0"), "{b}");
    let (st, b) = tel("GOOD", r#"{"ts":"yesterday","values":{"t":2}}"#);
    assert!(st == 400 && message(&b).contains("ts"), "{b}");
    assert_eq!(tel("GOOD", r#""just a string""#).0, 400);
    // No values at all is accepted with nothing stored, as ThingsBoard accepts it.
    assert_eq!(tel("GOOD", "{}").0, 200);
    // Non-finite numbers.
    assert_eq!(tel("GOOD", r#"{"t":1e999}"#).0, 400);
    assert_eq!(tel("GOOD", r#"{"t":NaN}"#).0, 400);
    assert_eq!(tel("GOOD", r#"{"t":Infinity}"#).0, 400);
    // Huge key names.
    let long_key = "k".repeat(300);
    let (st, b) = tel("GOOD", &format!(r#"{{"{long_key}":1}}"#));
    assert!(st == 400 && message(&b).contains("longer than"), "{b}");
    // Huge body: 413. The server stops reading at the limit and closes, so a client still
    // writing the rest of its 200 KB may see the socket closed under it (broken pipe or
    // reset) before it reads the 413; that is refused too. Either way nothing is stored
    // (the snapshot comparison below).
    let huge = format!(r#"{{"t":"{}"}}"#, "x".repeat(200_000));
    match ureq::post(&format!("{}/api/v1/GOOD/telemetry", s.base))
        .set("Content-Type", "application/json")
        .send_string(&huge)
    {
        Err(ureq::Error::Status(413, _)) | Err(ureq::Error::Transport(_)) => {}
        Ok(r) => panic!("a 200 KB body was accepted with {}", r.status()),
        Err(ureq::Error::Status(code, _)) => panic!("a 200 KB body got {code}, not 413"),
    }
    // Attributes of the wrong shape.
    assert_eq!(s.req("POST", "/api/v1/GOOD/attributes", None, Some("[1]")).0, 400);
    assert_eq!(s.req("POST", &format!("{base}/attributes/SERVER_SCOPE"), Some(&jwt), Some(r#"{"a":null}"#)).0, 400);
    assert_eq!(s.req("POST", &format!("{base}/attributes/NOT_A_SCOPE"), Some(&jwt), Some(r#"{"a":1}"#)).0, 400);

    // Unknown query parameters and out-of-range values.
    let (st, b) = s.req("GET", &format!("{base}/values/timeseries?keys=t&startTS=0"), Some(&jwt), None);
    assert!(st == 400 && message(&b).contains("startTS"), "{b}");
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=0&page=0", Some(&jwt), None).0, 400);
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=-5&page=0", Some(&jwt), None).0, 400);
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=1000000&page=0", Some(&jwt), None).0, 400);
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=99999999999999999999&page=0", Some(&jwt), None).0, 400);
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=10&page=-1", Some(&jwt), None).0, 400);
    assert_eq!(s.req("GET", "/api/tenant/devices?pageSize=10&page=0&sortOrder=SIDEWAYS", Some(&jwt), None).0, 400);
    assert_eq!(
        s.req(
            "GET",
            &format!("{base}/values/timeseries?keys=t&startTs=0&endTs=10&agg=MEDIAN&interval=1"),
            Some(&jwt),
            None
        )
        .0,
        400
    );
    assert_eq!(
        s.req(
            "GET",
            &format!("{base}/values/timeseries?keys=t&startTs=0&endTs=9999999999999&agg=AVG&interval=1"),
            Some(&jwt),
            None
        )
        .0,
        400
    );
    assert_eq!(s.req("GET", &format!("{base}/values/timeseries?keys=t&startTs=10&endTs=0"), Some(&jwt), None).0, 400);
    assert_eq!(
        s.req("GET", &format!("{base}/values/timeseries?keys=t&startTs=0&endTs=10&limit=0"), Some(&jwt), None).0,
        400
    );
    assert_eq!(s.req("DELETE", &format!("{base}/timeseries/delete?keys=t"), Some(&jwt), None).0, 400);
    assert_eq!(s.req("DELETE", &format!("{base}/timeseries/delete?startTs=0&endTs=1"), Some(&jwt), None).0, 400);
    assert_eq!(s.req("GET", "/api/plugins/telemetry/ASSET/x/values/timeseries", Some(&jwt), None).0, 400);

    // Malformed admin requests.
    assert_eq!(s.req("POST", "/api/device", Some(&jwt), Some("{not json")).0, 400);
    assert_eq!(s.req("POST", "/api/device", Some(&jwt), Some(r#"{"type":"no name"}"#)).0, 400);
    assert_eq!(s.req("POST", "/api/device", Some(&jwt), Some(&json!({"name": "n".repeat(300)}).to_string())).0, 400);
    assert_eq!(s.req("POST", "/api/auth/login", None, Some("garbage")).0, 401);

    // SQL-ish strings are just names: stored verbatim, harmless.
    let evil = "x'); DROP TABLE devices; --";
    let (st, d) = s.json("POST", "/api/device", &jwt, Some(json!({"name": evil})));
    assert_eq!((st, d["name"].as_str()), (200, Some(evil)));
    let (st, found) =
        s.json("GET", "/api/tenant/devices?deviceName=x%27%29%3B%20DROP%20TABLE%20devices%3B%20--", &jwt, None);
    assert_eq!((st, found["name"].as_str()), (200, Some(evil)));
    assert_eq!(s.req("DELETE", &format!("/api/device/{}", d["id"]["id"].as_str().unwrap()), Some(&jwt), None).0, 200);

    assert_eq!(snapshot(&s), before, "bad input changed stored data");
    let (_, m) = s.req("GET", "/metrics", None, None);
    assert!(m.lines().any(|l| l.starts_with("gridlinks_payload_rejected_total ") && !l.ends_with(" 0")), "{m}");
}

/// Integers beyond 64 bits keep every digit (stored as strings, as ThingsBoard does), over
/// HTTP, MQTT and the REST telemetry and attribute posts.
/// A body declared larger than the limit (`Content-Length`) is refused with 413 at once,
/// not waited for until the body timeout (which would hold the connection meanwhile): the
/// body timeout is set far beyond the test's patience, so a 408 cannot arrive first.
#[test]
fn a_body_declared_too_large_is_refused_before_it_is_read() {
    let s = Server::start_env(&[("GRIDLINKS_HTTP_BODY_READ_TIMEOUT", "600000")]);
    let jwt = s.login();
    s.device(&jwt, "declared", "DECLARED");
    for (path, token) in [("/api/v1/DECLARED/telemetry", None), ("/api/device/bulk_import", Some(jwt.as_str()))] {
        let auth = token.map(|t| format!("X-Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let answer = s.raw_http(&format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{{}}"
        ));
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
    }
}

/// A request with a body refused before its body is read (here: no permission) is answered
/// with `Connection: close`, so that the client does not send its next request down a
/// connection the server is closing (ureq met "Unexpected EOF" on the request after such a
/// refusal, now and then).
#[test]
fn a_refused_request_with_a_body_says_the_connection_closes() {
    let s = Server::start();
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let answer = s
        .raw_http(&format!(
            "POST /api/device HTTP/1.1\r\nHost: x\r\nX-Authorization: Bearer {sys}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
        ))
        .to_lowercase();
    assert!(answer.starts_with("http/1.1 403"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    // A refusal without a body keeps the connection.
    let (st, _) = s.req("GET", "/api/tenant/devices?pageSize=10&page=0", Some(&sys), None);
    assert_eq!(st, 403);
}

#[test]
fn integers_beyond_64_bits_are_kept_exactly_on_every_transport() {
    use common::mqtt::*;
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "big", "BIG");
    let big = "123456789012345678901234567890";
    let neg = "-98765432109876543210987654321";
    assert_eq!(s.telemetry("BIG", &format!(r#"{{"ts":1,"values":{{"bigpos":{big}}}}}"#)), 200);
    let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("BIG"), 60);
    c.publish(
        "v1/devices/me/telemetry",
        format!(r#"{{"ts":2,"values":{{"bigpos":{neg}}}}}"#).as_bytes(),
        QoS::AtLeastOnce,
        Some(1),
    );
    assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == 0));
    let base = format!("/api/plugins/telemetry/DEVICE/{id}");
    // (Raw bodies: the test's own JSON library would round the number.)
    let rest = format!(r#"{{"ts":3,"values":{{"bigpos":{big}1}}}}"#);
    assert_eq!(s.req("POST", &format!("{base}/timeseries/ANY"), Some(&jwt), Some(&rest)).0, 200);
    for strict in ["false", "true"] {
        let (_, v) = s.req(
            "GET",
            &format!("{base}/values/timeseries?keys=bigpos&startTs=0&endTs=10&orderBy=ASC&useStrictDataTypes={strict}"),
            Some(&jwt),
            None,
        );
        for exact in [big.to_owned(), neg.to_owned(), format!("{big}1")] {
            assert!(v.contains(&format!("\"{exact}\"")), "strict={strict}: {exact} missing in {v}");
        }
    }
    // Attributes over HTTP and MQTT.
    assert_eq!(s.req("POST", "/api/v1/BIG/attributes", None, Some(&format!(r#"{{"fw":{big}}}"#))).0, 200);
    let (_, a) = s.req("GET", &format!("{base}/values/attributes/CLIENT_SCOPE?keys=fw"), Some(&jwt), None);
    assert!(a.contains(&format!("\"{big}\"")), "{a}");
}

/// A flood of bad publishes costs a few log lines, not one per message.
#[test]
fn a_flood_of_bad_publishes_does_not_flood_the_log() {
    use common::mqtt::*;
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("server.log");
    // The client pipelines far past its Receive Maximum: lenient mode reads it as fast as
    // answers free the window instead of ending it with 0x93.
    let s = Server::start_logged(&tmp.path().join("data"), &[("GRIDLINKS_MQTT_RECEIVE_MAXIMUM_LENIENT", "true")], &log);
    let jwt = s.login();
    s.device(&jwt, "noisy", "NOISY");
    let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("NOISY"), 60);
    let n = 2000u16;
    let packets: Vec<Packet> =
        (1..=n).map(|i| publish_packet("v1/devices/me/telemetry", b"{not json", QoS::AtLeastOnce, Some(i))).collect();
    c.send_raw(&bytes_of(ProtocolVersion::V5, &packets)).unwrap();
    for _ in 0..n {
        assert!(matches!(c.recv(), Some(Packet::PubAck(a)) if a.reason == reason::PAYLOAD_FORMAT_INVALID));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let warns = text.lines().filter(|l| l.contains("rejected MQTT publish")).count();
    assert!((1..=5).contains(&warns), "{warns} lines for {n} rejected publishes:\n{text}");
    assert!(text.contains("suppressed="), "{text}");
}
