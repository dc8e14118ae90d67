//! `ota-download`: N devices download one firmware package at once over MQTT, in chunks, as
//! ThingsBoard's device SDK does (`v2/fw/request/{id}/chunk/{n}` → `v2/fw/response/…`), from
//! a GridLinks the tool starts. The package is uploaded and assigned to the default device
//! profile over the REST API; each device then asks for its chunks one after another. Every
//! device's bytes are compared with the package: a device that got anything else is counted
//! as failed. Measured: bytes per second, chunk latency, server CPU and RSS.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use gridlinks_codec::mqtt::{Packet, ProtocolVersion, PubResp, Publish, PublishProperties, QoS};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use crate::cli::OtaDownloadArgs;
use crate::mqtt_client::{ClientOptions, Endpoint, MqttConnection};
use crate::proc_stats::ProcessStats;
use crate::report::LatencySummary;
use crate::rest_api::{random_tokens, ApiTarget, RestClient};
use crate::servers::{Binaries, ManagedServer};
use crate::stats::LatencyShards;

/// The run's figures.
#[derive(Debug, Serialize)]
pub struct OtaRun {
    /// Devices downloading at once.
    pub devices: usize,
    /// Package size, bytes.
    pub package_bytes: usize,
    /// Chunk size, bytes.
    pub chunk_bytes: usize,
    /// Devices that got the whole package, byte for byte.
    pub complete: usize,
    /// The first failure.
    pub first_error: Option<String>,
    /// Seconds from the first request to the last chunk.
    pub seconds: f64,
    /// Package bytes delivered per second, all devices.
    pub bytes_per_second: f64,
    /// Server CPU seconds during the downloads.
    pub server_cpu_seconds: f64,
    /// Server RSS before the downloads and at its highest during them, KiB.
    pub rss_before_kib: u64,
    /// The highest RSS sampled (every 100 ms) during the downloads, KiB.
    pub rss_peak_kib: u64,
    /// Chunk request → chunk latency.
    pub chunk_latency: LatencySummary,
}

/// Runs the scenario and prints its figures.
pub async fn run(args: OtaDownloadArgs) -> anyhow::Result<std::process::ExitCode> {
    let bins = Binaries::with_gridlinks(args.server.gridlinks_bin.as_deref());
    let server = ManagedServer::start_gridlinks_with(&bins, "", None).await.context("starting gridlinks")?;
    let (base, password) = server.api().context("gridlinks has an API")?;
    let api = ApiTarget { base: base.clone(), user: "admin".into(), password };
    let (n, size) = (args.devices, args.package_bytes);
    // Bytes no compression or dedup could help with, reproducible.
    let package: Bytes = (0..size).map(|i| ((i as u64).wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let tokens = random_tokens(n)?;
    {
        let (package, tokens) = (package.clone(), tokens.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let rest = RestClient::login(&api)?;
            let profile = rest.get_json("/api/deviceProfileInfo/default")?["id"]["id"].clone();
            let info = rest.post_json(
                "/api/otaPackage",
                &json!({"title": "bench-fw", "version": "1", "type": "FIRMWARE",
                    "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": profile}}),
            )?;
            let id = info["id"]["id"].as_str().context("package id")?.to_owned();
            ureq::post(&format!("{}/api/otaPackage/{id}?checksumAlgorithm=SHA256", api.base))
                .set("X-Authorization", &format!("Bearer {}", rest.token()))
                .set("Content-Type", "application/octet-stream")
                .send_bytes(&package)
                .context("uploading the package")?;
            let mut doc = rest.get_json(&format!("/api/deviceProfile/{}", profile.as_str().unwrap_or_default()))?;
            doc["firmwareId"] = json!({"entityType": "OTA_PACKAGE", "id": id});
            rest.post_json("/api/deviceProfile", &doc)?;
            let names: Vec<String> = (0..n).map(|i| format!("ota-bench-{i}")).collect();
            rest.bulk_import(&names, &tokens)
        })
        .await??;
    }
    let server_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, server.mqtt_port()));
    let mut conns = Vec::with_capacity(n);
    for (i, token) in tokens.iter().enumerate() {
        let opts = ClientOptions {
            client_id: format!("ota-bench-{i}"),
            username: Some(token.clone()),
            password: None,
            keep_alive: Duration::from_secs(120),
            version: ProtocolVersion::V5,
            connect_timeout: Duration::from_secs(30),
            session_expiry: None,
            // The GridLinks this scenario starts listens in plain MQTT.
            tls: None,
        };
        let source = args.server.sources.get(i % args.server.sources.len().max(1)).copied();
        conns.push(MqttConnection::connect(Endpoint { server: server_addr, source }, &opts).await?);
    }
    let proc = ProcessStats::new(server.pid())?;
    let before = proc.sample()?;
    let peak = Arc::new(AtomicU64::new(before.memory.rss_kib));
    let sampler = {
        let (peak, pid) = (peak.clone(), server.pid());
        tokio::spawn(async move {
            let Ok(p) = ProcessStats::new(pid) else { return };
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if let Ok(m) = p.memory() {
                    peak.fetch_max(m.rss_kib, Ordering::Relaxed);
                }
            }
        })
    };
    let latency = LatencyShards::new(16);
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, conn)| {
            let (package, latency, chunk) = (package.clone(), latency.clone(), args.chunk_bytes);
            tokio::spawn(async move { download(conn, &package, chunk, &latency, i).await })
        })
        .collect();
    let (mut complete, mut first_error) = (0, None);
    for t in tasks {
        match t.await? {
            Ok(()) => complete += 1,
            Err(e) => {
                first_error.get_or_insert(format!("{e:#}"));
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = proc.cpu_seconds()? - before.cpu_seconds;
    sampler.abort();
    server.stop().await?;
    let run = OtaRun {
        devices: n,
        package_bytes: size,
        chunk_bytes: args.chunk_bytes,
        complete,
        first_error,
        seconds,
        bytes_per_second: (complete * size) as f64 / seconds,
        server_cpu_seconds: cpu,
        rss_before_kib: before.memory.rss_kib,
        rss_peak_kib: peak.load(Ordering::Relaxed),
        chunk_latency: LatencySummary::from_histogram(&latency.merged()),
    };
    println!(
        "ota-download: {} devices × {} KiB in {} KiB chunks over MQTT\n\
         complete {}/{} in {:.2} s: {:.1} MiB/s  server CPU {:.2} s ({:.1} ms per MiB)  \
         RSS {:.1} MiB before, {:.1} MiB peak  chunk p50 {:.2} ms  p99 {:.2} ms{}",
        n,
        size / 1024,
        args.chunk_bytes / 1024,
        run.complete,
        n,
        seconds,
        run.bytes_per_second / 1_048_576.0,
        cpu,
        1000.0 * cpu / ((complete * size) as f64 / 1_048_576.0).max(f64::MIN_POSITIVE),
        run.rss_before_kib as f64 / 1024.0,
        run.rss_peak_kib as f64 / 1024.0,
        run.chunk_latency.p50_us as f64 / 1000.0,
        run.chunk_latency.p99_us as f64 / 1000.0,
        run.first_error.as_ref().map_or(String::new(), |e| format!("\nfirst failure: {e}")),
    );
    if let Some(path) = &args.server.json {
        std::fs::write(path, serde_json::to_vec_pretty(&run)?)?;
    }
    Ok(if run.complete == n { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::from(2) })
}

/// One device: every chunk in turn, each compared with the package.
async fn download(
    mut conn: MqttConnection,
    package: &Bytes,
    chunk: usize,
    latency: &LatencyShards,
    index: usize,
) -> anyhow::Result<()> {
    let chunks = package.len().div_ceil(chunk);
    let size = Bytes::from(chunk.to_string());
    for n in 0..chunks {
        let asked = Instant::now();
        conn.queue(&Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: format!("v2/fw/request/1/chunk/{n}"),
            packet_id: Some(u16::try_from(n % 65_535 + 1).unwrap_or(1)),
            payload: size.clone(),
            properties: PublishProperties::default(),
        }))?;
        conn.flush().await?;
        let want = format!("v2/fw/response/1/chunk/{n}");
        loop {
            match conn.read_packet().await? {
                Packet::Publish(p) if p.topic == want => {
                    let start = n * chunk;
                    let expected = &package[start..(start + chunk).min(package.len())];
                    anyhow::ensure!(p.payload == expected, "chunk {n}: {} bytes unlike the package's", p.payload.len());
                    if let Some(pid) = p.packet_id {
                        let ack =
                            PubResp { packet_id: pid, reason: 0, reason_string: None, user_properties: Vec::new() };
                        conn.queue(&Packet::PubAck(ack))?;
                    }
                    break;
                }
                Packet::PubAck(a) if a.reason >= 0x80 => anyhow::bail!("chunk {n} refused: reason {:#x}", a.reason),
                _ => {}
            }
        }
        latency.record(index, asked.elapsed());
    }
    conn.disconnect().await;
    Ok(())
}
