//! `ws-telemetry`: live telemetry over ThingsBoard's WebSocket API on a GridLinks the tool
//! starts. `--devices` devices are made through the bulk import. Then either one WebSocket
//! session per device subscribes to that device (`TIMESERIES`), or one session subscribes
//! to every device (`--one-session`). Each device posts `--rate` messages per second over
//! HTTP keep-alive connections (`--connections`), every point carrying its send time in
//! microseconds.
//!
//! Measured over the posting phase:
//! - post → update latency at the WebSocket client, which includes the durable commit;
//! - server CPU per update delivered;
//! - the server's RSS per session, from RSS before and after the sessions open;
//! - updates received against posts acknowledged: one update per acknowledged post and
//!   subscription, none missing.
//!
//! `--via mqtt` receives the same data through the canonical MQTT topics instead
//! (`gridlinks/devices/{name}/telemetry`, anonymous QoS 0 subscribers, one per device or one
//! on `gridlinks/devices/+/telemetry`), for a side-by-side comparison of the two fan-outs.
//! `--via none` opens no receivers: the server CPU per post it reports is what posting and
//! committing cost alone, so the fan-out's own cost is the difference.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use gridlinks_codec::mqtt::{Packet, ProtocolVersion, QoS, Subscribe, SubscriptionRequest};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use super::http_telemetry::read_response;
use crate::cli::{Via, WsTelemetryArgs};
use crate::mqtt_client::{ClientOptions, Endpoint, MqttConnection};
use crate::proc_stats::ProcessStats;
use crate::report::LatencySummary;
use crate::rest_api::{random_tokens, ApiTarget, RestClient};
use crate::servers::{Binaries, ManagedServer};
use crate::stats::LatencyShards;

/// Longest wait for the updates of the last posts once posting ended: a hang guard (the
/// wait ends as soon as every update is in), generous for a busy machine.
const LAST_UPDATES_PATIENCE: Duration = Duration::from_secs(30);

/// The run's figures.
#[derive(Debug, Serialize)]
pub struct WsRun {
    /// Devices, each posting at `rate`.
    pub devices: usize,
    /// `ws`, `mqtt` or `none`.
    pub via: String,
    /// WebSocket sessions.
    pub sessions: usize,
    /// Messages per second per device.
    pub rate: f64,
    /// Seconds of posting.
    pub seconds: f64,
    /// Posts answered 200.
    pub posted: u64,
    /// Updates received (points, one per post and subscription).
    pub received: u64,
    /// Posts acknowledged that no update carried.
    pub missing: u64,
    /// Server CPU seconds over the posting phase.
    pub server_cpu_seconds: f64,
    /// Server CPU microseconds per update delivered (posting included; 0 without receivers).
    pub server_cpu_us_per_update: f64,
    /// Server CPU microseconds per post acknowledged (fan-out included).
    pub server_cpu_us_per_post: f64,
    /// Server RSS before the sessions opened and once they had subscribed, KiB.
    pub rss_kib: (u64, u64),
    /// Server RSS growth per session, KiB (negative: the allocator gave back more than
    /// the sessions took; 0 without sessions).
    pub rss_kib_per_session: f64,
    /// Post → update latency.
    pub latency: LatencySummary,
}

/// `total / n`, 0 when `n` is 0.
fn per(total: f64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        total / n as f64
    }
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Runs the scenario and prints its figures.
pub async fn run(args: WsTelemetryArgs) -> anyhow::Result<std::process::ExitCode> {
    let bins = Binaries::with_gridlinks(args.server.gridlinks_bin.as_deref());
    // Every session is the administrator's: the per-user and per-tenant bounds must let one
    // user hold a session (and a subscription) per device.
    let n = args.devices.max(1);
    let config = format!(
        "[ws]\nmax_sessions_per_user = {n}\nmax_subscriptions_per_user = {n}\nmax_subscriptions_per_tenant = {n}\n"
    );
    let server = ManagedServer::start_gridlinks_with(&bins, &config, None).await.context("starting gridlinks")?;
    let (base, password) = server.api().context("gridlinks has an API")?;
    let addr: SocketAddr = base.trim_start_matches("http://").parse().context("the API address")?;
    let api = ApiTarget { base: base.clone(), user: "admin".into(), password };
    let n = args.devices;
    let names: Vec<String> = (0..n).map(|i| format!("ws-bench-{i}")).collect();
    let tokens = random_tokens(n)?;
    let (ids, jwt) = {
        let (api, names, tokens) = (api.clone(), names.clone(), tokens.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<(Vec<String>, String)> {
            let rest = RestClient::login(&api)?;
            rest.bulk_import(&names, &tokens)?;
            let ids =
                names.iter().map(|n| rest.device_id(n)?.context("an imported device")).collect::<Result<_, _>>()?;
            Ok((ids, rest.token().to_owned()))
        })
        .await??
    };
    let proc = ProcessStats::new(server.pid())?;
    // The import's memory settles before the baseline is taken.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = proc.memory()?.rss_kib;
    // Sessions: one per device, or one for all.
    let groups: Vec<Vec<String>> = match (args.via, args.one_session) {
        (Via::None, _) => Vec::new(),
        (_, true) => vec![ids.clone()],
        (_, false) => ids.iter().map(|id| vec![id.clone()]).collect(),
    };
    let received = Arc::new(AtomicU64::new(0));
    let latency = LatencyShards::new(groups.len().max(1));
    let (readers, rss_after) = match args.via {
        Via::Ws => {
            let sessions = open_ws(&base, &jwt, &groups).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            (read_ws(sessions, &received, &latency), proc.memory()?.rss_kib)
        }
        Via::Mqtt => {
            let server_addr = SocketAddr::new(addr.ip(), server.mqtt_port());
            let subscribers = open_mqtt(server_addr, &names, args.one_session).await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            (read_mqtt(subscribers, &received, &latency), proc.memory()?.rss_kib)
        }
        Via::None => (Vec::new(), rss_before),
    };
    // Posting: each connection takes an equal share of the devices and posts each device's
    // message once per period.
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let cpu_start = proc.cpu_seconds()?;
    let started = Instant::now();
    let deadline = started + args.duration;
    let posted = Arc::new(AtomicU64::new(0));
    let conns = args.connections.min(n);
    let mut posters = Vec::with_capacity(conns);
    for c in 0..conns {
        let mine: Vec<String> = tokens.iter().skip(c).step_by(conns).cloned().collect();
        let posted = posted.clone();
        posters.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let mut buf = BytesMut::new();
            let mut next = Instant::now();
            while Instant::now() < deadline {
                for token in &mine {
                    let body = format!(r#"{{"t":"{}"}}"#, now_us());
                    let req = format!(
                        "POST /api/v1/{token}/telemetry HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    stream.write_all(req.as_bytes()).await?;
                    if read_response(&mut stream, &mut buf).await?.status == 200 {
                        posted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                next += period;
                tokio::time::sleep_until(next).await;
            }
            anyhow::Ok(())
        }));
    }
    for p in posters {
        p.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Let the last updates arrive.
    let posted = posted.load(Ordering::Relaxed);
    // Each device has exactly one subscription (its own session's, or the one session's),
    // or none without receivers.
    let expected = if groups.is_empty() { 0 } else { posted };
    let wait_until = Instant::now() + LAST_UPDATES_PATIENCE;
    while received.load(Ordering::Relaxed) < expected && Instant::now() < wait_until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu = proc.cpu_seconds()? - cpu_start;
    server.stop().await?;
    for r in readers {
        let _ = r.await;
    }
    let received = received.load(Ordering::Relaxed);
    let sessions_n = groups.len();
    let run = WsRun {
        devices: n,
        via: format!("{:?}", args.via).to_lowercase(),
        sessions: sessions_n,
        rate: args.rate,
        seconds,
        posted,
        received,
        missing: expected.saturating_sub(received),
        server_cpu_seconds: cpu,
        server_cpu_us_per_update: per(cpu * 1e6, received),
        server_cpu_us_per_post: per(cpu * 1e6, posted),
        rss_kib: (rss_before, rss_after),
        rss_kib_per_session: per(rss_after as f64 - rss_before as f64, sessions_n as u64),
        latency: LatencySummary::from_histogram(&latency.merged()),
    };
    println!(
        "ws-telemetry: {} devices at {}/s, {} session(s) via {}\n\
         posted {}  updates {}  missing {}  post→update p50 {:.2} ms  p99 {:.2} ms  \
         server CPU {:.1} µs/update, {:.1} µs/post  RSS {:.1} KiB/session",
        n,
        args.rate,
        sessions_n,
        run.via,
        run.posted,
        run.received,
        run.missing,
        run.latency.p50_us as f64 / 1000.0,
        run.latency.p99_us as f64 / 1000.0,
        run.server_cpu_us_per_update,
        run.server_cpu_us_per_post,
        run.rss_kib_per_session,
    );
    if let Some(path) = &args.server.json {
        crate::report::write_json(path, &json!({"scenario": "ws-telemetry", "run": run}))?;
    }
    Ok(crate::exit_code(run.missing == 0 && run.posted > 0))
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// One WebSocket session per group, subscribed to the group's devices (each first update
/// read).
async fn open_ws(base: &str, jwt: &str, groups: &[Vec<String>]) -> anyhow::Result<Vec<Ws>> {
    let url = format!("{}/api/ws", base.replacen("http://", "ws://", 1));
    let mut sessions = Vec::with_capacity(groups.len());
    for group in groups {
        let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.context("opening a WebSocket")?;
        let cmds: Vec<Value> = group
            .iter()
            .enumerate()
            .map(|(i, id)| json!({"cmdId": i, "type": "TIMESERIES", "entityType": "DEVICE", "entityId": id, "keys": "t"}))
            .collect();
        // Authentication, then the commands in messages within the server's size bound.
        ws.send(Message::Text(json!({"authCmd": {"cmdId": 0, "token": jwt}}).to_string().into())).await?;
        for chunk in cmds.chunks(100) {
            ws.send(Message::Text(json!({"cmds": chunk}).to_string().into())).await?;
        }
        for _ in group {
            loop {
                if let Message::Text(t) = ws.next().await.context("a session closed early")?? {
                    let v: Value = serde_json::from_str(&t)?;
                    anyhow::ensure!(v["errorCode"] == 0, "subscription refused: {v}");
                    break;
                }
            }
        }
        sessions.push(ws);
    }
    Ok(sessions)
}

/// Records the latency of every point `t` (its send time, µs, as text) at `now`.
fn record(points: impl Iterator<Item = u64>, received: &AtomicU64, rec: &mut crate::stats::LatencyRecorder) {
    let now = now_us();
    for sent in points {
        rec.record(Duration::from_micros(now.saturating_sub(sent)));
        received.fetch_add(1, Ordering::Relaxed);
    }
}

fn read_ws(sessions: Vec<Ws>, received: &Arc<AtomicU64>, latency: &Arc<LatencyShards>) -> Vec<JoinHandle<()>> {
    sessions
        .into_iter()
        .enumerate()
        .map(|(i, mut ws)| {
            let (received, mut rec) = (received.clone(), latency.recorder(i));
            tokio::spawn(async move {
                while let Some(Ok(msg)) = ws.next().await {
                    let Message::Text(t) = msg else { continue };
                    let Ok(v) = serde_json::from_str::<Value>(&t) else { continue };
                    let points = v["data"]["t"].as_array().cloned().unwrap_or_default();
                    let sent = points.iter().filter_map(|p| p[1].as_str()?.parse::<u64>().ok());
                    record(sent, &received, &mut rec);
                }
                rec.flush();
            })
        })
        .collect()
}

/// One anonymous QoS 0 subscriber per device (`gridlinks/devices/{name}/telemetry`), or one
/// on every device's topic.
async fn open_mqtt(server: SocketAddr, names: &[String], one: bool) -> anyhow::Result<Vec<MqttConnection>> {
    let filters: Vec<String> = match one {
        true => vec!["gridlinks/devices/+/telemetry".to_owned()],
        false => names.iter().map(|n| format!("gridlinks/devices/{n}/telemetry")).collect(),
    };
    let mut subscribers = Vec::with_capacity(filters.len());
    for (i, filter) in filters.into_iter().enumerate() {
        let opts = ClientOptions {
            client_id: format!("ws-bench-sub-{i}"),
            username: None,
            password: None,
            keep_alive: Duration::from_secs(60),
            version: ProtocolVersion::V5,
            connect_timeout: Duration::from_secs(10),
            session_expiry: None,
            // The GridLinks this scenario starts listens in plain MQTT.
            tls: None,
        };
        let mut c = MqttConnection::connect(Endpoint { server, source: None }, &opts)
            .await
            .map_err(|e| anyhow::anyhow!("connecting a subscriber: {}", e.reason()))?;
        let subscribe = Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscriptionRequest {
                filter,
                qos: QoS::AtMostOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
            }],
            subscription_identifier: None,
            user_properties: Vec::new(),
        });
        c.queue(&subscribe)?;
        c.flush().await?;
        loop {
            match c.read_packet().await.map_err(|e| anyhow::anyhow!("subscribing: {}", e.reason()))? {
                Packet::SubAck(a) if a.return_codes.iter().all(|c| *c < 0x80) => break,
                Packet::SubAck(a) => anyhow::bail!("subscription refused: {:?}", a.return_codes),
                _ => {}
            }
        }
        subscribers.push(c);
    }
    Ok(subscribers)
}

fn read_mqtt(
    subscribers: Vec<MqttConnection>,
    received: &Arc<AtomicU64>,
    latency: &Arc<LatencyShards>,
) -> Vec<JoinHandle<()>> {
    subscribers
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let (received, mut rec) = (received.clone(), latency.recorder(i));
            tokio::spawn(async move {
                while let Ok(p) = c.read_packet().await {
                    let Packet::Publish(p) = p else { continue };
                    // `[{"ts", "values": {"t": <sent µs>}}]`
                    let Ok(v) = serde_json::from_slice::<Value>(&p.payload) else { continue };
                    let points = v.as_array().cloned().unwrap_or_default();
                    // The server typed the numeric text as a number.
                    let t = |r: &Value| r["values"]["t"].as_u64().or_else(|| r["values"]["t"].as_str()?.parse().ok());
                    let sent = points.iter().filter_map(t);
                    record(sent, &received, &mut rec);
                }
                rec.flush();
            })
        })
        .collect()
}
