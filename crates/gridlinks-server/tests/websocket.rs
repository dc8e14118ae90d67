//! ThingsBoard's WebSocket API on the real binary, driven by tungstenite (a WebSocket client
//! written outside the project) with the messages of ThingsBoard's documentation: the
//! first update is the current state, then every committed change of the subscribed keys;
//! history; unsubscribe; the older `plugins/telemetry` endpoint; errors; a customer user
//! kept to its customer's devices, at subscription and at every delivery; the subscription
//! limit; a session ended by its token's expiry; and `ENTITY_DATA` as ThingsBoard's widgets
//! send it.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use std::time::Duration;

use common::ws::{self, next, send, Ws};
use common::*;
use tungstenite::Message;

fn open(s: &Server, path: &str) -> Ws {
    ws::open(s, path, Duration::from_secs(10))
}

/// Whether the server closes the session (after any messages, returned).
fn closes(ws: &mut Ws) -> (bool, Vec<J>) {
    let mut seen = Vec::new();
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => seen.push(serde_json::from_str(&t).unwrap()),
            Ok(Message::Close(_)) | Err(_) => return (true, seen),
            Ok(_) => {}
        }
    }
}

fn ts_cmd(cmd_id: i64, device: &str, keys: &str) -> J {
    json!({"cmdId": cmd_id, "type": "TIMESERIES", "entityType": "DEVICE", "entityId": device, "keys": keys})
}

#[test]
fn telemetry_subscriptions_deliver_committed_changes() {
    let s = Server::start();
    let jwt = s.login();
    let d1 = s.device(&jwt, "ws-1", "WSTOKEN1");
    let d2 = s.device(&jwt, "ws-2", "WSTOKEN2");
    assert_eq!(s.telemetry("WSTOKEN1", r#"{"ts":1000,"values":{"temperature":20.5}}"#), 200);

    // The first message authenticates and may carry commands; the first update is the
    // current value.
    let mut ws = open(&s, "/api/ws");
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [ts_cmd(1, &d1, "temperature")]}));
    let first = next(&mut ws);
    assert_eq!(
        first,
        json!({"subscriptionId": 1, "errorCode": 0, "errorMsg": null, "data": {"temperature": [[1000, "20.5"]]},
            "latestValues": {"temperature": 1000}})
    );
    // Committed changes follow, only of the subscribed keys and device.
    assert_eq!(s.telemetry("WSTOKEN2", r#"{"temperature":99}"#), 200);
    assert_eq!(s.telemetry("WSTOKEN1", r#"{"ts":2000,"values":{"temperature":21.5,"other":1}}"#), 200);
    let u = next(&mut ws);
    assert_eq!(u["subscriptionId"], 1);
    assert_eq!(u["data"], json!({"temperature": [[2000, "21.5"]]}), "{u}");

    // History once, and a subscription with a time window starting with its points.
    send(
        &mut ws,
        json!({"cmds": [{"cmdId": 2, "type": "TIMESERIES_HISTORY", "entityType": "DEVICE", "entityId": d1,
            "keys": "temperature", "startTs": 0, "endTs": 5000, "limit": 10, "agg": "NONE"}]}),
    );
    let h = next(&mut ws);
    assert_eq!(h["subscriptionId"], 2);
    assert_eq!(h["data"]["temperature"], json!([[2000, "21.5"], [1000, "20.5"]]), "{h}");
    let mut windowed = ts_cmd(3, &d1, "temperature,other");
    windowed["startTs"] = json!(1500);
    send(&mut ws, json!({"cmds": [windowed]}));
    let w = next(&mut ws);
    assert_eq!(w["data"], json!({"temperature": [[2000, "21.5"]], "other": [[2000, "1"]]}), "{w}");

    // Unsubscribed: only subscription 3 still gets updates.
    send(&mut ws, json!({"cmds": [{"cmdId": 1, "type": "TIMESERIES", "unsubscribe": true}]}));
    assert_eq!(s.telemetry("WSTOKEN1", r#"{"ts":3000,"values":{"temperature":22.5}}"#), 200);
    let u = next(&mut ws);
    assert_eq!((u["subscriptionId"].as_i64(), &u["data"]), (Some(3), &json!({"temperature": [[3000, "22.5"]]})));

    // Commands not served and malformed messages get error updates; the session goes on.
    send(&mut ws, json!({"cmds": [{"cmdId": 4, "type": "ALARM_DATA"}]}));
    assert_eq!(next(&mut ws)["errorCode"], 2);
    ws.send(Message::Text("{not json".into())).unwrap();
    assert_eq!(next(&mut ws)["errorCode"], 2);
    send(&mut ws, json!({"cmds": [ts_cmd(5, "00000000-0000-0000-0000-000000000009", "t")]}));
    assert_eq!(next(&mut ws)["errorCode"], 2, "no such device");

    // The older endpoint: token in the query, tsSubCmds.
    let mut old = open(&s, &format!("/api/ws/plugins/telemetry?token={jwt}"));
    send(
        &mut old,
        json!({"tsSubCmds": [{"cmdId": 7, "entityType": "DEVICE", "entityId": d2, "scope": "LATEST_TELEMETRY"}]}),
    );
    assert_eq!(next(&mut old)["data"]["temperature"][0][1], "99");
    assert_eq!(s.telemetry("WSTOKEN2", r#"{"humidity":40}"#), 200);
    assert_eq!(next(&mut old)["data"]["humidity"][0][1], "40");

    // Without a valid token nothing is served and the session ends.
    let mut anon = open(&s, "/api/ws");
    send(&mut anon, json!({"cmds": [ts_cmd(1, &d1, "temperature")]}));
    let (closed, seen) = closes(&mut anon);
    assert!(closed && seen[0]["errorCode"] == 3, "{seen:?}");
    let mut bad = open(&s, "/api/ws/plugins/telemetry?token=forged");
    let (closed, seen) = closes(&mut bad);
    assert!(closed && seen[0]["errorCode"] == 3, "{seen:?}");
}

/// A customer user's subscriptions: only its customer's devices, and a device taken from
/// the customer stops reaching it at once.
#[test]
fn a_customer_user_gets_only_its_customers_devices() {
    let s = Server::start();
    let jwt = s.login();
    let a = s.customer(&jwt, "A");
    let mine = s.device(&jwt, "mine", "WSMINE");
    let marker = s.device(&jwt, "marker", "WSMARKER");
    let theirs = s.device(&jwt, "theirs", "WSTHEIRS");
    for d in [&mine, &marker] {
        assert_eq!(s.json("POST", &format!("/api/customer/{a}/device/{d}"), &jwt, None).0, 200);
    }
    let (_, ann) = s.user(&jwt, "ann@a.test", Some(&a), "ann-secret");
    let mut ws = open(&s, "/api/ws");
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": ann}, "cmds": [ts_cmd(1, &theirs, "")]}));
    let refused = next(&mut ws);
    assert_eq!((refused["subscriptionId"].as_i64(), refused["errorCode"].as_i64()), (Some(1), Some(3)), "{refused}");
    send(&mut ws, json!({"cmds": [ts_cmd(2, &mine, ""), ts_cmd(3, &marker, "")]}));
    assert_eq!(next(&mut ws)["subscriptionId"], 2);
    assert_eq!(next(&mut ws)["subscriptionId"], 3);
    assert_eq!(s.telemetry("WSTHEIRS", r#"{"secret":1}"#), 200);
    assert_eq!(s.telemetry("WSMINE", r#"{"v":1}"#), 200);
    assert_eq!(next(&mut ws)["subscriptionId"], 2, "its own device; nothing of theirs");
    // Unassigned: the next update it sees is the marker's.
    assert_eq!(s.json("DELETE", &format!("/api/customer/device/{mine}"), &jwt, None).0, 200);
    assert_eq!(s.telemetry("WSMINE", r#"{"v":2}"#), 200);
    assert_eq!(s.telemetry("WSMARKER", r#"{"v":3}"#), 200);
    let u = next(&mut ws);
    assert_eq!((u["subscriptionId"].as_i64(), &u["data"]["v"][0][1]), (Some(3), &json!("3")), "{u}");
}

fn entity_query(cmd_id: i64, filter: J, page_size: usize) -> J {
    json!({"cmdId": cmd_id, "type": "ENTITY_DATA", "query": {
        "entityFilter": filter,
        "pageLink": {"pageSize": page_size, "page": 0, "textSearch": null,
            "sortOrder": {"key": {"type": "ENTITY_FIELD", "key": "name"}, "direction": "ASC"}},
        "entityFields": [{"type": "ENTITY_FIELD", "key": "name"}, {"type": "ENTITY_FIELD", "key": "type"}],
        "latestValues": [{"type": "TIME_SERIES", "key": "temperature"}, {"type": "SHARED_ATTRIBUTE", "key": "target"}]}})
}

fn names(page: &J) -> Vec<&str> {
    page["data"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["latest"]["ENTITY_FIELD"]["name"]["value"].as_str().unwrap())
        .collect()
}

/// `ENTITY_DATA` as ThingsBoard's widgets send it: a page of a device type's devices with
/// entity fields and latest values, then the committed changes its `latestCmd` follows and
/// the points its `tsCmd` follows; a customer user's page holds its customer's devices only.
#[test]
fn entity_data_pages_and_follows_devices() {
    let s = Server::start();
    let jwt = s.login();
    let mut ids = Vec::new();
    for (name, token, ty) in [
        ("th-1", "EDTH1", "thermostat"),
        ("th-2", "EDTH2", "thermostat"),
        ("th-3", "EDTH3", "thermostat"),
        ("meter", "EDMETER", "meter"),
    ] {
        let (st, d) =
            s.json("POST", &format!("/api/device?accessToken={token}"), &jwt, Some(json!({"name": name, "type": ty})));
        assert_eq!(st, 200, "{d}");
        ids.push(d["id"]["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(s.telemetry("EDTH1", r#"{"ts":1000,"values":{"temperature":20}}"#), 200);
    let path = format!("/api/plugins/telemetry/DEVICE/{}/attributes/SHARED_SCOPE", ids[1]);
    assert_eq!(s.req("POST", &path, Some(&jwt), Some(r#"{"target":22}"#)).0, 200);

    let mut ws = open(&s, "/api/ws");
    let thermostats = json!({"type": "deviceType", "deviceTypes": ["thermostat"], "deviceNameFilter": "th"});
    let mut cmd = entity_query(1, thermostats, 2);
    cmd["latestCmd"] =
        json!({"keys": [{"type": "TIME_SERIES", "key": "temperature"}, {"type": "SHARED_ATTRIBUTE", "key": "target"}]});
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [cmd]}));
    let page = next(&mut ws);
    assert_eq!(
        (page["cmdId"].as_i64(), page["cmdUpdateType"].as_str(), page["errorCode"].as_i64()),
        (Some(1), Some("ENTITY_DATA"), Some(0)),
        "{page}"
    );
    assert_eq!(
        (
            page["data"]["totalElements"].as_i64(),
            page["data"]["totalPages"].as_i64(),
            page["data"]["hasNext"].as_bool()
        ),
        (Some(3), Some(2), Some(true))
    );
    assert_eq!(names(&page), ["th-1", "th-2"]);
    let rows = &page["data"]["data"];
    assert_eq!(rows[0]["entityId"], json!({"entityType": "DEVICE", "id": ids[0]}));
    assert_eq!(rows[0]["latest"]["TIME_SERIES"]["temperature"], json!({"ts": 1000, "value": "20"}));
    assert_eq!(rows[0]["latest"]["ENTITY_FIELD"]["type"]["value"], "thermostat");
    assert_eq!(rows[1]["latest"]["SHARED_ATTRIBUTE"]["target"]["value"], "22", "{page}");
    assert!(rows[1]["latest"].get("TIME_SERIES").is_none(), "a value never written is left out: {page}");

    // Committed changes of the page's devices follow; nothing of devices off the page.
    assert_eq!(s.telemetry("EDTH3", r#"{"temperature":30}"#), 200);
    assert_eq!(s.telemetry("EDTH2", r#"{"ts":2000,"values":{"temperature":25,"other":1}}"#), 200);
    let u = next(&mut ws);
    assert_eq!(u["data"], J::Null);
    assert_eq!(
        u["update"],
        json!([{"entityId": {"entityType": "DEVICE", "id": ids[1]},
        "latest": {"TIME_SERIES": {"temperature": {"ts": 2000, "value": "25"}}}, "timeseries": {}}]),
        "{u}"
    );
    assert_eq!(s.req("POST", &path, Some(&jwt), Some(r#"{"target":23}"#)).0, 200);
    let u = next(&mut ws);
    assert_eq!(u["update"][0]["latest"]["SHARED_ATTRIBUTE"]["target"]["value"], "23", "{u}");

    // tsCmd on the same cmdId, no query: the window's points of the page, then new points.
    send(
        &mut ws,
        json!({"cmds": [{"cmdId": 1, "type": "ENTITY_DATA", "tsCmd": {"keys": ["temperature"], "startTs": 0, "timeWindow": 0, "limit": 10}}]}),
    );
    let w = next(&mut ws);
    assert_eq!(w["update"][0]["timeseries"]["temperature"], json!([{"ts": 1000, "value": "20"}]), "{w}");
    assert_eq!(w["update"][1]["timeseries"]["temperature"], json!([{"ts": 2000, "value": "25"}]), "{w}");
    assert_eq!(s.telemetry("EDTH1", r#"{"ts":3000,"values":{"temperature":21}}"#), 200);
    let u = next(&mut ws);
    assert_eq!(u["update"][0]["timeseries"]["temperature"], json!([{"ts": 3000, "value": "21"}]), "{u}");
    assert!(u["update"][0]["latest"].as_object().unwrap().is_empty(), "tsCmd replaced latestCmd: {u}");
    // historyCmd: once.
    send(
        &mut ws,
        json!({"cmds": [{"cmdId": 1, "type": "ENTITY_DATA", "historyCmd": {"keys": ["temperature"], "startTs": 1500, "endTs": 5000}}]}),
    );
    let h = next(&mut ws);
    assert_eq!(h["update"][0]["timeseries"]["temperature"], json!([{"ts": 3000, "value": "21"}]), "{h}");
    // Unsubscribed: a single-entity query on another cmdId is what still updates.
    let mut single =
        entity_query(2, json!({"type": "singleEntity", "singleEntity": {"entityType": "DEVICE", "id": ids[3]}}), 10);
    single["latestCmd"] = json!({"keys": [{"type": "TIME_SERIES", "key": "kwh"}]});
    send(&mut ws, json!({"cmds": [{"cmdId": 1, "type": "ENTITY_DATA_UNSUBSCRIBE"}, single]}));
    assert_eq!(names(&next(&mut ws)), ["meter"]);
    assert_eq!(s.telemetry("EDTH1", r#"{"temperature":22}"#), 200);
    assert_eq!(s.telemetry("EDMETER", r#"{"kwh":7}"#), 200);
    let u = next(&mut ws);
    assert_eq!(
        (u["cmdId"].as_i64(), &u["update"][0]["latest"]["TIME_SERIES"]["kwh"]["value"]),
        (Some(2), &json!("7")),
        "{u}"
    );
    // Errors answer in the entity shape.
    send(
        &mut ws,
        json!({"cmds": [{"cmdId": 3, "type": "ENTITY_DATA", "latestCmd": {"keys": []}},
        entity_query(4, json!({"type": "edgeType", "edgeTypes": ["x"]}), 10)]}),
    );
    for cmd_id in [3, 4] {
        let e = next(&mut ws);
        assert_eq!(
            (e["cmdId"].as_i64(), e["errorCode"].as_i64(), e["cmdUpdateType"].as_str()),
            (Some(cmd_id), Some(2), Some("ENTITY_DATA")),
            "{e}"
        );
    }

    // A customer user's query over every device holds its customer's devices only, and the
    // older endpoint's entityDataCmds serve it too.
    let a = s.customer(&jwt, "A");
    assert_eq!(s.json("POST", &format!("/api/customer/{a}/device/{}", ids[2]), &jwt, None).0, 200);
    let (_, ann) = s.user(&jwt, "ann@a.test", Some(&a), "ann-secret");
    let mut old = open(&s, &format!("/api/ws/plugins/telemetry?token={ann}"));
    let mut all = entity_query(9, json!({"type": "entityType", "entityType": "DEVICE"}), 100);
    all.as_object_mut().unwrap().remove("type");
    send(&mut old, json!({"entityDataCmds": [all]}));
    let p = next(&mut old);
    assert_eq!((names(&p), p["data"]["totalElements"].as_i64()), (vec!["th-3"], Some(1)), "{p}");
    let other =
        entity_query(10, json!({"type": "singleEntity", "singleEntity": {"entityType": "DEVICE", "id": ids[0]}}), 10);
    send(&mut old, json!({"entityDataCmds": [other]}));
    assert_eq!(next(&mut old)["data"]["totalElements"], 0, "another customer's device is not in its pages");
    // Two sessions open; one device followed (cmdId 2's); the older endpoint's queries follow nothing.
    let (_, metrics) = s.req("GET", "/metrics", None, None);
    assert!(
        metrics.contains("\ngridlinks_ws_sessions 2\n") && metrics.contains("\ngridlinks_ws_subscriptions 1\n"),
        "{metrics}"
    );
}

#[test]
fn sessions_are_bounded_and_end_with_their_token() {
    let s = Server::start_env(&[("GRIDLINKS_WS_MAX_SUBSCRIPTIONS", "2"), ("GRIDLINKS_AUTH_TOKEN_TTL", "8")]);
    let admin = s.login();
    let d = s.device(&admin, "bounded", "WSBOUNDED");
    let jwt = s.login();
    let mut ws = ws::open(&s, "/api/ws", Duration::from_secs(60));
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [ts_cmd(1, &d, "a"), ts_cmd(2, &d, "b")]}));
    assert_eq!(next(&mut ws)["errorCode"], 0);
    assert_eq!(next(&mut ws)["errorCode"], 0);
    send(&mut ws, json!({"cmds": [ts_cmd(3, &d, "c")]}));
    let refused = next(&mut ws);
    assert_eq!((refused["subscriptionId"].as_i64(), refused["errorCode"].as_i64()), (Some(3), Some(2)), "{refused}");
    assert!(refused["errorMsg"].as_str().unwrap().contains("ws.max_subscriptions"));
    // The token expires after 8 s: the session ends, saying why.
    let started = std::time::Instant::now();
    let (closed, seen) = closes(&mut ws);
    // Closed, not timed out (reads give up after 60 s).
    assert!(closed && started.elapsed() < Duration::from_secs(59), "{seen:?}");
    assert_eq!(seen.last().unwrap()["errorMsg"], "Token has expired", "{seen:?}");
}

/// Attribute subscriptions: the current attributes of a scope (or all), then every committed
/// change, from REST (shared, server) and from the device itself (client).
#[test]
fn attribute_subscriptions_deliver_committed_changes() {
    let s = Server::start();
    let jwt = s.login();
    let d = s.device(&jwt, "attrs", "WSATTRS");
    let shared = |body: &str| {
        let path = format!("/api/plugins/telemetry/DEVICE/{d}/attributes/SHARED_SCOPE");
        assert_eq!(s.req("POST", &path, Some(&jwt), Some(body)).0, 200);
    };
    shared(r#"{"mode":"eco"}"#);
    let mut ws = open(&s, "/api/ws");
    let attrs = |cmd_id: i64, scope: Option<&str>| json!({"cmdId": cmd_id, "type": "ATTRIBUTES", "entityType": "DEVICE", "entityId": d, "scope": scope});
    send(
        &mut ws,
        json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [attrs(1, Some("SHARED_SCOPE")), attrs(2, None)]}),
    );
    for cmd_id in [1, 2] {
        let first = next(&mut ws);
        assert_eq!(
            (first["subscriptionId"].as_i64(), &first["data"]["mode"][0][1]),
            (Some(cmd_id), &json!("eco")),
            "{first}"
        );
    }
    // The device's own (client) attribute reaches only the subscription of every scope.
    let (st, _) = s.req("POST", "/api/v1/WSATTRS/attributes", None, Some(r#"{"fw":"1.0"}"#));
    assert_eq!(st, 200);
    let u = next(&mut ws);
    assert_eq!((u["subscriptionId"].as_i64(), &u["data"]["fw"][0][1]), (Some(2), &json!("1.0")), "{u}");
    // A shared change reaches both.
    shared(r#"{"mode":"boost"}"#);
    let mut got: Vec<i64> = (0..2)
        .map(|_| {
            let u = next(&mut ws);
            assert_eq!(u["data"]["mode"][0][1], "boost", "{u}");
            u["subscriptionId"].as_i64().unwrap()
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, [1, 2]);
    // The older form.
    let mut old = open(&s, &format!("/api/ws/plugins/telemetry?token={jwt}"));
    send(
        &mut old,
        json!({"attrSubCmds": [{"cmdId": 5, "entityType": "DEVICE", "entityId": d, "scope": "CLIENT_SCOPE"}]}),
    );
    let first = next(&mut old);
    assert_eq!((first["data"]["fw"][0][1].as_str(), first["data"].get("mode")), (Some("1.0"), None), "{first}");
    send(&mut old, json!({"attrSubCmds": [{"cmdId": 6, "entityType": "DEVICE", "entityId": d, "scope": "NO_SCOPE"}]}));
    assert_eq!(next(&mut old)["errorCode"], 2);
}

/// A session that does not authenticate in time is closed; one that stops reading is
/// closed once its queue is full, and nothing waits for it meanwhile.
#[test]
fn silent_and_slow_sessions_are_closed() {
    let s = Server::start_env(&[("GRIDLINKS_WS_AUTH_TIMEOUT", "1"), ("GRIDLINKS_WS_QUEUE", "4")]);
    let jwt = s.login();
    let d = s.device(&jwt, "slow", "WSSLOW");
    let mut silent = open(&s, "/api/ws");
    let (closed, seen) = closes(&mut silent);
    assert!(closed && seen[0]["errorCode"] == 3, "{seen:?}");

    let mut slow = open(&s, "/api/ws");
    send(&mut slow, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [ts_cmd(1, &d, "blob")]}));
    assert_eq!(next(&mut slow)["subscriptionId"], 1);
    // The client stops reading; 400 updates of 60 KB are more than socket buffers hold.
    let blob = "x".repeat(60_000);
    let started = std::time::Instant::now();
    for i in 0..400 {
        let body = json!({"blob": format!("{i}{blob}")}).to_string();
        assert_eq!(s.telemetry("WSSLOW", &body), 200, "the device never waits for the slow session");
    }
    // A hang guard: a post that waited for the session would run into the client's own
    // 30 s request timeout above; 400 posts of 60 KB may take a while on a busy machine.
    assert!(started.elapsed() < Duration::from_secs(120), "{:?}", started.elapsed());
    let (closed, seen) = closes(&mut slow);
    let last = seen.last().unwrap();
    assert!(closed, "the slow session is closed");
    assert_eq!(last["errorCode"], 1, "{}", last["errorMsg"]);
    assert!(last["errorMsg"].as_str().unwrap().contains("ws.queue"), "{last}");
    assert!(seen.len() < 400, "{} updates reached the slow client", seen.len());
}

fn numeric(key_type: &str, key: &str, op: &str, v: J) -> J {
    json!({"key": {"type": key_type, "key": key}, "valueType": "NUMERIC",
        "predicate": {"type": "NUMERIC", "operation": op, "value": {"defaultValue": v, "dynamicValue": null}}})
}

/// Sends one command; its answer.
fn ask(ws: &mut Ws, cmd: J) -> J {
    send(ws, json!({"cmds": [cmd]}));
    next(ws)
}

fn fleet_query(cmd_id: i64, key_filters: J, sort: J) -> J {
    json!({"cmdId": cmd_id, "type": "ENTITY_DATA", "query": {
        "entityFilter": {"type": "deviceType", "deviceTypes": ["fleet"]},
        "pageLink": {"pageSize": 10, "page": 0, "sortOrder": sort},
        "entityFields": [{"type": "ENTITY_FIELD", "key": "name"}],
        "latestValues": [{"type": "TIME_SERIES", "key": "temperature"}],
        "keyFilters": key_filters}})
}

/// Key filters (numeric, string, complex, over time series, attributes and entity fields),
/// sorting by a latest value, and `ENTITY_COUNT` with its recount, as ThingsBoard's
/// widgets send them; a customer user counts its customer's devices only.
#[test]
fn entity_queries_filter_sort_and_count() {
    let s = Server::start_env(&[("GRIDLINKS_WS_COUNT_REFRESH", "1")]);
    let jwt = s.login();
    let mut ids = Vec::new();
    for (i, temperature) in ["10", "25", r#""hot""#, ""].into_iter().enumerate() {
        let (name, token) = (format!("f-{}", i + 1), format!("FLEET{}", i + 1));
        let (st, d) = s.json(
            "POST",
            &format!("/api/device?accessToken={token}"),
            &jwt,
            Some(json!({"name": name, "type": "fleet"})),
        );
        assert_eq!(st, 200, "{d}");
        ids.push(d["id"]["id"].as_str().unwrap().to_owned());
        if !temperature.is_empty() {
            assert_eq!(s.telemetry(&token, &format!(r#"{{"temperature":{temperature}}}"#)), 200);
        }
        let site = if i % 2 == 0 { "North" } else { "South" };
        let path = format!("/api/plugins/telemetry/DEVICE/{}/attributes/SERVER_SCOPE", ids[i]);
        assert_eq!(s.req("POST", &path, Some(&jwt), Some(&format!(r#"{{"site":"{site}"}}"#))).0, 200);
    }
    let by_name = json!({"key": {"type": "ENTITY_FIELD", "key": "name"}, "direction": "ASC"});
    let mut ws = open(&s, "/api/ws");
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": []}));
    let found = |page: &J| names(page).into_iter().map(str::to_owned).collect::<Vec<_>>();

    // A numeric filter: text that is no number and a missing value never match.
    let p = ask(
        &mut ws,
        fleet_query(1, json!([numeric("TIME_SERIES", "temperature", "GREATER", json!(15))]), by_name.clone()),
    );
    assert_eq!((found(&p), p["data"]["totalElements"].as_i64()), (vec!["f-2".to_owned()], Some(1)), "{p}");
    let p = ask(
        &mut ws,
        fleet_query(1, json!([numeric("TIME_SERIES", "temperature", "NOT_EQUAL", json!(10))]), by_name.clone()),
    );
    assert_eq!(found(&p), ["f-2"], "{p}");
    // COMPLEX OR over one key, ANDed with a string filter on an attribute.
    let outside = json!({"key": {"type": "TIME_SERIES", "key": "temperature"}, "valueType": "NUMERIC",
        "predicate": {"type": "COMPLEX", "operation": "OR", "predicates": [
            {"type": "NUMERIC", "operation": "LESS", "value": {"defaultValue": 15}},
            {"type": "NUMERIC", "operation": "GREATER", "value": {"defaultValue": 20}}]}});
    let p = ask(&mut ws, fleet_query(1, json!([outside.clone()]), by_name.clone()));
    assert_eq!(found(&p), ["f-1", "f-2"], "{p}");
    let north = json!({"key": {"type": "SERVER_ATTRIBUTE", "key": "site"}, "valueType": "STRING",
        "predicate": {"type": "STRING", "operation": "EQUAL", "value": {"defaultValue": "north"}, "ignoreCase": true}});
    let p = ask(&mut ws, fleet_query(1, json!([outside, north.clone()]), by_name.clone()));
    assert_eq!(found(&p), ["f-1"], "{p}");
    let not_f1 = json!({"key": {"type": "ENTITY_FIELD", "key": "name"}, "valueType": "STRING",
        "predicate": {"type": "STRING", "operation": "NOT_IN", "value": {"defaultValue": "f-1, f-2"}}});
    let p = ask(&mut ws, fleet_query(1, json!([not_f1, north]), by_name.clone()));
    assert_eq!(found(&p), ["f-3"], "{p}");

    // Sorted by the latest temperature: numbers in order, then text, then no value; DESC
    // is the reverse.
    let by_temp = |dir: &str| json!({"key": {"type": "TIME_SERIES", "key": "temperature"}, "direction": dir});
    assert_eq!(found(&ask(&mut ws, fleet_query(1, json!([]), by_temp("ASC")))), ["f-1", "f-2", "f-3", "f-4"]);
    assert_eq!(found(&ask(&mut ws, fleet_query(1, json!([]), by_temp("DESC")))), ["f-4", "f-3", "f-2", "f-1"]);
    let by_site = json!({"key": {"type": "ATTRIBUTE", "key": "site"}, "direction": "DESC"});
    assert_eq!(found(&ask(&mut ws, fleet_query(1, json!([]), by_site)))[..2], ["f-2", "f-4"]);

    // Refused with the reason, in the entity shape.
    let dynamic = json!({"key": {"type": "TIME_SERIES", "key": "temperature"}, "valueType": "NUMERIC",
        "predicate": {"type": "NUMERIC", "operation": "GREATER",
            "value": {"defaultValue": 1, "dynamicValue": {"sourceType": "CURRENT_USER", "sourceAttribute": "max"}}}});
    let e = ask(&mut ws, fleet_query(2, json!([dynamic]), by_name.clone()));
    assert_eq!((e["errorCode"].as_i64(), e["cmdUpdateType"].as_str()), (Some(2), Some("ENTITY_DATA")), "{e}");
    assert!(e["errorMsg"].as_str().unwrap().contains("dynamic"), "{e}");
    let e = ask(
        &mut ws,
        fleet_query(2, json!([]), json!({"key": {"type": "ENTITY_FIELD", "key": "colour"}, "direction": "ASC"})),
    );
    assert!(e["errorMsg"].as_str().unwrap().contains("colour"), "{e}");

    // ENTITY_COUNT: the count now, then again when it changes (ws.count_refresh = 1 s).
    let count = |cmd_id: i64, filters: J| {
        json!({"cmdId": cmd_id, "type": "ENTITY_COUNT", "query": {
            "entityFilter": {"type": "entityType", "entityType": "DEVICE"}, "keyFilters": filters}})
    };
    let warm = json!([numeric("TIME_SERIES", "temperature", "GREATER", json!(15))]);
    let c = ask(&mut ws, count(5, warm.clone()));
    assert_eq!(c, json!({"cmdId": 5, "count": 1, "errorCode": 0, "errorMsg": null, "cmdUpdateType": "COUNT_DATA"}));
    assert_eq!(s.telemetry("FLEET1", r#"{"temperature":30}"#), 200);
    let c = next(&mut ws);
    assert_eq!((c["cmdId"].as_i64(), c["count"].as_i64()), (Some(5), Some(2)), "{c}");
    let c = ask(&mut ws, count(6, json!([])));
    assert_eq!(c["count"], 4, "{c}");
    let bad = json!([{"key": {"type": "TIME_SERIES", "key": "t"}, "predicate": {"type": "NUMERIC", "operation": "ABOUT", "value": {"defaultValue": 1}}}]);
    let e = ask(&mut ws, count(7, bad));
    assert_eq!(
        (e["cmdId"].as_i64(), e["errorCode"].as_i64(), e["cmdUpdateType"].as_str()),
        (Some(7), Some(2), Some("COUNT_DATA")),
        "{e}"
    );
    // Unsubscribed: a change that would move count 5 sends nothing; the next message is
    // the answer to the command after it, sent once a recount has passed.
    send(
        &mut ws,
        json!({"cmds": [{"cmdId": 5, "type": "ENTITY_COUNT_UNSUBSCRIBE"}, {"cmdId": 6, "type": "ENTITY_COUNT_UNSUBSCRIBE"}]}),
    );
    assert_eq!(s.telemetry("FLEET4", r#"{"temperature":40}"#), 200);
    std::thread::sleep(Duration::from_millis(2500));
    let c = ask(&mut ws, count(8, warm.clone()));
    assert_eq!((c["cmdId"].as_i64(), c["count"].as_i64()), (Some(8), Some(3)), "{c}");

    // A customer user counts its customer's devices only.
    let a = s.customer(&jwt, "A");
    assert_eq!(s.json("POST", &format!("/api/customer/{a}/device/{}", ids[1]), &jwt, None).0, 200);
    let (_, ann) = s.user(&jwt, "ann@a.test", Some(&a), "ann-secret");
    let mut theirs = open(&s, &format!("/api/ws/plugins/telemetry?token={ann}"));
    let mut c = count(1, warm);
    c.as_object_mut().unwrap().remove("type");
    send(&mut theirs, json!({"entityCountCmds": [c]}));
    assert_eq!(next(&mut theirs)["count"], 1);
}

/// Subscriptions are bounded per user and per tenant across sessions, and sessions per
/// user: a customer user cannot hold sessions × subscriptions without end (an issue's
/// probe: 512 sessions × 1,000 subscriptions to one user). A session's end gives its
/// subscriptions back.
#[test]
fn subscriptions_are_bounded_per_user_and_per_tenant_and_sessions_per_user() {
    let s = Server::start_env(&[
        ("GRIDLINKS_WS_MAX_SUBSCRIPTIONS", "3"),
        ("GRIDLINKS_WS_MAX_SUBSCRIPTIONS_PER_USER", "4"),
        ("GRIDLINKS_WS_MAX_SUBSCRIPTIONS_PER_TENANT", "6"),
        ("GRIDLINKS_WS_MAX_SESSIONS_PER_USER", "2"),
    ]);
    let jwt = s.login();
    let d = s.device(&jwt, "counted", "WSCOUNTED");
    let auth = |token: &str, cmds: Vec<J>| json!({"authCmd": {"cmdId": 0, "token": token}, "cmds": cmds});
    let mut a = open(&s, "/api/ws");
    send(&mut a, auth(&jwt, vec![ts_cmd(1, &d, "a"), ts_cmd(2, &d, "b"), ts_cmd(3, &d, "c")]));
    for _ in 0..3 {
        assert_eq!(next(&mut a)["errorCode"], 0);
    }
    // A second session of the same user: one more, then the user's bound.
    let mut b = open(&s, "/api/ws");
    send(&mut b, auth(&jwt, vec![ts_cmd(1, &d, "a"), ts_cmd(2, &d, "b")]));
    assert_eq!(next(&mut b)["errorCode"], 0);
    let refused = next(&mut b);
    assert_eq!(refused["subscriptionId"], 2, "{refused}");
    assert!(refused["errorMsg"].as_str().unwrap().contains("ws.max_subscriptions_per_user"), "{refused}");
    // A third session of the user is refused.
    let mut c = open(&s, "/api/ws");
    send(&mut c, auth(&jwt, vec![ts_cmd(1, &d, "a")]));
    let (closed, seen) = closes(&mut c);
    assert!(closed, "{seen:?}");
    assert!(seen[0]["errorMsg"].as_str().unwrap().contains("ws.max_sessions_per_user"), "{seen:?}");
    // Another user of the tenant: the tenant holds 4 of 6.
    let (_, other) = s.user(&jwt, "watcher@tenant.test", None, "watcher-secret");
    let mut o = open(&s, "/api/ws");
    send(&mut o, auth(&other, vec![ts_cmd(1, &d, "a"), ts_cmd(2, &d, "b"), ts_cmd(3, &d, "c")]));
    assert_eq!(next(&mut o)["errorCode"], 0);
    assert_eq!(next(&mut o)["errorCode"], 0);
    let refused = next(&mut o);
    assert!(refused["errorMsg"].as_str().unwrap().contains("ws.max_subscriptions_per_tenant"), "{refused}");
    // The first session ends: its three come back to the user and the tenant.
    a.close(None).unwrap();
    let _ = closes(&mut a);
    let mut again = None;
    for _ in 0..100 {
        send(&mut o, json!({"cmds": [ts_cmd(3, &d, "c")]}));
        let answer = next(&mut o);
        if answer["errorCode"] == 0 {
            again = Some(answer);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(again.is_some(), "the ended session's subscriptions were not given back");
    let mut c = open(&s, "/api/ws");
    send(&mut c, auth(&jwt, vec![ts_cmd(1, &d, "a")]));
    assert_eq!(next(&mut c)["errorCode"], 0, "the user's second session slot came back");
}

/// A message over `ws.max_message_bytes` closes the session with 1009 and says why (an
/// issue's probe: 70 KB got a bare reset, 639 KB of 5,000 commands no answer at all).
#[test]
fn an_oversized_message_closes_with_1009_and_the_reason() {
    let s = Server::start();
    let jwt = s.login();
    let d = s.device(&jwt, "big", "WSBIG");
    for size in [70_000, 639_000] {
        let mut ws = open(&s, "/api/ws");
        send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [ts_cmd(1, &d, "a")]}));
        assert_eq!(next(&mut ws)["errorCode"], 0);
        let n = size / 120;
        let cmds: Vec<J> = (0..n).map(|i| ts_cmd(i as i64 + 2, &d, &"k".repeat(40))).collect();
        let text = json!({"cmds": cmds}).to_string();
        assert!(text.len() > 65_536);
        ws.send(Message::Text(text.into())).unwrap();
        let close = loop {
            match ws.read() {
                Ok(Message::Close(c)) => break c,
                Ok(Message::Text(t)) => panic!("an answer to an oversized message: {t}"),
                Ok(_) => {}
                Err(e) => panic!("{size} bytes: no close frame, {e}"),
            }
        };
        let close = close.expect("a close frame with a code");
        assert_eq!(u16::from(close.code), 1009, "{close:?}");
        assert!(close.reason.contains("ws.max_message_bytes"), "{close:?}");
    }
}

/// Another tenant's device is answered as an id that exists nowhere: the same error code
/// and message, so that a subscription does not tell a tenant which ids exist elsewhere.
#[test]
fn another_tenants_device_is_answered_as_one_that_does_not_exist() {
    let s = Server::start();
    let sys = s.login_as("sysadmin", SYSADMIN_PASSWORD);
    let alpha = s.login();
    let theirs = s.device(&alpha, "alpha-only", "WSALPHAONLY");
    let (st, beta) = s.json("POST", "/api/tenant", &sys, Some(json!({"title": "Beta"})));
    assert_eq!(st, 200, "{beta}");
    let body = json!({"email": "boss@beta.ws", "authority": "TENANT_ADMIN",
        "tenantId": {"entityType": "TENANT", "id": beta["id"]["id"]}});
    let (_, beta) = s.activated_user(&sys, body, "beta-secret");
    let mut ws = open(&s, "/api/ws");
    let nowhere = "6a4b0f4e-0000-4000-8000-000000000001";
    let cmds = vec![ts_cmd(1, &theirs, "t"), ts_cmd(2, nowhere, "t")];
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": beta}, "cmds": cmds}));
    let (a, b) = (next(&mut ws), next(&mut ws));
    assert_ne!(a["errorCode"], 0, "{a}");
    assert_eq!((&a["errorCode"], &a["errorMsg"]), (&b["errorCode"], &b["errorMsg"]), "{a} / {b}");
}
