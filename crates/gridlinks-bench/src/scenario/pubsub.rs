//! `pubsub`: publisher groups and subscriber groups, as in TBMQ's performance tests.
//!
//! Publisher `i` of group `g` publishes to `PREFIX/g/CLIENT-ID`; every subscriber of
//! group `g` subscribes to `PREFIX/g/+` (with `--shared`, the group's subscribers share
//! one `$share/gG/PREFIX/g/+` subscription and split its messages). Payloads are the
//! tracker JSON of [`PayloadKind::Tracker`], stamped with their send time in µs, so a
//! subscriber measures end-to-end latency (publish written → PUBLISH decoded).
//!
//! Phases:
//! 1. **subscribe**: subscribers connect and subscribe (SUBACK checked).
//! 2. **connect**: publishers connect.
//! 3. **publish**: publishers run exactly as in `mqtt-telemetry` (window of unacked QoS 1
//!    publishes, or QoS 0 writes; `--rate`/`--interval` pacing).
//! 4. **drain**: after the last publish ack, wait until every expected delivery arrived,
//!    or no delivery came for `--drain-timeout`.
//! 5. **disconnect**.
//!
//! Expected deliveries: each acknowledged publish once per connected subscriber of its
//! group (once per group with `--shared`). With QoS 1 on both sides a missing delivery
//! is a lost message: the run fails with exit code 2.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::BytesMut;
use gridlinks_codec::mqtt::{Packet, PubResp, QoS, Subscribe, SubscriptionRequest};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::telemetry::{
    disconnect_all, render_payload, send_interval, tracker_stamp, Fleet, PayloadKind, PayloadSpec, Plan, Topics,
};
use super::{ConnectPacer, Progress, ProgressKind, ProgressSources, Target};
use crate::cli::PubsubArgs;
use crate::figures;
use crate::loss_check::unix_micros;
use crate::mqtt_client::{ConnectionError, MqttConnection};
use crate::proc_stats::ProcessStats;
use crate::report::{LatencySummary, PubsubReport, Reasons, ServerCost};
use crate::stats::{Counters, LatencyRecorder, LatencyShards};

/// Latency histogram shards per kind.
const LATENCY_SHARDS: usize = 32;

/// Connect outcomes buffered between subscriber tasks and the collector.
const OUTCOME_CHANNEL: usize = 1024;

/// How often the drain phase looks at the delivery count.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// Packet id of the one SUBSCRIBE each subscriber sends.
const SUBSCRIBE_ID: u16 = 1;

/// How one subscriber's run ended.
#[derive(Default)]
struct SubscriberResult {
    /// Messages delivered to it.
    received: u64,
    /// When the last one arrived.
    last_received: Option<Instant>,
    /// Why the connection was lost, if it was.
    lost: Option<String>,
    /// The connection, still open, for DISCONNECT.
    conn: Option<MqttConnection>,
}

/// Runs the scenario and prints its report; exit code 2 when QoS 1 deliveries are missing.
pub async fn run(args: PubsubArgs) -> anyhow::Result<std::process::ExitCode> {
    figures::finish(&args.target.output, &measure(&args).await?, crate::settings::pubsub(&args))
}

/// Runs the scenario.
pub async fn measure(args: &PubsubArgs) -> anyhow::Result<PubsubReport> {
    let publishers = args.groups * args.publishers;
    let subscribers = args.groups * args.subscribers;
    let target = Arc::new(Target::resolve(&args.target, publishers + subscribers).await?);
    let qos = |q: u8| {
        if q == 0 {
            QoS::AtMostOnce
        } else {
            QoS::AtLeastOnce
        }
    };
    let plan = Arc::new(Plan {
        topic: Topics::Each(
            (0..publishers)
                .map(|i| {
                    format!(
                        "{}/{}/{}",
                        args.topic_prefix,
                        i / args.publishers.max(1),
                        target.client_options(i).client_id
                    )
                })
                .collect(),
        ),
        qos: qos(args.pub_qos),
        inflight: args.inflight,
        payload: PayloadSpec { target_len: args.payload_bytes, kind: PayloadKind::Tracker, template: None },
        messages_per_device: args.messages_per_publisher,
        ack_timeout: args.ack_timeout,
        devices: publishers,
        interval: send_interval(args.rate, args.interval, publishers),
        record_acks: false,
        lag_slots: None,
        ramp_up: Duration::ZERO,
        first_ts: 0,
    });
    let duration = super::window_duration(args.duration, args.messages_per_publisher);
    let me = ProcessStats::own().context("reading own /proc")?;
    let counters = Arc::new(Counters::default());
    let puback = LatencyShards::new(LATENCY_SHARDS);
    let e2e = LatencyShards::new(LATENCY_SHARDS);
    let progress = Progress::start(
        ProgressKind::Pubsub,
        ProgressSources {
            counters: Arc::clone(&counters),
            server: target.server_stats.clone(),
            ack_latency: Some(Arc::clone(&puback)),
            e2e_latency: Some(Arc::clone(&e2e)),
            keep_buckets: false,
        },
        "subscribing",
    );

    // Phase 1: subscribers.
    let started = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (outcome_tx, mut outcome_rx) = mpsc::channel::<(usize, Result<(), String>)>(OUTCOME_CHANNEL);
    let spawner = {
        let (target, counters, e2e) = (Arc::clone(&target), Arc::clone(&counters), Arc::clone(&e2e));
        let per_group = args.subscribers.max(1);
        let (prefix, shared, sub_qos) = (args.topic_prefix.clone(), args.shared, qos(args.sub_qos));
        let persistent = args.persistent_subscribers;
        let rate = args.connect_rate;
        tokio::spawn(async move {
            let pacer = ConnectPacer::new(rate, target.max_pending);
            let mut tasks = Vec::with_capacity(subscribers);
            for j in 0..subscribers {
                let group = j / per_group;
                let filter =
                    if shared { format!("$share/g{group}/{prefix}/{group}/+") } else { format!("{prefix}/{group}/+") };
                let subscriber = Subscriber {
                    index: publishers + j,
                    group,
                    filter,
                    qos: sub_qos,
                    persistent,
                    target: Arc::clone(&target),
                    counters: Arc::clone(&counters),
                    latency: e2e.recorder(j),
                };
                let permit = pacer.slot(j).await;
                let (outcome_tx, stop_rx) = (outcome_tx.clone(), stop_rx.clone());
                tasks.push(tokio::spawn(subscriber.run(permit, outcome_tx, stop_rx)));
            }
            tasks
        })
    };
    let mut connect_failures = Reasons::new();
    let mut subscribed = vec![0usize; args.groups];
    for _ in 0..subscribers {
        match outcome_rx.recv().await {
            Some((group, Ok(()))) => subscribed[group] += 1,
            Some((_, Err(reason))) => *connect_failures.entry(reason).or_default() += 1,
            None => break,
        }
    }
    let subscriber_tasks = spawner.await.context("subscriber spawner panicked")?;

    // Phase 2: publishers.
    progress.set_phase("connecting");
    let fleet = Fleet::connect(&target, &plan, &counters, &puback, args.connect_rate).await?;
    for (reason, n) in &fleet.connect_failures {
        *connect_failures.entry(reason.clone()).or_default() += n;
    }
    let connect_seconds = started.elapsed().as_secs_f64();

    // Phase 3: publish.
    let server_before = target.server_sample()?;
    let me_before = me.cpu_seconds()?;
    if let Some(s) = &server_before {
        progress.reset_peak(s.memory.rss_kib);
    }
    progress.set_phase("publishing");
    let published = fleet.publish(duration).await?;

    // Phase 4: drain.
    progress.set_phase("draining");
    let mut acked_per_group = vec![0u64; args.groups];
    for (i, acked) in published.acked.iter().enumerate() {
        acked_per_group[i / args.publishers.max(1)] += acked;
    }
    let expected = expected_deliveries(&acked_per_group, &subscribed, args.shared);
    let mut last_count = Counters::get(&counters.received);
    let mut last_change = Instant::now();
    loop {
        let now_count = Counters::get(&counters.received);
        if now_count >= expected {
            break;
        }
        if now_count != last_count {
            last_count = now_count;
            last_change = Instant::now();
        } else if last_change.elapsed() >= args.drain_timeout {
            break;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let server_after = target.server_sample()?;
    let me_after = me.cpu_seconds()?;
    stop_tx.send_replace(true);
    let mut results = Vec::with_capacity(subscriber_tasks.len());
    for task in subscriber_tasks {
        results.push(task.await.context("subscriber task panicked")?);
    }

    // Phase 5: disconnect.
    progress.set_phase("disconnecting");
    let mut dropped = published.lost;
    let mut open = published.open;
    let mut last_delivery = published.start;
    let mut received = 0;
    for r in results {
        if let Some(reason) = r.lost {
            *dropped.entry(format!("subscriber: {reason}")).or_default() += 1;
        }
        received += r.received;
        last_delivery = last_delivery.max(r.last_received.unwrap_or(published.start));
        open.extend(r.conn);
    }
    disconnect_all(open).await;
    let rss_peak = server_after.map(|s| progress.peak(s.memory.rss_kib));
    let timeline = progress.finish();
    Ok(PubsubReport {
        server: target.name(),
        mqtt_version: target.version_label(args.target.mqtt_version),
        groups: args.groups,
        publishers: args.publishers,
        subscribers: args.subscribers,
        shared: args.shared,
        pub_qos: args.pub_qos,
        sub_qos: args.sub_qos,
        inflight: args.inflight,
        offered_rate: plan.interval.map_or(0.0, |i| publishers as f64 / i.as_secs_f64()),
        payload_bytes: render_payload(&mut BytesMut::new(), &plan.payload, 0, unix_micros()).len(),
        connected: Counters::get(&counters.connected),
        connect_failures,
        connect_seconds,
        publish_seconds: (published.last_ack - published.start).as_secs_f64(),
        delivery_seconds: (last_delivery - published.start).as_secs_f64(),
        sent: Counters::get(&counters.sent),
        acked: Counters::get(&counters.acked),
        failed: Counters::get(&counters.failed),
        expected,
        received,
        dropped,
        puback: (args.pub_qos == 1).then(|| LatencySummary::from_histogram(&puback.merged())),
        e2e: LatencySummary::from_histogram(&e2e.merged()),
        server_cost: ServerCost::between(target.server_stats.as_ref(), server_before, server_after, rss_peak),
        generator_cpu_seconds: me_after - me_before,
        timeline,
    })
}

/// Deliveries expected from `acked` publishes per group with `subscribed` subscribers
/// per group: one per subscriber, or one per group when they share a subscription.
fn expected_deliveries(acked: &[u64], subscribed: &[usize], shared: bool) -> u64 {
    acked.iter().zip(subscribed).map(|(&a, &s)| if shared { a * u64::from(s > 0) } else { a * s as u64 }).sum()
}

/// One subscribing connection.
struct Subscriber {
    index: usize,
    group: usize,
    filter: String,
    qos: QoS,
    /// Connect with a persistent session.
    persistent: bool,
    target: Arc<Target>,
    counters: Arc<Counters>,
    latency: LatencyRecorder,
}

impl Subscriber {
    async fn run(
        mut self,
        permit: OwnedSemaphorePermit,
        outcome: mpsc::Sender<(usize, Result<(), String>)>,
        mut stop: watch::Receiver<bool>,
    ) -> SubscriberResult {
        let mut result = SubscriberResult::default();
        let subscribed = self.subscribe().await;
        drop(permit);
        let mut conn = match subscribed {
            Ok(conn) => {
                Counters::add(&self.counters.connected, 1);
                let _ = outcome.send((self.group, Ok(()))).await;
                conn
            }
            Err(reason) => {
                Counters::add(&self.counters.connect_failed, 1);
                let _ = outcome.send((self.group, Err(reason))).await;
                return result;
            }
        };
        drop(outcome);
        let ping_every = self.target.ping_interval();
        let mut next_ping = Instant::now() + ping_every;
        loop {
            let first = tokio::select! {
                packet = conn.read_packet() => packet,
                _ = stop.changed() => break,
                _ = tokio::time::sleep_until(next_ping) => {
                    conn.queue(&Packet::PingReq).expect("PINGREQ always encodes");
                    if let Err(e) = conn.flush().await {
                        return self.lost(result, ConnectionError::Io(e));
                    }
                    next_ping = Instant::now() + ping_every;
                    continue;
                }
            };
            let mut next = match first {
                Ok(packet) => Some(packet),
                Err(e) => return self.lost(result, e),
            };
            let now = Instant::now();
            let now_us = unix_micros();
            let mut count = 0;
            while let Some(packet) = next {
                match packet {
                    Packet::Publish(p) => {
                        count += 1;
                        if let Some(sent_us) = tracker_stamp(&p.payload) {
                            self.latency.record(Duration::from_micros(now_us.saturating_sub(sent_us)));
                        }
                        if let Some(id) = p.packet_id {
                            let ack =
                                PubResp { packet_id: id, reason: 0, reason_string: None, user_properties: Vec::new() };
                            // QoS 2 deliveries are not requested (SUBSCRIBE asks QoS <= 1).
                            conn.queue(&Packet::PubAck(ack)).expect("PUBACK always encodes");
                        }
                    }
                    Packet::Disconnect(_) => return self.lost(result, ConnectionError::Closed),
                    _ => {} // PINGRESP
                }
                next = match conn.try_decode() {
                    Ok(p) => p,
                    Err(e) => return self.lost(result, e),
                };
            }
            if count > 0 {
                result.received += count;
                result.last_received = Some(now);
                Counters::add(&self.counters.received, count);
            }
            if let Err(e) = conn.flush().await {
                return self.lost(result, ConnectionError::Io(e));
            }
            next_ping = Instant::now() + ping_every;
        }
        result.conn = Some(conn);
        result
    }

    /// Connects and subscribes; a failure as the reason counted in the report.
    async fn subscribe(&self) -> Result<MqttConnection, String> {
        let mut opts = self.target.client_options(self.index);
        opts.session_expiry = self.persistent.then_some(3600);
        let mut conn =
            MqttConnection::connect(self.target.endpoint(self.index), &opts).await.map_err(|e| e.reason())?;
        let subscribe = Packet::Subscribe(Subscribe {
            packet_id: SUBSCRIBE_ID,
            filters: vec![SubscriptionRequest {
                filter: self.filter.clone(),
                qos: self.qos,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
            }],
            subscription_identifier: None,
            user_properties: Vec::new(),
        });
        conn.queue(&subscribe).map_err(|e| format!("cannot encode SUBSCRIBE: {e}"))?;
        let answer = tokio::time::timeout(self.target.connect_timeout, async {
            conn.flush().await.map_err(ConnectionError::Io)?;
            loop {
                match conn.read_packet().await? {
                    Packet::SubAck(ack) => return Ok::<_, ConnectionError>(ack),
                    _ => continue,
                }
            }
        })
        .await;
        match answer {
            Err(_) => Err("timeout waiting for SUBACK".into()),
            Ok(Err(e)) => Err(format!("subscribe: {}", e.reason())),
            Ok(Ok(ack)) => match ack.return_codes.first() {
                Some(&code) if code < 0x80 => Ok(conn),
                Some(&code) => Err(format!("SUBACK {code:#04x} refused")),
                None => Err("SUBACK without return code".into()),
            },
        }
    }

    /// Ends a subscriber whose connection broke.
    fn lost(&mut self, mut result: SubscriberResult, e: ConnectionError) -> SubscriberResult {
        self.latency.flush();
        Counters::add(&self.counters.dropped, 1);
        result.lost = Some(e.reason());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_deliveries_count_each_subscriber_or_each_shared_group() {
        assert_eq!(expected_deliveries(&[10, 20], &[2, 1], false), 40);
        assert_eq!(expected_deliveries(&[10, 20], &[2, 1], true), 30);
        assert_eq!(expected_deliveries(&[10, 20], &[0, 3], true), 20);
        assert_eq!(expected_deliveries(&[10, 20], &[0, 3], false), 60);
    }
}
