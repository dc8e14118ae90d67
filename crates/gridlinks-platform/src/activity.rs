//! Device activity, as ThingsBoard's device state service keeps it: the server-scope
//! attributes `active`, `lastConnectTime`, `lastDisconnectTime`, `lastActivityTime` and
//! `inactivityAlarmTime`, with a device's `inactivityTimeout` (a server attribute, ms) over
//! `activity.inactivity_timeout`.
//!
//! Every transport reports connects, disconnects and messages here; that costs a lookup and
//! an atomic store per message, never a storage write. A task writes what changed, once per
//! `activity.check_interval`: connects, disconnects and `active` changes at its next tick,
//! `lastActivityTime` at most once per `activity.persist_interval` per device. The writes go
//! through the ingest like any attribute write, so WebSocket subscribers see them. A crash
//! loses at most the last `persist_interval` of `lastActivityTime` (and the last tick of
//! connects and disconnects); a clean shutdown writes everything ([`Activity::flush`]).
//!
//! With several nodes each node reports its own sessions; before a node calls a device
//! inactive it reads the stored `lastActivityTime`, which another node holding the device
//! keeps fresh, so a device that moved is not called inactive by the node it left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use gridlinks_ingest::Item;
use gridlinks_storage::Store;
use gridlinks_types::{AttributeScope, DeviceId, Ts, Value};
use parking_lot::{Mutex, RwLock};

use crate::config::ActivityConfig;
use crate::core::Core;

/// The attribute names ThingsBoard uses.
pub const ACTIVE: &str = "active";
/// Last connect, ms.
pub const LAST_CONNECT: &str = "lastConnectTime";
/// Last disconnect, ms.
pub const LAST_DISCONNECT: &str = "lastDisconnectTime";
/// Last message, ms.
pub const LAST_ACTIVITY: &str = "lastActivityTime";
/// When the device was last called inactive, ms.
pub const INACTIVITY_ALARM: &str = "inactivityAlarmTime";
/// A device's own timeout, ms (a server attribute an administrator sets).
pub const INACTIVITY_TIMEOUT: &str = "inactivityTimeout";

/// Devices' activity written in one submit at most.
const WRITE_BATCH: usize = 512;

/// One device's activity.
#[derive(Default)]
pub struct Entry {
    last_activity: AtomicI64,
    active: AtomicBool,
    /// A connect, a disconnect or an `active` change waits to be written.
    changed: AtomicBool,
    written: Mutex<Written>,
}

/// What was last written, and the times only the task reads.
#[derive(Default)]
struct Written {
    last_connect: Option<i64>,
    last_disconnect: Option<i64>,
    inactivity_alarm: Option<i64>,
    /// `active` as last written (none: never, on this node).
    active: Option<bool>,
    /// `lastActivityTime` as written, and when.
    activity: i64,
    activity_at: i64,
}

impl Entry {
    /// A message from the device.
    pub fn touch(&self) {
        self.last_activity.store(Ts::now().0, Ordering::Relaxed);
        if !self.active.load(Ordering::Relaxed) && !self.active.swap(true, Ordering::AcqRel) {
            self.changed.store(true, Ordering::Release);
        }
    }
}

/// Every device's activity on this node.
pub struct Activity {
    cfg: ActivityConfig,
    devices: RwLock<HashMap<DeviceId, Arc<Entry>>>,
    /// The devices with an `inactivityTimeout` attribute, and its value (ms): read at start,
    /// then kept by [`Activity::timeout_changed`], so that a check reads no storage.
    timeouts: RwLock<HashMap<DeviceId, i64>>,
}

impl Activity {
    /// Activity with `cfg`'s timeouts.
    pub fn new(cfg: ActivityConfig) -> Self {
        Self { cfg, devices: RwLock::default(), timeouts: RwLock::default() }
    }

    fn entry(&self, device: DeviceId) -> Arc<Entry> {
        if let Some(e) = self.devices.read().get(&device) {
            return e.clone();
        }
        self.devices.write().entry(device).or_default().clone()
    }

    /// A session of `device` opened (MQTT, custom TCP, a gateway's `connect`); the entry
    /// to [`Entry::touch`] on each of its messages (and keep-alives).
    pub fn connected(&self, device: DeviceId) -> Arc<Entry> {
        let e = self.entry(device);
        if self.cfg.enabled {
            e.written.lock().last_connect = Some(Ts::now().0);
            e.touch();
            e.changed.store(true, Ordering::Release);
        }
        e
    }

    /// A session of `device` closed.
    pub fn disconnected(&self, device: DeviceId) {
        if !self.cfg.enabled {
            return;
        }
        let e = self.entry(device);
        e.written.lock().last_disconnect = Some(Ts::now().0);
        e.changed.store(true, Ordering::Release);
    }

    /// A message from `device` outside a session (HTTP, CoAP, a gateway's sub-device).
    pub fn touch(&self, device: DeviceId) {
        if self.cfg.enabled {
            self.entry(device).touch();
        }
    }

    /// `device`'s `inactivityTimeout` attribute was written (`None`: deleted, or not a
    /// positive number of milliseconds).
    pub fn timeout_changed(&self, device: DeviceId, value: Option<&Value>) {
        match value.and_then(timeout_ms) {
            Some(t) => self.timeouts.write().insert(device, t),
            None => self.timeouts.write().remove(&device),
        };
    }

    /// Devices with an entry (a gauge).
    pub fn tracked(&self) -> usize {
        self.devices.read().len()
    }

    /// Loads the devices stored as active, so that those that stay silent after a restart
    /// are called inactive in time.
    pub fn load(&self, store: &Store) -> Result<(), gridlinks_storage::StoreError> {
        let keys = [ACTIVE.to_owned(), LAST_ACTIVITY.to_owned(), INACTIVITY_TIMEOUT.to_owned()];
        for d in store.devices()? {
            let attrs = store.attributes(d.id, Some(AttributeScope::Server), Some(&keys))?;
            let value = |k: &str| attrs.iter().find(|a| a.key == k).map(|a| &a.value);
            self.timeout_changed(d.id, value(INACTIVITY_TIMEOUT));
            if value(ACTIVE) == Some(&Value::Bool(true)) {
                let e = self.entry(d.id);
                e.active.store(true, Ordering::Release);
                let last = match value(LAST_ACTIVITY) {
                    Some(Value::Long(t)) => *t,
                    _ => Ts::now().0,
                };
                e.last_activity.store(last, Ordering::Release);
                let mut w = e.written.lock();
                (w.activity, w.activity_at, w.active) = (last, last, Some(true));
            }
        }
        Ok(())
    }

    /// One tick: calls silent devices inactive and writes what changed (everything, with
    /// `all`: at shutdown).
    pub async fn flush(&self, core: &Core, all: bool) {
        let now = Ts::now().0;
        let entries: Vec<(DeviceId, Arc<Entry>)> = self.devices.read().iter().map(|(d, e)| (*d, e.clone())).collect();
        let mut items = Vec::new();
        // Devices that became active or inactive (notified once written).
        let mut turned = Vec::new();
        for (device, e) in entries {
            let timeout = self.timeouts.read().get(&device).copied().unwrap_or(self.cfg.inactivity_timeout.0 as i64);
            let last = e.last_activity.load(Ordering::Acquire);
            // As ThingsBoard: silent past its timeout is inactive, connected or not (an MQTT
            // keep-alive counts as activity).
            if e.active.load(Ordering::Acquire) && now - last > timeout {
                // Another node may hold the device now and keep the stored time fresh.
                let stored = self.stored_activity(core, device).await.unwrap_or(last);
                if now - stored.max(last) > timeout {
                    e.active.store(false, Ordering::Release);
                    e.written.lock().inactivity_alarm = Some(now);
                    e.changed.store(true, Ordering::Release);
                }
            }
            let changed = e.changed.swap(false, Ordering::AcqRel);
            let mut w = e.written.lock();
            let activity_due = last > w.activity && (all || now - w.activity_at >= self.cfg.persist_interval.0 as i64);
            if !changed && !activity_due {
                continue;
            }
            let active = e.active.load(Ordering::Acquire);
            // A change of what was written; a device never seen active is not "inactive" news.
            if w.active != Some(active) && (w.active.is_some() || active) {
                turned.push((device, active));
            }
            w.active = Some(active);
            let mut values = vec![(ACTIVE.to_owned(), Value::Bool(active))];
            if last > w.activity {
                values.push((LAST_ACTIVITY.to_owned(), Value::Long(last)));
                (w.activity, w.activity_at) = (last, now);
            }
            for (key, at) in [
                (LAST_CONNECT, w.last_connect.take()),
                (LAST_DISCONNECT, w.last_disconnect.take()),
                (INACTIVITY_ALARM, w.inactivity_alarm.take()),
            ] {
                if let Some(at) = at {
                    values.push((key.to_owned(), Value::Long(at)));
                }
            }
            items.push(Item::Attributes { device, scope: AttributeScope::Server, values });
        }
        // In batches, so that a burst (10,000 devices connecting) holds the writer for
        // short turns between the devices' own writes.
        while !items.is_empty() {
            let batch: Vec<Item> = items.drain(..items.len().min(WRITE_BATCH)).collect();
            let devices: Vec<DeviceId> = batch.iter().map(Item::device).collect();
            for (device, result) in devices.into_iter().zip(core.ingest.submit(batch).await) {
                if result.is_err() && core.store.device(device).ok().flatten().is_none() {
                    // Deleted: forgotten.
                    self.devices.write().remove(&device);
                }
            }
        }
        for (device, active) in turned {
            core.notify.send(crate::notify::Event::Activity(device, active)).await;
        }
    }

    async fn stored_activity(&self, core: &Core, device: DeviceId) -> Option<i64> {
        match server_attribute(core, device, LAST_ACTIVITY).await? {
            Some(Value::Long(t)) => Some(t),
            _ => None,
        }
    }
}

/// `device`'s server attribute `key`: `None` when it could not be read.
async fn server_attribute(core: &Core, device: DeviceId, key: &str) -> Option<Option<Value>> {
    let read = crate::attributes::read(&core.store, device, Some(AttributeScope::Server), Some(vec![key.into()]));
    Some(read.await.ok()?.into_iter().next().map(|a| a.value))
}

/// An `inactivityTimeout` value as milliseconds: a positive number.
fn timeout_ms(v: &Value) -> Option<i64> {
    match v {
        Value::Long(t) if *t > 0 => Some(*t),
        Value::Double(t) if *t >= 1.0 => Some(*t as i64),
        _ => None,
    }
}

/// Runs [`Activity::flush`] every `activity.check_interval` until aborted.
pub async fn run(core: Core) {
    let activity = core.activity.clone();
    let mut tick = tokio::time::interval(core.cfg.activity.check_interval.duration());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        activity.flush(&core, false).await;
    }
}
