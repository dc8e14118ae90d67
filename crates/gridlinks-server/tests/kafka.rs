//! `cluster.queue = "kafka"` against a real Kafka broker (KRaft, from the Apache jars on
//! Maven Central, started by `scripts/services/kafka.sh` on free loopback ports): device
//! data is answered only after Kafka acknowledged it, the storage writer's consumer group
//! stores every acknowledged point, a node whose Kafka or PostgreSQL is gone is not ready
//! (`/readyz`), refuses device data (503) and MQTT sessions with the cause and recovers by
//! itself, and a node killed mid-stream stores everything once it is back.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

#[path = "../../gridlinks-cassandra/tests/service/mod.rs"]
mod cassandra_service;
mod common;
mod kafka_service;
#[path = "../../gridlinks-postgres/tests/service/mod.rs"]
mod pg_service;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cassandra_service::Cassandra;
use common::mqtt::Raw;
use common::Server;
use gridlinks_codec::mqtt::{reason, ProtocolVersion};
use kafka_service::Kafka;
use pg_service::Postgres;

fn start_on(dir: &Path, env: &[(&'static str, String)]) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Server::start_on(dir, &env)
}

/// Calls `f` until it is true or `secs` have passed; whether it became true.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every acknowledged point is stored: the storage writer consumes behind the
/// acknowledgement ("ack ⇒ queryable soon after"); 60 s is far more than it needs.
fn wait_all_stored(s: &Server, ids: &[String], acked: &[Vec<i64>]) {
    let jwt = s.login();
    eventually(60, || {
        ids.iter().zip(acked).all(|(id, a)| {
            let stored = s.stored_timestamps(&jwt, id, "t");
            a.iter().all(|t| stored.contains(t))
        })
    });
    s.assert_all_stored(ids, acked, "t");
}

fn devices(s: &Server, n: usize) -> (Vec<String>, Vec<String>) {
    let jwt = s.login();
    let tokens: Vec<String> = (0..n).map(|i| format!("kafka-token-{i}")).collect();
    let ids = tokens.iter().enumerate().map(|(i, t)| s.device(&jwt, &format!("kafka-dev-{i}"), t)).collect();
    (ids, tokens)
}

/// Posts 40 points to each of 5 devices and an attribute through a node committing to
/// Kafka, and checks every acknowledged point (and the attribute) is stored; the devices'
/// ids and the node.
fn every_acknowledged_point_is_stored(env: &[(&'static str, String)], data: &Path) -> (Vec<String>, Server) {
    let s = start_on(data, env);
    let (ids, tokens) = devices(&s, 5);
    let mut acked = vec![Vec::new(); ids.len()];
    for ts in 1..=40i64 {
        for (i, token) in tokens.iter().enumerate() {
            let body = format!(r#"{{"ts":{ts},"values":{{"t":{}}}}}"#, ts * 10 + i as i64);
            assert_eq!(s.telemetry(token, &body), 200);
            acked[i].push(ts);
        }
    }
    // Attributes go the same way.
    let (st, _) = s.req("POST", "/api/v1/kafka-token-0/attributes", None, Some(r#"{"fw":"v1.2"}"#));
    assert_eq!(st, 200);
    wait_all_stored(&s, &ids, &acked);
    let jwt = s.login();
    let path = format!("/api/plugins/telemetry/DEVICE/{}/values/attributes/CLIENT_SCOPE", ids[0]);
    let stored = eventually(20, || {
        let (_, attrs) = s.json("GET", &path, &jwt, None);
        attrs.as_array().is_some_and(|a| a.iter().any(|x| x["key"] == "fw" && x["value"] == "v1.2"))
    });
    assert!(stored, "attribute not stored: {}", s.json("GET", &path, &jwt, None).1);
    (ids, s)
}

#[test]
fn every_point_acknowledged_through_kafka_is_stored() {
    let kafka = Kafka::start(1);
    let tmp = tempfile::tempdir().unwrap();
    let mut env = kafka.env("node-1");
    env.push(("GRIDLINKS_STORAGE_MAX_KEYS", "2".into()));
    let (ids, s) = every_acknowledged_point_is_stored(&env, &tmp.path().join("data"));
    // A key the store has no room for is refused before Kafka (400), never acknowledged
    // and then left out by the storage writer; a new key within the limit is reserved
    // before it is produced.
    assert_eq!(s.telemetry("kafka-token-0", r#"{"ts":41,"values":{"u":1}}"#), 200);
    let (st, body) = s.req("POST", "/api/v1/kafka-token-0/telemetry", None, Some(r#"{"ts":42,"values":{"v":1}}"#));
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("too many distinct telemetry keys"), "{body}");
    let jwt = s.login();
    let stored = eventually(30, || s.stored_timestamps(&jwt, &ids[0], "u").contains(&41));
    assert!(stored, "the point with the reserved key is not stored");
    let (_, keys) = s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{}/keys/timeseries", ids[0]), &jwt, None);
    assert_eq!(keys, serde_json::json!(["t", "u"]));
}

/// `cluster.timeseries = "postgres"`: the storage writer writes the time series to a real
/// PostgreSQL, and the REST API reads, aggregates and deletes them there.
#[test]
fn with_postgres_time_series_every_acknowledged_point_is_in_postgres() {
    let (kafka, pg) = (Kafka::start(1), Postgres::start());
    let tmp = tempfile::tempdir().unwrap();
    let mut env = kafka.env("node-1");
    env.push(("GRIDLINKS_CLUSTER_KAFKA_MAX_LAG", "3".into()));
    env.push(("GRIDLINKS_CLUSTER_TIMESERIES", "postgres".into()));
    env.push(("GRIDLINKS_CLUSTER_POSTGRES_URL_FILE", pg.url_file().display().to_string()));
    let (ids, s) = every_acknowledged_point_is_stored(&env, &tmp.path().join("data"));

    // What PostgreSQL cannot hold (NUL in text) is refused before Kafka, never acknowledged.
    let (st, body) =
        s.req("POST", "/api/v1/kafka-token-0/telemetry", None, Some(r#"{"ts":50,"values":{"t":"a\u0000b"}}"#));
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("NUL"), "{body}");

    // The points are in PostgreSQL itself, read by another client.
    let direct = gridlinks_postgres::PgTimeseries::open(&pg.url, 1).unwrap();
    read_and_deleted_there(&s, &ids[0], &direct);
    deleted_device_forgotten(&s, &ids[2], &direct);
    let device = gridlinks_types::DeviceId(ids[0].parse().unwrap());
    down_and_back(&s, "postgresql", || pg.stop(), || pg.restart(), &direct, device);

    // The storage writer stalls (a lock on the latest values' table for 8 s; PostgreSQL
    // itself answers): past cluster.kafka.max_lag (3) records not yet stored, posts wait
    // for it and are refused as overloaded after the produce timeout (3 s), instead of
    // the lag growing without bound; once it has caught up, they are taken again.
    let mut lock =
        pg.psql_background("BEGIN; LOCK TABLE gl_ts_kv_latest IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(8); COMMIT");
    std::thread::sleep(Duration::from_millis(500));
    // Posts one after another, 20 ms apart (the lag is read every 500 ms while low).
    let (mut acked, mut refused) = (Vec::new(), None);
    for ts in 100..300i64 {
        let started = Instant::now();
        let (st, body) = s.req(
            "POST",
            "/api/v1/kafka-token-0/telemetry",
            None,
            Some(&format!(r#"{{"ts":{ts},"values":{{"t":{ts}}}}}"#)),
        );
        match st {
            200 => acked.push(ts),
            503 => {
                refused = Some((body, started.elapsed()));
                break;
            }
            _ => panic!("{st} {body}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (body, waited) = refused.expect("posts were not held back while the storage writer stalled");
    assert!(body.contains("overloaded"), "{body}");
    assert!(waited >= Duration::from_millis(2500), "refused after {waited:?}: it waits for the storage writers first");
    // At most the bound and what arrives between two reads of the lag (500 ms at ~40/s).
    assert!(acked.len() <= 40, "{} posts taken past a bound of 3 records", acked.len());
    let (_, ready) = s.req("GET", "/readyz", None, None);
    assert!(ready.contains("storage_lag"), "{ready}");
    lock.wait().unwrap();
    let taken = eventually(30, || s.telemetry("kafka-token-0", r#"{"ts":150,"values":{"t":150}}"#) == 200);
    assert!(taken, "posts are not taken again after the storage writer caught up");
    let jwt = s.login();
    let all = eventually(30, || {
        let stored = s.stored_timestamps(&jwt, &ids[0], "t");
        acked.iter().all(|t| stored.contains(t)) && stored.contains(&150)
    });
    assert!(all, "an acknowledged point is missing");
    // Nothing went to the node's own time series: a node without the database has none.
    drop(s);
    let plain = start_on(&tmp.path().join("data"), &[]);
    let jwt = plain.login();
    assert!(plain.stored_timestamps(&jwt, &ids[1], "t").is_empty());
}

/// The raw points of key `t` in `[0, 100)`, oldest first, up to 100.
fn raw_t() -> gridlinks_storage::query::HistoryQuery {
    gridlinks_storage::query::HistoryQuery {
        keys: vec!["t".into()],
        start: gridlinks_types::Ts(0),
        end: gridlinks_types::Ts(100),
        interval: 0,
        agg: gridlinks_storage::query::Agg::None,
        limit: 100,
        order: gridlinks_storage::query::Order::Asc,
    }
}

/// The points a node stored in a shared database are there for another client of it
/// (`direct`), and the REST API's aggregation and delete are answered there.
fn read_and_deleted_there(s: &Server, id: &str, direct: &dyn gridlinks_storage::Timeseries) {
    let device = gridlinks_types::DeviceId(id.parse().unwrap());
    let latest = direct.latest(device, None).unwrap();
    assert_eq!(latest, [("t".to_owned(), gridlinks_types::Ts(40), gridlinks_types::Value::Long(400))]);
    let jwt = s.login();
    let base = format!("/api/plugins/telemetry/DEVICE/{id}");
    let (st, agg) =
        s.json("GET", &format!("{base}/values/timeseries?keys=t&startTs=1&endTs=41&interval=20&agg=COUNT"), &jwt, None);
    assert_eq!(st, 200, "{agg}");
    assert_eq!(agg["t"], serde_json::json!([{"ts": 11, "value": "20"}, {"ts": 31, "value": "20"}]));
    let (st, _) = s.req(
        "DELETE",
        &format!("{base}/timeseries/delete?keys=t&startTs=1&endTs=21&deleteLatest=false"),
        Some(&jwt),
        None,
    );
    assert_eq!(st, 200);
    let left = direct.history(device, &raw_t()).unwrap();
    assert_eq!(left[0].1.len(), 20, "points 21..=40 are left");
}

/// A device deleted over REST: its telemetry goes from the shared database too.
fn deleted_device_forgotten(s: &Server, id: &str, direct: &dyn gridlinks_storage::Timeseries) {
    let device = gridlinks_types::DeviceId(id.parse().unwrap());
    assert!(!direct.latest(device, None).unwrap().is_empty());
    let (st, _) = s.req("DELETE", &format!("/api/device/{id}"), Some(&s.login()), None);
    assert_eq!(st, 200);
    let gone = eventually(10, || {
        direct.latest(device, None).unwrap().is_empty() && direct.history(device, &raw_t()).unwrap().is_empty()
    });
    assert!(gone, "the deleted device's telemetry is still there: {:?}", direct.latest(device, None));
}

/// The shared database `name` gone (`stop`): the node is not ready and refuses device data
/// and sessions with the cause (acknowledged data could not become queryable); back
/// (`restart`), it takes them again by itself, and a point posted then is stored.
fn down_and_back(
    s: &Server,
    name: &str,
    stop: impl FnOnce(),
    restart: impl FnOnce(),
    direct: &dyn gridlinks_storage::Timeseries,
    device: gridlinks_types::DeviceId,
) {
    assert_ready(s, name);
    stop();
    assert_not_ready(s, name);
    let (st, body) = s.req("POST", "/api/v1/kafka-token-0/telemetry", None, Some(r#"{"ts":60,"values":{"t":60}}"#));
    assert_eq!(st, 503, "{body}");
    assert!(body.contains(name), "{body}");
    assert_connect_refused(s, "kafka-token-0", name);
    restart();
    assert_ready(s, name);
    assert_eq!(s.telemetry("kafka-token-0", r#"{"ts":61,"values":{"t":61}}"#), 200);
    let stored = eventually(30, || direct.latest(device, None).is_ok_and(|l| l[0].1 == gridlinks_types::Ts(61)));
    assert!(stored, "the point after the restart is not in {name}");
}

/// `cluster.timeseries = "cassandra"`: the storage writer writes the time series to a real
/// Cassandra 5, and the REST API reads, aggregates and deletes them there.
#[test]
fn with_cassandra_time_series_every_acknowledged_point_is_in_cassandra() {
    let (kafka, cassandra) = (Kafka::start(1), Cassandra::start());
    let tmp = tempfile::tempdir().unwrap();
    let mut env = kafka.env("node-1");
    env.push(("GRIDLINKS_CLUSTER_TIMESERIES", "cassandra".into()));
    env.push(("GRIDLINKS_CLUSTER_CASSANDRA_CONTACT_POINTS", cassandra.contact.clone()));
    env.push(("GRIDLINKS_CLUSTER_CASSANDRA_REPLICATION_FACTOR", "1".into()));
    let (ids, s) = every_acknowledged_point_is_stored(&env, &tmp.path().join("data"));
    let direct = gridlinks_cassandra::CassandraTimeseries::open(&gridlinks_cassandra::CassandraSettings {
        contact_points: vec![cassandra.contact.clone()],
        keyspace: "gridlinks".into(),
        replication_factor: 1,
        ttl_days: 0,
    })
    .unwrap();
    read_and_deleted_there(&s, &ids[0], &direct);
    deleted_device_forgotten(&s, &ids[2], &direct);
    // Cassandra's text holds NUL, which PostgreSQL refuses.
    assert_eq!(s.telemetry("kafka-token-1", r#"{"ts":50,"values":{"t":"a\u0000b"}}"#), 200);
    let device = gridlinks_types::DeviceId(ids[1].parse().unwrap());
    use gridlinks_storage::Timeseries;
    let nul = eventually(30, || {
        direct.latest(device, None).is_ok_and(|l| l[0].2 == gridlinks_types::Value::Str("a\0b".into()))
    });
    assert!(nul, "{:?}", direct.latest(device, None));
    let device = gridlinks_types::DeviceId(ids[0].parse().unwrap());
    down_and_back(&s, "cassandra", || cassandra.kill(), || cassandra.restart(), &direct, device);
}

#[test]
fn without_kafka_writes_are_refused_with_503_and_resume_by_themselves() {
    let kafka = Kafka::start(1);
    let tmp = tempfile::tempdir().unwrap();
    let s = start_on(&tmp.path().join("data"), &kafka.env("node-1"));
    let (ids, tokens) = devices(&s, 1);
    let mut acked = vec![Vec::new()];
    assert_eq!(s.telemetry(&tokens[0], r#"{"ts":1,"values":{"t":1}}"#), 200);
    acked[0].push(1);
    assert_ready(&s, "kafka");
    // The broker killed (-9): the probe finds it gone; the node is not ready, and says why.
    kafka.run(&["stop", "1"]);
    assert_not_ready(&s, "kafka");
    let (_, health) = s.req("GET", "/healthz", None, None);
    assert!(health.contains(r#""status":"UP""#), "liveness is the node's own: {health}");
    // Device data is refused at once with the cause, not after the produce timeout (3 s).
    let started = Instant::now();
    let (st, body) =
        s.req("POST", &format!("/api/v1/{}/telemetry", tokens[0]), None, Some(r#"{"ts":2,"values":{"t":2}}"#));
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("kafka"), "the error names the cause: {body}");
    assert!(started.elapsed() < Duration::from_secs(2), "refused after {:?}", started.elapsed());
    assert_connect_refused(&s, &tokens[0], "kafka");
    // Device management still works: it is not device data.
    let jwt = s.login();
    let (st, _) = s.json("GET", &format!("/api/device/{}", ids[0]), &jwt, None);
    assert_eq!(st, 200);
    kafka.run(&["restart", "1"]);
    let mut ts = 2;
    let resumed = eventually(30, || {
        ts += 1;
        s.telemetry(&tokens[0], &format!(r#"{{"ts":{ts},"values":{{"t":{ts}}}}}"#)) == 200
    });
    assert!(resumed, "writes did not resume after kafka came back");
    acked[0].push(ts);
    assert_ready(&s, "kafka");
    let (_, ack) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some(&tokens[0]), 30);
    assert_eq!(ack.code, 0, "{ack:?}");
    wait_all_stored(&s, &ids, &acked);
}

/// `/readyz` is 200 and names `backend` UP, soon (the probe runs every second).
fn assert_ready(s: &Server, backend: &str) {
    let ready = eventually(30, || {
        let (st, body) = s.req("GET", "/readyz", None, None);
        st == 200 && serde_json::from_str::<serde_json::Value>(&body).unwrap()["backends"][backend] == "UP"
    });
    assert!(ready, "not ready: {:?}", s.req("GET", "/readyz", None, None));
}

/// `/readyz` turns 503 with `backend` DOWN and the reason, within 15 s.
fn assert_not_ready(s: &Server, backend: &str) {
    let down = eventually(15, || s.req("GET", "/readyz", None, None).0 == 503);
    let (_, body) = s.req("GET", "/readyz", None, None);
    assert!(down, "still ready: {body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["status"], "DOWN");
    assert!(body["backends"][backend].as_str().unwrap().starts_with("DOWN: "), "{body}");
}

/// A device's MQTT CONNECT is refused: 5.0 "server unavailable" with the cause as its
/// reason string, 3.1.1 return code 3.
fn assert_connect_refused(s: &Server, token: &str, cause: &str) {
    let (_, ack) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some(token), 30);
    assert_eq!(ack.code, reason::SERVER_UNAVAILABLE, "{ack:?}");
    let why = ack.properties.reason_string.unwrap_or_default();
    assert!(why.contains(cause), "the reason names the cause: {why}");
    let (_, ack) = Raw::connect(s.mqtt_port, ProtocolVersion::V3_1_1, Some(token), 30);
    assert_eq!(ack.code, reason::V3_SERVER_UNAVAILABLE, "{ack:?}");
}

#[test]
fn a_node_killed_mid_stream_stores_every_acknowledged_point_once_back() {
    let kafka = Kafka::start(1);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let env = kafka.env("node-1");
    let mut s = start_on(&dir, &env);
    let (ids, tokens) = devices(&s, 4);
    let mut acked = vec![Vec::new(); ids.len()];
    for ts in 1..=200i64 {
        for (i, token) in tokens.iter().enumerate() {
            if s.telemetry(token, &format!(r#"{{"ts":{ts},"values":{{"t":{ts}}}}}"#)) == 200 {
                acked[i].push(ts);
            }
        }
    }
    // Killed at once: some of what Kafka acknowledged may not be in the store yet, and the
    // last offsets may not be committed.
    s.kill9();
    let s = start_on(&dir, &env);
    wait_all_stored(&s, &ids, &acked);
    // Written again or not, each point is one row: history has exactly the acknowledged ones.
    let jwt = s.login();
    for (id, a) in ids.iter().zip(&acked) {
        assert_eq!(s.stored_timestamps(&jwt, id, "t").len(), a.len());
    }
}

/// Refresh tokens and logouts hold on every node: a refresh token works once in the
/// cluster, reusing one ends the login on both nodes, and so does a logout; an API key made
/// on one node works on the other.
fn shared_logins(a: &Server, b: &Server) {
    let pair = |v: &serde_json::Value| {
        let token = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        (token("token"), token("refreshToken"))
    };
    let login = |s: &Server| {
        let (st, v) = s.try_login("admin", common::ADMIN_PASSWORD);
        assert_eq!(st, 200, "{v}");
        pair(&v)
    };
    let refresh = |s: &Server, token: &str| {
        let (st, v) = s.refresh(token);
        let (token, refresh_token) = pair(&v);
        (st, token, refresh_token)
    };
    let me = |s: &Server, jwt: &str| s.json("GET", "/api/auth/user", jwt, None).0;

    // Refreshed on B, then at once on A with the new refresh token: both work.
    let (jwt, r1) = login(a);
    let (st, jwt2, r2) = refresh(b, &r1);
    assert_eq!(st, 200);
    let (st, jwt3, r3) = refresh(a, &r2);
    assert_eq!(st, 200, "a refresh token made on B is refused on A");
    assert_eq!((me(a, &jwt3), me(b, &jwt3), me(b, &jwt2)), (200, 200, 200));
    // The first refresh token again, on either node: a copy. The login ends: at once on
    // that node, on the other at its next catch-up (`cluster.entities_poll`, 250 ms).
    assert_eq!(refresh(a, &r1).0, 401);
    assert_eq!((me(a, &jwt), me(a, &jwt3)), (401, 401), "a token of the ended login still works");
    let ended = eventually(2, || me(b, &jwt) == 401 && me(b, &jwt3) == 401);
    assert!(ended, "B still takes tokens of a login ended on A");
    assert_eq!(refresh(b, &r3).0, 401);

    // A logout on A ends the login on B too.
    let (jwt, _) = login(b);
    assert_eq!(me(a, &jwt), 200);
    assert_eq!(a.req("POST", "/api/auth/logout", Some(&jwt), None).0, 200);
    assert!(eventually(2, || me(b, &jwt) == 401), "B still takes the token of a logout on A");

    // An API key made on A works on B once B has caught up.
    let (jwt, _) = login(a);
    let body = serde_json::json!({"description": "cluster", "expirationTime": 0});
    let (st, key) = a.json("POST", "/api/apiKey", &jwt, Some(body));
    assert_eq!(st, 200, "{key}");
    let value = key["value"].as_str().unwrap().to_owned();
    let with_key = |s: &Server| {
        ureq::get(&format!("{}/api/auth/user", s.base))
            .set("X-Authorization", &format!("ApiKey {value}"))
            .call()
            .map_or_else(|e| if let ureq::Error::Status(c, _) = e { c } else { 0 }, |r| r.status())
    };
    assert_eq!(with_key(a), 200);
    assert!(eventually(10, || with_key(b) == 200), "B refuses an API key made on A");
}

/// MQTT across nodes, through Kafka: an application credential made on A logs in on B; a
/// message published on A reaches a subscriber on B; a retained message published on A is
/// given to a new subscriber on B; device telemetry taken by A reaches B's subscriber of the
/// canonical topics; and the other way, B to A.
fn cross_node_mqtt(a: &Server, b: &Server, jwt: &str, token: &str, device: &str) {
    use gridlinks_codec::mqtt::{Packet, QoS};
    let cred = serde_json::json!({"username": "app", "password": "app-pw", "publish": ["apps/#"],
        "subscribe": ["apps/#", "gridlinks/devices/+/telemetry"]});
    let (st, out) = a.json("POST", "/api/mqtt/clients", jwt, Some(cred));
    assert_eq!(st, 200, "{out}");
    // B lists it (before anything asked B for it by name), and shows it.
    let listed = || b.json("GET", "/api/mqtt/clients", jwt, None).1[0]["username"] == "app";
    assert!(eventually(10, listed), "B does not list it");
    assert_eq!(b.json("GET", "/api/mqtt/clients/app", jwt, None).0, 200);
    let login = |s: &Server, id: &str| {
        let (c, ack) = Raw::login(s.mqtt_port, ProtocolVersion::V5, id, "app", "app-pw");
        assert_eq!(ack.code, 0, "{ack:?}");
        c
    };
    let next_publish = |c: &mut Raw| loop {
        match c.recv() {
            Some(Packet::Publish(p)) => return (p.topic, String::from_utf8_lossy(&p.payload).into_owned(), p.retain),
            Some(_) => continue,
            None => panic!("connection closed"),
        }
    };
    let (mut sub_b, mut sub_a) = (login(b, "sub-b"), login(a, "sub-a"));
    for c in [&mut sub_b, &mut sub_a] {
        let filters = ["apps/#", "gridlinks/devices/+/telemetry"];
        assert_eq!(c.subscribe_qos(1, &filters, QoS::AtLeastOnce).return_codes, [1, 1]);
    }
    let mut pub_a = login(a, "pub-a");
    pub_a.publish("apps/one", b"from A", QoS::AtLeastOnce, Some(1));
    // The subscriber on A gets it at once, the one on B through Kafka.
    assert_eq!(next_publish(&mut sub_a), ("apps/one".into(), "from A".into(), false));
    assert_eq!(next_publish(&mut sub_b), ("apps/one".into(), "from A".into(), false));
    assert!(matches!(pub_a.recv(), Some(Packet::PubAck(ack)) if ack.reason == 0), "PUBACK 0 after Kafka took it");

    // Retained on A: B keeps it for later subscribers.
    let mut retained = common::mqtt::publish_packet("apps/state", b"on", QoS::AtLeastOnce, Some(2));
    if let Packet::Publish(p) = &mut retained {
        p.retain = true;
    }
    pub_a.send(&retained);
    assert_eq!(next_publish(&mut sub_a).1, "on");
    assert_eq!(next_publish(&mut sub_b).1, "on");
    let mut late_b = login(b, "late-b");
    late_b.subscribe_qos(3, &["apps/state"], QoS::AtLeastOnce);
    assert_eq!(next_publish(&mut late_b), ("apps/state".into(), "on".into(), true));

    // B to A.
    let mut pub_b = login(b, "pub-b");
    pub_b.publish("apps/two", b"from B", QoS::AtLeastOnce, Some(1));
    assert_eq!(next_publish(&mut sub_a), ("apps/two".into(), "from B".into(), false));

    // Device telemetry taken by A reaches the canonical topic on both nodes.
    assert_eq!(a.telemetry(token, r#"{"ts":10,"values":{"live":1}}"#), 200);
    for c in [&mut sub_a, &mut sub_b] {
        let (topic, payload, _) = loop {
            let p = next_publish(c);
            if p.0.starts_with("gridlinks/") {
                break p;
            }
        };
        assert_eq!(topic, format!("gridlinks/devices/{device}/telemetry"));
        assert_eq!(payload, r#"[{"ts":10,"values":{"live":1}}]"#);
    }

    // The credential deleted on B: A closes its live connections soon, and refuses it.
    let (st, _) = b.req("DELETE", "/api/mqtt/clients/app", Some(jwt), None);
    assert_eq!(st, 200);
    let started = Instant::now();
    while sub_a.recv().is_some() {}
    // Closed, not timed out (reads give up after 10 s); a busy machine may be slow.
    assert!(started.elapsed() < Duration::from_secs(9), "A closed it after {:?}", started.elapsed());
    let (_, ack) = Raw::login(a.mqtt_port, ProtocolVersion::V5, "again-a", "app", "app-pw");
    assert_ne!(ack.code, 0, "{ack:?}");
}

/// A rumqttc client `id` of application `user` on `s`, subscribed to `filters` at QoS 1,
/// collecting every (topic, payload) it receives; the client keeps it connected.
fn collector(s: &Server, id: &str, user: &str, password: &str, filters: &[&str]) -> (Collected, rumqttc::Client) {
    let mut o = rumqttc::MqttOptions::new(id, "127.0.0.1", s.mqtt_port);
    o.set_credentials(user, password);
    let (client, mut conn) = rumqttc::Client::new(o, 1_000);
    let got: Collected = std::sync::Arc::default();
    let (subscribed, into) = (std::sync::mpsc::channel(), got.clone());
    let n = filters.len();
    std::thread::spawn(move || {
        let mut acks = 0;
        for ev in conn.iter() {
            match ev {
                Ok(rumqttc::Event::Incoming(rumqttc::Incoming::SubAck(a))) => {
                    assert!(a.return_codes.iter().all(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_))));
                    acks += 1;
                    if acks == n {
                        let _ = subscribed.0.send(());
                    }
                }
                Ok(rumqttc::Event::Incoming(rumqttc::Incoming::Publish(p))) => {
                    into.lock().unwrap().push((p.topic.clone(), String::from_utf8_lossy(&p.payload).into_owned()));
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    for f in filters {
        client.subscribe(*f, rumqttc::QoS::AtLeastOnce).unwrap();
    }
    subscribed.1.recv_timeout(Duration::from_secs(10)).expect("SUBACK");
    (got, client)
}

type Collected = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// Shared subscriptions across nodes, through a Kafka consumer group per shared group: a
/// group with a member on A and one on B gets each message once (not once per node),
/// whichever node took it, spread over both; so does a group on the canonical telemetry
/// topics. When B's member leaves, A's member gets everything, still once.
fn cross_node_shared(a: &Server, b: &Server, jwt: &str, token: &str) {
    use gridlinks_codec::mqtt::{Packet, QoS};
    let cred = serde_json::json!({"username": "worker", "password": "worker-pw", "publish": ["jobs/#"],
        "subscribe": ["jobs/#", "gridlinks/devices/+/telemetry"]});
    assert_eq!(a.json("POST", "/api/mqtt/clients", jwt, Some(cred)).0, 200);
    assert!(eventually(10, || b.json("GET", "/api/mqtt/clients/worker", jwt, None).0 == 200), "B lacks it");
    let filters = ["$share/workers/jobs/+", "$share/watch/gridlinks/devices/+/telemetry"];
    let (on_a, _keep_a) = collector(a, "w-a", "worker", "worker-pw", &filters);
    let (on_b, keep_b) = collector(b, "w-b", "worker", "worker-pw", &filters);
    // Publishers on both nodes, each with its own topic and client id (the Kafka key: the
    // records spread over the partitions, which Kafka splits between the two nodes).
    let mut publishers: Vec<Raw> = (0..16)
        .map(|i| {
            let s = if i % 2 == 0 { a } else { b };
            let (p, ack) =
                Raw::login(s.mqtt_port, ProtocolVersion::V5, &format!("jobs-pub-{i}"), "worker", "worker-pw");
            assert_eq!(ack.code, 0, "{ack:?}");
            p
        })
        .collect();
    let mut sent = Vec::new();
    let mut round = |sent: &mut Vec<String>| {
        for (i, p) in publishers.iter_mut().enumerate() {
            let body = format!("{i}-{}", sent.len());
            p.publish(&format!("jobs/{i}"), body.as_bytes(), QoS::AtLeastOnce, Some(1));
            assert!(matches!(p.recv(), Some(Packet::PubAck(ack)) if ack.reason == 0), "PUBACK");
            sent.push(body);
        }
    };
    let jobs = |c: &Collected| -> Vec<String> {
        c.lock().unwrap().iter().filter(|(t, _)| t.starts_with("jobs/")).map(|(_, p)| p.clone()).collect()
    };
    // Rounds until both members got some (Kafka assigns the partitions while the group
    // forms), then every message must have arrived exactly once.
    let spread = eventually(30, || {
        round(&mut sent);
        std::thread::sleep(Duration::from_millis(300));
        !jobs(&on_a).is_empty() && !jobs(&on_b).is_empty()
    });
    assert!(spread, "one node's member got nothing: A {} B {}", jobs(&on_a).len(), jobs(&on_b).len());
    let once = |sent: &[String]| {
        let arrived = eventually(30, || jobs(&on_a).len() + jobs(&on_b).len() >= sent.len());
        std::thread::sleep(Duration::from_secs(2)); // late duplicates
        let mut got: Vec<String> = jobs(&on_a).into_iter().chain(jobs(&on_b)).collect();
        got.sort();
        let mut want = sent.to_vec();
        want.sort();
        let missing: Vec<&String> = want.iter().filter(|w| !got.contains(w)).collect();
        let twice: Vec<&String> = got.windows(2).filter(|w| w[0] == w[1]).map(|w| &w[0]).collect();
        assert!(
            arrived && got == want,
            "sent {}, the group got {}: missing {missing:?}, twice {twice:?}",
            want.len(),
            got.len()
        );
    };
    once(&sent);

    // Device telemetry taken by either node reaches the canonical-topic group once.
    for ts in 1..=10i64 {
        let s = if ts % 2 == 0 { a } else { b };
        assert_eq!(s.telemetry(token, &format!(r#"{{"ts":{ts},"values":{{"shared":{ts}}}}}"#)), 200);
    }
    let points = || -> Vec<i64> {
        let mut ts: Vec<i64> = [&on_a, &on_b]
            .iter()
            .flat_map(|c| c.lock().unwrap().clone())
            .filter(|(t, _)| t.starts_with("gridlinks/"))
            .flat_map(|(_, p)| serde_json::from_str::<serde_json::Value>(&p).unwrap().as_array().unwrap().clone())
            .filter(|point| point["values"].get("shared").is_some())
            .map(|point| point["ts"].as_i64().unwrap())
            .collect();
        ts.sort_unstable();
        ts
    };
    assert!(eventually(30, || points().len() >= 10), "{:?}", points());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(points(), (1..=10).collect::<Vec<_>>(), "each point once");

    // B's member leaves: B lets the group go, and A's member gets every message, once.
    keep_b.disconnect().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    on_a.lock().unwrap().clear();
    on_b.lock().unwrap().clear();
    let mut after = Vec::new();
    round(&mut after);
    let all_on_a = eventually(30, || jobs(&on_a).len() >= after.len());
    assert!(all_on_a, "A's member got {} of {}", jobs(&on_a).len(), after.len());
    once(&after);
    assert!(jobs(&on_b).is_empty());
}

/// A persistent session moves between nodes: made on A, it gets messages published on A
/// and B while away (A holds it), resumes on B with all of them, gets live messages there,
/// then moves back to A while connected on B (B's connection is taken over).
fn cross_node_session(a: &Server, b: &Server, jwt: &str) {
    use gridlinks_codec::mqtt::{Packet, QoS};
    let cred = serde_json::json!({"username": "mover", "password": "mover-pw", "publish": ["moves/#"],
        "subscribe": ["moves/#"]});
    assert_eq!(a.json("POST", "/api/mqtt/clients", jwt, Some(cred)).0, 200);
    assert!(eventually(10, || b.json("GET", "/api/mqtt/clients/mover", jwt, None).0 == 200), "B lacks it");
    let connect = |s: &Server, clean_start: bool| {
        let (c, ack) = Raw::connect_custom(s.mqtt_port, ProtocolVersion::V5, |c| {
            c.client_id = "mover-1".into();
            c.username = Some("mover".into());
            c.password = Some(bytes::Bytes::from_static(b"mover-pw"));
            c.clean_start = clean_start;
            c.properties.session_expiry_interval = Some(600);
        });
        assert_eq!(ack.code, 0, "{ack:?}");
        (c, ack.session_present)
    };
    let publisher = |s: &Server, id: &str| {
        let (p, ack) = Raw::login(s.mqtt_port, ProtocolVersion::V5, id, "mover", "mover-pw");
        assert_eq!(ack.code, 0, "{ack:?}");
        p
    };
    let send = |p: &mut Raw, topic: &str| {
        p.publish(topic, topic.as_bytes(), QoS::AtLeastOnce, Some(1));
        assert!(matches!(p.recv(), Some(Packet::PubAck(ack)) if ack.reason == 0), "PUBACK");
    };

    let (mut m, _) = connect(a, true);
    assert_eq!(m.subscribe_qos(1, &["moves/#"], QoS::AtLeastOnce).return_codes, [1]);
    m.disconnect();
    let (mut on_a, mut on_b) = (publisher(a, "mover-pub-a"), publisher(b, "mover-pub-b"));
    let away: Vec<String> = (1..=6).map(|i| format!("moves/away/{i}")).collect();
    for (i, topic) in away.iter().enumerate() {
        send(if i % 2 == 0 { &mut on_a } else { &mut on_b }, topic);
    }
    // Back on B: the session is there, with every message queued while away.
    let (mut m, present) = connect(b, false);
    assert!(present, "B did not find the session made on A");
    let mut got: Vec<String> = (0..away.len()).map(|_| m.next_topic()).collect();
    got.sort();
    assert_eq!(got, away, "the messages queued on A while away");
    send(&mut on_a, "moves/live/1");
    // At least once, as below: under load a copy queued during the move may come again
    // (seen once in a full `make test`: moves/away/5 twice); nothing the client never had.
    loop {
        let topic = m.next_topic();
        if topic == "moves/live/1" {
            break;
        }
        assert!(away.contains(&topic), "{topic} out of nowhere");
    }

    // Back to A while connected on B: B's connection is taken over, A resumes.
    let (mut m2, present) = connect(a, false);
    assert!(present, "A did not find the session back");
    let (disconnect, after) = m.expect_close();
    assert!(after < Duration::from_secs(5), "B closed its connection after {after:?}");
    assert_eq!(disconnect.map(|d| d.reason), Some(reason::SESSION_TAKEN_OVER));
    send(&mut on_b, "moves/live/2");
    // A copy whose PUBACK B had not read when it let go comes again (at least once);
    // nothing the client never had.
    loop {
        let topic = m2.next_topic();
        if topic == "moves/live/2" {
            break;
        }
        assert!(topic == "moves/live/1" || away.contains(&topic), "{topic} out of nowhere");
    }
    m2.disconnect();
}

/// Server-to-device messages across nodes, through Kafka: a device connected to A gets a
/// shared attribute posted on B, and RPC calls taken by B (two-way, answered through A, and
/// one-way); a call on B for a device connected to no node is answered 409.
fn cross_node_downlink(a: &Server, b: &Server, jwt: &str) {
    use gridlinks_codec::mqtt::{Packet, QoS};
    let id = a.device(jwt, "downlink-1", "downlink-token");
    let known = eventually(10, || b.json("GET", &format!("/api/device/{id}"), jwt, None).0 == 200);
    assert!(known, "B does not know the device made on A");
    let (mut dev, ack) = Raw::connect(a.mqtt_port, ProtocolVersion::V3_1_1, Some("downlink-token"), 30);
    assert_eq!(ack.code, 0, "{ack:?}");
    let filters = ["v1/devices/me/attributes", "v1/devices/me/rpc/request/+"];
    assert_eq!(dev.subscribe_qos(1, &filters, QoS::AtMostOnce).return_codes, [0, 0]);
    let next = |c: &mut Raw| loop {
        match c.recv() {
            Some(Packet::Publish(p)) => return (p.topic, String::from_utf8_lossy(&p.payload).into_owned()),
            Some(_) => continue,
            None => panic!("the device's connection closed"),
        }
    };

    let path = format!("/api/plugins/telemetry/DEVICE/{id}/attributes/SHARED_SCOPE");
    assert_eq!(b.req("POST", &path, Some(jwt), Some(r#"{"mode":"eco"}"#)).0, 200);
    assert_eq!(next(&mut dev), ("v1/devices/me/attributes".into(), r#"{"mode":"eco"}"#.into()));
    // A delete on B is pushed by A, which holds the device (it travels on the device-data topic).
    let delete = format!("/api/plugins/telemetry/DEVICE/{id}/SHARED_SCOPE?keys=mode");
    assert_eq!(b.req("DELETE", &delete, Some(jwt), None).0, 200);
    assert_eq!(next(&mut dev), ("v1/devices/me/attributes".into(), r#"{"deleted":["mode"]}"#.into()));

    let twoway = format!("/api/plugins/rpc/twoway/{id}");
    let answered = std::thread::scope(|s| {
        let call = s.spawn(|| b.req("POST", &twoway, Some(jwt), Some(r#"{"method":"getTemp","params":{"unit":"C"}}"#)));
        let (topic, body) = next(&mut dev);
        assert_eq!(body, r#"{"method":"getTemp","params":{"unit":"C"}}"#);
        let n = topic.strip_prefix("v1/devices/me/rpc/request/").expect("an RPC request topic");
        dev.publish(&format!("v1/devices/me/rpc/response/{n}"), br#"{"temp":21.5}"#, QoS::AtMostOnce, None);
        call.join().unwrap()
    });
    assert_eq!(answered, (200, r#"{"temp":21.5}"#.to_owned()), "B's two-way call, answered by the device on A");

    let oneway = format!("/api/rpc/oneway/{id}");
    assert_eq!(b.req("POST", &oneway, Some(jwt), Some(r#"{"method":"blink","params":3}"#)).0, 200);
    assert_eq!(next(&mut dev).1, r#"{"method":"blink","params":3}"#);

    // An inactivityTimeout set on B holds on A, which watches the connected device: it goes
    // silent and A calls it inactive (A's default timeout is ten minutes).
    let server = format!("/api/plugins/telemetry/DEVICE/{id}/attributes/SERVER_SCOPE");
    assert_eq!(b.req("POST", &server, Some(jwt), Some(r#"{"inactivityTimeout":1000}"#)).0, 200);
    let active = format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/SERVER_SCOPE?keys=active");
    let inactive = eventually(20, || b.json("GET", &active, jwt, None).1[0]["value"] == serde_json::json!(false));
    assert!(inactive, "A kept its own timeout: {}", b.json("GET", &active, jwt, None).1);

    // Connected nowhere: 409 once no node said it delivered the call (rpc.remote_wait, 1 s).
    dev.disconnect();
    let offline = eventually(10, || b.req("POST", &oneway, Some(jwt), Some(r#"{"method":"blink"}"#)).0 == 409);
    assert!(offline, "B does not answer 409 for a device connected nowhere");
}

/// Alarm rules run where a device's partition is consumed: points posted to both nodes
/// count towards one `REPEATING` rule, one alarm is raised, and both nodes show it, its
/// acknowledgement and its clearing.
fn cross_node_alarms(a: &Server, b: &Server, jwt: &str) {
    let rule = |op: &str, v: i64| {
        serde_json::json!({"condition": {"condition": [{"key": {"type": "TIME_SERIES", "key": "temperature"},
            "valueType": "NUMERIC", "predicate": {"type": "NUMERIC", "operation": op, "value": {"defaultValue": v}}}],
            "spec": {"type": "REPEATING", "predicate": {"defaultValue": 2}}}})
    };
    let profile = serde_json::json!({"name": "cluster-boiler", "profileData": {"alarms": [{"id": "hot", "alarmType": "Hot",
        "createRules": {"MAJOR": rule("GREATER", 70)}, "clearRule": rule("LESS", 50)}]}});
    assert_eq!(a.json("POST", "/api/deviceProfile", jwt, Some(profile)).0, 200);
    let body = serde_json::json!({"name": "cluster-boiler-1", "type": "cluster-boiler"});
    let (st, d) = a.json("POST", "/api/device?accessToken=cluster-boiler-token", jwt, Some(body));
    assert_eq!(st, 200, "{d}");
    let id = d["id"]["id"].as_str().unwrap().to_owned();
    assert!(eventually(10, || b.json("GET", &format!("/api/device/{id}"), jwt, None).0 == 200));
    let alarms = |s: &Server| -> Vec<serde_json::Value> {
        let (_, page) = s.json("GET", &format!("/api/v2/alarm/DEVICE/{id}?pageSize=10&page=0"), jwt, None);
        page["data"].as_array().cloned().unwrap_or_default()
    };
    // One hot point on each node: two in a row, wherever they came in.
    assert_eq!(a.telemetry("cluster-boiler-token", r#"{"temperature":75}"#), 200);
    assert_eq!(b.telemetry("cluster-boiler-token", r#"{"temperature":76}"#), 200);
    for s in [a, b] {
        assert!(eventually(30, || alarms(s).len() == 1), "{:?}", alarms(s));
    }
    let alarm = alarms(a).remove(0);
    assert_eq!((alarm["severity"].as_str(), alarm["status"].as_str()), (Some("MAJOR"), Some("ACTIVE_UNACK")));
    let alarm_id = alarm["id"]["id"].as_str().unwrap().to_owned();
    assert_eq!(b.json("POST", &format!("/api/alarm/{alarm_id}/ack"), jwt, None).0, 200);
    assert!(eventually(30, || alarms(a)[0]["status"] == "ACTIVE_ACK"), "{:?}", alarms(a));
    for s in [a, b] {
        assert_eq!(s.telemetry("cluster-boiler-token", r#"{"temperature":20}"#), 200);
    }
    for s in [a, b] {
        assert!(eventually(30, || alarms(s).first().is_some_and(|x| x["status"] == "CLEARED_ACK")), "{:?}", alarms(s));
        assert_eq!(alarms(s).len(), 1, "one alarm, raised once");
    }
}

/// `cluster.entities = "postgres"` with PostgreSQL time series: two nodes on one Kafka and
/// one PostgreSQL share devices, credentials, sessions and telemetry. What is created,
/// changed or deleted on one node holds on the other, and a device may post to either.
#[test]
fn two_nodes_share_devices_and_telemetry() {
    let (kafka, pg) = (Kafka::start(1), Postgres::start());
    let tmp = tempfile::tempdir().unwrap();
    let env = |node: &str| {
        let mut env = kafka.env(node);
        env.push(("GRIDLINKS_CLUSTER_TIMESERIES", "postgres".into()));
        env.push(("GRIDLINKS_CLUSTER_ENTITIES", "postgres".into()));
        env.push(("GRIDLINKS_CLUSTER_POSTGRES_URL_FILE", pg.url_file().display().to_string()));
        env.push(("GRIDLINKS_AUTH_JWT_SECRET", "one-secret-for-every-node".into()));
        env
    };
    let a = start_on(&tmp.path().join("a"), &env("node-a"));
    let mut b = start_on(&tmp.path().join("b"), &env("node-b"));

    // One first tenant, and one set of logins: a token made on A works on B at once (B
    // catches up when it meets a login it does not know yet).
    let jwt = a.login();
    let (st, user_a) = a.json("GET", "/api/auth/user", &jwt, None);
    assert_eq!(st, 200);
    let (st, user_b) = b.json("GET", "/api/auth/user", &jwt, None);
    assert_eq!(st, 200, "{user_b}");
    assert_eq!(user_a["tenantId"], user_b["tenantId"]);
    let jwt_b = b.login();
    assert_eq!(a.json("GET", "/api/auth/user", &jwt_b, None).0, 200);
    shared_logins(&a, &b);

    // A device made on A: B knows it soon (its catch-up runs every 250 ms), over REST and
    // for the device itself (MQTT and HTTP).
    let id = a.device(&jwt, "shared-1", "shared-token-1");
    let known = eventually(10, || b.json("GET", &format!("/api/device/{id}"), &jwt_b, None).0 == 200);
    assert!(known, "B does not know the device made on A");
    let (_, ack) = Raw::connect(b.mqtt_port, ProtocolVersion::V5, Some("shared-token-1"), 30);
    assert_eq!(ack.code, 0, "{ack:?}");
    assert_eq!(b.telemetry("shared-token-1", r#"{"ts":1,"values":{"t":1}}"#), 200);
    assert_eq!(a.telemetry("shared-token-1", r#"{"ts":2,"values":{"t":2}}"#), 200);
    // Both points, posted to different nodes, are read back from either.
    for (s, jwt) in [(&a, &jwt), (&b, &jwt_b)] {
        let stored = eventually(30, || s.stored_timestamps(jwt, &id, "t") == [1, 2].into());
        assert!(stored, "{:?}", s.stored_timestamps(jwt, &id, "t"));
    }

    cross_node_mqtt(&a, &b, &jwt, "shared-token-1", "shared-1");
    cross_node_downlink(&a, &b, &jwt);
    cross_node_shared(&a, &b, &jwt, "shared-token-1");
    cross_node_session(&a, &b, &jwt);
    cross_node_alarms(&a, &b, &jwt);

    // Names are the cluster's: B refuses A's name.
    let body = serde_json::json!({"name": "shared-1", "type": "default"});
    let (st, out) = b.json("POST", "/api/device", &jwt_b, Some(body));
    assert_eq!(st, 400, "{out}");

    // An attribute posted on B (through Kafka, stored by whichever node consumes the
    // device's partition) is read on A.
    let (st, _) = b.req("POST", "/api/v1/shared-token-1/attributes", None, Some(r#"{"fw":"v2.0"}"#));
    assert_eq!(st, 200);
    let path = format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/CLIENT_SCOPE");
    let seen = eventually(30, || {
        let (_, attrs) = a.json("GET", &path, &jwt, None);
        attrs.as_array().is_some_and(|v| v.iter().any(|x| x["key"] == "fw" && x["value"] == "v2.0"))
    });
    assert!(seen, "{}", a.json("GET", &path, &jwt, None).1);

    // Deleted on B: A refuses the device's token soon, and closes its live connection.
    let (mut live_on_a, ack) = Raw::connect(a.mqtt_port, ProtocolVersion::V5, Some("shared-token-1"), 30);
    assert_eq!(ack.code, 0, "{ack:?}");
    let (st, _) = b.req("DELETE", &format!("/api/device/{id}"), Some(&jwt_b), None);
    assert_eq!(st, 200);
    let (_, after) = live_on_a.expect_close();
    assert!(after < Duration::from_secs(5), "A closed the deleted device's connection after {after:?}");
    let gone = eventually(10, || a.telemetry("shared-token-1", r#"{"ts":3,"values":{"t":3}}"#) == 401);
    assert!(gone, "A still takes the deleted device's data");
    let (_, ack) = Raw::connect(a.mqtt_port, ProtocolVersion::V5, Some("shared-token-1"), 30);
    assert_ne!(ack.code, 0, "{ack:?}");

    // A node of the cluster shuts down cleanly (its PostgreSQL connections closed off the
    // async runtime).
    assert!(b.sigterm().success(), "node B did not shut down cleanly");
}

/// Where a device reaches each node: HTTP base URL and MQTT port, updated when a node
/// restarts on new ports.
type Nodes = std::sync::Mutex<Vec<(String, u16)>>;

/// Posts points `1, 2, …` of device `token` (key `t`), one after another, to node `home`
/// of `nodes`, until `stop`: over HTTP, or over MQTT (QoS 1, one connection kept until it
/// fails). A point not acknowledged (the node is gone, or refuses while it recovers) is
/// sent again to the next node, as a device behind a load balancer would. The
/// acknowledged timestamps.
fn post_with_failover(
    nodes: &Nodes,
    mut home: usize,
    token: &str,
    mqtt: bool,
    stop: &std::sync::atomic::AtomicBool,
    progress: &std::sync::atomic::AtomicUsize,
) -> Vec<i64> {
    use gridlinks_codec::mqtt::{Packet, QoS};
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build();
    let mut conn: Option<Raw> = None;
    let mut acked = Vec::new();
    let mut ts = 0i64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        ts += 1;
        let body = format!(r#"{{"ts":{ts},"values":{{"t":{ts}}}}}"#);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (base, port) = nodes.lock().unwrap()[home].clone();
            let ok = if mqtt {
                if conn.is_none() {
                    conn = std::panic::catch_unwind(|| Raw::connect(port, ProtocolVersion::V5, Some(token), 30))
                        .ok()
                        .filter(|(_, ack)| ack.code == 0)
                        .map(|(c, _)| c);
                    if let Some(c) = &conn {
                        c.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    }
                }
                let sent = conn.as_mut().is_some_and(|c| {
                    c.try_send(&common::mqtt::publish_packet(
                        "v1/devices/me/telemetry",
                        body.as_bytes(),
                        QoS::AtLeastOnce,
                        Some(1),
                    ))
                    .is_ok()
                        && matches!(c.try_recv(), Ok(Some(Packet::PubAck(a))) if a.reason == 0)
                });
                if !sent {
                    conn = None;
                }
                sent
            } else {
                match agent.post(&format!("{base}/api/v1/{token}/telemetry")).send_string(&body) {
                    Ok(r) => r.status() == 200,
                    Err(ureq::Error::Status(503 | 401, _)) | Err(ureq::Error::Transport(_)) => false,
                    Err(e) => panic!("{base}: {e}"),
                }
            };
            if ok {
                break;
            }
            home = (home + 1) % 3;
            assert!(Instant::now() < deadline, "no node took point {ts} of {token} within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        acked.push(ts);
        progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    acked
}

/// Three nodes on three Kafka brokers (replication factor 3, two in sync), time series in
/// `timeseries` (Cassandra or PostgreSQL), entities in PostgreSQL. Devices post to all
/// three nodes, over HTTP and MQTT; under that load node A is killed (kill -9) and its
/// devices move to the others, a Kafka broker is killed (kill -9), and node B is restarted
/// (its storage writer with it). Every acknowledged point is stored exactly once, and a
/// subscriber on node C (rumqttc) receives every one.
fn three_nodes_lose_nothing(timeseries: &str) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;
    let (kafka, pg) = (Kafka::start(3), Postgres::start());
    let cassandra = (timeseries == "cassandra").then(Cassandra::start);
    let tmp = tempfile::tempdir().unwrap();
    let env = |node: &str| {
        let mut env = kafka.env(node);
        env.retain(|(k, _)| !k.contains("REPLICATION_FACTOR") && !k.contains("MIN_INSYNC"));
        env.extend([
            ("GRIDLINKS_CLUSTER_KAFKA_REPLICATION_FACTOR", "3".to_owned()),
            ("GRIDLINKS_CLUSTER_KAFKA_MIN_INSYNC_REPLICAS", "2".to_owned()),
            ("GRIDLINKS_CLUSTER_TIMESERIES", timeseries.to_owned()),
            ("GRIDLINKS_CLUSTER_ENTITIES", "postgres".to_owned()),
            ("GRIDLINKS_CLUSTER_POSTGRES_URL_FILE", pg.url_file().display().to_string()),
            ("GRIDLINKS_AUTH_JWT_SECRET", "one-secret-for-every-node".to_owned()),
        ]);
        if let Some(c) = &cassandra {
            env.extend([
                ("GRIDLINKS_CLUSTER_CASSANDRA_CONTACT_POINTS", c.contact.clone()),
                ("GRIDLINKS_CLUSTER_CASSANDRA_REPLICATION_FACTOR", "1".to_owned()),
            ]);
        }
        env
    };
    let a = start_on(&tmp.path().join("a"), &env("node-a"));
    let mut b = start_on(&tmp.path().join("b"), &env("node-b"));
    let c = start_on(&tmp.path().join("c"), &env("node-c"));
    let jwt = a.login();
    let tokens: Vec<String> = (0..6).map(|i| format!("three-token-{i}")).collect();
    let ids: Vec<String> = tokens.iter().enumerate().map(|(i, t)| a.device(&jwt, &format!("three-{i}"), t)).collect();
    for s in [&b, &c] {
        let known =
            eventually(10, || ids.iter().all(|id| s.json("GET", &format!("/api/device/{id}"), &jwt, None).0 == 200));
        assert!(known, "a node does not know the devices made on A");
    }

    // A subscriber on C to every device's canonical telemetry topic.
    let cred = serde_json::json!({"username": "watch", "password": "watch-pw", "subscribe": ["gridlinks/devices/+/telemetry"]});
    assert_eq!(a.json("POST", "/api/mqtt/clients", &jwt, Some(cred)).0, 200);
    assert!(eventually(10, || c.json("GET", "/api/mqtt/clients/watch", &jwt, None).0 == 200), "C lacks the credential");
    let (seen, _watching) = collector(&c, "watch-c", "watch", "watch-pw", &["gridlinks/devices/+/telemetry"]);

    let nodes: Nodes = Mutex::new([&a, &b, &c].iter().map(|s| (s.base.clone(), s.mqtt_port)).collect());
    let stop = AtomicBool::new(false);
    let progress: Vec<AtomicUsize> = tokens.iter().map(|_| AtomicUsize::new(0)).collect();
    let a_pid = a.pid();
    // Stops the devices however the scope ends: a failure in it must not leave them posting.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let acked: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        // Devices 0-2 post over HTTP, 3-5 over MQTT; device i is homed on node i % 3.
        let posters: Vec<_> = tokens
            .iter()
            .enumerate()
            .map(|(i, token)| {
                let (nodes, stop, progress) = (&nodes, &stop, &progress[i]);
                scope.spawn(move || post_with_failover(nodes, i % 3, token, i >= 3, stop, progress))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(4));
        // Node A dies at once: its devices post to B and C from now on.
        Command::new("kill").args(["-9", &a_pid.to_string()]).status().unwrap();
        std::thread::sleep(Duration::from_secs(4));
        // A Kafka broker dies: two replicas of every partition are left, enough to acknowledge.
        kafka.run(&["stop", "2"]);
        std::thread::sleep(Duration::from_secs(4));
        // Node B restarts, and with it its storage writer (the consumer group rebalances).
        assert!(b.sigterm().success(), "node B did not shut down cleanly");
        b = start_on(&tmp.path().join("b"), &env("node-b"));
        nodes.lock().unwrap()[1] = (b.base.clone(), b.mqtt_port);
        // Every device posts on after the last event: 5 more points each and over 20 in
        // all (not a fixed time, which a busy machine may not give them).
        let after: Vec<usize> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
        eventually(60, || {
            progress.iter().zip(&after).all(|(p, a)| {
                let n = p.load(Ordering::Relaxed);
                n >= a + 5 && n > 20
            })
        });
        stop.store(true, Ordering::Relaxed);
        posters.into_iter().map(|p| p.join().unwrap()).collect()
    });

    // Every device kept posting, and no point was lost or stored twice.
    for (i, a) in acked.iter().enumerate() {
        assert!(a.len() > 20, "device {i}: only {} points acknowledged", a.len());
    }
    let jwt = c.login();
    let all = eventually(60, || {
        ids.iter().zip(&acked).all(|(id, a)| a.iter().all(|t| c.stored_timestamps(&jwt, id, "t").contains(t)))
    });
    assert!(all, "acknowledged points are missing");
    c.assert_all_stored(&ids, &acked, "t");
    for (id, a) in ids.iter().zip(&acked) {
        let path = format!(
            "/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=t&startTs=0&endTs=100000000&limit=100000"
        );
        let (_, v) = c.json("GET", &path, &jwt, None);
        assert_eq!(
            v["t"].as_array().map_or(0, Vec::len),
            a.len(),
            "device {id}: a point stored twice or one not acknowledged"
        );
    }
    // The subscriber on C got every acknowledged point, whichever node took it.
    let points = || -> std::collections::HashSet<(String, i64)> {
        seen.lock()
            .unwrap()
            .iter()
            .flat_map(|(topic, payload)| {
                let name = topic.split('/').nth(2).unwrap_or_default().to_owned();
                let points: serde_json::Value = serde_json::from_str(payload).unwrap();
                points
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(move |p| (name.clone(), p["ts"].as_i64().unwrap()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let missing = || -> usize {
        let seen = points();
        acked
            .iter()
            .enumerate()
            .map(|(i, a)| a.iter().filter(|t| !seen.contains(&(format!("three-{i}"), **t))).count())
            .sum()
    };
    let delivered = eventually(30, || missing() == 0);
    assert!(delivered, "{} acknowledged points did not reach the subscriber on C", missing());
}

#[test]
fn three_nodes_on_three_brokers_and_cassandra_lose_nothing_when_a_node_and_a_broker_die() {
    three_nodes_lose_nothing("cassandra");
}

#[test]
fn three_nodes_on_three_brokers_and_postgres_lose_nothing_when_a_node_and_a_broker_die() {
    three_nodes_lose_nothing("postgres");
}
