//! The send path: each event from the WAL to the producer, and each
//! delivery report back into the window.
//!
//! An event normally goes straight out ([`Session::deliver`]); a suspect
//! from [`PoisonMemory`](super::verdicts::PoisonMemory) goes out alone
//! ([`Session::trial`]); known poison goes to the `on_error` policy instead
//! ([`Session::dead_letter`], whose copy `deliver` then sends in its place).
//!
//! A record the broker refuses (too large for its topic, not authorised) is
//! no Kafka outage, but it ends its producer: with the gapless guarantee
//! librdkafka turns the refusal into a fatal error. So the session keeps its
//! replication stream and takes back what that producer held
//! ([`Session::take_back`]: acks stay acks, everything else waits in the
//! window), opens a fresh producer at once (no backoff, no reconnect) and
//! sends the taken-back records again in WAL order, each refused one alone,
//! before anything newer ([`Session::resend_pending`]). Duplicates are
//! bounded by the records in flight.

use std::time::Duration;

use tokio::time::Instant;

use super::delivery::Delivery;
use super::poison::Undeliverable;
use super::telemetry::TelemetryEvent;
use super::verdicts::Refusal;
use super::window::{InFlight, Reported, Route, Window};
use super::{Reconnect, Session, SessionEnd};
use crate::progress::ledger::CommitPosition;
use crate::relay::RelayError;
use crate::sink::{DeliveryReport, FailureKind, SendError};
use crate::source::transactions::SourceItem;

/// How long [`Session::take_back`] waits for the reports of the records
/// still in flight, first with only the queue purged (their real outcome
/// spares duplicates), then once more after purging them too.
const TAKE_BACK_WAIT: Duration = Duration::from_secs(5);

/// What a report asks of the producer, once the window and the telemetry
/// have it.
pub(super) enum Trouble {
    /// A refusal, which explains the producer's end.
    Refusal(String),
    /// The producer ended without a refusal known to explain it.
    ProducerEnded(String),
    /// Kafka is unreachable: reconnect.
    Outage(String),
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

impl<D: Delivery> Session<'_, D> {
    /// One item from the stream: a checkpoint moves the window; an event is
    /// mapped and sent, or goes to the `on_error` policy.
    pub(super) async fn on_item(
        &mut self,
        item: SourceItem,
    ) -> Result<Option<SessionEnd>, RelayError> {
        // Halted: nothing after the cause may be sent or become a
        // checkpoint, not even the rest of the message that carried it (a
        // non-transactional message brings its own checkpoint along).
        if self.window.halted().is_some() {
            return Ok(None);
        }
        match item {
            SourceItem::Checkpoint {
                lsn,
                commit_time_us,
                ..
            } => {
                self.window.commit(lsn);
                let commit = CommitPosition {
                    end_lsn: lsn,
                    commit_time_us,
                };
                self.note_commit(commit);
                self.delivery.checkpoint(commit);
                self.telemetry.emit(TelemetryEvent::TransactionRead);
                Ok(None)
            }
            SourceItem::Event(event) => {
                self.telemetry.emit(TelemetryEvent::EventSeen);
                let Some(identity) = self.window.arrive(event.commit_lsn) else {
                    self.telemetry.emit(TelemetryEvent::EventSkipped);
                    return Ok(None);
                };
                let record = match self.mapper.map(&event) {
                    Ok(record) => record,
                    Err(e) => {
                        let error = e.to_string();
                        let poison = Undeliverable::Unmapped {
                            event,
                            identity,
                            error,
                        };
                        return self.undeliverable(poison).await;
                    }
                };
                let route = self.window.route(&identity);
                if let Route::Poison(refusal) = route {
                    let poison = Undeliverable::KnownPoison {
                        event,
                        identity,
                        record,
                        refusal,
                    };
                    return self.undeliverable(poison).await;
                }
                self.ensure_topic(&record.topic).await?;
                let entry = self
                    .window
                    .admit(event, record, identity, false, self.received_at);
                match route {
                    Route::Trial => self.trial(entry).await,
                    _ => self.deliver(entry).await,
                }
            }
        }
    }

    /// Sends the records waiting in the window, in WAL order, each by its
    /// route. A refusal meanwhile adds what was in flight back; the lowest
    /// id always goes first.
    pub(super) async fn resend_pending(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        while let Some((route, entry)) = self.window.next_to_send() {
            let end = match route {
                Route::Poison(refusal) => {
                    self.undeliverable(Undeliverable::Refused { entry, refusal })
                        .await?
                }
                Route::Trial => self.trial(entry).await?,
                Route::Send => self.deliver(entry).await?,
            };
            if end.is_some() {
                return Ok(end);
            }
        }
        Ok(None)
    }

    /// Applies `on_error` to `poison` and sends its dead-letter copy, if any.
    async fn undeliverable(
        &mut self,
        poison: Undeliverable,
    ) -> Result<Option<SessionEnd>, RelayError> {
        match self.dead_letter(poison).await? {
            Some(copy) => self.deliver(copy).await,
            None => Ok(None),
        }
    }

    /// Sends a suspect alone: waits until nothing else is in flight, sends
    /// it, and waits for its report before going on. Acked, it is acquitted
    /// (it was a batch-mate of the real culprit); refused alone, it is
    /// poison for certain.
    ///
    /// Exactly-once: alone inside the open Kafka transaction, flushed before
    /// and after, so that no batch-mate shares its produce request; its
    /// verdict comes with the commit or the abort. Committing what is open
    /// before it instead would split its database transaction: its first
    /// events visible without the rest and without its dead-letter copy.
    async fn trial(&mut self, mut entry: InFlight) -> Result<Option<SessionEnd>, RelayError> {
        if D::TRANSACTIONAL {
            if let Err(e) = self.delivery.flush().await {
                return self.transaction_failed(e).await;
            }
            Window::isolate(&mut entry);
            if let Some(end) = self.deliver(entry).await? {
                return Ok(Some(end));
            }
            return match self.delivery.flush().await {
                Ok(()) => Ok(None),
                Err(e) => self.transaction_failed(e).await,
            };
        }
        if let Some(end) = self.drain_reports(|w| w.with_producer() == 0).await? {
            return Ok(Some(end));
        }
        Window::isolate(&mut entry);
        let id = entry.id;
        if let Some(end) = self.deliver(entry).await? {
            return Ok(Some(end));
        }
        self.drain_reports(|w| !w.is_with_producer(id)).await
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
        done: impl Fn(&Window<'_>) -> bool,
    ) -> Result<Option<SessionEnd>, RelayError> {
        while !done(&self.window) && self.window.halted().is_none() {
            if D::TRANSACTIONAL {
                // Reports come with the commit; nothing is left to wait
                // for without an open transaction.
                if self.delivery.open_transaction().is_none() {
                    break;
                }
                if let Some(end) = self.commit().await? {
                    return Ok(Some(end));
                }
                continue;
            }
            let Some(report) = self.delivery.next_report().await else {
                return Ok(Some(Reconnect::producer_stopped()));
            };
            if let Some(end) = self.on_report(report).await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Hands one record to the producer, waiting out a full local queue. A
    /// record librdkafka refuses goes to the `on_error` policy, and its
    /// dead-letter copy is sent here in its place: one loop, no recursion.
    pub(super) async fn deliver(
        &mut self,
        mut entry: InFlight,
    ) -> Result<Option<SessionEnd>, RelayError> {
        loop {
            // Behind records waiting to be sent again, it waits with them.
            if self.window.must_wait(entry.id) {
                self.window.queue(entry);
                return Ok(None);
            }
            match self.delivery.send(entry.id, &entry.record) {
                Ok(()) => {
                    self.telemetry.emit(TelemetryEvent::Sent(&entry));
                    if D::TRANSACTIONAL {
                        entry.lighten();
                    }
                    self.window.sent(entry);
                    return Ok(None);
                }
                Err(SendError::QueueFull) if D::TRANSACTIONAL => {
                    // Room comes with the commit of what the queue holds.
                    if let Some(end) = self.commit().await? {
                        return Ok(Some(end));
                    }
                }
                Err(SendError::QueueFull) => {
                    // This waits for Kafka to acknowledge something, for as
                    // long as a hung broker takes, in the middle of a batch
                    // whose turn is not told yet: tell the window as it is,
                    // not as the last turn left it (CI saw 93 in flight
                    // where the queue held 100).
                    let reported = self.source.reported();
                    self.tell_turn(reported);
                    let Some(report) = self.delivery.next_report().await else {
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
                    let refusal = Refusal {
                        code,
                        error: format!("{message} ({code:?})"),
                    };
                    let Some((refused, refusal)) = self.window.rejected(entry, refusal) else {
                        // A dead-letter copy: the window halted.
                        self.tell_halt();
                        return Ok(None);
                    };
                    let poison = Undeliverable::Refused {
                        entry: refused,
                        refusal,
                    };
                    match self.dead_letter(poison).await? {
                        Some(copy) => entry = copy,
                        None => return Ok(None),
                    }
                }
                Err(SendError::Rejected { code, message, .. }) if D::TRANSACTIONAL => {
                    // The transaction cannot commit now: abort it, resume
                    // from the ledger (or stop, when fenced).
                    self.window.hold(entry);
                    let error = crate::sink::TransactionError::Abortable { code, message };
                    return self.transaction_failed(error).await;
                }
                Err(SendError::Rejected { code, message, .. })
                    if super::window::ends_with_the_producer(code) =>
                {
                    // The producer died, most likely of a refusal whose
                    // report is still on its way: take back what it held.
                    self.window.hold(entry);
                    return self.replace_producer(false, &message).await;
                }
                Err(e) => {
                    let cause = format!("delivery failed: {e}");
                    self.telemetry.emit(TelemetryEvent::KafkaDown(&cause));
                    return Ok(Some(Reconnect::delivery(&e)));
                }
            }
        }
    }

    /// One delivery report: the window judges it, the telemetry tells it,
    /// and the session does what it asks of the producer.
    pub(super) async fn on_report(
        &mut self,
        report: DeliveryReport,
    ) -> Result<Option<SessionEnd>, RelayError> {
        match self.book(report) {
            None => Ok(None),
            // Suspect it (alone it was the culprit), and go on with a
            // fresh producer.
            Some(Trouble::Refusal(cause)) => self.replace_producer(true, &cause).await,
            Some(Trouble::ProducerEnded(cause)) => self.replace_producer(false, &cause).await,
            Some(Trouble::Outage(cause)) => Ok(Some(self.give_up(&cause))),
        }
    }

    /// Hands a report to the window and tells what it made of it: the one
    /// place a report's outcome is told, for the producer's reports and
    /// while taking its records back alike.
    pub(super) fn book(&mut self, report: DeliveryReport) -> Option<Trouble> {
        let reported = self.window.report(report);
        // A refused dead-letter copy halted the window.
        let halted = matches!(reported, Reported::Refused(_));
        let (failure, trouble): (_, fn(String) -> Trouble) = match reported {
            Reported::Stale => return None,
            Reported::Acked(entry, delivered) => {
                let table = self.mapper.label(&entry.event);
                self.telemetry.emit(TelemetryEvent::Acked {
                    entry: &entry,
                    delivered,
                    table,
                });
                return None;
            }
            Reported::Suspect(f) | Reported::Refused(f) => (f, Trouble::Refusal),
            Reported::ProducerEnded(f) => (f, Trouble::ProducerEnded),
            Reported::Outage(f) => (f, Trouble::Outage),
        };
        self.telemetry
            .emit(TelemetryEvent::DeliveryFailed(&failure));
        if halted {
            self.tell_halt();
        }
        Some(trouble(failure.to_string()))
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
        let fresh = D::open(self.settings, &self.ledger_key).await?;
        std::mem::replace(&mut self.delivery, fresh).retire();
        self.telemetry.emit(TelemetryEvent::ProducerReplaced {
            waiting: self.window.waiting(),
        });
        Ok(None)
    }

    /// Ends the session for a reconnect from the slot, Kafka marked down.
    pub(super) fn give_up(&mut self, cause: &str) -> SessionEnd {
        self.window.freeze();
        self.telemetry.emit(TelemetryEvent::KafkaDown(cause));
        Reconnect::delivery(cause)
    }

    /// Collects the reports of everything the producer holds: the window
    /// judges each as it does any report; what never reports waits to be
    /// sent again.
    async fn take_back(&mut self) -> Result<TakenBack, RelayError> {
        let mut found = TakenBack::default();
        for purge_in_flight in [false, true] {
            if self.window.with_producer() == 0 {
                break;
            }
            if purge_in_flight {
                self.delivery.purge();
            } else {
                self.delivery.purge_queued();
            }
            let deadline = Instant::now() + TAKE_BACK_WAIT;
            while self.window.with_producer() > 0 {
                let next = tokio::time::timeout_at(deadline, self.delivery.next_report());
                let Ok(Some(report)) = next.await else {
                    break;
                };
                match self.book(report) {
                    Some(Trouble::Refusal(_)) => found.refused = true,
                    Some(Trouble::Outage(cause)) => {
                        found.outage.get_or_insert(cause);
                    }
                    Some(Trouble::ProducerEnded(_)) | None => {}
                }
            }
        }
        if self.window.with_producer() > 0 {
            found.outage.get_or_insert(format!(
                "no delivery report for {} record(s) from the producer being replaced",
                self.window.with_producer()
            ));
            self.window.take_back_unreported();
        }
        Ok(found)
    }
}
