//! The server's REST, MQTT, CoAP and WebSocket features once through a real two-node
//! cluster: one Kafka broker (`scripts/services/kafka.sh`), one PostgreSQL for the time
//! series and the shared entities (`scripts/services/postgres.sh`), and two `gridlinks`
//! nodes, A and B. The single-node tests show each feature works; this one shows it still
//! works when the write lands on one node and the read on the other, as behind a load
//! balancer. Each area writes on one node and checks on the other, alternating.
//!
//! The cluster's promises it relies on, and no more: device data is acknowledged once
//! Kafka has it and is queryable soon after (a storage writer consumes it), and entities
//! made on one node reach the other at its next catch-up (`cluster.entities_poll`,
//! 250 ms). So every read after a write on the other node polls ([`eventually`]). Logins
//! (JWTs) work on both nodes.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
mod kafka_service;
#[path = "../../gridlinks-postgres/tests/service/mod.rs"]
mod pg_service;

use std::collections::HashSet;
use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

use coap_lite::{CoapOption, MessageClass, MessageType, RequestType, ResponseType};
use common::mqtt::{Packet, ProtocolVersion, QoS, Raw};
use common::{json, ws, Server, J, SYSADMIN_PASSWORD};
use kafka_service::Kafka;
use pg_service::Postgres;

/// How long a read after a write on the other node may take to see it, seconds.
const WAIT: u64 = 30;

#[test]
fn rest_mqtt_coap_and_websocket_features_hold_across_two_nodes() {
    let (kafka, pg) = (Kafka::start(1), Postgres::start());
    let tmp = tempfile::tempdir().unwrap();
    let a = node(&kafka, &pg, &tmp.path().join("a"), "node-a");
    let b = node(&kafka, &pg, &tmp.path().join("b"), "node-b");
    // One login for both nodes.
    let jwt = a.login();

    devices_and_profiles(&a, &b, &jwt);
    customers_and_users(&a, &b, &jwt);
    telemetry(&a, &b, &jwt);
    attributes(&a, &b, &jwt);
    bulk_import(&a, &b, &jwt);
    gateway(&a, &b, &jwt);
    provisioning(&a, &b, &jwt);
    websocket(&a, &b, &jwt);
    tenants(&a, &b, &jwt);
}

/// A node on `kafka` with its time series and entities in `pg`, its own data in `dir`.
fn node(kafka: &Kafka, pg: &Postgres, dir: &Path, id: &str) -> Server {
    let mut env = kafka.env(id);
    env.extend([
        ("GRIDLINKS_CLUSTER_TIMESERIES", "postgres".to_owned()),
        ("GRIDLINKS_CLUSTER_ENTITIES", "postgres".to_owned()),
        ("GRIDLINKS_CLUSTER_POSTGRES_URL_FILE", pg.url_file().display().to_string()),
        ("GRIDLINKS_AUTH_JWT_SECRET", "one-secret-for-every-node".to_owned()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Server::start_on(dir, &env)
}

// ---- the areas ----------------------------------------------------------------------

/// A device profile made on B; a device of that profile made on A. B reads it, finds it
/// by text search, relabels it; A sees the label; B reads its credentials; deleted on A,
/// B answers 404.
fn devices_and_profiles(a: &Server, b: &Server, jwt: &str) {
    let profile = id_of(&ok(
        b,
        "POST",
        "/api/deviceProfile",
        jwt,
        Some(json!({"name": "cluster-thermostat", "type": "DEFAULT", "transportType": "MQTT"})),
    ));
    known(a, jwt, &format!("/api/deviceProfile/{profile}"));
    let body = json!({"name": "cluster-dev-1", "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": profile}});
    let made = ok(a, "POST", "/api/device?accessToken=CLUSTERDEV1", jwt, Some(body));
    assert_eq!(made["type"], "cluster-thermostat", "{made}");
    let path = format!("/api/device/{}", id_of(&made));

    known(b, jwt, &path);
    let on_b = get(b, jwt, &path);
    assert_eq!((on_b["name"].as_str(), &on_b["deviceProfileId"]), (Some("cluster-dev-1"), &made["deviceProfileId"]));
    let found = get(b, jwt, "/api/tenant/devices?pageSize=10&page=0&textSearch=CLUSTER-DEV");
    assert_eq!(names(&found), ["cluster-dev-1"]);

    let mut relabelled = on_b.clone();
    relabelled["label"] = json!("Boiler room");
    ok(b, "POST", "/api/device", jwt, Some(relabelled));
    eventually("A sees the label set on B", json!("Boiler room"), || get(a, jwt, &path)["label"].clone());

    let cred = get(b, jwt, &format!("{path}/credentials"));
    assert_eq!(
        (cred["credentialsType"].as_str(), cred["credentialsId"].as_str()),
        (Some("ACCESS_TOKEN"), Some("CLUSTERDEV1"))
    );

    ok(a, "DELETE", &path, jwt, None);
    eventually("B forgets the device deleted on A", 404, || status(b, jwt, &path));
}

/// A customer made on A gets a device assigned on B; its user, made and activated on A,
/// logs in on B and reads that device but not another of the tenant's, on either node.
fn customers_and_users(a: &Server, b: &Server, jwt: &str) {
    let customer = a.customer(jwt, "Cluster Customer");
    let theirs = a.device(jwt, "customer-dev", "CUSTOMERDEV");
    let tenants = a.device(jwt, "tenant-dev", "TENANTDEV");
    let (theirs_path, tenants_path) = (format!("/api/device/{theirs}"), format!("/api/device/{tenants}"));
    for path in [&format!("/api/customer/{customer}"), &theirs_path, &tenants_path] {
        known(b, jwt, path);
    }
    let assigned = ok(b, "POST", &format!("/api/customer/{customer}/device/{theirs}"), jwt, None);
    assert_eq!(assigned["customerId"]["id"].as_str(), Some(&*customer), "{assigned}");

    a.user(jwt, "ann@cluster.test", Some(&customer), "ann-secret");
    let ann = login(b, "ann@cluster.test", "ann-secret");
    assert_eq!(get(b, &ann, &theirs_path)["name"], "customer-dev");
    assert_eq!(status(b, &ann, &tenants_path), 403, "a customer user reads a device not its customer's");
    // On A too, once A has the assignment made on B.
    eventually("A lets the customer user read its device", 200, || status(a, &ann, &theirs_path));
    assert_eq!(status(a, &ann, &tenants_path), 403);
}

/// Points over HTTP to A, over MQTT (QoS 1) to B and over CoAP to A are all read on B:
/// history, aggregates, latest values, keys. A range deleted on B is gone on A.
fn telemetry(a: &Server, b: &Server, jwt: &str) {
    const TOKEN: &str = "CLUSTERMETER";
    let id = a.device(jwt, "cluster-meter", TOKEN);
    // Point `ts` is `t = 10·ts`.
    let point = |ts: i64| format!(r#"{{"ts":{ts},"values":{{"t":{}}}}}"#, ts * 10);
    for ts in 1..=4 {
        assert_eq!(a.telemetry(TOKEN, &point(ts)), 200);
    }
    let mut dev = device_mqtt(b, TOKEN, "cluster-meter-b");
    for ts in 5..=8 {
        publish_acked(&mut dev, "v1/devices/me/telemetry", &point(ts), ts as u16);
    }
    dev.disconnect();
    let code = coap_post(a, &format!("/api/v1/{TOKEN}/telemetry"), r#"{"ts":9,"values":{"t":90,"rssi":-70}}"#);
    assert_eq!(code, ResponseType::Created);

    let all: Vec<(i64, f64)> = (1..=9).map(|ts| (ts, ts as f64 * 10.0)).collect();
    eventually("B's history of every point", all, || series(b, jwt, &id, "t", "startTs=0&endTs=100&orderBy=ASC"));
    // Three intervals of three points each: [1, 4), [4, 7), [7, 10), each at its middle.
    let agg = |f: &str| series(b, jwt, &id, "t", &format!("startTs=1&endTs=10&interval=3&agg={f}"));
    assert_eq!(agg("COUNT"), [(2, 3.0), (5, 3.0), (8, 3.0)]);
    assert_eq!(agg("AVG"), [(2, 20.0), (5, 50.0), (8, 80.0)]);
    let latest = json!({"t": [{"ts": 9, "value": "90"}], "rssi": [{"ts": 9, "value": "-70"}]});
    let base = format!("/api/plugins/telemetry/DEVICE/{id}");
    eventually("B's latest values", latest, || get(b, jwt, &format!("{base}/values/timeseries?keys=t,rssi")));
    let keys = get(b, jwt, &format!("{base}/keys/timeseries"));
    let mut keys: Vec<&str> = keys.as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["rssi", "t"]);

    // endTs is exclusive: the HTTP points, 1..=4, go.
    ok(b, "DELETE", &format!("{base}/timeseries/delete?keys=t&startTs=1&endTs=5&deleteLatest=false"), jwt, None);
    eventually("A's history without the range deleted on B", HashSet::from([5, 6, 7, 8, 9]), || {
        a.stored_timestamps(jwt, &id, "t")
    });
}

/// Client attributes an MQTT device published on B are read on A; a server attribute
/// posted on A is read on B; a shared attribute posted on B answers the device's
/// attribute requests on A, over MQTT and HTTP.
fn attributes(a: &Server, b: &Server, jwt: &str) {
    const TOKEN: &str = "CLUSTERATTRS";
    let id = a.device(jwt, "cluster-attrs", TOKEN);
    let mut on_b = device_mqtt(b, TOKEN, "cluster-attrs-b");
    publish_acked(&mut on_b, "v1/devices/me/attributes", r#"{"fw":"v1.0.3"}"#, 1);
    on_b.disconnect();
    eventually("A reads the client attribute published on B", Some(json!("v1.0.3")), || {
        attribute(a, jwt, &id, "CLIENT_SCOPE", "fw")
    });

    let base = format!("/api/plugins/telemetry/DEVICE/{id}");
    ok(a, "POST", &format!("{base}/attributes/SERVER_SCOPE"), jwt, Some(json!({"site": "north"})));
    eventually("B reads the server attribute posted on A", Some(json!("north")), || {
        attribute(b, jwt, &id, "SERVER_SCOPE", "site")
    });

    ok(b, "POST", &format!("{base}/attributes/SHARED_SCOPE"), jwt, Some(json!({"interval": 30})));
    eventually("A has the shared attribute posted on B", Some(json!(30)), || {
        attribute(a, jwt, &id, "SHARED_SCOPE", "interval")
    });
    let mut on_a = device_mqtt(a, TOKEN, "cluster-attrs-a");
    assert_eq!(on_a.subscribe(1, &["v1/devices/me/attributes/response/+"]).return_codes, [1]);
    let request = br#"{"clientKeys":"fw","sharedKeys":"interval"}"#;
    // At QoS 0: no PUBACK to tell apart from the answer.
    on_a.publish("v1/devices/me/attributes/request/1", request, QoS::AtMostOnce, None);
    let (topic, answer) = next_publish(&mut on_a);
    assert_eq!(topic, "v1/devices/me/attributes/response/1");
    assert_eq!(answer, json!({"client": {"fw": "v1.0.3"}, "shared": {"interval": 30}}));
    on_a.disconnect();
    let (st, answer) = a.req("GET", &format!("/api/v1/{TOKEN}/attributes?sharedKeys=interval"), None, None);
    assert_eq!((st, serde_json::from_str::<J>(&answer).unwrap()), (200, json!({"shared": {"interval": 30}})));
}

/// Devices imported on A (CSV with tokens) connect over MQTT to B.
fn bulk_import(a: &Server, b: &Server, jwt: &str) {
    let csv = "name,token\nbulk-1,BULKTOKEN1\nbulk-2,BULKTOKEN2\n";
    let mapping = json!({"columns": [{"type": "NAME"}, {"type": "ACCESS_TOKEN"}],
        "delimiter": ",", "update": false, "header": true});
    let r = ok(a, "POST", "/api/device/bulk_import", jwt, Some(json!({"file": csv, "mapping": mapping})));
    assert_eq!((r["created"].as_i64(), r["errors"].as_i64()), (Some(2), Some(0)), "{r}");
    for token in ["BULKTOKEN1", "BULKTOKEN2"] {
        let mut c = device_mqtt(b, token, token);
        publish_acked(&mut c, "v1/devices/me/telemetry", r#"{"imported":1}"#, 1);
        c.disconnect();
    }
}

/// A gateway made on A, connected to B, announces a sub-device and sends its telemetry;
/// A lists the sub-device by name and reads its points.
fn gateway(a: &Server, b: &Server, jwt: &str) {
    a.gateway(jwt, "cluster-gateway", "CLUSTERGW");
    let mut gw = device_mqtt(b, "CLUSTERGW", "cluster-gateway");
    publish_acked(&mut gw, "v1/gateway/connect", r#"{"device":"gw-sensor-1","type":"thermo"}"#, 1);
    let points = r#"{"gw-sensor-1":[{"ts":10,"values":{"t":1}},{"ts":20,"values":{"t":2}}]}"#;
    publish_acked(&mut gw, "v1/gateway/telemetry", points, 2);
    gw.disconnect();
    let path = "/api/tenant/devices?deviceName=gw-sensor-1";
    eventually("A lists the sub-device made on B", 200, || status(a, jwt, path));
    let sub = get(a, jwt, path);
    assert_eq!(sub["type"], "thermo", "{sub}");
    eventually("A reads the sub-device's points", vec![(10, 1.0), (20, 2.0)], || {
        series(a, jwt, &id_of(&sub), "t", "startTs=0&endTs=100&orderBy=ASC")
    });
}

/// A profile allowing provisioning made on A; a device provisions itself over HTTP on B
/// and posts telemetry to A with the token B gave it.
fn provisioning(a: &Server, b: &Server, jwt: &str) {
    let strategy = "ALLOW_CREATE_NEW_DEVICES";
    let body = json!({"name": "cluster-provisioned", "provisionType": strategy, "provisionDeviceKey": "cluster-key",
        "profileData": {"provisionConfiguration": {"type": strategy, "provisionDeviceSecret": "cluster-secret"}}});
    let profile = id_of(&ok(a, "POST", "/api/deviceProfile", jwt, Some(body)));
    known(b, jwt, &format!("/api/deviceProfile/{profile}"));
    let ask = json!({"deviceName": "provisioned-1", "provisionDeviceKey": "cluster-key",
        "provisionDeviceSecret": "cluster-secret"});
    let (st, answer) = b.req("POST", "/api/v1/provision", None, Some(&ask.to_string()));
    assert_eq!(st, 200, "{answer}");
    let answer: J = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["status"], "SUCCESS", "{answer}");
    let token = answer["credentialsValue"].as_str().unwrap();
    eventually("A takes the provisioned device's telemetry", 200, || {
        a.telemetry(token, r#"{"ts":1,"values":{"t":1}}"#)
    });
    let device = get(a, jwt, "/api/tenant/devices?deviceName=provisioned-1");
    assert_eq!(device["type"], "cluster-provisioned", "{device}");
    eventually("A stores the provisioned device's point", vec![(1, 1.0)], || {
        series(a, jwt, &id_of(&device), "t", "startTs=0&endTs=100")
    });
}

/// A WebSocket session on A subscribed to a device's time series gets its current value,
/// then the point posted to B.
fn websocket(a: &Server, b: &Server, jwt: &str) {
    const TOKEN: &str = "CLUSTERWS";
    let id = a.device(jwt, "cluster-ws", TOKEN);
    assert_eq!(a.telemetry(TOKEN, r#"{"ts":1000,"values":{"temp":20}}"#), 200);
    eventually("A stores the first point", vec![(1000, 20.0)], || series(a, jwt, &id, "temp", "startTs=0&endTs=5000"));

    let mut ws = ws::open(a, "/api/ws", Duration::from_secs(WAIT));
    let sub = json!({"cmdId": 1, "type": "TIMESERIES", "entityType": "DEVICE", "entityId": id, "keys": "temp"});
    ws::send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [sub]}));
    let first = ws::next(&mut ws);
    assert_eq!((&first["subscriptionId"], &first["errorCode"]), (&json!(1), &json!(0)), "{first}");
    assert_eq!(first["data"], json!({"temp": [[1000, "20"]]}), "{first}");

    eventually("B takes the device's telemetry", 200, || b.telemetry(TOKEN, r#"{"ts":2000,"values":{"temp":21}}"#));
    let update = ws::next(&mut ws);
    assert_eq!(update["subscriptionId"], 1, "{update}");
    assert_eq!(update["data"], json!({"temp": [[2000, "21"]]}), "{update}");
}

/// The system administrator makes a second tenant and its administrator on A; that
/// administrator logs in on B, is refused the first tenant's device, and its own device
/// (made on B) takes telemetry on A, which it reads there; the first tenant's
/// administrator is refused that device on A (each as a device that does not exist).
fn tenants(a: &Server, b: &Server, jwt: &str) {
    let sys = a.login_as("sysadmin", SYSADMIN_PASSWORD);
    let tenant = id_of(&ok(a, "POST", "/api/tenant", &sys, Some(json!({"title": "Cluster Beta"}))));
    let admin = json!({"email": "boss@beta.test", "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": tenant}});
    a.activated_user(&sys, admin, "beta-secret");
    let beta = login(b, "boss@beta.test", "beta-secret");
    assert_eq!(get(b, &beta, "/api/auth/user")["tenantId"]["id"].as_str(), Some(&*tenant));

    let first = format!("/api/device/{}", a.device(jwt, "alpha-dev", "ALPHADEV"));
    known(b, jwt, &first);
    assert_eq!(status(b, &beta, &first), 404, "another tenant's device: as one that does not exist");

    let own = b.device(&beta, "beta-dev", "BETADEV");
    eventually("A takes the telemetry of a device made on B", 200, || {
        a.telemetry("BETADEV", r#"{"ts":1,"values":{"t":1}}"#)
    });
    eventually("A stores the second tenant's point", vec![(1, 1.0)], || {
        series(a, &beta, &own, "t", "startTs=0&endTs=100")
    });
    assert_eq!(
        status(a, jwt, &format!("/api/device/{own}")),
        404,
        "another tenant's device: as one that does not exist"
    );
}

// ---- polling --------------------------------------------------------------------------

/// Reads with `read` every 100 ms until it gives `want`; panics naming `what` and the last
/// value read after [`WAIT`] seconds.
fn eventually<T: PartialEq + std::fmt::Debug>(what: &str, want: T, mut read: impl FnMut() -> T) {
    let deadline = Instant::now() + Duration::from_secs(WAIT);
    loop {
        let got = read();
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: after {WAIT} s still {got:?}, not {want:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `s` answers `GET path` with 200: it knows what the other node made.
fn known(s: &Server, jwt: &str, path: &str) {
    eventually(&format!("{} knows {path}", s.base), 200, || status(s, jwt, path));
}

// ---- REST -----------------------------------------------------------------------------

/// `method path` on `s` as `jwt`: asserts 200, gives the body.
fn ok(s: &Server, method: &str, path: &str, jwt: &str, body: Option<J>) -> J {
    let (st, v) = s.json(method, path, jwt, body);
    assert_eq!(st, 200, "{method} {path} on {}: {v}", s.base);
    v
}

fn get(s: &Server, jwt: &str, path: &str) -> J {
    ok(s, "GET", path, jwt, None)
}

/// The status of `GET path` on `s` as `jwt`.
fn status(s: &Server, jwt: &str, path: &str) -> u16 {
    s.json("GET", path, jwt, None).0
}

/// The id of an entity as ThingsBoard returns it (`{"id": {"id": …}}`).
fn id_of(v: &J) -> String {
    v["id"]["id"].as_str().unwrap_or_else(|| panic!("no id in {v}")).to_owned()
}

/// The names in a page of devices.
fn names(page: &J) -> Vec<&str> {
    page["data"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect()
}

/// `user`'s access token from a password login on `s`, at once: a node that does not have
/// the user's activation yet catches up first.
fn login(s: &Server, user: &str, password: &str) -> String {
    let (st, body) = s.try_login(user, password);
    assert_eq!(st, 200, "{user} logs in on {}: {body}", s.base);
    body["token"].as_str().unwrap().to_owned()
}

/// Device `id`'s points of `key` (`values/timeseries?keys={key}&{query}`, numbers), as
/// (ts, value).
fn series(s: &Server, jwt: &str, id: &str, key: &str, query: &str) -> Vec<(i64, f64)> {
    let path =
        format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys={key}&useStrictDataTypes=true&{query}");
    let v = get(s, jwt, &path);
    let points = v[key].as_array().cloned().unwrap_or_default();
    points.iter().map(|p| (p["ts"].as_i64().unwrap(), p["value"].as_f64().unwrap())).collect()
}

/// Attribute `key` of device `id` in `scope` as `s` reads it; `None` when absent.
fn attribute(s: &Server, jwt: &str, id: &str, scope: &str, key: &str) -> Option<J> {
    let list = get(s, jwt, &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/{scope}"));
    list.as_array()?.iter().find(|a| a["key"] == key).map(|a| a["value"].clone())
}

// ---- MQTT -----------------------------------------------------------------------------

/// Device `token`'s MQTT 5 connection to `s` as client `client_id`, once `s` knows the
/// token (it may have been made on the other node).
fn device_mqtt(s: &Server, token: &str, client_id: &str) -> Raw {
    let mut conn = None;
    eventually(&format!("{token} connects to {}", s.base), 0, || {
        let (c, ack) = Raw::connect_as(s.mqtt_port, ProtocolVersion::V5, client_id, Some(token));
        conn = Some(c);
        ack.code
    });
    let c = conn.unwrap();
    c.stream.set_read_timeout(Some(Duration::from_secs(WAIT))).unwrap();
    c
}

/// Publishes `payload` at QoS 1 as packet `id`; asserts the PUBACK (reason 0).
fn publish_acked(c: &mut Raw, topic: &str, payload: &str, id: u16) {
    c.publish(topic, payload.as_bytes(), QoS::AtLeastOnce, Some(id));
    match c.recv() {
        Some(Packet::PubAck(ack)) => assert_eq!((ack.packet_id, ack.reason), (id, 0), "{topic}"),
        other => panic!("{topic}: expected a PUBACK, got {other:?}"),
    }
}

/// The next message the server sends `c` (other packets skipped): topic and JSON payload.
fn next_publish(c: &mut Raw) -> (String, J) {
    loop {
        match c.recv() {
            Some(Packet::Publish(p)) => return (p.topic, serde_json::from_slice(&p.payload).unwrap()),
            Some(_) => continue,
            None => panic!("the connection closed"),
        }
    }
}

// ---- CoAP -----------------------------------------------------------------------------

/// A confirmable CoAP POST of `body` to `path` on `s`; the response's code (piggybacked
/// on the ACK, or after an empty ACK as a separate response).
fn coap_post(s: &Server, path: &str, body: &str) -> ResponseType {
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(WAIT))).unwrap();
    let mut p = coap_lite::Packet::new();
    p.header.set_version(1);
    p.header.set_type(MessageType::Confirmable);
    p.header.code = MessageClass::Request(RequestType::Post);
    p.header.message_id = 0x2001;
    p.set_token(vec![0xc1, 0x05]);
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        p.add_option(CoapOption::UriPath, seg.as_bytes().to_vec());
    }
    p.payload = body.as_bytes().to_vec();
    udp.send_to(&p.to_bytes().unwrap(), ("127.0.0.1", s.coap_port)).unwrap();
    loop {
        let mut buf = [0u8; 2048];
        let n = udp.recv(&mut buf).unwrap();
        match coap_lite::Packet::from_bytes(&buf[..n]).unwrap().header.code {
            MessageClass::Response(code) => return code,
            MessageClass::Empty => continue,
            other => panic!("not a response: {other:?}"),
        }
    }
}
