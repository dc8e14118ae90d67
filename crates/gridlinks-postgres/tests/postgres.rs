//! The PostgreSQL time-series store against a real PostgreSQL (Debian's), started on a free
//! loopback port by `scripts/services/postgres.sh`: the conformance suite every backend
//! passes, redelivery stored once, months partitioned, and a database that goes away.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod service;

use gridlinks_postgres::PgTimeseries;
use gridlinks_storage::timeseries::conformance::run;
use gridlinks_storage::timeseries::Shared;
use gridlinks_storage::{StoreError, Timeseries};
use gridlinks_types::{DeviceId, Ts, TsRecord, Value};
use service::Postgres;

#[test]
fn postgres_passes_the_conformance_suite_and_recovers() {
    let pg = Postgres::start();
    let store = PgTimeseries::open(&pg.url, 4).unwrap();
    run(&store, &store, DeviceId::new_random(), DeviceId::new_random()).unwrap();
    // Opening again finds the schema in place.
    let store = PgTimeseries::open(&pg.url, 2).unwrap();

    // One batch of two devices, written twice (a redelivery): each point stored once.
    let (a, b) = (DeviceId::new_random(), DeviceId::new_random());
    let now = Ts::now().0;
    let recs = |v: i64| {
        vec![
            TsRecord { ts: Ts(now), values: vec![("x".into(), Value::Long(v))] },
            TsRecord { ts: Ts(now), values: vec![("x".into(), Value::Long(v + 1))] },
            // 1990: outside the partitioned window, kept in the default partition.
            TsRecord { ts: Ts(631_152_000_000), values: vec![("x".into(), Value::Long(v))] },
        ]
    };
    let (ra, rb) = (recs(1), recs(10));
    for _ in 0..2 {
        store.write(&[(a, &ra), (b, &rb)]).unwrap();
    }
    let count = |d: DeviceId| pg.psql(&format!("SELECT count(*) FROM gl_ts_kv WHERE device = '{}'", d.0));
    assert_eq!((count(a), count(b)), ("2".to_owned(), "2".to_owned()));
    // Of equal (device, key, ts) in a batch, the last one is kept.
    assert_eq!(store.latest(a, None).unwrap(), [("x".to_owned(), Ts(now), Value::Long(2))]);
    let parts = pg.psql("SELECT string_agg(relname, ',' ORDER BY relname) FROM pg_class WHERE relname LIKE 'gl_ts_kv_%' AND relkind = 'r'");
    assert!(parts.contains("gl_ts_kv_default"), "{parts}");
    assert_eq!(
        parts.split(',').filter(|p| p.chars().last().is_some_and(|c| c.is_ascii_digit())).count(),
        1,
        "one month's partition: {parts}"
    );
    assert_eq!(pg.psql(&format!("SELECT count(*) FROM gl_ts_kv_default WHERE device = '{}'", a.0)), "1");

    // The database gone: a clear error, no panic, no hang.
    pg.stop();
    match store.latest(a, None) {
        Err(StoreError::Database(m)) => assert!(m.contains("postgresql"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(store.write(&[(a, &ra)]), Err(StoreError::Database(_))));
}
