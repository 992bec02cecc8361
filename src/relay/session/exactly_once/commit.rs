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
//! A commit runs on a task of its own while the loop reads on: what the
//! walsender sends meanwhile waits in the session's backlog, unmapped, and
//! is handled in WAL order once the commit ended, so the next transaction
//! holds all of it. Waiting for the commit instead kept the walsender
//! waiting too, and then took the keepalives it had sent before the pile
//! for "idle": every commit as slow as the last carried a few events, and
//! a broker 20 ms away left the relay a minute behind (`relay::slow_commits`).
//! Nothing of a transaction is sent before the last one committed, so the
//! window, its positions and the ledger entries are as with one commit at a
//! time.
//!
//! The slot is confirmed up to the last committed entry at most, so the
//! ledger is never behind the slot: a restart skips what the ledger has
//! (read `read_committed`) and repeats nothing. An abort, or a commit whose
//! outcome is unknown, ends the session: the next one reads the ledger
//! again and resumes from it, not from this session's memory. A fencing
//! stops the relay. A commit the watchdog finds stuck (`kafka.stuck_after`
//! while every partition has a leader) is not waited for: the session ends
//! at once and the next one's producer fences this one
//! (`ExactlyOnce::replace_stuck`).

use tokio::time::Instant;

use super::super::mode::Step;
use super::super::parts::{Reconnect, Session, SessionEnd};
use super::super::producer_watch::{ProducerWait, Watched};
use super::super::send::Trouble;
use super::super::telemetry::TelemetryEvent;
use super::super::window::Position;
use super::producer::{AbortOutcome, CommitCall, LedgerRecord};
use super::{ExactlyOnce, PendingCommit};
use crate::relay::error::RelayError;
use crate::relay::telemetry::ReconnectCause;
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
        let busy = self.delivery.producer.committing();
        if busy || self.window.halted().is_some() || self.window.waiting() > 0 {
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

    /// Starts a commit if one is due (see [`Session::commit_due`]); the
    /// loop reads on while it is under way.
    pub(super) async fn commit_if_due(&mut self) -> Step {
        let now = Instant::now();
        match self.commit_due(now) {
            Some(at) if at <= now => self.start_commit().await,
            _ => Ok(None),
        }
    }

    /// Commits the open Kafka transaction (after the one under way, if
    /// any) and waits for it. Without an open one, commits the entry
    /// alone.
    pub(super) async fn commit(&mut self) -> Step {
        if let Some(end) = self.settle_commit().await? {
            return Ok(Some(end));
        }
        if let Some(end) = self.start_commit().await? {
            return Ok(Some(end));
        }
        self.settle_commit().await
    }

    /// Waits for the commit under way, if any, and books it.
    pub(super) async fn settle_commit(&mut self) -> Step {
        if !self.delivery.producer.committing() {
            return Ok(None);
        }
        match self.watched(commit_call).await? {
            Watched::Done(call) => self.commit_ended(call).await,
            Watched::Replaced(end) => Ok(end),
        }
    }

    /// Books the commit whose call ended; a failed one is aborted, and the
    /// session ends.
    pub(super) async fn commit_ended(&mut self, call: CommitCall) -> Step {
        match self.finish_commit(call).await {
            Ok(end) => Ok(end),
            Err(e) => self.transaction_failed(e).await,
        }
    }

    /// Lets the commit under way end (or the watchdog give it up); its
    /// outcome is booked, and a failure told (its transaction stays open:
    /// to abort, or for the next producer with the transactional id to
    /// end).
    pub(super) async fn close_commit(&mut self) {
        if !self.delivery.producer.committing() {
            return;
        }
        // Given up as stuck, the commit is the next producer's to end.
        let call = match self.watched(commit_call).await {
            Ok(Watched::Done(call)) => call,
            Ok(Watched::Replaced(_)) => return,
            Err(e) => {
                tracing::warn!(error = %e, "the Kafka transaction commit under way was given up");
                return;
            }
        };
        if let Err(e) = self.finish_commit(call).await {
            tracing::warn!(error = %e, "the Kafka transaction commit under way failed");
        }
    }

    /// Sends the ledger entry for the window's position into the open
    /// Kafka transaction and starts its commit.
    async fn start_commit(&mut self) -> Step {
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
        if let Err(e) = self.delivery.producer.start_commit(record) {
            return self.transaction_failed(e).await;
        }
        self.delivery.pending = Some(PendingCommit {
            entry,
            events,
            started: Instant::now(),
        });
        Ok(None)
    }

    /// The commit's end: its reports booked, acks now that they are
    /// visible, and the ledger told; or the failure, for the caller to
    /// abort the transaction (still open).
    async fn finish_commit(
        &mut self,
        call: CommitCall,
    ) -> Result<Option<SessionEnd>, TransactionError> {
        let reports = self.delivery.producer.committed(call).await?;
        let Some(PendingCommit {
            entry,
            events,
            started,
        }) = self.delivery.pending.take()
        else {
            debug_assert!(false, "a commit ended that was never started");
            return Ok(None);
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
        Ok(match booked {
            Committed::Complete => None,
            Committed::Incomplete => Some(
                self.give_up("the reports of a committed Kafka transaction did not all come back"),
            ),
            Committed::Contradicted(trouble) => Some(self.give_up(&format!(
                "a committed Kafka transaction reported a failed record: {}",
                trouble.cause()
            ))),
        })
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
        // The commit under way ends first: it holds what came before the
        // cause, and librdkafka takes no abort meanwhile. A failed commit
        // leaves its transaction open, aborted below.
        self.close_commit().await;
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
            unconfirmed: match &outcome {
                AbortOutcome::Aborted => None,
                AbortOutcome::Unconfirmed(error) => Some(error),
            },
        });
    }
}

/// The commit under way, as a wait the watchdog races.
fn commit_call(mode: &mut ExactlyOnce) -> ProducerWait<'_, CommitCall> {
    Box::pin(mode.producer.commit_call())
}
