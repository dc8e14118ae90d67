//! ThingsBoard's HTTP device API beyond telemetry: server-side RPC and shared-attribute
//! updates by long poll, the device's RPC answers, client-side RPC, and the bounds on long
//! polls — tried as a device and as an abusive client would, against the real binary.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::thread;

use common::*;

/// `GET` on the device API in a thread: status and body.
fn get_in_thread(s: &Server, path: String) -> thread::JoinHandle<(u16, String)> {
    let base = s.base.clone();
    thread::spawn(move || match ureq::get(&format!("{base}{path}")).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("{path}: {e}"),
    })
}

/// Waits until `n` long polls wait on the server (its `/metrics` gauge).
fn wait_polls(s: &Server, n: u64) {
    wait_until(&format!("{n} long polls waiting"), || {
        let (_, m) = s.req("GET", "/metrics", None, None);
        m.lines().any(|l| l == format!("gridlinks_http_long_polls {n}"))
    });
}

#[test]
fn rpc_by_long_poll_answered_over_http() {
    let s = Server::start();
    let jwt = s.login();
    let dev = s.device(&jwt, "http-dev", "HTTPTOK");

    // A call made while the device polls reaches it as ThingsBoard shapes it.
    let poll = get_in_thread(&s, "/api/v1/HTTPTOK/rpc?timeout=60000".into());
    wait_polls(&s, 1);
    let call = {
        let (base, jwt) = (s.base.clone(), jwt.clone());
        let dev = dev.clone();
        thread::spawn(move || {
            ureq::post(&format!("{base}/api/plugins/rpc/twoway/{dev}"))
                .set("X-Authorization", &format!("Bearer {jwt}"))
                .send_json(json!({"method":"setLevel","params":{"level":3},"timeout":60000}))
                .map(|r| r.into_json::<J>().unwrap())
                .map_err(|e| e.to_string())
        })
    };
    let (st, body) = poll.join().unwrap();
    assert_eq!(st, 200, "{body}");
    let req: J = serde_json::from_str(&body).unwrap();
    assert_eq!((&req["method"], &req["params"]), (&json!("setLevel"), &json!({"level":3})));
    let id = req["id"].as_u64().unwrap();
    // A wrong token may not answer it; the device does.
    assert_eq!(s.req("POST", &format!("/api/v1/NOPE/rpc/{id}"), None, Some(r#"{"x":1}"#)).0, 401);
    assert_eq!(s.req("POST", &format!("/api/v1/HTTPTOK/rpc/{id}"), None, Some("not json")).0, 400);
    assert_eq!(s.req("POST", "/api/v1/HTTPTOK/rpc/abc", None, Some("{}")).0, 400);
    assert_eq!(s.req("POST", &format!("/api/v1/HTTPTOK/rpc/{id}"), None, Some(r#"{"level":3}"#)).0, 200);
    assert_eq!(call.join().unwrap().unwrap(), json!({"level":3}));

    // A call between two polls waits for the next one (the poll session lingers).
    let call = {
        let (base, jwt, dev) = (s.base.clone(), jwt.clone(), dev.clone());
        thread::spawn(move || {
            ureq::post(&format!("{base}/api/plugins/rpc/oneway/{dev}"))
                .set("X-Authorization", &format!("Bearer {jwt}"))
                .send_json(json!({"method":"reboot","params":{}}))
                .map(|r| r.status())
                .map_err(|e| e.to_string())
        })
    };
    assert_eq!(call.join().unwrap(), Ok(200));
    let (st, body) = s.req("GET", "/api/v1/HTTPTOK/rpc?timeout=20000", None, None);
    assert_eq!(st, 200, "{body}");
    assert_eq!(serde_json::from_str::<J>(&body).unwrap()["method"], "reboot");

    // Nothing pending: an empty 408 at the timeout.
    let (st, body) = s.req("GET", "/api/v1/HTTPTOK/rpc?timeout=200", None, None);
    assert_eq!((st, body.as_str()), (408, ""));

    // Client-side RPC is answered at once.
    let (st, body) = s.req("POST", "/api/v1/HTTPTOK/rpc", None, Some(r#"{"method":"getSessionLimits","params":{}}"#));
    assert_eq!(st, 200, "{body}");
    assert!(serde_json::from_str::<J>(&body).unwrap()["maxPayloadSize"].is_u64(), "{body}");
    assert_eq!(s.req("POST", "/api/v1/HTTPTOK/rpc", None, Some(r#"{"params":{}}"#)).0, 400);
}

#[test]
fn shared_attribute_updates_by_long_poll_and_deletion_of_the_device() {
    let s = Server::start();
    let jwt = s.login();
    let dev = s.device(&jwt, "http-attrs", "ATTRTOK");
    let poll = get_in_thread(&s, "/api/v1/ATTRTOK/attributes/updates?timeout=60000".into());
    wait_polls(&s, 1);
    let path = format!("/api/plugins/telemetry/DEVICE/{dev}/SHARED_SCOPE");
    assert_eq!(s.json("POST", &path, &jwt, Some(json!({"mode":"eco"}))).0, 200);
    let (st, body) = poll.join().unwrap();
    assert_eq!((st, serde_json::from_str::<J>(&body).unwrap()), (200, json!({"mode":"eco"})));
    // A deletion while no poll waits is kept for the next poll.
    assert_eq!(s.req("DELETE", &format!("{path}?keys=mode"), Some(&jwt), None).0, 200);
    let (st, body) = s.req("GET", "/api/v1/ATTRTOK/attributes/updates?timeout=20000", None, None);
    assert_eq!((st, serde_json::from_str::<J>(&body).unwrap()), (200, json!({"deleted":["mode"]})));

    // ThingsBoard's HTTP client's spellings of attribute reads.
    assert_eq!(s.json("POST", &path, &jwt, Some(json!({"a":1,"b":2,"c":3}))).0, 200);
    let (st, body) = s.req("GET", "/api/v1/ATTRTOK/attributes?sharedKeys=a&sharedKeys=b", None, None);
    assert_eq!((st, serde_json::from_str::<J>(&body).unwrap()), (200, json!({"shared":{"a":1,"b":2}})));
    let (st, body) = s.req("GET", "/api/v1/ATTRTOK/attributes?shared_keys=c", None, None);
    assert_eq!((st, serde_json::from_str::<J>(&body).unwrap()), (200, json!({"shared":{"c":3}})));
    assert_eq!(s.req("GET", "/api/v1/ATTRTOK/attributes?sharedkeys=c", None, None).0, 400);

    // The change above waited for this poll.
    let (st, body) = s.req("GET", "/api/v1/ATTRTOK/attributes/updates?timeout=20000", None, None);
    assert_eq!((st, serde_json::from_str::<J>(&body).unwrap()), (200, json!({"a":1,"b":2,"c":3})));

    // The device is deleted while it polls: ThingsBoard's 403 "Device was deleted!".
    let poll = get_in_thread(&s, "/api/v1/ATTRTOK/attributes/updates?timeout=60000".into());
    wait_polls(&s, 1);
    assert_eq!(s.req("DELETE", &format!("/api/device/{dev}"), Some(&jwt), None).0, 200);
    assert_eq!(poll.join().unwrap(), (403, "Device was deleted!".into()));
    assert_eq!(s.req("GET", "/api/v1/ATTRTOK/attributes/updates?timeout=100", None, None).0, 401);
}

#[test]
fn long_polls_are_bounded_per_device_and_per_node() {
    let s =
        Server::start_env(&[("GRIDLINKS_HTTP_MAX_LONG_POLLS", "3"), ("GRIDLINKS_HTTP_MAX_LONG_POLLS_PER_DEVICE", "2")]);
    let jwt = s.login();
    s.device(&jwt, "a", "POLLA");
    s.device(&jwt, "b", "POLLB");
    assert_eq!(s.req("GET", "/api/v1/POLLA/rpc?timeout=-1", None, None).0, 400);
    assert_eq!(s.req("GET", "/api/v1/POLLA/rpc?timeout=1&x=2", None, None).0, 400);
    assert_eq!(s.req("GET", "/api/v1/NOPE/rpc?timeout=100", None, None).0, 401);
    let held: Vec<_> = (0..2).map(|_| get_in_thread(&s, "/api/v1/POLLA/rpc?timeout=8000".into())).collect();
    wait_polls(&s, 2);
    let (st, body) = s.req("GET", "/api/v1/POLLA/rpc?timeout=8000", None, None);
    assert_eq!(st, 429, "{body}");
    assert!(body.contains("http.max_long_polls_per_device"), "{body}");
    let third = get_in_thread(&s, "/api/v1/POLLB/attributes/updates?timeout=8000".into());
    wait_polls(&s, 3);
    let (st, body) = s.req("GET", "/api/v1/POLLB/rpc?timeout=8000", None, None);
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("http.max_long_polls"), "{body}");
    for h in held.into_iter().chain([third]) {
        assert_eq!(h.join().unwrap().0, 408);
    }
    // All freed: a poll waits again.
    assert_eq!(s.req("GET", "/api/v1/POLLB/rpc?timeout=100", None, None).0, 408);
}
