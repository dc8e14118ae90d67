//! What the server sends a client: its QoS 1/2 window (packet ids never reused while in
//! flight), queued and resent copies, their acknowledgements (PUBACK, PUBREC/PUBREL/PUBCOMP)
//! and the durable rows they free.

use super::*;

/// Most QoS 1 messages the server leaves unacknowledged with one client (lower when the
/// client's MQTT 5 Receive Maximum says so).
pub(super) const OUTBOUND_WINDOW: u16 = 1024;

/// The server's own QoS 1 publishes to one client that await its PUBACK: a window of at
/// most `max`, and packet ids never reused while in flight.
pub(super) struct OutWindow {
    max: u16,
    in_flight: u16,
    next_id: u16,
    /// Packet ids in flight (at most `max`). Dropped when the window empties, so an idle
    /// connection holds none of it (a bitmap of all 65,535 ids would be 8 KiB each).
    used: HashSet<u16>,
    /// For a persistent session, the copies in flight in the order sent: what the next
    /// connection sends again if this one ends before they are acknowledged.
    kept: Option<VecDeque<(u16, Outbound)>>,
}

impl OutWindow {
    pub(super) fn new(max: u16, keep: bool) -> Self {
        Self { max: max.max(1), in_flight: 0, next_id: 0, used: HashSet::default(), kept: keep.then(VecDeque::new) }
    }

    /// Marks `id` in flight if it is free (a copy sent again keeps its packet id).
    pub(super) fn reserve(&mut self, id: u16) -> bool {
        if id == 0 || !self.used.insert(id) {
            return false;
        }
        self.in_flight += 1;
        true
    }

    /// Remembers the copy sent as `id` (persistent sessions only).
    pub(super) fn keep(&mut self, id: u16, out: Outbound) {
        if let Some(kept) = &mut self.kept {
            kept.push_back((id, out));
        }
    }

    /// Whether `id` is in flight.
    pub(super) fn in_flight(&self, id: u16) -> bool {
        self.used.contains(&id)
    }

    /// QoS 2: the client received copy `id` (PUBREC); only the PUBREL is owed now. Whether
    /// the kept copy (if any) was still owed as a message.
    pub(super) fn received(&mut self, id: u16) -> Option<Outbound> {
        let kept = self.kept.as_mut()?;
        let (_, out) = kept.iter_mut().find(|(k, _)| *k == id)?;
        if out.released {
            return None;
        }
        out.released = true;
        Some(out.clone())
    }

    /// The kept copy acknowledged as `id`.
    pub(super) fn acked(&mut self, id: u16) -> Option<Outbound> {
        let kept = self.kept.as_mut()?;
        let i = kept.iter().position(|(k, _)| *k == id)?;
        kept.remove(i).map(|(_, out)| out)
    }

    /// The kept copies still unacknowledged, in the order sent, with their packet ids.
    pub(super) fn unacked(&mut self) -> Vec<Outbound> {
        self.kept.take().map_or_else(Vec::new, |k| {
            k.into_iter()
                .map(|(id, mut out)| {
                    out.packet_id = Some(id);
                    out
                })
                .collect()
        })
    }

    /// QoS 1 messages that may be sent now.
    pub(super) fn room(&self) -> usize {
        usize::from(self.max - self.in_flight)
    }

    /// A free packet id, marked in flight; only called with room left (so one is free).
    pub(super) fn take_id(&mut self) -> u16 {
        loop {
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            if self.used.insert(self.next_id) {
                self.in_flight += 1;
                return self.next_id;
            }
        }
    }

    /// The client acknowledged `id`; false when it was not in flight.
    pub(super) fn release(&mut self, id: u16) -> bool {
        if !self.used.remove(&id) {
            return false;
        }
        self.in_flight -= 1;
        if self.in_flight == 0 {
            self.used = HashSet::default();
        }
        true
    }
}

impl<T: Transport> Conn<T> {
    /// Deletes (in the background) the durable rows of copies the client acknowledged.
    pub(super) fn flush_acked_rows(&mut self) {
        self.delete_acked_rows(None);
    }

    /// The connection's last flush: deletes the rows of acknowledged copies, then says the
    /// connection ended (another node taking its session over reads the rows next). In a
    /// task of its own, so that the connection's future stays small.
    pub(super) fn last_flush(&mut self, link: &SessionLink) {
        self.delete_acked_rows(Some(link.inbox.clone()));
    }

    /// Deletes the rows of acknowledged copies in the background, then tells `ended`.
    fn delete_acked_rows(&mut self, ended: Option<Arc<gridlinks_broker::sessions::Inbox>>) {
        if self.acked_rows.is_empty() {
            ended.inspect(|inbox| inbox.connection_ended());
            return;
        }
        let rows = std::mem::take(&mut self.acked_rows);
        let writer = self.st.core.writer.clone();
        spawn_logged("deleting acknowledged MQTT copies", async move {
            let deleted = writer.submit(WriteOp::Broker(rows)).await;
            ended.inspect(|inbox| inbox.connection_ended());
            deleted
        });
    }

    /// A PUBREC for one of the server's QoS 2 publishes.
    pub(super) fn on_pubrec(
        &mut self,
        r: PubResp,
        window: &mut OutWindow,
        link: &SessionLink,
        pending: &mut Option<Box<FuturesOrdered<InFlight>>>,
    ) {
        if r.reason >= 0x80 {
            // Refused by the client (MQTT 5): the exchange ends here.
            self.settle(r.packet_id, window, link);
        } else if window.in_flight(r.packet_id) {
            // Delivered: only the PUBREL is owed now. A durable copy's row says so before
            // the PUBREL goes, so that after a crash the client gets the PUBREL again, not
            // the message.
            let pubrel = Packet::PubRel(resp(r.packet_id, 0, None));
            let row = window
                .received(r.packet_id)
                .zip(self.client_id.as_ref())
                .and_then(|(out, client)| pubsub::released_row(client, &out));
            match row {
                Some(row) => {
                    let done = Done { ack: Some(pubrel), reply: None, close: None, ..Default::default() };
                    pending.get_or_insert_default().push_back(self.after_stored(vec![row], done));
                }
                None => {
                    self.queue(&pubrel);
                }
            }
        } else {
            let reason = if self.version == ProtocolVersion::V5 { rc::PACKET_IDENTIFIER_NOT_FOUND } else { 0 };
            self.queue(&Packet::PubRel(resp(r.packet_id, reason, None)));
        }
    }

    /// Queues what waits in the session's inbox, as far as the window allows: first the
    /// copies an earlier connection left unacknowledged (same packet id, DUP set), then the
    /// queue. Expired messages (MQTT 5 message expiry) are dropped here, without using the
    /// window.
    pub(super) fn send_queued(&mut self, link: &SessionLink, window: &mut OutWindow) {
        let now = std::time::Instant::now();
        let mut unacked = link.inbox.take_unacked();
        if !unacked.is_empty() {
            let rest = unacked.split_off(unacked.len().min(window.room()));
            link.inbox.requeue_unacked(rest);
            for out in unacked {
                if out.released {
                    // QoS 2 after PUBREC: only the PUBREL is owed, with the same id.
                    if let Some(id) = out.packet_id.filter(|id| window.reserve(*id)) {
                        self.queue(&Packet::PubRel(resp(id, 0, None)));
                        window.keep(id, out);
                    }
                } else if !self.expired(&out, now) {
                    let id = out.packet_id.filter(|id| window.reserve(*id)).unwrap_or_else(|| window.take_id());
                    self.send(out, Some(id), true, now, window);
                }
            }
        }
        loop {
            let batch = link.inbox.take(window.room(), |id| !window.in_flight(id));
            if batch.is_empty() {
                return;
            }
            for out in batch {
                if self.expired(&out, now) {
                    continue;
                }
                // A durable copy goes with its fixed id (free unless two in one batch share
                // it, which takes 65,535 copies between them: then it gets another).
                let packet_id = (out.qos > QoS::AtMostOnce).then(|| {
                    out.fixed_packet_id().filter(|&id| window.reserve(id)).unwrap_or_else(|| window.take_id())
                });
                self.send(out, packet_id, false, now, window);
            }
        }
    }

    /// Queues the PUBLISH of `out` (`packet_id` taken for QoS 1 and 2, DUP when sent
    /// again). A message larger than the client's Maximum Packet Size is discarded as if
    /// it had been delivered (MQTT 5 §3.1.2.11.4): its window slot frees, its durable copy
    /// goes.
    pub(super) fn send(
        &mut self,
        out: Outbound,
        packet_id: Option<u16>,
        dup: bool,
        now: std::time::Instant,
        window: &mut OutWindow,
    ) {
        if self.queue_publish(&out, packet_id, dup, now) {
            if let Some(id) = packet_id {
                window.keep(id, out);
            }
            return;
        }
        if packet_id.is_some_and(|id| window.release(id)) {
            if let Some(client) = self.client_id.clone() {
                self.acked_rows.extend(pubsub::acked_row(&client, &out));
            }
        }
    }

    /// The client finished with the server's publish `id` (PUBACK, PUBCOMP, or a refusing
    /// PUBREC): its window slot frees, its durable copy goes, waiting messages follow.
    pub(super) fn settle(&mut self, id: u16, window: &mut OutWindow, link: &SessionLink) {
        if !window.release(id) {
            return;
        }
        if let (Some(out), Some(client)) = (window.acked(id), self.client_id.clone()) {
            self.acked_rows.extend(pubsub::acked_row(&client, &out));
        }
        if link.inbox.has_queued() {
            self.send_queued(link, window);
        }
    }

    /// Whether `out` expired; an expired durable copy's row is deleted.
    pub(super) fn expired(&mut self, out: &Outbound, now: std::time::Instant) -> bool {
        if !out.msg.expired(now) {
            return false;
        }
        if let Some(client) = self.client_id.clone() {
            self.acked_rows.extend(pubsub::acked_row(&client, out));
        }
        true
    }

    /// Encodes the PUBLISH carrying `out` to this client (for MQTT 5 with the message's
    /// properties, its remaining expiry and the matching subscription identifiers) into the
    /// write buffer, by reference: a copy of a fanned-out message costs no allocation
    /// unless its MQTT 5 properties differ per copy. False when it was not queued: larger
    /// than the client's Maximum Packet Size (counted), or not encodable.
    pub(super) fn queue_publish(
        &mut self,
        out: &Outbound,
        packet_id: Option<u16>,
        dup: bool,
        now: std::time::Instant,
    ) -> bool {
        let none = PublishProperties::default();
        let mut own;
        let mut properties = &none;
        if self.version == ProtocolVersion::V5 {
            let expiry = out.msg.expires.map(|e| retained::remaining_secs(e, now));
            properties = match (&out.msg.props, expiry, out.subscription_ids.is_empty()) {
                (Some(p), None, true) => p,
                (p, expiry, _) => {
                    own = p.as_deref().cloned().unwrap_or_default();
                    own.message_expiry_interval = expiry;
                    own.subscription_identifiers.clone_from(&out.subscription_ids);
                    &own
                }
            };
        }
        let qos = match (packet_id, out.qos) {
            (None, _) => QoS::AtMostOnce,
            (Some(_), QoS::ExactlyOnce) => QoS::ExactlyOnce,
            (Some(_), _) => QoS::AtLeastOnce,
        };
        // A client in a tenant's namespace sees its topics in its own terms.
        let topic = self
            .client_id
            .as_deref()
            .and_then(gridlinks_platform::sessions::mount_of)
            .and_then(|m| out.msg.topic.strip_prefix(m))
            .unwrap_or(&out.msg.topic);
        // Our topic alias, when the client takes them: the topic goes once with it.
        let alias = self.aliases.as_mut().and_then(|a| a.outbound(topic, dup));
        let with_alias;
        if let Some((alias, _)) = alias {
            with_alias = PublishProperties { topic_alias: Some(alias), ..properties.clone() };
            properties = &with_alias;
        }
        let publish = PublishRef {
            dup,
            qos,
            retain: out.retain,
            topic: if alias.is_some_and(|(_, with_topic)| !with_topic) { "" } else { topic },
            packet_id,
            payload: &out.msg.payload,
            properties,
        };
        let start = self.wbuf.len();
        if let Err(e) = encode_publish(&publish, self.version, &mut self.wbuf) {
            gridlinks_platform::logging::error_limited!(error = %e, "cannot encode MQTT PUBLISH; closing the connection");
            self.broken = true;
            return false;
        }
        if !self.fits(start) {
            self.st.metrics.too_large.fetch_add(1, Ordering::Relaxed);
            if let (Some(a), Some((_, true))) = (self.aliases.as_mut(), alias) {
                a.unsent(topic);
            }
            return false;
        }
        true
    }

    /// Whether the packet encoded into the write buffer from `start` on fits the client's
    /// Maximum Packet Size; if not, it is taken out again.
    pub(super) fn fits(&mut self, start: usize) -> bool {
        if self.wbuf.len() - start <= self.max_out {
            return true;
        }
        self.wbuf.truncate(start);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::OutWindow;

    #[test]
    fn the_outbound_window_never_reuses_an_id_in_flight_even_across_the_wrap() {
        let mut w = OutWindow::new(3, false);
        let first = w.take_id();
        assert_eq!(w.room(), 2);
        // Cycle through the whole id space twice with `first` still unacknowledged.
        for _ in 0..(2 * 65_535) {
            let id = w.take_id();
            assert_ne!(id, first, "id {first} is still in flight");
            assert_ne!(id, 0);
            assert!(w.release(id));
        }
        assert_eq!(w.room(), 2);
        assert!(w.release(first));
        assert!(!w.release(first), "a second PUBACK for the same id frees nothing");
        assert_eq!(w.room(), 3);
    }
}
