//! Data forwarding on the real binary: an HTTP sink (a real receiver on loopback, stopped
//! and started again mid-stream, and the server killed with SIGKILL mid-stream) gets every
//! acknowledged message, in order per device, filtered by profile, event type and key,
//! signed; an MQTT sink delivers through a real Mosquitto that is restarted mid-stream; a
//! Kafka sink writes to a real Kafka whose broker is killed mid-stream, and from a node
//! that commits to Kafka and stores time series in Cassandra, killed mid-stream; bad sinks
//! are refused on save with a clear error; secrets are never shown.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

#[path = "../../gridlinks-cassandra/tests/service/mod.rs"]
mod cassandra_service;
mod common;
mod kafka_service;
use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::*;

const ENV: [(&str, &str); 2] =
    [("GRIDLINKS_FORWARDING_ALLOW_PRIVATE_ADDRESSES", "true"), ("GRIDLINKS_FORWARDING_RETRY_DELAY", "100")];

/// An HTTP receiver on a fixed loopback port that keeps each POSTed JSON array's events
/// and the signature headers; it can be stopped (connections refused) and started again.
struct Receiver {
    port: u16,
    events: Arc<Mutex<Vec<J>>>,
    signed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start() -> Self {
        let mut r = Self {
            port: free_port(),
            events: Arc::default(),
            signed: Arc::default(),
            stop: Arc::default(),
            thread: None,
        };
        r.resume();
        r
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/ingest", self.port)
    }

    fn resume(&mut self) {
        let l = TcpListener::bind(("127.0.0.1", self.port)).unwrap();
        l.set_nonblocking(true).unwrap();
        self.stop.store(false, Ordering::SeqCst);
        let (events, signed, stop) = (self.events.clone(), self.signed.clone(), self.stop.clone());
        self.thread = Some(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let Ok((conn, _)) = l.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                };
                conn.set_nonblocking(false).unwrap();
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                let mut len = 0;
                loop {
                    let mut h = String::new();
                    r.read_line(&mut h).unwrap();
                    let h = h.trim_end().to_lowercase();
                    if h.is_empty() {
                        break;
                    }
                    if let Some(v) = h.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                    if h.starts_with("x-gridlinks-signature: sha256=") {
                        signed.store(true, Ordering::SeqCst);
                    }
                }
                let mut body = vec![0; len];
                r.read_exact(&mut body).unwrap();
                let batch: Vec<J> = serde_json::from_slice(&body).unwrap();
                events.lock().unwrap().extend(batch);
                let mut conn = conn;
                let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            }
        }));
    }

    /// Stops listening: connections are refused until [`Receiver::resume`].
    fn pause(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
    }

    fn events(&self) -> Vec<J> {
        self.events.lock().unwrap().clone()
    }
}

fn profile(s: &Server, jwt: &str, name: &str) -> String {
    let (st, p) = s.json("POST", "/api/deviceProfile", jwt, Some(json!({"name": name, "type": "DEFAULT"})));
    assert_eq!(st, 200, "{p}");
    p["id"]["id"].as_str().unwrap().to_owned()
}

fn device_in(s: &Server, jwt: &str, name: &str, token: &str, profile: &str) -> String {
    let body = json!({"name": name, "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": profile}});
    let (st, d) = s.json("POST", &format!("/api/device?accessToken={token}"), jwt, Some(body));
    assert_eq!(st, 200, "{d}");
    d["id"]["id"].as_str().unwrap().to_owned()
}

fn sink(s: &Server, jwt: &str, body: J) -> J {
    let (st, v) = s.json("POST", "/api/forwarding/sink", jwt, Some(body));
    assert_eq!(st, 200, "{v}");
    v
}

/// The `t` values of `device`'s telemetry events, in arrival order.
fn arrivals(events: &[J], device: &str) -> Vec<i64> {
    events
        .iter()
        .filter(|e| e["type"] == "TELEMETRY" && e["deviceId"] == device)
        .map(|e| e["values"]["t"].as_i64().unwrap())
        .collect()
}

/// Each value's first arrival is after every smaller one's: a batch sent again (at least
/// once) repeats what came before, it never overtakes.
fn assert_in_order(what: &str, arrived: &[i64]) {
    let mut seen = BTreeSet::new();
    for &v in arrived {
        if seen.insert(v) {
            assert_eq!(seen.last(), Some(&v), "{what}: {v} arrived first after a larger value: {arrived:?}");
        }
    }
}

#[test]
fn an_http_sink_gets_every_acknowledged_message_in_order_across_a_sink_outage_and_a_kill9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &ENV);
    let jwt = s.login();
    let (fwd, other) = (profile(&s, &jwt, "forwarded"), profile(&s, &jwt, "kept-home"));
    let a = device_in(&s, &jwt, "boiler-a", "tok-a", &fwd);
    let b = device_in(&s, &jwt, "boiler-b", "tok-b", &fwd);
    let home = device_in(&s, &jwt, "meter-home", "tok-home", &other);
    let mut rx = Receiver::start();
    let created = sink(
        &s,
        &jwt,
        json!({"name": "warehouse", "type": "HTTP",
            "configuration": {"url": rx.url(), "secret": "s3cret", "batchSize": 7, "headers": {"X-Api-Key": "k"}},
            "filter": {"deviceProfileIds": [fwd], "keys": ["t", "fw"]}}),
    );
    let id = created["id"]["id"].as_str().unwrap().to_owned();
    assert_eq!(created["configuration"]["secretSet"], true, "{created}");
    assert!(created["configuration"].get("secret").is_none(), "a secret is never shown: {created}");

    let send = |s: &Server, from: i64, to: i64| {
        for n in from..to {
            for token in ["tok-a", "tok-b", "tok-home"] {
                let body = json!({"ts": 1_700_000_000_000i64 + n, "values": {"t": n, "noise": "x"}}).to_string();
                assert_eq!(s.telemetry(token, &body), 200);
            }
        }
    };
    send(&s, 0, 40);
    wait_until("the first messages at the sink", || arrivals(&rx.events(), &a).len() >= 40);
    // The sink goes away: ingest goes on, acknowledged; the sink's task retries.
    rx.pause();
    send(&s, 40, 80);
    let (st, _) =
        s.req("POST", "/api/v1/tok-a/attributes", None, Some(&json!({"fw": "v1.2", "secret-ish": 1}).to_string()));
    assert_eq!(st, 200);
    wait_until("a failed delivery in the sink's statistics", || {
        let (_, v) = s.json("GET", &format!("/api/forwarding/sink/{id}"), &jwt, None);
        v["stats"]["failedAttempts"].as_u64().unwrap_or(0) > 0 && v["stats"]["lastError"].is_string()
    });
    // The server dies with acknowledged data not yet forwarded, and comes back.
    s.kill9();
    let s = Server::start_on(&dir, &ENV);
    let jwt = s.login();
    send(&s, 80, 100);
    rx.resume();
    for d in [&a, &b] {
        wait_until("every acknowledged message at the sink", || {
            arrivals(&rx.events(), d).into_iter().collect::<BTreeSet<_>>().len() == 100
        });
    }
    let events = rx.events();
    for d in [&a, &b] {
        let got = arrivals(&events, d);
        assert_eq!(got.iter().copied().collect::<BTreeSet<_>>(), (0..100).collect(), "{d}");
        assert_in_order(d, &got);
    }
    assert!(arrivals(&events, &home).is_empty(), "a device of another profile is not forwarded");
    for e in &events {
        if e["type"] == "TELEMETRY" {
            assert_eq!(e["values"].as_object().unwrap().len(), 1, "only the sink's keys: {e}");
            assert!(e["deviceName"].as_str().unwrap().starts_with("boiler-"), "{e}");
            assert_eq!(e["deviceProfileId"], fwd.as_str());
            assert!(e["seq"].as_u64().unwrap() > 0);
        }
    }
    let attrs: Vec<&J> = events.iter().filter(|e| e["type"] == "ATTRIBUTES").collect();
    assert_eq!(attrs.len(), 1, "{attrs:?}");
    assert_eq!(attrs[0]["scope"], "CLIENT_SCOPE");
    assert_eq!(attrs[0]["values"], json!({"fw": "v1.2"}));
    assert!(rx.signed.load(Ordering::SeqCst), "POSTs carry the signature");

    // An alarm change is forwarded too.
    let alarm = json!({"originator": {"entityType": "DEVICE", "id": a}, "type": "Overheat", "severity": "MAJOR"});
    assert_eq!(s.json("POST", "/api/alarm", &jwt, Some(alarm)).0, 200);
    wait_until("the alarm at the sink", || rx.events().iter().any(|e| e["type"] == "ALARM"));
    let alarm_event = rx.events().into_iter().find(|e| e["type"] == "ALARM").unwrap();
    assert_eq!(alarm_event["alarm"]["type"], "Overheat");
    assert_eq!(alarm_event["alarm"]["status"], "ACTIVE_UNACK");
    assert_eq!(alarm_event["deviceId"], a.as_str());

    let (_, v) = s.json("GET", &format!("/api/forwarding/sink/{id}"), &jwt, None);
    assert!(v["stats"]["deliveredEvents"].as_u64().unwrap() > 0, "{v}");
    let (_, list) = s.json("GET", "/api/forwarding/sinks?pageSize=10&page=0", &jwt, None);
    assert_eq!(list["totalElements"], 1, "{list}");
    let (_, m) = s.req("GET", "/metrics", None, None);
    assert!(m.contains(&format!("gridlinks_forward_delivered_events_total{{sink=\"{id}\"}}")), "{m}");

    // A device moved into the sink's profile is forwarded from its next message on.
    let (_, mut moved) = s.json("GET", &format!("/api/device/{home}"), &jwt, None);
    moved["deviceProfileId"] = json!({"entityType": "DEVICE_PROFILE", "id": fwd});
    assert_eq!(s.json("POST", "/api/device", &jwt, Some(moved)).0, 200);
    assert_eq!(s.telemetry("tok-home", &json!({"t": 1000}).to_string()), 200);
    wait_until("the moved device's message at the sink", || arrivals(&rx.events(), &home) == [1000]);
    let v = s.json("GET", &format!("/api/forwarding/sink/{id}"), &jwt, None).1;

    // An update without the secret keeps it; disabling stops the sink.
    let mut update = v.clone();
    update["enabled"] = false.into();
    update["configuration"].as_object_mut().unwrap().remove("secretSet");
    let updated = sink(&s, &jwt, update);
    assert_eq!(updated["configuration"]["secretSet"], true, "{updated}");
    assert_eq!(updated["stats"]["running"], false);
    let before = rx.events().len();
    send(&s, 100, 105);
    let (st, _) = s.req("DELETE", &format!("/api/forwarding/sink/{id}"), Some(&jwt), None);
    assert_eq!(st, 200);
    // What a disabled sink is not sent, it never gets (nothing arrives, checked after the
    // delete, when no task could send it any more).
    assert_eq!(rx.events().len(), before);
}

#[test]
fn bad_sinks_are_refused_on_save_with_a_clear_error() {
    let s = Server::start();
    let jwt = s.login();
    let refused = |body: J, says: &str| {
        let (st, v) = s.json("POST", "/api/forwarding/sink", &jwt, Some(body.clone()));
        assert_eq!(st, 400, "{body} -> {v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{body} -> {v}, expected {says:?}");
    };
    let http = |c: J| json!({"name": "x", "type": "HTTP", "configuration": c});
    refused(json!({"name": "x", "type": "FTP", "configuration": {}}), "one of HTTP, KAFKA, MQTT");
    refused(http(json!({"url": "ftp://example.com"})), "http(s) URL");
    refused(http(json!({"url": "http://example.com", "batchSize": 0})), "batchSize");
    refused(http(json!({"url": "http://example.com", "headers": {"Bad Header": "v"}})), "headers");
    // Loopback is refused unless forwarding.allow_private_addresses is on.
    refused(http(json!({"url": "http://127.0.0.1:9/x"})), "allow_private_addresses");
    refused(
        json!({"name": "x", "type": "KAFKA", "configuration": {"bootstrapServers": "k1", "topic": "t"}}),
        "host:port",
    );
    refused(
        json!({"name": "x", "type": "KAFKA", "configuration": {"bootstrapServers": "k1:9092", "topic": "a b"}}),
        "topic",
    );
    refused(
        json!({"name": "x", "type": "MQTT", "configuration": {"host": "broker.example", "topic": "a/${nope}"}}),
        "unknown field ${nope}",
    );
    refused(
        json!({"name": "x", "type": "MQTT", "configuration": {"host": "broker.example", "topic": "a/#"}}),
        "wildcards",
    );
    let mut filtered = http(json!({"url": "http://example.com"}));
    filtered["filter"] = json!({"events": ["TELEMETRY", "RPC"]});
    refused(filtered, "filter.events");
    let mut unknown_profile = http(json!({"url": "http://example.com"}));
    unknown_profile["filter"] = json!({"deviceProfileIds": ["6d1c3e3a-0000-4000-8000-000000000001"]});
    let (st, v) = s.json("POST", "/api/forwarding/sink", &jwt, Some(unknown_profile));
    assert_eq!(st, 404, "{v}");
    // A customer user may not manage sinks.
    let customer = s.customer(&jwt, "c");
    let (_, user_jwt) = s.user(&jwt, "cu@example.com", Some(&customer), "customer-password");
    let (st, _) = s.json("GET", "/api/forwarding/sinks?pageSize=10&page=0", &user_jwt, None);
    assert_eq!(st, 403);
}

/// A child process killed when dropped (also when a test panics).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Mosquitto on `port` keeping its sessions in `dir` (saved when it stops on SIGTERM).
fn mosquitto(dir: &Path, port: u16) -> Reaped {
    // Started as root, Mosquitto drops to its own user, which must be able to save there.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n",
            dir.display()
        ),
    )
    .unwrap();
    let child = Command::new("mosquitto")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto (apt-get install mosquitto)");
    wait_until("mosquitto listening", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    Reaped(child)
}

fn sigterm(mut c: Reaped) {
    Command::new("kill").args(["-TERM", &c.0.id().to_string()]).status().unwrap();
    c.0.wait().unwrap();
}

#[test]
fn an_mqtt_sink_publishes_through_a_mosquitto_restarted_mid_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = mosquitto(tmp.path(), port);
    // A subscriber with a session Mosquitto keeps (QoS 1, not clean): what is published
    // while it reconnects waits for it.
    let out = tmp.path().join("received.txt");
    let _sub = Reaped(
        Command::new("stdbuf")
            .args([
                "-oL",
                "mosquitto_sub",
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-q",
                "1",
                "-c",
                "-i",
                "fwd-sub",
            ])
            .args(["-t", "fwd/#", "-v"])
            .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto_sub (apt-get install mosquitto-clients)"),
    );
    let s = Server::start_env(&ENV);
    let jwt = s.login();
    s.device(&jwt, "pump-1", "tok-pump");
    let created = sink(
        &s,
        &jwt,
        json!({"name": "broker", "type": "MQTT",
            "configuration": {"host": "127.0.0.1", "port": port, "topic": "fwd/${deviceName}/${type}",
                "username": "gl", "password": "pw"},
            "filter": {"events": ["TELEMETRY"]}}),
    );
    assert_eq!(created["configuration"]["passwordSet"], true, "{created}");
    let received = || -> HashMap<i64, String> {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (topic, payload) = l.split_once(' ')?;
                let e: J = serde_json::from_str(payload).ok()?;
                Some((e["values"]["t"].as_i64()?, topic.to_owned()))
            })
            .collect()
    };
    let send = |from: i64, to: i64| {
        for n in from..to {
            let body = json!({"ts": 1_700_000_000_000i64 + n, "values": {"t": n}}).to_string();
            assert_eq!(s.telemetry("tok-pump", &body), 200);
        }
    };
    // The subscriber is subscribed once the first message comes through.
    wait_until("the subscriber and the sink connected", || {
        send(0, 1);
        received().contains_key(&0)
    });
    send(1, 30);
    wait_until("the first messages through Mosquitto", || received().len() >= 30);
    sigterm(broker);
    send(30, 60);
    let broker = mosquitto(tmp.path(), port);
    wait_until("every acknowledged message through the restarted Mosquitto", || received().len() == 60);
    let got = received();
    assert!(got.values().all(|t| t == "fwd/pump-1/telemetry"), "{got:?}");
    let (_, v) = s.json("GET", &format!("/api/forwarding/sink/{}", created["id"]["id"].as_str().unwrap()), &jwt, None);
    assert!(v["stats"]["deliveredEvents"].as_u64().unwrap() >= 60, "{v}");
    sigterm(broker);
}

/// Every `t` of `device`'s telemetry events in `topic` so far (a fresh consumer group
/// reading from the start, until nothing more comes for a while).
fn kafka_values(bootstrap: &str, topic: &str, device: &str) -> BTreeSet<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("check-{}", free_port()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut got = BTreeSet::new();
    let mut idle = 0;
    while idle < 3 {
        match consumer.poll(std::time::Duration::from_secs(1)) {
            Some(Ok(m)) => {
                idle = 0;
                let e: J = serde_json::from_slice(m.payload().unwrap()).unwrap();
                if e["deviceId"] == device && e["type"] == "TELEMETRY" {
                    assert_eq!(m.key(), Some(device.as_bytes()), "a device's records are keyed by its id");
                    got.insert(e["values"]["t"].as_i64().unwrap());
                }
            }
            _ => idle += 1,
        }
    }
    got
}

/// Creates `topic` (the test brokers create none by themselves, as production ones
/// often do not) and a Kafka sink writing to it.
fn kafka_sink(s: &Server, jwt: &str, bootstrap: &str, topic: &str) -> String {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let created = rt
        .block_on(admin.create_topics(&[NewTopic::new(topic, 2, TopicReplication::Fixed(1))], &AdminOptions::new()))
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let v = sink(
        s,
        jwt,
        json!({"name": "stream", "type": "KAFKA", "configuration": {"bootstrapServers": bootstrap, "topic": topic}}),
    );
    v["id"]["id"].as_str().unwrap().to_owned()
}

#[test]
fn a_kafka_sink_gets_every_acknowledged_message_across_a_broker_kill() {
    let kafka = kafka_service::Kafka::start(1);
    let bootstrap = kafka.env("x").into_iter().find(|(k, _)| k.ends_with("BOOTSTRAP_SERVERS")).unwrap().1;
    let s = Server::start_env(&ENV);
    let jwt = s.login();
    let id = s.device(&jwt, "meter-k", "tok-k");
    kafka_sink(&s, &jwt, &bootstrap, "gridlinks-forwarded");
    let send = |from: i64, to: i64| {
        for n in from..to {
            let body = json!({"ts": 1_700_000_000_000i64 + n, "values": {"t": n}}).to_string();
            assert_eq!(s.telemetry("tok-k", &body), 200);
        }
    };
    send(0, 30);
    wait_until("the first records in Kafka", || kafka_values(&bootstrap, "gridlinks-forwarded", &id).len() == 30);
    // The sink's broker dies: ingest goes on; the sink retries until it is back.
    kafka.run(&["stop", "1"]);
    send(30, 60);
    kafka.run(&["restart", "1"]);
    wait_until("every acknowledged message in Kafka", || {
        kafka_values(&bootstrap, "gridlinks-forwarded", &id) == (0..60).collect()
    });
}

#[test]
fn a_node_on_kafka_and_cassandra_forwards_what_it_stored_across_a_kill9() {
    let (kafka, cassandra) = (kafka_service::Kafka::start(1), cassandra_service::Cassandra::start());
    let tmp = tempfile::tempdir().unwrap();
    let mut env = kafka.env("node-1");
    let bootstrap = env.iter().find(|(k, _)| k.ends_with("BOOTSTRAP_SERVERS")).unwrap().1.clone();
    env.push(("GRIDLINKS_CLUSTER_TIMESERIES", "cassandra".into()));
    env.push(("GRIDLINKS_CLUSTER_CASSANDRA_CONTACT_POINTS", cassandra.contact.clone()));
    env.push(("GRIDLINKS_CLUSTER_CASSANDRA_REPLICATION_FACTOR", "1".into()));
    env.extend(ENV.iter().map(|(k, v)| (*k, v.to_string())));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dir = tmp.path().join("data");
    let mut s = Server::start_on(&dir, &env);
    let jwt = s.login();
    let id = s.device(&jwt, "meter-c", "tok-c");
    kafka_sink(&s, &jwt, &bootstrap, "gridlinks-forwarded");
    for n in 0..40 {
        let body = json!({"ts": 1_700_000_000_000i64 + n, "values": {"t": n}}).to_string();
        assert_eq!(s.telemetry("tok-c", &body), 200);
    }
    s.kill9();
    let s = Server::start_on(&dir, &env);
    for n in 40..60 {
        let body = json!({"ts": 1_700_000_000_000i64 + n, "values": {"t": n}}).to_string();
        assert_eq!(s.telemetry("tok-c", &body), 200);
    }
    wait_until("every acknowledged message in the sink's topic", || {
        kafka_values(&bootstrap, "gridlinks-forwarded", &id) == (0..60).collect()
    });
}

#[test]
fn a_dead_sink_cannot_fill_the_disk_the_outbox_drops_its_oldest_and_says_so() {
    let mut env = ENV.to_vec();
    env.push(("GRIDLINKS_FORWARDING_OUTBOX_MAX_ENTRIES", "20"));
    let mut s = Server::start_env(&env);
    let jwt = s.login();
    let dev = s.device(&jwt, "chatty", "tok-chatty");
    let mut rx = Receiver::start();
    rx.pause();
    let v = sink(&s, &jwt, json!({"name": "down", "type": "HTTP", "configuration": {"url": rx.url()}}));
    let id = v["id"]["id"].as_str().unwrap().to_owned();
    for n in 0..100 {
        let body = json!({"ts": 1_700_000_000_000i64 + n, "values": {"t": n}}).to_string();
        assert_eq!(s.telemetry("tok-chatty", &body), 200, "ingest goes on while the sink is down");
    }
    wait_until("the dropped entries counted", || {
        let (_, v) = s.json("GET", &format!("/api/forwarding/sink/{id}"), &jwt, None);
        v["stats"]["droppedEntries"].as_u64().unwrap_or(0) > 0
            && v["stats"]["lastError"].as_str().unwrap_or_default().contains("outbox was full")
    });
    // Trimmed each second: once ingest stops, the outbox is back within its bound.
    wait_until("the outbox within its bound", || {
        let (_, m) = s.req("GET", "/metrics", None, None);
        let outbox = m.lines().find_map(|l| l.strip_prefix("gridlinks_forward_outbox_entries "));
        outbox.and_then(|v| v.trim().parse::<u64>().ok()).is_some_and(|n| n <= 20)
    });
    rx.resume();
    wait_until("the newest messages at the sink", || arrivals(&rx.events(), &dev).contains(&99));
    let got = arrivals(&rx.events(), &dev);
    assert!(got.len() < 100, "the oldest were dropped: {got:?}");
    assert_in_order(&dev, &got);
    // With a sink running (and one failing: paused again), the server still stops cleanly.
    rx.pause();
    assert_eq!(s.telemetry("tok-chatty", r#"{"t":100}"#), 200);
    Command::new("kill").args(["-TERM", &s.pid().to_string()]).status().unwrap();
    wait_until("the server to stop on SIGTERM", || s.child.try_wait().unwrap().is_some());
    assert!(s.child.try_wait().unwrap().unwrap().success());
}
