//! `provision`: devices provision themselves through ThingsBoard's provisioning API
//! (`POST /api/v1/provision`) on a GridLinks the tool starts. It creates `--profiles`
//! device profiles (`ALLOW_CREATE_NEW_DEVICES`, each with its own key and secret); then
//! `--connections` HTTP/1.1 keep-alive connections provision profiles × devices-per-profile
//! devices, one request in flight each. With `--tenants` each profile is in a tenant of its
//! own (the system administrator makes the tenants and their administrators, each of whom
//! makes its profile). Devices per second, per server CPU-second and the latency are
//! measured over that phase alone. Afterwards every returned token posts one
//! telemetry message: a token that does not work is counted as lost.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Context;
use bytes::BytesMut;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use super::http_telemetry::{read_response, read_response_body};
use crate::cli::ProvisionArgs;
use crate::proc_stats::ProcessStats;
use crate::report::LatencySummary;
use crate::rest_api::{ApiTarget, RestClient};
use crate::servers::{Binaries, ManagedServer};
use crate::stats::LatencyShards;

/// The run's figures.
#[derive(Debug, Serialize)]
pub struct ProvisionRun {
    /// Device profiles.
    pub profiles: usize,
    /// Whether each profile is in a tenant of its own.
    pub tenants: bool,
    /// Devices asked for.
    pub devices: usize,
    /// Connections.
    pub connections: usize,
    /// Devices provisioned (status SUCCESS).
    pub provisioned: usize,
    /// Requests answered otherwise, and the first such answer.
    pub refused: usize,
    /// The first refusal or error.
    pub first_error: Option<String>,
    /// Seconds of the provisioning phase.
    pub seconds: f64,
    /// Provisioned devices per second.
    pub devices_per_second: f64,
    /// Server CPU seconds during the phase.
    pub server_cpu_seconds: f64,
    /// Provisioned devices per server CPU-second.
    pub devices_per_cpu_second: f64,
    /// Request → answer latency.
    pub latency: LatencySummary,
    /// Returned tokens whose telemetry post got 200.
    pub tokens_working: usize,
}

/// Runs the scenario and prints its figures.
pub async fn run(args: ProvisionArgs) -> anyhow::Result<std::process::ExitCode> {
    let bins = Binaries::with_gridlinks(args.server.gridlinks_bin.as_deref());
    let server = ManagedServer::start_gridlinks_with(&bins, "", None).await.context("starting gridlinks")?;
    let (base, password) = server.api().context("gridlinks has an API")?;
    let addr: SocketAddr = base.trim_start_matches("http://").parse().context("the API address")?;
    let api = ApiTarget { base, user: "admin".into(), password };
    let (profiles, tenants) = (args.profiles, args.tenants);
    {
        let api = api.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let admin = RestClient::login(&api)?;
            let sys = RestClient::login(&ApiTarget { user: "sysadmin".into(), ..api.clone() })?;
            for p in 0..profiles {
                let rest = match tenants {
                    true => {
                        let email = format!("admin-{p}@bench.test");
                        RestClient::login(&sys.tenant_admin(
                            &format!("bench-tenant-{p}"),
                            None,
                            &email,
                            &api.password,
                        )?)?
                    }
                    false => admin.clone(),
                };
                rest.post_json(
                    "/api/deviceProfile",
                    &json!({
                        "name": format!("bench-profile-{p}"),
                        "provisionType": "ALLOW_CREATE_NEW_DEVICES",
                        "provisionDeviceKey": format!("bench-key-{p}"),
                        "profileData": {"provisionConfiguration": {
                            "type": "ALLOW_CREATE_NEW_DEVICES", "provisionDeviceSecret": format!("bench-secret-{p}")}},
                    }),
                )?;
            }
            Ok(())
        })
        .await??;
    }
    let total = profiles * args.devices_per_profile;
    let next = Arc::new(AtomicUsize::new(0));
    let latency = LatencyShards::new(16);
    let proc = ProcessStats::new(server.pid())?;
    let mut streams = Vec::with_capacity(args.connections);
    for i in 0..args.connections {
        streams.push(connect(addr, &args.server.sources, i).await?);
    }
    let cpu_start = proc.cpu_seconds()?;
    let started = Instant::now();
    let tasks: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, stream)| {
            let (next, latency, per) = (next.clone(), latency.clone(), args.devices_per_profile);
            tokio::spawn(async move { provision_loop(stream, addr, &next, total, per, latency.recorder(i)).await })
        })
        .collect();
    let mut results = Vec::with_capacity(args.connections);
    for t in tasks {
        results.push(t.await?);
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = proc.cpu_seconds()? - cpu_start;
    let (mut tokens, mut refused, mut first_error) = (Vec::with_capacity(total), 0, None);
    for (stream, outcome) in results {
        tokens.push((stream, outcome.tokens));
        refused += outcome.refused;
        if let Some(e) = outcome.first_error {
            first_error.get_or_insert(e);
        }
    }
    let provisioned: usize = tokens.iter().map(|(_, t)| t.len()).sum();
    // Each token once, over the same connections.
    let checks: Vec<_> = tokens
        .into_iter()
        .filter_map(|(stream, tokens)| stream.map(|s| tokio::spawn(use_tokens(s, addr, tokens))))
        .collect();
    let mut tokens_working = 0;
    for c in checks {
        tokens_working += c.await?;
    }
    server.stop().await?;
    let run = ProvisionRun {
        profiles,
        tenants,
        devices: total,
        connections: args.connections,
        provisioned,
        refused,
        first_error,
        seconds,
        devices_per_second: provisioned as f64 / seconds,
        server_cpu_seconds: cpu,
        devices_per_cpu_second: if cpu > 0.0 { provisioned as f64 / cpu } else { 0.0 },
        latency: LatencySummary::from_histogram(&latency.merged()),
        tokens_working,
    };
    println!(
        "provision: {} profiles{} × {} devices over {} connections\n\
         devices/s {:.0}  per server CPU-s {:.0}  p50 {:.2} ms  p99 {:.2} ms  provisioned {}/{}  tokens working {}",
        profiles,
        if tenants { " (one per tenant)" } else { "" },
        args.devices_per_profile,
        args.connections,
        run.devices_per_second,
        run.devices_per_cpu_second,
        run.latency.p50_us as f64 / 1000.0,
        run.latency.p99_us as f64 / 1000.0,
        run.provisioned,
        total,
        run.tokens_working,
    );
    if let Some(e) = &run.first_error {
        println!("first refusal: {e}");
    }
    if let Some(path) = &args.server.json {
        crate::report::write_json(path, &json!({"scenario": "provision", "run": run}))?;
    }
    Ok(crate::exit_code(run.provisioned == total && run.tokens_working == total))
}

async fn connect(addr: SocketAddr, sources: &[IpAddr], i: usize) -> anyhow::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    let source = sources.get(i % sources.len().max(1)).copied().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    socket.bind(SocketAddr::new(source, 0))?;
    let stream = socket.connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn request(addr: SocketAddr, path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What one connection provisioned.
struct Outcome {
    tokens: Vec<String>,
    refused: usize,
    first_error: Option<String>,
}

/// Takes device numbers from `next` until `total`, provisions each; the stream back (if
/// still usable) and what it got.
async fn provision_loop(
    mut stream: TcpStream,
    addr: SocketAddr,
    next: &AtomicUsize,
    total: usize,
    per_profile: usize,
    mut latency: crate::stats::LatencyRecorder,
) -> (Option<TcpStream>, Outcome) {
    let mut out = Outcome { tokens: Vec::new(), refused: 0, first_error: None };
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= total {
            return (Some(stream), out);
        }
        let p = n / per_profile;
        let body = json!({"deviceName": format!("bench-device-{n}"),
            "provisionDeviceKey": format!("bench-key-{p}"), "provisionDeviceSecret": format!("bench-secret-{p}")})
        .to_string();
        let sent = Instant::now();
        let answer = async {
            stream.write_all(&request(addr, "/api/v1/provision", &body)).await?;
            read_response_body(&mut stream, &mut buf).await
        }
        .await;
        latency.record(sent.elapsed());
        let (response, body) = match answer {
            Ok(a) => a,
            Err(e) => {
                out.refused += 1;
                out.first_error.get_or_insert(format!("device {n}: {e}"));
                return (None, out);
            }
        };
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        match answer["credentialsValue"].as_str().filter(|_| response.status == 200 && answer["status"] == "SUCCESS") {
            Some(token) => out.tokens.push(token.to_owned()),
            None => {
                out.refused += 1;
                out.first_error.get_or_insert(format!("device {n}: HTTP {} {answer}", response.status));
            }
        }
    }
}

/// Posts one telemetry message with each token; how many got 200.
async fn use_tokens(mut stream: TcpStream, addr: SocketAddr, tokens: Vec<String>) -> usize {
    let mut buf = BytesMut::with_capacity(4096);
    let mut working = 0;
    for token in tokens {
        let req = request(addr, &format!("/api/v1/{token}/telemetry"), r#"{"provisioned":1}"#);
        if stream.write_all(&req).await.is_err() {
            break;
        }
        match read_response(&mut stream, &mut buf).await {
            Ok(r) if r.status == 200 => working += 1,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    working
}
