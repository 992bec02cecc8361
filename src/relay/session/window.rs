//! The session's in-flight window: every event between the WAL and Kafka's
//! acknowledgement, in one owner. It holds the ack tracker (which keeps each
//! record the producer holds), the records waiting to be sent again, the
//! verdicts on poison and, once the session stops moving, why ([`Halt`]).
//!
//! # Invariant
//!
//! An admitted event holds one tracker slot from [`Window::admit`] until
//! Kafka acknowledges it (or its dead-letter copy, which takes the slot
//! over). Meanwhile it is in exactly one place: with the producer
//! ([`Window::sent`]), waiting to be sent again ([`Window::hold`]), or in the
//! session's hands between two verbs. So the slot is confirmed only past
//! acknowledged events (see `progress`), and nothing taken back from a
//! producer is dropped.
//!
//! Records taken back wait in id (WAL) order and go out before anything
//! newer: an event admitted meanwhile joins them ([`Window::must_wait`]).
//! Per-key order holds, as the broker accepts nothing in a partition after a
//! refused batch: what comes back is a suffix of each partition.
//!
//! Pure and synchronous: no I/O, no clock, no Kafka. Each verb answers with
//! what happened ([`Reported`], [`Route`]); the session does the I/O that
//! asks for (a new producer, a reconnect, a dead-letter copy).

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use rdkafka::types::RDKafkaErrorCode;
use tokio::time::Instant;

use super::verdicts::{EventIdentity, PoisonMemory, Refusal, Verdict};
use crate::outbox::{EventKind, KafkaRecord, OutboxEvent};
use crate::progress::ledger::InsideTransaction;
use crate::progress::{AckTracker, DeliveryId};
use crate::sink::{Delivered, DeliveryFailure, DeliveryReport, FailureKind};
use crate::Lsn;

/// A record with a tracker slot: with the producer (the tracker keeps it
/// until its report), waiting to be sent again, or on its way between the
/// two.
pub(super) struct InFlight {
    pub(super) id: DeliveryId,
    pub(super) record: KafkaRecord,
    pub(super) event: OutboxEvent,
    pub(super) identity: EventIdentity,
    /// The record is the event's dead-letter copy.
    pub(super) dead_lettered: bool,
    /// Sent with nothing else in flight (a suspect on trial).
    pub(super) isolated: bool,
    /// When the WAL carrying it arrived, for the receive-to-ack histogram.
    pub(super) received_at: Instant,
}

impl InFlight {
    /// Drops what only a resend would need: the record's key, value and
    /// headers and the event's columns, all slices that keep the WAL frame
    /// they arrived in alive. Exactly-once never sends from memory again
    /// (an abort resumes from the position ledger), so once the producer
    /// has a record, its window entry needs only what the ack reports:
    /// the topic, the size, the event id and where the event came from.
    pub(super) fn lighten(&mut self) {
        let record = &mut self.record;
        record.key = None;
        record.value = None;
        record.headers = Vec::new();
        record.event_id = record.event_id.as_deref().map(Bytes::copy_from_slice);
        match &mut self.event.kind {
            EventKind::Row(row) => row.values = Vec::new(),
            EventKind::Message { content, .. } => *content = Bytes::new(),
        }
    }

    /// The event's dead-letter copy, in the original's tracker slot.
    pub(super) fn into_dead_letter(self, record: KafkaRecord) -> InFlight {
        InFlight {
            record,
            dead_lettered: true,
            isolated: false,
            ..self
        }
    }
}

/// Why a session stopped moving: nothing after the cause is sent or
/// confirmed, until the next session reads it again and decides anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Halt {
    /// `relay.on_error = "stop"`: the event cannot be mapped, or is known
    /// poison.
    Undeliverable {
        xid: u32,
        commit_lsn: Lsn,
        error: String,
    },
    /// `relay.on_error = "stop"`: Kafka refused the event.
    Refused {
        xid: u32,
        commit_lsn: Lsn,
        error: String,
    },
    /// The dead-letter topic refused an event's copy too.
    DeadLetterRefused { error: String },
    /// The outbox table changed (the table watch's reason, with the
    /// recovery).
    TableChanged(String),
}

impl fmt::Display for Halt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const STOP: &str = "the relay will not move past it (relay.on_error = \"stop\")";
        match self {
            Halt::Undeliverable {
                xid,
                commit_lsn,
                error,
            } => write!(
                f,
                "event in transaction {xid} (commit LSN {commit_lsn}) cannot be delivered: {error}; {STOP}"
            ),
            Halt::Refused {
                xid,
                commit_lsn,
                error,
            } => write!(
                f,
                "Kafka refused an event of transaction {xid} (commit LSN {commit_lsn}): {error}; {STOP}"
            ),
            Halt::DeadLetterRefused { error } => {
                write!(f, "the dead-letter topic refused an event too: {error}")
            }
            Halt::TableChanged(reason) => f.write_str(reason),
        }
    }
}

/// How a record goes to Kafka, by the poison verdict on its event.
pub(super) enum Route {
    /// As usual.
    Send,
    /// A suspect: alone, after everything before it is acknowledged.
    Trial,
    /// Known poison: to the `relay.on_error` policy, not to Kafka.
    Poison(Refusal),
}

/// What a delivery report did to the window.
// `Acked` is the common case, matched as soon as it is returned: boxing the
// record would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
pub(super) enum Reported {
    /// No record the producer holds has this id (reported already, or taken
    /// back).
    Stale,
    /// Acknowledged: the tracker has it; the record is the session's to
    /// count.
    Acked(InFlight, Delivered),
    /// The broker refused the record, perhaps only for sharing a batch with
    /// the real culprit: a suspect now (confirmed poison, when it went
    /// alone), waiting to be sent again. The refusal explains why the
    /// producer ends (the gapless guarantee makes it fatal).
    Suspect(DeliveryFailure),
    /// The broker refused a dead-letter copy: nothing is left to try, the
    /// window is halted. Also explains the producer's end.
    Refused(DeliveryFailure),
    /// The producer ended (its fatal error, a purge, an implicit ack): the
    /// record waits to be sent again on the next producer.
    ProducerEnded(DeliveryFailure),
    /// Kafka is unreachable, and may have a gap after this record: the
    /// record waits too, but the session must reconnect from the slot.
    Outage(DeliveryFailure),
}

/// Failures that follow from the producer's end rather than from Kafka being
/// unreachable: the fatal error itself, records purged from it, and
/// implicit acks (sent again anyway). Anything else is an outage.
pub(super) fn ends_with_the_producer(code: RDKafkaErrorCode) -> bool {
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

/// How far everything read has been handed over (sent, or skipped as
/// relayed before): what the ledger entry of an exactly-once Kafka
/// transaction committed now may say. Every event at or below it is in the
/// transaction or in one committed earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    /// The last commit end (or idle position) passed.
    pub(super) through: Lsn,
    /// The transaction after it, as far as its events were handed over.
    pub(super) inside: Option<InsideTransaction>,
}

/// What the position ledger says was relayed before this (re)start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Relayed {
    /// Events whose commit lies below this.
    pub(super) through: Option<Lsn>,
    /// The first events of one more transaction (exactly-once).
    pub(super) inside: Option<InsideTransaction>,
}

/// The in-flight limits (`relay.max_in_flight_events`, `_bytes`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) events: usize,
    pub(super) bytes: u64,
}

pub(super) struct Window<'p> {
    tracker: AckTracker<InFlight>,
    /// Taken back from an ended producer (or held by a halt), by delivery
    /// id: sent again, on a fresh producer, before anything newer.
    resend: BTreeMap<u64, InFlight>,
    /// Kept across sessions: the verdicts outlive a reconnect.
    poison: &'p mut PoisonMemory,
    /// Position of the next event within its transaction.
    ordinal: u32,
    /// Events the position ledger has as relayed before this (re)start:
    /// skipped, not sent again.
    relayed: Relayed,
    position: Position,
    halted: Option<Halt>,
    limits: Limits,
}

impl<'p> Window<'p> {
    pub(super) fn new(
        start: Lsn,
        relayed: Relayed,
        poison: &'p mut PoisonMemory,
        limits: Limits,
    ) -> Self {
        Window {
            tracker: AckTracker::new(start),
            resend: BTreeMap::new(),
            poison,
            ordinal: 0,
            relayed,
            // Never behind the ledger's own position: an entry never goes
            // back.
            position: Position {
                through: relayed.through.map_or(start, |t| t.max(start)),
                inside: relayed.inside,
            },
            halted: None,
            limits,
        }
    }

    /// A transaction ended at `end_lsn` (its Commit's end), after its last
    /// event.
    pub(super) fn commit(&mut self, end_lsn: Lsn) {
        self.tracker.commit(end_lsn);
        self.ordinal = 0;
        let ahead = end_lsn > self.position.through
            && self
                .position
                .inside
                .map_or(true, |i| end_lsn > i.commit_lsn);
        if ahead && self.halted.is_none() {
            self.position = Position {
                through: end_lsn,
                inside: None,
            };
        }
    }

    /// An idle position between transactions. Halted, nothing after the
    /// cause becomes a checkpoint.
    pub(super) fn keepalive(&mut self, lsn: Lsn) {
        if self.halted.is_none() {
            self.tracker.keepalive(lsn);
            if self.position.inside.is_none() && lsn > self.position.through {
                self.position.through = lsn;
            }
        }
    }

    /// An event of the transaction committing at `commit_lsn` arrived: its
    /// identity, or `None` when the ledger has it as relayed (its commit
    /// ends at or before the ledger's position, a commit end or idle one,
    /// or it is among the first events of a transaction the ledger has
    /// partly).
    pub(super) fn arrive(&mut self, commit_lsn: Lsn) -> Option<EventIdentity> {
        let identity = (commit_lsn, self.ordinal);
        self.ordinal += 1;
        let below = self.relayed.through.is_some_and(|t| commit_lsn < t);
        let partly = self
            .relayed
            .inside
            .is_some_and(|i| i.commit_lsn == commit_lsn && identity.1 < i.events);
        if partly {
            self.handed_over(&identity);
        }
        if below || partly {
            return None;
        }
        Some(identity)
    }

    /// Moves the position past the event `identity`, never back (a record
    /// sent again after a refusal was passed already).
    fn handed_over(&mut self, identity: &EventIdentity) {
        let next = InsideTransaction {
            commit_lsn: identity.0,
            events: identity.1 + 1,
        };
        let ahead = match self.position.inside {
            None => true,
            Some(i) => (next.commit_lsn, next.events) > (i.commit_lsn, i.events),
        };
        if ahead && self.halted.is_none() {
            self.position.inside = Some(next);
        }
    }

    /// How far everything read has been handed over (see [`Position`]).
    pub(super) fn position(&self) -> Position {
        self.position
    }

    /// How an event goes out, by its verdict.
    pub(super) fn route(&self, identity: &EventIdentity) -> Route {
        match self.poison.verdict(identity) {
            None => Route::Send,
            Some(Verdict::Suspect) => Route::Trial,
            Some(Verdict::Confirmed(refusal)) => Route::Poison(refusal),
        }
    }

    /// Gives an event (or, for one that never got a slot, its dead-letter
    /// copy) its tracker slot.
    pub(super) fn admit(
        &mut self,
        event: OutboxEvent,
        record: KafkaRecord,
        identity: EventIdentity,
        dead_lettered: bool,
        received_at: Instant,
    ) -> InFlight {
        let id = self.tracker.push_event(record.size);
        InFlight {
            id,
            record,
            event,
            identity,
            dead_lettered,
            isolated: false,
            received_at,
        }
    }

    /// Whether the record `id` has to wait: records with lower ids wait to
    /// be sent again, and order within a partition is send order. Then it
    /// joins them ([`Window::queue`]).
    #[inline]
    pub(super) fn must_wait(&self, id: DeliveryId) -> bool {
        self.resend
            .first_key_value()
            .is_some_and(|(&first, _)| first < id.get())
    }

    /// Queues `entry` behind the records waiting to be sent again (see
    /// [`Window::must_wait`]).
    pub(super) fn queue(&mut self, entry: InFlight) {
        self.resend.insert(entry.id.get(), entry);
    }

    /// The producer took `entry`: the tracker keeps it until its report.
    pub(super) fn sent(&mut self, entry: InFlight) {
        self.handed_over(&entry.identity);
        let kept = self.tracker.sent(entry.id, entry);
        debug_assert!(kept.is_ok(), "a record was sent without a tracker slot");
    }

    /// A delivery report, from the producer or while taking its records
    /// back: the one place a report is judged.
    pub(super) fn report(&mut self, report: DeliveryReport) -> Reported {
        let Some(entry) = self.tracker.take_sent(report.id) else {
            return Reported::Stale;
        };
        match report.result {
            Ok(delivered) => {
                if entry.isolated {
                    // Delivered alone: it was a batch-mate of the real culprit.
                    self.poison.acquit(&entry.identity);
                }
                let _ = self.tracker.ack(entry.id);
                Reported::Acked(entry, delivered)
            }
            Err(failure) => match failure.kind {
                FailureKind::PerEvent if entry.dead_lettered => {
                    self.halt(Halt::DeadLetterRefused {
                        error: failure.to_string(),
                    });
                    self.hold(entry);
                    Reported::Refused(failure)
                }
                FailureKind::PerEvent => {
                    // The broker refuses whole batches: alone, it was the
                    // culprit.
                    let verdict = if entry.isolated {
                        Verdict::Confirmed(Refusal {
                            code: failure.code,
                            error: failure.to_string(),
                        })
                    } else {
                        Verdict::Suspect
                    };
                    self.poison.judge(entry.identity, verdict);
                    self.hold(entry);
                    Reported::Suspect(failure)
                }
                FailureKind::Transport => {
                    self.hold(entry);
                    if ends_with_the_producer(failure.code) {
                        Reported::ProducerEnded(failure)
                    } else {
                        Reported::Outage(failure)
                    }
                }
            },
        }
    }

    /// librdkafka refused `entry` at hand-over, alone (e.g. above the
    /// producer's `message.max.bytes`): poison for certain, and the producer
    /// stays healthy. The entry and the refusal come back for the
    /// `relay.on_error` policy; `None` when it was a dead-letter copy, which
    /// halts the window.
    pub(super) fn rejected(
        &mut self,
        entry: InFlight,
        refusal: Refusal,
    ) -> Option<(InFlight, Refusal)> {
        self.poison
            .judge(entry.identity, Verdict::Confirmed(refusal.clone()));
        if entry.dead_lettered {
            self.halt(Halt::DeadLetterRefused {
                error: refusal.error,
            });
            self.hold(entry);
            return None;
        }
        Some((entry, refusal))
    }

    /// Keeps a record to send again on the next producer (never while
    /// halted, so there it keeps its slot below everything after it).
    pub(super) fn hold(&mut self, mut entry: InFlight) {
        entry.isolated = false;
        self.resend.insert(entry.id.get(), entry);
    }

    /// Takes back everything the producer still holds, whose reports never
    /// came: they wait to be sent again.
    pub(super) fn take_back_unreported(&mut self) {
        for entry in self.tracker.take_all_sent() {
            self.hold(entry);
        }
    }

    /// The next record waiting to be sent again, lowest id first, with its
    /// route (a dead-letter copy is sent as it is); `None` when none waits,
    /// or halted.
    pub(super) fn next_to_send(&mut self) -> Option<(Route, InFlight)> {
        if self.halted.is_some() {
            return None;
        }
        let (_, entry) = self.resend.pop_first()?;
        let route = if entry.dead_lettered {
            Route::Send
        } else {
            self.route(&entry.identity)
        };
        Some((route, entry))
    }

    /// Marks `entry` as sent alone (a suspect on trial).
    pub(super) fn isolate(entry: &mut InFlight) {
        entry.isolated = true;
    }

    /// Stops the window: nothing more is read, sent again or confirmed past
    /// the cause. A later halt replaces the reason.
    pub(super) fn halt(&mut self, halt: Halt) -> &Halt {
        self.halted.insert(halt)
    }

    /// Kafka may have a gap: nothing after the oldest unacknowledged event
    /// may be confirmed, whatever is acknowledged later.
    pub(super) fn freeze(&mut self) {
        if let Some(id) = self.tracker.oldest_unacked() {
            let _ = self.tracker.fail(id);
        }
    }

    pub(super) fn halted(&self) -> Option<&Halt> {
        self.halted.as_ref()
    }

    /// Whether to take more from the stream: under the in-flight limits, not
    /// halted, nothing waiting to be sent again.
    pub(super) fn may_read(&self) -> bool {
        let full = self.tracker.in_flight() >= self.limits.events
            || self.tracker.in_flight_bytes() as u64 >= self.limits.bytes;
        !full && self.halted.is_none() && self.resend.is_empty()
    }

    /// Whether records wait to be sent again (and may, not halted).
    pub(super) fn resend_due(&self) -> bool {
        !self.resend.is_empty() && self.halted.is_none()
    }

    /// Records waiting to be sent again.
    pub(super) fn waiting(&self) -> usize {
        self.resend.len()
    }

    /// The position every admitted event up to has been acknowledged.
    pub(super) fn confirmable(&self) -> Lsn {
        self.tracker.confirmable()
    }

    /// Admitted and not yet acknowledged.
    pub(super) fn in_flight(&self) -> usize {
        self.tracker.in_flight()
    }

    pub(super) fn in_flight_bytes(&self) -> usize {
        self.tracker.in_flight_bytes()
    }

    /// Records the producer holds (sent, not reported on).
    pub(super) fn with_producer(&self) -> usize {
        self.tracker.sent_count()
    }

    /// The oldest record the producer holds.
    pub(super) fn oldest_with_producer(&self) -> Option<&InFlight> {
        self.tracker.oldest_sent().map(|(_, entry)| entry)
    }

    /// The topics of the records the producer holds.
    pub(super) fn topics_with_producer(&self) -> std::collections::BTreeSet<String> {
        self.tracker
            .iter_sent()
            .map(|entry| entry.record.topic.to_string())
            .collect()
    }

    /// Whether the producer holds the record `id`.
    pub(super) fn is_with_producer(&self, id: DeliveryId) -> bool {
        self.tracker.is_sent(id)
    }
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
