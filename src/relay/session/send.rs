//! The send path: each event from the WAL to the producer, and each
//! delivery report back into the window.
//!
//! An event normally goes straight out ([`Session::deliver`]); a suspect
//! from [`PoisonMemory`](super::verdicts::PoisonMemory) goes out alone
//! ([`Session::trial`]); known poison goes to the `on_error` policy instead
//! ([`Session::dead_letter`], whose copy `deliver` then sends in its place).
//!
//! What the producer does with a refused record, or a failure, is the
//! delivery mode's to decide ([`DeliveryMode`]).

use super::mode::{DeliveryMode, Step};
use super::parts::{Reconnect, Session, SessionEnd};
use super::poison::Undeliverable;
use super::schema_ids::Mapped;
use super::telemetry::TelemetryEvent;
use super::verdicts::Refusal;
use super::window::{InFlight, Reported, Route};
use crate::progress::ledger::CommitPosition;
use crate::relay::error::RelayError;
use crate::sink::{DeliveryReport, FailureKind, SendError};
use crate::source::assembler::SourceItem;

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

impl Trouble {
    /// What went wrong, in words.
    pub(super) fn cause(&self) -> &str {
        match self {
            Trouble::Refusal(c) | Trouble::ProducerEnded(c) | Trouble::Outage(c) => c,
        }
    }
}

impl<D: DeliveryMode> Session<'_, D> {
    /// One item from the stream: a checkpoint moves the window; an event is
    /// mapped and sent, or goes to the `on_error` policy.
    pub(super) async fn on_item(&mut self, item: SourceItem) -> Step {
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
                self.telemetry.emit(TelemetryEvent::TransactionRead);
                Ok(None)
            }
            SourceItem::Event(event) => {
                self.telemetry.emit(TelemetryEvent::EventSeen);
                let Some(identity) = self.window.arrive(event.commit_lsn) else {
                    self.telemetry.emit(TelemetryEvent::EventSkipped);
                    return Ok(None);
                };
                let record = match self.map_event(&event).await? {
                    Mapped::Record(record) => record,
                    Mapped::Stopped(end) => return Ok(Some(end)),
                    Mapped::Unmapped(e) => {
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
                let entry =
                    self.window
                        .admit(event, record, identity, false, self.stream.received_at);
                match route {
                    Route::Trial => D::trial(self, entry).await,
                    _ => self.deliver(entry).await,
                }
            }
        }
    }

    /// Sends the records waiting in the window, in WAL order, each by its
    /// route. A refusal meanwhile adds what was in flight back; the lowest
    /// id always goes first.
    pub(super) async fn resend_pending(&mut self) -> Step {
        while let Some((route, entry)) = self.window.next_to_send() {
            let end = match route {
                Route::Poison(refusal) => {
                    self.undeliverable(Undeliverable::Refused { entry, refusal })
                        .await?
                }
                Route::Trial => D::trial(self, entry).await?,
                Route::Send => self.deliver(entry).await?,
            };
            if end.is_some() {
                return Ok(end);
            }
        }
        Ok(None)
    }

    /// Applies `on_error` to `poison` and sends its dead-letter copy, if any.
    async fn undeliverable(&mut self, poison: Undeliverable) -> Step {
        match self.dead_letter(poison).await? {
            Some(copy) => self.deliver(copy).await,
            None => Ok(None),
        }
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

    /// Hands one record to the producer, waiting out a full local queue. A
    /// record librdkafka refuses goes to the `on_error` policy, and its
    /// dead-letter copy is sent here in its place: one loop, no recursion.
    pub(super) async fn deliver(&mut self, mut entry: InFlight) -> Step {
        loop {
            // Behind records waiting to be sent again, it waits with them.
            if self.window.must_wait(entry.id) {
                self.window.queue(entry);
                return Ok(None);
            }
            match self.delivery.send(&mut entry) {
                Ok(()) => {
                    self.telemetry.emit(TelemetryEvent::Sent(&entry));
                    self.window.sent(entry);
                    return Ok(None);
                }
                Err(SendError::QueueFull) => {
                    if let Some(end) = D::make_room(self).await? {
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
                Err(SendError::Rejected {
                    code,
                    kind,
                    message,
                }) => return D::refused(self, entry, code, kind, message).await,
            }
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

    /// Ends the session for a reconnect from the slot, Kafka marked down.
    pub(super) fn give_up(&mut self, cause: &str) -> SessionEnd {
        self.window.freeze();
        self.telemetry.emit(TelemetryEvent::KafkaDown(cause));
        Reconnect::delivery(cause)
    }
}
