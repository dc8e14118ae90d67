//! The broker's state machine under random packet sequences from several clients at once,
//! against the real binary: valid and invalid packets, garbage bytes, dropped sockets,
//! takeovers, persistent sessions. The server must never fall over, and no client may
//! ever receive a message on a topic that no filter it subscribed to matches (no leak of
//! other clients' data).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::mqtt::*;
use common::Server;
use gridlinks_broker::topic::matches;

const TOPICS: [&str; 6] = ["a", "a/b", "a/b/c", "b/b", "$SYS/x", "v1/devices/me/telemetry"];
const FILTERS: [&str; 9] = ["a/#", "+/b", "#", "a/+/c", "$SYS/#", "$share/g/a/#", "b/+", "a/#/b", "v1/#"];
const CLIENTS: [&str; 4] = ["f0", "f1", "f2", "f3"];

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn random_packet(r: &mut Rng, v5: bool) -> Packet {
    let qos = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce][r.next(3)];
    let id = 1 + r.next(20) as u16;
    match r.next(8) {
        0 | 1 => {
            let filter = FILTERS[r.next(FILTERS.len())].to_string();
            Packet::Subscribe(Subscribe {
                packet_id: id,
                filters: vec![SubscriptionRequest {
                    filter,
                    qos,
                    no_local: v5 && r.next(3) == 0,
                    retain_as_published: v5 && r.next(2) == 0,
                    retain_handling: if v5 { r.next(3) as u8 } else { 0 },
                }],
                subscription_identifier: (v5 && r.next(2) == 0).then(|| 1 + r.next(1000) as u32),
                user_properties: Vec::new(),
            })
        }
        2 => Packet::Unsubscribe(Unsubscribe {
            packet_id: id,
            filters: vec![FILTERS[r.next(FILTERS.len())].into()],
            user_properties: Vec::new(),
        }),
        3 | 4 => {
            let mut properties = PublishProperties::default();
            if v5 {
                properties.message_expiry_interval = (r.next(3) == 0).then(|| r.next(3) as u32);
                properties.topic_alias = (r.next(4) == 0).then(|| 1 + r.next(80) as u16);
                properties.user_properties = vec![("k".into(), "v".into()); r.next(3)];
            }
            Packet::Publish(Publish {
                dup: r.next(5) == 0,
                qos,
                retain: r.next(4) == 0,
                topic: TOPICS[r.next(TOPICS.len())].into(),
                packet_id: (qos != QoS::AtMostOnce).then_some(id),
                payload: Bytes::from(vec![b'x'; r.next(64)]),
                properties,
            })
        }
        5 => {
            let ack = PubResp {
                packet_id: id,
                reason: [0, 0x80][r.next(2)],
                reason_string: None,
                user_properties: Vec::new(),
            };
            [
                Packet::PubAck(ack.clone()),
                Packet::PubRec(ack.clone()),
                Packet::PubRel(ack.clone()),
                Packet::PubComp(ack),
            ][r.next(4)]
            .clone()
        }
        6 => Packet::PingReq,
        _ => Packet::Disconnect(Disconnect {
            reason: [0, 4][r.next(2)],
            session_expiry_interval: None,
            reason_string: None,
            server_reference: None,
        }),
    }
}

#[test]
fn random_packets_from_several_clients_never_crash_the_server_or_leak() {
    let server = Server::start_env(&[("GRIDLINKS_MQTT_ALLOW_ANONYMOUS", "true")]);
    let port = server.mqtt_port;
    let mut r = Rng(0x5DEE_CE66_D1CE_4E5B);
    // Per client id: its connection, and every filter it asked for since its session began.
    let mut conns: HashMap<&str, Raw> = HashMap::new();
    let mut asked: HashMap<&str, Vec<String>> = HashMap::new();
    let mut received = 0;
    for _ in 0..1500 {
        let c = CLIENTS[r.next(CLIENTS.len())];
        match r.next(10) {
            0 => {
                let v5 = r.next(2) == 0;
                let clean = r.next(2) == 0;
                let version = if v5 { ProtocolVersion::V5 } else { ProtocolVersion::V3_1_1 };
                let (raw, ack) = Raw::connect_custom(port, version, |k| {
                    k.client_id = c.into();
                    k.clean_start = clean;
                    if v5 && !clean {
                        k.properties.session_expiry_interval = Some(30);
                    }
                });
                if !ack.session_present {
                    asked.insert(c, Vec::new());
                }
                raw.stream.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
                conns.insert(c, raw);
            }
            1 => {
                conns.remove(c); // the socket just drops
            }
            2 => {
                if let Some(raw) = conns.get_mut(c) {
                    let junk: Vec<u8> = (0..1 + r.next(40)).map(|_| r.next(256) as u8).collect();
                    let _ = raw.send_raw(&junk);
                }
            }
            _ => {
                let Some(raw) = conns.get_mut(c) else { continue };
                let p = random_packet(&mut r, raw.version == ProtocolVersion::V5);
                if let Packet::Subscribe(s) = &p {
                    asked.entry(c).or_default().extend(s.filters.iter().map(|f| f.filter.clone()));
                }
                let _ = raw.try_send(&p);
            }
        }
        // Read what has arrived on every connection; check each PUBLISH.
        for (id, raw) in conns.iter_mut() {
            while let Ok(Some(p)) = raw.try_recv() {
                if let Packet::Publish(m) = p {
                    received += 1;
                    let ok = asked.get(id).is_some_and(|fs| {
                        fs.iter().any(|f| matches(f.strip_prefix("$share/g/").unwrap_or(f), &m.topic))
                    });
                    assert!(ok, "{id} received {:?}, which none of its filters {:?} matches", m.topic, asked.get(id));
                }
            }
        }
    }
    assert!(received > 0, "the random traffic delivered nothing: the check checked nothing");
    drop(conns);
    // Still serving: a fresh pair of clients exchanges a message.
    let (mut sub, _) = Raw::connect_as(port, ProtocolVersion::V5, "after-sub", None);
    assert_eq!(sub.subscribe(1, &["after"]).return_codes, [1]);
    let (mut publisher, _) = Raw::connect_as(port, ProtocolVersion::V5, "after-pub", None);
    publisher.publish("after", b"ok", QoS::AtLeastOnce, Some(1));
    let got = std::iter::from_fn(|| sub.recv()).find_map(|p| if let Packet::Publish(m) = p { Some(m) } else { None });
    assert_eq!(got.map(|m| m.payload), Some(Bytes::from_static(b"ok")));
    assert_eq!(server.req("GET", "/healthz", None, None).0, 200);
}
