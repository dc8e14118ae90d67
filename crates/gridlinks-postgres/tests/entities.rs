//! Shared entities (`cluster.entities = "postgres"`) against a real PostgreSQL: two or three
//! stores, each the embedded store of a node with its own writer, follow one replica. What
//! one node writes the others see; a name or token taken on one node is taken on all, also
//! under concurrent writes from two nodes; removals, documents and attributes travel; a node
//! restarted, or new, catches up; a database that goes away fails writes and leaves the
//! node's store as it was.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod service;

use gridlinks_postgres::PgReplica;
use gridlinks_storage::{
    DocKind, SaveDevice, Store, StoreError, StoreOptions, WriteOp, WriteOutcome, WriterConfig, WriterHandle,
};
use gridlinks_types::{AttributeScope, DeviceId, Value};
use service::Postgres;

/// Creates device `name` with access token `token`.
fn new_device(name: &str, token: &str) -> WriteOp {
    WriteOp::SaveDevice(SaveDevice { name: name.into(), token: Some(token.into()), ..SaveDevice::default() })
}

struct Node {
    store: Store,
    writer: WriterHandle,
    thread: std::thread::JoinHandle<()>,
}

impl Node {
    fn open(dir: &std::path::Path, url: &str) -> Self {
        let store = Store::open(dir, &StoreOptions::default()).unwrap();
        // The blocking client runs its own runtime: not on one of the test's.
        let replica = tokio::task::block_in_place(|| PgReplica::open(url)).unwrap();
        store.attach_replica(Box::new(replica)).unwrap();
        let (writer, thread) = store.start_writer(WriterConfig::default()).unwrap();
        Self { store, writer, thread }
    }

    async fn catch_up(&self) {
        self.writer.submit(WriteOp::CatchUp).await.unwrap();
    }

    async fn save(&self, name: &str, token: &str) -> Result<DeviceId, StoreError> {
        match self.writer.submit(new_device(name, token)).await? {
            WriteOutcome::Device(d) => Ok(d.id),
            other => panic!("{other:?}"),
        }
    }

    /// Stops the writer and closes the store (and its connection, off the runtime).
    fn close(self) {
        tokio::task::block_in_place(move || {
            drop(self.writer);
            self.thread.join().unwrap();
            drop(self.store);
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_share_devices_documents_and_attributes_through_postgres() {
    let pg = Postgres::start();
    let tmp = tempfile::tempdir().unwrap();
    let a = Node::open(&tmp.path().join("a"), &pg.url);
    let b = Node::open(&tmp.path().join("b"), &pg.url);

    // A device made on A authenticates on B once B has caught up.
    let d1 = a.save("d1", "tok1").await.unwrap();
    assert_eq!(b.store.device_id_by_token("tok1").unwrap(), None, "not before B caught up");
    b.catch_up().await;
    assert_eq!(b.store.device_id_by_token("tok1").unwrap(), Some(d1));
    assert_eq!(b.store.device(d1).unwrap().unwrap().name, "d1");

    // A write on B checks against what A wrote, without an explicit catch-up first.
    a.save("d2", "tok2").await.unwrap();
    assert!(matches!(b.save("d2", "other").await, Err(StoreError::NameTaken(_))));
    assert!(matches!(b.save("d3", "tok2").await, Err(StoreError::TokenTaken)));

    // Both nodes create the same names at once: each name is created exactly once.
    let (wa, wb) = (a.writer.clone(), b.writer.clone());
    let mut tasks = Vec::new();
    for i in 0..20 {
        for (node, w) in [("a", wa.clone()), ("b", wb.clone())] {
            tasks.push(tokio::spawn(async move {
                (i, w.submit(new_device(&format!("race-{i}"), &format!("race-{node}-{i}"))).await)
            }));
        }
    }
    let mut created = [0; 20];
    for t in tasks {
        match t.await.unwrap() {
            (i, Ok(_)) => created[i] += 1,
            (_, Err(StoreError::NameTaken(_))) => {}
            (_, Err(e)) => panic!("{e}"),
        }
    }
    assert_eq!(created, [1; 20], "each name once");
    drop((wa, wb));
    a.catch_up().await;
    b.catch_up().await;
    let names = |s: &Store| {
        let mut n: Vec<String> = s.devices().unwrap().into_iter().map(|d| d.name).collect();
        n.sort();
        n
    };
    assert_eq!(names(&a.store), names(&b.store));
    assert_eq!(a.store.device_count().unwrap(), 22);

    // A removal travels, and B's token cache lets go of the token.
    assert!(b.store.device_id_by_token("tok2").unwrap().is_some(), "cached on B");
    let d2 = a.store.device_by_name(None, "d2").unwrap().unwrap().id;
    a.writer.submit(WriteOp::DeleteDevice(d2)).await.unwrap();
    b.catch_up().await;
    assert_eq!(b.store.device_id_by_token("tok2").unwrap(), None);
    assert!(b.store.device(d2).unwrap().is_none());

    // Documents and attributes.
    let customer = match b
        .writer
        .submit(WriteOp::SaveDoc {
            kind: DocKind::Customer,
            id: None,
            title: "Acme".into(),
            doc: serde_json::json!({}),
        })
        .await
        .unwrap()
    {
        WriteOutcome::Doc(d) => d.id,
        other => panic!("{other:?}"),
    };
    let values = vec![("fw".to_owned(), Value::Str("1.2".into()))];
    b.writer.submit(WriteOp::Attributes { device: d1, scope: AttributeScope::Shared, values }).await.unwrap();
    a.catch_up().await;
    assert_eq!(a.store.doc(DocKind::Customer, customer).unwrap().unwrap().title, "Acme");
    let attrs = a.store.attributes(d1, Some(AttributeScope::Shared), None).unwrap();
    assert_eq!(attrs.len(), 1);
    assert_eq!(attrs[0].value, Value::Str("1.2".into()));
    // A's caches of documents know they are stale.
    assert!(a.store.remote_generation("docs") > 0);
    assert_eq!(b.store.remote_generation("docs"), 0, "a node's own writes are not remote");

    // A compare-and-set of a shared setting (a login's refresh) raced on both nodes: one
    // wins each round, and the loser sees the winner's value.
    let swap = |w: WriterHandle, expect: &str, value: String| {
        let op = WriteOp::SwapSetting {
            name: "cas".into(),
            expect: Some(expect.as_bytes().to_vec()),
            value: Some(value.into_bytes()),
        };
        tokio::spawn(async move {
            match w.submit(op).await.unwrap() {
                WriteOutcome::Swapped(done) => done,
                other => panic!("{other:?}"),
            }
        })
    };
    let first = WriteOp::SwapSetting { name: "cas".into(), expect: None, value: Some(b"0".to_vec()) };
    assert!(matches!(a.writer.submit(first).await.unwrap(), WriteOutcome::Swapped(true)));
    for round in 0..10 {
        let now = round.to_string();
        let (ta, tb) = (
            swap(a.writer.clone(), &now, format!("{}", round + 1)),
            swap(b.writer.clone(), &now, format!("{}", round + 1)),
        );
        let won = [ta.await.unwrap(), tb.await.unwrap()];
        assert_eq!(won.iter().filter(|w| **w).count(), 1, "round {round}: {won:?}");
    }
    b.catch_up().await;
    assert_eq!(b.store.setting("cas").unwrap().as_deref(), Some(&b"10"[..]));

    // B restarts on its data: it goes on from the version it had.
    b.close();
    a.save("after-restart", "tok-ar").await.unwrap();
    let b = Node::open(&tmp.path().join("b"), &pg.url);
    b.catch_up().await;
    assert!(b.store.device_id_by_token("tok-ar").unwrap().is_some());
    assert_eq!(names(&a.store), names(&b.store));
    // A new node gets everything.
    let c = Node::open(&tmp.path().join("c"), &pg.url);
    c.catch_up().await;
    assert_eq!(names(&a.store), names(&c.store));
    assert_eq!(c.store.device_id_by_token("tok1").unwrap(), Some(d1));

    // The database goes away: a write fails with the reason and the node's store is left as
    // it was; back, writes go on.
    pg.stop();
    let e = a.save("while-down", "tok-wd").await.unwrap_err();
    assert!(matches!(e, StoreError::Database(_)), "{e}");
    assert!(a.store.device_by_name(None, "while-down").unwrap().is_none());
    pg.restart();
    let mut saved = None;
    // Until writes resume: 60 s is a hang guard.
    for _ in 0..600 {
        if let Ok(id) = a.save("while-down", "tok-wd").await {
            saved = Some(id);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let id = saved.expect("writes did not resume");
    c.catch_up().await;
    assert_eq!(c.store.device_id_by_token("tok-wd").unwrap(), Some(id));
    for n in [a, b, c] {
        n.close();
    }
}
