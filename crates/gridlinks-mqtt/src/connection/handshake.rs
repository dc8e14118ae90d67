//! The handshake: the CONNECT (the first packet), authentication of a device token, an
//! application's user name and password or an anonymous client, the session's registration
//! (a persistent one committed before its CONNACK) and the CONNACK itself.

use super::*;
use gridlinks_listener::tls::ClientCert;
use gridlinks_platform::provision::ChainRefusal;

impl<T: Transport> Conn<T> {
    pub(super) async fn read_connect(&mut self) -> Option<Box<Connect>> {
        loop {
            match self.decode() {
                Ok(Some(Packet::Connect(c))) => return Some(c),
                Ok(Some(_)) => return None, // the first packet must be CONNECT
                Ok(None) => {
                    if !self.fill().await {
                        return None;
                    }
                }
                Err(DecodeError::UnsupportedProtocol { .. }) => {
                    // Answered in the MQTT 3.1.1 layout, which every client understands.
                    self.queue(&Packet::ConnAck(ConnAck {
                        session_present: false,
                        code: rc::V3_UNACCEPTABLE_PROTOCOL_VERSION,
                        properties: ConnAckProperties::default(),
                    }));
                    let _ = self.flush().await;
                    return None;
                }
                Err(_) => return None,
            }
        }
    }

    /// Checks an application's user name and password, or a device's access token (user
    /// name), or admits a client without one as a pub/sub client when
    /// `mqtt.allow_anonymous` is on; registers the session (resuming a persistent one,
    /// committing its stored state first); answers CONNACK either way.
    pub(super) async fn admit(&mut self, c: &Connect) -> Option<Admitted> {
        let v5 = self.version == ProtocolVersion::V5;
        let refuse = |v3: u8, v5code: u8| if v5 { v5code } else { v3 };
        let mut code = 0;
        let mut who = None;
        // Why, for an MQTT 5 CONNACK's reason string.
        let mut refusal = None;
        let assigned = c.client_id.is_empty().then(|| format!("gridlinks-{}", uuid::Uuid::new_v4().simple()));
        let client_id: Arc<str> = assigned.as_deref().unwrap_or(&c.client_id).into();
        let password = c.password.as_deref().filter(|p| !p.is_empty());
        let peer = self.stream.peer_ip().unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let user = c.username.as_deref().filter(|u| !u.is_empty());
        // Owned: the connection's state is not shared across the awaits below.
        let cert = self.stream.client_cert().cloned();
        if let Some(cert) = &cert {
            match by_certificate(&self.st, cert, &client_id).await {
                Ok(w) => who = Some(w),
                Err(Some(text)) => {
                    code = refuse(rc::V3_NOT_AUTHORIZED, rc::NOT_AUTHORIZED);
                    refusal = v5.then_some(text);
                }
                Err(None) => code = refuse(rc::V3_SERVER_UNAVAILABLE, rc::SERVER_UNAVAILABLE),
            }
        } else {
            // A name is a device token unless it comes with a password and is an application's
            // (names and tokens are kept apart; this settles older data).
            let app = user.is_some_and(|u| password.is_some() && self.st.clients.contains(u));
            let device = match user {
                Some(u) if !app => self.st.core.ingest.authenticate(u),
                _ => Err(IngestError::BadCredential),
            };
            // MQTT_BASIC device credentials: by user name, or by client id alone.
            let basic = match (&device, app) {
                (Err(IngestError::BadCredential), false) => {
                    self.st.basic_login(peer, user, &c.client_id, password).await
                }
                _ => Ok(None),
            };
            let auth_refusal = |e: &AuthError| match e {
                AuthError::Throttled(_) => refuse(rc::V3_SERVER_UNAVAILABLE, rc::CONNECTION_RATE_EXCEEDED),
                AuthError::Busy => refuse(rc::V3_SERVER_UNAVAILABLE, rc::SERVER_BUSY),
                _ => refuse(rc::V3_BAD_USERNAME_OR_PASSWORD, rc::BAD_USER_NAME_OR_PASSWORD),
            };
            match (user, device, basic) {
                (_, Ok(d), _) | (_, _, Ok(Some(d))) => who = Some(Who::Device(d)),
                (_, _, Err(e)) => {
                    code = auth_refusal(&e);
                    refusal = v5.then(|| e.to_string()).filter(|_| code != rc::BAD_USER_NAME_OR_PASSWORD);
                }
                (None, _, Ok(None)) if self.st.core.cfg.mqtt.allow_anonymous => {
                    let acl = self.st.client_acl(&self.st.anonymous_acl, None, &client_id);
                    who = Some(Who::Client { id: client_id, owner: "".into(), acl });
                }
                (None, _, Ok(None)) => code = refuse(rc::V3_BAD_USERNAME_OR_PASSWORD, rc::BAD_USER_NAME_OR_PASSWORD),
                (Some(_), Err(IngestError::BadCredential), Ok(None)) if password.is_none() => {
                    code = refuse(rc::V3_NOT_AUTHORIZED, rc::NOT_AUTHORIZED)
                }
                // An application's login; an unknown name costs what a wrong password costs.
                (Some(user), Err(IngestError::BadCredential), Ok(None)) => {
                    let password = password.unwrap_or_default();
                    match self.st.clients.login(&self.st.auth, peer, user, password, &client_id).await {
                        Ok(login) => who = Some(self.st.application(login, user, client_id)),
                        Err(e) => {
                            code = auth_refusal(&e);
                            refusal = v5.then(|| e.to_string()).filter(|_| code != rc::BAD_USER_NAME_OR_PASSWORD);
                        }
                    }
                }
                (_, Err(_), Ok(None)) => code = refuse(rc::V3_SERVER_UNAVAILABLE, rc::SERVER_UNAVAILABLE),
            }
        }
        // A node whose Kafka or database is unreachable takes no new sessions: the client
        // is told why and goes to another node, or retries.
        if let Some(e) = self.st.core.backends.refusal().filter(|_| code == 0) {
            code = refuse(rc::V3_SERVER_UNAVAILABLE, rc::SERVER_UNAVAILABLE);
            refusal = v5.then(|| e.to_string());
            who = None;
        }
        if let (Some(Who::Client { acl, .. }), Some(will)) = (&who, &c.will) {
            if may_publish(acl, &will.topic).is_err() {
                code = refuse(rc::V3_NOT_AUTHORIZED, rc::NOT_AUTHORIZED);
                who = None;
            }
        }
        if code == 0 && c.client_id.is_empty() && !v5 && (!c.clean_start || c.protocol == ProtocolVersion::V3_1) {
            code = rc::V3_IDENTIFIER_REJECTED;
            who = None;
        }
        // Tenants' namespaces are the server's: a client id there would be another
        // tenant's session.
        if code == 0 && c.client_id.starts_with(gridlinks_platform::sessions::MOUNT_ROOT) {
            code = refuse(rc::V3_IDENTIFIER_REJECTED, rc::CLIENT_IDENTIFIER_NOT_VALID);
            refusal = v5.then(|| format!("client ids may not start with {}", gridlinks_platform::sessions::MOUNT_ROOT));
            who = None;
        }
        // MQTT 5 Response Information: a topic prefix of the client's own, allowed to it
        // (after the configured and the credential's rules: a deny there still holds).
        let mut response_information = None;
        if let (0, true, Some(Who::Client { acl, .. })) =
            (code, c.properties.request_response_information == Some(1), &mut who)
        {
            let own_id = assigned.as_deref().unwrap_or(&c.client_id);
            let template = &self.st.core.cfg.mqtt.response_information;
            if !template.is_empty() && !own_id.contains(['+', '#', '/']) {
                let prefix = template.replace("%c", own_id);
                let rule = Rule { permission: Permission::Allow, action: Action::All, filter: format!("{prefix}/#") };
                let mut with = (**acl).clone();
                with.rules.push(rule);
                *acl = Arc::new(with);
                response_information = Some(prefix);
            }
        }
        let mut props = ConnAckProperties::default();
        // Each device token and application user name has a bounded number of connections.
        let credential = match (&who, c.username.as_deref()) {
            (Some(Who::Device(_)), _) if cert.is_some() => cert.as_ref().map(|c| c.fingerprint.as_str()),
            (Some(Who::Device(_)), Some(token)) => Some(token),
            (Some(Who::Client { owner, .. }), _) if !owner.is_empty() => Some(&**owner),
            _ => None,
        };
        let mut slot = None;
        if let Some(key) = credential.filter(|_| code == 0) {
            slot = self.st.devices.counts.acquire(key, self.st.core.cfg.mqtt.max_connections_per_credential);
            if slot.is_none() {
                self.st.metrics.over_credential_limit.fetch_add(1, Ordering::Relaxed);
                code = refuse(rc::V3_SERVER_UNAVAILABLE, rc::QUOTA_EXCEEDED);
                refusal = v5.then(|| {
                    "too many connections with this credential (mqtt.max_connections_per_credential)".to_owned()
                });
                who = None;
            }
        }
        let mut registered = None;
        if let (0, Some(who)) = (code, &who) {
            match self.register(c, who).await {
                Ok(r) => registered = Some(r),
                Err(e) => {
                    gridlinks_platform::logging::warn_limited!(error = %e, "cannot store an MQTT session");
                    code = refuse(rc::V3_SERVER_UNAVAILABLE, rc::SERVER_UNAVAILABLE);
                }
            }
        }
        props.reason_string = refusal;
        let present = registered.as_ref().is_some_and(|(_, present, _)| *present);
        if v5 && code == 0 {
            props.receive_maximum = Some(self.st.core.cfg.mqtt.receive_maximum);
            props.maximum_packet_size = u32::try_from(self.st.core.cfg.mqtt.max_packet_size).ok();
            // Retained messages and shared subscriptions are for pub/sub clients.
            let pubsub = u8::from(matches!(who, Some(Who::Client { .. })));
            props.retain_available = Some(pubsub);
            props.shared_subscription_available = Some(pubsub);
            props.subscription_identifiers_available = Some(pubsub);
            props.topic_alias_maximum = Some(TOPIC_ALIAS_MAX);
            props.response_information = response_information;
            props.wildcard_subscription_available = Some(1);
            props.assigned_client_identifier = assigned;
            props.server_keep_alive = keep_alive(c.keep_alive, self.st.core.cfg.mqtt.max_keep_alive, v5).1;
            let asked = c.properties.session_expiry_interval.unwrap_or(0);
            // The server's own limit, when lower than asked, is said in CONNACK.
            props.session_expiry_interval = (asked > self.expiry).then_some(self.expiry);
        }
        self.queue(&Packet::ConnAck(ConnAck { session_present: present, code, properties: props }));
        let flushed = self.flush().await.is_ok();
        let (link, _, durable) = registered?;
        let admitted = Admitted { who: who?, link, durable, _slot: slot };
        if !flushed {
            self.release(&admitted);
            return None;
        }
        Some(admitted)
    }

    /// Registers an accepted connection's session: (session link, session present,
    /// durable). A pub/sub client's persistent session is stored before CONNACK.
    pub(super) async fn register(&mut self, c: &Connect, who: &Who) -> Result<(SessionLink, bool, bool), StoreError> {
        let st = self.st.clone();
        let (id, owner) = match who {
            Who::Device(device) => {
                return Ok((st.devices.sessions.register(*device, st.core.cfg.mqtt.outbound_queue), false, false))
            }
            Who::Client { id, owner, .. } => (id, owner),
        };
        // Rules that withhold topics of granted subscriptions, in the router's terms.
        let withheld = match who {
            Who::Client { acl, .. } if acl.filters_delivery() => {
                let rules = acl.rules.iter().map(|r| Rule { filter: mounted(id, &r.filter), ..r.clone() }).collect();
                Some(Arc::new(Acl { rules, ..Acl::default() }))
            }
            _ => None,
        };
        let max = st.core.cfg.mqtt.max_session_expiry;
        self.expiry = match self.version {
            ProtocolVersion::V5 => c.properties.session_expiry_interval.unwrap_or(0).min(max),
            _ if !c.clean_start => max,
            _ => 0,
        };
        // With several nodes, the session may be held by another node: taken over first.
        crate::handoff::take_over(&st, id).await?;
        // What a discarded persistent session left on disk (read before registering, so
        // copies queued for the new session are not among them).
        // Every stored session is also in memory (loaded at start-up), so only a known
        // persistent session costs a storage read here.
        let old_rows = if c.clean_start && st.devices.sessions.is_persistent(id) {
            pubsub::forget_rows(&st.core.store, id)?
        } else {
            Vec::new()
        };
        let r = st.devices.sessions.register_client(
            id,
            owner.clone(),
            st.core.cfg.mqtt.client_outbound_queue,
            c.clean_start,
            self.expiry,
            withheld,
        );
        let mut rows = if r.discarded { old_rows } else { Vec::new() };
        if self.expiry > 0 {
            rows.push(pubsub::session_row(&st, id, owner, self.expiry, None));
        } else if r.present {
            // Resumed as a session that now ends with this connection.
            rows.push(BrokerRow { table: BrokerTable::Sessions, key: id.as_bytes().to_vec(), value: None });
        }
        let durable = self.expiry > 0 || r.present;
        if !rows.is_empty() {
            if let Err(e) = st.core.writer.submit(WriteOp::Broker(rows)).await {
                st.devices.sessions.unregister_client(id, &r.link, Vec::new());
                return Err(e);
            }
        }
        Ok((r.link, r.present, durable))
    }

    /// Ends the session of a connection that failed right after CONNACK.
    pub(super) fn release(&self, a: &Admitted) {
        match &a.who {
            Who::Device(device) => self.st.devices.sessions.unregister(*device, a.link.id),
            Who::Client { id, .. } => {
                self.st.devices.sessions.unregister_client(id, &a.link, Vec::new());
            }
        }
    }
}

/// Who a client certificate makes the client. As in
/// ThingsBoard it alone decides (the user name and password are not read): the device
/// whose X509_CERTIFICATE credentials hold it; else, by X.509 chain provisioning, the
/// device of the profile whose CA certificate it chains to; else, if `tls.client_ca_file`
/// issued it, the application credential its CN names (Mosquitto's
/// use_identity_as_username). `Err(Some(why))`: not authorized; `Err(None)`: storage
/// unavailable.
async fn by_certificate(st: &Mqtt, cert: &ClientCert, client_id: &Arc<str>) -> Result<Who, Option<String>> {
    if let Some(d) = st.x509_login(&cert.fingerprint).await.map_err(|()| None)? {
        return Ok(Who::Device(d));
    }
    let chain: Vec<Vec<u8>> = cert.chain.iter().map(|d| d.to_vec()).collect();
    let cn = cert.common_name.clone().unwrap_or_default();
    match gridlinks_platform::provision::x509_chain(&st.platform, &chain).await {
        Ok(d) => Ok(Who::Device(d)),
        Err(ChainRefusal::NoProfile) if st.issued_to_application(&chain) => {
            match st.clients.cert_login(&cn, client_id) {
                Some(login) => Ok(st.application(login, &cn, client_id.clone())),
                None => Err(Some(format!("no MQTT client credential is named {cn:?} (the certificate's CN)"))),
            }
        }
        Err(ChainRefusal::NoProfile) => {
            Err(Some("no device has this client certificate (X509_CERTIFICATE credentials)".into()))
        }
        Err(why) => Err(Some(why.to_string())),
    }
}

/// The keep alive a connection is held to, and the Server Keep Alive an MQTT 5 client is
/// told: `max` (seconds; 0: no bound) replaces what a v5 client asks above it, or no keep
/// alive at all (0), as Mosquitto's `max_keepalive` does. An MQTT 3.1.1 client cannot be
/// told and keeps its own.
pub(super) fn keep_alive(asked: u16, max: u16, v5: bool) -> (u16, Option<u16>) {
    if v5 && max > 0 && (asked == 0 || asked > max) {
        (max, Some(max))
    } else {
        (asked, None)
    }
}

#[cfg(test)]
mod keep_alive_tests {
    use super::keep_alive;

    #[test]
    fn a_bound_applies_to_mqtt5_clients_only() {
        assert_eq!(keep_alive(120, 30, true), (30, Some(30)));
        assert_eq!(keep_alive(0, 30, true), (30, Some(30)), "none at all is more than the bound");
        assert_eq!(keep_alive(20, 30, true), (20, None));
        assert_eq!(keep_alive(120, 30, false), (120, None), "3.1.1 cannot be told");
        assert_eq!(keep_alive(120, 0, true), (120, None), "no bound");
    }
}
