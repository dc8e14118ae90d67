//! A provisioning connection: user name `provision`, no password (ThingsBoard's MQTT
//! provisioning API). It may subscribe to `/provision/response` and publish one request to
//! `/provision/request`; the answer comes on `/provision/response`. Nothing else: no device
//! API, no pub/sub, no session. It ends when the client disconnects, sends anything else,
//! or after [`PROVISION_WINDOW`].

use super::*;

/// The topic a provisioning request is published to.
pub(super) const REQUEST_TOPIC: &str = "/provision/request";
/// The topic the answer is sent on.
pub(super) const RESPONSE_TOPIC: &str = "/provision/response";
/// How long a provisioning connection may stay.
const PROVISION_WINDOW: Duration = Duration::from_secs(30);

impl<T: Transport> Conn<T> {
    /// Serves a provisioning connection after its CONNECT, to its end.
    pub(super) async fn provision(&mut self) {
        self.queue(&Packet::ConnAck(ConnAck { session_present: false, code: 0, properties: Default::default() }));
        if self.flush().await.is_err() {
            return;
        }
        let _ = tokio::time::timeout(PROVISION_WINDOW, self.provision_exchange()).await;
    }

    async fn provision_exchange(&mut self) {
        let mut answered = false;
        loop {
            let packet = match self.decode() {
                Ok(Some(p)) => p,
                Ok(None) if self.fill().await => continue,
                _ => return,
            };
            match packet {
                Packet::Subscribe(s) => {
                    // Only the answer's topic, at QoS 0.
                    let codes = s.filters.iter().map(|f| if f.filter == RESPONSE_TOPIC { 0 } else { 0x80 }).collect();
                    let ack = SubAck { packet_id: s.packet_id, return_codes: codes, reason_string: None };
                    self.queue(&Packet::SubAck(ack));
                }
                Packet::Publish(p) if p.topic == REQUEST_TOPIC && !answered && p.qos != QoS::ExactlyOnce => {
                    answered = true;
                    let peer = self.stream.peer_ip().unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
                    let answer = gridlinks_platform::provision::provision(&self.st, peer, &p.payload).await;
                    if let Some(packet_id) = p.packet_id {
                        let ack = PubResp { packet_id, reason: 0, reason_string: None, user_properties: Vec::new() };
                        self.queue(&Packet::PubAck(ack));
                    }
                    self.queue(&Packet::Publish(Publish {
                        dup: false,
                        qos: QoS::AtMostOnce,
                        retain: false,
                        topic: RESPONSE_TOPIC.into(),
                        packet_id: None,
                        payload: answer.to_string().into(),
                        properties: PublishProperties::default(),
                    }));
                }
                Packet::PingReq => {
                    self.queue(&Packet::PingResp);
                }
                // DISCONNECT, a second request, another topic, anything else: the end.
                _ => return,
            }
            if self.broken || self.flush().await.is_err() {
                return;
            }
        }
    }
}
