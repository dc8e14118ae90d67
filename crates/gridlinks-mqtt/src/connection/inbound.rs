//! What a client sends: device publishes (batched into one ingest submit per read) and
//! their acknowledgements, pub/sub publishes routed to subscribers, SUBSCRIBE, UNSUBSCRIBE,
//! PUBREL, topic aliases; and the one mapping of ingest refusals to MQTT reason codes.

use super::*;

/// Device publishes decoded from one read (telemetry, client attributes), committed as
/// one ingest batch: one commit-log request, one wake-up, one write of their acks.
pub(super) struct Batch {
    /// When its first publish was decoded (for the PUBACK latency histogram).
    decoded: Instant,
    items: Vec<Item>,
    /// Every publish, in order.
    publishes: Vec<BatchedPublish>,
}

/// A publish in a [`Batch`]: its topic, QoS, packet id and item index (or why it has none).
pub(super) type BatchedPublish = (&'static str, QoS, Option<u16>, Result<usize, IngestError>);

impl Batch {
    /// Commits the batch; the acks of every publish in it, in order.
    async fn commit(self, st: Arc<Mqtt>, device: DeviceId, version: ProtocolVersion) -> Done {
        // A batch of only malformed publishes has no items: the writer answers that at once.
        let results = st.core.ingest.submit(self.items).await;
        let mut done = Done { extra: self.publishes.len().saturating_sub(1), ..Done::default() };
        for (topic, qos, packet_id, item) in self.publishes {
            let result = match item {
                Ok(i) => results.get(i).cloned().unwrap_or(Err(IngestError::Unavailable("no result".into()))),
                Err(e) => Err(e),
            };
            let one =
                outcome(&st, device, topic, result.map(|()| None).map_err(TopicError::from), version, qos, packet_id);
            if matches!(one.ack, Some(Packet::PubAck(_))) {
                st.metrics.observe_puback(self.decoded.elapsed());
            }
            done.batch_acks.extend(one.ack);
            done.close = done.close.or(one.close);
            done.rate_limited |= one.rate_limited;
        }
        done
    }
}

/// Client `session`'s topic filter in its tenant's namespace (`$share/{group}/` stays in
/// front).
pub(super) fn mounted(session: &str, filter: &str) -> String {
    let Some(m) = gridlinks_platform::sessions::mount_of(session) else { return filter.to_owned() };
    match filter.strip_prefix("$share/").and_then(|r| r.split_once('/')) {
        Some((group, rest)) => format!("$share/{group}/{m}{rest}"),
        None => format!("{m}{filter}"),
    }
}

/// May a pub/sub client with `acl` publish to `topic`? If not, why.
pub(super) fn may_publish(acl: &Acl, topic: &str) -> Result<(), String> {
    if topic.starts_with(DEVICE_API_PREFIX) {
        Err(format!("not authorized to publish to {topic:?}: the device API needs a device token"))
    } else if topic.starts_with(gridlinks_platform::sessions::MOUNT_ROOT) {
        Err(format!("not authorized to publish to {topic:?}: tenants' namespaces are the server's"))
    } else if topic.starts_with(SERVER_PREFIX) {
        Err(format!("not authorized to publish to {topic:?}: only the server publishes under {SERVER_PREFIX}"))
    } else if !is_valid_topic_name(topic) || !acl.may_publish(topic) {
        Err(format!("not authorized to publish to {topic:?}: outside this client's ACL"))
    } else {
        Ok(())
    }
}

/// A client's PUBLISH as the message its subscribers get: the topic alias and
/// subscription identifiers are the sender's business; the expiry becomes a deadline.
pub(crate) fn message(p: Publish) -> Message {
    let mut props = p.properties;
    let expires =
        props.message_expiry_interval.take().map(|s| std::time::Instant::now() + Duration::from_secs(u64::from(s)));
    props.topic_alias = None;
    props.subscription_identifiers.clear();
    let has_props = !props.is_empty();
    Message {
        topic: p.topic.into(),
        payload: p.payload,
        qos: p.qos,
        props: has_props.then(|| Arc::new(props)),
        expires,
    }
}

/// Maps the result of a device publish to what the client sees: the one place where the
/// ingest path's refusals ([`IngestError`]) become MQTT reason codes.
pub(super) fn outcome(
    st: &Mqtt,
    device: DeviceId,
    topic: &str,
    result: Result<Option<Reply>, TopicError>,
    version: ProtocolVersion,
    qos: QoS,
    packet_id: Option<u16>,
) -> Done {
    let ack = |reason: u8, text: Option<String>| pub_ack(qos, packet_id, reason, text);
    let err = match result {
        Ok(reply) => return Done { ack: ack(0, None), reply, ..Default::default() },
        Err(e) => e,
    };
    let (reason, text, bad) = match &err {
        TopicError::UnknownTopic => {
            (rc::TOPIC_NAME_INVALID, format!("unknown topic {topic:?}: not a ThingsBoard device topic"), true)
        }
        TopicError::Ingest(e) => match e {
            IngestError::BadPayload(m) => (rc::PAYLOAD_FORMAT_INVALID, format!("payload format invalid: {m}"), true),
            IngestError::Rejected(m) => (rc::PAYLOAD_FORMAT_INVALID, m.clone(), true),
            IngestError::NotGateway | IngestError::ForeignDevice(_) => (rc::NOT_AUTHORIZED, e.to_string(), true),
            IngestError::BadCredential | IngestError::DeviceGone => {
                return Done { close: Some((rc::NOT_AUTHORIZED, "device deleted".into())), ..Default::default() };
            }
            IngestError::Overloaded | IngestError::DiskFull(_) => (rc::QUOTA_EXCEEDED, e.to_string(), false),
            IngestError::Limit(m) => (rc::QUOTA_EXCEEDED, m.clone(), false),
            IngestError::RateLimited(m) => {
                // PUBACK/PUBREC say 0x97 (quota exceeded); a QoS 0 publish cannot be refused
                // alone, and 3.1.1 cannot refuse at all: 0x96 (message rate too high) closes.
                if version == ProtocolVersion::V5 && qos != QoS::AtMostOnce {
                    let ack = ack(rc::QUOTA_EXCEEDED, Some(m.clone()));
                    return Done { ack, rate_limited: true, ..Default::default() };
                }
                return Done { close: Some((rc::MESSAGE_RATE_TOO_HIGH, m.clone())), ..Default::default() };
            }
            IngestError::Unavailable(_) | IngestError::Failed(_) => (rc::UNSPECIFIED_ERROR, e.to_string(), false),
        },
    };
    if bad {
        st.metrics.bad_publishes.fetch_add(1, Ordering::Relaxed);
        // One line per rejected message, never with the payload.
        gridlinks_platform::logging::warn_limited!(%device, topic, error = %text, "rejected MQTT publish");
    }
    if version == ProtocolVersion::V5 {
        // MQTT 5 can say what was wrong and keep the connection (QoS 0 cannot be answered).
        Done { ack: ack(reason, Some(text)), ..Default::default() }
    } else {
        // MQTT 3.1.1 has no negative acknowledgement: closing is the only honest answer.
        Done { close: Some((reason, text)), ..Default::default() }
    }
}

impl<T: Transport> Conn<T> {
    /// Queues the batch being built as one in-flight item (before anything queued after it).
    pub(super) fn seal(&mut self, batch: &mut Option<Box<Batch>>, who: &Who, pending: &mut FuturesOrdered<InFlight>) {
        let (Some(b), Who::Device(device)) = (batch.take(), who) else { return };
        let (st, device, version) = (self.st.clone(), *device, self.version);
        // The batch counted each of its publishes while it was built; now one item is pending.
        self.extra_in_flight -= 1;
        pending.push_back(Box::pin(b.commit(st, device, version)));
    }

    pub(super) fn on_packet(
        &mut self,
        p: Packet,
        who: &Who,
        link: &SessionLink,
        pending: &mut FuturesOrdered<InFlight>,
        batch: &mut Option<Box<Batch>>,
    ) -> Option<End> {
        let v5 = self.version == ProtocolVersion::V5;
        // Activity: a lookup per packet rather than a field, which would grow every
        // connection's task (`a_connection_task_stays_small`).
        if let (Who::Device(device), Packet::Publish(_) | Packet::PingReq) = (who, &p) {
            self.st.core.activity.touch(*device);
        }
        if let (Packet::Publish(p), Who::Device(device)) = (&p, who) {
            let batchable = p.properties.topic_alias.is_none()
                && (p.qos != QoS::ExactlyOnce || p.packet_id.is_none_or(|pid| !link.inbox.awaiting_release(pid)))
                && self.rate.as_ref().is_none();
            if let (true, Some(item)) = (batchable, device_api::batch_item(&self.st, *device, &p.topic, &p.payload)) {
                self.st.metrics.publishes.fetch_add(1, Ordering::Relaxed);
                let topic = if p.topic == TELEMETRY_TOPIC { TELEMETRY_TOPIC } else { ATTRIBUTES_TOPIC };
                let b = batch.get_or_insert_with(|| {
                    Box::new(Batch { decoded: Instant::now(), items: Vec::new(), publishes: Vec::new() })
                });
                let index = item.map(|item| {
                    b.items.push(item);
                    b.items.len() - 1
                });
                b.publishes.push((topic, p.qos, p.packet_id, index));
                self.extra_in_flight += 1;
                return None;
            }
        }
        // Everything else keeps its place after the batch.
        self.seal(batch, who, pending);
        match p {
            Packet::Publish(p) => {
                self.st.metrics.publishes.fetch_add(1, Ordering::Relaxed);
                if self.rate.as_mut().is_some_and(|r| !r.allow()) {
                    let text = format!(
                        "message rate limit exceeded: mqtt.rate_limit_messages = {} per second",
                        self.st.core.cfg.mqtt.rate_limit_messages
                    );
                    // PUBACK/PUBREC cannot carry 0x96 (message rate too high): 0x97 quota exceeded.
                    return match (v5, p.qos, p.packet_id) {
                        (true, QoS::AtLeastOnce, Some(pid)) => {
                            pending.push_back(ready(Some(Packet::PubAck(resp(pid, rc::QUOTA_EXCEEDED, Some(text))))));
                            None
                        }
                        (true, QoS::ExactlyOnce, Some(pid)) => {
                            pending.push_back(ready(Some(Packet::PubRec(resp(pid, rc::QUOTA_EXCEEDED, Some(text))))));
                            None
                        }
                        // QoS 0 cannot be refused one by one, and 3.1.1 cannot refuse at all.
                        _ => Some(End::Disconnect(rc::MESSAGE_RATE_TOO_HIGH, text)),
                    };
                }
                let mut p = p;
                if let Some(alias) = p.properties.topic_alias.take() {
                    if let Err(end) = self.resolve_alias(alias, &mut p.topic) {
                        return Some(end);
                    }
                }
                if p.qos == QoS::ExactlyOnce {
                    if let Some(pid) = p.packet_id.filter(|pid| link.inbox.awaiting_release(*pid)) {
                        // A redelivery of a QoS 2 message already received (on this or an
                        // earlier connection of the session): PUBREC again, nothing routed.
                        pending.push_back(ready(Some(Packet::PubRec(resp(pid, 0, None)))));
                        return None;
                    }
                }
                let device = match who {
                    Who::Device(device) => *device,
                    Who::Client { id, acl, .. } => return self.route(id, acl, p, pending),
                };
                let st = self.st.clone();
                let (version, decoded) = (self.version, Instant::now());
                pending.push_back(Box::pin(async move {
                    let result = device_api::handle_publish(st.platform.clone(), device, &p.topic, p.payload).await;
                    let done = outcome(&st, device, &p.topic, result, version, p.qos, p.packet_id);
                    if matches!(done.ack, Some(Packet::PubAck(_))) {
                        st.metrics.observe_puback(decoded.elapsed());
                    }
                    done
                }));
            }
            Packet::PubRel(r) => {
                let known = link.inbox.release(r.packet_id);
                let reason = if known || !v5 { 0 } else { rc::PACKET_IDENTIFIER_NOT_FOUND };
                let pubcomp = Done {
                    ack: Some(Packet::PubComp(resp(r.packet_id, reason, None))),
                    reply: None,
                    close: None,
                    ..Default::default()
                };
                match (&self.client_id, known && self.expiry > 0) {
                    // A persistent session stored the packet id: the PUBCOMP waits until it
                    // is deleted, or a restart could take the client's next message with
                    // that id for a copy sent again and drop it.
                    (Some(client), true) => {
                        let row = pubsub::incoming_row(client, r.packet_id, false);
                        pending.push_back(self.after_stored(vec![row], pubcomp));
                    }
                    _ => pending.push_back(Box::pin(std::future::ready(pubcomp))),
                }
            }
            // Handled in the read loop (they open the outbound window).
            Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_) => {}
            Packet::Subscribe(s) => {
                let (ack, retained) = self.subscribe(who, s);
                let done = Done { ack: Some(ack), reply: None, close: None, retained, ..Default::default() };
                pending.push_back(self.after_session_saved(who, done));
            }
            Packet::Unsubscribe(u) => {
                let ack = self.unsubscribe(who, u);
                let done = Done { ack: Some(ack), reply: None, close: None, ..Default::default() };
                pending.push_back(self.after_session_saved(who, done));
            }
            Packet::PingReq => {
                self.queue(&Packet::PingResp);
            }
            // 0x04: "disconnect with will message".
            Packet::Disconnect(d) => {
                self.disconnect_expiry = d.session_expiry_interval;
                return Some(if d.reason == rc::DISCONNECT_WITH_WILL_MESSAGE { End::Gone } else { End::Normal });
            }
            Packet::Connect(_) => {
                self.st.metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
                return Some(End::Disconnect(rc::PROTOCOL_ERROR, "second CONNECT".into()));
            }
            Packet::Auth(_) | Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                self.st.metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
                return Some(End::Disconnect(rc::PROTOCOL_ERROR, "unexpected packet from a client".into()));
            }
        }
        None
    }

    /// `done` once a persistent session's subscriptions are stored (SUBACK and UNSUBACK
    /// wait for that); at once for other sessions.
    pub(super) fn after_session_saved(&self, who: &Who, done: Done) -> InFlight {
        match who {
            Who::Client { id, owner, .. } if self.expiry > 0 => {
                let row = pubsub::session_row(&self.st, id, owner, self.expiry, None);
                self.after_stored(vec![row], done)
            }
            _ => Box::pin(std::future::ready(done)),
        }
    }

    /// `done` once `rows` are committed; if they cannot be, the connection closes (an
    /// acknowledgement cannot say "not stored" for every packet). The write goes ahead
    /// if the connection ends first.
    pub(super) fn after_stored(&self, rows: Vec<BrokerRow>, done: Done) -> InFlight {
        let writer = self.st.core.writer.clone();
        let write = tokio::spawn(async move { writer.submit(WriteOp::Broker(rows)).await });
        let v5 = self.version == ProtocolVersion::V5;
        Box::pin(async move {
            match write.await.unwrap_or(Err(StoreError::Closed)) {
                Ok(_) => done,
                Err(e) => Done {
                    ack: None,
                    reply: None,
                    close: Some((if v5 { rc::UNSPECIFIED_ERROR } else { 0 }, format!("session state not stored: {e}"))),
                    ..Default::default()
                },
            }
        })
    }

    /// Applies MQTT 5 topic alias `alias` to a PUBLISH topic: an empty topic takes the
    /// alias's, a non-empty one (re)defines it.
    pub(super) fn resolve_alias(&mut self, alias: u16, topic: &mut String) -> Result<(), End> {
        if alias == 0 || alias > TOPIC_ALIAS_MAX {
            return Err(End::Disconnect(
                rc::TOPIC_ALIAS_INVALID,
                format!("topic alias {alias} is outside 1..={TOPIC_ALIAS_MAX}"),
            ));
        }
        let slot = usize::from(alias - 1);
        let inbound = &mut self.aliases.get_or_insert_with(Default::default).inbound;
        if topic.is_empty() {
            match inbound.get(slot).cloned().flatten() {
                Some(t) => *topic = t,
                None => return Err(End::Disconnect(rc::PROTOCOL_ERROR, format!("topic alias {alias} was never set"))),
            }
        } else {
            if inbound.is_empty() {
                *inbound = vec![None; usize::from(TOPIC_ALIAS_MAX)];
            }
            inbound[slot] = Some(topic.clone());
        }
        Ok(())
    }

    /// A pub/sub client's PUBLISH: routed to the subscribed client sessions at once, then
    /// acknowledged once what must be durable is committed. Topics outside the client's
    /// ACL, and the device API's, are refused.
    pub(super) fn route(
        &mut self,
        client: &str,
        acl: &Acl,
        mut p: Publish,
        pending: &mut FuturesOrdered<InFlight>,
    ) -> Option<End> {
        let v5 = self.version == ProtocolVersion::V5;
        let (qos, packet_id) = (p.qos, p.packet_id);
        if let Err(text) = may_publish(acl, &p.topic) {
            self.st.metrics.bad_publishes.fetch_add(1, Ordering::Relaxed);
            return match (self.st.core.cfg.mqtt.deny_action, v5) {
                (DenyAction::Disconnect, _) | (DenyAction::Reason, false) => {
                    Some(End::Disconnect(rc::NOT_AUTHORIZED, text))
                }
                (DenyAction::Ignore, false) => {
                    pending.push_back(ready(pub_ack(qos, packet_id, 0, None)));
                    None
                }
                (_, true) => {
                    pending.push_back(ready(pub_ack(qos, packet_id, rc::NOT_AUTHORIZED, Some(text))));
                    None
                }
            };
        }
        if let Some(m) = gridlinks_platform::sessions::mount_of(client) {
            p.topic = format!("{m}{}", p.topic);
        }
        let retain = p.retain;
        let msg = message(p);
        // A persistent session remembers a QoS 2 message's packet id until its PUBREL, also
        // across a restart: committed with the copies, before the PUBREC.
        let remember = packet_id
            .filter(|_| qos == QoS::ExactlyOnce && self.expiry > 0)
            .map(|id| pubsub::incoming_row(client, id, true));
        let routing = pubsub::route(&self.st, client, &msg, retain, remember);
        if routing.congested {
            self.flags.set(super::Flags::CONGESTED);
        }
        // MQTT 5: 0x10 "no matching subscribers" is a success code.
        let reason = if !routing.matched && v5 { rc::NO_MATCHING_SUBSCRIBERS } else { 0 };
        let Some(work) = routing.pending else {
            pending.push_back(ready(pub_ack(qos, packet_id, reason, None)));
            return None;
        };
        // The acknowledgement waits until the retained message and the copies for
        // persistent sessions are committed, and (backpressure) until full subscriber
        // queues have room or those subscribers are disconnected as too slow.
        pending.push_back(Box::pin(async move {
            match work.await {
                Ok(()) => {
                    Done { ack: pub_ack(qos, packet_id, reason, None), reply: None, close: None, ..Default::default() }
                }
                Err(e) => {
                    let text = format!("message not stored: {e}");
                    let reason = if matches!(e, StoreError::DiskFull(_) | StoreError::Overloaded) {
                        rc::QUOTA_EXCEEDED
                    } else {
                        rc::UNSPECIFIED_ERROR
                    };
                    if v5 {
                        Done {
                            ack: pub_ack(qos, packet_id, reason, Some(text)),
                            reply: None,
                            close: None,
                            ..Default::default()
                        }
                    } else {
                        Done {
                            ack: None,
                            reply: None,
                            close: Some((rc::UNSPECIFIED_ERROR, text)),
                            ..Default::default()
                        }
                    }
                }
            }
        }));
        None
    }

    pub(super) fn subscribe(&mut self, who: &Who, s: Subscribe) -> (Packet, Vec<Outbound>) {
        let v5 = self.version == ProtocolVersion::V5;
        let mut retained = Vec::new();
        let codes: Vec<u8> = s
            .filters
            .iter()
            .map(|f| {
                let granted = f.qos;
                match who {
                    Who::Device(device) => {
                        // Server-originated device messages go at QoS 0 or 1.
                        let granted = granted.min(QoS::AtLeastOnce);
                        if f.filter.starts_with("$share/") {
                            return if v5 {
                                rc::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
                            } else {
                                rc::V3_SUBSCRIPTION_FAILURE
                            };
                        }
                        if validate_filter(&f.filter).is_err() {
                            return if v5 { rc::TOPIC_FILTER_INVALID } else { rc::V3_SUBSCRIPTION_FAILURE };
                        }
                        match self.st.devices.sessions.subscribe(*device, self.session, &f.filter, granted) {
                            Ok(()) => u8::from(granted),
                            Err(_) => {
                                if v5 {
                                    rc::QUOTA_EXCEEDED
                                } else {
                                    rc::V3_SUBSCRIPTION_FAILURE
                                }
                            }
                        }
                    }
                    Who::Client { id: client, acl, .. } => {
                        let plain = f
                            .filter
                            .strip_prefix("$share/")
                            .and_then(|r| r.split_once('/'))
                            .map_or(f.filter.as_str(), |(_, p)| p);
                        if plain.starts_with(DEVICE_API_PREFIX)
                            || plain.starts_with(gridlinks_platform::sessions::MOUNT_ROOT)
                            || !acl.may_subscribe(&f.filter)
                        {
                            return if v5 { rc::NOT_AUTHORIZED } else { rc::V3_SUBSCRIPTION_FAILURE };
                        }
                        let filter = mounted(client, &f.filter);
                        let opts = SubOptions {
                            qos: granted,
                            no_local: f.no_local,
                            retain_as_published: f.retain_as_published,
                            retain_handling: f.retain_handling,
                            subscription_id: s.subscription_identifier,
                        };
                        match self.st.devices.sessions.subscribe_client(client, &filter, opts) {
                            Ok(r) => {
                                if let Some(shared) = self.st.shared.as_ref().filter(|_| filter.starts_with("$share/"))
                                {
                                    shared.follow(&self.st, &filter);
                                }
                                retained.extend(r.into_iter().map(|(msg, qos)| Outbound {
                                    retain: true,
                                    subscription_ids: s.subscription_identifier.into_iter().collect(),
                                    ..Outbound::plain(msg, qos)
                                }));
                                u8::from(granted)
                            }
                            Err(SubscribeError::TooMany(_)) => {
                                if v5 {
                                    rc::QUOTA_EXCEEDED
                                } else {
                                    rc::V3_SUBSCRIPTION_FAILURE
                                }
                            }
                            Err(_) => {
                                if v5 {
                                    rc::TOPIC_FILTER_INVALID
                                } else {
                                    rc::V3_SUBSCRIPTION_FAILURE
                                }
                            }
                        }
                    }
                }
            })
            .collect();
        let reason_string = (v5 && codes.contains(&rc::QUOTA_EXCEEDED)).then(|| {
            format!(
                "too many subscriptions: at most {} per session (mqtt.max_subscriptions_per_client)",
                self.st.core.cfg.mqtt.max_subscriptions_per_client
            )
        });
        (Packet::SubAck(SubAck { packet_id: s.packet_id, return_codes: codes, reason_string }), retained)
    }

    pub(super) fn unsubscribe(&mut self, who: &Who, u: Unsubscribe) -> Packet {
        let codes = u
            .filters
            .iter()
            .map(|f| {
                let existed = match who {
                    Who::Device(device) => self.st.devices.sessions.unsubscribe(*device, self.session, f),
                    Who::Client { id, .. } => self.st.devices.sessions.unsubscribe_client(id, &mounted(id, f)),
                };
                if existed {
                    0
                } else {
                    rc::NO_SUBSCRIPTION_EXISTED
                }
            })
            .collect();
        Packet::UnsubAck(UnsubAck { packet_id: u.packet_id, reason_codes: codes, reason_string: None })
    }
}
