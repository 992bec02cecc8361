//! Exactly-once: when the session commits a Kafka transaction, and what a
//! commit or an abort does to the window and the ledger.
//!
//! A Kafka transaction holds what the window handed over since the last
//! commit, in WAL order, and one position ledger entry for how far that is
//! ([`Position`](super::window::Position)): the last commit end passed and,
//! when a database transaction is split, how many of the next one's events.
//! It commits when it holds `relay.transaction_max_events` (at most half the
//! window), when the window is full (its reports wait for the commit), after
//! `relay.transaction_max_delay`, or once the stream is idle: the walsender
//! sends a keepalive between transactions as soon as it waits for WAL
//! (PostgreSQL's `WalSndWaitForWal`), which no backlog ever lets it do. (An
//! empty hand-over channel is no such sign: in a backlog the relay often
//! outpaces the driver, and committing then cost 6 × the throughput.) An
//! idle relay whose
//! position moved past the ledger (WAL of other tables, keepalives) commits
//! a transaction holding only the ledger entry, once per status interval.
//!
//! A commit runs in the background: the session goes on reading and mapping
//! events meanwhile, queued in the window (librdkafka takes no record while
//! it commits), and sends them in the next transaction once the commit is
//! done. In a backlog drain the commits took about 45 % of the time when the
//! session waited for them.
//!
//! The slot is confirmed up to the last committed entry at most, so the
//! ledger is never behind the slot: a restart skips what the ledger has
//! (read `read_committed`) and repeats nothing. An abort, or a commit whose
//! outcome is unknown, ends the session: the next one reads the ledger
//! again and resumes from it, not from this session's memory. A fencing
//! stops the relay.

use tokio::time::Instant;

use super::delivery::{Delivery, LedgerRecord};
use super::ledger;
use super::telemetry::TelemetryEvent;
use super::{Session, SessionEnd};
use crate::progress::ledger::LedgerEntry;
use crate::relay::RelayError;
use crate::sink::{ledger_record, TransactionError};

/// A commit under way: what it will have committed.
pub(super) struct PendingCommit {
    entry: LedgerEntry,
    events: usize,
    started: Instant,
}

impl<D: Delivery> Session<'_, D> {
    /// When the open Kafka transaction (or an idle ledger move) is due, if
    /// anything is to commit; never while a commit is under way.
    pub(super) fn commit_due(&self, now: Instant) -> Option<Instant> {
        if !D::TRANSACTIONAL
            || self.window.halted().is_some()
            || self.window.waiting() > 0
            || self.delivery.committing()
        {
            return None;
        }
        let relay = &self.settings.config.relay;
        match self.delivery.open_transaction() {
            Some((events, began)) => {
                let now_due = events >= self.commit_size() || !self.window.may_read() || self.idle;
                Some(if now_due {
                    now
                } else {
                    began + relay.transaction_max_delay
                })
            }
            None => {
                let position = self.window.position();
                if position.through <= self.committed || position.inside.is_some() {
                    return None;
                }
                let writer = self.ledger_writer.as_ref()?;
                let at = writer.due_at(position.through, now.into_std())?;
                Some(Instant::from_std(at))
            }
        }
    }

    /// Events at which a transaction commits: `relay.transaction_max_events`,
    /// and at most half the window, so that the other half is read and
    /// mapped while it commits.
    fn commit_size(&self) -> usize {
        let relay = &self.settings.config.relay;
        relay
            .transaction_max_events
            .min((relay.max_in_flight_events / 2).max(1))
    }

    /// Starts a commit if one is due (see [`Session::commit_due`]).
    pub(super) async fn commit_if_due(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        let now = Instant::now();
        match self.commit_due(now) {
            Some(at) if at <= now => self.start_commit().await,
            _ => Ok(None),
        }
    }

    /// Commits now and waits for it: at a shutdown, before a suspect's
    /// trial, for room in a full queue.
    pub(super) async fn commit(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        if let Some(end) = self.settle_commit().await? {
            return Ok(Some(end));
        }
        if let Some(end) = self.start_commit().await? {
            return Ok(Some(end));
        }
        self.settle_commit().await
    }

    /// Waits for the commit under way, if any, and books it.
    pub(super) async fn settle_commit(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        if !self.delivery.committing() {
            return Ok(None);
        }
        self.commit_finished().await
    }

    /// Starts committing the open Kafka transaction with the ledger entry
    /// for the window's position (or the entry alone, none being open).
    async fn start_commit(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        let position = self.window.position();
        let Some(writer) = &mut self.ledger_writer else {
            // Only before the server is known; never in a session.
            return Ok(None);
        };
        let entry = writer.at(
            position.through,
            position.inside,
            std::time::Instant::now(),
            ledger::now_us(),
        );
        let (key, value) = ledger_record(&entry);
        let record = LedgerRecord {
            topic: self.settings.config.kafka.ledger_topic.clone(),
            key,
            value,
        };
        let events = self.delivery.open_transaction().map_or(0, |(n, _)| n);
        match self.delivery.start_commit(record) {
            Ok(()) => {
                self.pending_commit = Some(PendingCommit {
                    entry,
                    events,
                    started: Instant::now(),
                });
                Ok(None)
            }
            Err(e) => self.transaction_failed(e).await,
        }
    }

    /// The commit under way is done: books its reports (acks, now that they
    /// are visible), or aborts and ends the session.
    pub(super) async fn commit_finished(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        match self.book_commit().await {
            Ok(end) => Ok(end),
            Err(e) => self.transaction_failed(e).await,
        }
    }

    async fn book_commit(&mut self) -> Result<Option<SessionEnd>, TransactionError> {
        let reports = self.delivery.finish_commit().await?;
        let Some(pending) = self.pending_commit.take() else {
            return Ok(None);
        };
        let complete = reports.len() == pending.events;
        for report in reports {
            // Acks only: a commit succeeds only when every record of the
            // transaction was delivered.
            let _ = self.book(report);
        }
        self.telemetry.emit(TelemetryEvent::TransactionCommitted {
            events: pending.events,
            seconds: pending.started.elapsed().as_secs_f64(),
            through: pending.entry.confirmed_lsn,
        });
        self.committed = pending.entry.confirmed_lsn;
        self.ledger.committed(pending.entry);
        if !complete {
            // Committed, so the ledger has them: the next session skips
            // them rather than wait here for reports.
            return Ok(Some(self.give_up(
                "the reports of a committed Kafka transaction did not all come back",
            )));
        }
        Ok(None)
    }

    /// A transaction call or a send failed: the relay stops when fenced,
    /// else the transaction is aborted and the session ends, to resume from
    /// the ledger.
    pub(super) async fn transaction_failed(
        &mut self,
        error: TransactionError,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let error = match (error, self.delivery.fenced()) {
            (e @ TransactionError::Fenced { .. }, _) | (_, Some(e)) => {
                self.telemetry.emit(TelemetryEvent::Fenced(&e.to_string()));
                return Err(RelayError::Transaction(e));
            }
            (e, None) => e,
        };
        let cause = error.to_string();
        self.pending_commit = None;
        self.abort(&cause).await;
        Ok(Some(self.give_up(&cause)))
    }

    /// Aborts the open transaction (a commit under way ends first, and is
    /// booked if it succeeded). Its reports are booked as failures, so the
    /// verdicts on records the broker refused outlive the session.
    pub(super) async fn abort(&mut self, cause: &str) {
        if self.delivery.committing() && self.pending_commit.is_some() {
            let _ = self.book_commit().await;
        }
        let Some((events, _)) = self.delivery.open_transaction() else {
            return;
        };
        let reports = self.delivery.abort().await;
        for report in reports {
            let _ = self.book(report);
        }
        self.telemetry
            .emit(TelemetryEvent::TransactionAborted { events, cause });
    }
}
