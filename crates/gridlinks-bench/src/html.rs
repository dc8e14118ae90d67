//! The HTML report of a run (`--html FILE`): one self-contained page with summary
//! tables and line charts over time (throughput, latency percentiles, connect curve,
//! server CPU and memory), meant to be looked at rather than read.
//!
//! The page works offline and loads nothing: no JavaScript, no CDN, no web fonts,
//! no images. Charts are inline SVG drawn here; hovering over a chart shows the
//! values of every series at that time (an SVG `<title>` tooltip on a vertical
//! band), and hovering over a line shows its label. A Content-Security-Policy
//! `<meta>` forbids the page from fetching anything at all.
//!
//! Lines that lie on each other stay visible and can be told apart:
//! - Clicking a legend entry hides or shows its line (a CSS-only toggle: each entry is
//!   the `<label>` of a hidden checkbox that precedes the plot in its card).
//! - Series of different groups (the servers of a comparison, [`Series::group`]) are
//!   drawn in different line styles: the first group as a wide solid line under the
//!   others, the next ones thinner and dashed on top of it, each with its own marker
//!   shape (circle, square, diamond, triangle), so two equal lines show as one dashed
//!   line over a wider one. With two groups or more the legend also has a toggle per
//!   group, so one server's lines can be isolated in one click.
//!
//! Latency spans orders of magnitude (one server's p50 at 0.2 ms, another's max at
//! 400 ms), so latency charts use a logarithmic value axis ([`Scale::Log`]): ticks at
//! 1, 2 and 5 × 10^n (only powers of ten over many decades), labelled with the scale,
//! and the faster server's lines keep their shape instead of lying flat on zero.
//!
//! Above the tables a settings section says what the run was asked to do and where it
//! ran ([`Page::settings`]) and what each server's acknowledgement promises
//! ([`Page::durability`]), so figures are read against the load and the guarantees
//! that produced them.
//!
//! Callers describe the page with plain data ([`Page`], [`Table`], [`Chart`],
//! [`Series`]) and call [`render`]. Every piece of text is escaped, so labels and
//! cells may contain anything. Rendering never panics: non-finite points are
//! skipped, a chart with nothing to draw gets a "No data" note instead of a plot,
//! and long series are thinned to a few points per pixel column (keeping each
//! column's minimum and maximum, so spikes stay visible).

use std::fmt::{self, Write as _};

/// One line on a chart: (x, y) points, x = seconds since the run started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Name shown in the legend and the tooltips.
    pub label: String,
    /// The group the line belongs to (the server of a comparison), if any: lines of
    /// one group share a line style and marker shape, and the legend can hide a group.
    pub group: Option<String>,
    /// The points, `(seconds since the run started, value)`. Points with a NaN or
    /// infinite coordinate are skipped; the order does not matter (they are drawn
    /// sorted by x).
    pub points: Vec<(f64, f64)>,
}

/// How a chart's value axis maps values to heights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scale {
    /// Evenly spaced values from 0 (throughput, connections, memory).
    #[default]
    Linear,
    /// Evenly spaced powers of ten (latency): values that differ a hundredfold stay
    /// readable on one chart. Values at or below zero cannot be drawn and are skipped.
    Log,
}

/// A line chart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chart {
    /// Heading above the chart.
    pub title: String,
    /// Label of the y axis, usually the unit (`msgs/s`, `ms`, `RSS MiB`).
    pub y_label: String,
    /// The value axis' scale.
    pub y_scale: Scale,
    /// The lines, drawn on shared axes, one colour each.
    pub series: Vec<Series>,
}

/// A table of text cells; the first column is a row label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// Heading above the table.
    pub title: String,
    /// Column names.
    pub header: Vec<String>,
    /// The rows; cells that read as numbers (`1,234`, `0.812 ms`, `99.2%`, `1.50x`)
    /// are right-aligned in a monospace font.
    pub rows: Vec<Vec<String>>,
}

/// The whole page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// Title of the document and its main heading.
    pub title: String,
    /// One line under the title (command line, machine, date...).
    pub subtitle: String,
    /// What the run was asked to do and where it ran (scenario, load, clients, QoS,
    /// payload, duration, machine, servers and versions): shown first, in a section
    /// with the id `settings`.
    pub settings: Vec<Table>,
    /// What an acknowledgement from each server promises, as (server, note): shown
    /// beside the settings, in a section with the id `durability`.
    pub durability: Vec<(String, String)>,
    /// Summary tables, shown after the settings.
    pub tables: Vec<Table>,
    /// Charts over time, shown after the tables.
    pub charts: Vec<Chart>,
    /// Optional raw JSON result embedded at the bottom inside a collapsed `<details><pre>` block.
    pub raw_json: Option<String>,
}

/// Renders the page as one HTML document.
#[must_use]
pub fn render(page: &Page) -> String {
    let mut out = String::with_capacity(32 * 1024);
    // Writing into a String cannot fail.
    let _ = write_page(&mut out, page);
    out
}

// ---------------------------------------------------------------------------
// Page layout
// ---------------------------------------------------------------------------

const STYLE: &str = "\
:root{color-scheme:light}
*{box-sizing:border-box}
body{margin:0;background:#f5f6f8;color:#1d2330;font:14px/1.45 system-ui,-apple-system,\"Segoe UI\",Roboto,Helvetica,Arial,sans-serif}
main{max-width:1500px;margin:0 auto;padding:20px 24px 32px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:16px;margin:0 0 8px}
.subtitle{margin:0 0 20px;color:#5b6472;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,\"Liberation Mono\",monospace;font-size:12.5px;overflow-wrap:anywhere}
.card{background:#fff;border:1px solid #e0e3e9;border-radius:8px;padding:12px 16px;margin:0 0 16px;min-width:0}
.tables{display:flex;flex-wrap:wrap;gap:0 16px;align-items:flex-start}
.tables .card{max-width:100%}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:13px}
th,td{padding:4px 12px;border-bottom:1px solid #eceef2;text-align:left;white-space:nowrap;vertical-align:top}
thead th{border-bottom:2px solid #cfd4dc;font-weight:600;color:#3b4350}
tbody th{font-weight:500}
tbody tr:nth-child(even){background:#fafbfc}
tbody tr:hover{background:#eef4ff}
.num{text-align:right;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,\"Liberation Mono\",monospace;font-variant-numeric:tabular-nums}
.empty{color:#8a93a0;font-style:italic}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,680px),1fr));gap:16px;margin-bottom:16px}
.charts .card{margin:0}
.legend{list-style:none;margin:0 0 2px;padding:0;display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12.5px;color:#3b4350}
.legend svg{vertical-align:middle;margin-right:6px}
.legend .none{color:#8a93a0}
.legend label{cursor:pointer;user-select:none;border-radius:4px;padding:1px 4px}
.legend label:hover{background:#eef1f6}
.legend.groups{margin-bottom:4px;font-weight:600}
.legend.groups li:first-child{font-weight:400;color:#5b6472}
.tog{position:fixed;top:0;left:0;opacity:0;width:1px;height:1px;margin:0;pointer-events:none}
svg.plot{display:block;width:100%;height:auto;font-family:system-ui,-apple-system,\"Segoe UI\",Roboto,Helvetica,Arial,sans-serif}
svg.plot text{fill:#5b6472}
svg.plot .hover rect{fill:transparent;pointer-events:all}
svg.plot .hover rect:hover{fill:rgba(40,70,120,.08)}
.nodata{margin:8px 0;padding:48px 0;text-align:center;color:#8a93a0;font-style:italic;border:1px dashed #d5d9e0;border-radius:6px}
details summary{cursor:pointer;font-weight:600}
pre{margin:10px 0 0;max-height:480px;overflow:auto;padding:10px;background:#f8f9fb;border:1px solid #eceef2;border-radius:6px;font-size:12px}
footer{color:#8a93a0;font-size:12px}
.durability{max-width:640px}
.durability dl{margin:0;font-size:13px}
.durability dt{font-weight:600;margin-top:6px}
.durability dd{margin:0 0 0 12px;color:#3b4350}
@media print{body{background:#fff}.card{break-inside:avoid}}
";

fn write_page(out: &mut String, page: &Page) -> fmt::Result {
    let title = if page.title.trim().is_empty() { "gridlinks-bench report" } else { page.title.as_str() };
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    // The report is a file that must work offline: forbid every fetch.
    out.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" \
         content=\"default-src 'none'; style-src 'unsafe-inline'\">\n",
    );
    writeln!(out, "<title>{}</title>", escape(title))?;
    writeln!(out, "<style>\n{STYLE}{}</style>\n</head>\n<body>\n<main>", toggle_style(page))?;
    writeln!(out, "<h1>{}</h1>", escape(title))?;
    if !page.subtitle.is_empty() {
        writeln!(out, "<p class=\"subtitle\">{}</p>", escape(&page.subtitle))?;
    }
    if !page.settings.is_empty() || !page.durability.is_empty() {
        out.push_str("<div class=\"tables settings\" id=\"settings\">\n");
        for table in &page.settings {
            write_table(out, table)?;
        }
        if !page.durability.is_empty() {
            out.push_str(
                "<section class=\"card durability\" id=\"durability\">\n\
                 <h2>What an acknowledgement means</h2>\n<dl>\n",
            );
            for (server, note) in &page.durability {
                writeln!(out, "<dt>{}</dt><dd>{}</dd>", escape(server), escape(note))?;
            }
            out.push_str("</dl>\n</section>\n");
        }
        out.push_str("</div>\n");
    }
    if !page.tables.is_empty() {
        out.push_str("<div class=\"tables\">\n");
        for table in &page.tables {
            write_table(out, table)?;
        }
        out.push_str("</div>\n");
    }
    if !page.charts.is_empty() {
        out.push_str("<div class=\"charts\">\n");
        for (n, chart) in page.charts.iter().enumerate() {
            write_chart(out, n, chart)?;
        }
        out.push_str("</div>\n");
    }
    if let Some(json) = &page.raw_json {
        writeln!(
            out,
            "<details class=\"card\">\n<summary>Raw JSON result</summary>\n<pre>{}</pre>\n</details>",
            escape(json)
        )?;
    }
    out.push_str(
        "<footer>Generated by gridlinks-bench. Self-contained: works offline; \
         hover over a chart for the values, click a legend entry to hide or show its \
         line.</footer>\n</main>\n</body>\n</html>\n",
    );
    Ok(())
}

/// Escapes text for HTML element content and (double- or single-quoted) attribute
/// values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------

/// Units a numeric cell may end with. Longer units come before the shorter units
/// they end with (`ms` before `s`).
const UNITS: [&str; 21] = [
    "msgs/s", "/s", "TiB", "GiB", "MiB", "KiB", "GB", "MB", "kB", "KB", "B", "ms", "µs", "us", "ns", "s", "%", "x",
    "×", "k", "M",
];

/// Whether a cell reads as a number: digits with optional sign, decimal point,
/// exponent and thousands separators (`,`), optionally followed by one unit
/// (`0.812 ms`, `99.2%`, `2.0 MiB`, `1.50x`, `1,234,567`).
fn is_numeric(cell: &str) -> bool {
    let mut s = cell.trim();
    if let Some(unit) = UNITS.iter().find(|u| s.ends_with(*u)) {
        s = s[..s.len() - unit.len()].trim_end();
    }
    let s: String = s.chars().filter(|&c| c != ',').collect();
    // f64::from_str also takes "inf" and "NaN"; a number here is made of digits.
    s.bytes().any(|b| b.is_ascii_digit())
        && s.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'+' | b'-' | b'e' | b'E'))
        && s.parse::<f64>().is_ok()
}

/// Whether a cell is aligned like a number: a number or a placeholder for a
/// missing one.
fn aligns_right(cell: &str) -> bool {
    matches!(cell.trim(), "-" | "—" | "n/a") || is_numeric(cell)
}

fn write_table(out: &mut String, table: &Table) -> fmt::Result {
    let width = table.rows.iter().map(Vec::len).chain([table.header.len()]).max().unwrap_or(0);
    // A column's header is right-aligned when its cells are numbers.
    let numeric_column: Vec<bool> =
        (0..width).map(|j| j > 0 && table.rows.iter().any(|r| r.get(j).is_some_and(|c| is_numeric(c)))).collect();
    out.push_str("<section class=\"card\">\n");
    if !table.title.is_empty() {
        writeln!(out, "<h2>{}</h2>", escape(&table.title))?;
    }
    out.push_str("<div class=\"scroll\"><table>\n");
    if !table.header.is_empty() {
        out.push_str("<thead><tr>");
        for (j, name) in table.header.iter().enumerate() {
            let class = if numeric_column.get(j).copied().unwrap_or(false) { " class=\"num\"" } else { "" };
            write!(out, "<th scope=\"col\"{class}>{}</th>", escape(name))?;
        }
        out.push_str("</tr></thead>\n");
    }
    out.push_str("<tbody>\n");
    if table.rows.is_empty() {
        writeln!(out, "<tr><td class=\"empty\" colspan=\"{}\">No rows</td></tr>", width.max(1))?;
    }
    for row in &table.rows {
        out.push_str("<tr>");
        for j in 0..width {
            let cell = row.get(j).map_or("", String::as_str);
            if j == 0 {
                write!(out, "<th scope=\"row\">{}</th>", escape(cell))?;
            } else if aligns_right(cell) {
                write!(out, "<td class=\"num\">{}</td>", escape(cell))?;
            } else {
                write!(out, "<td>{}</td>", escape(cell))?;
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table></div>\n</section>\n");
    Ok(())
}

// ---------------------------------------------------------------------------
// Charts
// ---------------------------------------------------------------------------

/// Size of the SVG viewBox.
const VIEW_W: f64 = 760.0;
const VIEW_H: f64 = 260.0;
/// The plot area inside the viewBox.
const PLOT_LEFT: f64 = 72.0;
const PLOT_RIGHT: f64 = 746.0;
const PLOT_TOP: f64 = 12.0;
const PLOT_BOTTOM: f64 = 222.0;

/// Series colours, distinguishable on white; after eight series they repeat
/// with a dash pattern.
const PALETTE: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#17becf", "#8c564b", "#e377c2"];
const DASHES: [&str; 3] = ["", "7 4", "2 3"];

/// Above this many points a series is thinned per pixel column.
const THIN_ABOVE: usize = 2000;
/// Series with at most this many points get a marker on every point.
const MARKERS_UP_TO: usize = 60;
/// At most this many hover bands (tooltips) per chart.
const MAX_BANDS: usize = 150;

fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

fn dash(i: usize) -> &'static str {
    DASHES[(i / PALETTE.len()) % DASHES.len()]
}

/// The finite points of a series that `scale` can draw (positive ones on a log
/// scale), sorted by x.
fn finite_points(series: &Series, scale: Scale) -> Vec<(f64, f64)> {
    let drawable = |y: f64| y.is_finite() && (scale == Scale::Linear || y > 0.0);
    let mut points: Vec<(f64, f64)> =
        series.points.iter().copied().filter(|&(x, y)| x.is_finite() && drawable(y)).collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

/// Axes of a chart: data ranges, ticks and the mapping to viewBox coordinates.
#[derive(Debug, Clone)]
struct Axes {
    x_lo: f64,
    x_hi: f64,
    x_ticks: Vec<f64>,
    x_step: f64,
    y_ticks: Vec<f64>,
    y_step: f64,
    /// The value axis is logarithmic: ticks are 1/2/5 × 10^n, heights follow log10.
    y_log: bool,
}

impl Axes {
    /// Axes covering all points (positive ones, on a log scale); `None` when there
    /// are none.
    fn new(series: &[Vec<(f64, f64)>], scale: Scale) -> Option<Axes> {
        let all = series.iter().flatten();
        let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut y_min, mut y_max) = (f64::INFINITY, f64::NEG_INFINITY);
        let mut any = false;
        for &(x, y) in all {
            any = true;
            x_min = x_min.min(x);
            x_max = x_max.max(x);
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
        if !any {
            return None;
        }
        let (mut x_lo, mut x_hi) = (x_min, x_max);
        if x_hi > x_lo {
            // Runs are timed from 0: start there unless that leaves the chart mostly empty.
            if x_lo > 0.0 && x_lo <= 0.2 * x_hi {
                x_lo = 0.0;
            }
        } else {
            let pad = (x_lo.abs() * 0.1).max(1.0);
            x_lo -= pad;
            x_hi += pad;
            if x_min >= 0.0 && x_lo < 0.0 {
                x_lo = 0.0;
            }
        }
        let (x_ticks, x_step) = time_ticks(x_lo, x_hi);
        let y_log = scale == Scale::Log;
        let y_ticks = if y_log { log_ticks(y_min, y_max) } else { nice_ticks(y_min, y_max) };
        let y_step = match y_ticks.as_slice() {
            [a, b, ..] => b - a,
            _ => 1.0,
        };
        Some(Axes { x_lo, x_hi, x_ticks, x_step, y_ticks, y_step, y_log })
    }

    fn y_lo(&self) -> f64 {
        self.y_ticks.first().copied().unwrap_or(0.0)
    }

    fn y_hi(&self) -> f64 {
        self.y_ticks.last().copied().unwrap_or(1.0)
    }

    /// x in viewBox coordinates.
    fn px(&self, x: f64) -> f64 {
        PLOT_LEFT + fraction(x, self.x_lo, self.x_hi) * (PLOT_RIGHT - PLOT_LEFT)
    }

    /// y in viewBox coordinates.
    fn py(&self, y: f64) -> f64 {
        let f = if self.y_log {
            // The ticks are positive; so are the points drawn (see `finite_points`).
            fraction(y.max(f64::MIN_POSITIVE).log10(), self.y_lo().log10(), self.y_hi().log10())
        } else {
            fraction(y, self.y_lo(), self.y_hi())
        };
        PLOT_BOTTOM - f * (PLOT_BOTTOM - PLOT_TOP)
    }

    /// The label of value tick `y`.
    fn y_tick_label(&self, y: f64) -> String {
        if self.y_log {
            fmt_value(y)
        } else {
            fmt_tick(y, self.y_step)
        }
    }
}

/// Where `v` lies between `lo` and `hi`, as 0..=1; computed on halves so that
/// spans near `f64::MAX` do not overflow.
fn fraction(v: f64, lo: f64, hi: f64) -> f64 {
    let span = hi * 0.5 - lo * 0.5;
    if span > 0.0 && span.is_finite() {
        let f = (v * 0.5 - lo * 0.5) / span;
        if f.is_finite() {
            f.clamp(0.0, 1.0)
        } else {
            0.5
        }
    } else {
        0.5
    }
}

/// 10^e, exact for the usual exponents (1/10^n rather than 10^-n keeps 0.1 exact).
fn pow10(e: i32) -> f64 {
    if e >= 0 {
        10f64.powi(e)
    } else {
        1.0 / 10f64.powi(-e)
    }
}

/// The smallest 1, 2 or 5 × 10^n that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let e = raw.log10().floor() as i32;
    let base = pow10(e);
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * base).find(|&s| s >= raw * (1.0 - 1e-9)).unwrap_or(10.0 * base)
}

/// Ticks of a value axis: 4 to 6 multiples of a 1/2/5 × 10^n step covering
/// `min..=max` and 0 (0..1 when everything is 0).
fn nice_ticks(min: f64, max: f64) -> Vec<f64> {
    let lo = if min.is_finite() { min.min(0.0) } else { 0.0 };
    let hi = if max.is_finite() { max.max(0.0) } else { 0.0 };
    if hi <= lo {
        return nice_ticks(0.0, 1.0);
    }
    let step = nice_step((hi * 0.5 - lo * 0.5) / 2.5);
    let k0 = (lo / step + 1e-9).floor();
    let k1 = (hi / step - 1e-9).ceil();
    if step > 0.0 && step.is_finite() && k0.is_finite() && k1.is_finite() {
        let n = k1 - k0;
        if (1.0..=20.0).contains(&n) {
            let ticks: Vec<f64> = (0..=n as usize).map(|i| (k0 + i as f64) * step).collect();
            if ticks.iter().all(|t| t.is_finite()) {
                return ticks;
            }
        }
    }
    // Extreme magnitudes: four plain intervals.
    (0..=4)
        .map(|i| {
            let t = f64::from(i) / 4.0;
            lo * (1.0 - t) + hi * t
        })
        .collect()
}

/// Ticks of a logarithmic value axis covering `min..=max` (positive): 1, 2 and 5 ×
/// 10^n over up to three decades, powers of ten beyond (every k-th power past eight
/// decades), from the last tick at or below `min` to the first at or above `max`.
fn log_ticks(min: f64, max: f64) -> Vec<f64> {
    if !(min.is_finite() && max.is_finite() && min > 0.0) {
        return vec![1.0, 10.0];
    }
    let max = max.max(min);
    // Exponents stay where 10^e is a normal, finite f64.
    let lo_e = ((min.log10() + 1e-9).floor() as i32).clamp(-300, 300);
    let hi_e = ((max.log10() - 1e-9).ceil() as i32).clamp(lo_e + 1, 301);
    let decades = hi_e - lo_e;
    let stride = (decades + 7) / 8;
    let hi_e = (lo_e + stride * ((decades + stride - 1) / stride)).min(301 + stride);
    let mantissas: &[f64] = if decades <= 3 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    let mut ticks = Vec::new();
    let mut e = lo_e;
    while e <= hi_e {
        for &m in mantissas {
            let t = m * pow10(e);
            if t.is_finite() && (e < hi_e || m == 1.0) {
                ticks.push(t);
            }
        }
        e += stride;
    }
    // Trim to the ticks that bracket the values.
    let first = ticks.iter().rposition(|&t| t <= min * (1.0 + 1e-9)).unwrap_or(0);
    let end = ticks.len().saturating_sub(1);
    let last = ticks.iter().position(|&t| t >= max * (1.0 - 1e-9)).unwrap_or(end).max(first + 1).min(end);
    let ticks: Vec<f64> = ticks.get(first..=last.max(first)).map(<[f64]>::to_vec).unwrap_or_default();
    if ticks.len() >= 2 {
        ticks
    } else {
        let t = ticks.first().copied().unwrap_or(1.0);
        vec![t, t * 10.0]
    }
}

/// Ticks of the time axis within `lo..=hi` (seconds) and their step: a 1/2/5 step
/// below 10 s, then steps that read well as time (15 s, 30 s, 1 min, 5 min...).
fn time_ticks(lo: f64, hi: f64) -> (Vec<f64>, f64) {
    const STEPS: [f64; 13] = [10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 3600.0, 7200.0];
    let raw = (hi * 0.5 - lo * 0.5) / 2.5;
    let step = if !(raw.is_finite() && raw > 0.0) {
        1.0
    } else if raw <= 10.0 {
        nice_step(raw)
    } else {
        STEPS.iter().copied().find(|&s| s >= raw).unwrap_or_else(|| nice_step(raw / 3600.0) * 3600.0)
    };
    let k0 = (lo / step - 1e-9).ceil();
    let k1 = (hi / step + 1e-9).floor();
    let ticks = if step.is_finite() && k0.is_finite() && k1.is_finite() && k1 >= k0 {
        let n = (k1 - k0).min(50.0) as usize;
        (0..=n).map(|i| (k0 + i as f64) * step).filter(|t| t.is_finite()).collect()
    } else {
        Vec::new()
    };
    (ticks, step)
}

/// Decimal places that show multiples of `step` (a 1/2/5 × 10^n) exactly.
fn step_decimals(step: f64) -> usize {
    if !(step.is_finite() && step > 0.0) {
        return 0;
    }
    let e = (step.log10() + 1e-9).floor();
    (-e).clamp(0.0, 12.0) as usize
}

/// `v` with `decimals` places, trailing zeros dropped; scientific for extreme values.
fn fixed(v: f64, decimals: usize) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v.abs() >= 1e15 {
        return format!("{v:.1e}");
    }
    let mut s = format!("{v:.decimals$}");
    if s.contains('.') {
        let kept = s.trim_end_matches('0').trim_end_matches('.').len();
        s.truncate(kept);
    }
    if s == "-0" {
        s = "0".into();
    }
    s
}

/// The k/M/G/T scale of a magnitude.
fn magnitude(a: f64) -> (f64, &'static str) {
    if a >= 1e12 {
        (1e12, "T")
    } else if a >= 1e9 {
        (1e9, "G")
    } else if a >= 1e6 {
        (1e6, "M")
    } else if a >= 1e3 {
        (1e3, "k")
    } else {
        (1.0, "")
    }
}

/// Compact label of a tick on an axis with the given step: `1.2k`, `35k`, `1.5M`, `0.5`.
fn fmt_tick(v: f64, step: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if v.abs() >= 1e15 || !v.is_finite() {
        return fixed(v, 0);
    }
    let (scale, suffix) = magnitude(v.abs());
    format!("{}{suffix}", fixed(v / scale, step_decimals(step / scale)))
}

/// Compact value with about three significant digits: `1.23k`, `35k`, `0.0123`.
fn fmt_value(v: f64) -> String {
    if v == 0.0 || !v.is_finite() || v.abs() >= 1e15 {
        return fixed(v, 0);
    }
    let (scale, suffix) = magnitude(v.abs());
    let x = v / scale;
    let decimals = if x.abs() >= 100.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else if x.abs() >= 1.0 {
        2
    } else {
        (2.0 - x.abs().log10().floor()).clamp(0.0, 12.0) as usize
    };
    format!("{}{suffix}", fixed(x, decimals))
}

/// A viewBox coordinate, rounded to 0.1.
struct C(f64);

impl fmt::Display for C {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenths = (self.0 * 10.0).round();
        let tenths = if tenths.is_finite() { tenths.clamp(-1e7, 1e7) as i64 } else { 0 };
        let (sign, a) = if tenths < 0 { ("-", -tenths) } else { ("", tenths) };
        if a % 10 == 0 {
            write!(f, "{sign}{}", a / 10)
        } else {
            write!(f, "{sign}{}.{}", a / 10, a % 10)
        }
    }
}

/// Keeps at most the first, lowest, highest and last point of each pixel column
/// when a series has more points than the chart has room for. `px` is sorted by x.
fn thin(px: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if px.len() <= THIN_ABOVE {
        return px;
    }
    let mut kept = Vec::with_capacity(4 * (PLOT_RIGHT - PLOT_LEFT) as usize);
    let mut i = 0;
    while i < px.len() {
        let column = px[i].0.floor();
        let (mut low, mut high, mut j) = (i, i, i);
        while j < px.len() && px[j].0.floor() == column {
            if px[j].1 < px[low].1 {
                low = j;
            }
            if px[j].1 > px[high].1 {
                high = j;
            }
            j += 1;
        }
        let mut picks = [i, low, high, j - 1];
        picks.sort_unstable();
        let mut last = None;
        for k in picks {
            if last != Some(k) {
                kept.push(px[k]);
                last = Some(k);
            }
        }
        i = j;
    }
    kept
}

/// The point of a sorted series nearest to `x`, if within `half` of it.
fn nearest(points: &[(f64, f64)], x: f64, half: f64) -> Option<(f64, f64)> {
    let i = points.partition_point(|p| p.0 < x);
    [i.checked_sub(1), Some(i)]
        .into_iter()
        .flatten()
        .filter_map(|k| points.get(k).copied())
        .filter(|p| (p.0 - x).abs() <= half * (1.0 + 1e-9))
        .min_by(|a, b| (a.0 - x).abs().total_cmp(&(b.0 - x).abs()))
}

fn series_label(series: &Series, i: usize) -> String {
    if series.label.trim().is_empty() {
        format!("series {}", i + 1)
    } else {
        series.label.clone()
    }
}

/// The distinct groups of a chart's series, in order of first appearance.
fn groups(chart: &Chart) -> Vec<&str> {
    let mut groups: Vec<&str> = Vec::new();
    for g in chart.series.iter().filter_map(|s| s.group.as_deref()) {
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups
}

/// Rules that hide a line whose legend checkbox is cleared and grey out its legend
/// entry, for as many series and groups as the page's charts have.
fn toggle_style(page: &Page) -> String {
    let series = page.charts.iter().map(|c| c.series.len()).max().unwrap_or(0);
    let groups = page.charts.iter().map(|c| groups(c).len()).max().unwrap_or(0);
    let toggles = (0..series).map(|i| format!("s{i}")).chain((0..groups).map(|j| format!("g{j}")));
    let (mut hide, mut grey, mut focus) = (Vec::new(), Vec::new(), Vec::new());
    for t in toggles {
        hide.push(format!(".tog.{t}:not(:checked)~svg .series.{t}"));
        grey.push(format!(".tog.{t}:not(:checked)~.legend label.{t}"));
        focus.push(format!(".tog.{t}:focus-visible~.legend label.{t}"));
    }
    if hide.is_empty() {
        return String::new();
    }
    format!(
        "{}{{display:none}}\n{}{{opacity:.4;text-decoration:line-through}}\n\
         {}{{outline:2px solid #9aa2ae}}\n",
        hide.join(","),
        grey.join(","),
        focus.join(",")
    )
}

/// How a marker is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    Circle,
    Square,
    Diamond,
    Triangle,
}

/// How one line is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LineStyle {
    colour: &'static str,
    width: f64,
    dash: &'static str,
    marker: Marker,
    /// Index of its group in [`groups`], if it has one.
    group: Option<usize>,
}

/// Width of the lines of series without a group.
const LINE_WIDTH: f64 = 1.8;

/// Line width, dash pattern and marker of each group, by group index (repeating):
/// the first group wide and solid (drawn first, under the others), the next ones
/// thin and dashed, so a line lying exactly on another leaves it visible.
const GROUP_STYLES: [(f64, &str, Marker); 4] = [
    (3.4, "", Marker::Circle),
    (1.6, "6 4", Marker::Square),
    (1.6, "2 3", Marker::Diamond),
    (1.6, "9 3 2 3", Marker::Triangle),
];

/// The style of each series of `chart`: colour by series; width, dash and marker by
/// group when there are several groups, else the plain look (dashed past the
/// palette).
fn line_styles(chart: &Chart) -> Vec<LineStyle> {
    let groups = groups(chart);
    chart
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let group =
                s.group.as_deref().and_then(|g| groups.iter().position(|&x| x == g)).filter(|_| groups.len() > 1);
            match group {
                Some(j) => {
                    let (width, dash, marker) = GROUP_STYLES[j % GROUP_STYLES.len()];
                    LineStyle { colour: colour(i), width, dash, marker, group: Some(j) }
                }
                None => LineStyle {
                    colour: colour(i),
                    width: LINE_WIDTH,
                    dash: dash(i),
                    marker: Marker::Circle,
                    group: None,
                },
            }
        })
        .collect()
}

/// A marker of radius about `r` at (x, y), filled by the enclosing group's colour.
fn write_marker(out: &mut String, marker: Marker, x: f64, y: f64, r: f64) -> fmt::Result {
    match marker {
        Marker::Circle => write!(out, "<circle cx=\"{}\" cy=\"{}\" r=\"{r}\"/>", C(x), C(y)),
        Marker::Square => write!(
            out,
            "<path class=\"m-square\" d=\"M{} {}h{}v{}h{}z\"/>",
            C(x - r),
            C(y - r),
            C(2.0 * r),
            C(2.0 * r),
            C(-2.0 * r)
        ),
        Marker::Diamond => {
            let d = r * 1.35;
            write!(
                out,
                "<path class=\"m-diamond\" d=\"M{} {}L{} {}L{} {}L{} {}z\"/>",
                C(x),
                C(y - d),
                C(x + d),
                C(y),
                C(x),
                C(y + d),
                C(x - d),
                C(y)
            )
        }
        Marker::Triangle => {
            let d = r * 1.3;
            write!(
                out,
                "<path class=\"m-triangle\" d=\"M{} {}L{} {}L{} {}z\"/>",
                C(x),
                C(y - d),
                C(x + d),
                C(y + 0.8 * d),
                C(x - d),
                C(y + 0.8 * d)
            )
        }
    }
}

/// A legend swatch: a short line in the style, with its marker when grouped.
fn write_swatch(out: &mut String, style: &LineStyle) -> fmt::Result {
    write!(
        out,
        "<svg width=\"26\" height=\"10\" aria-hidden=\"true\"><g fill=\"{}\">\
         <line x1=\"0\" y1=\"5\" x2=\"26\" y2=\"5\" stroke=\"{}\" stroke-width=\"{}\"{}/>",
        style.colour,
        style.colour,
        style.width.min(3.0),
        dash_of(style.dash)
    )?;
    if style.group.is_some() {
        write_marker(out, style.marker, 13.0, 5.0, 3.0)?;
    }
    out.push_str("</g></svg>");
    Ok(())
}

/// The class names of line `i`'s toggles: `s{i}`, and `g{j}` when grouped.
fn toggle_classes(i: usize, style: &LineStyle) -> String {
    match style.group {
        Some(j) => format!("s{i} g{j}"),
        None => format!("s{i}"),
    }
}

/// The hidden checkboxes and the legends that toggle them: a row of groups (when
/// there are several) and one entry per series. Each entry is a `<label>` of a
/// checkbox placed before the legends and the plot, so CSS alone hides the line.
/// The checkboxes are fixed to the viewport's corner (and invisible), so that the
/// focus a click on a label gives them never scrolls the page.
fn write_legend(
    out: &mut String,
    n: usize,
    chart: &Chart,
    labels: &[String],
    points: &[Vec<(f64, f64)>],
    styles: &[LineStyle],
) -> fmt::Result {
    let groups = groups(chart);
    let grouped = groups.len() > 1;
    for (i, label) in labels.iter().enumerate() {
        writeln!(
            out,
            "<input type=\"checkbox\" class=\"tog s{i}\" id=\"c{n}s{i}\" checked aria-label=\"show {label}\">"
        )?;
    }
    if grouped {
        for (j, g) in groups.iter().enumerate() {
            writeln!(
                out,
                "<input type=\"checkbox\" class=\"tog g{j}\" id=\"c{n}g{j}\" checked aria-label=\"show {}\">",
                escape(g)
            )?;
        }
        out.push_str("<ul class=\"legend groups\"><li>Show:</li>");
        for (j, g) in groups.iter().enumerate() {
            let (width, dash, marker) = GROUP_STYLES[j % GROUP_STYLES.len()];
            let style = LineStyle { colour: "#5b6472", width, dash, marker, group: Some(j) };
            write!(
                out,
                "<li><label class=\"g{j}\" for=\"c{n}g{j}\" data-group=\"{g}\" \
                 title=\"Click to hide or show every line of {g}\">",
                g = escape(g)
            )?;
            write_swatch(out, &style)?;
            write!(out, "{}</label></li>", escape(g))?;
        }
        out.push_str("</ul>\n");
    }
    out.push_str("<ul class=\"legend\">");
    for (i, label) in labels.iter().enumerate() {
        let none = points.get(i).is_none_or(Vec::is_empty);
        let Some(style) = styles.get(i) else {
            continue;
        };
        write!(
            out,
            "<li{}><label class=\"{}\" for=\"c{n}s{i}\" title=\"Click to hide or show this line\">",
            if none { " class=\"none\"" } else { "" },
            toggle_classes(i, style),
        )?;
        write_swatch(out, style)?;
        write!(out, "{}{}</label></li>", label, if none { " (no data)" } else { "" })?;
    }
    out.push_str("</ul>\n");
    Ok(())
}

fn write_chart(out: &mut String, n: usize, chart: &Chart) -> fmt::Result {
    out.push_str("<section class=\"card chart\">\n");
    if !chart.title.is_empty() {
        writeln!(out, "<h2>{}</h2>", escape(&chart.title))?;
    }
    let points: Vec<Vec<(f64, f64)>> = chart.series.iter().map(|s| finite_points(s, chart.y_scale)).collect();
    let labels: Vec<String> = chart.series.iter().enumerate().map(|(i, s)| escape(&series_label(s, i))).collect();
    let Some(axes) = Axes::new(&points, chart.y_scale) else {
        out.push_str("<p class=\"nodata\">No data</p>\n</section>\n");
        return Ok(());
    };
    let styles = line_styles(chart);
    write_legend(out, n, chart, &labels, &points, &styles)?;

    writeln!(
        out,
        "<svg class=\"plot\" viewBox=\"0 0 {VIEW_W} {VIEW_H}\" font-size=\"12\" role=\"img\" aria-label=\"{}\" \
         data-y-scale=\"{}\">",
        escape(&chart.title),
        if axes.y_log { "log" } else { "linear" }
    )?;

    // Grid and tick labels.
    out.push_str("<g stroke=\"#e8eaef\" stroke-width=\"1\">");
    for &y in &axes.y_ticks {
        let py = axes.py(y);
        write!(out, "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", C(PLOT_LEFT), C(py), C(PLOT_RIGHT), C(py))?;
    }
    for &x in &axes.x_ticks {
        let px = axes.px(x);
        write!(out, "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", C(px), C(PLOT_TOP), C(px), C(PLOT_BOTTOM))?;
    }
    out.push_str("</g>\n<g text-anchor=\"end\">");
    for &y in &axes.y_ticks {
        write!(
            out,
            "<text x=\"{}\" y=\"{}\">{}</text>",
            C(PLOT_LEFT - 7.0),
            C(axes.py(y) + 4.0),
            escape(&axes.y_tick_label(y))
        )?;
    }
    out.push_str("</g>\n<g text-anchor=\"middle\">");
    for &x in &axes.x_ticks {
        write!(
            out,
            "<text x=\"{}\" y=\"{}\">{}</text>",
            C(axes.px(x)),
            C(PLOT_BOTTOM + 17.0),
            escape(&fixed(x, step_decimals(axes.x_step)))
        )?;
    }
    writeln!(out, "<text x=\"{}\" y=\"{}\">time (s)</text>", C((PLOT_LEFT + PLOT_RIGHT) / 2.0), C(VIEW_H - 4.0))?;
    writeln!(
        out,
        "<text transform=\"rotate(-90)\" x=\"{}\" y=\"16\">{}{}</text></g>",
        C(-(PLOT_TOP + PLOT_BOTTOM) / 2.0),
        escape(&chart.y_label),
        if axes.y_log { " (log scale)" } else { "" }
    )?;
    writeln!(
        out,
        "<path d=\"M{} {}V{}H{}\" fill=\"none\" stroke=\"#9aa2ae\" stroke-width=\"1\"/>",
        C(PLOT_LEFT),
        C(PLOT_TOP),
        C(PLOT_BOTTOM),
        C(PLOT_RIGHT)
    )?;

    write_hover_bands(out, &axes, &points, &labels)?;

    // The lines, on top of the hover bands so that their own tooltips show; the
    // first group's wide lines first, the other groups' thin dashed ones over them.
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&i| styles.get(i).and_then(|s| s.group).unwrap_or(0));
    for i in order {
        let (Some(series), Some(style)) = (points.get(i), styles.get(i)) else {
            continue;
        };
        if series.is_empty() {
            continue;
        }
        let label = labels.get(i).map_or("", String::as_str);
        let px: Vec<(f64, f64)> = series.iter().map(|&(x, y)| (axes.px(x), axes.py(y))).collect();
        write!(out, "<g class=\"series {}\" fill=\"{}\"", toggle_classes(i, style), style.colour)?;
        if let Some(group) = chart.series.get(i).and_then(|s| s.group.as_deref()) {
            write!(out, " data-group=\"{}\"", escape(group))?;
        }
        out.push('>');
        if series.len() > 1 {
            write!(
                out,
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" \
                 stroke-linejoin=\"round\" stroke-linecap=\"round\"{} points=\"",
                style.colour,
                style.width,
                dash_of(style.dash)
            )?;
            let mut previous = None;
            let mut first = true;
            for (x, y) in thin(px.clone()) {
                let rounded = ((x * 10.0).round(), (y * 10.0).round());
                if previous == Some(rounded) {
                    continue;
                }
                previous = Some(rounded);
                if !first {
                    out.push(' ');
                }
                first = false;
                write!(out, "{},{}", C(x), C(y))?;
            }
            write!(out, "\"><title>{label}</title></polyline>")?;
        }
        if series.len() <= MARKERS_UP_TO {
            let r = match (series.len(), style.group) {
                (1, _) => 3.5,
                (_, Some(0)) => 2.8,
                _ => 2.2,
            };
            for &(x, y) in &px {
                write_marker(out, style.marker, x, y, r)?;
            }
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n</section>\n");
    Ok(())
}

fn dash_of(dash: &str) -> String {
    match dash {
        "" => String::new(),
        d => format!(" stroke-dasharray=\"{d}\""),
    }
}

/// Transparent vertical bands over the plot whose tooltips list every series'
/// value at that time.
fn write_hover_bands(out: &mut String, axes: &Axes, points: &[Vec<(f64, f64)>], labels: &[String]) -> fmt::Result {
    let longest = points.iter().map(Vec::len).max().unwrap_or(0);
    let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(x, _) in points.iter().flatten() {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
    }
    let bands = longest.clamp(1, MAX_BANDS);
    // Bands centred on evenly spaced times from the first point to the last, so that
    // regularly sampled series have one point at each band's centre.
    let (step, half) = if bands > 1 && x_max > x_min {
        let step = x_max / (bands - 1) as f64 - x_min / (bands - 1) as f64;
        (step, step / 2.0)
    } else {
        (0.0, f64::INFINITY)
    };
    let bands = if half.is_finite() { bands } else { 1 };
    out.push_str("<g class=\"hover\" fill=\"transparent\">");
    for b in 0..bands {
        let centre = x_min + step * b as f64;
        // The tooltip is headed by the time of the first value shown; a series
        // sampled at another time says when.
        let mut time = None;
        let mut tip = String::new();
        for (i, series) in points.iter().enumerate() {
            if let Some((x, y)) = nearest(series, centre, half) {
                let label = labels.get(i).map_or("", String::as_str);
                write!(tip, "\n{label}: {}", escape(&fmt_value(y)))?;
                let t = *time.get_or_insert(x);
                if (x - t).abs() > 1e-9 * t.abs().max(1.0) {
                    write!(tip, " (t = {} s)", escape(&fixed(x, 2)))?;
                }
            }
        }
        let Some(time) = time else {
            continue;
        };
        let (left, right) = if half.is_finite() {
            (axes.px(centre - half).max(PLOT_LEFT), axes.px(centre + half).min(PLOT_RIGHT))
        } else {
            (PLOT_LEFT, PLOT_RIGHT)
        };
        write!(
            out,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"><title>t = {} s{tip}</title></rect>",
            C(left),
            C(PLOT_TOP),
            C((right - left).max(0.5)),
            C(PLOT_BOTTOM - PLOT_TOP),
            escape(&fixed(time, 2)),
        )?;
    }
    out.push_str("</g>\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(label: &str, points: Vec<(f64, f64)>) -> Series {
        Series { label: label.into(), points, group: None }
    }

    fn chart(series: Vec<Series>) -> Chart {
        Chart { title: "Throughput".into(), y_label: "msgs/s".into(), series, ..Default::default() }
    }

    fn ramp(n: usize, f: impl Fn(f64) -> f64) -> Vec<(f64, f64)> {
        (0..n).map(|i| (i as f64, f(i as f64))).collect()
    }

    fn page_with(charts: Vec<Chart>) -> Page {
        Page { title: "t".into(), charts, ..Default::default() }
    }

    fn count(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    /// The `points` attribute of every polyline.
    fn polylines(html: &str) -> Vec<Vec<(f64, f64)>> {
        html.split("<polyline")
            .skip(1)
            .map(|rest| {
                let start = rest.find("points=\"").map_or(0, |i| i + 8);
                let end = rest[start..].find('"').map_or(rest.len(), |i| start + i);
                rest[start..end]
                    .split(' ')
                    .map(|xy| {
                        let (x, y) = xy.split_once(',').expect("x,y");
                        (x.parse().expect("x"), y.parse().expect("y"))
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn escapes_the_five_special_characters() {
        assert_eq!(escape(r#"a & b < c > d "e" 'f'"#), "a &amp; b &lt; c &gt; d &quot;e&quot; &#39;f&#39;");
        assert_eq!(escape("plain µs ✓"), "plain µs ✓");
    }

    #[test]
    fn escapes_text_everywhere() {
        let evil = "<script>alert('x')</script>";
        let page = Page {
            title: evil.into(),
            subtitle: evil.into(),
            settings: vec![Table { title: evil.into(), header: vec![], rows: vec![vec![evil.into(), evil.into()]] }],
            durability: vec![(evil.into(), evil.into())],
            tables: vec![Table {
                title: evil.into(),
                header: vec![evil.into(), evil.into()],
                rows: vec![vec![evil.into(), evil.into()]],
            }],
            charts: vec![
                Chart {
                    title: evil.into(),
                    y_label: evil.into(),
                    series: vec![series(evil, ramp(5, |x| x))],
                    ..Default::default()
                },
                Chart { title: evil.into(), ..Default::default() },
            ],
            raw_json: Some(format!("{{\"a\": \"{evil}\"}}")),
        };
        let html = render(&page);
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("alert('x')"));
        assert!(html.contains("<title>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;</title>"));
        assert!(html.contains("<h1>&lt;script&gt;"));
        // Title, h1, subtitle, table title, 2 header cells, 2 cells, 2 chart titles,
        // aria-label, legend, y label, line tooltip, hover tooltips, JSON.
        assert!(count(&html, "&lt;script&gt;") >= 16, "{html}");
    }

    #[test]
    fn two_series_give_two_polylines_and_a_legend_with_both() {
        let html = render(&page_with(vec![chart(vec![
            series("GridLinks", ramp(10, |x| 1000.0 + x)),
            series("Mosquitto", ramp(10, |x| 500.0 + x)),
        ])]));
        assert_eq!(count(&html, "<polyline"), 2);
        let legend = &html[html.find("<ul class=\"legend\">").expect("legend")..];
        let legend = &legend[..legend.find("</ul>").expect("end of legend")];
        assert!(legend.contains("GridLinks") && legend.contains("Mosquitto"));
        assert!(legend.contains(PALETTE[0]) && legend.contains(PALETTE[1]));
        assert!(html.contains(&format!("stroke=\"{}\"", PALETTE[0])));
        assert!(html.contains(&format!("stroke=\"{}\"", PALETTE[1])));
        assert!(html.contains("<title>GridLinks</title></polyline>"));
        assert!(html.contains("msgs/s"));
        assert!(html.contains("time (s)"));
        assert_eq!(count(&html, "<svg class=\"plot\""), 1);
    }

    fn grouped(label: &str, group: &str, points: Vec<(f64, f64)>) -> Series {
        Series { group: Some(group.into()), ..series(label, points) }
    }

    #[test]
    fn equal_lines_of_two_groups_stay_visible_and_can_be_hidden() {
        let html = render(&page_with(vec![chart(vec![
            grouped("gridlinks acked/s", "gridlinks", ramp(10, |_| 200.0)),
            grouped("mosquitto acked/s", "mosquitto", ramp(10, |_| 200.0)),
        ])]));
        // One line each, the first wide and solid, drawn first; the second thin,
        // dashed, with another marker, on top.
        let gl = html.find("<g class=\"series s0 g0\"").expect("first group's line");
        let mq = html.find("<g class=\"series s1 g1\"").expect("second group's line");
        assert!(gl < mq);
        let (gl, mq) = (&html[gl..mq], &html[mq..]);
        assert!(gl.contains("data-group=\"gridlinks\"") && gl.contains("stroke-width=\"3.4\""));
        assert!(!gl[..gl.find("</g>").unwrap()].contains("stroke-dasharray"));
        assert!(gl.contains("<circle"));
        assert!(mq.contains("stroke-width=\"1.6\" stroke-linejoin"));
        assert!(mq.contains("stroke-dasharray=\"6 4\""));
        assert!(mq[..mq.find("</g>").unwrap()].contains("class=\"m-square\""));
        // A checkbox and a legend label per line and per group; CSS does the hiding.
        for id in ["c0s0", "c0s1", "c0g0", "c0g1"] {
            assert_eq!(count(&html, &format!("id=\"{id}\" checked")), 1, "{id}");
            assert_eq!(count(&html, &format!("for=\"{id}\"")), 1, "{id}");
        }
        assert!(html.contains("<ul class=\"legend groups\">"));
        for t in ["s0", "s1", "g0", "g1"] {
            assert!(html.contains(&format!(".tog.{t}:not(:checked)~svg .series.{t}")));
        }
        // Checkboxes come before the legends and the plot (the `~` selectors).
        let card = &html[html.find("<section class=\"card chart\">").unwrap()..];
        let last_box = card.rfind("<input ").unwrap();
        assert!(last_box < card.find("<ul class=\"legend").unwrap());
        assert!(last_box < card.find("<svg class=\"plot\"").unwrap());
    }

    #[test]
    fn ungrouped_series_keep_the_plain_look() {
        let html = render(&page_with(vec![chart(vec![
            grouped("p50", "only", ramp(5, |x| x)),
            series("p99", ramp(5, |x| 2.0 * x)),
        ])]));
        assert!(!html.contains("legend groups"), "one group: nothing to isolate");
        assert!(html.contains("<g class=\"series s0\" fill"));
        assert!(html.contains("<g class=\"series s1\" fill"));
        assert_eq!(count(&html, "stroke-width=\"1.8\" stroke-linejoin"), 2);
        assert!(!html.contains("m-square") && !html.contains("stroke-dasharray"));
        assert!(html.contains("id=\"c0s1\"") && !html.contains("c0g0"));
    }

    #[test]
    fn charts_without_data_get_a_note_instead_of_a_plot() {
        for empty in [
            chart(vec![]),
            chart(vec![series("a", vec![]), series("b", vec![])]),
            chart(vec![series("nan", vec![(f64::NAN, 1.0), (1.0, f64::INFINITY)])]),
        ] {
            let html = render(&page_with(vec![empty]));
            assert!(html.contains("<p class=\"nodata\">No data</p>"), "{html}");
            assert!(!html.contains("<polyline"));
            assert!(!html.contains("<svg class=\"plot\""));
        }
    }

    #[test]
    fn non_finite_points_are_skipped() {
        let points = vec![
            (0.0, 1.0),
            (1.0, f64::NAN),
            (2.0, 3.0),
            (f64::INFINITY, 4.0),
            (3.0, f64::NEG_INFINITY),
            (f64::NAN, f64::NAN),
            (4.0, 2.0),
        ];
        let html = render(&page_with(vec![chart(vec![series("s", points)])]));
        let lines = polylines(&html);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].len(), 3, "{:?}", lines[0]);
        assert!(!html.contains("NaN") && !html.contains("inf"));
    }

    #[test]
    fn points_are_drawn_in_x_order_within_the_plot() {
        let points = vec![(3.0, 30.0), (1.0, 10.0), (2.0, 20.0), (0.0, 0.0)];
        let html = render(&page_with(vec![chart(vec![series("s", points)])]));
        let line = &polylines(&html)[0];
        assert!(line.windows(2).all(|w| w[0].0 < w[1].0), "{line:?}");
        for &(x, y) in line {
            assert!((PLOT_LEFT..=PLOT_RIGHT).contains(&x));
            assert!((PLOT_TOP..=PLOT_BOTTOM).contains(&y));
        }
        // x from 0 at the left edge to 3 at the right, y rising.
        assert_eq!(line[0], (PLOT_LEFT, PLOT_BOTTOM));
        assert_eq!(line[3].0, PLOT_RIGHT);
        assert!(line[3].1 < line[0].1);
    }

    #[test]
    fn a_single_point_is_a_dot() {
        let html = render(&page_with(vec![chart(vec![series("one", vec![(5.0, 42.0)])])]));
        assert!(!html.contains("<polyline"));
        assert_eq!(count(&html, "<circle"), 1);
        assert!(html.contains("r=\"3.5\""));
        assert!(html.contains("one: 42"));
    }

    #[test]
    fn empty_series_beside_others_keeps_its_legend_entry() {
        let html = render(&page_with(vec![chart(vec![series("measured", ramp(3, |x| x)), series("missing", vec![])])]));
        assert_eq!(count(&html, "<polyline"), 1);
        assert!(html.contains("missing (no data)"));
    }

    #[test]
    fn nice_ticks_use_1_2_5_steps_from_zero() {
        assert_eq!(nice_ticks(0.0, 93.0), [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(nice_ticks(12.0, 100.0), [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(nice_ticks(0.0, 35_000.0), [0.0, 10e3, 20e3, 30e3, 40e3]);
        assert_eq!(nice_ticks(-35.0, 80.0), [-50.0, 0.0, 50.0, 100.0]);
        assert_eq!(nice_ticks(-7.0, -3.0), [-8.0, -6.0, -4.0, -2.0, 0.0]);
        let zero = nice_ticks(0.0, 0.0);
        assert_eq!(zero.len(), 6);
        assert_eq!((zero[0], zero[5]), (0.0, 1.0));
        // Every maximum gets 4 to 6 ticks from 0 covering it, on a 1/2/5 step.
        let mut max = 1e-6;
        while max < 1e12 {
            let ticks = nice_ticks(0.0, max);
            assert!((4..=6).contains(&ticks.len()), "{max}: {ticks:?}");
            assert_eq!(ticks[0], 0.0);
            assert!(ticks[ticks.len() - 1] >= max * (1.0 - 1e-9), "{max}: {ticks:?}");
            let step = ticks[1] - ticks[0];
            let mantissa = step / pow10(step.log10().floor() as i32);
            assert!([1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-6), "{max}: {ticks:?}");
            max *= 1.37;
        }
    }

    #[test]
    fn huge_values_give_finite_ticks() {
        for max in [1e300, f64::MAX] {
            let ticks = nice_ticks(-f64::MAX, max);
            assert!(ticks.len() >= 2 && ticks.iter().all(|t| t.is_finite()));
        }
        let html =
            render(&page_with(vec![chart(vec![series("big", vec![(0.0, f64::MAX), (1.0, -f64::MAX), (2.0, 1e300)])])]));
        assert_eq!(polylines(&html)[0].len(), 3);
        assert!(!html.contains("inf") && !html.contains("NaN"));
    }

    #[test]
    fn all_zero_values_get_a_0_to_1_axis() {
        let html = render(&page_with(vec![chart(vec![series("idle", ramp(5, |_| 0.0))])]));
        let line = &polylines(&html)[0];
        assert!(line.iter().all(|&(_, y)| y == PLOT_BOTTOM));
        assert!(html.contains(">0.2</text>") && html.contains(">1</text>"));
    }

    #[test]
    fn tick_labels_are_compact() {
        assert_eq!(fmt_tick(0.0, 0.1), "0");
        assert_eq!(fmt_tick(-0.0, 0.1), "0");
        assert_eq!(fmt_tick(0.5, 0.1), "0.5");
        assert_eq!(fmt_tick(0.3 * 3.0, 0.3), "0.9");
        assert_eq!(fmt_tick(0.05, 0.01), "0.05");
        assert_eq!(fmt_tick(800.0, 200.0), "800");
        assert_eq!(fmt_tick(1200.0, 200.0), "1.2k");
        assert_eq!(fmt_tick(2000.0, 500.0), "2k");
        assert_eq!(fmt_tick(35_000.0, 5_000.0), "35k");
        assert_eq!(fmt_tick(1_500_000.0, 500_000.0), "1.5M");
        assert_eq!(fmt_tick(-20.0, 10.0), "-20");
        assert_eq!(fmt_tick(3e9, 1e9), "3G");
        assert_eq!(fmt_value(1234.0), "1.23k");
        assert_eq!(fmt_value(35_000.0), "35k");
        assert_eq!(fmt_value(0.0123), "0.0123");
        assert_eq!(fmt_value(42.0), "42");
        assert_eq!(fmt_value(-1.5e6), "-1.5M");
    }

    #[test]
    fn time_ticks_read_as_seconds_and_minutes() {
        assert_eq!(time_ticks(0.0, 60.0), (vec![0.0, 15.0, 30.0, 45.0, 60.0], 15.0));
        assert_eq!(time_ticks(0.0, 10.0).0, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let (ticks, step) = time_ticks(0.0, 3600.0);
        assert_eq!(step, 900.0);
        assert_eq!(ticks, [0.0, 900.0, 1800.0, 2700.0, 3600.0]);
        // Ticks stay within the range.
        assert_eq!(time_ticks(3.0, 97.0).0, [20.0, 40.0, 60.0, 80.0]);
    }

    #[test]
    fn coordinates_are_rounded_to_a_tenth() {
        assert_eq!(C(12.34).to_string(), "12.3");
        assert_eq!(C(12.96).to_string(), "13");
        assert_eq!(C(-0.04).to_string(), "0");
        assert_eq!(C(-1.25).to_string(), "-1.3");
        assert_eq!(C(f64::NAN).to_string(), "0");
    }

    #[test]
    fn numeric_cells_are_recognised() {
        for cell in [
            "1,234,567",
            "0.812 ms",
            "99.2%",
            "2.0 MiB",
            "1.50x",
            "12.5 KiB",
            "3.20 s",
            "-4",
            "+1e3",
            " 42 ",
            "20,000 msgs/s",
        ] {
            assert!(is_numeric(cell), "{cell}");
        }
        for cell in ["", "-", "x", "%", "ms", "inf", "NaN", "p99", "v1.2", "abc", "0x1F", "1 2", "gridlinks"] {
            assert!(!is_numeric(cell), "{cell}");
        }
    }

    #[test]
    fn tables_align_numbers_right_and_label_rows() {
        let table = Table {
            title: "Results".into(),
            header: vec!["figure".into(), "gridlinks".into(), "note".into()],
            rows: vec![vec!["msgs/s".into(), "20,000".into(), "steady".into()], vec!["p99".into(), "-".into()]],
        };
        let html = render(&Page { tables: vec![table], ..Default::default() });
        assert!(html.contains("<th scope=\"row\">msgs/s</th><td class=\"num\">20,000</td><td>steady</td>"));
        // Short rows are padded; "-" aligns with the numbers.
        assert!(html.contains("<th scope=\"row\">p99</th><td class=\"num\">-</td><td></td>"));
        assert!(html.contains("<th scope=\"col\" class=\"num\">gridlinks</th><th scope=\"col\">note</th>"));
        assert!(html.contains("<h2>Results</h2>"));
        let empty = render(&Page { tables: vec![Table::default()], ..Default::default() });
        assert!(empty.contains("No rows"));
    }

    #[test]
    fn the_document_is_complete_and_offline() {
        let html = render(&Page {
            title: "gridlinks-bench mqtt-telemetry".into(),
            subtitle: "gridlinks-bench mqtt-telemetry --devices 1000".into(),
            tables: vec![Table {
                title: "Results".into(),
                header: vec!["figure".into(), "value".into()],
                rows: vec![vec!["msgs/s".into(), "1,000".into()]],
            }],
            charts: vec![chart(vec![series("a", ramp(30, |x| x * x))])],
            raw_json: Some("{\"acked\": 1}".into()),
            ..Default::default()
        });
        assert!(html.starts_with("<!DOCTYPE html>\n<html lang=\"en\">"));
        assert!(html.contains("<meta charset=\"utf-8\">"));
        assert!(html.contains("<style>"));
        assert!(html.trim_end().ends_with("</html>"));
        for external in ["http://", "https://", "<script", "src=", "url(", "@import", "<link"] {
            assert!(!html.contains(external), "{external}");
        }
        assert!(html.contains("<details class=\"card\">"));
        assert!(html.contains("<pre>{&quot;acked&quot;: 1}</pre>"));
        assert_eq!(count(&html, "<section"), count(&html, "</section>"));
        assert_eq!(count(&html, "<svg"), count(&html, "</svg>"));
        assert_eq!(count(&html, "<g"), count(&html, "</g>"));
    }

    #[test]
    fn hover_bands_list_every_series_at_a_time() {
        let html = render(&page_with(vec![chart(vec![
            series("p50", ramp(10, |_| 1500.0)),
            series("p99", ramp(10, |_| 2_500_000.0)),
        ])]));
        assert_eq!(count(&html, "<rect"), 10);
        assert!(html.contains("<title>t = 3 s\np50: 1.5k\np99: 2.5M</title></rect>"));
    }

    #[test]
    fn tooltips_give_the_time_of_each_value() {
        // 600 points in 150 bands: each band names the sample it shows.
        let html = render(&page_with(vec![chart(vec![
            series("a", ramp(600, |x| x)),
            series("b", ramp(600, |x| x).iter().map(|&(x, y)| (x + 0.5, y)).collect()),
        ])]));
        assert_eq!(count(&html, "<rect"), MAX_BANDS);
        assert!(html.contains("<title>t = 0 s\na: 0\nb: 0 (t = 0.5 s)</title>"), "{html}");
        assert!(html.contains("<title>t = 599 s\na: 599\nb: 599 (t = 599.5 s)</title>"));
        assert!(!html.contains("t = 4.02 s"));
    }

    #[test]
    fn long_series_stay_compact() {
        // An hour at one point a second, noisy, three lines.
        let noisy = |seed: f64| ramp(3600, move |x| 20_000.0 + 5_000.0 * ((x * seed).sin()));
        let html = render(&page_with(vec![chart(vec![
            series("a", noisy(1.3)),
            series("b", noisy(2.7)),
            series("c", noisy(0.1)),
        ])]));
        assert!(html.len() < 300_000, "{} bytes", html.len());
        assert!(count(&html, "<rect") <= MAX_BANDS);
        // Thinning keeps the extremes of the noisy line.
        let line = &polylines(&html)[0];
        let top = line.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let bottom = line.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
        assert!(line.len() < 3600);
        let axes = Axes::new(&[noisy(1.3)], Scale::Linear).expect("axes");
        assert!((top - axes.py(25_000.0)).abs() < 0.5, "{top}");
        assert!((bottom - axes.py(15_000.0)).abs() < 0.5, "{bottom}");
        // A million points still render in bounded size.
        let html = render(&page_with(vec![chart(vec![series(
            "m",
            (0..1_000_000).map(|i| (i as f64 / 1000.0, (i % 7) as f64)).collect(),
        )])]));
        assert!(html.len() < 200_000, "{} bytes", html.len());
    }

    #[test]
    fn palette_colours_are_distinct_and_repeat_dashed() {
        let mut colours = PALETTE.to_vec();
        colours.sort_unstable();
        colours.dedup();
        assert_eq!(colours.len(), 8);
        assert_eq!(dash(0), "");
        assert_eq!(colour(8), colour(0));
        assert_ne!(dash(8), dash(0));
    }

    #[test]
    fn log_ticks_are_one_two_five_over_few_decades_and_powers_over_many() {
        assert_eq!(log_ticks(0.3, 40.0), [0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
        assert_eq!(log_ticks(1.0, 1.0), [1.0, 2.0]);
        assert_eq!(log_ticks(0.002, 900.0), [0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]);
        // Past eight decades every other power.
        let wide = log_ticks(1e-3, 1e12);
        assert_eq!(wide.first(), Some(&1e-3));
        assert!(wide.len() <= 9 && wide.last().is_some_and(|&t| t >= 1e12), "{wide:?}");
        // Nothing drawable, or extremes: still two ticks, all finite and positive.
        for (lo, hi) in [(0.0, 1.0), (f64::NAN, 1.0), (f64::MIN_POSITIVE, f64::MAX), (5.0, 1.0)] {
            let t = log_ticks(lo, hi);
            assert!(t.len() >= 2 && t.iter().all(|v| v.is_finite() && *v > 0.0), "{lo} {hi}: {t:?}");
        }
    }

    #[test]
    fn a_log_chart_keeps_the_faster_servers_line_off_the_floor() {
        // Server A answers in 0.2-0.4 ms, server B in 150-400 ms.
        let fast = grouped("a p50", "a", ramp(10, |x| 0.2 + 0.02 * x));
        let slow = grouped("b p50", "b", ramp(10, |x| 150.0 + 25.0 * x));
        let log =
            Chart { title: "Latency".into(), y_label: "ms".into(), y_scale: Scale::Log, series: vec![fast, slow] };
        let html = render(&page_with(vec![log.clone()]));
        assert!(html.contains("data-y-scale=\"log\""), "{html}");
        assert!(html.contains("ms (log scale)"));
        for tick in [">0.1<", ">1<", ">10<", ">100<", ">1k<"] {
            assert!(html.contains(tick), "no tick {tick}");
        }
        let lines = polylines(&html);
        let height = |line: &Vec<(f64, f64)>| {
            let ys = line.iter().map(|p| p.1);
            ys.clone().fold(f64::NEG_INFINITY, f64::max) - ys.fold(f64::INFINITY, f64::min)
        };
        // The fast line rises visibly (over 10 of the plot's 210 units) and sits well
        // above the floor; on a linear axis it is flat at the bottom.
        assert!(height(&lines[0]) > 10.0, "{:?}", lines[0]);
        assert!(lines[0].iter().all(|p| p.1 < PLOT_BOTTOM - 10.0), "{:?}", lines[0]);
        let linear = render(&page_with(vec![Chart { y_scale: Scale::Linear, ..log }]));
        assert!(height(&polylines(&linear)[0]) < 1.0);
        assert!(linear.contains("data-y-scale=\"linear\""));
        // Zero and negative values cannot be drawn on a log axis: skipped, not a panic.
        let zeros =
            Chart { y_scale: Scale::Log, series: vec![series("z", vec![(0.0, 0.0), (1.0, -1.0)])], ..chart(vec![]) };
        assert!(render(&page_with(vec![zeros])).contains("No data"));
    }

    #[test]
    fn settings_and_durability_come_before_the_results() {
        let page = Page {
            settings: vec![Table {
                title: "Settings".into(),
                header: vec!["setting".into(), "value".into()],
                rows: vec![vec!["QoS".into(), "1".into()]],
            }],
            durability: vec![("gridlinks".into(), "ack after durable commit".into())],
            tables: vec![Table { title: "Results".into(), ..Default::default() }],
            ..Default::default()
        };
        let html = render(&page);
        let settings = html.find("id=\"settings\"").expect("settings section");
        let durability = html.find("id=\"durability\"").expect("durability section");
        let results = html.find("<h2>Results</h2>").expect("results");
        assert!(settings < durability && durability < results);
        assert!(html.contains("<dt>gridlinks</dt><dd>ack after durable commit</dd>"));
        assert!(!render(&Page::default()).contains("id=\"settings\""), "no empty section");
    }
}
