//! Live sessions per device. A connection registers when its CONNECT is accepted and
//! gets a bounded outbound queue; the rest of the server delivers to a device by topic,
//! and only sessions subscribed to a matching filter receive the message.
//!
//! A session whose queue is full is not read from by its client: it is closed rather than
//! letting messages vanish silently (the device re-syncs on reconnect).
//!
//! The queue is a `VecDeque` behind a mutex plus a `Notify`: an idle session allocates
//! nothing for it (a channel would pre-allocate a block of slots per connection).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use gridlinks_types::DeviceId;
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap as HashMap;
use tokio::sync::{oneshot, Notify};

use gridlinks_codec::mqtt::QoS;

use crate::acl::Acl;
use crate::router::{Delivery, Groups, Message, Router, SubOptions, SubscribeError};
use crate::topic::matches;

/// Identifies one live connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionId(pub u64);

/// A message for one connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Outbound {
    /// The message (topic, payload, properties, expiry), shared by all its copies: one
    /// reference count per copy.
    pub msg: Arc<Message>,
    /// QoS of this copy: the lower of the published QoS and the subscription's.
    pub qos: QoS,
    /// RETAIN flag (retain-as-published subscriptions).
    pub retain: bool,
    /// Identifiers of the subscriptions that matched (MQTT 5).
    pub subscription_ids: Vec<u32>,
    /// Its row in the durable queue of a persistent session (QoS 1 and 2 copies only):
    /// consecutive for the copies of one session, see [`Outbound::fixed_packet_id`].
    pub seq: Option<u64>,
    /// The packet id it was sent with, once sent: an unacknowledged copy is sent again
    /// with the same id and DUP set when the session resumes.
    pub packet_id: Option<u16>,
    /// QoS 2: the client sent PUBREC, so only the PUBREL is owed (sent again on resume).
    pub released: bool,
}

impl Outbound {
    /// A copy without retain flag or subscription identifiers.
    pub fn plain(msg: impl Into<Arc<Message>>, qos: QoS) -> Self {
        let msg = msg.into();
        Self { msg, qos, retain: false, subscription_ids: Vec::new(), seq: None, packet_id: None, released: false }
    }

    /// The packet id a durable copy is always sent with, derived from its row: after a
    /// server crash it goes again with the id the client may have seen, so a QoS 2 client
    /// recognises it. Consecutive copies of a session get consecutive ids, so two copies in
    /// flight at once share one only if the older is 65,535 copies behind.
    pub fn fixed_packet_id(&self) -> Option<u16> {
        // The remainder is below 65,535, so it fits and the id is never 0.
        self.seq.map(|seq| (seq % 65_535) as u16 + 1)
    }
}

/// Why the server ends a session's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CloseReason {
    /// A new connection with the same client id took the session over.
    TakenOver = 1,
    /// Its queue stayed full: too slow to receive.
    TooSlow = 2,
    /// Its device was deleted, or its credential changed or was deleted.
    Revoked = 3,
    /// The server is shutting down: stop reading, finish what is in flight, then close.
    ShuttingDown = 4,
}

/// A session's inbox: queued messages and the close flag, with one wake-up for both. A
/// persistent session keeps its inbox across connections.
#[derive(Default)]
pub struct Inbox {
    queue: Mutex<VecDeque<Outbound>>,
    /// Sequence number of the next durable copy.
    next_seq: AtomicU64,
    /// Copies an earlier connection sent and the client did not acknowledge, to send again
    /// (same packet id, DUP) before the queue.
    unacked: Mutex<Vec<Outbound>>,
    /// QoS 2 packet ids the client published whose PUBREC went out and whose PUBREL has not
    /// arrived: a PUBLISH sent again with one of them is not routed a second time, also on
    /// the next connection of a persistent session (a handful at most: the server's
    /// Receive Maximum bounds them).
    incoming: Mutex<Vec<u16>>,
    /// 0 while open, else a [`CloseReason`].
    closed: AtomicU8,
    /// The connection that has the session now (a [`SessionId`]): one that finds another
    /// here was taken over.
    owner: AtomicU64,
    /// Woken when a message is queued or the session must close.
    pub wake: Notify,
    /// Publishers whose copies went into the queue past its bound (locked after `queue`).
    backlog: Mutex<Backlog>,
    /// The connection that had it last has ended and handed its rows to the writer.
    ended: AtomicBool,
    /// Woken when `ended` is set.
    ended_wake: Notify,
}

/// The publishers a full queue holds back, and how far the client has read.
#[derive(Default)]
struct Backlog {
    /// Copies taken from the queue since the inbox was made.
    taken: u64,
    /// (value of `taken` at which the copy is within the bound, its publisher's release),
    /// in increasing order: each release wakes exactly one publisher, when it is due.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl Inbox {
    /// Its connection ended, and what it had to store (deleted copies) is submitted.
    pub fn connection_ended(&self) {
        self.ended.store(true, Ordering::Release);
        self.ended_wake.notify_waiters();
    }

    /// Waits until [`Inbox::connection_ended`].
    pub async fn wait_connection_ended(&self) {
        loop {
            let woken = self.ended_wake.notified();
            if self.ended.load(Ordering::Acquire) {
                return;
            }
            woken.await;
        }
    }

    /// An empty inbox whose durable copies are numbered from `seq`.
    fn numbered_from(seq: u64) -> Self {
        Self { next_seq: AtomicU64::new(seq), ..Self::default() }
    }

    /// Whether the client's QoS 2 message `id` was received and awaits its PUBREL.
    pub fn awaiting_release(&self, id: u16) -> bool {
        self.incoming.lock().contains(&id)
    }

    /// The client's QoS 2 message `id` was received (its PUBREC goes out now).
    pub fn received(&self, id: u16) {
        let mut ids = self.incoming.lock();
        if !ids.contains(&id) {
            ids.push(id);
        }
    }

    /// The client released its QoS 2 message `id` (PUBREL); whether it was awaited.
    pub fn release(&self, id: u16) -> bool {
        let mut ids = self.incoming.lock();
        let before = ids.len();
        ids.retain(|&i| i != id);
        ids.len() != before
    }

    /// Takes every queued message.
    pub fn drain(&self) -> VecDeque<Outbound> {
        std::mem::take(&mut *self.queue.lock())
    }

    /// Takes the copies an earlier connection left unacknowledged, in the order sent.
    pub fn take_unacked(&self) -> Vec<Outbound> {
        std::mem::take(&mut *self.unacked.lock())
    }

    /// Queues `outs` whatever the bound (retained messages for a new subscription: as
    /// many as the retained store holds for its filter).
    pub fn push_all(&self, outs: Vec<Outbound>) {
        self.queue.lock().extend(outs);
    }

    /// Puts copies taken with [`Inbox::take_unacked`] but not sent back in front.
    pub fn requeue_unacked(&self, rest: Vec<Outbound>) {
        let mut held = self.unacked.lock();
        let later = std::mem::replace(&mut *held, rest);
        held.extend(later);
    }

    /// Messages waiting (queued or unacknowledged).
    pub fn len(&self) -> usize {
        self.queue.lock().len() + self.unacked.lock().len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes messages from the front, in order, while at most `qos1_room` of them need
    /// an acknowledgement (QoS 1 and 2) and their fixed packet ids are free (`id_free`);
    /// the rest stay queued for [`Inbox::take`] after acks.
    pub fn take(&self, qos1_room: usize, id_free: impl Fn(u16) -> bool) -> Vec<Outbound> {
        let mut queue = self.queue.lock();
        let mut room = qos1_room;
        let mut n = 0;
        for m in queue.iter() {
            if m.qos > QoS::AtMostOnce {
                if room == 0 || m.fixed_packet_id().is_some_and(|id| !id_free(id)) {
                    break;
                }
                room -= 1;
            }
            n += 1;
        }
        let taken: Vec<Outbound> = queue.drain(..n).collect();
        self.took(queue, taken.len());
        taken
    }

    /// Takes the first queued message (a client that takes one at a time: an HTTP long
    /// poll).
    pub fn pop(&self) -> Option<Outbound> {
        let mut queue = self.queue.lock();
        let first = queue.pop_front()?;
        self.took(queue, 1);
        Some(first)
    }

    /// `n` messages were taken from `queue`: the publishers they held back may go.
    fn took(&self, mut queue: parking_lot::MutexGuard<'_, VecDeque<Outbound>>, n: usize) {
        if queue.is_empty() && queue.capacity() > 0 {
            // An idle session keeps no queue buffer (a few KiB each over thousands of
            // connections); the next message allocates one again.
            *queue = VecDeque::new();
        }
        if n > 0 {
            let mut backlog = self.backlog.lock();
            backlog.taken += n as u64;
            while backlog.waiting.front().is_some_and(|(due, _)| *due <= backlog.taken) {
                if let Some((_, release)) = backlog.waiting.pop_front() {
                    let _ = release.send(());
                }
            }
            if backlog.waiting.is_empty() && backlog.waiting.capacity() > 0 {
                backlog.waiting = VecDeque::new();
            }
        }
    }

    /// Queues `out`. Within `capacity` that is all. Past it a QoS 0 copy is given back
    /// ([`Pushed::Full`]), and a QoS 1/2 copy is queued anyway with a receiver that fires
    /// once the client has taken enough for it to be within `capacity`: its publisher's
    /// acknowledgement waits for that (backpressure). At `hard_limit` nothing more is
    /// queued ([`Pushed::Full`]).
    pub fn push(&self, out: Outbound, capacity: usize, hard_limit: usize) -> Pushed {
        let mut queue = self.queue.lock();
        let full = queue.len() >= capacity;
        if full && (out.qos == QoS::AtMostOnce || queue.len() >= hard_limit) {
            return Pushed::Full(out);
        }
        queue.push_back(out);
        let waiter = full.then(|| {
            let (release, released) = oneshot::channel();
            let mut backlog = self.backlog.lock();
            let due = backlog.taken + (queue.len() - capacity) as u64;
            backlog.waiting.push_back((due, release));
            released
        });
        drop(queue);
        self.wake.notify_one();
        match waiter {
            Some(released) => Pushed::Waiting(released),
            None => Pushed::Queued,
        }
    }

    /// Lets every waiting publisher go (the connection ended or must close): nobody will
    /// take from the queue until the session resumes, if it does.
    pub fn release_waiters(&self) {
        self.backlog.lock().waiting.clear();
    }

    /// True when messages wait in the queue or to be sent again.
    pub fn has_queued(&self) -> bool {
        !self.queue.lock().is_empty() || !self.unacked.lock().is_empty()
    }

    /// True once the session must close.
    pub fn is_closed(&self) -> bool {
        self.close_reason().is_some()
    }

    /// Why the session must close, once it must.
    pub fn close_reason(&self) -> Option<CloseReason> {
        match self.closed.load(Ordering::Acquire) {
            1 => Some(CloseReason::TakenOver),
            2 => Some(CloseReason::TooSlow),
            3 => Some(CloseReason::Revoked),
            4 => Some(CloseReason::ShuttingDown),
            _ => None,
        }
    }

    fn close(&self, reason: CloseReason) {
        // The first reason stays.
        let _ = self.closed.compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire);
        self.release_waiters();
        self.wake.notify_one();
    }
}

/// What a connection keeps to receive messages and close requests.
pub struct SessionLink {
    /// Its id.
    pub id: SessionId,
    /// Messages for the client and the close flag; woken also when a newer connection
    /// with the same client id takes the session over.
    pub inbox: Arc<Inbox>,
}

impl SessionLink {
    fn new(id: SessionId, inbox: Arc<Inbox>) -> Self {
        inbox.owner.store(id.0, Ordering::Release);
        Self { id, inbox }
    }

    /// Why this connection must close, once it must: also when another connection resumed
    /// its session (the inbox stays open for that one).
    pub fn close_reason(&self) -> Option<CloseReason> {
        if self.inbox.owner.load(Ordering::Acquire) != self.id.0 {
            return Some(CloseReason::TakenOver);
        }
        self.inbox.close_reason()
    }
}

/// What [`Inbox::push`] did with a copy.
pub enum Pushed {
    /// Queued within the bound.
    Queued,
    /// Queued past the bound: the publisher waits for this.
    Waiting(oneshot::Receiver<()>),
    /// Not queued (a QoS 0 copy past the bound, any copy at the hard limit).
    Full(Outbound),
}

/// What registering a client's connection found.
pub struct Registered {
    /// The connection's link.
    pub link: SessionLink,
    /// A persistent session was resumed (CONNACK session present).
    pub present: bool,
    /// A persistent session was discarded (clean start): its durable state must go.
    pub discarded: bool,
}

/// What ending a client's connection left.
#[derive(Debug, PartialEq, Eq)]
pub enum Unregistered {
    /// The session ended with the connection (clean session).
    Ended,
    /// A newer connection with the same client id has the session.
    Superseded,
    /// The persistent session stays, offline, for `expiry` seconds; `epoch` identifies
    /// this offline period for [`Sessions::expire_client`].
    Parked {
        /// Session expiry interval, seconds.
        expiry: u32,
        /// Identifies this offline period.
        epoch: SessionId,
    },
}

/// Where a PUBLISH went: copies queued, and QoS 1 copies waiting for room.
#[derive(Default)]
pub struct Routed {
    /// Copies queued at once.
    pub queued: usize,
    /// QoS 1 copies whose receiver's queue is full.
    pub blocked: Vec<Blocked>,
    /// (client id, seq, QoS of the copy) of the copies for persistent sessions: rows to
    /// write to their durable queues before the publisher is acknowledged.
    pub durable: Vec<(Arc<str>, u64, QoS)>,
    /// QoS 0 copies dropped because their receiver's queue was full.
    pub dropped_qos0: usize,
    /// (client id, seq) of durable copies pushed out of full offline queues
    /// (`drop_oldest`): rows to delete.
    pub dropped: Vec<(Arc<str>, u64)>,
}

/// A QoS 1/2 copy queued past its receiver's bound, whose publisher waits.
pub struct Blocked {
    inbox: Arc<Inbox>,
    released: oneshot::Receiver<()>,
}

impl Blocked {
    /// Waits until the receiver has taken enough of its queue, or is gone. A receiver
    /// that does not within `patience` is disconnected (too slow): it cannot hold
    /// publishers back longer than that (a persistent session keeps the copy). Returns
    /// whether the receiver took its share.
    pub async fn wait(self, patience: std::time::Duration) -> bool {
        match tokio::time::timeout(patience, self.released).await {
            Ok(released) => released.is_ok(),
            Err(_) => {
                self.inbox.close(CloseReason::TooSlow);
                false
            }
        }
    }
}

/// A persistent session as loaded from storage.
pub struct StoredSession {
    /// The credential's user name it logged in with ("" for anonymous clients).
    pub owner: Arc<str>,
    /// Session expiry interval, seconds.
    pub expiry: u32,
    /// Its subscriptions.
    pub subscriptions: Vec<(String, SubOptions)>,
    /// Copies waiting for it, in order; those `released` (QoS 2 copies the client
    /// received) are owed only their PUBREL, with their `packet_id`.
    pub queued: Vec<Outbound>,
    /// Packet ids of QoS 2 messages its client published and has not released.
    pub incoming: Vec<u16>,
    /// Where its new durable copies are numbered from (`None`: one above the highest
    /// queued). A session moving from another node starts far above it, so that copies
    /// that node still queues cannot take the same numbers.
    pub numbered_from: Option<u64>,
}

/// A client session (not a device).
struct ClientEntry {
    /// The connection that has it, or had it last (then `online` is false).
    id: SessionId,
    /// The credential's user name it logged in with ("" for anonymous clients).
    owner: Arc<str>,
    inbox: Arc<Inbox>,
    capacity: usize,
    online: bool,
    /// Session expiry interval in seconds; 0: the session ends with its connection.
    expiry: u32,
    /// Rules that keep some topics of its granted subscriptions from it ([`Acl::withheld`],
    /// filters in the router's terms); `None` when none may.
    withheld: Option<Arc<Acl>>,
}

struct Entry {
    id: SessionId,
    inbox: Arc<Inbox>,
    /// Most queued messages before the session is closed as too slow.
    capacity: usize,
    /// (filter, granted QoS).
    subs: Vec<(String, QoS)>,
}

/// All live sessions, by device.
#[derive(Default)]
pub struct Sessions {
    /// Sessions of clients that are not devices (applications, anonymous), by client id.
    by_client: RwLock<HashMap<String, ClientEntry>>,
    /// Their subscriptions and the retained messages.
    router: Mutex<Router>,
    by_device: RwLock<HashMap<DeviceId, Vec<Entry>>>,
    next: AtomicU64,
    /// Above every durable-queue sequence number given out: where a new session's
    /// numbering starts, so that rows of a discarded session with the same client id,
    /// perhaps still being deleted, are never reused.
    seq: AtomicU64,
    /// At the queue bound of an offline persistent session, drop the oldest copy (else the new one).
    offline_drop_oldest: bool,
    /// Copies a client's queue may hold while publishers wait, before the client is
    /// disconnected as too slow (0: unbounded, see [`Sessions::hard_limit`]).
    hard_limit: usize,
    dropped_offline: AtomicU64,
    /// The router's count of subscriptions overlapping its interest filter, readable
    /// without its lock.
    interested: AtomicUsize,
    closed_on_overflow: AtomicU64,
    dropped_qos0: AtomicU64,
    /// Set by [`Sessions::shut_down`]: sessions registered from then on close at once.
    shutting_down: AtomicBool,
    /// Most subscriptions per session (device or client); 0: unbounded.
    max_subscriptions: usize,
    /// Shared subscriptions get their messages through [`Sessions::publish_group`] only
    /// (several nodes: one Kafka consumer group per shared group).
    groups_elsewhere: bool,
}

impl Sessions {
    /// No sessions; client subscriptions overlapping `filter` are counted
    /// ([`Sessions::interested`]), those in a namespace under `namespaces` too.
    pub fn with_interest(filter: &str, namespaces: Option<&str>) -> Self {
        Self { router: Mutex::new(Router::with_interest(filter, namespaces)), ..Self::default() }
    }

    /// Whether a client subscription overlaps the filter given to
    /// [`Sessions::with_interest`] (a lock-free read, for publishers' hot paths).
    pub fn interested(&self) -> bool {
        self.interested.load(Ordering::Relaxed) > 0
    }

    /// Runs `f` on the router, then publishes its interest count.
    fn with_router<T>(&self, f: impl FnOnce(&mut Router) -> T) -> T {
        let mut router = self.router.lock();
        let out = f(&mut router);
        self.interested.store(router.interested(), Ordering::Relaxed);
        out
    }

    /// Registers a new session of `device` with an outbound queue of `capacity`.
    pub fn register(&self, device: DeviceId, capacity: usize) -> SessionLink {
        let id = self.next_id();
        let inbox = Arc::new(Inbox::default());
        self.by_device.write().entry(device).or_default().push(Entry {
            id,
            inbox: inbox.clone(),
            capacity: capacity.max(1),
            subs: Vec::new(),
        });
        self.link(id, inbox)
    }

    /// Tells every connection, and every one that registers from now on, that the server
    /// is shutting down ([`CloseReason::ShuttingDown`]).
    pub fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        for e in self.by_device.read().values().flatten() {
            e.inbox.close(CloseReason::ShuttingDown);
        }
        for e in self.by_client.read().values().filter(|e| e.online) {
            e.inbox.close(CloseReason::ShuttingDown);
        }
    }

    /// A link for connection `id` to `inbox`, which was registered (is visible to
    /// [`Sessions::shut_down`]) first.
    fn link(&self, id: SessionId, inbox: Arc<Inbox>) -> SessionLink {
        if self.shutting_down.load(Ordering::SeqCst) {
            inbox.close(CloseReason::ShuttingDown);
        }
        SessionLink::new(id, inbox)
    }

    fn next_id(&self) -> SessionId {
        SessionId(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Removes a session (on disconnect).
    pub fn unregister(&self, device: DeviceId, id: SessionId) {
        let mut map = self.by_device.write();
        if let Some(list) = map.get_mut(&device) {
            list.retain(|e| e.id != id);
            if list.is_empty() {
                map.remove(&device);
            }
        }
    }

    /// Adds or replaces a subscription of a session; a new filter is refused when the
    /// session has [`Sessions::max_subscriptions`] already.
    pub fn subscribe(&self, device: DeviceId, id: SessionId, filter: &str, qos: QoS) -> Result<(), SubscribeError> {
        let mut map = self.by_device.write();
        if let Some(e) = map.get_mut(&device).and_then(|l| l.iter_mut().find(|e| e.id == id)) {
            let full = e.subs.len() >= self.subscription_limit();
            match e.subs.iter_mut().find(|(f, _)| f == filter) {
                Some(existing) => existing.1 = qos,
                None if full => return Err(SubscribeError::TooMany(self.max_subscriptions)),
                None => e.subs.push((filter.to_owned(), qos)),
            }
        }
        Ok(())
    }

    fn subscription_limit(&self) -> usize {
        if self.max_subscriptions == 0 {
            usize::MAX
        } else {
            self.max_subscriptions
        }
    }

    /// Removes a subscription; returns whether it existed.
    pub fn unsubscribe(&self, device: DeviceId, id: SessionId, filter: &str) -> bool {
        let mut map = self.by_device.write();
        match map.get_mut(&device).and_then(|l| l.iter_mut().find(|e| e.id == id)) {
            Some(e) => {
                let before = e.subs.len();
                e.subs.retain(|(f, _)| f != filter);
                if e.subs.capacity() > 2 * e.subs.len() + 4 {
                    e.subs.shrink_to_fit();
                }
                e.subs.len() != before
            }
            None => false,
        }
    }

    /// Publishes to every session of `device` subscribed to a filter matching `topic`;
    /// returns how many sessions got it. A session whose queue is full is closed.
    pub fn deliver(&self, device: DeviceId, topic: &str, payload: Bytes) -> usize {
        let map = self.by_device.read();
        let Some(list) = map.get(&device) else { return 0 };
        let mut delivered = 0;
        for e in list {
            let Some(qos) = e.subs.iter().filter(|(f, _)| matches(f, topic)).map(|(_, q)| *q).max() else {
                continue;
            };
            let mut queue = e.inbox.queue.lock();
            if queue.len() >= e.capacity {
                drop(queue);
                self.closed_on_overflow.fetch_add(1, Ordering::Relaxed);
                e.inbox.close(CloseReason::TooSlow);
            } else {
                queue.push_back(Outbound::plain(Message::new(topic, qos, payload.clone()), qos));
                drop(queue);
                e.inbox.wake.notify_one();
                delivered += 1;
            }
        }
        delivered
    }

    /// Closes every session of `device` (it was deleted).
    pub fn close_device(&self, device: DeviceId) -> usize {
        let map = self.by_device.read();
        map.get(&device).map_or(0, |list| {
            list.iter().for_each(|e| e.inbox.close(CloseReason::Revoked));
            list.len()
        })
    }

    /// The devices with a live session.
    pub fn devices(&self) -> Vec<DeviceId> {
        self.by_device.read().keys().copied().collect()
    }

    /// Number of live sessions.
    pub fn count(&self) -> usize {
        self.by_device.read().values().map(Vec::len).sum::<usize>() + self.by_client.read().len()
    }

    /// Registers a connection of client `client_id` (not a device), logged in as `owner`,
    /// with an outbound queue of `capacity` and session expiry `expiry` seconds (0: the
    /// session ends with the connection). A live connection with the same client id is
    /// taken over (kicked). A persistent session is resumed unless `clean_start`. A copy
    /// whose topic `withheld` withholds is never queued for it.
    pub fn register_client(
        &self,
        client_id: &str,
        owner: Arc<str>,
        capacity: usize,
        clean_start: bool,
        expiry: u32,
        withheld: Option<Arc<Acl>>,
    ) -> Registered {
        let id = self.next_id();
        let mut map = self.by_client.write();
        let old = map.remove(client_id);
        let mut present = false;
        let mut discarded = false;
        let inbox = match old {
            Some(old) => {
                if !clean_start && old.expiry > 0 {
                    present = true;
                    old.inbox.closed.store(0, Ordering::Release);
                    old.inbox.clone()
                } else {
                    discarded = old.expiry > 0;
                    old.inbox.close(CloseReason::TakenOver);
                    // A clean session starts without the old subscriptions.
                    self.with_router(|r| r.remove_client(client_id));
                    Arc::new(Inbox::numbered_from(self.seq.load(Ordering::Relaxed)))
                }
            }
            None => Arc::new(Inbox::numbered_from(self.seq.load(Ordering::Relaxed))),
        };
        inbox.ended.store(false, Ordering::Release);
        map.insert(
            client_id.to_owned(),
            ClientEntry { id, owner, inbox: inbox.clone(), capacity: capacity.max(1), online: true, expiry, withheld },
        );
        let link = self.link(id, inbox);
        // A connection that had the resumed session sees it is no longer the owner.
        link.inbox.wake.notify_waiters();
        Registered { link, present, discarded }
    }

    /// Restores a persistent session from storage, offline, with an outbound queue of
    /// `capacity`; returns the epoch to expire it with.
    pub fn restore_client(&self, client_id: &str, stored: StoredSession, capacity: usize) -> SessionId {
        let StoredSession { owner, expiry, subscriptions, queued, incoming, numbered_from } = stored;
        let id = self.next_id();
        let highest = queued.iter().filter_map(|o| o.seq).max();
        let next = numbered_from.unwrap_or_else(|| highest.map_or_else(|| self.seq.load(Ordering::Relaxed), |s| s + 1));
        let inbox = Arc::new(Inbox::numbered_from(next));
        // Copies the client received (QoS 2, PUBREC) are owed their PUBREL first.
        let (released, queued): (Vec<_>, Vec<_>) = queued.into_iter().partition(|o| o.released);
        *inbox.unacked.lock() = released;
        *inbox.queue.lock() = queued.into();
        *inbox.incoming.lock() = incoming;
        self.with_router(|r| {
            for (filter, opts) in subscriptions {
                // Stored filters were validated when first subscribed.
                let _ = r.subscribe(client_id, &filter, opts);
            }
        });
        self.by_client.write().insert(
            client_id.to_owned(),
            // Its rules are known again when its client connects.
            ClientEntry { id, owner, inbox, capacity: capacity.max(1), online: false, expiry, withheld: None },
        );
        id
    }

    /// Ends an offline persistent session whose expiry ran out, if it is still the
    /// offline period `epoch`; whether it ended (its durable state must go then).
    pub fn expire_client(&self, client_id: &str, epoch: SessionId) -> bool {
        let mut map = self.by_client.write();
        if !map.get(client_id).is_some_and(|e| e.id == epoch && !e.online) {
            return false;
        }
        map.remove(client_id);
        drop(map);
        self.with_router(|r| r.remove_client(client_id));
        true
    }

    /// Replaces what `client_id`'s session holds from before `below` (copies numbered
    /// lower, QoS 2 ids) with what is stored now: the node it moved from queued some since
    /// the session was restored here, and its client acknowledged others there. Copies
    /// this node numbered (from `below` on) stay, after the stored ones.
    pub fn resync_stored(&self, client_id: &str, stored: Vec<Outbound>, incoming: Vec<u16>, below: u64) {
        let map = self.by_client.read();
        let Some(e) = map.get(client_id) else { return };
        let ours = |o: &Outbound| o.seq.is_none_or(|s| s >= below);
        // The order `Inbox::len` takes them in.
        let mut queue = e.inbox.queue.lock();
        let mut unacked = e.inbox.unacked.lock();
        queue.retain(ours);
        unacked.retain(ours);
        for out in stored.into_iter().filter(|o| !ours(o)) {
            if out.released {
                unacked.push(out);
            } else {
                queue.push_back(out);
            }
        }
        queue.make_contiguous().sort_by_key(|o| o.seq.unwrap_or(u64::MAX));
        drop((unacked, queue));
        *e.inbox.incoming.lock() = incoming;
    }

    /// Ends `client_id`'s session here without touching what is stored for it (another
    /// node took it over); its connection, if any, is closed as taken over. The inbox of
    /// a session that had a connection (wait for [`Inbox::wait_connection_ended`]), or
    /// `Some(None)` for an offline one; `None` when this node did not hold it.
    pub fn evict_client(&self, client_id: &str) -> Option<Option<Arc<Inbox>>> {
        let e = self.by_client.write().remove(client_id)?;
        e.inbox.close(CloseReason::TakenOver);
        self.with_router(|r| r.remove_client(client_id));
        Some(e.online.then_some(e.inbox))
    }

    /// Whether this node holds a session of `client_id` (online or offline).
    pub fn holds_client(&self, client_id: &str) -> bool {
        self.by_client.read().contains_key(client_id)
    }

    /// Whether `client_id` has a persistent session (online or offline).
    pub fn is_persistent(&self, client_id: &str) -> bool {
        self.by_client.read().get(client_id).is_some_and(|e| e.expiry > 0)
    }

    /// Whether a connection took `client_id`'s session since its offline period `epoch`
    /// began.
    pub fn resumed_since(&self, client_id: &str, epoch: SessionId) -> bool {
        self.by_client.read().get(client_id).is_some_and(|e| e.online || e.id != epoch)
    }

    /// The subscriptions of `client_id`, for persisting its session.
    pub fn client_subscriptions(&self, client_id: &str) -> Vec<(String, SubOptions)> {
        self.router.lock().subscriptions(client_id)
    }

    /// Closes every client session logged in as `owner` (its credential changed or was
    /// deleted); returns how many.
    pub fn close_clients_of(&self, owner: &str) -> usize {
        let map = self.by_client.read();
        map.values().filter(|e| &*e.owner == owner).map(|e| e.inbox.close(CloseReason::Revoked)).count()
    }

    /// Ends connection `link` of `client_id`. `unacked` are the copies it sent that the
    /// client did not acknowledge: a persistent session keeps them (first in line for the
    /// next connection); a clean session ends here with its subscriptions. Nothing else
    /// happens when a newer connection took the client id over, except that a resumed
    /// session gets the unacknowledged copies back.
    pub fn unregister_client(&self, client_id: &str, link: &SessionLink, unacked: Vec<Outbound>) -> Unregistered {
        let mut map = self.by_client.write();
        let Some(e) = map.get_mut(client_id) else { return Unregistered::Superseded };
        if !Arc::ptr_eq(&e.inbox, &link.inbox) {
            return Unregistered::Superseded;
        }
        if !unacked.is_empty() {
            link.inbox.requeue_unacked(unacked);
            link.inbox.wake.notify_one();
        }
        if e.id != link.id {
            return Unregistered::Superseded;
        }
        if e.expiry == 0 {
            map.remove(client_id);
            drop(map);
            self.with_router(|r| r.remove_client(client_id));
            return Unregistered::Ended;
        }
        e.online = false;
        // Nobody takes from the queue while offline: its publishers need not wait.
        link.inbox.release_waiters();
        Unregistered::Parked { expiry: e.expiry, epoch: e.id }
    }

    /// Sets the session expiry of `client_id`'s session (MQTT 5 DISCONNECT may change it).
    pub fn set_expiry(&self, client_id: &str, link: &SessionLink, expiry: u32) {
        if let Some(e) = self.by_client.write().get_mut(client_id).filter(|e| e.id == link.id) {
            e.expiry = expiry;
        }
    }

    /// Subscribes client `client_id`; the retained messages the subscription receives now
    /// (less those its rules withhold).
    pub fn subscribe_client(
        &self,
        client_id: &str,
        filter: &str,
        opts: SubOptions,
    ) -> Result<Vec<(Message, QoS)>, SubscribeError> {
        let max = self.subscription_limit();
        let mut retained = self.with_router(|r| r.subscribe_at_most(client_id, filter, opts, max))?.retained;
        if let Some(acl) = self.by_client.read().get(client_id).and_then(|e| e.withheld.clone()) {
            retained.retain(|(m, _)| !acl.withheld(&m.topic));
        }
        Ok(retained)
    }

    /// Unsubscribes client `client_id`; whether the subscription existed.
    pub fn unsubscribe_client(&self, client_id: &str, filter: &str) -> bool {
        self.with_router(|r| r.unsubscribe(client_id, filter))
    }

    /// Routes a PUBLISH of client `from` to every subscribed client session (and keeps it
    /// as the retained message with `retain`). A QoS 0 copy for a full queue is dropped
    /// (counted); a QoS 1/2 copy for a full queue is queued and comes back in
    /// [`Routed::blocked`]: the publisher's acknowledgement waits until the receiver has
    /// caught up (backpressure), see [`Blocked::wait`]. An offline persistent session's
    /// full queue drops a copy by the configured policy instead.
    ///
    /// With [`Sessions::groups_elsewhere`], shared subscriptions are left out: each gets its
    /// messages through [`Sessions::publish_group`].
    pub fn publish(&self, from: &str, msg: &Message, retain: bool) -> Routed {
        let groups = if self.groups_elsewhere { Groups::None } else { Groups::All };
        let deliveries = self.router.lock().publish_to(from, msg, retain, groups);
        self.queue_deliveries(msg, deliveries)
    }

    /// Routes a PUBLISH of client `from` to one member of shared group `full`
    /// (`$share/{group}/{filter}`) only, as [`Sessions::publish`] does (the retained store
    /// is left as it is; `retain` is the message's flag). `None` when no member here takes
    /// it: for a topic the group's filter matches, the group has no member here.
    pub fn publish_group(&self, full: &str, from: &str, msg: &Message, retain: bool) -> Option<Routed> {
        let deliveries = self.router.lock().publish_to(from, msg, retain, Groups::Only(full));
        (!deliveries.is_empty()).then(|| self.queue_deliveries(msg, deliveries))
    }

    /// The shared groups with members here.
    pub fn groups(&self) -> Vec<String> {
        self.router.lock().groups()
    }

    fn queue_deliveries(&self, msg: &Message, deliveries: Vec<Delivery>) -> Routed {
        let mut routed = Routed::default();
        if deliveries.is_empty() {
            return routed;
        }
        let shared = Arc::new(msg.clone());
        let hard_limit = if self.hard_limit == 0 { usize::MAX } else { self.hard_limit };
        let map = self.by_client.read();
        for d in deliveries {
            let Some(e) = map.get(&*d.client) else { continue };
            if e.withheld.as_ref().is_some_and(|acl| acl.withheld(&msg.topic)) {
                continue;
            }
            let persistent = e.expiry > 0;
            if !e.online && d.qos == QoS::AtMostOnce {
                // An offline session gets QoS 1 copies only.
                continue;
            }
            let seq = (persistent && d.qos > QoS::AtMostOnce).then(|| {
                let seq = e.inbox.next_seq.fetch_add(1, Ordering::Relaxed);
                self.seq.fetch_max(seq + 1, Ordering::Relaxed);
                seq
            });
            let out = Outbound {
                msg: shared.clone(),
                qos: d.qos,
                retain: d.retain,
                subscription_ids: d.subscription_ids,
                seq,
                packet_id: None,
                released: false,
            };
            let queued = if e.online {
                match e.inbox.push(out, e.capacity, hard_limit) {
                    Pushed::Queued => true,
                    Pushed::Waiting(released) => {
                        routed.blocked.push(Blocked { inbox: e.inbox.clone(), released });
                        true
                    }
                    Pushed::Full(_) if d.qos == QoS::AtMostOnce => {
                        self.dropped_qos0.fetch_add(1, Ordering::Relaxed);
                        routed.dropped_qos0 += 1;
                        false
                    }
                    Pushed::Full(out) => {
                        // The hard limit: the client is too slow. A clean session ends with
                        // its queue; a persistent one keeps it, bounded by the policy.
                        self.closed_on_overflow.fetch_add(1, Ordering::Relaxed);
                        e.inbox.close(CloseReason::TooSlow);
                        persistent && self.queue_at_bound(&e.inbox, out, hard_limit, &d.client, &mut routed)
                    }
                }
            } else {
                self.queue_at_bound(&e.inbox, out, e.capacity, &d.client, &mut routed)
            };
            if !queued {
                continue;
            }
            routed.queued += 1;
            if let Some(seq) = seq {
                routed.durable.push((d.client, seq, d.qos));
            }
        }
        routed
    }

    /// Queues `out` for a session nobody takes from now, whose queue may hold `bound`
    /// copies: at the bound `mqtt.offline_queue_full` decides which copy goes (counted);
    /// whether `out` was queued.
    fn queue_at_bound(
        &self,
        inbox: &Inbox,
        out: Outbound,
        bound: usize,
        client: &Arc<str>,
        routed: &mut Routed,
    ) -> bool {
        let mut queue = inbox.queue.lock();
        if queue.len() >= bound {
            self.dropped_offline.fetch_add(1, Ordering::Relaxed);
            if !self.offline_drop_oldest {
                return false;
            }
            if let Some(old) = queue.pop_front() {
                routed.dropped.extend(old.seq.map(|s| (client.clone(), s)));
            }
        }
        queue.push_back(out);
        true
    }

    /// Makes new sessions number their durable copies from `seq` on (after loading stored
    /// rows: one above the highest).
    pub fn seq_floor(&self, seq: u64) {
        self.seq.fetch_max(seq, Ordering::Relaxed);
    }

    /// Shared subscriptions are reached only through [`Sessions::publish_group`] (with
    /// several nodes, each group's messages come from its own Kafka consumer group).
    pub fn groups_elsewhere(mut self, yes: bool) -> Self {
        self.groups_elsewhere = yes;
        self
    }

    /// A session (device or client) may hold at most `per_session` subscriptions (0:
    /// unbounded); a SUBSCRIBE for another filter is refused ([`SubscribeError::TooMany`]).
    pub fn max_subscriptions(mut self, per_session: usize) -> Self {
        self.max_subscriptions = per_session;
        self
    }

    /// A client whose queue reaches `copies` (publishers waiting on it) is disconnected as
    /// too slow; a persistent session keeps that many.
    pub fn hard_limit(mut self, copies: usize) -> Self {
        self.hard_limit = copies;
        self
    }

    /// At the queue bound of an offline persistent session, drop the oldest queued copy
    /// instead of the new one.
    pub fn drop_oldest_when_offline_queue_full(mut self, yes: bool) -> Self {
        self.offline_drop_oldest = yes;
        self
    }

    /// QoS 1 copies for offline persistent sessions dropped at their queue bound.
    pub fn dropped_offline(&self) -> u64 {
        self.dropped_offline.load(Ordering::Relaxed)
    }

    /// QoS 0 copies dropped because the receiver's queue was full.
    pub fn dropped_qos0(&self) -> u64 {
        self.dropped_qos0.load(Ordering::Relaxed)
    }

    /// Sessions closed because their outbound queue was full.
    pub fn closed_on_overflow(&self) -> u64 {
        self.closed_on_overflow.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlinks_codec::mqtt::QoS::{AtLeastOnce as Q1, AtMostOnce as Q0, ExactlyOnce as Q2};

    /// QoS `n` (0..=2).
    fn q(n: usize) -> QoS {
        QoS::try_from(n as u8).unwrap()
    }

    #[tokio::test]
    async fn delivery_follows_subscriptions_and_overflow_closes() {
        let s = Sessions::default();
        let d = DeviceId::new_random();
        let a = s.register(d, 1);
        let b = s.register(d, 1);
        s.subscribe(d, a.id, "v1/devices/me/rpc/request/+", Q1).unwrap();
        s.subscribe(d, b.id, "v1/devices/me/attributes", Q0).unwrap();
        assert_eq!(s.deliver(d, "v1/devices/me/rpc/request/1", Bytes::from_static(b"{}")), 1);
        a.inbox.wake.notified().await;
        let m = a.inbox.drain().pop_front().unwrap();
        assert_eq!((&*m.msg.topic, m.qos), ("v1/devices/me/rpc/request/1", Q1));
        assert_eq!(s.deliver(d, "v1/devices/me/attributes", Bytes::from_static(b"1")), 1);
        // b's queue (capacity 1) is now full: the next delivery closes it instead of dropping silently.
        assert_eq!(s.deliver(d, "v1/devices/me/attributes", Bytes::from_static(b"2")), 0);
        assert_eq!(s.closed_on_overflow(), 1);
        assert!(b.inbox.is_closed());
        assert_eq!(b.inbox.drain().pop_front().unwrap().msg.payload, Bytes::from_static(b"1"));
        assert!(s.unsubscribe(d, a.id, "v1/devices/me/rpc/request/+"));
        assert_eq!(s.deliver(d, "v1/devices/me/rpc/request/2", Bytes::new()), 0);
        assert_eq!(s.close_device(d), 2);
        s.unregister(d, a.id);
        s.unregister(d, b.id);
        assert_eq!(s.count(), 0);
    }

    #[tokio::test]
    async fn client_sessions_route_take_over_and_drop_subscriptions_when_they_end() {
        let s = Sessions::default();
        let a = s.register_client("app", "u".into(), 10, true, 0, None).link;
        let opts = SubOptions { qos: Q1, ..Default::default() };
        assert!(s.subscribe_client("app", "meters/+", opts).unwrap().is_empty());
        assert_eq!(s.publish("dev", &Message::new("meters/1", Q1, Bytes::from_static(b"7")), true).queued, 1);
        let m = a.inbox.drain().pop_front().unwrap();
        assert_eq!((&*m.msg.topic, m.qos, m.retain), ("meters/1", Q1, false));
        // The retained message waits for the next subscriber.
        let late = s.register_client("late", "".into(), 10, true, 0, None).link;
        let retained = s.subscribe_client("late", "meters/#", opts).unwrap();
        assert_eq!(retained.len(), 1);
        assert_eq!(retained[0].0.payload, Bytes::from_static(b"7"));
        assert_eq!(s.close_clients_of("nobody"), 0);
        // Same client id again: the old session is closed, its subscriptions gone.
        let a2 = s.register_client("app", "u".into(), 10, true, 0, None).link;
        assert_eq!(a.inbox.close_reason(), Some(CloseReason::TakenOver));
        assert!(!a2.inbox.is_closed());
        s.unregister_client("app", &a, Vec::new()); // the old connection ending changes nothing
        assert_eq!(s.count(), 2);
        assert_eq!(
            s.publish("dev", &Message::new("meters/2", Q0, Bytes::new()), false).queued,
            1,
            "only 'late' is subscribed"
        );
        assert_eq!(s.close_clients_of("u"), 1, "the credential 'u' changed");
        assert!(a2.inbox.is_closed() && !late.inbox.is_closed());
        s.unregister_client("late", &late, Vec::new());
        s.unregister_client("app", &a2, Vec::new());
        assert_eq!(s.count(), 0);
        assert_eq!(s.publish("dev", &Message::new("meters/3", Q0, Bytes::new()), false).queued, 0);
    }

    #[test]
    fn interest_counts_overlapping_subscriptions() {
        let s = Sessions::with_interest("gridlinks/devices/+/telemetry", Some("$ns/"));
        let opts = SubOptions::default();
        let _a = s.register_client("a", "".into(), 10, true, 0, None);
        assert!(!s.interested());
        s.subscribe_client("a", "other/#", opts).unwrap();
        assert!(!s.interested());
        s.subscribe_client("a", "gridlinks/devices/d1/+", opts).unwrap();
        s.subscribe_client("a", "$share/g/#", opts).unwrap();
        assert!(s.interested());
        assert!(s.unsubscribe_client("a", "gridlinks/devices/d1/+"));
        assert!(s.interested(), "the shared '#' still overlaps");
        let a2 = s.register_client("a", "".into(), 10, true, 0, None).link;
        assert!(!s.interested(), "a takeover starts clean");
        s.subscribe_client("a", "#", opts).unwrap();
        s.unregister_client("a", &a2, Vec::new());
        assert!(!s.interested());
        // A subscription in a namespace counts as the same filter would.
        let _b = s.register_client("b", "".into(), 10, true, 0, None);
        s.subscribe_client("b", "$ns/t1/other/#", opts).unwrap();
        assert!(!s.interested());
        s.subscribe_client("b", "$share/g/$ns/t1/gridlinks/devices/+/telemetry", opts).unwrap();
        assert!(s.interested());
        assert!(s.unsubscribe_client("b", "$share/g/$ns/t1/gridlinks/devices/+/telemetry"));
        assert!(!s.interested());
    }

    #[test]
    fn persistent_sessions_queue_while_offline_resume_and_expire() {
        let s = Sessions::default();
        let opts = SubOptions { qos: Q1, ..Default::default() };
        let r = s.register_client("p", "".into(), 2, false, 60, None);
        assert!(!r.present && !r.discarded);
        s.subscribe_client("p", "t/#", opts).unwrap();
        // Online: a QoS 1 copy gets a durable row.
        let routed = s.publish("x", &Message::new("t/1", Q1, Bytes::from_static(b"1")), false);
        assert_eq!(routed.durable.len(), 1);
        let mut sent = r.link.inbox.take(10, |_| true);
        sent[0].packet_id = Some(7);
        // The connection ends with that copy unacknowledged: the session stays, offline.
        let Unregistered::Parked { expiry: 60, epoch } = s.unregister_client("p", &r.link, sent) else {
            panic!("not parked")
        };
        // Offline: QoS 0 is not queued, QoS 1 is (durably) up to the bound, then dropped.
        assert_eq!(s.publish("x", &Message::new("t/2", Q0, Bytes::new()), false).queued, 0);
        assert_eq!(s.publish("x", &Message::new("t/3", Q1, Bytes::new()), false).durable.len(), 1);
        assert_eq!(s.publish("x", &Message::new("t/4", Q1, Bytes::new()), false).durable.len(), 1);
        assert!(s.publish("x", &Message::new("t/5", Q1, Bytes::new()), false).durable.is_empty());
        assert_eq!(s.dropped_offline(), 1);
        // Resumed: the unacknowledged copy first (same packet id), then the queue.
        let r2 = s.register_client("p", "".into(), 2, false, 60, None);
        assert!(r2.present);
        assert!(!s.expire_client("p", epoch), "resumed sessions do not expire");
        let unacked = r2.link.inbox.take_unacked();
        assert_eq!((&*unacked[0].msg.topic, unacked[0].packet_id), ("t/1", Some(7)));
        let topics: Vec<_> = r2.link.inbox.take(10, |_| true).into_iter().map(|o| o.msg.topic.to_string()).collect();
        assert_eq!(topics, ["t/3", "t/4"]);
        let Unregistered::Parked { epoch, .. } = s.unregister_client("p", &r2.link, Vec::new()) else { panic!() };
        assert!(s.expire_client("p", epoch));
        assert_eq!(s.count(), 0);
        assert_eq!(s.publish("x", &Message::new("t/6", Q1, Bytes::new()), false).queued, 0, "subscriptions gone");
        // Clean start discards a persistent session.
        s.register_client("q", "".into(), 2, false, 60, None);
        s.subscribe_client("q", "t/#", opts).unwrap();
        let r3 = s.register_client("q", "".into(), 2, true, 0, None);
        assert!(!r3.present && r3.discarded);
        assert_eq!(s.publish("x", &Message::new("t/7", Q1, Bytes::new()), false).queued, 0);
    }

    #[test]
    fn a_full_offline_queue_can_drop_the_oldest_instead() {
        let s = Sessions::default().drop_oldest_when_offline_queue_full(true);
        let r = s.register_client("p", "".into(), 1, false, 60, None);
        s.subscribe_client("p", "t", SubOptions { qos: Q1, ..Default::default() }).unwrap();
        s.unregister_client("p", &r.link, Vec::new());
        let first = s.publish("x", &Message::new("t", Q1, Bytes::from_static(b"1")), false);
        let second = s.publish("x", &Message::new("t", Q1, Bytes::from_static(b"2")), false);
        assert_eq!(second.dropped[0], (first.durable[0].0.clone(), first.durable[0].1), "the first copy's row goes");
        let r = s.register_client("p", "".into(), 1, false, 60, None);
        assert_eq!(r.link.inbox.take(10, |_| true)[0].msg.payload, Bytes::from_static(b"2"));
    }

    /// Random operations of several clients on the session state machine (connect clean
    /// or persistent, take over, disconnect with unacknowledged copies, expire, subscribe,
    /// unsubscribe, publish, receive): no panic, no copy reaches a client that never
    /// subscribed to a filter matching it in its current session, queues stay bounded.
    #[test]
    fn random_sessions_never_leak_messages_to_other_clients() {
        let topics = ["a", "a/b", "a/b/c", "b/b", "$SYS/x"];
        let filters = ["a/#", "+/b", "#", "a/+/c", "$SYS/#", "$share/g/a/#", "b/+"];
        let clients = ["c0", "c1", "c2", "c3", "c4"];
        let capacity = 8;
        let mut next = crate::test_rng(0x9E37_79B9_7F4A_7C15);
        for _round in 0..200 {
            let s = Sessions::default().drop_oldest_when_offline_queue_full(next(2) == 0).hard_limit(2 * capacity);
            // Per client: its live link, and every filter subscribed since its session began.
            let mut links: HashMap<&str, SessionLink> = HashMap::default();
            let mut allowed: HashMap<&str, Vec<&str>> = HashMap::default();
            let mut parked: HashMap<&str, SessionId> = HashMap::default();
            for _ in 0..300 {
                let c = clients[next(clients.len())];
                match next(9) {
                    0 => {
                        let clean = next(2) == 0;
                        let r =
                            s.register_client(c, "".into(), capacity, clean, if next(2) == 0 { 60 } else { 0 }, None);
                        if !r.present {
                            allowed.insert(c, Vec::new());
                        }
                        parked.remove(c);
                        links.insert(c, r.link);
                    }
                    1 => {
                        if let Some(link) = links.remove(c) {
                            let mut unacked = link.inbox.take(next(3), |_| true);
                            unacked.iter_mut().for_each(|o| o.packet_id = Some(1 + next(100) as u16));
                            match s.unregister_client(c, &link, unacked) {
                                Unregistered::Parked { epoch, .. } => {
                                    parked.insert(c, epoch);
                                }
                                Unregistered::Ended => {
                                    allowed.remove(c);
                                }
                                Unregistered::Superseded => {}
                            }
                        }
                    }
                    2 => {
                        if let Some(epoch) = parked.remove(c) {
                            if s.expire_client(c, epoch) {
                                allowed.remove(c);
                            }
                        }
                    }
                    3 | 4 => {
                        if links.contains_key(c) {
                            let f = filters[next(filters.len())];
                            let opts = SubOptions { qos: q(next(3)), no_local: next(4) == 0, ..Default::default() };
                            if s.subscribe_client(c, f, opts).is_ok() {
                                allowed.entry(c).or_default().push(f);
                            }
                        }
                    }
                    5 => {
                        if links.contains_key(c) {
                            s.unsubscribe_client(c, filters[next(filters.len())]);
                        }
                    }
                    6 | 7 => {
                        let msg = Message::new(topics[next(topics.len())], q(next(3)), Bytes::from_static(b"m"));
                        s.publish(c, &msg, next(5) == 0);
                    }
                    _ => {
                        let Some(link) = links.get(c) else { continue };
                        let mut got = link.inbox.take_unacked();
                        got.extend(link.inbox.take(next(4), |_| true));
                        for out in got {
                            let plain = |f: &str| f.strip_prefix("$share/g/").unwrap_or(f).to_owned();
                            assert!(
                                allowed.get(c).is_some_and(|fs| fs.iter().any(|f| matches(&plain(f), &out.msg.topic))),
                                "{c} got {:?} without a matching subscription",
                                out.msg.topic
                            );
                            assert!(out.qos <= out.msg.qos);
                        }
                        assert!(link.inbox.len() <= 2 * capacity + 8, "queue bound");
                    }
                }
            }
        }
    }

    #[test]
    fn take_stops_at_the_window_and_keeps_order() {
        let inbox = Inbox::default();
        for (i, qos) in [Q1, Q0, Q1, Q1, Q0].into_iter().enumerate() {
            inbox.queue.lock().push_back(Outbound::plain(Message::new(&i.to_string(), qos, Bytes::new()), qos));
        }
        let topics = |v: Vec<Outbound>| v.into_iter().map(|m| m.msg.topic.to_string()).collect::<Vec<_>>();
        assert_eq!(topics(inbox.take(2, |_| true)), ["0", "1", "2"], "stops before the third QoS 1");
        assert!(inbox.has_queued());
        assert_eq!(topics(inbox.take(0, |_| true)), Vec::<String>::new());
        assert_eq!(topics(inbox.take(5, |_| true)), ["3", "4"]);
        assert!(!inbox.has_queued());
    }

    #[test]
    fn durable_copies_are_numbered_per_session_and_wait_for_their_fixed_packet_id() {
        let s = Sessions::default();
        let opts = SubOptions { qos: Q2, ..Default::default() };
        let a = s.register_client("a", "".into(), 100, true, 60, None).link;
        let b = s.register_client("b", "".into(), 100, true, 60, None).link;
        s.subscribe_client("a", "t", opts).unwrap();
        s.subscribe_client("b", "t", opts).unwrap();
        for _ in 0..3 {
            assert_eq!(s.publish("p", &Message::new("t", Q2, Bytes::new()), false).durable.len(), 2);
        }
        // Consecutive per session, whatever the other sessions get.
        let ids: Vec<_> = a.inbox.queue.lock().iter().map(|o| (o.seq, o.fixed_packet_id())).collect();
        assert_eq!(ids, [(Some(0), Some(1)), (Some(1), Some(2)), (Some(2), Some(3))]);
        assert_eq!(b.inbox.queue.lock()[2].fixed_packet_id(), Some(3));
        // A copy whose id is still in flight waits, and the copies behind it with it.
        assert_eq!(a.inbox.take(10, |id| id != 2).len(), 1);
        assert_eq!(a.inbox.take(10, |_| true).len(), 2);
        // Ids wrap after 65,535 copies, never to 0.
        let mut late = Outbound::plain(Message::new("t", Q1, Bytes::new()), Q1);
        late.seq = Some(65_535 + 1);
        assert_eq!(late.fixed_packet_id(), Some(2));
        late.seq = Some(65_534);
        assert_eq!(late.fixed_packet_id(), Some(65_535));
        // A session started again after a clean start numbers above the one it replaces
        // (whose rows may still be being deleted).
        let a2 = s.register_client("a", "".into(), 100, true, 60, None).link;
        s.subscribe_client("a", "t", opts).unwrap();
        s.publish("p", &Message::new("t", Q2, Bytes::new()), false);
        assert_eq!(a2.inbox.queue.lock()[0].seq, Some(3));
    }

    #[tokio::test]
    async fn a_session_moving_in_numbers_above_and_takes_the_old_nodes_last_rows() {
        let s = Sessions::default();
        let copy = |seq: u64| {
            let mut o = Outbound::plain(Message::new(&format!("t/{seq}"), Q1, Bytes::new()), Q1);
            o.seq = Some(seq);
            o
        };
        let stored = StoredSession {
            owner: "app".into(),
            expiry: 60,
            subscriptions: vec![("t/#".into(), SubOptions { qos: Q1, ..Default::default() })],
            queued: vec![copy(3), copy(4)],
            incoming: vec![7],
            numbered_from: Some(1 << 32),
        };
        s.restore_client("c", stored, 100);
        assert!(s.holds_client("c"));
        // Copies queued here number far above the old node's.
        s.publish("p", &Message::new("t/new", Q1, Bytes::new()), false);
        // The rows read again: 3 was acknowledged on the old node, 5 queued there late;
        // this node's own copy (numbered from 1 << 32) stays, whatever the rows say.
        s.resync_stored("c", vec![copy(4), copy(5), copy(1 << 32)], vec![7, 8], 1 << 32);
        let r = s.register_client("c", "app".into(), 100, false, 60, None);
        assert!(r.present);
        let order: Vec<_> = r.link.inbox.queue.lock().iter().map(|o| o.seq).collect();
        assert_eq!(order, [Some(4), Some(5), Some(1 << 32)]);
        assert_eq!(*r.link.inbox.incoming.lock(), [7, 8]);
        // Another node takes it: gone here, its connection closed, its routes with it.
        let inbox = s.evict_client("c").expect("held").expect("connected");
        assert!(r.link.close_reason().is_some());
        assert!(!s.holds_client("c") && s.evict_client("c").is_none());
        inbox.connection_ended();
        inbox.wait_connection_ended().await;
        assert_eq!(s.publish("p", &Message::new("t/x", Q1, Bytes::new()), false).queued, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_holds_qos1_publishers_back_and_drops_qos0() {
        let s = Sessions::default().hard_limit(4);
        let sub = s.register_client("slow", "".into(), 2, true, 0, None).link;
        let opts = SubOptions { qos: Q1, ..Default::default() };
        s.subscribe_client("slow", "t", opts).unwrap();
        let publish =
            |p: &'static [u8], qos: QoS| s.publish("p", &Message::new("t", qos, Bytes::from_static(p)), false);
        assert_eq!(publish(b"1", Q1).queued + publish(b"2", Q1).queued, 2);
        // Full: QoS 0 is dropped and counted, QoS 1 is queued and its publisher waits.
        assert_eq!(publish(b"x", Q0).queued, 0);
        assert_eq!(s.dropped_qos0(), 1);
        let mut third = publish(b"3", Q1);
        assert_eq!((third.queued, third.blocked.len()), (1, 1));
        let mut fourth = publish(b"4", Q1);
        let waiting3 = tokio::spawn(third.blocked.remove(0).wait(std::time::Duration::from_secs(5)));
        let waiting4 = tokio::spawn(fourth.blocked.remove(0).wait(std::time::Duration::from_secs(5)));
        tokio::task::yield_now().await;
        assert!(!waiting3.is_finished(), "the publisher waits until the subscriber catches up");
        // The subscriber takes message 1: message 3 is within the bound now, 4 is not.
        assert_eq!(sub.inbox.take(1, |_| true)[0].msg.payload, Bytes::from_static(b"1"));
        assert!(waiting3.await.unwrap());
        tokio::task::yield_now().await;
        assert!(!waiting4.is_finished(), "one release per copy taken: no herd");
        let rest: Vec<_> = sub.inbox.take(10, |_| true).into_iter().map(|o| o.msg.payload.clone()).collect();
        assert_eq!(rest, [&b"2"[..], b"3", b"4"], "in publish order");
        assert!(waiting4.await.unwrap());
        // A receiver that does not catch up is disconnected after the patience.
        publish(b"5", Q1);
        publish(b"6", Q1);
        let mut routed = publish(b"7", Q1);
        assert!(!routed.blocked.remove(0).wait(std::time::Duration::from_secs(5)).await);
        assert_eq!(sub.inbox.close_reason(), Some(CloseReason::TooSlow));
        // At the hard limit it is disconnected at once; a clean session loses the copy.
        let fast = s.register_client("burst", "".into(), 1, true, 0, None).link;
        s.subscribe_client("burst", "b", opts).unwrap();
        let burst = |p: &'static [u8]| s.publish("p", &Message::new("b", Q1, Bytes::from_static(p)), false);
        assert_eq!((burst(b"1").blocked.len(), burst(b"2").blocked.len()), (0, 1));
        assert_eq!((burst(b"3").blocked.len(), burst(b"4").blocked.len()), (1, 1));
        assert!(!fast.inbox.is_closed());
        assert_eq!(burst(b"5").queued, 0);
        assert_eq!(fast.inbox.close_reason(), Some(CloseReason::TooSlow));
        assert_eq!(s.closed_on_overflow(), 1);
    }

    #[test]
    fn subscriptions_per_session_are_bounded() {
        let s = Sessions::default().max_subscriptions(2);
        let opts = SubOptions { qos: Q1, ..SubOptions::default() };
        let link = s.register_client("c", "".into(), 10, true, 0, None).link;
        s.subscribe_client("c", "a", opts).unwrap();
        s.subscribe_client("c", "b", opts).unwrap();
        assert!(matches!(s.subscribe_client("c", "c", opts), Err(SubscribeError::TooMany(2))));
        // Subscribing again to a filter it has is a replacement, not one more.
        s.subscribe_client("c", "a", opts).unwrap();
        assert!(s.unsubscribe_client("c", "a"));
        s.subscribe_client("c", "c", opts).unwrap();
        let d = DeviceId::new_random();
        let dev = s.register(d, 10);
        s.subscribe(d, dev.id, "x", Q1).unwrap();
        s.subscribe(d, dev.id, "y", Q1).unwrap();
        assert!(matches!(s.subscribe(d, dev.id, "z", Q1), Err(SubscribeError::TooMany(2))));
        s.subscribe(d, dev.id, "x", Q0).unwrap();
        let _ = link;
    }
}
