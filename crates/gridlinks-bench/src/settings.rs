//! What a run was asked to do and where it ran, for the settings section of the HTML
//! report: the scenario's load (from its command-line options, so a figure can be read
//! against the load that produced it), the machine (cores, CPU, memory, kernel), and
//! what each server promises when it acknowledges ([`crate::servers::ServerKind::durability`]).
//!
//! Settings are `(name, value)` rows; the scenarios' rows come from their options, the
//! machine's from `/proc`, so every report of the same command on the same machine
//! shows the same rows.

use std::time::Duration;

use crate::cli::{ConnectArgs, HttpTelemetryArgs, PubsubArgs, TargetArgs, TelemetryArgs};

/// `(name, value)` rows, in the order shown.
pub type Settings = Vec<(String, String)>;

fn row(name: &str, value: impl Into<String>) -> (String, String) {
    (name.to_string(), value.into())
}

/// `1.5 s`, `800 ms`, `2 min`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0 s".into()
    } else if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{} min", ms / 60_000)
    } else {
        format!("{} s", crate::report::round3(d.as_secs_f64()))
    }
}

/// The offered load: as fast as acknowledgements allow, a total rate, or one message
/// per device every interval (with the total it makes).
fn load(rate: f64, interval: Option<Duration>, senders: usize, what: &str) -> String {
    match interval {
        Some(i) if !i.is_zero() => format!(
            "1 {what} every {} per sender = {} {what}s/s in total",
            duration(i),
            crate::report::round3(senders as f64 / i.as_secs_f64())
        ),
        _ if rate > 0.0 => format!("{} {what}s/s in total", crate::report::round3(rate)),
        _ => "as fast as acknowledgements allow".into(),
    }
}

/// How long the load runs: a duration, or a message count per sender.
fn length(duration_arg: Option<Duration>, per_sender: Option<u64>, default: Duration) -> String {
    match (duration_arg, per_sender) {
        (_, Some(n)) => format!("{n} messages per sender"),
        (Some(d), None) => duration(d),
        (None, None) => duration(default),
    }
}

/// The connection options every MQTT scenario shares.
fn target(t: &TargetArgs) -> Settings {
    let mut s = vec![
        row("MQTT version", t.mqtt_version.label()),
        row("transport", transport(t)),
        row("keep-alive", format!("{} s", t.keep_alive)),
    ];
    if t.workers > 1 {
        s.push(row("generator processes", t.workers.to_string()));
    }
    if !t.sources.is_empty() {
        let sources: Vec<String> = t.sources.iter().map(ToString::to_string).collect();
        s.push(row("source addresses", sources.join(", ")));
    }
    s
}

/// TCP, or TLS with the name checked (the CA file is a temporary path, not shown).
fn transport(t: &TargetArgs) -> String {
    match t.tls_ca {
        Some(_) => format!(
            "TLS (1.3 or 1.2, server certificate checked for {}, full handshake per connection)",
            t.tls_server_name
        ),
        None => "TCP".into(),
    }
}

/// `mqtt-telemetry`.
pub fn telemetry(a: &TelemetryArgs) -> Settings {
    let mut s = vec![
        row("scenario", "mqtt-telemetry"),
        row("devices (connections)", a.devices.to_string()),
        row("offered load", load(a.rate, a.interval, a.devices, "msg")),
        row("length", length(a.duration, a.messages_per_device, Duration::from_secs(10))),
        row("QoS", a.qos.to_string()),
        row("in flight per connection", a.inflight.to_string()),
        row("payload", payload(a.payload_bytes, a.payload_template.is_some())),
    ];
    if !a.ramp_up.is_zero() {
        s.push(row("ramp-up", duration(a.ramp_up)));
    }
    if let Some(p) = &a.device_profile {
        s.push(row("device profile", p.display().to_string()));
    }
    if let Some(sink) = a.forward.sink() {
        let batch = a.forward.forward_batch_size;
        s.push(row(
            "data forwarding",
            match sink {
                crate::cli::ForwardSink::Http => {
                    format!("HTTP sink, the tool's receiver on loopback, {batch} events per POST")
                }
                crate::cli::ForwardSink::Kafka(b) => {
                    format!("Kafka sink at {b}, a new topic of {} partitions", a.forward.forward_partitions)
                }
                crate::cli::ForwardSink::Blackhole => "HTTP sink that accepts and never answers".to_owned(),
            },
        ));
    }
    s.extend(target(&a.target));
    s.push(row("checks", checks(a.verify, a.storage_lag)));
    s
}

/// `http-telemetry`.
pub fn http_telemetry(a: &HttpTelemetryArgs) -> Settings {
    let mut s = vec![
        row("scenario", "http-telemetry"),
        row("devices (keep-alive connections)", a.devices.to_string()),
        row("offered load", load(a.rate, a.interval, a.devices, "request")),
        row("length", length(a.duration, a.messages_per_device, Duration::from_secs(10))),
        row("in flight per connection", "1"),
        row("payload", payload(a.payload_bytes, a.payload_template.is_some())),
    ];
    if let Some(p) = &a.device_profile {
        s.push(row("device profile", p.display().to_string()));
    }
    s.push(row("checks", checks(a.verify, a.storage_lag)));
    s
}

/// `pubsub`.
pub fn pubsub(a: &PubsubArgs) -> Settings {
    let publishers = a.groups * a.publishers;
    let mut s = vec![
        row("scenario", "pubsub"),
        row(
            "clients",
            format!(
                "{} groups × ({} publishers + {} subscribers{})",
                a.groups,
                a.publishers,
                a.subscribers,
                if a.shared { ", one shared subscription" } else { "" }
            ),
        ),
        row("offered load", load(a.rate, a.interval, publishers, "msg")),
        row("length", length(a.duration, a.messages_per_publisher, Duration::from_secs(10))),
        row("QoS", format!("publish {}, subscribe {}", a.pub_qos, a.sub_qos)),
        row("in flight per publisher", a.inflight.to_string()),
        row("payload", format!("{} bytes", a.payload_bytes)),
        row("subscriber sessions", if a.persistent_subscribers { "persistent" } else { "clean" }),
    ];
    s.extend(target(&a.target));
    s
}

/// `connect`.
pub fn connect(a: &ConnectArgs) -> Settings {
    let mut s = vec![
        row("scenario", "connect"),
        row("connections", a.connections.to_string()),
        row(
            "connect rate",
            if a.rate > 0.0 { format!("{} /s", crate::report::round3(a.rate)) } else { "unpaced".into() },
        ),
        row("hold", duration(a.hold)),
    ];
    s.extend(target(&a.target));
    s
}

fn payload(bytes: usize, template: bool) -> String {
    if template {
        format!("template, padded to {bytes} bytes")
    } else {
        format!("{bytes} bytes")
    }
}

fn checks(verify: bool, storage_lag: bool) -> String {
    match (verify, storage_lag) {
        (true, true) => "loss check, storage lag".into(),
        (true, false) => "loss check".into(),
        (false, true) => "storage lag".into(),
        (false, false) => "none".into(),
    }
}

/// The machine the tool runs on (and, for servers it starts, the server too): cores,
/// CPU model, memory, kernel; rows it cannot read are left out.
pub fn machine() -> Settings {
    let mut s = Settings::new();
    if let Ok(n) = std::thread::available_parallelism() {
        s.push(row("cores (available to the tool)", n.get().to_string()));
    }
    if let Some(model) = proc_field("/proc/cpuinfo", "model name") {
        s.push(row("CPU", model));
    }
    if let Some(kib) =
        proc_field("/proc/meminfo", "MemTotal").and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
    {
        s.push(row("memory", format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0))));
    }
    if let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        s.push(row("kernel", format!("Linux {}", release.trim())));
    }
    s.push(row("generator", format!("gridlinks-bench {}", env!("CARGO_PKG_VERSION"))));
    s
}

/// The value of the first `key: value` line of a /proc file.
fn proc_field(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: TelemetryArgs,
    }

    fn value<'a>(s: &'a Settings, name: &str) -> &'a str {
        s.iter().find(|(n, _)| n == name).map_or("", |(_, v)| v.as_str())
    }

    #[test]
    fn telemetry_settings_name_the_load() {
        let t = T::parse_from(["t", "--devices", "20", "--interval", "800ms", "--duration", "90s", "--qos", "1"]);
        let s = telemetry(&t.a);
        assert_eq!(value(&s, "devices (connections)"), "20");
        assert_eq!(value(&s, "offered load"), "1 msg every 800 ms per sender = 25 msgs/s in total");
        assert_eq!(value(&s, "length"), "90 s");
        assert_eq!(value(&s, "QoS"), "1");
        assert_eq!(value(&s, "transport"), "TCP");
        let t = T::parse_from(["t", "--rate", "300", "--messages-per-device", "10"]);
        let s = telemetry(&t.a);
        assert_eq!(value(&s, "offered load"), "300 msgs/s in total");
        assert_eq!(value(&s, "length"), "10 messages per sender");
        let t = T::parse_from(["t", "--tls-ca", "ca.pem", "--tls-server-name", "broker.test"]);
        let s = telemetry(&t.a);
        assert!(value(&s, "transport").starts_with("TLS (") && value(&s, "transport").contains("broker.test"));
        assert_eq!(t.a.target.version_label(), "3.1.1 over TLS");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(duration(Duration::from_millis(800)), "800 ms");
        assert_eq!(duration(Duration::from_secs(120)), "2 min");
        assert_eq!(duration(Duration::ZERO), "0 s");
    }

    #[test]
    fn the_machine_has_cores() {
        let m = machine();
        assert!(m.iter().any(|(n, v)| n.starts_with("cores") && v.parse::<usize>().is_ok_and(|c| c > 0)), "{m:?}");
    }
}
