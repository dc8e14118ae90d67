//! The ingest boundary over a real embedded store (temp directory, the real writer thread).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::sync::{Arc, Mutex};

use gridlinks_ingest::{BoxFuture, Embedded, Ingest, IngestError, Item, LiveData};
use gridlinks_storage::{SaveDevice, Store, StoreError, StoreOptions, WriteOp, WriteOutcome, WriterConfig};
use gridlinks_types::{AttributeScope, DeviceId, Ts, TsRecord, Value};

/// Records what reached live fan-out; fails on demand.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(DeviceId, usize)>>,
    fail: bool,
}

impl LiveData for Recorder {
    fn wants_telemetry(&self) -> bool {
        true
    }
    fn telemetry(&self, committed: Vec<(DeviceId, Arc<[TsRecord]>)>) -> BoxFuture<'_, Result<(), StoreError>> {
        self.seen.lock().unwrap().extend(committed.iter().map(|(d, r)| (*d, r.len())));
        let fail = self.fail;
        Box::pin(async move {
            if fail {
                Err(StoreError::Overloaded)
            } else {
                Ok(())
            }
        })
    }
}

fn point(ts: i64) -> Vec<TsRecord> {
    vec![TsRecord { ts: Ts(ts), values: vec![("t".into(), Value::Long(ts))] }]
}

#[tokio::test]
async fn a_batch_gets_one_result_per_item_and_only_committed_telemetry_goes_live() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    let (writer, join) = store.start_writer(WriterConfig::default()).unwrap();
    let save = SaveDevice {
        tenant: None,
        profile: None,
        id: None,
        name: "d".into(),
        device_type: String::new(),
        label: None,
        token: Some("TOKEN".into()),
        additional_info: None,
    };
    let WriteOutcome::Device(d) = writer.submit(WriteOp::SaveDevice(save)).await.unwrap() else { panic!() };
    for fail in [false, true] {
        let live = Arc::new(Recorder { fail, ..Recorder::default() });
        let ingest = Ingest::new(store.clone(), Arc::new(Embedded(writer.clone())), live.clone(), 10);
        assert_eq!(ingest.authenticate("TOKEN"), Ok(d.id));
        assert_eq!(ingest.authenticate("nope"), Err(IngestError::BadCredential));
        let gone = DeviceId::from_bytes([7; 16]);
        let results = ingest
            .submit(vec![
                Item::Telemetry { device: d.id, records: point(1) },
                Item::Telemetry { device: gone, records: point(2) },
                Item::Attributes {
                    device: d.id,
                    scope: AttributeScope::Client,
                    values: vec![("a".into(), Value::Bool(true))],
                },
                Item::Telemetry { device: d.id, records: point(3) },
            ])
            .await;
        let overloaded = Err(IngestError::Overloaded);
        let telemetry_ok = if fail { overloaded.clone() } else { Ok(()) };
        assert_eq!(results, vec![telemetry_ok.clone(), Err(IngestError::DeviceGone), Ok(()), telemetry_ok]);
        // The unknown device's telemetry never reached live fan-out.
        assert_eq!(*live.seen.lock().unwrap(), vec![(d.id, 1), (d.id, 1)]);
    }
    // Every committed point is stored, whatever live fan-out said.
    assert_eq!(store.latest(d.id, None).unwrap()[0].2, Value::Long(3));
    drop(writer);
    join.join().unwrap();
}
