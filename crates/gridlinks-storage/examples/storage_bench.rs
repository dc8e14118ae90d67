//! Storage ceiling: points per second the embedded store sustains through the
//! group-commit writer, with no network or protocol work in front of it.
//!
//! `cargo run --release -p gridlinks-storage --example storage_bench -- [DEVICES] [SECONDS] [fsync|nosync]`
//!
//! DEVICES tasks each submit 5-value records with increasing timestamps as fast as
//! the writer acknowledges them (one request in flight per task).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gridlinks_storage::{SaveDevice, Store, StoreOptions, WriteOp, WriteOutcome, WriterConfig};
use gridlinks_types::{Ts, TsRecord, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let devices: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let secs: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10);
    let fsync = args.get(3).is_none_or(|a| a != "nosync");
    let dir = tempfile::tempdir()?;
    let store = Store::open(dir.path(), &StoreOptions::default())?;
    let (writer, join) = store.start_writer(WriterConfig { fsync, ..WriterConfig::default() })?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let points = Arc::new(AtomicU64::new(0));
    let started = rt.block_on(async {
        let mut ids = Vec::new();
        for i in 0..devices {
            let op = WriteOp::SaveDevice(SaveDevice {
                tenant: None,
                profile: None,
                id: None,
                name: format!("d{i}"),
                device_type: String::new(),
                label: None,
                token: None,
                additional_info: None,
            });
            if let Ok(WriteOutcome::Device(d)) = writer.submit(op).await {
                ids.push(d.id);
            }
        }
        let started = Instant::now();
        let deadline = started + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for id in ids {
            let w = writer.clone();
            let points = points.clone();
            tasks.push(tokio::spawn(async move {
                let mut ts = 1_700_000_000_000i64;
                while Instant::now() < deadline {
                    ts += 1000;
                    let values = ["temperature", "humidity", "pressure", "battery", "status"]
                        .iter()
                        .enumerate()
                        .map(|(i, k)| {
                            (
                                k.to_string(),
                                if i == 4 {
                                    Value::Str("ok".into())
                                } else {
                                    Value::Double(ts as f64 / 1e9 + i as f64)
                                },
                            )
                        })
                        .collect();
                    if w.submit(WriteOp::Telemetry {
                        device: id,
                        records: vec![TsRecord { ts: Ts(ts), values }].into(),
                    })
                    .await
                    .is_ok()
                    {
                        points.fetch_add(5, Ordering::Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        started
    });
    let elapsed = started.elapsed().as_secs_f64();
    let stats = writer.stats();
    let commits = stats.commits.load(Ordering::Relaxed);
    let sync_s = stats.sync_nanos.load(Ordering::Relaxed) as f64 / 1e9;
    let p = points.load(Ordering::Relaxed);
    println!(
        "devices={devices} fsync={fsync} points={p} elapsed={elapsed:.1}s -> {:.0} points/s ({:.0} msgs/s), {commits} commits, avg {:.1} msgs/commit, {:.2} ms avg sync",
        p as f64 / elapsed,
        p as f64 / 5.0 / elapsed,
        p as f64 / 5.0 / commits.max(1) as f64,
        sync_s * 1000.0 / commits.max(1) as f64
    );
    drop(writer);
    let _ = join.join();
    Ok(())
}
