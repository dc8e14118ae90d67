//! HTTP device long polls (`GET /api/v1/{token}/rpc`, `…/attributes/updates`): an HTTP
//! device's session in the platform's device-session registry, so server-side RPC (from any
//! node) and shared-attribute pushes reach it as they reach an MQTT device.
//!
//! A device's first poll of a kind registers a session subscribed to that kind's topic;
//! the session stays registered while polls wait and for `http.long_poll_linger` after the
//! last one ends, so what arrives between two polls waits in its queue (at most
//! `mqtt.outbound_queue`; past it the session is dropped as too slow) for the next one. A
//! poll takes one message, or answers 408 at its timeout. Polls are bounded per device
//! (`http.max_long_polls_per_device`, 429) and on the node (`http.max_long_polls`, 503),
//! and each holds one HTTP connection (`http.max_connections`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gridlinks_broker::sessions::{CloseReason, Inbox, SessionId};
use gridlinks_codec::mqtt::QoS;
use gridlinks_platform::Platform;
use gridlinks_thingsboard::topic::{self, DeviceTopic};
use gridlinks_types::DeviceId;
use parking_lot::Mutex;
use serde_json::Value as J;

/// What a device polls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Server-side RPC requests.
    Rpc,
    /// Shared-attribute changes and deletions.
    Attributes,
}

impl Kind {
    fn filter(self) -> &'static str {
        match self {
            Self::Rpc => topic::RPC_REQUESTS,
            Self::Attributes => topic::ATTRIBUTES,
        }
    }
}

/// How a poll ended without a message.
#[derive(Debug, PartialEq, Eq)]
pub enum PollError {
    /// Nothing came within the timeout (408).
    Timeout,
    /// `http.max_long_polls` polls wait already (503).
    NodeBusy,
    /// `http.max_long_polls_per_device` polls of this device wait already (429).
    DeviceBusy,
    /// The device was deleted or its credentials changed (403, as ThingsBoard's "Device was
    /// deleted!").
    Revoked,
    /// The server is shutting down (503).
    ShuttingDown,
}

struct Parked {
    id: SessionId,
    inbox: Arc<Inbox>,
    /// Polls waiting on it now.
    waiting: usize,
    /// When the last poll ended.
    idle_since: Instant,
}

/// The long-poll sessions of this node.
#[derive(Default)]
pub struct LongPolls {
    parked: Mutex<HashMap<(DeviceId, Kind), Parked>>,
    waiting: AtomicUsize,
}

/// Ends a poll however its future ends (answered, timed out, or dropped when the client
/// went away): one fewer waiting, on the node and on the session.
struct Waiting<'a> {
    polls: &'a LongPolls,
    key: (DeviceId, Kind),
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.polls.waiting.fetch_sub(1, Ordering::AcqRel);
        if let Some(p) = self.polls.parked.lock().get_mut(&self.key) {
            p.waiting -= 1;
            p.idle_since = Instant::now();
        }
    }
}

impl LongPolls {
    /// Long polls over `platform`'s sessions, with a task that unregisters sessions idle
    /// for `http.long_poll_linger` (it ends with `platform`).
    pub fn start(platform: &Arc<Platform>) -> Arc<Self> {
        let polls = Arc::new(Self::default());
        let linger = platform.core.cfg.http.long_poll_linger.duration();
        let (weak, p) = (Arc::downgrade(&polls), Arc::downgrade(platform));
        tokio::spawn(reap(weak, p, linger));
        polls
    }

    /// Waits up to `timeout` for one message of `kind` for `device`: the HTTP body to send.
    pub async fn poll(&self, p: &Platform, device: DeviceId, kind: Kind, timeout: Duration) -> Result<J, PollError> {
        let http = &p.core.cfg.http;
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= http.max_long_polls {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(PollError::NodeBusy);
        }
        let key = (device, kind);
        let inbox = {
            let mut parked = self.parked.lock();
            let sessions = &p.devices.sessions;
            let fresh = || {
                let link = sessions.register(device, p.core.cfg.mqtt.outbound_queue);
                // A fresh session has no subscription to exceed a limit with.
                let _ = sessions.subscribe(device, link.id, kind.filter(), QoS::AtMostOnce);
                Parked { id: link.id, inbox: link.inbox, waiting: 0, idle_since: Instant::now() }
            };
            let entry = parked.entry(key).or_insert_with(fresh);
            if entry.inbox.close_reason() == Some(CloseReason::TooSlow) {
                // Dropped as too slow between polls: this poll starts a new one.
                sessions.unregister(device, entry.id);
                *entry = fresh();
            }
            if entry.waiting >= http.max_long_polls_per_device {
                drop(parked);
                self.waiting.fetch_sub(1, Ordering::AcqRel);
                return Err(PollError::DeviceBusy);
            }
            entry.waiting += 1;
            entry.inbox.clone()
        };
        let _waiting = Waiting { polls: self, key };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let woken = inbox.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            match inbox.close_reason() {
                Some(CloseReason::Revoked) => return Err(PollError::Revoked),
                Some(CloseReason::ShuttingDown) => return Err(PollError::ShuttingDown),
                _ => {}
            }
            if let Some(out) = inbox.pop() {
                if let Some(body) = body(kind, &out.msg.topic, &out.msg.payload) {
                    return Ok(body);
                }
                continue;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return Err(PollError::Timeout);
            }
        }
    }

    /// Long polls waiting now (a gauge for `/metrics`).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Unregisters the sessions no poll has used for `linger`, and closed ones.
    fn reap(&self, p: &Platform, linger: Duration) {
        self.parked.lock().retain(|(device, _), s| {
            let keep = s.waiting > 0 || (s.idle_since.elapsed() < linger && s.inbox.close_reason().is_none());
            if !keep {
                p.devices.sessions.unregister(*device, s.id);
            }
            keep
        });
    }
}

async fn reap(polls: Weak<LongPolls>, platform: Weak<Platform>, linger: Duration) {
    let mut tick = tokio::time::interval((linger / 2).max(Duration::from_millis(100)));
    loop {
        tick.tick().await;
        let (Some(polls), Some(p)) = (polls.upgrade(), platform.upgrade()) else { return };
        polls.reap(&p, linger);
    }
}

/// The HTTP body for a queued message: an RPC request as `{"id","method","params"}`
/// (ThingsBoard's shape), an attribute update as pushed (`{"k":v}`, `{"deleted":[…]}`).
fn body(kind: Kind, topic: &str, payload: &Bytes) -> Option<J> {
    let msg: J = serde_json::from_slice(payload).ok()?;
    match (kind, DeviceTopic::parse(topic)) {
        (Kind::Attributes, Some(DeviceTopic::Attributes)) => Some(msg),
        (Kind::Rpc, Some(DeviceTopic::RpcRequest(id))) => {
            let J::Object(call) = msg else { return None };
            let mut out = serde_json::Map::with_capacity(3);
            out.insert("id".into(), id.parse::<u32>().ok()?.into());
            out.extend(call);
            Some(J::Object(out))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_as_thingsboard_sends_them() {
        let rpc =
            body(Kind::Rpc, "v1/devices/me/rpc/request/7", &Bytes::from_static(br#"{"method":"m","params":{"a":1}}"#));
        assert_eq!(rpc, Some(json!({"id":7,"method":"m","params":{"a":1}})));
        assert_eq!(rpc.unwrap().as_object().unwrap().keys().next().unwrap(), "id", "id first, as ThingsBoard");
        let attrs = body(Kind::Attributes, "v1/devices/me/attributes", &Bytes::from_static(br#"{"deleted":["k"]}"#));
        assert_eq!(attrs, Some(json!({"deleted":["k"]})));
        assert_eq!(body(Kind::Rpc, "v1/devices/me/attributes", &Bytes::from_static(b"{}")), None);
        assert_eq!(body(Kind::Rpc, "v1/devices/me/rpc/request/x", &Bytes::from_static(b"{}")), None);
    }
}
