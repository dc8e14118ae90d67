//! Storage scenarios: each test opens a real store in a temp directory and drives it
//! through the writer thread, as the server does.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use gridlinks_storage::query::{Agg, HistoryQuery, Order};
use gridlinks_storage::{
    DeleteTelemetry, ImportRow, SaveDevice, SaveProfile, Store, StoreError, StoreOptions, WriteOp, WriteOutcome,
    WriterConfig, WriterHandle,
};
use gridlinks_types::{AttributeScope, DeviceId, Ts, TsRecord, Value};

fn open(dir: &std::path::Path) -> (Store, WriterHandle, std::thread::JoinHandle<()>) {
    let store = Store::open(dir, &StoreOptions::default()).unwrap();
    let (h, j) = store.start_writer(WriterConfig::default()).unwrap();
    (store, h, j)
}

async fn device(h: &WriterHandle, name: &str) -> DeviceId {
    match h
        .submit(WriteOp::SaveDevice(SaveDevice {
            name: name.into(),
            token: Some(format!("tok-{name}")),
            ..SaveDevice::default()
        }))
        .await
        .unwrap()
    {
        WriteOutcome::Device(d) => d.id,
        other => panic!("unexpected {other:?}"),
    }
}

fn rec(ts: i64, kv: &[(&str, Value)]) -> TsRecord {
    TsRecord { ts: Ts(ts), values: kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() }
}

fn all(keys: &[&str], agg: Agg, interval: i64) -> HistoryQuery {
    HistoryQuery {
        keys: keys.iter().map(|s| s.to_string()).collect(),
        start: Ts(0),
        end: Ts(1_000_000),
        interval,
        agg,
        limit: 1000,
        order: Order::Asc,
    }
}

#[tokio::test]
async fn same_point_twice_is_stored_once_and_rows_merge() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    let d = device(&h, "a").await;
    for _ in 0..2 {
        h.submit(WriteOp::Telemetry { device: d, records: vec![rec(10, &[("t", Value::Long(1))])].into() })
            .await
            .unwrap();
    }
    // A later message with another key at the same ts merges into the row.
    h.submit(WriteOp::Telemetry {
        device: d,
        records: vec![rec(10, &[("h", Value::Double(0.5))]), rec(20, &[("t", Value::Long(2))])].into(),
    })
    .await
    .unwrap();
    // Redelivery of the old point after newer ones must not duplicate it either.
    h.submit(WriteOp::Telemetry { device: d, records: vec![rec(10, &[("t", Value::Long(1))])].into() }).await.unwrap();
    let r = store.history(d, &all(&["t", "h"], Agg::None, 0)).unwrap();
    assert_eq!(
        r,
        vec![
            ("t".into(), vec![(Ts(10), Value::Long(1)), (Ts(20), Value::Long(2))]),
            ("h".into(), vec![(Ts(10), Value::Double(0.5))]),
        ]
    );
}

#[tokio::test]
async fn latest_follows_newest_ts_not_last_write() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    let d = device(&h, "a").await;
    for ts in [50, 70, 60] {
        h.submit(WriteOp::Telemetry { device: d, records: vec![rec(ts, &[("t", Value::Long(ts))])].into() })
            .await
            .unwrap();
    }
    assert_eq!(store.latest(d, None).unwrap(), vec![("t".into(), Ts(70), Value::Long(70))]);
}

#[tokio::test]
async fn aggregation_intervals_and_types() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    let d = device(&h, "a").await;
    let records =
        (0..10).map(|i| rec(i * 10, &[("l", Value::Long(i)), ("f", Value::Double(i as f64 / 2.0))])).collect();
    h.submit(WriteOp::Telemetry { device: d, records }).await.unwrap();
    let mut q = all(&["l", "f"], Agg::Sum, 50);
    q.end = Ts(100);
    let r = store.history(d, &q).unwrap();
    assert_eq!(r[0], ("l".into(), vec![(Ts(25), Value::Long(10)), (Ts(75), Value::Long(35))]));
    assert_eq!(r[1], ("f".into(), vec![(Ts(25), Value::Double(5.0)), (Ts(75), Value::Double(17.5))]));
    q.agg = Agg::Avg;
    assert_eq!(store.history(d, &q).unwrap()[0].1[0], (Ts(25), Value::Double(2.0)));
    q.agg = Agg::Max;
    assert_eq!(store.history(d, &q).unwrap()[0].1[1], (Ts(75), Value::Long(9)));
    q.agg = Agg::Count;
    q.order = Order::Desc;
    assert_eq!(store.history(d, &q).unwrap()[0].1, vec![(Ts(75), Value::Long(5)), (Ts(25), Value::Long(5))]);
    q.interval = 0;
    assert!(matches!(store.history(d, &q), Err(StoreError::Limit(_))));
}

#[tokio::test]
async fn delete_range_and_rewrite_latest() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    let d = device(&h, "a").await;
    let records = (1..=5).map(|i| rec(i, &[("t", Value::Long(i)), ("u", Value::Long(i))])).collect();
    h.submit(WriteOp::Telemetry { device: d, records }).await.unwrap();
    h.submit(WriteOp::DeleteTelemetry(DeleteTelemetry {
        device: d,
        keys: vec!["t".into()],
        range: Some((Ts(4), Ts(6))),
        delete_latest: true,
        rewrite_latest: true,
    }))
    .await
    .unwrap();
    let r = store.history(d, &all(&["t"], Agg::None, 0)).unwrap();
    assert_eq!(r[0].1.len(), 3);
    let latest = store.latest(d, None).unwrap();
    assert_eq!(latest[0], ("t".into(), Ts(3), Value::Long(3)));
    assert_eq!(latest[1], ("u".into(), Ts(5), Value::Long(5)));
    h.submit(WriteOp::DeleteTelemetry(DeleteTelemetry {
        device: d,
        keys: vec!["t".into(), "u".into()],
        range: None,
        delete_latest: true,
        rewrite_latest: false,
    }))
    .await
    .unwrap();
    assert!(store.history(d, &all(&["t", "u"], Agg::None, 0)).unwrap().is_empty());
    assert!(store.latest(d, None).unwrap().is_empty());
}

#[tokio::test]
async fn devices_names_tokens_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    let d = device(&h, "a").await;
    let dup = h
        .submit(WriteOp::SaveDevice(SaveDevice {
            tenant: None,
            profile: None,
            id: None,
            name: "a".into(),
            device_type: String::new(),
            label: None,
            token: None,
            additional_info: None,
        }))
        .await;
    assert!(matches!(dup, Err(StoreError::NameTaken(_))));
    assert_eq!(store.device_id_by_token("tok-a").unwrap(), Some(d));
    // The cached record follows a change of the device.
    assert_eq!(store.device_cached(d).unwrap().unwrap().label, None);
    h.submit(WriteOp::SaveDevice(SaveDevice {
        tenant: None,
        profile: None,
        id: Some(d),
        name: "a".into(),
        device_type: String::new(),
        label: Some("kitchen".into()),
        token: None,
        additional_info: None,
    }))
    .await
    .unwrap();
    assert_eq!(store.device_cached(d).unwrap().unwrap().label.as_deref(), Some("kitchen"));
    h.submit(WriteOp::Attributes {
        device: d,
        scope: AttributeScope::Shared,
        values: vec![("fw".into(), Value::Str("1.0".into()))],
    })
    .await
    .unwrap();
    assert_eq!(store.attributes(d, None, None).unwrap().len(), 1);
    h.submit(WriteOp::DeleteDevice(d)).await.unwrap();
    assert_eq!(store.device_id_by_token("tok-a").unwrap(), None);
    assert!(store.device(d).unwrap().is_none());
    assert!(store.device_cached(d).unwrap().is_none());
    assert!(store.attributes(d, None, None).unwrap().is_empty());
    let late = h.submit(WriteOp::Telemetry { device: d, records: vec![rec(1, &[("t", Value::Long(1))])].into() }).await;
    assert!(matches!(late, Err(StoreError::DeviceNotFound)));
}

#[tokio::test]
async fn import_creates_updates_and_reports_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    device(&h, "taken").await;
    let row = |line, name: &str, token: Option<&str>| ImportRow {
        line,
        name: name.into(),
        device_type: Some("sensor".into()),
        label: None,
        token: token.map(String::from),
        description: None,
        gateway: Some(true),
        shared: vec![("k".into(), Value::Long(line as i64))],
        server: vec![],
    };
    let rows = vec![
        row(2, "d1", Some("t1")),
        row(3, "d2", None),
        row(4, "d3", Some("t1")),        // token used by d1 in the same import
        row(5, "d4", Some("tok-taken")), // token of an existing device
        row(6, "d1", Some("t1")),        // same device again: an update
    ];
    let WriteOutcome::Import(out) = h.submit(WriteOp::Import { tenant: None, rows, update: true }).await.unwrap()
    else {
        panic!()
    };
    assert_eq!((out.created, out.updated), (2, 2 - 1));
    assert_eq!(out.errors.len(), 2, "{:?}", out.errors);
    assert!(out.errors[0].starts_with("Line 4:"));
    let d1 = store.device_by_name(None, "d1").unwrap().unwrap();
    assert_eq!(d1.device_type, "sensor");
    assert_eq!(d1.additional_info, Some(serde_json::json!({"gateway": true})));
    let attrs = store.attributes(d1.id, Some(AttributeScope::Shared), None).unwrap();
    assert_eq!(attrs[0].value, Value::Long(6));
    assert_eq!(store.devices().unwrap().len(), 3);
    // Without `update`, an existing device is still updated but its attributes are not.
    let rows = vec![row(2, "d1", None)];
    let WriteOutcome::Import(out) = h.submit(WriteOp::Import { tenant: None, rows, update: false }).await.unwrap()
    else {
        panic!()
    };
    assert_eq!((out.created, out.updated, out.errors.len()), (0, 1, 0));
    let attrs = store.attributes(d1.id, Some(AttributeScope::Shared), None).unwrap();
    assert_eq!(attrs[0].value, Value::Long(6));
    assert_eq!(store.device_id_by_token("t1").unwrap(), Some(d1.id));
}

#[tokio::test]
async fn acknowledged_writes_survive_reopen_and_concurrency_groups_commits() {
    let dir = tempfile::tempdir().unwrap();
    let d;
    {
        let (_store, h, j) = open(dir.path());
        d = device(&h, "a").await;
        let mut tasks = Vec::new();
        for t in 0..50i64 {
            let h = h.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..20 {
                    h.submit(WriteOp::Telemetry {
                        device: d,
                        records: vec![rec(t * 1000 + i, &[("v", Value::Long(i))])].into(),
                    })
                    .await
                    .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let stats = h.stats();
        let commits = stats.commits.load(std::sync::atomic::Ordering::Relaxed);
        assert!(commits < 1001, "1001 writes should share commits, got {commits}");
        drop(h);
        j.join().unwrap();
    }
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let r = store.history(d, &all(&["v"], Agg::Count, 1_000_000)).unwrap();
    assert_eq!(r[0].1[0].1, Value::Long(1000));
}

#[tokio::test]
async fn broker_rows_last_write_wins_per_round_and_survive_reopen() {
    use gridlinks_storage::{BrokerRow, BrokerTable};
    let dir = tempfile::tempdir().unwrap();
    let row = |table, key: &str, value: Option<&str>| BrokerRow {
        table,
        key: key.as_bytes().to_vec(),
        value: value.map(|v| v.as_bytes().to_vec()),
    };
    {
        let (store, h, j) = open(dir.path());
        h.submit(WriteOp::Broker(vec![
            row(BrokerTable::Retained, "a/b", Some("1")),
            row(BrokerTable::Retained, "a/b", Some("2")),
            row(BrokerTable::Retained, "gone", Some("x")),
            row(BrokerTable::Credentials, "a/b", Some("cred")),
        ]))
        .await
        .unwrap();
        h.submit(WriteOp::Broker(vec![row(BrokerTable::Retained, "gone", None)])).await.unwrap();
        assert_eq!(store.broker_row(BrokerTable::Credentials, b"a/b").unwrap().as_deref(), Some(&b"cred"[..]));
        drop(h);
        j.join().unwrap();
    }
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let rows = store.broker_rows(BrokerTable::Retained).unwrap();
    assert_eq!(rows, vec![(b"a/b".to_vec(), b"2".to_vec())], "tables do not mix; the later write won");
}

async fn save(h: &WriterHandle, name: &str, info: Option<serde_json::Value>) -> DeviceId {
    let op = WriteOp::SaveDevice(SaveDevice {
        tenant: None,
        profile: None,
        id: None,
        name: name.into(),
        device_type: String::new(),
        label: None,
        token: None,
        additional_info: info,
    });
    match h.submit(op).await.unwrap() {
        WriteOutcome::Device(d) => d.id,
        other => panic!("unexpected {other:?}"),
    }
}

async fn for_gateway(h: &WriterHandle, gateway: DeviceId, name: &str) -> Result<DeviceId, StoreError> {
    let op = WriteOp::GatewayDevice { gateway, name: name.into(), device_type: None, max_devices: 2, adopt: false };
    h.submit(op).await.map(|o| match o {
        WriteOutcome::Device(d) => d.id,
        other => panic!("unexpected {other:?}"),
    })
}

/// With adoption allowed a gateway takes a device of no gateway as its own (bound, and
/// counted against its bound); another gateway's device, a gateway, or a device whose profile
/// refuses adoption it does not.
#[tokio::test]
async fn gateways_adopt_devices_of_no_gateway_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, j) = open(dir.path());
    let adopt = |gateway, name: &str| WriteOp::GatewayDevice {
        gateway,
        name: name.into(),
        device_type: None,
        max_devices: 2,
        adopt: true,
    };
    let gw = save(&h, "gw", Some(serde_json::json!({"gateway": true}))).await;
    let gw2 = save(&h, "gw2", Some(serde_json::json!({"gateway": true}))).await;
    let plain = save(&h, "plain", Some(serde_json::json!({"description": "kept"}))).await;
    let WriteOutcome::Device(d) = h.submit(adopt(gw, "plain")).await.unwrap() else { panic!() };
    assert_eq!((d.id, d.gateway), (plain, Some(gw)));
    let stored = store.device(plain).unwrap().unwrap();
    assert_eq!(stored.gateway, Some(gw));
    let info = stored.additional_info.unwrap();
    assert_eq!(
        (info["description"].as_str(), info["lastConnectedGateway"].as_str()),
        (Some("kept"), Some(&*gw.to_string()))
    );
    assert_eq!(store.gateway_devices(gw).unwrap(), [plain]);
    // Never taken over by another gateway; a gateway is never adopted.
    assert!(matches!(h.submit(adopt(gw2, "plain")).await, Err(StoreError::ForeignDevice(_))));
    assert!(matches!(h.submit(adopt(gw, "gw2")).await, Err(StoreError::ForeignDevice(_))));
    // A profile that refuses adoption wins over the default.
    let locked = SaveProfile {
        id: None,
        tenant: None,
        name: "locked".into(),
        doc: serde_json::json!({"name": "locked", "gatewayAdoption": "REFUSE"}),
    };
    let WriteOutcome::Profile(locked) = h.submit(WriteOp::SaveProfile(locked)).await.unwrap() else { panic!() };
    let vault = SaveDevice { name: "vault".into(), profile: Some(locked.id), ..SaveDevice::default() };
    h.submit(WriteOp::SaveDevice(vault)).await.unwrap();
    assert!(matches!(h.submit(adopt(gw, "vault")).await, Err(StoreError::ForeignDevice(_))));
    // Adopted devices count against the gateway's bound.
    save(&h, "spare", None).await;
    h.submit(adopt(gw, "new-one")).await.unwrap();
    assert!(matches!(h.submit(adopt(gw, "spare")).await, Err(StoreError::Limit(_))));
    assert_eq!(store.device_by_name(None, "spare").unwrap().unwrap().gateway, None);
    drop(h);
    j.join().unwrap();
}

/// `max_devices_per_tenant` bounds every way devices are made, per tenant.
#[tokio::test]
async fn devices_per_tenant_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let (h, j) = store.start_writer(WriterConfig { max_devices_per_tenant: 3, ..WriterConfig::default() }).unwrap();
    let t = uuid::Uuid::new_v4();
    let dev = |tenant, name: &str, info: Option<serde_json::Value>| {
        WriteOp::SaveDevice(SaveDevice { tenant, name: name.into(), additional_info: info, ..SaveDevice::default() })
    };
    h.submit(dev(None, "a", None)).await.unwrap();
    let gw = match h.submit(dev(None, "gw", Some(serde_json::json!({"gateway": true})))).await.unwrap() {
        WriteOutcome::Device(d) => d.id,
        other => panic!("unexpected {other:?}"),
    };
    let row = |name: &str| ImportRow {
        line: 1,
        name: name.into(),
        device_type: None,
        label: None,
        token: None,
        description: None,
        gateway: None,
        shared: Vec::new(),
        server: Vec::new(),
    };
    let WriteOutcome::Import(out) =
        h.submit(WriteOp::Import { tenant: None, rows: vec![row("b"), row("c")], update: false }).await.unwrap()
    else {
        panic!()
    };
    assert_eq!((out.created, out.errors.len()), (1, 1), "{out:?}");
    assert!(out.errors[0].contains("max_devices_per_tenant"), "{out:?}");
    assert!(matches!(h.submit(dev(None, "d", None)).await, Err(StoreError::EntitiesLimit(_))));
    let sub = WriteOp::GatewayDevice { gateway: gw, name: "e".into(), device_type: None, max_devices: 10, adopt: true };
    assert!(matches!(h.submit(sub).await, Err(StoreError::EntitiesLimit(_))));
    // Updates are not creations; another tenant has its own bound.
    let a = store.device_by_name(None, "a").unwrap().unwrap().id;
    let update = SaveDevice { id: Some(a), name: "a".into(), label: Some("renamed".into()), ..SaveDevice::default() };
    h.submit(WriteOp::SaveDevice(update)).await.unwrap();
    h.submit(dev(Some(t), "a", None)).await.unwrap();
    // A deleted device frees its place.
    h.submit(WriteOp::DeleteDevice(a)).await.unwrap();
    h.submit(dev(None, "d", None)).await.unwrap();
    assert!(matches!(h.submit(dev(None, "f", None)).await, Err(StoreError::EntitiesLimit(_))));
    drop(h);
    j.join().unwrap();
}

#[tokio::test]
async fn gateways_own_the_devices_they_create_or_are_assigned_and_no_others() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, j) = open(dir.path());
    let gw = save(&h, "gw", Some(serde_json::json!({"gateway": true}))).await;
    let other_gw = save(&h, "gw2", Some(serde_json::json!({"gateway": true}))).await;
    let plain = save(&h, "plain", None).await;
    // Only a gateway may create or use sub-devices.
    assert!(matches!(for_gateway(&h, plain, "x").await, Err(StoreError::NotGateway)));
    // Created on first use, the same device afterwards.
    let child = for_gateway(&h, gw, "child").await.unwrap();
    assert_eq!(for_gateway(&h, gw, "child").await.unwrap(), child);
    assert_eq!(store.device(child).unwrap().unwrap().gateway, Some(gw));
    // Another gateway's device and a device of no gateway are refused.
    assert!(matches!(for_gateway(&h, other_gw, "child").await, Err(StoreError::ForeignDevice(n)) if n == "child"));
    assert!(matches!(for_gateway(&h, gw, "plain").await, Err(StoreError::ForeignDevice(_))));
    // The per-gateway bound: a second device, then no third.
    for_gateway(&h, gw, "child2").await.unwrap();
    assert!(matches!(for_gateway(&h, gw, "child3").await, Err(StoreError::Limit(_))));
    assert!(store.device_by_name(None, "child3").unwrap().is_none());
    // An administrator assigns a device; it then counts against that gateway.
    h.submit(WriteOp::AssignGateway { device: plain, gateway: Some(other_gw) }).await.unwrap();
    assert_eq!(for_gateway(&h, other_gw, "plain").await.unwrap(), plain);
    assert!(matches!(
        h.submit(WriteOp::AssignGateway { device: child, gateway: Some(plain) }).await,
        Err(StoreError::NotGateway)
    ));
    // A deleted gateway's devices belong to no gateway; ownership survives a reopen.
    h.submit(WriteOp::DeleteDevice(other_gw)).await.unwrap();
    assert_eq!(store.device(plain).unwrap().unwrap().gateway, None);
    assert!(store.gateway_devices(other_gw).unwrap().is_empty());
    drop(h);
    j.join().unwrap();
    drop(store);
    let (store, _h, _j) = open(dir.path());
    let mut owned = store.gateway_devices(gw).unwrap();
    owned.sort();
    let mut expected = vec![child, store.device_by_name(None, "child2").unwrap().unwrap().id];
    expected.sort();
    assert_eq!(owned, expected);
}

/// The engine's write path does not take the version-history lock (vendor/README.md): with
/// a tiny memtable, flushes, table registrations and compactions run all the time while
/// batches are committed and read back. Every acknowledged point is readable at once and
/// after reopening, and the latest values follow the newest points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_interleaved_with_constant_flushes_and_compactions_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions { memtable_bytes: 64 * 1024, ..StoreOptions::default() };
    let (devices, rounds, per_round) = (20usize, 200i64, 10i64);
    let ids;
    {
        let store = Store::open(dir.path(), &opts).unwrap();
        let (h, j) = store.start_writer(WriterConfig::default()).unwrap();
        let mut made = Vec::new();
        for n in 0..devices {
            made.push(device(&h, &format!("flush-{n}")).await);
        }
        ids = made;
        let mut tasks = Vec::new();
        for (n, &d) in ids.iter().enumerate() {
            let (h, store) = (h.clone(), store.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..rounds {
                    let ops = (0..per_round)
                        .map(|i| {
                            let ts = r * per_round + i + 1;
                            let pad = "x".repeat(64 + n);
                            WriteOp::Telemetry {
                                device: d,
                                records: vec![rec(ts, &[("v", Value::Long(ts)), ("pad", Value::Str(pad))])].into(),
                            }
                        })
                        .collect();
                    for res in h.submit_batch(ops).await.unwrap() {
                        res.unwrap();
                    }
                    // Acknowledged means readable, while tables come and go underneath.
                    let newest = r * per_round + per_round;
                    let latest = store.latest(d, Some(&["v".to_string()])).unwrap();
                    assert_eq!(latest[0].2, Value::Long(newest), "device {n} round {r}");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        drop(h);
        j.join().unwrap();
    }
    let store = Store::open(dir.path(), &opts).unwrap();
    let q = HistoryQuery { end: Ts(1_000_000), ..all(&["v"], Agg::Count, 1_000_000) };
    for &d in &ids {
        let r = store.history(d, &q).unwrap();
        assert_eq!(r[0].1[0].1, Value::Long(rounds * per_round), "every point survives reopening");
    }
}

/// Latest rows are checkpointed lazily: readers merge the checkpoint with newer points. A
/// late point older than the checkpoint, deletes that keep or drop the latest value, and a
/// crash (no final checkpoint) all leave the latest values exact.
#[tokio::test]
async fn latest_values_stay_exact_with_lazy_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let latest = |store: &Store, d| -> Vec<(String, i64, Value)> {
        store.latest(d, None).unwrap().into_iter().map(|(k, ts, v)| (k, ts.0, v)).collect()
    };
    let (store, h, j) = open(dir.path());
    let d = device(&h, "lazy").await;
    // 100 points (three checkpoints on the way), then one late point for a new key.
    for ts in 1..=100 {
        h.submit(WriteOp::Telemetry { device: d, records: vec![rec(ts, &[("a", Value::Long(ts))])].into() })
            .await
            .unwrap();
        assert_eq!(latest(&store, d), vec![("a".into(), ts, Value::Long(ts))]);
    }
    h.submit(WriteOp::Telemetry {
        device: d,
        records: vec![rec(5, &[("b", Value::Long(5)), ("a", Value::Long(-5))])].into(),
    })
    .await
    .unwrap();
    assert_eq!(latest(&store, d), vec![("a".into(), 100, Value::Long(100)), ("b".into(), 5, Value::Long(5))]);
    // Deleting the newest points without touching latest keeps it; with rewrite it moves back.
    let del = |keep: bool| DeleteTelemetry {
        device: d,
        keys: vec!["a".into()],
        range: Some((Ts(90), Ts(101))),
        delete_latest: !keep,
        rewrite_latest: true,
    };
    h.submit(WriteOp::DeleteTelemetry(del(true))).await.unwrap();
    assert_eq!(latest(&store, d)[0], ("a".into(), 100, Value::Long(100)));
    h.submit(WriteOp::DeleteTelemetry(del(false))).await.unwrap();
    assert_eq!(latest(&store, d)[0], ("a".into(), 89, Value::Long(89)));
    // More points after the delete, then a "crash": the writer never writes a final checkpoint.
    for ts in 200..210 {
        h.submit(WriteOp::Telemetry { device: d, records: vec![rec(ts, &[("a", Value::Long(ts))])].into() })
            .await
            .unwrap();
    }
    std::mem::forget(h);
    std::mem::forget(j);
    drop(store);
    // Let background flushes settle so that the copy is a consistent picture of the disk:
    // until the files stop changing, not for a guessed time.
    settle(dir.path());
    let dir2 = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), dir2.path());
    let store = Store::open(dir2.path(), &StoreOptions::default()).unwrap();
    assert_eq!(latest(&store, d), vec![("a".into(), 209, Value::Long(209)), ("b".into(), 5, Value::Long(5))]);
}

/// Waits until the files under `dir` (names and sizes) are the same in two looks 300 ms
/// apart; 60 s is a hang guard.
fn settle(dir: &std::path::Path) {
    fn look(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, u64)>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => look(&entry.path(), out),
                Ok(m) => out.push((entry.path(), m.len())),
                Err(_) => {} // removed meanwhile: the next look differs
            }
        }
    }
    let snapshot = || {
        let mut files = Vec::new();
        look(dir, &mut files);
        files.sort();
        files
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut before = snapshot();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = snapshot();
        if now == before {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{} kept changing", dir.display());
        before = now;
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Protocol identities: one device per (protocol, identity), kept across updates and
/// restarts, gone with the device; auto-provisioning finds or creates `{protocol}-{id}`.
#[tokio::test]
async fn protocol_identities() {
    use gridlinks_types::ProtocolIdentity;
    let dir = tempfile::tempdir().unwrap();
    let (store, h, j) = open(dir.path());
    let ident = |p: &str, id: &str| ProtocolIdentity { protocol: p.into(), id: id.into() };
    let a = device(&h, "a").await;
    let b = device(&h, "b").await;
    let set = |device, identity| WriteOp::SetIdentity { device, identity };
    h.submit(set(a, Some(ident("lamp", "000000000001")))).await.unwrap();
    assert_eq!(store.device_id_by_identity(&ident("lamp", "000000000001")).unwrap(), Some(a));
    // The same identity in another protocol is another credential.
    assert_eq!(store.device_id_by_identity(&ident("meter", "000000000001")).unwrap(), None);
    let taken = h.submit(set(b, Some(ident("lamp", "000000000001")))).await.unwrap_err();
    assert!(matches!(taken, StoreError::IdentityTaken(_)), "{taken:?}");
    let bad = h.submit(set(b, Some(ident("lamp", "has space")))).await.unwrap_err();
    assert!(matches!(bad, StoreError::Invalid(_)), "{bad:?}");
    // An update through the REST shape keeps the identity; the token still works.
    let save = SaveDevice {
        tenant: None,
        profile: None,
        id: Some(a),
        name: "a2".into(),
        device_type: String::new(),
        label: None,
        token: None,
        additional_info: None,
    };
    h.submit(WriteOp::SaveDevice(save)).await.unwrap();
    assert_eq!(store.device(a).unwrap().unwrap().identity, Some(ident("lamp", "000000000001")));
    assert_eq!(store.device_id_by_token("tok-a").unwrap(), Some(a));
    // Moving it to another identity frees the old one.
    h.submit(set(a, Some(ident("lamp", "000000000002")))).await.unwrap();
    assert_eq!(store.device_id_by_identity(&ident("lamp", "000000000001")).unwrap(), None);

    // Auto-provisioning: an existing identity is found, a new one creates lamp-{id}.
    let found = h.submit(WriteOp::ProtocolDevice {
        identity: ident("lamp", "000000000002"),
        device_type: "lamp".into(),
        max_devices: 100,
    });
    assert!(matches!(found.await.unwrap(), WriteOutcome::Device(d) if d.id == a));
    let created = match h
        .submit(WriteOp::ProtocolDevice {
            identity: ident("lamp", "000000000003"),
            device_type: "lamp".into(),
            max_devices: 100,
        })
        .await
        .unwrap()
    {
        WriteOutcome::Device(d) => d,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!((created.name.as_str(), created.device_type.as_str()), ("lamp-000000000003", "lamp"));
    assert_eq!(store.device_id_by_identity(&ident("lamp", "000000000003")).unwrap(), Some(created.id));
    // A device already named lamp-{id} without the identity is not taken over.
    device(&h, "lamp-000000000004").await;
    let clash = h.submit(WriteOp::ProtocolDevice {
        identity: ident("lamp", "000000000004"),
        device_type: "lamp".into(),
        max_devices: 100,
    });
    assert!(matches!(clash.await.unwrap_err(), StoreError::NameTaken(_)));
    assert_eq!(store.device_id_by_identity(&ident("lamp", "000000000004")).unwrap(), None);

    // A bound on the devices of a protocol: 2 hold a lamp identity now.
    let full = h.submit(WriteOp::ProtocolDevice {
        identity: ident("lamp", "000000000009"),
        device_type: "lamp".into(),
        max_devices: 2,
    });
    assert!(matches!(full.await.unwrap_err(), StoreError::Limit(_)));
    // The refused name clash above did not count: with room for 3, it is created.
    let room = h.submit(WriteOp::ProtocolDevice {
        identity: ident("lamp", "000000000009"),
        device_type: "lamp".into(),
        max_devices: 3,
    });
    let room = match room.await.unwrap() {
        WriteOutcome::Device(d) => d.id,
        other => panic!("unexpected {other:?}"),
    };
    h.submit(WriteOp::DeleteDevice(room)).await.unwrap();
    assert_eq!(store.identity_count("lamp").unwrap(), 2);
    assert_eq!(store.identity_count("meter").unwrap(), 0);
    // Deleting the device deletes its identity.
    h.submit(WriteOp::DeleteDevice(created.id)).await.unwrap();
    assert_eq!(store.device_id_by_identity(&ident("lamp", "000000000003")).unwrap(), None);
    drop(h);
    j.join().unwrap();
    drop(store);
    let (store, h, j) = open(dir.path());
    assert_eq!(store.device_id_by_identity(&ident("lamp", "000000000002")).unwrap(), Some(a));
    drop(h);
    j.join().unwrap();
}

/// Tenants: the same device name in two tenants, each found only in its own; each tenant
/// gets its own profiles (a type names the tenant's profile) and its own default; a
/// gateway's devices are of its tenant; all of it after a reopen too.
#[tokio::test]
async fn tenants_have_their_own_device_names_and_profiles() {
    let dir = tempfile::tempdir().unwrap();
    let t = uuid::Uuid::new_v4();
    let save = |tenant: Option<uuid::Uuid>, name: &str, ty: &str, token: &str, info: Option<serde_json::Value>| {
        WriteOp::SaveDevice(SaveDevice {
            tenant,
            profile: None,
            id: None,
            name: name.into(),
            device_type: ty.into(),
            label: None,
            token: Some(token.into()),
            additional_info: info,
        })
    };
    let (a, b, gw) = {
        let (store, h, _j) = open(dir.path());
        let dev = |o| match o {
            WriteOutcome::Device(d) => *d,
            other => panic!("unexpected {other:?}"),
        };
        let a = dev(h.submit(save(None, "pump", "boiler", "tok-a", None)).await.unwrap());
        let b = dev(h.submit(save(Some(t), "pump", "boiler", "tok-b", None)).await.unwrap());
        assert!(matches!(h.submit(save(Some(t), "pump", "", "tok-c", None)).await, Err(StoreError::NameTaken(_))));
        assert!(
            matches!(h.submit(save(Some(t), "other", "", "tok-a", None)).await, Err(StoreError::TokenTaken)),
            "tokens are unique across tenants: a device's token alone names it"
        );
        assert_ne!(a.profile_id(), b.profile_id(), "each tenant has its own 'boiler' profile");
        let profiles = store.profiles().unwrap();
        let of = |tenant| profiles.iter().filter(|p| p.tenant == tenant).count();
        assert_eq!(of(Some(t)), 1, "{profiles:?}");
        assert!(profiles.iter().any(|p| p.tenant == Some(t) && p.default), "the tenant's first profile is its default");
        assert_eq!(profiles.iter().filter(|p| p.default).count(), 2);
        // A profile id of another tenant is unknown here.
        let foreign = WriteOp::SaveDevice(SaveDevice {
            profile: Some(a.profile_id()),
            ..match save(Some(t), "x", "", "tok-x", None) {
                WriteOp::SaveDevice(s) => s,
                _ => unreachable!(),
            }
        });
        assert!(matches!(h.submit(foreign).await, Err(StoreError::ProfileNotFound(_))));
        let gw =
            dev(h.submit(save(Some(t), "gw", "", "tok-gw", Some(serde_json::json!({"gateway": true})))).await.unwrap());
        let op = WriteOp::GatewayDevice {
            gateway: gw.id,
            name: "pump".into(),
            device_type: None,
            max_devices: 10,
            adopt: false,
        };
        assert!(
            matches!(h.submit(op).await, Err(StoreError::ForeignDevice(_))),
            "the tenant's own 'pump' is not the gateway's"
        );
        let op = WriteOp::GatewayDevice {
            gateway: gw.id,
            name: "child".into(),
            device_type: None,
            max_devices: 10,
            adopt: false,
        };
        let child = dev(h.submit(op).await.unwrap());
        assert_eq!(child.tenant, Some(t));
        (a.id, b.id, gw.id)
    };
    let (store, _h, _j) = open(dir.path());
    assert_eq!(store.device_by_name(None, "pump").unwrap().unwrap().id, a);
    assert_eq!(store.device_by_name(Some(t), "pump").unwrap().unwrap().id, b);
    assert!(store.device_by_name(None, "child").unwrap().is_none());
    assert_eq!(store.device_by_name(Some(t), "child").unwrap().unwrap().gateway, Some(gw));
    assert_eq!(store.device_id_by_token("tok-b").unwrap(), Some(b));
}

/// The embedded store passes the suite every time-series backend passes.
#[test]
fn the_time_series_conformance_suite() {
    use gridlinks_storage::timeseries::conformance::{run, Writes};
    struct Embedded(WriterHandle, tokio::runtime::Runtime);
    impl Writes for Embedded {
        fn write(&self, device: DeviceId, records: Vec<TsRecord>) -> Result<(), StoreError> {
            self.1.block_on(self.0.submit(WriteOp::Telemetry { device, records: records.into() })).map(drop)
        }
        fn delete(&self, d: DeleteTelemetry) -> Result<(), StoreError> {
            self.1.block_on(self.0.submit(WriteOp::DeleteTelemetry(d))).map(drop)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (a, b) = rt.block_on(async { (device(&h, "a").await, device(&h, "b").await) });
    run(&store, &Embedded(h, rt), a, b).unwrap();
}

/// A shared setting is written once: the first value stays; one kept in `meta` by an older
/// version is taken over.
#[tokio::test]
async fn settings_are_written_once_and_taken_over_from_meta() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    store.meta_put("legacy", b"from-meta").unwrap();
    let set = |name: &str, value: &[u8]| {
        let op = WriteOp::SettingIfAbsent { name: name.into(), value: value.to_vec() };
        let h = h.clone();
        async move {
            match h.submit(op).await.unwrap() {
                WriteOutcome::Setting(v) => v,
                other => panic!("{other:?}"),
            }
        }
    };
    assert_eq!(set("legacy", b"made").await, b"from-meta");
    assert_eq!(set("fresh", b"first").await, b"first");
    assert_eq!(set("fresh", b"second").await, b"first");
    assert_eq!(store.setting("fresh").unwrap().as_deref(), Some(&b"first"[..]));
    assert_eq!(store.setting("legacy").unwrap().as_deref(), Some(&b"from-meta"[..]));
}

/// The outbox takes what the filter wants, only once it is committed, numbered in commit
/// order; a failed write leaves nothing; numbers go on after a restart and a trim.
#[tokio::test]
async fn outbox_holds_committed_wanted_writes_in_order_across_restarts_and_trims() {
    use gridlinks_storage::{DocKind, OutboxEvent, OutboxFilter};
    use std::sync::Arc;
    struct Only(DeviceId);
    impl OutboxFilter for Only {
        fn wants(&self, op: &WriteOp) -> bool {
            match op {
                WriteOp::Telemetry { device, .. } | WriteOp::Attributes { device, .. } => *device == self.0,
                WriteOp::PutDoc { kind, .. } => *kind == DocKind::Alarm,
                _ => false,
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let alarm = uuid::Uuid::new_v4();
    let a;
    {
        let (store, h, j) = open(dir.path());
        a = device(&h, "a").await;
        let b = device(&h, "b").await;
        // No filter: nothing is copied.
        h.submit(WriteOp::Telemetry { device: a, records: vec![rec(1, &[("v", Value::Long(1))])].into() })
            .await
            .unwrap();
        assert_eq!(store.outbox_bounds(), (1, 1));
        store.set_outbox_filter(Some(Arc::new(Only(a))));
        let mut durable = store.outbox_durable();
        let ops = vec![
            WriteOp::Telemetry { device: a, records: vec![rec(2, &[("v", Value::Long(2))])].into() },
            WriteOp::Telemetry { device: b, records: vec![rec(2, &[("v", Value::Long(2))])].into() },
            // A device that does not exist: refused, so not in the outbox.
            WriteOp::Telemetry { device: DeviceId(uuid::Uuid::new_v4()), records: vec![rec(2, &[])].into() },
            WriteOp::Attributes {
                device: a,
                scope: AttributeScope::Client,
                values: vec![("fw".into(), Value::Str("1".into()))],
            },
            WriteOp::PutDoc {
                kind: DocKind::Alarm,
                id: alarm,
                title: "Hot".into(),
                doc: serde_json::json!({"severity": "MAJOR"}),
            },
            WriteOp::Telemetry { device: a, records: vec![rec(3, &[("v", Value::Long(3))])].into() },
        ];
        let results = h.submit_batch(ops).await.unwrap();
        assert!(results[2].is_err());
        assert_eq!(*durable.borrow_and_update(), 4);
        let got = store.outbox_read(0, 4, 100).unwrap();
        let seqs: Vec<u64> = got.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
        assert!(
            matches!(&got[0].event, OutboxEvent::Telemetry { device, records } if *device == a && records[0].ts == Ts(2))
        );
        assert!(matches!(&got[1].event, OutboxEvent::Attributes { device, .. } if *device == a));
        assert!(matches!(&got[2].event, OutboxEvent::Alarm { id, title, .. } if *id == alarm && title == "Hot"));
        assert!(matches!(&got[3].event, OutboxEvent::Telemetry { records, .. } if records[0].ts == Ts(3)));
        assert_eq!(store.outbox_read(2, 3, 100).unwrap().len(), 1, "reads stop at `upto`");
        store.set_outbox_cursor("r", 2).unwrap();
        let trimmed = store.outbox_trim(3).unwrap();
        assert_eq!((trimmed.tail, trimmed.removed), (3, 2));
        drop(h);
        j.join().unwrap();
    }
    let (store, h, j) = open(dir.path());
    assert_eq!(store.outbox_bounds(), (3, 5), "the tail and the numbering survive a restart");
    assert_eq!(store.outbox_cursor("r").unwrap(), Some(2));
    assert_eq!(store.outbox_read(0, 10, 100).unwrap().len(), 2);
    store.set_outbox_filter(Some(Arc::new(Only(a))));
    h.submit(WriteOp::Telemetry { device: a, records: vec![rec(4, &[("v", Value::Long(4))])].into() }).await.unwrap();
    assert_eq!(store.outbox_read(4, 10, 100).unwrap()[0].seq, 5);
    // Trimming everything, then restarting, keeps the numbers growing.
    store.outbox_trim(u64::MAX).unwrap();
    drop((store, h));
    j.join().unwrap();
    let (store, _h, _j) = open(dir.path());
    assert_eq!(store.outbox_bounds(), (6, 6));
    assert!(store.outbox_read(0, 10, 100).unwrap().is_empty());
}

#[tokio::test]
async fn documents_written_together_are_one_write_and_only_of_kinds_without_unique_titles() {
    let dir = tempfile::tempdir().unwrap();
    let (store, h, _j) = open(dir.path());
    let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let docs = vec![(a, "a".into(), serde_json::json!({"n": 1})), (b, "b".into(), serde_json::json!({"n": 2}))];
    h.submit(WriteOp::PutDocs { kind: gridlinks_storage::DocKind::AlarmRuleState, docs }).await.unwrap();
    assert_eq!(store.doc(gridlinks_storage::DocKind::AlarmRuleState, b).unwrap().unwrap().doc["n"], 2);
    assert_eq!(store.docs(gridlinks_storage::DocKind::AlarmRuleState).unwrap().len(), 2);
    let not_object = vec![(a, "a".into(), serde_json::json!([1]))];
    let r = h.submit(WriteOp::PutDocs { kind: gridlinks_storage::DocKind::AlarmRuleState, docs: not_object }).await;
    assert!(matches!(r, Err(StoreError::Invalid(_))), "{r:?}");
    let unique = vec![(a, "x".into(), serde_json::json!({}))];
    let r = h.submit(WriteOp::PutDocs { kind: gridlinks_storage::DocKind::Customer, docs: unique }).await;
    assert!(matches!(r, Err(StoreError::Invalid(_))), "{r:?}");
    assert!(store.doc(gridlinks_storage::DocKind::Customer, a).unwrap().is_none());
}
