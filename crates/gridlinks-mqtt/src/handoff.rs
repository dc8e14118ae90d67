//! With several nodes, one MQTT client id has one session in the cluster. A persistent
//! session is held by one node (its row's `home`): that node alone loads it at start,
//! queues copies for it and expires it. A client that connects to another node takes it
//! over there, through the Kafka bus (no node-to-node call):
//!
//! 1. the new node catches up with the shared entities and restores the session as stored
//!    (subscriptions, queued copies, QoS 2 ids), numbering its own new copies far above
//!    the stored ones: from now on it queues what is published for the client too;
//! 2. it says on the bus that the client connected here ([`BrokerRecord::SessionTaken`]);
//!    every other node ends its session of that client id (a live connection there is
//!    closed as taken over), and the holder answers once everything it stored for the
//!    session is committed ([`BrokerRecord::SessionReleased`]);
//! 3. the new node catches up again and takes the session's stored copies as they are now
//!    (the holder queued some meanwhile, its client acknowledged others there), before its
//!    own; then the CONNECT goes on (resumed, or discarded for a clean start) and the
//!    session's row names the new node.
//!
//! A message published during the move may reach the client twice (both nodes queued it):
//! at least once, as QoS 1 has it. A holder that does not answer within
//! `cluster.session_handoff` (it died) leaves the session as stored: its rows reached
//! PostgreSQL before its own store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gridlinks_broker::sessions::StoredSession;
use gridlinks_kafka::bus::{BrokerRecord, Takeover};
use gridlinks_storage::{StoreError, WriteOp};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::{pubsub, Mqtt};

/// New copies of a session that moved here are numbered from this far above the highest
/// stored one: the node it left may still queue a few below.
const SEQ_JUMP: u64 = 1 << 32;

/// This node's takeovers waiting for the holder to let go, by number.
#[derive(Default)]
pub struct Handoffs {
    waiting: Mutex<HashMap<u64, oneshot::Sender<()>>>,
    next: AtomicU64,
}

impl Handoffs {
    fn start(&self) -> (u64, oneshot::Receiver<()>) {
        let request = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().insert(request, tx);
        (request, rx)
    }

    /// Stops waiting for takeover `request`.
    fn forget(&self, request: u64) {
        self.waiting.lock().remove(&request);
    }

    /// The holder let go of the session takeover `request` asked for.
    pub fn released(&self, request: u64) {
        if let Some(tx) = self.waiting.lock().remove(&request) {
            let _ = tx.send(());
        }
    }
}

/// `client`'s stored session as this node's store holds it now.
async fn stored(st: &Mqtt, client: &str) -> Result<Option<(Option<String>, StoredSession)>, StoreError> {
    let (store, id) = (st.core.store.clone(), client.to_owned());
    tokio::task::spawn_blocking(move || pubsub::read_session(&store, &id)).await.map_err(|_| StoreError::Closed)?
}

/// Before pub/sub client `client`'s session is registered here: takes it over from the
/// node holding it, and ends any session of the client id on other nodes. Nothing to do
/// with one node, or when this node holds the session already.
pub async fn take_over(st: &Arc<Mqtt>, client: &str) -> Result<(), StoreError> {
    let Some(bus) = &st.core.bus else { return Ok(()) };
    if st.devices.sessions.holds_client(client) {
        return Ok(());
    }
    st.core.writer.submit(WriteOp::CatchUp).await?;
    let me = bus.node_id();
    let mut home = String::new();
    let mut below = None;
    if let Some((holder, mut session)) = stored(st, client).await? {
        home = holder.filter(|h| h != me).unwrap_or_default();
        let highest = session.queued.iter().filter_map(|o| o.seq).max().unwrap_or(0);
        below = Some(highest.saturating_add(SEQ_JUMP));
        session.numbered_from = below;
        st.devices.sessions.restore_client(client, session, st.core.cfg.mqtt.client_outbound_queue);
    }
    let (request, released) = st.handoffs.start();
    let taken = BrokerRecord::SessionTaken(Takeover {
        client: client.to_owned(),
        by: me.to_owned(),
        home: home.clone(),
        request,
    });
    let sent = async { bus.send(client.as_bytes(), &taken)?.await }.await;
    if sent.is_err() || home.is_empty() {
        st.handoffs.forget(request);
        if sent.is_err() {
            // Not taken over: the holder keeps it.
            st.devices.sessions.evict_client(client);
        }
        return sent;
    }
    let wait = st.core.cfg.cluster.session_handoff.duration();
    if tokio::time::timeout(wait, released).await.is_err() {
        st.handoffs.forget(request);
        tracing::warn!(client, node = %home, "the node holding the session did not let it go in time; taking it as stored");
    }
    st.core.writer.submit(WriteOp::CatchUp).await?;
    if let (Some(below), Some((_, session))) = (below, stored(st, client).await?) {
        st.devices.sessions.resync_stored(client, session.queued, session.incoming, below);
    }
    Ok(())
}

/// Client `client` connected to node `by`: this node ends its session of the client id,
/// and, when it is the session's `home`, answers once what it stored for it is committed.
/// The holder first routes every record the bus had when it heard of the takeover (a
/// message published just before, on another partition, may not have reached it yet): the
/// new node's subscriptions may have missed it. Runs beside the bus follower.
pub fn release(st: &Arc<Mqtt>, Takeover { client, by, home, request }: Takeover) {
    let Some(bus) = st.core.bus.clone() else { return };
    if home != bus.node_id() {
        if st.devices.sessions.evict_client(&client).is_some() {
            tracing::debug!(client, node = %by, "session taken over by another node");
        }
        return;
    }
    let st = st.clone();
    tokio::spawn(async move {
        let wait = st.core.cfg.cluster.session_handoff.duration();
        let b = bus.clone();
        match tokio::task::spawn_blocking(move || b.ends()).await {
            Ok(Ok(ends)) => {
                let deadline = tokio::time::Instant::now() + wait;
                while !bus.followed_past(&ends) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
            Ok(Err(e)) => gridlinks_platform::logging::warn_limited!(error = %e, "session handoff: bus ends unknown"),
            Err(e) => gridlinks_platform::logging::warn_limited!(error = %e, "session handoff: bus ends unknown"),
        }
        if let Some(Some(inbox)) = st.devices.sessions.evict_client(&client) {
            // Its connection deletes the rows of the copies its client acknowledged.
            if tokio::time::timeout(wait, inbox.wait_connection_ended()).await.is_err() {
                gridlinks_platform::logging::warn_limited!(
                    client,
                    "session handoff: the connection did not end in time"
                );
            }
        }
        // The writer commits in order: copies queued before this are stored (and shared) now.
        let done = async {
            st.core.writer.submit(WriteOp::CatchUp).await?;
            bus.send(by.as_bytes(), &BrokerRecord::SessionReleased { to: by.clone(), request })?.await
        }
        .await;
        match done {
            Ok(()) => tracing::debug!(client, node = %by, "session handed over to another node"),
            Err(e) => gridlinks_platform::logging::warn_limited!(client, error = %e, "session handoff: not answered"),
        }
    });
}
