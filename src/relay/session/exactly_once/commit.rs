//! When the session commits a Kafka transaction, and what a commit or an
//! abort does to the window and the ledger.
//!
//! A Kafka transaction holds what the window handed over since the last
//! commit, in WAL order, and one position ledger entry for how far that is
//! ([`Position`](super::window::Position)): the last commit end passed and,
//! when a database transaction is split, how many of the next one's events.
//! It commits when it holds `relay.transaction_max_events`, when the window
//! is full (its reports wait for the commit), after
//! `relay.transaction_max_delay`, or once the stream is idle: the walsender
//! sends a keepalive between transactions each time its reader reaches the
//! end of the WAL it knew to be flushed (PostgreSQL's `WalSndWaitForWal`,
//! before it looks for more), so at the head of the WAL and never in the
//! middle of a backlog written before. (An empty hand-over channel is no
//! such sign: in a backlog the relay often outpaces the driver, and
//! committing then cut the drain to a fraction of its rate; docs/benchmarks.md,
//! "When an exactly-once transaction commits".) An idle relay whose position
//! moved past the ledger (WAL of other tables, keepalives) commits a
//! transaction holding only the ledger entry, once per status interval, no
//! further than the table watch vouches for (as the slot).
//!
//! The slot is confirmed up to the last committed entry at most, so the
//! ledger is never behind the slot: a restart skips what the ledger has
//! (read `read_committed`) and repeats nothing. An abort, or a commit whose
//! outcome is unknown, ends the session: the next one reads the ledger
//! again and resumes from it, not from this session's memory. A fencing
//! stops the relay.

use tokio::time::Instant;

use super::super::mode::Step;
use super::super::send::Trouble;
use super::super::telemetry::TelemetryEvent;
use super::super::window::Position;
use super::super::{Reconnect, ReconnectCause, Session, SessionEnd};
use super::producer::LedgerRecord;
use super::ExactlyOnce;
use crate::relay::RelayError;
use crate::sink::{ledger_record, DeliveryReport, TransactionError};

/// What the reports of a committed transaction said.
enum Committed {
    /// Every record acknowledged.
    Complete,
    /// Fewer reports than records came back.
    Incomplete,
    /// A report was a failure, which a commit that succeeded rules out.
    Contradicted(Trouble),
}

impl Session<'_, ExactlyOnce> {
    /// When the open Kafka transaction (or an idle ledger move) is due, if
    /// anything is to commit.
    pub(super) fn commit_due(&self, now: Instant) -> Option<Instant> {
        if self.window.halted().is_some() || self.window.waiting() > 0 {
            return None;
        }
        let relay = &self.settings.config.relay;
        match self.delivery.producer.open_transaction() {
            Some((events, began)) => {
                let now_due = events >= relay.transaction_max_events
                    || !self.window.may_read()
                    || self.stream.idle;
                Some(if now_due {
                    now
                } else {
                    began + relay.transaction_max_delay
                })
            }
            None => {
                let position = self.ledger_position();
                if position.inside.is_some() {
                    return None;
                }
                if position.through <= self.delivery.committed {
                    // Held back by the table watch alone: ask again once it
                    // has looked (nothing else may wake an idle session).
                    let held = self.window.position().through > self.delivery.committed;
                    return held.then(|| now + self.settings.config.postgres.status_interval);
                }
                let writer = self.ledger_writer.as_ref()?;
                let at = writer.due_at(position.through, now.into_std())?;
                Some(Instant::from_std(at))
            }
        }
    }

    /// What the next ledger entry may say: the window's position, except
    /// that a move without events stops at the table watch's ceiling, as
    /// the slot does. Past it a table change may have kept events out of
    /// the stream, and the entry would vouch for them (they come back only
    /// by a backfill either way, but the halt names the ceiling).
    pub(super) fn ledger_position(&self) -> Position {
        let mut position = self.window.position();
        if self.delivery.producer.open_transaction().is_none() && position.inside.is_none() {
            let vouched = self.table_watch.vouched().max(self.delivery.committed);
            position.through = position.through.min(vouched);
        }
        position
    }

    /// Commits now if due (see [`Session::commit_due`]).
    pub(super) async fn commit_if_due(&mut self) -> Step {
        let now = Instant::now();
        match self.commit_due(now) {
            Some(at) if at <= now => self.commit().await,
            _ => Ok(None),
        }
    }

    /// Commits the open Kafka transaction with the ledger entry for the
    /// window's position, then books its reports: acks, now that they are
    /// visible. Without an open one, commits the entry alone.
    pub(super) async fn commit(&mut self) -> Step {
        if let Some(end) = self.fencing_checked().await? {
            return Ok(Some(end));
        }
        let position = self.ledger_position();
        let Some(writer) = &mut self.ledger_writer else {
            // Only before the server is known; never in a session.
            return Ok(None);
        };
        let entry = writer.at(
            position.through,
            position.inside,
            std::time::Instant::now(),
            crate::clock::now_unix_micros(),
        );
        let (key, value) = ledger_record(&entry);
        let record = LedgerRecord {
            topic: self.settings.config.kafka.ledger_topic.clone(),
            key,
            value,
        };
        let events = self
            .delivery
            .producer
            .open_transaction()
            .map_or(0, |(n, _)| n);
        let started = Instant::now();
        let reports = match self.delivery.producer.commit(record).await {
            Ok(reports) => reports,
            Err(e) => return self.transaction_failed(e).await,
        };
        let booked = self.book_committed(reports, events);
        self.telemetry.emit(TelemetryEvent::TransactionCommitted {
            events,
            seconds: started.elapsed().as_secs_f64(),
            through: entry.confirmed_lsn,
        });
        self.delivery.committed = entry.confirmed_lsn;
        self.ledger.committed(entry);
        // Committed, so the ledger has them: the next session skips them
        // rather than wait here for reports.
        match booked {
            Committed::Complete => Ok(None),
            Committed::Incomplete => Ok(Some(
                self.give_up("the reports of a committed Kafka transaction did not all come back"),
            )),
            Committed::Contradicted(trouble) => Ok(Some(self.give_up(&format!(
                "a committed Kafka transaction reported a failed record: {}",
                trouble.cause()
            )))),
        }
    }

    /// Books the reports of a committed transaction of `events` records:
    /// acks, now that they are visible.
    fn book_committed(&mut self, reports: Vec<DeliveryReport>, events: usize) -> Committed {
        let complete = reports.len() == events;
        let mut contradiction = None;
        for report in reports {
            if let Some(trouble) = self.book(report) {
                contradiction.get_or_insert(trouble);
            }
        }
        match (contradiction, complete) {
            (Some(trouble), _) => Committed::Contradicted(trouble),
            (None, true) => Committed::Complete,
            (None, false) => Committed::Incomplete,
        }
    }

    /// Waits for the ledger read after the fencing, if it is still under
    /// way: nothing commits before it, and a failed read, or a gap it
    /// confirms (see `RelayLedger::after_fencing`), aborts the open
    /// transaction and ends the session. When the entry that speaks for the
    /// session moved, the instance it fenced committed a last transaction
    /// after the gate's read: the open transaction is aborted (nothing of it
    /// becomes visible) and the session starts again from that entry.
    async fn fencing_checked(&mut self) -> Step {
        let Some(check) = self.delivery.fencing_check.take() else {
            return Ok(None);
        };
        let found = check.finish().await;
        let moved = match found.and_then(|found| self.ledger.after_fencing(found)) {
            Ok(moved) => moved,
            Err(e) => {
                // Ended now rather than by the next initialisation: an open
                // transaction holds back read_committed consumers of every
                // partition it wrote to.
                self.abort(&e.to_string()).await;
                return Err(e);
            }
        };
        if !moved {
            return Ok(None);
        }
        let detail = "the position ledger moved while this instance took the transactional id \
                      over (the instance it fenced committed a last transaction): starting again \
                      from it";
        self.abort(detail).await;
        Ok(Some(SessionEnd::Reconnect(Reconnect {
            cause: ReconnectCause::Kafka,
            detail: detail.into(),
        })))
    }

    /// A transaction call or a send failed: the relay stops when fenced,
    /// else the transaction is aborted and the session ends, to resume from
    /// the ledger.
    pub(super) async fn transaction_failed(&mut self, error: TransactionError) -> Step {
        let error = match (error, self.delivery.producer.fenced()) {
            (e @ TransactionError::Fenced { .. }, _) | (_, Some(e)) => {
                self.telemetry.emit(TelemetryEvent::Fenced(&e.to_string()));
                return Err(RelayError::Transaction(e));
            }
            (e, None) => e,
        };
        let cause = error.to_string();
        self.abort(&cause).await;
        Ok(Some(self.give_up(&cause)))
    }

    /// Aborts the open transaction. Its reports are booked as failures, so
    /// the verdicts on records the broker refused outlive the session.
    pub(super) async fn abort(&mut self, cause: &str) {
        let Some((events, _)) = self.delivery.producer.open_transaction() else {
            return;
        };
        let (reports, outcome) = self.delivery.producer.abort().await;
        for report in reports {
            // Every one a failure: what it asks of the producer is moot, as
            // an abort ends the session (or its drain) with the producer.
            match self.book(report) {
                None
                | Some(Trouble::Refusal(_) | Trouble::ProducerEnded(_) | Trouble::Outage(_)) => {}
            }
        }
        self.telemetry.emit(TelemetryEvent::TransactionAborted {
            events,
            cause,
            outcome: &outcome,
        });
    }
}
