//! The PostgreSQL time-series store against a real PostgreSQL (Debian's), started on a free
//! loopback port by `scripts/services/postgres.sh`: the conformance suites every backend
//! and every shared backend pass, months partitioned, and a database that goes away.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod service;

use gridlinks_postgres::PgTimeseries;
use gridlinks_storage::timeseries::conformance::{run, run_batches};
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

    let (a, b) = (DeviceId::new_random(), DeviceId::new_random());
    let now = Ts::now().0;
    run_batches(&store, a, b, now).unwrap();
    let ra = vec![TsRecord { ts: Ts(now), values: vec![("x".into(), Value::Long(2))] }];
    let count = |d: DeviceId| pg.psql(&format!("SELECT count(*) FROM gl_ts_kv WHERE device = '{}'", d.0));
    assert_eq!((count(a), count(b)), ("4".to_owned(), "3".to_owned()));
    let parts = pg.psql("SELECT string_agg(relname, ',' ORDER BY relname) FROM pg_class WHERE relname LIKE 'gl_ts_kv_%' AND relkind = 'r'");
    assert!(parts.contains("gl_ts_kv_default"), "{parts}");
    assert_eq!(
        parts.split(',').filter(|p| p.chars().last().is_some_and(|c| c.is_ascii_digit())).count(),
        2,
        "two months' partitions (now and 62 days back): {parts}"
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
