//! The Cassandra time-series store against a real Apache Cassandra 5, started on free
//! loopback ports by `scripts/services/cassandra.sh`: the conformance suites every backend
//! and every shared backend pass, TTL, and a node that dies and comes back.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod service;

use gridlinks_cassandra::{CassandraSettings, CassandraTimeseries};
use gridlinks_storage::timeseries::conformance::{run, run_batches};
use gridlinks_storage::timeseries::Shared;
use gridlinks_storage::{StoreError, Timeseries};
use gridlinks_types::{DeviceId, Ts, TsRecord, Value};
use service::Cassandra;

fn settings(c: &Cassandra, keyspace: &str, ttl_days: u32) -> CassandraSettings {
    CassandraSettings {
        contact_points: vec![c.contact.clone()],
        keyspace: keyspace.into(),
        replication_factor: 1,
        ttl_days,
    }
}

#[test]
fn cassandra_passes_the_conformance_suite_and_recovers() {
    let c = Cassandra::start();
    let store = CassandraTimeseries::open(&settings(&c, "gl_test", 0)).unwrap();
    run(&store, &store, DeviceId::new_random(), DeviceId::new_random()).unwrap();
    // Opening again finds the schema in place.
    let store = CassandraTimeseries::open(&settings(&c, "gl_test", 0)).unwrap();
    store.ping().unwrap();

    let (a, b) = (DeviceId::new_random(), DeviceId::new_random());
    let now = Ts::now().0;
    run_batches(&store, a, b, now).unwrap();
    let ra = vec![TsRecord { ts: Ts(now), values: vec![("x".into(), Value::Long(2))] }];

    // TTL: points written with a TTL of a day carry it; those without do not.
    let ttl = CassandraTimeseries::open(&settings(&c, "gl_ttl", 1)).unwrap();
    ttl.write(&[(a, &ra)]).unwrap();
    let ttl_of = |ks: &str| {
        let cql = format!(
            "SELECT TTL(long_v) FROM {ks}.gl_ts_kv WHERE device = {} AND key = 'x' AND month = {} AND ts = {now}",
            a.0,
            gridlinks_storage::timeseries::month_of(now)
        );
        cql_one(&c, &cql)
    };
    let t = ttl_of("gl_ttl").expect("a TTL");
    assert!((86_000..=86_400).contains(&t), "{t}");
    assert_eq!(ttl_of("gl_test"), None);

    // The node killed: a clear error, no panic, no hang; back: the store works again.
    c.kill();
    match store.latest(a, None) {
        Err(StoreError::Database(m)) => assert!(m.contains("cassandra"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(store.write(&[(a, &ra)]), Err(StoreError::Database(_))));
    c.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while store.ping().is_err() {
        assert!(std::time::Instant::now() < deadline, "no reconnect within 60 s");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    store.write(&[(b, &ra)]).unwrap();
    assert_eq!(store.latest(b, None).unwrap(), [("x".to_owned(), Ts(now), Value::Long(2))]);
}

/// The first column of the first row of a CQL query, as an int (or none), by a client of
/// the test's own.
fn cql_one(c: &Cassandra, cql: &str) -> Option<i32> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let s = scylla::client::session_builder::SessionBuilder::new().known_node(&c.contact).build().await.unwrap();
        let r = s.query_unpaged(cql, ()).await.unwrap().into_rows_result().unwrap();
        r.maybe_first_row::<(Option<i32>,)>().unwrap().and_then(|r| r.0)
    })
}
