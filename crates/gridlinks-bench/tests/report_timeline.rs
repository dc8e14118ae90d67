//! What the timeline and the HTML report show, on short real runs against GridLinks
//! (started by the test or by `compare`) and Mosquitto (started by `compare`):
//! acknowledgement latency (PUBACK, HTTP response, CONNACK) and end-to-end latency
//! in every second that had acknowledgements, not only in the last one, for single
//! runs, comparisons and runs spread over worker processes; and comparison charts
//! where each server's lines stay visible and can be told apart and hidden.
//!
//! The devices publish once a second, far fewer values than a connection buffers
//! before handing them to the shared histograms, which is what hid the latency until
//! the end of the run. They publish a fixed number of messages (`--messages-per-device`)
//! rather than for a fixed time, so the counts checked do not depend on the machine's
//! speed; and "every second" means at least two seconds, not a sample per wall-clock
//! second (a busy machine's sampler may skip one).
//!
//! The HTML report draws latency on a log axis, says what the run was asked to do and
//! where it ran (settings), and what each server's acknowledgement promises (durability).
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
    let (json, html) = (server.dir.join("t.json"), server.dir.join("t.html"));
    let out = server.bench(&[
        "mqtt-telemetry",
        "--devices",
        "20",
        "--interval",
        "1s",
        "--messages-per-device",
        "4",
        "--qos",
        "1",
        "--payload-bytes",
        "150",
        "--provision",
        "--json",
        json.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    let acked = n(&result["acked"]);
    assert_eq!(acked, 80, "{result}");
    assert_latency_every_second("mqtt-telemetry", &result, "acked_per_second", "ack_latency", 2, acked / 2);

    // The single run's report: settings from its options, latency on a log axis, and
    // no claim about a server the tool did not start.
    let page = std::fs::read_to_string(&html).unwrap();
    let settings = section(&page, "settings");
    for (name, value) in [
        ("scenario", "mqtt-telemetry"),
        ("devices (connections)", "20"),
        ("offered load", "1 msg every 1 s per sender = 20 msgs/s in total"),
        ("length", "4 messages per sender"),
        ("QoS", "1"),
        ("payload", "150 bytes"),
    ] {
        assert_eq!(setting(settings, name).as_deref(), Some(value), "{name}: {settings}");
    }
    assert!(setting(settings, "cores (available to the tool)").is_some_and(|c| c.parse::<u32>().is_ok()), "{settings}");
    assert!(section(&page, "durability").contains("started outside the tool"));
    assert_log_latency_axis(&page, "Acknowledgement latency");
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
        "--messages-per-device",
        "4",
        "--provision",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    let acked = n(&result["acked"]);
    assert_eq!(acked, 80, "{result}");
    assert_latency_every_second("mqtt-telemetry --workers 2", &result, "acked_per_second", "ack_latency", 2, acked / 2);
    // Both workers' devices are in the merged samples: 20 connected, and more latency
    // values than either worker's 40 acknowledgements (a count, not a rate: how many
    // land in one second depends on the machine).
    let samples = timeline(&result);
    assert!(samples.iter().all(|s| n(&s["connected"]) == 20), "{samples:#?}");
    let values: u64 = samples.iter().map(|s| s["ack_latency"]["count"].as_u64().unwrap_or(0)).sum();
    assert!(values > acked / 2, "{values} latency values in the timeline: {samples:#?}");
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
        "--messages-per-device",
        "4",
        "--provision",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let result = read_json(&json);
    let acked = n(&result["acked"]);
    assert_eq!(acked, 40, "{result}");
    assert_latency_every_second("http-telemetry", &result, "acked_per_second", "ack_latency", 2, acked / 2);
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
        "--messages-per-publisher",
        "4",
        "--drain-timeout",
        "30s",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let runs = runs(&read_json(&json));
    assert_eq!(runs.len(), 2);
    for (server, result) in &runs {
        let what = format!("pubsub on {server}");
        let (acked, received) = (n(&result["acked"]), n(&result["received"]));
        assert_eq!((acked, received), (2 * 3 * 4, 2 * 2 * 3 * 4), "{what}: {result}");
        assert_latency_every_second(&what, result, "acked_per_second", "ack_latency", 2, acked / 2);
        assert_latency_every_second(&what, result, "received_per_second", "e2e_latency", 2, received / 2);
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
        "--messages-per-device",
        "5",
        "--qos",
        "1",
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
        assert!(p50.points >= 3, "{server}: {p50:?}");
    }
    assert_eq!(runs(&read_json(&json)).len(), 2, "--json after the scenario");

    // Latency on a log axis, so the faster server's lines keep their shape; counts
    // stay linear.
    assert_log_latency_axis(&page, "Acknowledgement latency");
    assert!(chart(&page, "Throughput per second").contains("data-y-scale=\"linear\""));

    // The settings come first: what ran, on what machine, against which versions.
    let settings = section(&page, "settings");
    assert!(page.find("id=\"settings\"") < page.find("<h2>mqtt-telemetry (gridlinks vs mosquitto)</h2>"));
    for (name, value) in [
        ("scenario", "mqtt-telemetry"),
        ("devices (connections)", "20"),
        ("offered load", "1 msg every 1 s per sender = 20 msgs/s in total"),
        ("length", "5 messages per sender"),
        ("QoS", "1"),
        ("in flight per connection", "10"),
        ("payload", "100 bytes"),
    ] {
        assert_eq!(setting(settings, name).as_deref(), Some(value), "{name}: {settings}");
    }
    assert!(setting(settings, "cores (available to the tool)").is_some_and(|c| c.parse::<u32>().is_ok()), "{settings}");
    let versions = read_json(&json)["steps"][0]["runs"].clone();
    for run in versions.as_array().unwrap() {
        let (server, version) = (run["server"].as_str().unwrap(), run["version"].as_str().unwrap());
        assert_eq!(setting(settings, server).as_deref(), Some(version), "{settings}");
    }

    // What an acknowledgement means, per server.
    let durability = section(&page, "durability");
    let note = |server: &str| {
        durability
            .split(&format!("<dt>{server}</dt><dd>"))
            .nth(1)
            .and_then(|rest| rest.split("</dd>").next())
            .unwrap_or_else(|| panic!("no note for {server}: {durability}"))
    };
    assert!(note("gridlinks").contains("durable commit") && note("gridlinks").contains("fsync"), "{durability}");
    assert!(note("mosquitto").contains("in memory") && note("mosquitto").contains("nothing persisted"), "{durability}");
}

/// The section of a report with the id `id` (the settings: up to the durability note
/// beside them; others: up to their `</section>`).
fn section<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in the report"));
    let rest = &html[start..];
    let end = if id == "settings" { rest.find("id=\"durability\"") } else { rest.find("</section>") };
    &rest[..end.unwrap_or(rest.len())]
}

/// The value of a settings row named `name` (`<th scope="row">name</th><td ...>value</td>`).
fn setting(settings: &str, name: &str) -> Option<String> {
    let row = settings.split(&format!("<th scope=\"row\">{name}</th>")).nth(1)?;
    let cell = row.split("</td>").next()?;
    Some(cell.rsplit('>').next()?.to_string())
}

/// The latency chart titled `title...` has a log value axis with labelled powers of ten.
fn assert_log_latency_axis(page: &str, title: &str) {
    let card = chart(page, title);
    assert!(card.contains("data-y-scale=\"log\""), "{card}");
    assert!(card.contains("ms (log scale)"), "{card}");
    let ticks = card.split("<g text-anchor=\"end\">").nth(1).and_then(|g| g.split("</g>").next()).unwrap_or("");
    let labels: Vec<&str> = ticks
        .split("<text")
        .skip(1)
        .filter_map(|t| t.split('>').nth(1))
        .map(|t| t.trim_end_matches("</text"))
        .collect();
    assert!(labels.len() >= 2, "{labels:?}");
    let value = |l: &str| -> f64 {
        let (number, scale) = match l.strip_suffix('k') {
            Some(n) => (n, 1e3),
            None => (l, 1.0),
        };
        number.parse::<f64>().unwrap_or_else(|_| panic!("tick {l:?}")) * scale
    };
    let values: Vec<f64> = labels.iter().map(|l| value(l)).collect();
    // Every tick is 1, 2 or 5 times a power of ten, and they rise.
    assert!(
        values.iter().all(|v| {
            let m = v / 10f64.powf((v.log10() + 1e-9).floor());
            [1.0, 2.0, 5.0].iter().any(|k| (m - k).abs() < 1e-6)
        }),
        "{labels:?}"
    );
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{labels:?}");
}
