//! One relay session: a replication stream, a producer and an ack tracker
//! that live and die together. The main `select!` is biased, by priority:
//! 1. shutdown (stop reading, drain in-flight acks, confirm, exit),
//! 2. delivery reports (acks move the confirmable position; a transport
//!    failure ends the session),
//! 3. the status-update timer (keeps the walsender alive while we are not
//!    reading, e.g. under backpressure),
//! 4. the drain deadline,
//! 5. new WAL, only while in-flight events and bytes are under their limits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{dead_letter, RelayError, RelaySettings};
use crate::config::OnError;
use crate::metrics as m;
use crate::outbox::{KafkaRecord, OutboxEvent, RecordMapper};
use crate::progress::{AckTracker, DeliveryId};
use crate::sink::{DeliveryReport, FailureKind, KafkaSink, SendError, TopicManager};
use crate::source::session::{Received, SourceSession};
use crate::source::transactions::SourceItem;
use crate::Lsn;

/// Least time between two status updates while the confirmable position
/// moves: batches updates under load, still confirms within a blink.
const MIN_STATUS_GAP: Duration = Duration::from_millis(100);

/// How long to wait for the rest of a refused batch's reports. librdkafka
/// reports a failed batch in one go; this only covers scheduling delays.
const BATCH_MATE_WAIT: Duration = Duration::from_millis(500);

/// `reason` values of the dead-letter counter (the `kind` of [`Session::poisoned`]).
pub(super) const DEAD_LETTER_REASONS: [&str; 2] = ["mapping", "delivery"];

pub enum SessionEnd {
    Shutdown,
    Reconnect(String),
}

/// An event's place in the WAL, stable across reconnects: its transaction's
/// commit LSN and its position within the transaction.
type EventIdentity = (Lsn, u32);

/// Events the broker refused, remembered across reconnects.
///
/// A broker refuses a whole batch when one record in it is too large, so a
/// broker-reported per-event failure only makes an event a *suspect*: on the
/// replay it is sent alone, after everything before it is acked. Refused
/// again alone, it is *confirmed* poison and the policy applies without
/// another try (which would only turn the producer fatal again).
#[derive(Default)]
pub struct PoisonMemory(HashMap<EventIdentity, Verdict>);

#[derive(Clone)]
enum Verdict {
    Suspect,
    Confirmed(String),
}

struct InFlight {
    id: DeliveryId,
    record: KafkaRecord,
    event: OutboxEvent,
    identity: EventIdentity,
    dead_lettered: bool,
    /// Sent with nothing else in flight (a suspect on trial).
    isolated: bool,
    /// When the WAL carrying it arrived, for the receive-to-ack histogram.
    received_at: Instant,
}

pub struct Session<'a> {
    settings: &'a RelaySettings,
    mapper: &'a mut RecordMapper,
    poison: &'a mut PoisonMemory,
    sink: KafkaSink,
    topics: TopicManager,
    tracker: AckTracker,
    in_flight: HashMap<u64, InFlight>,
    /// Position of the next event within its transaction.
    ordinal: u32,
    /// Set when a poison event stopped the relay (`on_error = "stop"`).
    halted: Option<String>,
    published: HashMap<Arc<str>, (Counter, Counter)>,
    /// When the message being processed arrived.
    received_at: Instant,
    filtered: m::Filtered,
    wal_to_ack: Histogram,
    /// Handles of the per-event and per-loop metrics, looked up once: a
    /// registry lookup per event is measurable at 100k events/s.
    hot: HotMetrics,
}

struct HotMetrics {
    events_seen: Counter,
    transactions: Counter,
    in_flight_events: Gauge,
    in_flight_bytes: Gauge,
}

impl HotMetrics {
    fn new() -> Self {
        HotMetrics {
            events_seen: metrics::counter!(m::EVENTS_SEEN),
            transactions: metrics::counter!(m::TRANSACTIONS),
            in_flight_events: metrics::gauge!(m::IN_FLIGHT_EVENTS),
            in_flight_bytes: metrics::gauge!(m::IN_FLIGHT_BYTES),
        }
    }
}

impl<'a> Session<'a> {
    pub async fn run(
        settings: &'a RelaySettings,
        mapper: &'a mut RecordMapper,
        poison: &'a mut PoisonMemory,
        mut stop: watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        let health = &settings.health;
        let mut source = SourceSession::open(&settings.source).await?;
        health.postgres_up();
        health.progress(0, source.start_lsn);
        // Statistics feed only the endpoint's gauges: none without one.
        let metrics_on = settings.config.metrics.listen.is_some();
        let stats = metrics_on.then(|| m::kafka::stats_hook(Arc::clone(health)));
        let sink = KafkaSink::with_stats(&settings.brokers, &settings.config.kafka, stats)?;
        health.new_producer();
        let topics = TopicManager::new(&settings.brokers, &settings.config.kafka)?;
        // A halt belongs to its session; the next one re-reads the event and
        // decides again.
        health.set_halted(None);
        metrics::gauge!(m::HALTED).set(0.0);
        let mut s = Session {
            settings,
            mapper,
            poison,
            sink,
            topics,
            tracker: AckTracker::new(source.start_lsn),
            in_flight: HashMap::new(),
            ordinal: 0,
            halted: None,
            published: HashMap::new(),
            received_at: Instant::now(),
            filtered: m::Filtered::new(),
            wal_to_ack: metrics::histogram!(m::WAL_RECEIVE_TO_ACK_SECONDS),
            hot: HotMetrics::new(),
        };
        let relay = &settings.config.relay;
        let interval = settings.config.postgres.status_interval;
        let mut items = Vec::new();
        let mut drain_deadline: Option<Instant> = None;
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        loop {
            if let Some(deadline) = drain_deadline {
                let drained = !source.in_transaction() && s.tracker.in_flight() == 0;
                if drained || Instant::now() >= deadline {
                    let confirmed = s.tracker.confirmable();
                    tracing::info!(%confirmed, unacked = s.tracker.in_flight(), drained, "shutting down");
                    s.filtered.update(source.ignored());
                    source.finish(confirmed).await?;
                    m::gauge_lsn(m::CONFIRMED_LSN, confirmed);
                    return Ok(SessionEnd::Shutdown);
                }
            }
            let full = s.tracker.in_flight() >= relay.max_in_flight_events
                || s.tracker.in_flight_bytes() as u64 >= relay.max_in_flight_bytes;
            // While draining, read on only to finish the open transaction, so
            // a restart does not repeat half of it.
            let reading = !full
                && s.halted.is_none()
                && (drain_deadline.is_none() || source.in_transaction());
            let status_at = Instant::from_std(source.stream().next_status_deadline(interval));
            tokio::select! {
                biased;
                _ = stop.wait_for(|v| *v), if drain_deadline.is_none() => {
                    tracing::info!(in_flight = s.tracker.in_flight(), "shutdown requested; draining");
                    drain_deadline = Some(Instant::now() + relay.shutdown_timeout);
                }
                report = s.sink.next_report() => {
                    let Some(report) = report else {
                        return Ok(SessionEnd::Reconnect("Kafka producer stopped".into()));
                    };
                    if let Some(end) = s.on_report(report).await? {
                        return Ok(end);
                    }
                    // Take every report already waiting: one wake-up per
                    // burst of acks instead of one per ack.
                    while let Some(report) = s.sink.try_report() {
                        if let Some(end) = s.on_report(report).await? {
                            return Ok(end);
                        }
                    }
                }
                _ = tokio::time::sleep_until(status_at) => {}
                _ = tokio::time::sleep_until(drain_deadline.unwrap_or(far)), if drain_deadline.is_some() => {}
                received = source.next(&mut items), if reading => {
                    let received = received?;
                    s.received_at = Instant::now();
                    for item in items.drain(..) {
                        if let Some(end) = s.on_item(item).await? {
                            return Ok(end);
                        }
                    }
                    if let Received::Keepalive { wal_end, reply_requested } = received {
                        if !source.in_transaction() {
                            s.tracker.keepalive(wal_end);
                        }
                        if reply_requested {
                            source.stream().send_status(s.tracker.confirmable(), false).await.map_err(crate::source::session::SourceError::from)?;
                        }
                    }
                }
            }
            let confirmable = s.tracker.confirmable();
            if source
                .stream()
                .status_due(confirmable, interval, MIN_STATUS_GAP)
            {
                source
                    .stream()
                    .send_status(confirmable, false)
                    .await
                    .map_err(crate::source::session::SourceError::from)?;
                m::gauge_lsn(m::CONFIRMED_LSN, source.stream().last_sent());
                m::gauge_lsn(m::RECEIVED_LSN, source.stream().received());
                s.filtered.update(source.ignored());
            }
            s.hot.in_flight_events.set(s.tracker.in_flight() as f64);
            s.hot
                .in_flight_bytes
                .set(s.tracker.in_flight_bytes() as f64);
            health.progress(s.tracker.in_flight(), source.stream().last_sent());
        }
    }

    async fn on_item(&mut self, item: SourceItem) -> Result<Option<SessionEnd>, RelayError> {
        match item {
            SourceItem::Checkpoint { lsn, .. } => {
                self.tracker.commit(lsn);
                self.ordinal = 0;
                self.hot.transactions.increment(1);
                Ok(None)
            }
            SourceItem::Event(event) => {
                self.hot.events_seen.increment(1);
                self.settings.health.event_seen();
                let identity = (event.commit_lsn, self.ordinal);
                self.ordinal += 1;
                let record = match self.mapper.map(&event) {
                    Ok(record) => record,
                    Err(e) => {
                        return self
                            .poisoned(event, None, identity, "mapping", &e.to_string())
                            .await
                    }
                };
                let verdict = if self.poison.0.is_empty() {
                    None
                } else {
                    self.poison.0.get(&identity).cloned()
                };
                match verdict {
                    Some(Verdict::Confirmed(error)) => {
                        self.poisoned(event, Some(record), identity, "delivery", &error)
                            .await
                    }
                    Some(Verdict::Suspect) => self.send_isolated(event, record, identity).await,
                    None => self.send(event, record, identity, false).await,
                }
            }
        }
    }

    /// Applies `on_error` to an event that cannot be delivered as it is.
    async fn poisoned(
        &mut self,
        event: OutboxEvent,
        record: Option<KafkaRecord>,
        identity: EventIdentity,
        kind: &str,
        error: &str,
    ) -> Result<Option<SessionEnd>, RelayError> {
        match (
            &self.settings.config.relay.on_error,
            &self.settings.dead_letter_topic,
        ) {
            (OnError::DeadLetter, Some(dlq)) => {
                let dlq_record = match &record {
                    Some(r) => dead_letter::from_record(r, dlq, &event, kind, error),
                    None => dead_letter::from_unmappable(&event, dlq, error),
                };
                tracing::warn!(lsn = %event.commit_lsn, xid = event.xid, %error, "event sent to the dead-letter topic");
                metrics::counter!(m::EVENTS_DEAD_LETTERED, "reason" => kind.to_string())
                    .increment(1);
                self.send(event, dlq_record, identity, true).await
            }
            _ => {
                self.halt(format!(
                    "event in transaction {} (commit LSN {}) cannot be delivered: {error}; \
                     the relay will not move past it (relay.on_error = \"stop\")",
                    event.xid, event.commit_lsn
                ));
                Ok(None)
            }
        }
    }

    fn halt(&mut self, reason: String) {
        tracing::error!(%reason, "relay halted");
        metrics::gauge!(m::HALTED).set(1.0);
        self.settings.health.set_halted(Some(reason.clone()));
        self.halted = Some(reason);
    }

    async fn send(
        &mut self,
        event: OutboxEvent,
        record: KafkaRecord,
        identity: EventIdentity,
        dead_lettered: bool,
    ) -> Result<Option<SessionEnd>, RelayError> {
        self.topics.ensure(&record.topic).await?;
        let id = self.tracker.push_event(record.size);
        let entry = InFlight {
            id,
            record,
            event,
            identity,
            dead_lettered,
            isolated: false,
            received_at: self.received_at,
        };
        self.enqueue(entry).await
    }

    /// Sends a suspect alone: waits until nothing else is in flight, sends
    /// it, and waits for its report before reading on.
    async fn send_isolated(
        &mut self,
        event: OutboxEvent,
        record: KafkaRecord,
        identity: EventIdentity,
    ) -> Result<Option<SessionEnd>, RelayError> {
        if let Some(end) = self.drain_reports(|s| s.in_flight.is_empty()).await? {
            return Ok(Some(end));
        }
        self.topics.ensure(&record.topic).await?;
        let id = self.tracker.push_event(record.size);
        let key = id.get();
        let entry = InFlight {
            id,
            record,
            event,
            identity,
            dead_lettered: false,
            isolated: true,
            received_at: self.received_at,
        };
        if let Some(end) = self.enqueue(entry).await? {
            return Ok(Some(end));
        }
        let end = self
            .drain_reports(|s| !s.in_flight.contains_key(&key))
            .await?;
        if end.is_none() && self.halted.is_none() {
            // Delivered alone: it was a batch-mate of the real culprit.
            self.poison.0.remove(&identity);
        }
        Ok(end)
    }

    /// After a broker refusal, gathers the reports of the rest of the refused
    /// batch (they arrive together) so every refused event becomes a suspect
    /// now, rather than one per reconnect.
    async fn collect_batch_mates(&mut self) {
        while !self.in_flight.is_empty() {
            let report = match tokio::time::timeout(BATCH_MATE_WAIT, self.sink.next_report()).await
            {
                Ok(Some(report)) => report,
                Ok(None) | Err(_) => return,
            };
            let Some(entry) = self.in_flight.remove(&report.id) else {
                continue;
            };
            if let Err(failure) = report.result {
                if failure.kind == FailureKind::PerEvent && !entry.dead_lettered {
                    self.poison
                        .0
                        .entry(entry.identity)
                        .or_insert(Verdict::Suspect);
                }
            }
        }
    }

    /// Handles delivery reports until `done` holds (or the session must end).
    async fn drain_reports(
        &mut self,
        done: impl Fn(&Self) -> bool,
    ) -> Result<Option<SessionEnd>, RelayError> {
        while !done(self) && self.halted.is_none() {
            let Some(report) = self.sink.next_report().await else {
                return Ok(Some(SessionEnd::Reconnect("Kafka producer stopped".into())));
            };
            if let Some(end) = self.on_report(report).await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Hands one record to the producer, waiting out a full local queue.
    async fn enqueue(&mut self, entry: InFlight) -> Result<Option<SessionEnd>, RelayError> {
        loop {
            let r = &entry.record;
            match self.sink.send(
                entry.id.get(),
                &r.topic,
                r.key.as_deref(),
                r.value.as_deref(),
                &r.headers,
                r.timestamp_ms,
            ) {
                Ok(()) => {
                    self.in_flight.insert(entry.id.get(), entry);
                    return Ok(None);
                }
                Err(SendError::QueueFull) => {
                    let Some(report) = self.sink.next_report().await else {
                        return Ok(Some(SessionEnd::Reconnect("Kafka producer stopped".into())));
                    };
                    if let Some(end) = self.on_report(report).await? {
                        return Ok(Some(end));
                    }
                }
                Err(SendError::Rejected {
                    code,
                    kind: FailureKind::PerEvent,
                    message,
                }) => {
                    // librdkafka refused this record alone (e.g. above the
                    // producer's message.max.bytes): poison for certain,
                    // and the producer stays healthy.
                    let error = format!("{message} ({code:?})");
                    self.poison
                        .0
                        .insert(entry.identity, Verdict::Confirmed(error.clone()));
                    if entry.dead_lettered {
                        self.halt(format!(
                            "the dead-letter topic refused an event too: {error}"
                        ));
                        self.in_flight.insert(entry.id.get(), entry);
                        return Ok(None);
                    }
                    // The tracker slot stays; the DLQ copy (or nothing, when
                    // halted) is what acks it.
                    return self.redirect(entry, "delivery", &error).await;
                }
                Err(e) => {
                    let cause = format!("delivery failed: {e}");
                    self.settings.health.kafka_down(&cause);
                    return Ok(Some(SessionEnd::Reconnect(cause)));
                }
            }
        }
    }

    /// Re-targets an event whose tracker slot already exists.
    async fn redirect(
        &mut self,
        entry: InFlight,
        kind: &str,
        error: &str,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let InFlight {
            id,
            record,
            event,
            identity,
            received_at,
            ..
        } = entry;
        match (
            &self.settings.config.relay.on_error,
            self.settings.dead_letter_topic.clone(),
        ) {
            (OnError::DeadLetter, Some(dlq)) => {
                let dlq_record = dead_letter::from_record(&record, &dlq, &event, kind, error);
                tracing::warn!(lsn = %event.commit_lsn, xid = event.xid, %error, "event sent to the dead-letter topic");
                metrics::counter!(m::EVENTS_DEAD_LETTERED, "reason" => kind.to_string())
                    .increment(1);
                self.topics.ensure(&dlq).await?;
                Box::pin(self.enqueue(InFlight {
                    id,
                    record: dlq_record,
                    event,
                    identity,
                    dead_lettered: true,
                    isolated: false,
                    received_at,
                }))
                .await
            }
            _ => {
                self.halt(format!(
                    "Kafka refused an event of transaction {} (commit LSN {}): {error}; \
                     the relay will not move past it (relay.on_error = \"stop\")",
                    event.xid, event.commit_lsn
                ));
                self.in_flight.insert(
                    id.get(),
                    InFlight {
                        id,
                        record,
                        event,
                        identity,
                        dead_lettered: false,
                        isolated: false,
                        received_at,
                    },
                );
                Ok(None)
            }
        }
    }

    async fn on_report(
        &mut self,
        report: DeliveryReport,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let Some(entry) = self.in_flight.remove(&report.id) else {
            return Ok(None);
        };
        match report.result {
            Ok(_) => {
                let _ = self.tracker.ack(entry.id);
                let (events, bytes) = self
                    .published
                    .entry(Arc::clone(&entry.record.topic))
                    .or_insert_with(|| {
                        let t = entry.record.topic.to_string();
                        (
                            metrics::counter!(m::EVENTS_PUBLISHED, "topic" => t.clone()),
                            metrics::counter!(m::BYTES_PUBLISHED, "topic" => t),
                        )
                    });
                events.increment(1);
                bytes.increment(entry.record.size as u64);
                let now_us = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_micros() as i64)
                    .unwrap_or(0);
                let behind_us = (now_us - entry.event.commit_time_us).max(0);
                metrics::histogram!(m::COMMIT_TO_ACK_SECONDS).record(behind_us as f64 / 1e6);
                self.wal_to_ack
                    .record(entry.received_at.elapsed().as_secs_f64());
                let health = &self.settings.health;
                health.acked(behind_us / 1000);
                health.kafka_up();
                Ok(None)
            }
            Err(failure) => {
                metrics::counter!(m::DELIVERY_FAILURES, "code" => format!("{:?}", failure.code), "kind" => format!("{:?}", failure.kind)).increment(1);
                let error = format!("{} ({:?})", failure.message, failure.code);
                match failure.kind {
                    FailureKind::PerEvent if entry.dead_lettered => {
                        self.halt(format!(
                            "the dead-letter topic refused an event too: {error}"
                        ));
                        self.in_flight.insert(report.id, entry);
                        Ok(None)
                    }
                    // The broker refused it, perhaps only for sharing a batch
                    // with the real culprit; with the gapless guarantee the
                    // producer is done for either way: reconnect and replay,
                    // trying a suspect alone.
                    FailureKind::PerEvent => {
                        let verdict = if entry.isolated {
                            Verdict::Confirmed(error.clone())
                        } else {
                            Verdict::Suspect
                        };
                        self.poison.0.insert(entry.identity, verdict);
                        let _ = self.tracker.fail(entry.id);
                        self.collect_batch_mates().await;
                        Ok(Some(SessionEnd::Reconnect(format!(
                            "delivery failed: Kafka refused an event: {error}"
                        ))))
                    }
                    FailureKind::Transport => {
                        // Freeze: nothing after this event may be confirmed.
                        let _ = self.tracker.fail(entry.id);
                        self.settings.health.kafka_down(&error);
                        Ok(Some(SessionEnd::Reconnect(format!(
                            "delivery failed: {error}"
                        ))))
                    }
                }
            }
        }
    }
}
