//! The send path: each event from the WAL to the producer, and each
//! delivery report back into the ack tracker.
//!
//! An event normally goes straight out ([`Session::send`]); a suspect from
//! [`PoisonMemory`](super::poison::PoisonMemory) goes out alone
//! ([`Session::trial`]); confirmed poison goes to the `on_error`
//! policy instead ([`Session::poisoned`]).
//!
//! A record the broker refuses (too large for its topic, not authorised) is
//! no Kafka outage, but it ends its producer: with the gapless guarantee
//! librdkafka turns the refusal into a fatal error. So the session keeps its
//! replication stream and takes back what that producer held
//! ([`Session::take_back`]: acks stay acks, everything else waits in
//! [`Session::resend`]), starts a fresh producer at once (no backoff, no
//! reconnect) and sends the taken-back records again in WAL order, each
//! refused one alone, before anything newer ([`Session::resend_pending`]).
//! Per-key order holds: within a partition the broker accepts nothing after
//! a refused batch (the sequence numbers would have a gap), so what comes
//! back is a suffix of each partition, sent again in order. Duplicates are
//! bounded by the records in flight.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::types::RDKafkaErrorCode;
use tokio::time::Instant;

use super::poison::{Cause, EventIdentity, Refusal, Stage, Verdict};
use super::{InFlight, Reconnect, Session, SessionEnd};
use crate::metrics as m;
use crate::outbox::{KafkaRecord, OutboxEvent};
use crate::progress::ledger::CommitPosition;
use crate::relay::{RelayError, RelaySettings};
use crate::sink::{
    Delivered, DeliveryFailure, DeliveryReport, FailureKind, KafkaSink, QueueBound, SendError,
};
use crate::source::transactions::SourceItem;

/// How long [`Session::take_back`] waits for the reports of the records
/// still in flight, first with only the queue purged (their real outcome
/// spares duplicates), then once more after purging them too.
const TAKE_BACK_WAIT: Duration = Duration::from_secs(5);

/// A producer for the session: delivery reports on its channel, statistics
/// to the health endpoint when there is one.
pub(super) fn new_sink(settings: &RelaySettings) -> Result<KafkaSink, RelayError> {
    let health = &settings.health;
    // Statistics feed only the endpoint's gauges: none without one.
    let metrics_on = settings.config.metrics.listen.is_some();
    let stats = metrics_on.then(|| m::kafka::stats_hook(Arc::clone(health)));
    let window = QueueBound::of(&settings.config.relay);
    let sink = KafkaSink::with_stats(&settings.brokers, &settings.config.kafka, window, stats)?;
    health.new_producer();
    // Ready as soon as a broker answers, not at the first statistics or ack.
    let health = Arc::clone(health);
    sink.when_connected(move || health.kafka_broker_up());
    Ok(sink)
}

/// Failures that follow from the producer's end rather than from Kafka being
/// unreachable: the fatal error itself, records purged from it, and
/// implicit acks (sent again anyway). Anything else is an outage.
fn ends_with_the_producer(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::Fatal
            | C::GaplessGuarantee
            | C::PurgeQueue
            | C::PurgeInflight
            | C::OutOfOrderSequenceNumber
            | C::Inconsistent
    )
}

/// What [`Session::take_back`] found among the last reports of a producer.
#[derive(Default)]
struct TakenBack {
    /// The broker refused a record (so the producer's end is explained).
    refused: bool,
    /// A failure that does mean Kafka is unreachable, or reports that never
    /// came: the session has to reconnect after all.
    outage: Option<String>,
}

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
            SourceItem::Checkpoint {
                lsn,
                commit_time_us,
                ..
            } => {
                self.tracker.commit(lsn);
                self.note_commit(CommitPosition {
                    end_lsn: lsn,
                    commit_time_us,
                });
                self.ordinal = 0;
                self.hot.transactions.increment(1);
                Ok(None)
            }
            SourceItem::Event(event) => {
                self.hot.events_seen.increment(1);
                self.settings.health.event_seen();
                let identity = (event.commit_lsn, self.ordinal);
                self.ordinal += 1;
                // Its commit (which ends at or before the ledger's position,
                // a commit end or idle position) was relayed before.
                if self
                    .skip_through
                    .is_some_and(|through| event.commit_lsn < through)
                {
                    self.skipped.increment(1);
                    return Ok(None);
                }
                let record = match self.mapper.map(&event) {
                    Ok(record) => record,
                    Err(e) => {
                        let cause = Cause::Mapping(e.to_string());
                        return self.poisoned(event, identity, Stage::Unmapped, cause).await;
                    }
                };
                match self.poison.verdict(&identity) {
                    Some(Verdict::Confirmed(refusal)) => {
                        let cause = Cause::Refused(refusal);
                        self.poisoned(event, identity, Stage::Mapped(record), cause)
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

    /// Sends a suspect alone (see [`Session::trial`]).
    async fn send_isolated(
        &mut self,
        event: OutboxEvent,
        record: KafkaRecord,
        identity: EventIdentity,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let entry = self.admit(event, record, identity, true).await?;
        self.trial(entry).await
    }

    /// Sends a suspect alone: waits until nothing else is in flight, sends
    /// it, and waits for its report before going on. Acked, it is acquitted
    /// (it was a batch-mate of the real culprit, see [`Session::on_report`]);
    /// refused alone, it is poison for certain.
    async fn trial(&mut self, mut entry: InFlight) -> Result<Option<SessionEnd>, RelayError> {
        if let Some(end) = self.drain_reports(|s| s.tracker.sent_count() == 0).await? {
            return Ok(Some(end));
        }
        entry.isolated = true;
        let id = entry.id;
        if let Some(end) = self.enqueue(entry).await? {
            return Ok(Some(end));
        }
        self.drain_reports(|s| !s.tracker.is_sent(id)).await
    }

    /// A record Kafka refused for itself goes to the `on_error` policy. Its
    /// tracker slot stays: the DLQ copy (or nothing, when halted) acks it.
    async fn refused(
        &mut self,
        entry: InFlight,
        refusal: Refusal,
    ) -> Result<Option<SessionEnd>, RelayError> {
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
        self.poisoned(event, identity, stage, Cause::Refused(refusal))
            .await
    }

    /// Sends the records taken back from an ended producer, in WAL order:
    /// confirmed poison to the `on_error` policy, suspects alone, the rest as
    /// usual. A refusal meanwhile adds what was in flight back here; the
    /// lowest id always goes first.
    pub(super) async fn resend_pending(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        while self.halted.is_none() {
            let Some((_, entry)) = self.resend.pop_first() else {
                break;
            };
            // A DLQ copy carries its original's identity: it is sent as it is.
            let verdict = if entry.dead_lettered {
                None
            } else {
                self.poison.verdict(&entry.identity)
            };
            let end = match verdict {
                Some(Verdict::Confirmed(refusal)) => self.refused(entry, refusal).await?,
                Some(Verdict::Suspect) => self.trial(entry).await?,
                None => self.enqueue(entry).await?,
            };
            if end.is_some() {
                return Ok(end);
            }
        }
        Ok(None)
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

    /// Makes sure `topic` exists (see [`TopicManager::ensure`]). However long
    /// the cluster takes, the driver keeps the walsender alive.
    ///
    /// [`TopicManager::ensure`]: crate::sink::TopicManager::ensure
    pub(super) async fn ensure_topic(&mut self, topic: &str) -> Result<(), RelayError> {
        // The common case, a known topic, without a future: this runs once
        // per event.
        if self.topics.is_known(topic) {
            return Ok(());
        }
        self.topics.ensure(topic).await?;
        Ok(())
    }

    /// Handles delivery reports until `done` holds (or the session must end).
    async fn drain_reports(
        &mut self,
        done: impl Fn(&Self) -> bool,
    ) -> Result<Option<SessionEnd>, RelayError> {
        while !done(self) && self.halted.is_none() {
            let Some(report) = self.sink.next_report().await else {
                return Ok(Some(Reconnect::producer_stopped()));
            };
            if let Some(end) = self.on_report(report).await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Hands one record to the producer, waiting out a full local queue.
    /// While records taken back from an ended producer wait with lower ids,
    /// it joins them instead: order within a partition is send order.
    pub(super) async fn enqueue(
        &mut self,
        entry: InFlight,
    ) -> Result<Option<SessionEnd>, RelayError> {
        loop {
            if self
                .resend
                .first_key_value()
                .is_some_and(|(&first, _)| first < entry.id.get())
            {
                self.resend.insert(entry.id.get(), entry);
                return Ok(None);
            }
            match self.sink.send_record(entry.id.get(), &entry.record) {
                Ok(()) => {
                    tracing::trace!(
                        target: EVENTS_TARGET,
                        event_id = %event_id(&entry.record),
                        lsn = %entry.event.commit_lsn,
                        topic = &*entry.record.topic,
                        "sent"
                    );
                    let kept = self.tracker.sent(entry.id, entry);
                    debug_assert!(kept.is_ok(), "a record was sent without a tracker slot");
                    return Ok(None);
                }
                Err(SendError::QueueFull) => {
                    let Some(report) = self.sink.next_report().await else {
                        return Ok(Some(Reconnect::producer_stopped()));
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
                    let refusal = Refusal {
                        code,
                        error: format!("{message} ({code:?})"),
                    };
                    self.poison
                        .judge(entry.identity, Verdict::Confirmed(refusal.clone()));
                    if entry.dead_lettered {
                        self.dead_letter_refused(entry, &refusal.error);
                        return Ok(None);
                    }
                    return self.refused(entry, refusal).await;
                }
                Err(SendError::Rejected { code, message, .. }) if ends_with_the_producer(code) => {
                    // The producer died, most likely of a refusal whose
                    // report is still on its way: take back what it held.
                    self.hold_for_resend(entry);
                    return self.replace_producer(false, &message).await;
                }
                Err(e) => {
                    let end = Reconnect::delivery(&e);
                    self.settings
                        .health
                        .kafka_down(&format!("delivery failed: {e}"));
                    return Ok(Some(end));
                }
            }
        }
    }

    /// Keeps a record to send again on the next producer.
    pub(super) fn hold_for_resend(&mut self, mut entry: InFlight) {
        entry.isolated = false;
        self.resend.insert(entry.id.get(), entry);
    }

    /// After a refusal (`refused`) or the producer's fatal error: takes back
    /// what the producer held and replaces it, keeping the stream. Falls back
    /// to a reconnect when Kafka turns out to be unreachable too, or when a
    /// fatal error is not explained by a refusal (`cause`).
    async fn replace_producer(
        &mut self,
        refused: bool,
        cause: &str,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let found = self.take_back().await?;
        if let Some(outage) = found.outage {
            return Ok(Some(self.give_up(&outage)));
        }
        if !(refused || found.refused) {
            return Ok(Some(self.give_up(cause)));
        }
        let fresh = new_sink(self.settings)?;
        let old = std::mem::replace(&mut self.sink, fresh);
        // Destroying a librdkafka client joins its threads: not on this one.
        tokio::task::spawn_blocking(move || drop(old));
        tracing::info!(
            resend = self.resend.len(),
            "Kafka refused a record: new producer, sending again what the old one had not delivered"
        );
        Ok(None)
    }

    /// Ends the session for a reconnect from the slot, Kafka marked down.
    fn give_up(&mut self, cause: &str) -> SessionEnd {
        // Freeze: nothing after the oldest unacknowledged event may be confirmed.
        if let Some(id) = self.tracker.oldest_unacked() {
            let _ = self.tracker.fail(id);
        }
        self.settings.health.kafka_down(cause);
        Reconnect::delivery(cause)
    }

    /// Collects the reports of everything the producer holds: acks are acks;
    /// a refused record becomes a suspect (confirmed poison when it was on
    /// trial alone); the rest waits in [`Session::resend`].
    async fn take_back(&mut self) -> Result<TakenBack, RelayError> {
        let mut found = TakenBack::default();
        for purge_in_flight in [false, true] {
            if self.tracker.sent_count() == 0 {
                break;
            }
            if purge_in_flight {
                self.sink.purge();
            } else {
                self.sink.purge_queued();
            }
            let deadline = Instant::now() + TAKE_BACK_WAIT;
            while self.tracker.sent_count() > 0 {
                let next = tokio::time::timeout_at(deadline, self.sink.next_report());
                let Ok(Some(report)) = next.await else {
                    break;
                };
                let Some(entry) = self.tracker.take_sent(report.id) else {
                    continue;
                };
                match report.result {
                    Ok(delivered) => self.acked(entry, delivered),
                    Err(failure) => self.taken_back(entry, failure, &mut found),
                }
            }
        }
        if self.tracker.sent_count() > 0 {
            found.outage.get_or_insert(format!(
                "no delivery report for {} record(s) from the producer being replaced",
                self.tracker.sent_count()
            ));
            for entry in self.tracker.take_all_sent() {
                self.hold_for_resend(entry);
            }
        }
        Ok(found)
    }

    fn taken_back(&mut self, entry: InFlight, failure: DeliveryFailure, found: &mut TakenBack) {
        count_failure(&failure);
        let error = failure.to_string();
        match failure.kind {
            FailureKind::PerEvent if entry.dead_lettered => {
                found.refused = true;
                self.dead_letter_refused(entry, &error);
            }
            FailureKind::PerEvent => {
                found.refused = true;
                self.poison
                    .judge(entry.identity, refusal_verdict(&entry, &failure));
                self.hold_for_resend(entry);
            }
            FailureKind::Transport => {
                if !ends_with_the_producer(failure.code) {
                    found.outage.get_or_insert(error);
                }
                self.hold_for_resend(entry);
            }
        }
    }

    pub(super) async fn on_report(
        &mut self,
        report: DeliveryReport,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let Some(entry) = self.tracker.take_sent(report.id) else {
            return Ok(None);
        };
        match report.result {
            Ok(delivered) => {
                self.acked(entry, delivered);
                Ok(None)
            }
            Err(failure) => {
                count_failure(&failure);
                let error = failure.to_string();
                match failure.kind {
                    FailureKind::PerEvent if entry.dead_lettered => {
                        self.dead_letter_refused(entry, &error);
                        self.replace_producer(true, &error).await
                    }
                    // The broker refused it, perhaps only for sharing a batch
                    // with the real culprit: suspect it (alone it was the
                    // culprit), and go on with a fresh producer.
                    FailureKind::PerEvent => {
                        self.poison
                            .judge(entry.identity, refusal_verdict(&entry, &failure));
                        self.hold_for_resend(entry);
                        self.replace_producer(true, &error).await
                    }
                    FailureKind::Transport if ends_with_the_producer(failure.code) => {
                        self.hold_for_resend(entry);
                        self.replace_producer(false, &error).await
                    }
                    FailureKind::Transport => {
                        // Freeze: nothing after this event may be confirmed.
                        let _ = self.tracker.fail(entry.id);
                        self.settings.health.kafka_down(&error);
                        Ok(Some(Reconnect::delivery(error)))
                    }
                }
            }
        }
    }

    /// Books an acknowledged record: tracker, metrics, health.
    fn acked(&mut self, entry: InFlight, delivered: Delivered) {
        if entry.isolated {
            // Delivered alone: it was a batch-mate of the real culprit.
            self.poison.acquit(&entry.identity);
        }
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
        // Per-table and topic handles, created on their first ack only;
        // found without allocating (a few tables, each with its topics).
        let label = self.mapper.label(&entry.event);
        let table = match self.published.iter().position(|(l, _)| l == label) {
            Some(i) => i,
            None => {
                self.published.push((label.to_owned(), HashMap::new()));
                self.published.len() - 1
            }
        };
        let (table, topics) = &mut self.published[table];
        let (events, bytes) = topics
            .entry(Arc::clone(&entry.record.topic))
            .or_insert_with_key(|topic| {
                let (table, topic) = (table.clone(), topic.to_string());
                (
                    metrics::counter!(m::EVENTS_PUBLISHED, "topic" => topic.clone(), "table" => table.clone()),
                    metrics::counter!(m::BYTES_PUBLISHED, "topic" => topic, "table" => table),
                )
            });
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
    }
}

fn count_failure(failure: &DeliveryFailure) {
    metrics::counter!(m::DELIVERY_FAILURES, "code" => format!("{:?}", failure.code), "kind" => format!("{:?}", failure.kind)).increment(1);
}

/// The verdict on a record the broker refused: sent alone, it is poison;
/// in company, a suspect (the broker refuses whole batches).
fn refusal_verdict(entry: &InFlight, failure: &DeliveryFailure) -> Verdict {
    if entry.isolated {
        Verdict::Confirmed(Refusal {
            code: failure.code,
            error: failure.to_string(),
        })
    } else {
        Verdict::Suspect
    }
}
