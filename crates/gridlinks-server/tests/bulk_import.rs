//! ThingsBoard's CSV bulk import.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

fn mapping(update: bool) -> J {
    json!({
        "columns": [
            {"type":"NAME"}, {"type":"TYPE"}, {"type":"LABEL"}, {"type":"ACCESS_TOKEN"},
            {"type":"SHARED_ATTRIBUTE","key":"interval"}, {"type":"SERVER_ATTRIBUTE","key":"site"},
            {"type":"TIMESERIES","key":"temp"}
        ],
        "delimiter": ",", "update": update, "header": true
    })
}

#[test]
fn import_creates_updates_and_reports_lines() {
    let s = Server::start();
    let jwt = s.login();
    let csv = "name,type,label,token,interval,site,temp\n\
               d1,meter,\"Floor 1, east\",TOK1,30,A,20.5\n\
               ,meter,,TOK2,,,\n\
               d3,meter,,TOK1,,,\n\
               d4,,,,true,\"B,\r\nbuilding 2\",\n\
               ,,,,,,\n";
    let (st, r) = s.json("POST", "/api/device/bulk_import", &jwt, Some(json!({"file": csv, "mapping": mapping(true)})));
    assert_eq!(st, 200, "{r}");
    assert_eq!((r["created"].as_i64(), r["updated"].as_i64(), r["errors"].as_i64()), (Some(2), Some(0), Some(3)));
    let errs: Vec<&str> = r["errorsList"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert!(errs.iter().any(|e| e.starts_with("Line 3:") && e.contains("name")), "{errs:?}");
    assert!(errs.iter().any(|e| e.starts_with("Line 4:") && e.contains("credentials")), "{errs:?}");
    // A quoted cell holds a line break; the record after it is numbered by its own line.
    assert!(errs.iter().any(|e| e.starts_with("Line 7:") && e.contains("name")), "{errs:?}");

    let (_, d1) = s.json("GET", "/api/tenant/devices?deviceName=d1", &jwt, None);
    assert_eq!((d1["type"].as_str(), d1["label"].as_str()), (Some("meter"), Some("Floor 1, east")));
    let id = d1["id"]["id"].as_str().unwrap();
    let (_, attrs) = s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes"), &jwt, None);
    assert!(attrs.as_array().unwrap().iter().any(|a| a["key"] == "interval" && a["value"] == 30));
    assert!(attrs.as_array().unwrap().iter().any(|a| a["key"] == "site" && a["value"] == "A"));
    let (_, ts) = s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=temp"), &jwt, None);
    assert_eq!(ts["temp"][0]["value"], "20.5");
    assert_eq!(s.telemetry("TOK1", r#"{"x":1}"#), 200);
    let (_, d4) = s.json("GET", "/api/tenant/devices?deviceName=d4", &jwt, None);
    let id4 = d4["id"]["id"].as_str().unwrap();
    let (_, site) = s.json(
        "GET",
        &format!("/api/plugins/telemetry/DEVICE/{id4}/values/attributes/SERVER_SCOPE?keys=site"),
        &jwt,
        None,
    );
    assert_eq!(site[0]["value"], "B,\r\nbuilding 2");

    // Re-import updates instead of duplicating.
    let csv2 = "name,type,label,token,interval,site,temp\nd1,meter2,,TOK1B,60,,\n";
    let (_, r) = s.json("POST", "/api/device/bulk_import", &jwt, Some(json!({"file": csv2, "mapping": mapping(true)})));
    assert_eq!((r["created"].as_i64(), r["updated"].as_i64(), r["errors"].as_i64()), (Some(0), Some(1), Some(0)));
    let (_, p) = s.json("GET", "/api/tenant/devices?pageSize=100&page=0", &jwt, None);
    assert_eq!(p["totalElements"], 2);
    assert_eq!(s.telemetry("TOK1", r#"{"x":1}"#), 401, "old token replaced");
    assert_eq!(s.telemetry("TOK1B", r#"{"x":1}"#), 200);
    let (_, attrs) =
        s.json("GET", &format!("/api/plugins/telemetry/DEVICE/{id}/values/attributes/SHARED_SCOPE"), &jwt, None);
    assert_eq!(attrs[0]["value"], 60);

    // Unsupported column types and bad requests are refused as a whole.
    let bad =
        json!({"file":"a\n","mapping":{"columns":[{"type":"X509"}],"delimiter":",","update":true,"header":false}});
    assert_eq!(s.json("POST", "/api/device/bulk_import", &jwt, Some(bad)).0, 400);
    assert_eq!(s.req("POST", "/api/device/bulk_import", Some(&jwt), Some("{}")).0, 400);
}

/// Broken quoting is an error for its line, never a device whose name swallowed the
/// delimiters (or the lines after it); control characters in names are refused wherever a
/// name is accepted.
#[test]
fn malformed_lines_and_control_characters_are_refused_per_line() {
    let s = Server::start();
    let jwt = s.login();
    let mapping = json!({"columns": [{"type": "NAME"}, {"type": "TYPE"}, {"type": "ACCESS_TOKEN"}], "delimiter": ",", "update": false, "header": false});
    let csv = "ok1,t,tokok1\n\
               \"bq1,t,tokbq1\n\
               \"bq2\"x,t,tokbq2\n\
               bq\"3,t,tokbq3\n\
               \"quoted, fine\",t,tokok2\n\
               nul\u{0}name,t,toknul\n\
               ok3,t,tok\u{1b}esc\n\
               ok4,t,tokok4\r\n";
    let (st, r) = s.json("POST", "/api/device/bulk_import", &jwt, Some(json!({"file": csv, "mapping": mapping})));
    assert_eq!(st, 200, "{r}");
    assert_eq!((r["created"].as_i64(), r["errors"].as_i64()), (Some(3), Some(5)), "{r}");
    let errors: Vec<&str> = r["errorsList"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    for (line, what) in [
        (2, "unclosed quote"),
        (3, "after the closing quote"),
        (4, "quote inside"),
        (6, "control characters"),
        (7, "control characters"),
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(&format!("Line {line}:")) && e.contains(what)),
            "line {line}: {errors:?}"
        );
    }
    let (_, list) = s.json("GET", "/api/tenant/devices?pageSize=100&page=0", &jwt, None);
    let mut names: Vec<&str> = list["data"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["ok1", "ok4", "quoted, fine"]);
    // The same rule over REST and the gateway API.
    let (st, b) = s.json("POST", "/api/device", &jwt, Some(json!({"name": "bad\u{0}name"})));
    assert_eq!(st, 400, "{b}");
    assert!(b["message"].as_str().unwrap().contains("control characters"), "{b}");
    assert_eq!(s.json("POST", "/api/device", &jwt, Some(json!({"name": "ok", "label": "two\nlines"}))).0, 400);
    assert_eq!(s.telemetry("tokok1", "{\"bad\\u0007key\":1}"), 400);
    let cred = json!({"username": "app\u{0}", "password": "pw"});
    assert_eq!(s.json("POST", "/api/mqtt/clients", &jwt, Some(cred)).0, 400);
}

/// A row must have exactly one cell per mapped column: a short row (a truncated or shifted
/// line) is refused like a long one, never imported with its last columns missing. Empty
/// cells are fine.
#[test]
fn rows_with_too_few_or_too_many_cells_are_refused_per_line() {
    let s = Server::start();
    let jwt = s.login();
    let mapping = json!({"columns": [{"type": "NAME"}, {"type": "TYPE"}, {"type": "ACCESS_TOKEN"}], "delimiter": ",", "update": false, "header": false});
    let csv = "full,t,TOKFULL\nshort,t\nlong,t,TOKLONG,extra\nblank-cells,,\nname-only\n";
    let (st, r) = s.json("POST", "/api/device/bulk_import", &jwt, Some(json!({"file": csv, "mapping": mapping})));
    assert_eq!(st, 200, "{r}");
    assert_eq!((r["created"].as_i64(), r["errors"].as_i64()), (Some(2), Some(3)), "{r}");
    let errors: Vec<&str> = r["errorsList"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    for (line, what) in [(2, "2 cells but 3 columns"), (3, "4 cells but only 3 columns"), (5, "1 cells but 3 columns")]
    {
        assert!(errors.iter().any(|e| e.starts_with(&format!("Line {line}:")) && e.contains(what)), "{errors:?}");
    }
    for (name, status) in [("full", 200), ("blank-cells", 200), ("short", 404), ("long", 404), ("name-only", 404)] {
        assert_eq!(s.json("GET", &format!("/api/tenant/devices?deviceName={name}"), &jwt, None).0, status, "{name}");
    }
}
