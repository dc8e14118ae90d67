//! Shared subscriptions with several nodes: this node follows each shared group that has a
//! member here through the group's own Kafka consumer group (`gridlinks_kafka::share`), so
//! every message of the group reaches one node and one member there. The local routing
//! (`Sessions::groups_elsewhere`) leaves shared groups out, this node's own publishes
//! included: they too come back through Kafka, after the publisher's PUBACK (which waits for
//! Kafka's acknowledgement).
//!
//! A group is followed from the moment a member subscribes here (or a stored session with
//! one is loaded); [`SharedGroups::sweep`] (every second) stops following groups whose last
//! member here is gone, and follows again those whose consumer gave up.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use gridlinks_kafka::bus::Event;
use gridlinks_kafka::share::{Handled, ShareConsumer};
use gridlinks_kafka::KafkaSettings;
use gridlinks_storage::WriteOp;
use parking_lot::Mutex;

use super::{pubsub, retained, Mqtt};
use crate::canonical;

/// How often groups without a member here are let go.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The shared groups this node follows.
pub struct SharedGroups {
    settings: KafkaSettings,
    /// By `$share/{group}/{filter}`.
    consumers: Mutex<HashMap<String, ShareConsumer>>,
}

impl SharedGroups {
    /// None followed yet, on the Kafka of `settings`.
    pub fn new(settings: KafkaSettings) -> Self {
        Self { settings, consumers: Mutex::default() }
    }

    /// Follows group `full` (`$share/{group}/{filter}`) unless it already does.
    pub fn follow(&self, st: &Arc<Mqtt>, full: &str) {
        let mut consumers = self.consumers.lock();
        if consumers.get(full).is_some_and(ShareConsumer::is_running) {
            return;
        }
        let data_too = canonical::may_match(full_filter(full));
        match ShareConsumer::start(&self.settings, full, data_too, handler(Arc::downgrade(st), full.to_owned())) {
            Ok(c) => {
                consumers.insert(full.to_owned(), c);
            }
            Err(e) => {
                gridlinks_platform::logging::warn_limited!(group = %full, error = %e, "cannot follow a shared group")
            }
        }
    }

    /// Stops following groups without a member here; follows again those with members whose
    /// consumer ended.
    pub fn sweep(&self, st: &Arc<Mqtt>) {
        let here = st.devices.sessions.groups();
        let gone: Vec<ShareConsumer> = {
            let mut consumers = self.consumers.lock();
            let names: Vec<String> = consumers.keys().filter(|g| here.binary_search(g).is_err()).cloned().collect();
            names.iter().filter_map(|g| consumers.remove(g)).collect()
        };
        // Leaving a group waits for its last commit: off the lock, off the async threads.
        if !gone.is_empty() {
            std::thread::spawn(move || gone.into_iter().for_each(ShareConsumer::stop));
        }
        for g in here {
            self.follow(st, &g);
        }
    }

    /// Stops following every group (shutdown: before the writer drains).
    pub fn stop_all(&self) {
        let all: Vec<ShareConsumer> = self.consumers.lock().drain().map(|(_, c)| c).collect();
        all.into_iter().for_each(ShareConsumer::stop);
    }
}

/// What group `full`'s consumer does with a record: hands a client publish, or a device's
/// committed telemetry as its canonical topic's message, to one member here, and waits until
/// its copy is durable where it must be.
fn handler(st: Weak<Mqtt>, full: String) -> impl FnMut(Event) -> Handled + Send + 'static {
    let rt = tokio::runtime::Handle::current();
    move |event| {
        let Some(st) = st.upgrade() else { return Handled::NotHere };
        let (from, msg, retain) = match event {
            Event::Publish(p) => match retained::decode_message(&p.message) {
                Some(msg) => (p.from, msg, p.retain),
                None => return Handled::Done,
            },
            Event::Data(WriteOp::Telemetry { device, records }) => match st.core.store.device(device) {
                Ok(Some(d)) => (String::new(), canonical::message(&d, &records), false),
                // Deleted since: no topic any more.
                Ok(None) => return Handled::Done,
                Err(e) => {
                    gridlinks_platform::logging::warn_limited!(error = %e, "shared group: device unknown for now");
                    return Handled::NotHere;
                }
            },
            _ => return Handled::Done,
        };
        if !gridlinks_broker::topic::matches(full_filter(&full), &msg.topic) {
            return Handled::Done;
        }
        let Some(routing) = pubsub::route_group(&st, &full, &from, &msg, retain) else {
            return Handled::NotHere;
        };
        match routing.pending.map(|p| rt.block_on(p)) {
            Some(Err(e)) => {
                gridlinks_platform::logging::warn_limited!(group = %full, error = %e, "a shared group's copy was not stored; handing it back");
                Handled::NotHere
            }
            _ => Handled::Done,
        }
    }
}

/// The filter of `$share/{group}/{filter}`.
fn full_filter(full: &str) -> &str {
    full.strip_prefix("$share/").and_then(|r| r.split_once('/')).map_or(full, |(_, f)| f)
}

/// Sweeps `st`'s shared groups every second until the task is aborted.
pub fn keep_up(st: &Arc<Mqtt>) -> Option<tokio::task::JoinHandle<()>> {
    st.shared.as_ref()?;
    let st = Arc::downgrade(st);
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(st) = st.upgrade() else { return };
            if let Some(shared) = &st.shared {
                shared.sweep(&st);
            }
        }
    }))
}
