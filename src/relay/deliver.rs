//! The send path: each event from the WAL to the producer, and each
//! delivery report back into the ack tracker.
//!
//! An event normally goes straight out ([`Session::send`]); a suspect from
//! [`PoisonMemory`](super::poison::PoisonMemory) goes out alone
//! ([`Session::send_isolated`]); confirmed poison goes to the `on_error`
//! policy instead ([`Session::poisoned`]).

use std::sync::Arc;
use std::time::Duration;

use super::poison::{EventIdentity, Stage, Verdict};
use super::session::{keep_alive, InFlight, Session, SessionEnd};
use super::RelayError;
use crate::metrics as m;
use crate::outbox::{KafkaRecord, OutboxEvent};
use crate::sink::{DeliveryReport, FailureKind, SendError};
use crate::source::transactions::SourceItem;

/// How long to wait for the rest of a refused batch's reports. librdkafka
/// reports a failed batch in one go; this only covers scheduling delays.
const BATCH_MATE_WAIT: Duration = Duration::from_millis(500);

/// Log target of the per-event audit trail: one TRACE line when an event is
/// handed to the producer and one when Kafka acknowledges it (with partition
/// and offset). Off unless asked for (`OUTBOXD_LOG=info,outboxd::events=trace`),
/// and then free of cost on the hot path when off: fields are only
/// evaluated for an enabled callsite.
pub const EVENTS_TARGET: &str = "outboxd::events";

fn event_id(record: &KafkaRecord) -> std::borrow::Cow<'_, str> {
    record
        .event_id
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or(std::borrow::Cow::Borrowed("-"))
}

impl Session<'_> {
    /// One item from the stream: a checkpoint moves the ack tracker; an
    /// event is mapped and sent, or goes to the `on_error` policy.
    pub(super) async fn on_item(
        &mut self,
        item: SourceItem,
    ) -> Result<Option<SessionEnd>, RelayError> {
        // Halted: nothing after the poison event may be sent or become a
        // checkpoint, not even the rest of the message that carried it (a
        // non-transactional message brings its own checkpoint along).
        if self.halted.is_some() {
            return Ok(None);
        }
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
                            .poisoned(event, identity, Stage::Unmapped, "mapping", &e.to_string())
                            .await
                    }
                };
                match self.poison.verdict(&identity) {
                    Some(Verdict::Confirmed(error)) => {
                        self.poisoned(event, identity, Stage::Mapped(record), "delivery", &error)
                            .await
                    }
                    Some(Verdict::Suspect) => self.send_isolated(event, record, identity).await,
                    None => self.send(event, record, identity).await,
                }
            }
        }
    }

    async fn send(
        &mut self,
        event: OutboxEvent,
        record: KafkaRecord,
        identity: EventIdentity,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let entry = self.admit(event, record, identity, false).await?;
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
        let entry = self.admit(event, record, identity, true).await?;
        let key = entry.id.get();
        if let Some(end) = self.enqueue(entry).await? {
            return Ok(Some(end));
        }
        let end = self
            .drain_reports(|s| !s.in_flight.contains_key(&key))
            .await?;
        if end.is_none() && self.halted.is_none() {
            // Delivered alone: it was a batch-mate of the real culprit.
            self.poison.acquit(&identity);
        }
        Ok(end)
    }

    /// Makes sure the record's topic exists, then gives the event its slot
    /// in the ack tracker.
    async fn admit(
        &mut self,
        event: OutboxEvent,
        record: KafkaRecord,
        identity: EventIdentity,
        isolated: bool,
    ) -> Result<InFlight, RelayError> {
        self.ensure_topic(&record.topic).await?;
        let id = self.tracker.push_event(record.size);
        Ok(InFlight {
            id,
            record,
            event,
            identity,
            dead_lettered: false,
            isolated,
            received_at: self.received_at,
        })
    }

    /// Makes sure `topic` exists (see [`TopicManager::ensure`]), keeping the
    /// walsender alive while the cluster is asked.
    ///
    /// [`TopicManager::ensure`]: crate::sink::TopicManager::ensure
    pub(super) async fn ensure_topic(&mut self, topic: &str) -> Result<(), RelayError> {
        // The common case, a known topic, without the timer `keep_alive`
        // sets up: this runs once per event.
        if self.topics.is_known(topic) {
            return Ok(());
        }
        let confirmed = self.tracker.confirmable();
        let interval = self.settings.config.postgres.status_interval;
        keep_alive(
            &mut self.source,
            confirmed,
            interval,
            self.topics.ensure(topic),
        )
        .await??;
        Ok(())
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
                    self.poison.suspect(entry.identity);
                }
            }
        }
    }

    /// The next delivery report, however long Kafka takes (e.g. a hung
    /// broker), with the walsender kept alive meanwhile.
    async fn next_report_keeping_alive(&mut self) -> Result<Option<DeliveryReport>, RelayError> {
        let confirmed = self.tracker.confirmable();
        let interval = self.settings.config.postgres.status_interval;
        Ok(keep_alive(
            &mut self.source,
            confirmed,
            interval,
            self.sink.next_report(),
        )
        .await?)
    }

    /// Handles delivery reports until `done` holds (or the session must end).
    async fn drain_reports(
        &mut self,
        done: impl Fn(&Self) -> bool,
    ) -> Result<Option<SessionEnd>, RelayError> {
        while !done(self) && self.halted.is_none() {
            let Some(report) = self.next_report_keeping_alive().await? else {
                return Ok(Some(SessionEnd::Reconnect("Kafka producer stopped".into())));
            };
            if let Some(end) = self.on_report(report).await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Hands one record to the producer, waiting out a full local queue.
    pub(super) async fn enqueue(
        &mut self,
        entry: InFlight,
    ) -> Result<Option<SessionEnd>, RelayError> {
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
                    tracing::trace!(
                        target: EVENTS_TARGET,
                        event_id = %event_id(&entry.record),
                        lsn = %entry.event.commit_lsn,
                        topic = &*entry.record.topic,
                        "sent"
                    );
                    self.in_flight.insert(entry.id.get(), entry);
                    return Ok(None);
                }
                Err(SendError::QueueFull) => {
                    let Some(report) = self.next_report_keeping_alive().await? else {
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
                        .judge(entry.identity, Verdict::Confirmed(error.clone()));
                    if entry.dead_lettered {
                        self.dead_letter_refused(entry, &error);
                        return Ok(None);
                    }
                    // The tracker slot stays; the DLQ copy (or nothing, when
                    // halted) is what acks it.
                    let InFlight {
                        id,
                        record,
                        event,
                        identity,
                        received_at,
                        ..
                    } = entry;
                    let stage = Stage::Refused {
                        record,
                        id,
                        received_at,
                    };
                    return self
                        .poisoned(event, identity, stage, "delivery", &error)
                        .await;
                }
                Err(e) => {
                    let cause = format!("delivery failed: {e}");
                    self.settings.health.kafka_down(&cause);
                    return Ok(Some(SessionEnd::Reconnect(cause)));
                }
            }
        }
    }

    pub(super) async fn on_report(
        &mut self,
        report: DeliveryReport,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let Some(entry) = self.in_flight.remove(&report.id) else {
            return Ok(None);
        };
        match report.result {
            Ok(delivered) => {
                tracing::trace!(
                    target: EVENTS_TARGET,
                    event_id = %event_id(&entry.record),
                    lsn = %entry.event.commit_lsn,
                    topic = &*entry.record.topic,
                    partition = delivered.partition,
                    offset = delivered.offset,
                    "acked"
                );
                let _ = self.tracker.ack(entry.id);
                // Per-topic handles, created on a topic's first ack only.
                if !self.published.contains_key(&entry.record.topic) {
                    let t = entry.record.topic.to_string();
                    self.published.insert(
                        Arc::clone(&entry.record.topic),
                        (
                            metrics::counter!(m::EVENTS_PUBLISHED, "topic" => t.clone()),
                            metrics::counter!(m::BYTES_PUBLISHED, "topic" => t),
                        ),
                    );
                }
                let (events, bytes) = &self.published[&entry.record.topic];
                events.increment(1);
                bytes.increment(entry.record.size as u64);
                let now_us = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_micros() as i64)
                    .unwrap_or(0);
                let behind_us = (now_us - entry.event.commit_time_us).max(0);
                self.hot.commit_to_ack.record(behind_us as f64 / 1e6);
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
                        self.dead_letter_refused(entry, &error);
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
                        self.poison.judge(entry.identity, verdict);
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
