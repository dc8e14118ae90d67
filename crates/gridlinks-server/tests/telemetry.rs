//! Telemetry and attributes end to end: HTTP device API in, REST API out.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

fn setup() -> (Server, String, String) {
    let s = Server::start();
    let jwt = s.login();
    let id = s.device(&jwt, "meter", "METER_TOKEN");
    (s, jwt, id)
}

#[test]
fn every_payload_form_round_trips_with_thingsboard_types() {
    let (s, jwt, id) = setup();
    assert_eq!(
        s.telemetry("METER_TOKEN", r#"{"ts":1000,"values":{"temp":21.5,"on":true,"n":7,"s":"hi","j":{"a":[1,2]}}}"#),
        200
    );
    assert_eq!(
        s.telemetry("METER_TOKEN", r#"[{"ts":2000,"values":{"temp":22.0}},{"ts":3000,"values":{"temp":"23"}}]"#),
        200
    );
    assert_eq!(s.telemetry("METER_TOKEN", r#"{"plain":1}"#), 200);
    let base = format!("/api/plugins/telemetry/DEVICE/{id}");

    let (st, latest) = s.json("GET", &format!("{base}/values/timeseries?keys=temp,on,n,s,j"), &jwt, None);
    assert_eq!(st, 200);
    // Default (useStrictDataTypes=false): strings, as ThingsBoard answers.
    assert_eq!(latest["temp"], json!([{"ts":3000,"value":"23"}]));
    assert_eq!(latest["on"][0]["value"], "true");
    assert_eq!(latest["j"][0]["value"], r#"{"a":[1,2]}"#);
    let (_, strict) =
        s.json("GET", &format!("{base}/values/timeseries?keys=temp,on,n,j&useStrictDataTypes=true"), &jwt, None);
    assert_eq!(strict["temp"][0]["value"], 23);
    assert_eq!(strict["on"][0]["value"], true);
    assert_eq!(strict["n"][0]["value"], 7);
    assert_eq!(strict["j"][0]["value"], json!({"a":[1,2]}));

    let (_, hist) = s.json(
        "GET",
        &format!("{base}/values/timeseries?keys=temp&startTs=0&endTs=5000&useStrictDataTypes=true"),
        &jwt,
        None,
    );
    assert_eq!(hist["temp"], json!([{"ts":3000,"value":23},{"ts":2000,"value":22.0},{"ts":1000,"value":21.5}]));
    let (_, asc) = s.json(
        "GET",
        &format!("{base}/values/timeseries?keys=temp&startTs=0&endTs=5000&orderBy=ASC&limit=2"),
        &jwt,
        None,
    );
    assert_eq!(asc["temp"], json!([{"ts":1000,"value":"21.5"},{"ts":2000,"value":"22.0"}]));
    // endTs is exclusive.
    let (_, excl) = s.json("GET", &format!("{base}/values/timeseries?keys=temp&startTs=1000&endTs=3000"), &jwt, None);
    assert_eq!(excl["temp"].as_array().unwrap().len(), 2);

    let (_, avg) = s.json(
        "GET",
        &format!(
            "{base}/values/timeseries?keys=temp&startTs=0&endTs=4000&interval=2000&agg=AVG&useStrictDataTypes=true"
        ),
        &jwt,
        None,
    );
    assert_eq!(avg["temp"], json!([{"ts":1000,"value":21.5},{"ts":3000,"value":22.5}]));
    let (_, cnt) = s.json(
        "GET",
        &format!(
            "{base}/values/timeseries?keys=temp&startTs=0&endTs=4000&interval=4000&agg=COUNT&useStrictDataTypes=true"
        ),
        &jwt,
        None,
    );
    assert_eq!(cnt["temp"], json!([{"ts":2000,"value":3}]));

    let (_, keys) = s.json("GET", &format!("{base}/keys/timeseries"), &jwt, None);
    assert_eq!(keys, json!(["j", "n", "on", "plain", "s", "temp"]));

    // Delete a range, then everything of one key.
    assert_eq!(
        s.req(
            "DELETE",
            &format!("{base}/timeseries/delete?keys=temp&startTs=2500&endTs=5000&rewriteLatestIfDeleted=true"),
            Some(&jwt),
            None
        )
        .0,
        200
    );
    let (_, latest) = s.json("GET", &format!("{base}/values/timeseries?keys=temp"), &jwt, None);
    assert_eq!(latest["temp"], json!([{"ts":2000,"value":"22.0"}]));
    assert_eq!(
        s.req("DELETE", &format!("{base}/timeseries/delete?keys=temp&deleteAllDataForKeys=true"), Some(&jwt), None).0,
        200
    );
    let (_, hist) = s.json("GET", &format!("{base}/values/timeseries?keys=temp&startTs=0&endTs=5000"), &jwt, None);
    assert_eq!(hist, json!({}));
}

#[test]
fn duplicates_are_stored_once_and_latest_follows_newest_ts() {
    let (s, jwt, id) = setup();
    for _ in 0..3 {
        assert_eq!(s.telemetry("METER_TOKEN", r#"{"ts":5000,"values":{"v":5}}"#), 200);
    }
    assert_eq!(s.telemetry("METER_TOKEN", r#"{"ts":4000,"values":{"v":4}}"#), 200);
    let base = format!("/api/plugins/telemetry/DEVICE/{id}");
    let (_, hist) = s.json("GET", &format!("{base}/values/timeseries?keys=v&startTs=0&endTs=10000"), &jwt, None);
    assert_eq!(hist["v"], json!([{"ts":5000,"value":"5"},{"ts":4000,"value":"4"}]));
    let (_, latest) = s.json("GET", &format!("{base}/values/timeseries?keys=v"), &jwt, None);
    assert_eq!(latest["v"], json!([{"ts":5000,"value":"5"}]));
}

#[test]
fn attributes_in_three_scopes() {
    let (s, jwt, id) = setup();
    let base = format!("/api/plugins/telemetry/DEVICE/{id}");
    assert_eq!(s.req("POST", "/api/v1/METER_TOKEN/attributes", None, Some(r#"{"fw":"1.2","battery":97}"#)).0, 200);
    assert_eq!(
        s.req("POST", &format!("{base}/attributes/SHARED_SCOPE"), Some(&jwt), Some(r#"{"interval":30,"mode":"eco"}"#))
            .0,
        200
    );
    assert_eq!(s.req("POST", &format!("{base}/attributes/SERVER_SCOPE"), Some(&jwt), Some(r#"{"site":"A"}"#)).0, 200);
    assert_eq!(s.req("POST", &format!("{base}/attributes/CLIENT_SCOPE"), Some(&jwt), Some(r#"{"x":1}"#)).0, 400);

    let (_, client) = s.json("GET", &format!("{base}/values/attributes/CLIENT_SCOPE"), &jwt, None);
    let client = client.as_array().unwrap();
    assert_eq!(client.len(), 2);
    assert!(client
        .iter()
        .any(|a| a["key"] == "battery" && a["value"] == 97 && a["lastUpdateTs"].as_i64().unwrap() > 0));
    // "1.2" is cast to a number, as ThingsBoard's JsonConverter does.
    assert!(client.iter().any(|a| a["key"] == "fw" && a["value"] == 1.2));
    let (_, some) = s.json("GET", &format!("{base}/values/attributes?keys=site,mode"), &jwt, None);
    assert_eq!(some.as_array().unwrap().len(), 2);
    let (_, keys) = s.json("GET", &format!("{base}/keys/attributes/SHARED_SCOPE"), &jwt, None);
    assert_eq!(keys, json!(["interval", "mode"]));

    // The device reads its client and shared attributes.
    let (st, b) =
        s.req("GET", "/api/v1/METER_TOKEN/attributes?clientKeys=battery&sharedKeys=interval,mode", None, None);
    assert_eq!(st, 200);
    let v: J = serde_json::from_str(&b).unwrap();
    assert_eq!(v, json!({"client":{"battery":97},"shared":{"interval":30,"mode":"eco"}}));
    let (_, b) = s.req("GET", "/api/v1/METER_TOKEN/attributes", None, None);
    let all: J = serde_json::from_str(&b).unwrap();
    assert_eq!(all["client"].as_object().unwrap().len(), 2);
    assert!(all.get("server").is_none());

    assert_eq!(s.req("DELETE", &format!("{base}/SHARED_SCOPE?keys=mode"), Some(&jwt), None).0, 200);
    let (_, keys) = s.json("GET", &format!("{base}/keys/attributes/SHARED_SCOPE"), &jwt, None);
    assert_eq!(keys, json!(["interval"]));
}
