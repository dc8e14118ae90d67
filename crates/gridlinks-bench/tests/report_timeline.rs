//! What the timeline and the HTML report show, on short real runs against GridLinks
//! (started by the test or by `compare`) and Mosquitto (started by `compare`):
//! acknowledgement latency (PUBACK, HTTP response, CONNACK) and end-to-end latency
//! in every second that had acknowledgements, not only in the last one, for single
//! runs, comparisons and runs spread over worker processes; and comparison charts
//! where each server's lines stay visible and can be told apart and hidden.
//!
//! The devices publish once a second, far fewer values than a connection buffers
//! before handing them to the shared histograms, which is what hid the latency until
//! the end of the run.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use common::{read_json, run_bench, scratch, server_bin, Server};
use serde_json::Value;

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The timeline of a result.
fn timeline(result: &Value) -> &Vec<Value> {
    result["timeline"].as_array().unwrap_or_else(|| panic!("no timeline: {result}"))
}

/// The results of the first step of a compare JSON, by server name.
fn runs(doc: &Value) -> Vec<(String, Value)> {
    doc["steps"][0]["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let server = r["server"].as_str().unwrap().to_string();
            assert!(r["error"].is_null(), "{server}: {}", r["error"]);
            (server, r["result"].clone())
        })
        .collect()
}

/// Every sample in which `rate` (a per-second field) is positive has a `latency`
/// object counting at least one value, there are at least `min_seconds` such samples,
/// and the samples' counts add up to at least `min_total` (values measured in the
/// last fraction of a second may land after the last sample).
fn assert_latency_every_second(
    what: &str,
    result: &Value,
    rate: &str,
    latency: &str,
    min_seconds: usize,
    min_total: u64,
) {
    let samples = timeline(result);
    let mut seconds = 0;
    let mut total = 0;
    for s in samples {
        if s[rate].as_f64().unwrap_or(0.0) >= 1.0 {
            seconds += 1;
            let count = s[latency]["count"].as_u64().unwrap_or(0);
            assert!(count > 0, "{what}: {latency} missing at t = {} ({rate} {}): {samples:#?}", s["t"], s[rate]);
            assert!(s[latency]["p50_us"].as_u64().unwrap_or(0) > 0, "{what}: {s}");
        }
        total += s[latency]["count"].as_u64().unwrap_or(0);
    }
    assert!(seconds >= min_seconds, "{what}: {seconds} seconds with {rate}: {samples:#?}");
    assert!(total >= min_total, "{what}: the timeline holds {total} {latency} values, expected at least {min_total}");
}

#[test]
fn mqtt_telemetry_records_puback_latency_every_second() {
    let server = Server::start("timeline-mqtt");
    let json = server.dir.join("t.json");
    let out = server.bench(&[
        "mqtt-telemetry",
        "--devices",
        "20",
        "--interval",
        "1s",
        "--duration",
        "4s",
        "--provision",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    let acked = n(&result["acked"]);
    assert!(acked >= 60, "{result}");
    assert_latency_every_second("mqtt-telemetry", &result, "acked_per_second", "ack_latency", 3, acked / 2);
}

#[test]
fn mqtt_telemetry_from_two_workers_merges_their_per_second_latency() {
    let server = Server::start("timeline-workers");
    let json = server.dir.join("w.json");
    let out = server.bench(&[
        "mqtt-telemetry",
        "--workers",
        "2",
        "--devices",
        "20",
        "--interval",
        "1s",
        "--duration",
        "4s",
        "--provision",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    let acked = n(&result["acked"]);
    assert_latency_every_second("mqtt-telemetry --workers 2", &result, "acked_per_second", "ack_latency", 3, acked / 2);
    // Both workers' devices are in the merged samples: 20 connected, ~20 acks/s.
    let samples = timeline(&result);
    assert!(samples.iter().all(|s| n(&s["connected"]) == 20), "{samples:#?}");
    let middle = &samples[samples.len() / 2];
    assert!((15.0..=25.0).contains(&middle["acked_per_second"].as_f64().unwrap()), "{middle}");
    assert!(n(&middle["ack_latency"]["count"]) >= 15, "{middle}");
}

#[test]
fn http_telemetry_records_response_latency_every_second() {
    let server = Server::start("timeline-http");
    let json = server.dir.join("h.json");
    let out = server.bench(&[
        "http-telemetry",
        "--devices",
        "10",
        "--interval",
        "1s",
        "--duration",
        "4s",
        "--provision",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    let acked = n(&result["acked"]);
    assert!(acked >= 30, "{result}");
    assert_latency_every_second("http-telemetry", &result, "acked_per_second", "ack_latency", 3, acked / 2);
}

#[test]
fn pubsub_records_puback_and_end_to_end_latency_every_second_on_both_servers() {
    let dir = scratch("timeline-pubsub");
    let json = dir.join("p.json");
    let out = run_bench(&[
        "compare",
        "--against",
        "mosquitto",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "pubsub",
        "--groups",
        "2",
        "--publishers",
        "3",
        "--subscribers",
        "2",
        "--interval",
        "1s",
        "--duration",
        "4s",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let runs = runs(&read_json(&json));
    assert_eq!(runs.len(), 2);
    for (server, result) in &runs {
        let what = format!("pubsub on {server}");
        let (acked, received) = (n(&result["acked"]), n(&result["received"]));
        assert_latency_every_second(&what, result, "acked_per_second", "ack_latency", 3, acked / 2);
        assert_latency_every_second(&what, result, "received_per_second", "e2e_latency", 3, received / 2);
    }
}

#[test]
fn connect_from_two_workers_records_connack_latency_every_connecting_second() {
    let dir = scratch("timeline-connect");
    let json = dir.join("c.json");
    let out = run_bench(&[
        "compare",
        "--against",
        "mosquitto",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "connect",
        "--connections",
        "90",
        "--rate",
        "30",
        "--hold",
        "1s",
        "--workers",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(0));
    for (server, result) in runs(&read_json(&json)) {
        assert_eq!(n(&result["connected"]), 90, "{server}: {result}");
        let samples = timeline(&result);
        // 90 connections at 30/s: about three seconds of connecting, each with its
        // CONNACKs, and every CONNACK in some second (the hold samples after the last).
        let mut seconds = 0;
        let mut total = 0;
        let mut before = 0;
        for s in samples {
            let connected = n(&s["connected"]);
            if connected > before {
                seconds += 1;
                let count = s["ack_latency"]["count"].as_u64().unwrap_or(0);
                assert!(
                    count > 0,
                    "{server}: no CONNACK latency at t = {} ({} new connections): {samples:#?}",
                    s["t"],
                    connected - before
                );
            }
            before = connected;
            total += s["ack_latency"]["count"].as_u64().unwrap_or(0);
        }
        assert!(seconds >= 2, "{server}: {samples:#?}");
        assert_eq!(total, 90, "{server}: every CONNACK in the timeline");
    }
}

/// One chart's card of an HTML report, found by a piece of its title.
fn chart<'a>(html: &'a str, title: &str) -> &'a str {
    html.split("<section class=\"card chart\">")
        .skip(1)
        .find(|card| card.split("</h2>").next().is_some_and(|heading| heading.contains(title)))
        .map(|card| card.split("</section>").next().unwrap_or(card))
        .unwrap_or_else(|| panic!("no chart {title:?} in the report"))
}

/// The value of `name="..."` in a tag.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    tag[start..].split('"').next()
}

/// A drawn line of a chart: its series group (`<g class="series ...">`).
#[derive(Debug)]
struct Line {
    class: String,
    group: String,
    stroke_width: String,
    dash: String,
    marker: &'static str,
    points: usize,
}

fn lines(card: &str) -> Vec<Line> {
    card.split("<g class=\"series ")
        .skip(1)
        .map(|rest| {
            let g = rest.split("</g>").next().unwrap_or(rest);
            let open = &format!(" class=\"series {}", g.split('>').next().unwrap_or(""));
            let polyline = g.split("<polyline").nth(1).unwrap_or("");
            let marker = if g.contains("<circle") {
                "circle"
            } else if g.contains("m-square") {
                "square"
            } else if g.contains("m-diamond") {
                "diamond"
            } else if g.contains("m-triangle") {
                "triangle"
            } else {
                "none"
            };
            Line {
                class: attr(open, "class").unwrap_or("").to_string(),
                group: attr(open, "data-group").unwrap_or("").to_string(),
                stroke_width: attr(polyline, "stroke-width").unwrap_or("").to_string(),
                dash: attr(polyline, "stroke-dasharray").unwrap_or("").to_string(),
                marker,
                points: attr(polyline, "points").map_or(0, |p| p.split(' ').count()),
            }
        })
        .collect()
}

#[test]
fn compare_report_shows_each_servers_lines_distinguishably_and_latency_all_along() {
    let dir = scratch("report-compare");
    let (html, json) = (dir.join("c.html"), dir.join("c.json"));
    let out = run_bench(&[
        "compare",
        "--against",
        "mosquitto",
        "--gridlinks-bin",
        server_bin().to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "mqtt-telemetry",
        "--devices",
        "20",
        "--interval",
        "1s",
        "--duration",
        "5s",
        // Given after the scenario: still written, with the comparison's result.
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("<script"), "the report stays script-free");

    for title in ["Throughput per second", "Connections", "Acknowledgement latency"] {
        let card = chart(&page, title);
        let lines = lines(card);
        let of = |server: &str| -> Vec<&Line> { lines.iter().filter(|l| l.group == server).collect() };
        let (gl, mq) = (of("gridlinks"), of("mosquitto"));
        assert!(!gl.is_empty() && !mq.is_empty(), "{title}: {lines:#?}");
        assert_eq!(gl.len() + mq.len(), lines.len(), "{title}: {lines:#?}");
        // Equal lines stay visible: the servers differ in width, dash and marker.
        let style = |l: &Line| (l.stroke_width.clone(), l.dash.clone(), l.marker);
        for (a, b) in gl.iter().zip(&mq) {
            assert_ne!(a.stroke_width, b.stroke_width, "{title}: {a:?} {b:?}");
            assert_ne!(a.dash, b.dash, "{title}: {a:?} {b:?}");
            assert_ne!(a.marker, b.marker, "{title}: {a:?} {b:?}");
        }
        assert!(gl.iter().all(|l| style(l) == style(gl[0])), "{title}: one style per server");
        // The first server's wide line is drawn first, under the dashed one.
        let first_mq = lines.iter().position(|l| l.group == "mosquitto");
        let last_gl = lines.iter().rposition(|l| l.group == "gridlinks");
        assert!(last_gl < first_mq, "{title}: {lines:#?}");
        // Every line and every server has a legend toggle: a label for a checkbox
        // whose class hides exactly that line (or that server's lines).
        for line in &lines {
            let series = line
                .class
                .split(' ')
                .find(|c| c.strip_prefix('s').is_some_and(|i| i.parse::<usize>().is_ok()))
                .unwrap_or_else(|| panic!("{title}: {line:?}"));
            let class = format!("tog {series}");
            let input = card
                .split("<input ")
                .skip(1)
                .map(|i| format!(" {}", i.split('>').next().unwrap_or(i)))
                .find(|i| attr(i, "class") == Some(class.as_str()))
                .unwrap_or_else(|| panic!("{title}: no checkbox for {line:?}"));
            let id = attr(&input, "id").unwrap_or("");
            assert!(input.contains("checked"), "{title}: shown at first");
            assert!(card.contains(&format!("for=\"{id}\"")), "{title}: no label for {id}");
        }
        for server in ["gridlinks", "mosquitto"] {
            assert!(
                card.contains(&format!("data-group=\"{server}\" title=\"Click to hide or show")),
                "{title}: no toggle for {server}"
            );
        }
    }
    // The toggles work without script: a rule hides a line whose box is cleared.
    assert!(page.contains(".tog.g0:not(:checked)~svg .series.g0"), "{page}");
    assert!(page.contains(".tog.s1:not(:checked)~svg .series.s1"));

    // The latency chart spans the run: each server's p50 has a point per second
    // of publishing, not one dot at the end.
    let latency = lines(chart(&page, "Acknowledgement latency per second (PUBACK)"));
    for server in ["gridlinks", "mosquitto"] {
        let p50 = latency.iter().find(|l| l.group == server).unwrap_or_else(|| panic!("{server}: {latency:#?}"));
        assert!(p50.points >= 4, "{server}: {p50:?}");
    }
    assert_eq!(runs(&read_json(&json)).len(), 2, "--json after the scenario");
}
