//! The headline figures of each result, and the HTML pages built from them: one run's
//! report (`--html`) and the side-by-side comparison of several servers (`compare`).

use crate::cli::OutputArgs;
use crate::html::{Chart, Page, Scale, Series, Table};
use crate::report::{per_second, thousands, ConnectReport, LatencySummary, PubsubReport, TelemetryReport};
use crate::settings::Settings;
use crate::timeline::{Sample, Timeline};

/// What a figure counts, for formatting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A plain number.
    Count,
    /// Per second.
    PerSecond,
    /// Milliseconds, from microseconds.
    Millis,
    /// MiB, from KiB.
    MiB,
    /// KiB.
    KiB,
    /// Percent.
    Percent,
    /// Seconds.
    Seconds,
}

/// Which way a figure improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// More is better (throughput).
    Higher,
    /// Less is better (latency, memory, CPU).
    Lower,
    /// Neither (a count describing the run).
    Neither,
}

/// One headline figure: name, value in the unit's raw form, unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Row label.
    pub name: String,
    /// Value; `None` when not measured.
    pub value: Option<f64>,
    /// How it is printed.
    pub unit: Unit,
    /// Which way is better.
    pub better: Better,
}

impl Figure {
    fn new(name: impl Into<String>, value: Option<f64>, unit: Unit, better: Better) -> Self {
        Figure { name: name.into(), value, unit, better }
    }

    /// The value for people: `12,345`, `0.812 ms`, `42.1 MiB`, `-` when not measured.
    pub fn formatted(&self) -> String {
        let Some(v) = self.value else {
            return "-".into();
        };
        match self.unit {
            Unit::Count | Unit::PerSecond => thousands(v.max(0.0).round() as u64),
            Unit::Millis => format!("{:.3} ms", v / 1000.0),
            Unit::MiB => format!("{:.1} MiB", v / 1024.0),
            Unit::KiB => format!("{v:.2} KiB"),
            Unit::Percent => format!("{v:.1}%"),
            Unit::Seconds => format!("{v:.2} s"),
        }
    }
}

/// `value / base` as `1.23x`, when both are measured and `base` is not zero.
pub fn ratio(value: Option<f64>, base: Option<f64>) -> String {
    match (value, base) {
        (Some(v), Some(b)) if b != 0.0 => format!("{:.2}x", v / b),
        _ => "-".into(),
    }
}

/// Latency percentiles as figures named `{what} p50` etc.
fn latency(what: &str, l: Option<&LatencySummary>) -> Vec<Figure> {
    let l = l.filter(|l| l.count > 0);
    [
        ("p50", l.map(|l| l.p50_us)),
        ("p95", l.map(|l| l.p95_us)),
        ("p99", l.map(|l| l.p99_us)),
        ("p99.9", l.map(|l| l.p999_us)),
        ("max", l.map(|l| l.max_us)),
    ]
    .into_iter()
    .map(|(p, v)| Figure::new(format!("{what} {p}"), v.map(|v| v as f64), Unit::Millis, Better::Lower))
    .collect()
}

/// A result the tool can put in tables and charts.
pub trait RunResult {
    /// The scenario, e.g. `mqtt-telemetry`.
    fn scenario(&self) -> &'static str;
    /// The first line of the human summary: what ran against what.
    fn headline(&self) -> String;
    /// The headline figures.
    fn figures(&self) -> Vec<Figure>;
    /// The per-second samples.
    fn timeline(&self) -> &Timeline;
    /// What the acknowledgement latency measures: `PUBACK`, `CONNACK`, `HTTP 200`.
    fn ack_name(&self) -> &'static str;
    /// The server driven, `host:port`.
    fn server(&self) -> String;
    /// The human summary.
    fn human(&self) -> String;
    /// The JSON result.
    fn to_json(&self) -> serde_json::Value;
    /// False when a loss or delivery check failed.
    fn passed(&self) -> bool;
}

/// Prints a run's summary, writes its `--json`/`--html` (with the run's `settings`, see
/// [`crate::settings`]), and gives the exit code: 2 when a check failed.
pub fn finish(
    output: &OutputArgs,
    result: &dyn RunResult,
    settings: Settings,
) -> anyhow::Result<std::process::ExitCode> {
    crate::report::emit(output, &result.human(), &result.to_json(), || run_page(result, settings))?;
    Ok(crate::exit_code(result.passed()))
}

impl RunResult for TelemetryReport {
    fn scenario(&self) -> &'static str {
        self.scenario
    }

    fn headline(&self) -> String {
        first_line(&self.human())
    }

    fn figures(&self) -> Vec<Figure> {
        use Better::*;
        let cost = self.server_cost.as_ref();
        let mut f = vec![
            Figure::new("connections", Some(self.connected as f64), Unit::Count, Neither),
            Figure::new(
                "connects/s",
                Some(per_second(self.connected as f64, self.connect_seconds)),
                Unit::PerSecond,
                Higher,
            ),
            Figure::new("msgs acked", Some(self.acked as f64), Unit::Count, Neither),
            Figure::new("msgs failed", Some(self.failed as f64), Unit::Count, Lower),
            Figure::new("msgs/s", Some(self.msgs_per_second()), Unit::PerSecond, Higher),
        ];
        f.extend(latency(self.ack_name(), self.puback.as_ref()));
        f.extend(server_figures(
            cost.map(|c| c.cpu_seconds),
            self.msgs_per_server_cpu_second(),
            "msgs per server CPU-second",
            cost.map(|c| c.rss_peak_kib),
        ));
        f.push(Figure::new(
            "generator CPU (% of one core)",
            Some(100.0 * per_second(self.generator_cpu_seconds, self.window_seconds)),
            Unit::Percent,
            Neither,
        ));
        if let Some(lag) = &self.storage_lag {
            f.push(Figure::new("storage lag p50", Some(lag.lag.p50_us as f64), Unit::Millis, Lower));
            f.push(Figure::new("storage lag p99", Some(lag.lag.p99_us as f64), Unit::Millis, Lower));
        }
        if let Some(loss) = &self.loss_check {
            f.push(Figure::new("acked points missing", Some(loss.missing as f64), Unit::Count, Lower));
        }
        if let Some(fw) = &self.forwarding {
            f.push(Figure::new("forwarded msgs (distinct)", Some(fw.unique_received as f64), Unit::Count, Neither));
            f.push(Figure::new("forwarded msgs missing", fw.missing.map(|m| m as f64), Unit::Count, Lower));
            f.push(Figure::new("forwarded duplicates", Some(fw.duplicates as f64), Unit::Count, Lower));
            f.push(Figure::new("sink msgs/s", Some(fw.received_per_second), Unit::PerSecond, Higher));
            let lag = (fw.missing.is_some() && fw.stamped_ahead == 0).then_some(&fw.lag);
            f.extend(latency("forward lag", lag).into_iter().filter(|x| !x.name.ends_with("p99.9")));
            f.push(Figure::new(
                "outbox entries at window end",
                fw.outbox_entries_window_end.map(|v| v as f64),
                Unit::Count,
                Lower,
            ));
        }
        f
    }

    fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    fn ack_name(&self) -> &'static str {
        self.ack_name()
    }

    fn server(&self) -> String {
        self.server.clone()
    }

    fn human(&self) -> String {
        self.human()
    }

    fn to_json(&self) -> serde_json::Value {
        self.to_json()
    }

    fn passed(&self) -> bool {
        self.passed()
    }
}

impl RunResult for PubsubReport {
    fn scenario(&self) -> &'static str {
        "pubsub"
    }

    fn headline(&self) -> String {
        first_line(&self.human())
    }

    fn figures(&self) -> Vec<Figure> {
        use Better::*;
        let cost = self.server_cost.as_ref();
        let mut f = vec![
            Figure::new("connections", Some(self.connected as f64), Unit::Count, Neither),
            Figure::new(
                "published msgs/s",
                Some(per_second(self.acked as f64, self.publish_seconds)),
                Unit::PerSecond,
                Higher,
            ),
            Figure::new("deliveries expected", Some(self.expected as f64), Unit::Count, Neither),
            Figure::new("deliveries received", Some(self.received as f64), Unit::Count, Neither),
            Figure::new("deliveries missing", Some(self.missing() as f64), Unit::Count, Lower),
            Figure::new("delivered msgs/s", Some(self.delivered_per_second()), Unit::PerSecond, Higher),
        ];
        f.extend(latency("end-to-end", Some(&self.e2e)));
        f.extend(latency("PUBACK", self.puback.as_ref()).into_iter().step_by(2));
        f.extend(server_figures(
            cost.map(|c| c.cpu_seconds),
            self.delivered_per_server_cpu_second(),
            "deliveries per server CPU-second",
            cost.map(|c| c.rss_peak_kib),
        ));
        f.push(Figure::new(
            "generator CPU (% of one core)",
            Some(100.0 * per_second(self.generator_cpu_seconds, self.delivery_seconds)),
            Unit::Percent,
            Neither,
        ));
        f
    }

    fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    fn ack_name(&self) -> &'static str {
        "PUBACK"
    }

    fn server(&self) -> String {
        self.server.clone()
    }

    fn human(&self) -> String {
        self.human()
    }

    fn to_json(&self) -> serde_json::Value {
        self.to_json()
    }

    fn passed(&self) -> bool {
        self.passed()
    }
}

impl RunResult for ConnectReport {
    fn scenario(&self) -> &'static str {
        "connect"
    }

    fn headline(&self) -> String {
        first_line(&self.human())
    }

    fn figures(&self) -> Vec<Figure> {
        use Better::*;
        let memory = self.server_memory.as_ref();
        let mut f = vec![
            Figure::new("connections", Some(self.connected as f64), Unit::Count, Neither),
            Figure::new("success", Some(100.0 * self.success_ratio()), Unit::Percent, Higher),
            Figure::new("connects/s", Some(self.connects_per_second()), Unit::PerSecond, Higher),
            Figure::new(
                "connects per server CPU-second",
                self.connects_per_server_cpu_second(),
                Unit::PerSecond,
                Higher,
            ),
        ];
        f.extend(latency("CONNACK", Some(&self.connack)).into_iter().step_by(2));
        f.push(Figure::new("server memory per connection", self.kib_per_connection(), Unit::KiB, Lower));
        f.push(Figure::new("server RSS while holding", memory.map(|m| m.rss_hold_max_kib as f64), Unit::MiB, Lower));
        f
    }

    fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    fn ack_name(&self) -> &'static str {
        "CONNACK"
    }

    fn server(&self) -> String {
        self.server.clone()
    }

    fn human(&self) -> String {
        self.human()
    }

    fn to_json(&self) -> serde_json::Value {
        self.to_json()
    }

    fn passed(&self) -> bool {
        true
    }
}

/// Server CPU, messages per CPU-second and peak RSS.
fn server_figures(
    cpu_seconds: Option<f64>,
    per_cpu: Option<f64>,
    per_cpu_name: &str,
    rss_peak_kib: Option<u64>,
) -> Vec<Figure> {
    vec![
        Figure::new("server CPU-seconds", cpu_seconds, Unit::Seconds, Better::Lower),
        Figure::new(per_cpu_name, per_cpu, Unit::PerSecond, Better::Higher),
        Figure::new("server RSS peak", rss_peak_kib.map(|k| k as f64), Unit::MiB, Better::Lower),
    ]
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim_matches(|c| c == '=' || c == ' ').to_owned()
}

/// What a report says about a server the tool did not start.
pub const UNKNOWN_DURABILITY: &str = "started outside the tool, so what its acknowledgement promises \
     depends on it and its configuration: GridLinks as shipped acknowledges after a durable \
     (fsync'd) commit; brokers such as Mosquitto and rumqttd as `compare` starts them keep \
     everything in memory";

/// The settings tables of a page: the scenario's `settings` (one column per entry of
/// `columns`, or one "value" column), then the machine and `servers` (name, version).
pub fn settings_tables(columns: &[(String, Settings)], servers: &[(String, String)]) -> Vec<Table> {
    let mut header = vec!["setting".to_string()];
    if columns.len() > 1 {
        header.extend(columns.iter().map(|(title, _)| title.clone()));
    } else {
        header.push("value".into());
    }
    let mut names: Vec<&str> = Vec::new();
    for (name, _) in columns.iter().flat_map(|(_, s)| s) {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    let rows =
        names
            .iter()
            .map(|&name| {
                let mut row = vec![name.to_string()];
                row.extend(columns.iter().map(|(_, s)| {
                    s.iter().find(|(n, _)| n == name).map_or_else(|| "-".to_string(), |(_, v)| v.clone())
                }));
                row
            })
            .collect();
    let mut machine = crate::settings::machine();
    machine.extend(servers.iter().cloned());
    vec![
        Table { title: "Settings".into(), header, rows },
        Table {
            title: "Machine and servers".into(),
            header: vec!["machine and servers".into(), "value".into()],
            rows: machine.into_iter().map(|(n, v)| vec![n, v]).collect(),
        },
    ]
}

/// The report of one run, with the run's `settings`.
pub fn run_page(result: &dyn RunResult, settings: Settings) -> Page {
    let server = result.server();
    Page {
        title: format!("gridlinks-bench {}", result.scenario()),
        subtitle: result.headline(),
        settings: settings_tables(&[(String::new(), settings)], &[("server".into(), server.clone())]),
        durability: vec![(server, UNKNOWN_DURABILITY.into())],
        tables: vec![Table {
            title: "Results".into(),
            header: vec!["figure".into(), "value".into()],
            rows: result.figures().into_iter().map(|f| vec![f.name.clone(), f.formatted()]).collect(),
        }],
        charts: charts(&[("", result.timeline())], result.ack_name()),
        raw_json: None,
    }
}

/// The side-by-side table of several runs of one scenario: a column per server and,
/// for every server after the first, the ratio first / that server.
pub fn comparison_table(title: &str, runs: &[(&str, &dyn RunResult)]) -> Table {
    let mut header = vec!["figure".to_string()];
    header.extend(runs.iter().map(|(name, _)| name.to_string()));
    if let Some((first, _)) = runs.first() {
        header.extend(runs.iter().skip(1).map(|(name, _)| format!("{first} / {name}")));
    }
    let figures: Vec<Vec<Figure>> = runs.iter().map(|(_, r)| r.figures()).collect();
    let rows = figures
        .first()
        .map(|first| {
            first
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let value = |run: &Vec<Figure>| run.get(i).and_then(|g| g.value);
                    let mut row = vec![f.name.clone()];
                    row.extend(figures.iter().map(|run| run.get(i).map_or("-".into(), Figure::formatted)));
                    row.extend(figures.iter().skip(1).map(|run| ratio(value(first), value(run))));
                    row
                })
                .collect()
        })
        .unwrap_or_default();
    Table { title: title.into(), header, rows }
}

/// Charts over time of one or several runs, overlaid: each run's name prefixes its
/// series labels and is their group (one line style per server, a legend toggle per
/// server, see [`crate::html`]). `ack` names what the acknowledgement latency
/// measures (`PUBACK`, `CONNACK`, `HTTP 200`).
pub fn charts(runs: &[(&str, &Timeline)], ack: &str) -> Vec<Chart> {
    let label = |run: &str, what: &str| {
        if run.is_empty() {
            what.to_string()
        } else {
            format!("{run} {what}")
        }
    };
    let series = |what: &str, figure: &dyn Fn(&Sample) -> Option<f64>| -> Vec<Series> {
        runs.iter()
            .map(|(run, t)| Series {
                label: label(run, what),
                points: t.points(figure),
                group: (!run.is_empty()).then(|| run.to_string()),
            })
            .filter(|s| s.points.iter().any(|&(_, v)| v != 0.0))
            .collect()
    };
    let ms = |l: &Option<LatencySummary>, pick: fn(&LatencySummary) -> u64| {
        l.filter(|l| l.count > 0).map(|l| pick(&l) as f64 / 1000.0)
    };
    let mut throughput = series("acked/s", &|s| Some(s.acked_per_second));
    throughput.extend(series("delivered/s", &|s| Some(s.received_per_second)));
    let mut ack_latency = series("p50", &|s| ms(&s.ack_latency, |l| l.p50_us));
    ack_latency.extend(series("p99", &|s| ms(&s.ack_latency, |l| l.p99_us)));
    ack_latency.extend(series("max", &|s| ms(&s.ack_latency, |l| l.max_us)));
    let mut e2e = series("p50", &|s| ms(&s.e2e_latency, |l| l.p50_us));
    e2e.extend(series("p99", &|s| ms(&s.e2e_latency, |l| l.p99_us)));
    e2e.extend(series("max", &|s| ms(&s.e2e_latency, |l| l.max_us)));
    let mut connections = series("connected", &|s| Some(s.connected as f64));
    connections.extend(series("failed", &|s| Some(s.connect_failed as f64)));
    let ack_title = format!("Acknowledgement latency per second ({ack})");
    let all = [
        ("Throughput per second", "msgs/s", throughput),
        (ack_title.as_str(), "ms", ack_latency),
        ("End-to-end latency per second", "ms", e2e),
        ("Connections (connect curve)", "connections", connections),
        ("Server CPU", "% of one core", series("CPU %", &|s| s.server_cpu_percent)),
        ("Server memory", "RSS MiB", series("RSS", &|s| s.server_rss_kib.map(|k| k as f64 / 1024.0))),
    ];
    all.into_iter()
        .filter(|(_, _, series)| !series.is_empty())
        .map(|(title, y_label, series)| Chart {
            title: title.into(),
            y_label: y_label.into(),
            // Latency spans orders of magnitude between servers and percentiles: on a
            // linear axis the faster server's lines lie flat on zero.
            y_scale: if y_label == "ms" { Scale::Log } else { Scale::Linear },
            series,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::ServerCost;

    fn telemetry(acked: u64, cpu: f64) -> TelemetryReport {
        TelemetryReport {
            acked,
            window_seconds: 10.0,
            server_cost: Some(ServerCost { cpu_seconds: cpu, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn figures_format_by_unit() {
        let f = |v, unit| Figure::new("x", Some(v), unit, Better::Neither).formatted();
        assert_eq!(f(1234567.4, Unit::Count), "1,234,567");
        assert_eq!(f(812.0, Unit::Millis), "0.812 ms");
        assert_eq!(f(2048.0, Unit::MiB), "2.0 MiB");
        assert_eq!(f(99.25, Unit::Percent), "99.2%");
        assert_eq!(Figure::new("x", None, Unit::Count, Better::Neither).formatted(), "-");
        assert_eq!(ratio(Some(3.0), Some(2.0)), "1.50x");
        assert_eq!(ratio(Some(3.0), Some(0.0)), "-");
    }

    #[test]
    fn comparison_puts_servers_side_by_side_with_ratios() {
        let (a, b) = (telemetry(200_000, 2.0), telemetry(100_000, 4.0));
        let table = comparison_table("t", &[("gridlinks", &a), ("mosquitto", &b)]);
        assert_eq!(table.header, ["figure", "gridlinks", "mosquitto", "gridlinks / mosquitto"]);
        let row =
            |name: &str| table.rows.iter().find(|r| r[0] == name).unwrap_or_else(|| panic!("no row {name}")).clone();
        assert_eq!(row("msgs/s"), ["msgs/s", "20,000", "10,000", "2.00x"]);
        assert_eq!(row("msgs per server CPU-second"), ["msgs per server CPU-second", "100,000", "25,000", "4.00x"]);
    }

    #[test]
    fn charts_leave_out_what_was_not_measured() {
        let timeline = Timeline {
            samples: (1..=5)
                .map(|t| Sample { t: t as f64, connected: 10, acked_per_second: 1000.0, ..Default::default() })
                .collect(),
        };
        let charts = charts(&[("a", &timeline), ("b", &timeline)], "PUBACK");
        let titles: Vec<&str> = charts.iter().map(|c| c.title.as_str()).collect();
        assert_eq!(titles, ["Throughput per second", "Connections (connect curve)"]);
        assert_eq!(charts[0].series.len(), 2);
        assert_eq!(charts[0].series[1].label, "b acked/s");
        assert_eq!(charts[0].series[1].group.as_deref(), Some("b"));
        assert_eq!(charts[0].series[0].points.len(), 5);
        let single = super::charts(&[("", &timeline)], "PUBACK");
        assert!(single[0].series[0].group.is_none(), "a single run has no groups");
    }

    #[test]
    fn every_second_with_latency_is_a_point_and_the_title_names_the_ack() {
        let timeline = Timeline {
            samples: (1..=5)
                .map(|t| Sample {
                    t: t as f64,
                    ack_latency: Some(LatencySummary {
                        count: 10,
                        p50_us: 1000 * t,
                        p99_us: 2000 * t,
                        max_us: 3000 * t,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
        };
        let charts = charts(&[("a", &timeline)], "CONNACK");
        let latency =
            charts.iter().find(|c| c.title == "Acknowledgement latency per second (CONNACK)").expect("latency chart");
        assert_eq!(latency.series[0].label, "a p50");
        assert_eq!(latency.series[0].points, [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (4.0, 4.0), (5.0, 5.0)]);
    }
}
