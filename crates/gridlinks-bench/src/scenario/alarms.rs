//! The alarm scenarios, against a running GridLinks (`--api`, and for `alarm-latency` its
//! MQTT port):
//!
//! * `alarm-latency`: how long after a device's acknowledged publish the alarm its
//!   telemetry raises (a device-profile alarm rule) can be read through the REST API.
//!   Probe devices `alarm-probe-<i>` of the profile [`PROBE_PROFILE`] (one `SIMPLE` rule:
//!   `temperature > 50` raises [`PROBE_ALARM`], `temperature <= 50` clears it) publish, one
//!   probe at a time, `temperature` 60 at QoS 1; from the PUBACK on, the device's active
//!   alarms are polled back to back (`GET /api/v2/alarm/DEVICE/{id}?statusList=ACTIVE`)
//!   until the alarm of that publish (its `startTs` is the message's `ts`) is there. Then
//!   `temperature` 0 clears it, polled the same way, so every probe raises a new alarm.
//! * `alarm-list`: `--alarms` alarms created through `POST /api/alarm` over `--devices`
//!   devices `alarm-dev-<i>` (distinct types per device, severities in turn, every fourth
//!   cleared), then the list and count queries timed, and the server's RSS with them.
//!
//! REST calls are blocking (`ureq`) and run on blocking threads; MQTT on the runtime.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use gridlinks_codec::mqtt::{Packet, Publish, PublishProperties, QoS};
use serde::Serialize;
use serde_json::{json, Value};

use crate::cli::{AlarmLatencyArgs, AlarmListArgs};
use crate::loss_check::unix_millis;
use crate::mqtt_client::{ClientOptions, Endpoint, MqttConnection};
use crate::proc_stats::ProcessStats;
use crate::rest_api::{self, RestClient};

/// The device profile of the probe devices.
pub const PROBE_PROFILE: &str = "bench-alarm-probe";
/// The alarm type its rule raises.
pub const PROBE_ALARM: &str = "Bench Probe High Temperature";
/// Telemetry value that raises the probe alarm, and one that clears it.
const RAISE_VALUE: u32 = 60;
const CLEAR_VALUE: u32 = 0;

/// Severities given in turn to the alarms of `alarm-list`.
const SEVERITIES: [&str; 5] = ["CRITICAL", "MAJOR", "MINOR", "WARNING", "INDETERMINATE"];

/// The probe profile: ThingsBoard's `DeviceProfile` JSON with one alarm rule.
pub fn probe_profile() -> Value {
    let filter = |op: &str| {
        json!([{"key": {"type": "TIME_SERIES", "key": "temperature"}, "valueType": "NUMERIC", "value": null,
                "predicate": {"type": "NUMERIC", "operation": op,
                              "value": {"defaultValue": 50, "userValue": null, "dynamicValue": null}}}])
    };
    json!({
        "name": PROBE_PROFILE,
        "type": "DEFAULT",
        "transportType": "DEFAULT",
        "provisionType": "DISABLED",
        "description": "gridlinks-bench alarm-latency: temperature > 50 raises, <= 50 clears",
        "profileData": {
            "configuration": {"type": "DEFAULT"},
            "transportConfiguration": {"type": "DEFAULT"},
            "provisionConfiguration": {"type": "DISABLED"},
            "alarms": [{
                "id": "bench-probe",
                "alarmType": PROBE_ALARM,
                "createRules": {"CRITICAL": {"condition": {"condition": filter("GREATER"), "spec": {"type": "SIMPLE"}},
                                             "schedule": null, "alarmDetails": null, "dashboardId": null}},
                "clearRule": {"condition": {"condition": filter("LESS_OR_EQUAL"), "spec": {"type": "SIMPLE"}},
                              "schedule": null, "alarmDetails": null, "dashboardId": null},
                "propagate": false,
            }],
        },
    })
}

/// Percentiles of a sample of values (any unit), by rank.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    /// Values.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (nearest rank); all zero when empty.
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Spread::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Spread { count: v.len(), p50: at(0.50), p90: at(0.90), p99: at(0.99), min: v[0], max: v[v.len() - 1] }
    }

    /// `p50 1.234 ms  p90 …  p99 …  min …  max …  (n values)`: with `unit` and three
    /// decimals, or whole numbers for an empty unit (counts).
    fn line(&self, unit: &str) -> String {
        let v = |x: f64| match unit {
            "" => format!("{x:.0}"),
            u => format!("{x:.3} {u}"),
        };
        format!(
            "p50 {}  p90 {}  p99 {}  min {}  max {}  ({} values)",
            v(self.p50),
            v(self.p90),
            v(self.p99),
            v(self.min),
            v(self.max),
            self.count
        )
    }
}

/// What `alarm-latency` measured (times in ms).
#[derive(Debug, Serialize)]
pub struct AlarmLatencyRun {
    /// Probe devices.
    pub devices: usize,
    /// Probes asked for.
    pub probes: usize,
    /// Probes whose alarm was seen.
    pub raised: usize,
    /// Probes whose alarm was not visible within `--timeout`.
    pub timed_out: usize,
    /// PUBLISH written → PUBACK.
    pub puback_ms: Spread,
    /// PUBACK → the alarm in a REST answer (the answer's arrival): what a client sees.
    pub ack_to_visible_ms: Spread,
    /// The alarm's `createdTime` (server clock, ms) − the PUBACK's arrival (same clock):
    /// negative when the alarm existed before the acknowledgement got back.
    pub created_minus_ack_ms: Spread,
    /// The alarm's `createdTime` − the PUBLISH's write (ms resolution).
    pub created_minus_publish_ms: Spread,
    /// Polls per probe until the alarm was there.
    pub polls: Spread,
    /// One poll's round trip (the resolution of `ack_to_visible_ms`).
    pub poll_ms: Spread,
    /// PUBACK of the clearing publish → no active alarm in a REST answer.
    pub ack_to_cleared_ms: Spread,
}

/// One device of `alarm-latency`.
struct Probe {
    id: String,
    conn: MqttConnection,
    /// The last `ts` it published (each publish one more, at least the wall clock).
    ts: u64,
}

/// When a polled condition held.
struct Seen {
    /// The answer's arrival.
    at: Instant,
    /// Polls made.
    polls: u32,
    /// The round trip of each poll, ms.
    rtt_ms: Vec<f64>,
    /// The alarm's `createdTime`, when the condition was an alarm.
    created_ms: Option<i64>,
}

/// `alarm-latency`.
pub async fn latency(args: AlarmLatencyArgs) -> anyhow::Result<std::process::ExitCode> {
    let api = args.api.target("alarm-latency")?;
    let devices = args.devices.min(args.probes).max(1);
    let names: Vec<String> = (0..devices).map(|i| format!("alarm-probe-{i}")).collect();
    eprintln!("alarm-latency: device profile {PROBE_PROFILE}, {devices} probe devices through {}", api.base);
    let (rest, tokens, ids) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let rest = RestClient::login(&api)?;
        rest.save_device_profile(&probe_profile())?;
        let tokens = rest_api::random_tokens(names.len())?;
        rest.bulk_import_typed(&names, &tokens, Some(PROBE_PROFILE))?;
        let ids = names
            .iter()
            .map(|n| rest.device_id(n)?.with_context(|| format!("device {n} was not created")))
            .collect::<anyhow::Result<Vec<String>>>()?;
        Ok((rest, tokens, ids))
    })
    .await??;
    let server = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("resolving {}", args.host))?
        .next()
        .with_context(|| format!("{} has no address", args.host))?;
    let mut probes = Vec::with_capacity(devices);
    for (i, (token, id)) in tokens.into_iter().zip(ids).enumerate() {
        let opts = ClientOptions {
            client_id: format!("alarm-probe-{i}"),
            username: Some(token),
            password: None,
            keep_alive: Duration::from_secs(60),
            version: gridlinks_codec::mqtt::ProtocolVersion::V3_1_1,
            connect_timeout: Duration::from_secs(10),
            session_expiry: None,
            tls: None,
        };
        let conn = MqttConnection::connect(Endpoint { server, source: None }, &opts)
            .await
            .map_err(|e| anyhow::anyhow!("probe device {i}: {}", e.reason()))?;
        probes.push(Probe { id, conn, ts: 0 });
    }
    // Start clean: an alarm left active by an earlier run is cleared first.
    for p in &mut probes {
        publish(p, CLEAR_VALUE).await?;
        poll(&rest, &p.id, args.timeout, None).await?.context("an earlier probe alarm stays active")?;
    }
    eprintln!("alarm-latency: {} probes, one every {:?}", args.probes, args.interval);
    let mut m = Measured::default();
    let mut next = tokio::time::Instant::now();
    for n in 0..args.probes {
        tokio::time::sleep_until(next).await;
        next += args.interval;
        let p = &mut probes[n % devices];
        let (sent_ms, sent, acked) = publish(p, RAISE_VALUE).await?;
        let acked_ms = unix_millis();
        m.puback.push(ms_between(sent, acked));
        match poll(&rest, &p.id, args.timeout, Some(p.ts)).await? {
            Some(seen) => {
                let created = seen.created_ms.unwrap_or_default();
                m.visible.push(ms_between(acked, seen.at));
                m.created_ack.push(created as f64 - acked_ms as f64);
                m.created_publish.push(created as f64 - sent_ms as f64);
                m.polls.push(f64::from(seen.polls));
                m.poll_rtt.extend(seen.rtt_ms);
            }
            None => m.timed_out += 1,
        }
        let (_, _, acked) = publish(p, CLEAR_VALUE).await?;
        match poll(&rest, &p.id, args.timeout, None).await? {
            Some(seen) => m.cleared.push(ms_between(acked, seen.at)),
            None => bail!("the probe alarm of device {} was not cleared within {:?}", p.id, args.timeout),
        }
    }
    for p in probes {
        p.conn.disconnect().await;
    }
    let run = AlarmLatencyRun {
        devices,
        probes: args.probes,
        raised: m.visible.len(),
        timed_out: m.timed_out,
        puback_ms: Spread::of(&m.puback),
        ack_to_visible_ms: Spread::of(&m.visible),
        created_minus_ack_ms: Spread::of(&m.created_ack),
        created_minus_publish_ms: Spread::of(&m.created_publish),
        polls: Spread::of(&m.polls),
        poll_ms: Spread::of(&m.poll_rtt),
        ack_to_cleared_ms: Spread::of(&m.cleared),
    };
    println!(
        "alarm-latency  {} probes over {} devices, {} alarms seen, {} not within {:?}\n\
         PUBACK                           {}\n\
         PUBACK -> alarm in REST answer   {}\n\
         createdTime - PUBACK arrival     {}\n\
         createdTime - PUBLISH write      {}\n\
         one poll (resolution)            {}\n\
         polls per probe                  {}\n\
         PUBACK -> cleared in REST answer {}",
        run.probes,
        run.devices,
        run.raised,
        run.timed_out,
        args.timeout,
        run.puback_ms.line("ms"),
        run.ack_to_visible_ms.line("ms"),
        run.created_minus_ack_ms.line("ms"),
        run.created_minus_publish_ms.line("ms"),
        run.poll_ms.line("ms"),
        run.polls.line(""),
        run.ack_to_cleared_ms.line("ms"),
    );
    if let Some(path) = &args.json {
        crate::report::write_json(path, &json!({"scenario": "alarm-latency", "run": run}))?;
    }
    Ok(crate::exit_code(run.timed_out == 0))
}

/// What the probes measured, ms.
#[derive(Default)]
struct Measured {
    puback: Vec<f64>,
    visible: Vec<f64>,
    created_ack: Vec<f64>,
    created_publish: Vec<f64>,
    polls: Vec<f64>,
    poll_rtt: Vec<f64>,
    cleared: Vec<f64>,
    timed_out: usize,
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64() * 1000.0
}

/// Publishes `{"ts":…,"values":{"temperature":value}}` at QoS 1 and waits for its PUBACK:
/// the wall clock (ms) and instant of the write, and the instant of the PUBACK.
async fn publish(p: &mut Probe, value: u32) -> anyhow::Result<(u64, Instant, Instant)> {
    let sent_ms = unix_millis();
    p.ts = sent_ms.max(p.ts + 1);
    let publish = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "v1/devices/me/telemetry".into(),
        packet_id: Some(1),
        payload: Bytes::from(format!("{{\"ts\":{},\"values\":{{\"temperature\":{value}}}}}", p.ts)),
        properties: PublishProperties::default(),
    });
    p.conn.queue(&publish).context("encoding PUBLISH")?;
    let sent = Instant::now();
    p.conn.flush().await.context("writing PUBLISH")?;
    loop {
        match p.conn.read_packet().await.map_err(|e| anyhow::anyhow!("waiting for PUBACK: {}", e.reason()))? {
            Packet::PubAck(ack) if ack.packet_id == 1 => return Ok((sent_ms, sent, Instant::now())),
            _ => continue,
        }
    }
}

/// Polls device `id`'s active alarms back to back until the probe alarm raised by the
/// message stamped `start_ts` is there (`Some`), or, with `None`, until none is active;
/// `Ok(None)` after `timeout`.
async fn poll(rest: &RestClient, id: &str, timeout: Duration, start_ts: Option<u64>) -> anyhow::Result<Option<Seen>> {
    let (rest, path) = (
        rest.clone(),
        format!("/api/v2/alarm/DEVICE/{id}?pageSize=10&page=0&statusList=ACTIVE&typeList={}", encode(PROBE_ALARM)),
    );
    tokio::task::spawn_blocking(move || -> anyhow::Result<Option<Seen>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Seen { at: Instant::now(), polls: 0, rtt_ms: Vec::new(), created_ms: None };
        while Instant::now() < deadline {
            let asked = Instant::now();
            let page = rest.get_json(&path)?;
            seen.at = Instant::now();
            seen.polls += 1;
            seen.rtt_ms.push(ms_between(asked, seen.at));
            let alarms = page["data"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            match start_ts {
                Some(ts) => {
                    if let Some(a) = alarms.iter().find(|a| a["startTs"].as_u64() == Some(ts)) {
                        seen.created_ms = a["createdTime"].as_i64();
                        return Ok(Some(seen));
                    }
                }
                None if alarms.is_empty() => return Ok(Some(seen)),
                None => {}
            }
        }
        Ok(None)
    })
    .await?
}

/// `text` for a URL query (letters and digits kept, the rest %-encoded).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One query of `alarm-list`, timed.
#[derive(Debug, Serialize)]
pub struct QueryTiming {
    /// What it asks.
    pub name: String,
    /// An example request (device queries go round the devices).
    pub path: String,
    /// Its `totalElements` (the last answer's).
    pub total_elements: u64,
    /// Rows in the last answer.
    pub rows: usize,
    /// Request → answer, ms.
    pub latency_ms: Spread,
}

/// What `alarm-list` measured.
#[derive(Debug, Serialize)]
pub struct AlarmListRun {
    /// Alarms asked for.
    pub alarms: usize,
    /// Devices they are spread over.
    pub devices: usize,
    /// Alarms created in this run (0 with `--skip-create`).
    pub created: usize,
    /// Seconds creating them took.
    pub create_seconds: f64,
    /// Alarms created per second.
    pub created_per_second: f64,
    /// Server CPU seconds while creating.
    pub create_server_cpu_seconds: Option<f64>,
    /// One create call (`POST /api/alarm`), ms.
    pub create_latency_ms: Spread,
    /// Server RSS before creating, KiB.
    pub rss_before_kib: Option<u64>,
    /// Server RSS after creating, KiB.
    pub rss_after_create_kib: Option<u64>,
    /// Server RSS after the queries, KiB.
    pub rss_after_queries_kib: Option<u64>,
    /// The queries.
    pub queries: Vec<QueryTiming>,
}

/// `alarm-list`.
pub async fn list(args: AlarmListArgs) -> anyhow::Result<std::process::ExitCode> {
    let api = args.api.target("alarm-list")?;
    let server = super::server_stats(&args.server_pid)?;
    tokio::task::spawn_blocking(move || list_blocking(&args, &api, server.as_ref())).await?
}

fn list_blocking(
    args: &AlarmListArgs,
    api: &rest_api::ApiTarget,
    server: Option<&ProcessStats>,
) -> anyhow::Result<std::process::ExitCode> {
    let rss = || -> anyhow::Result<Option<u64>> {
        server.map(|s| Ok(s.memory().context("reading server /proc")?.rss_kib)).transpose()
    };
    let rest = RestClient::login(api)?;
    let names: Vec<String> = (0..args.devices).map(|i| format!("alarm-dev-{i}")).collect();
    eprintln!("alarm-list: {} devices through {}", names.len(), api.base);
    rest.bulk_import(&names, &rest_api::random_tokens(names.len())?)?;
    let ids = names
        .iter()
        .map(|n| rest.device_id(n)?.with_context(|| format!("device {n} was not created")))
        .collect::<anyhow::Result<Vec<String>>>()?;
    let rss_before_kib = rss()?;
    let (mut created, mut create_seconds, mut create_cpu, mut create_latency) = (0, 0.0, None, Vec::new());
    if !args.skip_create {
        eprintln!("alarm-list: creating {} alarms over {} connections", args.alarms, args.threads);
        let cpu_before = server.map(ProcessStats::cpu_seconds).transpose()?;
        let started = Instant::now();
        let per_thread: Vec<anyhow::Result<Vec<f64>>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..args.threads)
                .map(|t| {
                    let (rest, ids) = (rest.clone(), &ids);
                    s.spawn(move || create_alarms(&rest, ids, args.alarms, t, args.threads))
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))).collect()
        });
        create_seconds = started.elapsed().as_secs_f64();
        create_cpu = match (server, cpu_before) {
            (Some(s), Some(before)) => Some(s.cpu_seconds()? - before),
            _ => None,
        };
        for r in per_thread {
            create_latency.extend(r?);
        }
        created = create_latency.len();
    }
    let rss_after_create_kib = rss()?;
    let total = args.alarms as u64;
    let cleared = (0..args.alarms).filter(|k| cleared(*k)).count() as u64;
    // (what, path: `{device}` is a device's id, in turn; the expected totalElements)
    let queries = [
        (
            "list ACTIVE, first page of 100",
            "/api/v2/alarms?pageSize=100&page=0&statusList=ACTIVE",
            Some(total - cleared),
        ),
        (
            "count ACTIVE (pageSize=1, totalElements)",
            "/api/v2/alarms?pageSize=1&page=0&statusList=ACTIVE",
            Some(total - cleared),
        ),
        (
            "count CLEARED (pageSize=1, totalElements)",
            "/api/v2/alarms?pageSize=1&page=0&statusList=CLEARED",
            Some(cleared),
        ),
        ("one device's alarms, page of 100", "/api/v2/alarm/DEVICE/{device}?pageSize=100&page=0", None),
    ];
    let mut timings = Vec::new();
    for (name, path, expected) in queries {
        let path = |r: usize| path.replace("{device}", &ids[r * 7919 % ids.len()]);
        let mut latency = Vec::with_capacity(args.requests);
        let (mut total_elements, mut rows) = (0, 0);
        // A few unmeasured requests first (connections, caches).
        for r in 0..args.requests + 5 {
            let asked = Instant::now();
            let page = rest.get_json(&path(r))?;
            if r >= 5 {
                latency.push(ms_between(asked, Instant::now()));
            }
            total_elements = page["totalElements"].as_u64().context("a page without totalElements")?;
            rows = page["data"].as_array().map_or(0, Vec::len);
        }
        if let Some(e) = expected.filter(|e| !args.skip_create && *e != total_elements) {
            eprintln!("alarm-list: {name}: totalElements {total_elements}, expected {e} (alarms from earlier runs?)");
        }
        timings.push(QueryTiming {
            name: name.into(),
            path: path(0),
            total_elements,
            rows,
            latency_ms: Spread::of(&latency),
        });
    }
    let run = AlarmListRun {
        alarms: args.alarms,
        devices: args.devices,
        created,
        create_seconds,
        created_per_second: crate::report::per_second(created as f64, create_seconds),
        create_server_cpu_seconds: create_cpu,
        create_latency_ms: Spread::of(&create_latency),
        rss_before_kib,
        rss_after_create_kib,
        rss_after_queries_kib: rss()?,
        queries: timings,
    };
    print!("{}", list_human(&run));
    if let Some(path) = &args.json {
        crate::report::write_json(path, &json!({"scenario": "alarm-list", "run": run}))?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Whether alarm `k` of `alarm-list` is created cleared (every fourth).
fn cleared(k: usize) -> bool {
    k % 4 == 3
}

/// Creates alarms `k = thread, thread + threads, …` below `alarms`: alarm `k` on device
/// `k % devices`, type `bench-alarm-{k / devices}`; the latency of each call, ms.
fn create_alarms(
    rest: &RestClient,
    ids: &[String],
    alarms: usize,
    thread: usize,
    threads: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut latency = Vec::with_capacity(alarms / threads + 1);
    for k in (thread..alarms).step_by(threads) {
        let now = unix_millis();
        let mut body = json!({
            "originator": {"entityType": "DEVICE", "id": ids[k % ids.len()]},
            "type": format!("bench-alarm-{}", k / ids.len()),
            "severity": SEVERITIES[k % SEVERITIES.len()],
            "startTs": now,
            "details": {"bench": k},
        });
        if cleared(k) {
            body["cleared"] = json!(true);
            body["clearTs"] = json!(now);
        }
        let asked = Instant::now();
        rest.post_json("/api/alarm", &body).with_context(|| format!("creating alarm {k}"))?;
        latency.push(ms_between(asked, Instant::now()));
    }
    Ok(latency)
}

fn list_human(run: &AlarmListRun) -> String {
    use std::fmt::Write as _;
    let mib = |k: Option<u64>| k.map_or("-".into(), crate::report::mib);
    let mut out = format!(
        "alarm-list     {} alarms over {} devices; created {} in {:.1} s ({:.0}/s",
        run.alarms, run.devices, run.created, run.create_seconds, run.created_per_second
    );
    if let Some(cpu) = run.create_server_cpu_seconds.filter(|c| *c > 0.0) {
        let _ = write!(out, ", {:.0} per server CPU-second", run.created as f64 / cpu);
    }
    let _ = writeln!(out, ")\ncreate call    {}", run.create_latency_ms.line("ms"));
    let _ = writeln!(
        out,
        "server RSS     before {}, after creating {}, after the queries {}",
        mib(run.rss_before_kib),
        mib(run.rss_after_create_kib),
        mib(run.rss_after_queries_kib)
    );
    for q in &run.queries {
        let _ = writeln!(
            out,
            "{}: totalElements {}, {} rows\n  {}\n  {}",
            q.name,
            q.total_elements,
            q.rows,
            q.path,
            q.latency_ms.line("ms")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_nearest_ranks() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        let s = Spread::of(&v);
        assert_eq!((s.count, s.p50, s.p90, s.p99, s.min, s.max), (200, 100.0, 180.0, 198.0, 1.0, 200.0));
        assert_eq!(Spread::of(&[]).count, 0);
        assert_eq!(Spread::of(&[-2.0, 5.0]).p50, -2.0);
        assert_eq!(Spread::of(&[1.0, 2.0]).line(""), "p50 1  p90 2  p99 2  min 1  max 2  (2 values)");
        assert_eq!(Spread::of(&[0.5]).line("ms").split("  ").next(), Some("p50 0.500 ms"));
    }

    #[test]
    fn query_text_is_encoded() {
        assert_eq!(encode("Bench Probe High Temperature"), "Bench%20Probe%20High%20Temperature");
        assert_eq!(encode("a-b_c.d"), "a-b_c.d");
    }

    #[test]
    fn every_fourth_alarm_is_cleared() {
        assert_eq!((0..100).filter(|k| cleared(*k)).count(), 25);
    }
}
