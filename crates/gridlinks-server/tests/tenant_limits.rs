//! Tenant profiles and their limits on the real binary: the system administrator's tenant
//! profile API (ThingsBoard's shapes), transport rate limits refused by name on MQTT 5
//! (PUBACK 0x97, DISCONNECT 0x96), MQTT 3.1.1 (closed), HTTP (429) and CoAP (4.29) with
//! nothing of a refused message stored, per device and per tenant, other tenants untouched;
//! entity counts (403, errorCode 41), REST calls per tenant and per customer (429), and
//! WebSocket sessions and subscriptions per tenant; counted in `/metrics`.
//!
//! Rate limits here are per hour, so that no refill during a slow run changes an answer.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::net::UdpSocket;
use std::time::Duration;

use coap_lite::{MessageClass, MessageType, Packet as Coap, RequestType, ResponseType};
use common::mqtt::*;
use common::{json, Server, J, SYSADMIN_PASSWORD};

/// A tenant with a new profile of `configuration`; its administrator's token.
fn tenant_with(s: &Server, sys: &str, name: &str, configuration: J) -> (String, String) {
    let profile = json!({"name": name, "profileData": {"configuration": configuration}});
    let (st, profile) = s.json("POST", "/api/tenantProfile", sys, Some(profile));
    assert_eq!(st, 200, "{profile}");
    let tenant = json!({"title": name, "tenantProfileId": profile["id"]});
    let (st, tenant) = s.json("POST", "/api/tenant", sys, Some(tenant));
    assert_eq!(st, 200, "{tenant}");
    assert_eq!(tenant["tenantProfileId"], profile["id"], "{tenant}");
    let tenant_id = tenant["id"]["id"].as_str().unwrap().to_owned();
    let admin = json!({"email": format!("boss@{name}.test"), "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": tenant_id}});
    let (_, jwt) = s.activated_user(sys, admin, "tenant-secret");
    (tenant_id, jwt)
}

fn telemetry(ts: i64) -> Vec<u8> {
    json!({"ts": ts, "values": {"t": ts}}).to_string().into_bytes()
}

/// MQTT 5 QoS 1 telemetry publishes of `ts`; the PUBACK of each (reason, reason string).
fn publish_v5(c: &mut Raw, from: i64, n: i64) -> Vec<(u8, Option<String>)> {
    (from..from + n)
        .map(|ts| {
            c.publish(TELEMETRY, &telemetry(ts), QoS::AtLeastOnce, Some(ts as u16));
            match c.recv() {
                Some(Packet::PubAck(a)) => (a.reason, a.reason_string),
                other => panic!("expected a PUBACK, got {other:?}"),
            }
        })
        .collect()
}

const TELEMETRY: &str = "v1/devices/me/telemetry";

fn coap_post(port: u16, path: &str, body: &[u8]) -> (ResponseType, String) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(("127.0.0.1", port)).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut p = Coap::new();
    p.header.set_version(1);
    p.header.set_type(MessageType::Confirmable);
    p.header.code = MessageClass::Request(RequestType::Post);
    p.header.message_id = 7;
    p.set_token(vec![1, 2, 3, 4]);
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        p.add_option(coap_lite::CoapOption::UriPath, seg.as_bytes().to_vec());
    }
    p.payload = body.to_vec();
    socket.send(&p.to_bytes().unwrap()).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = socket.recv(&mut buf).unwrap();
    let r = Coap::from_bytes(&buf[..n]).unwrap();
    let MessageClass::Response(code) = r.header.code else { panic!("not a response: {r:?}") };
    (code, String::from_utf8_lossy(&r.payload).into_owned())
}

fn refusals(s: &Server, limit: &str) -> u64 {
    let (_, text) = s.req("GET", "/metrics", None, None);
    let series = format!("gridlinks_tenant_limit_refusals_total{{limit=\"{limit}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&series)).map_or(0, |v| v.trim().parse().unwrap())
}

#[test]
fn a_device_over_its_rate_is_refused_by_name_on_every_transport_and_nothing_of_it_is_stored() {
    let s = Server::start();
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let limits = json!({
        "type": "DEFAULT",
        "transportDeviceTelemetryMsgRateLimit": "3:3600",
        "transportDeviceMsgRateLimit": "2:3600",
        "transportGatewayTelemetryMsgRateLimit": "3:3600",
        "transportGatewayDeviceTelemetryMsgRateLimit": "1:3600",
    });
    let (_, beta) = tenant_with(&s, &sys, "small", limits);
    let d1 = s.device(&beta, "d1", "SMALL-D1");
    let d2 = s.device(&beta, "d2", "SMALL-D2");
    let free = s.device(&s.login(), "free", "FREE-D");

    // MQTT 5, QoS 1: three taken, the fourth refused in its PUBACK, the connection kept.
    let (mut c, ack) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("SMALL-D1"), 60);
    assert_eq!(ack.code, 0);
    let acks = publish_v5(&mut c, 1, 4);
    assert!(acks[..3].iter().all(|a| a.0 == 0), "{acks:?}");
    assert_eq!(acks[3].0, 0x97, "quota exceeded: {acks:?}");
    let why = acks[3].1.clone().unwrap();
    assert!(
        why.contains("transportDeviceTelemetryMsgRateLimit") && why.contains("3:3600") && why.contains("small"),
        "{why}"
    );
    // Another kind of message has its own allowance (transportDeviceMsgRateLimit), as in
    // ThingsBoard; getSessionLimits tells the device its rates.
    c.publish(
        "v1/devices/me/rpc/request/1",
        br#"{"method":"getSessionLimits","params":{}}"#,
        QoS::AtLeastOnce,
        Some(90),
    );
    let mut limits = None;
    for _ in 0..2 {
        match c.recv() {
            Some(Packet::PubAck(a)) => assert_eq!(a.reason, 0),
            Some(Packet::Publish(p)) => limits = Some(serde_json::from_slice::<J>(&p.payload).unwrap()),
            other => panic!("{other:?}"),
        }
    }
    let limits = limits.unwrap();
    assert_eq!(
        limits["rateLimits"],
        json!({"messages": "2:3600", "telemetryMessages": "3:3600", "telemetryDataPoints": ""})
    );
    // QoS 0 cannot be refused alone: DISCONNECT 0x96 naming the limit.
    c.publish(TELEMETRY, &telemetry(5), QoS::AtMostOnce, None);
    let (d, _) = c.expect_close();
    let d = d.expect("a DISCONNECT");
    assert_eq!(d.reason, 0x96, "message rate too high: {d:?}");
    assert!(d.reason_string.unwrap().contains("transportDeviceTelemetryMsgRateLimit"));
    // MQTT 3.1.1 cannot refuse: the connection closes without a PUBACK.
    let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V3_1_1, Some("SMALL-D1"), 60);
    c.publish(TELEMETRY, &telemetry(6), QoS::AtLeastOnce, Some(6));
    c.expect_close();
    // HTTP: 429 naming it; CoAP: 4.29 naming it.
    let (st, body) = s.req("POST", "/api/v1/SMALL-D1/telemetry", None, Some(&String::from_utf8(telemetry(7)).unwrap()));
    assert_eq!(st, 429, "{body}");
    let body: J = serde_json::from_str(&body).unwrap();
    assert_eq!(body["errorCode"], 33, "{body}");
    assert!(body["message"].as_str().unwrap().contains("transportDeviceTelemetryMsgRateLimit"), "{body}");
    let (code, text) = coap_post(s.coap_port, "/api/v1/SMALL-D1/telemetry", &telemetry(8));
    assert_eq!(code, ResponseType::TooManyRequests, "{text}");
    assert!(text.contains("transportDeviceTelemetryMsgRateLimit"), "{text}");

    // Nothing refused was stored; another device of the tenant, and another tenant's
    // device, are not held up.
    assert_eq!(s.stored_timestamps(&beta, &d1, "t"), (1..=3).collect());
    let (mut c2, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("SMALL-D2"), 60);
    assert!(publish_v5(&mut c2, 1, 3).iter().all(|a| a.0 == 0));
    let (mut c3, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("FREE-D"), 60);
    assert!(publish_v5(&mut c3, 1, 50).iter().all(|a| a.0 == 0), "the default profile bounds nothing");
    assert_eq!(s.stored_timestamps(&s.login(), &free, "t").len(), 50);
    // As in ThingsBoard, what a gateway sends for its devices counts once against the
    // gateway limits, whatever devices it names (a refused one creates no device), and its
    // own messages against the gateway-device limits instead of the device limits.
    s.gateway(&beta, "gw", "SMALL-GW");
    let (mut gw, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("SMALL-GW"), 60);
    for (i, names) in [["s1", "s2"], ["s3", "s4"], ["s5", "s6"], ["s7", "s8"]].iter().enumerate() {
        let body = json!({names[0]: [{"ts": 1, "values": {"t": 1}}], names[1]: [{"ts": 1, "values": {"t": 1}}]});
        gw.publish("v1/gateway/telemetry", body.to_string().as_bytes(), QoS::AtLeastOnce, Some(i as u16 + 1));
        let Some(Packet::PubAck(a)) = gw.recv() else { panic!("no PUBACK") };
        assert_eq!(a.reason, if i < 3 { 0 } else { 0x97 }, "message {i}: {a:?}");
        if i == 3 {
            assert!(a.reason_string.unwrap().contains("transportGatewayTelemetryMsgRateLimit"));
        }
    }
    let (_, s7) = s.json("GET", "/api/tenant/devices?deviceName=s7", &beta, None);
    assert_eq!(s7["status"], 404, "{s7}");
    let own = publish_v5(&mut gw, 20, 2);
    assert_eq!(own[0].0, 0, "{own:?}");
    assert_eq!(own[1].0, 0x97, "{own:?}");
    assert!(own[1].1.as_deref().unwrap().contains("transportGatewayDeviceTelemetryMsgRateLimit"), "{own:?}");
    // getSessionLimits tells a gateway both, as ThingsBoard does.
    gw.publish("v1/devices/me/rpc/request/2", br#"{"method":"getSessionLimits","params":{}}"#, QoS::AtMostOnce, None);
    let limits = loop {
        if let Some(Packet::Publish(p)) = gw.recv() {
            break serde_json::from_slice::<J>(&p.payload).unwrap();
        }
    };
    assert_eq!(limits["rateLimits"]["telemetryMessages"], "1:3600", "{limits}");
    assert_eq!(limits["gatewayRateLimits"]["telemetryMessages"], "3:3600", "{limits}");
    // A device made a gateway counts as one from its next message (its device allowance
    // of 3 is spent; the gateway-device one of 1 is not).
    let (_, mut record) = s.json("GET", &format!("/api/device/{d2}"), &beta, None);
    record["additionalInfo"] = json!({"gateway": true});
    assert_eq!(s.json("POST", "/api/device", &beta, Some(record)).0, 200);
    let (mut c2, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("SMALL-D2"), 60);
    let after = publish_v5(&mut c2, 10, 2);
    assert_eq!((after[0].0, after[1].0), (0, 0x97), "{after:?}");
    assert!(after[1].1.as_deref().unwrap().contains("transportGatewayDeviceTelemetryMsgRateLimit"), "{after:?}");
    assert_eq!(refusals(&s, "transportGatewayTelemetryMsgRateLimit"), 1);
    assert_eq!(refusals(&s, "transportGatewayDeviceTelemetryMsgRateLimit"), 2);
    assert!(refusals(&s, "transportDeviceTelemetryMsgRateLimit") >= 5);
    assert_eq!(refusals(&s, "transportTenantMsgRateLimit"), 0);
}

/// After a refusal an MQTT 5 connection is not read for `mqtt.rate_limit_pause`: what the
/// client sends meanwhile waits in its socket (backpressure, no refusal each), then is read
/// and answered. With the pause 0 (ThingsBoard's way) it is answered at once.
#[test]
fn a_connection_past_its_rate_is_not_read_for_the_pause() {
    for pause in ["8000", "0"] {
        let s = Server::start_env(&[("GRIDLINKS_MQTT_RATE_LIMIT_PAUSE", pause)]);
        let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
        let (_, jwt) = tenant_with(&s, &sys, "paced", json!({"transportDeviceTelemetryMsgRateLimit": "1:3600"}));
        let id = s.device(&jwt, "p", "PACED-D");
        let (mut c, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("PACED-D"), 60);
        assert_eq!(publish_v5(&mut c, 1, 2).iter().map(|a| a.0).collect::<Vec<_>>(), [0, 0x97]);
        c.publish(TELEMETRY, &telemetry(3), QoS::AtLeastOnce, Some(3));
        c.send(&Packet::PingReq);
        if pause != "0" {
            // The pause began before the refusal was written: 3 s after it, well inside.
            c.stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            assert!(c.try_recv().is_err(), "the server read from the connection during its pause");
            c.stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        }
        // Both answered (PINGRESP may come first: it waits for no commit).
        let answers = [c.recv(), c.recv()];
        let refused = |p: &Option<Packet>| matches!(p, Some(Packet::PubAck(a)) if a.reason == 0x97 && a.packet_id == 3);
        assert!(answers.iter().any(refused), "pause {pause}: {answers:?}");
        assert!(answers.iter().any(|p| matches!(p, Some(Packet::PingResp))), "pause {pause}: {answers:?}");
        assert_eq!(s.stored_timestamps(&jwt, &id, "t"), [1].into());
    }
}

#[test]
fn a_tenant_rate_is_shared_by_its_devices_and_a_profile_change_applies_at_once() {
    let s = Server::start();
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let (_, beta) = tenant_with(&s, &sys, "shared", json!({"transportTenantTelemetryDataPointsRateLimit": "4:3600"}));
    s.device(&beta, "a", "SHARED-A");
    s.device(&beta, "b", "SHARED-B");
    let (mut a, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("SHARED-A"), 60);
    let (mut b, _) = Raw::connect(s.mqtt_port, ProtocolVersion::V5, Some("SHARED-B"), 60);
    // Data points, not messages: one message of three values, then one of one.
    a.publish(TELEMETRY, br#"{"x":1,"y":2,"z":3}"#, QoS::AtLeastOnce, Some(1));
    assert!(matches!(a.recv(), Some(Packet::PubAck(p)) if p.reason == 0));
    assert_eq!(publish_v5(&mut b, 1, 1)[0].0, 0);
    let refused = publish_v5(&mut b, 2, 1).pop().unwrap();
    assert_eq!(refused.0, 0x97);
    assert!(refused.1.unwrap().contains("transportTenantTelemetryDataPointsRateLimit"));
    assert_eq!(publish_v5(&mut a, 9, 1)[0].0, 0x97, "the tenant's allowance is spent for all its devices");
    // Saving another tenant reads every profile again: that is no fresh allowance.
    assert_eq!(s.json("POST", "/api/tenant", &sys, Some(json!({"title": "other"}))).0, 200);
    assert_eq!(publish_v5(&mut a, 11, 1)[0].0, 0x97);

    // The system administrator raises the limit: it applies to the next message.
    let (_, profiles) = s.json("GET", "/api/tenantProfiles?pageSize=10&page=0&textSearch=shared", &sys, None);
    let mut profile = profiles["data"][0].clone();
    profile["profileData"]["configuration"]["transportTenantTelemetryDataPointsRateLimit"] = "100:3600".into();
    assert_eq!(s.json("POST", "/api/tenantProfile", &sys, Some(profile)).0, 200);
    assert_eq!(publish_v5(&mut a, 12, 1)[0].0, 0);
}

#[test]
fn the_tenant_profile_api_has_thingsboards_shapes_and_guards_the_default() {
    let s = Server::start();
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let (st, default) = s.json("GET", "/api/tenantProfileInfo/default", &sys, None);
    assert_eq!(st, 200);
    assert_eq!(default["id"]["entityType"], "TENANT_PROFILE");
    let default_id = default["id"]["id"].as_str().unwrap().to_owned();
    let (_, tenants) = s.json("GET", "/api/tenants?pageSize=10&page=0", &sys, None);
    assert_eq!(tenants["data"][0]["tenantProfileId"]["id"], default_id.as_str(), "{tenants}");

    // A bad limit is refused naming its field; a good profile round-trips.
    let bad = json!({"name": "bad", "profileData": {"configuration": {"transportTenantMsgRateLimit": "lots"}}});
    let (st, e) = s.json("POST", "/api/tenantProfile", &sys, Some(bad));
    assert_eq!(st, 400);
    assert!(e["message"].as_str().unwrap().contains("transportTenantMsgRateLimit"), "{e}");
    assert_eq!(s.json("POST", "/api/tenantProfile", &sys, Some(json!({"name": " "}))).0, 400);
    let gold = json!({"name": "gold", "description": "big customers",
        "profileData": {"configuration": {"type": "DEFAULT", "maxDevices": 100, "tenantServerRestLimitsConfiguration": "100:1,2000:60"}}});
    let (st, gold) = s.json("POST", "/api/tenantProfile", &sys, Some(gold));
    assert_eq!(st, 200, "{gold}");
    assert_eq!((gold["name"].as_str(), gold["default"].as_bool()), (Some("gold"), Some(false)));
    let gold_id = gold["id"]["id"].as_str().unwrap().to_owned();
    let (_, got) = s.json("GET", &format!("/api/tenantProfile/{gold_id}"), &sys, None);
    assert_eq!(got["profileData"]["configuration"]["maxDevices"], 100);
    assert_eq!(got["description"], "big customers");
    let (_, page) = s.json("GET", "/api/tenantProfileInfos?pageSize=10&page=0", &sys, None);
    assert_eq!(page["totalElements"], 2, "{page}");
    assert_eq!(s.json("POST", "/api/tenantProfile", &sys, Some(json!({"name": "gold"}))).0, 400, "names are unique");

    // A tenant naming it has it; one naming no profile has the default; an unknown one is 404.
    let (_, t) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "T", "tenantProfileId": gold["id"]})));
    assert_eq!(t["tenantProfileId"]["id"], gold_id.as_str());
    let unknown = json!({"title": "U", "tenantProfileId": {"entityType": "TENANT_PROFILE", "id": "00000000-0000-4000-8000-00000000abcd"}});
    assert_eq!(s.json("POST", "/api/tenant", &sys, Some(unknown)).0, 404);
    let (st, e) = s.json("DELETE", &format!("/api/tenantProfile/{gold_id}"), &sys, None);
    assert_eq!(st, 400, "a profile in use stays: {e}");

    // The default moves; the default cannot be deleted, the old one then can once unused.
    let (st, made) = s.json("POST", &format!("/api/tenantProfile/{gold_id}/default"), &sys, None);
    assert_eq!((st, made["default"].as_bool()), (200, Some(true)));
    let (_, default) = s.json("GET", "/api/tenantProfileInfo/default", &sys, None);
    assert_eq!(default["id"]["id"], gold_id.as_str());
    assert_eq!(s.json("DELETE", &format!("/api/tenantProfile/{gold_id}"), &sys, None).0, 400);
    let (_, first) = s.json("GET", &format!("/api/tenantProfile/{default_id}"), &sys, None);
    assert_eq!(first["default"], false);
    let t_id = t["id"]["id"].as_str().unwrap();
    assert_eq!(s.json("DELETE", &format!("/api/tenant/{t_id}"), &sys, None).0, 200);
    // The first tenant names no profile: it has the default, now gold, so the old one is
    // unused.
    assert_eq!(s.json("DELETE", &format!("/api/tenantProfile/{default_id}"), &sys, None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/tenantProfile/{default_id}"), &sys, None).0, 404);
}

#[test]
fn entity_counts_rest_calls_and_websocket_sessions_are_bounded_per_tenant() {
    let s = Server::start();
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let limits = json!({"maxDevices": 1, "maxAssets": 1, "maxCustomers": 1, "maxDashboards": 1, "maxUsers": 2,
        "maxWsSessionsPerTenant": 1, "maxWsSubscriptionsPerRegularUser": 1});
    let (tenant, beta) = tenant_with(&s, &sys, "tiny", limits.clone());
    let alpha = s.login();
    let over = |what: &str, path: &str, body: J, field: &str| {
        let (st, e) = s.json("POST", path, &beta, Some(body));
        assert_eq!((st, &e["errorCode"]), (403, &json!(41)), "{what}: {e}");
        assert!(e["message"].as_str().unwrap().contains(field), "{what}: {e}");
    };
    let d1_id = s.device(&beta, "d1", "TINY-D1");
    over("device", "/api/device", json!({"name": "d2"}), "maxDevices");
    assert_eq!(s.json("POST", "/api/asset", &beta, Some(json!({"name": "a1", "type": "x"}))).0, 200);
    over("asset", "/api/asset", json!({"name": "a2", "type": "x"}), "maxAssets");
    let c1 = s.customer(&beta, "c1");
    over("customer", "/api/customer", json!({"title": "c2"}), "maxCustomers");
    assert_eq!(s.json("POST", "/api/dashboard", &beta, Some(json!({"title": "db1"}))).0, 200);
    over("dashboard", "/api/dashboard", json!({"title": "db2"}), "maxDashboards");
    // The administrator is one user; one more, then no more.
    s.user(&beta, "u1@tiny.test", Some(&c1), "user-secret");
    over("user", "/api/user", json!({"email": "u2@tiny.test", "authority": "TENANT_ADMIN"}), "maxUsers");
    // An update is not a creation; another tenant is not bounded.
    let (_, d1) = s.json("GET", "/api/tenant/devices?pageSize=10&page=0", &beta, None);
    assert_eq!(s.json("POST", "/api/device", &beta, Some(d1["data"][0].clone())).0, 200);
    for i in 0..3 {
        assert_eq!(s.json("POST", "/api/asset", &alpha, Some(json!({"name": format!("a{i}"), "type": "x"}))).0, 200);
    }

    // One WebSocket session per tenant: a second is refused naming the limit; once the first
    // ends, another may open.
    let session = || {
        let mut ws = common::ws::open(&s, "/api/ws", Duration::from_secs(10));
        let sub = json!({"type": "TIMESERIES", "entityType": "DEVICE", "entityId": d1_id, "cmdId": 1, "keys": "t"});
        common::ws::send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": beta}, "cmds": [sub]}));
        let answer = common::ws::next(&mut ws);
        (ws, answer)
    };
    let (mut first, answer) = session();
    assert_eq!(answer["errorCode"], 0, "{answer}");
    // One subscription per user: a second one of the same user is refused naming it.
    let sub = json!({"type": "TIMESERIES", "entityType": "DEVICE", "entityId": d1_id, "cmdId": 2, "keys": "x"});
    common::ws::send(&mut first, json!({"cmds": [sub]}));
    let refused = loop {
        let m = common::ws::next(&mut first);
        if m["subscriptionId"] == 2 || m["cmdId"] == 2 {
            break m;
        }
    };
    assert!(refused["errorMsg"].as_str().unwrap_or_default().contains("maxWsSubscriptionsPerRegularUser"), "{refused}");
    let (_, refused) = session();
    assert!(refused["errorMsg"].as_str().unwrap_or_default().contains("maxWsSessionsPerTenant"), "{refused}");
    first.close(None).unwrap();
    common::wait_until("the first session ends", || session().1["errorCode"] == 0);

    // REST calls per tenant: the system administrator sets 5 per hour; the sixth call is
    // 429 naming it; the other tenant and the system administrator go on.
    let (_, mut profile) = s.json("GET", "/api/tenantProfiles?pageSize=10&page=0&textSearch=tiny", &sys, None);
    let mut profile = profile["data"][0].take();
    profile["profileData"]["configuration"]["tenantServerRestLimitsConfiguration"] = "5:3600".into();
    assert_eq!(s.json("POST", "/api/tenantProfile", &sys, Some(profile)).0, 200);
    let statuses: Vec<u16> =
        (0..6).map(|_| s.json("GET", "/api/tenant/devices?pageSize=10&page=0", &beta, None).0).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let (_, e) = s.json("GET", "/api/tenant/devices?pageSize=10&page=0", &beta, None);
    assert_eq!(e["errorCode"], 33);
    assert!(e["message"].as_str().unwrap().contains("tenantServerRestLimitsConfiguration"), "{e}");
    assert_eq!(s.json("GET", "/api/tenant/devices?pageSize=10&page=0", &alpha, None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/tenant/{tenant}"), &sys, None).0, 200);
    assert!(refusals(&s, "tenantServerRestLimitsConfiguration") >= 2);
    assert_eq!(refusals(&s, "maxDevices"), 1);
    assert_eq!(refusals(&s, "maxAssets"), 1);
}
