//! Exactly-once delivery (`relay.delivery = "exactly-once"`): the
//! session's records go out in Kafka transactions ([`producer`]), each with
//! the position ledger's entry for how far it reaches, and the slot is
//! never confirmed past the last committed entry ([`commit`]: when a
//! transaction commits, and what a commit or an abort does to the window
//! and the ledger).
//!
//! The `transactional.id` is the ledger key, `outboxd-<system
//! identifier>/<database>/<slot>`, or `kafka.transactional_id`: the hot
//! standby of a slot has the same one, so initialising it when it takes over
//! fences the instance it replaces, and aborts what that one left open.

mod commit;
mod producer;

use std::collections::BTreeSet;

use rdkafka::types::RDKafkaErrorCode;
use tokio::time::Instant;

use super::mode::{DeliveryMode, Drain, Step, Stuck};
use super::parts::Session;
use super::producer_watch::Watched;
use super::telemetry::TelemetryEvent;
use super::watchdog::earliest;
use super::window::{InFlight, Window};
use crate::relay::error::RelayError;
use crate::relay::ledger::{FencingCheck, RelayLedger, Start};
use crate::relay::settings::RelaySettings;
use crate::sink::{FailureKind, SendError, TransactionError};
use crate::Lsn;
use producer::{CommitCall, Transactional};

pub(super) struct ExactlyOnce {
    producer: Transactional,
    /// The ledger entry and the telemetry of the commit under way.
    pending: Option<PendingCommit>,
    /// The position of the last committed ledger entry, which the slot is
    /// never confirmed past.
    committed: Lsn,
    /// The ledger read after this session's producer fenced the last one,
    /// under way until the first commit waits for it.
    fencing_check: Option<FencingCheck>,
}

/// What the session knows of the commit under way.
struct PendingCommit {
    /// The ledger entry it carries.
    entry: crate::progress::ledger::LedgerEntry,
    /// Event records in it.
    events: usize,
    started: Instant,
}

impl DeliveryMode for ExactlyOnce {
    /// Makes the producer and initialises its transactions (only a session
    /// that holds the slot gets here, so a standby fences nobody), then
    /// reads the ledger to its end, now that nobody else can write to it.
    async fn start(
        settings: &RelaySettings,
        ledger: &RelayLedger,
        start: &Start,
        start_lsn: Lsn,
        ledger_key: &str,
    ) -> Result<Self, RelayError> {
        let producer = Transactional::open(settings, ledger_key).await?;
        Ok(ExactlyOnce {
            producer,
            pending: None,
            // The ledger has everything up to its position in Kafka.
            committed: start.skip_through.map_or(start_lsn, |t| t.max(start_lsn)),
            fencing_check: ledger.check_after_fencing(start),
        })
    }

    /// Once the producer has a record, the window entry keeps only what the
    /// ack reports: an abort resumes from the ledger, never from memory.
    fn send(&mut self, entry: &mut InFlight) -> Result<(), SendError> {
        self.producer.send(entry.id, &entry.record)?;
        entry.lighten();
        Ok(())
    }

    /// The commit flushes; nothing lingers past it.
    fn send_now(&self) {}

    /// Reports come only with a commit or an abort; what is waited for is
    /// the commit under way.
    type News = CommitCall;

    async fn news(&mut self) -> CommitCall {
        self.producer.commit_call().await
    }

    /// A commit is under way: the next transaction begins once it ended.
    fn busy(&self) -> bool {
        self.producer.committing()
    }

    fn ceiling(&self) -> Lsn {
        self.committed
    }

    /// When the open Kafka transaction, or an idle ledger move, is due.
    fn wake_at(s: &Session<'_, Self>) -> Option<Instant> {
        s.commit_due(Instant::now())
    }

    async fn on_news(s: &mut Session<'_, Self>, call: CommitCall) -> Step {
        s.commit_ended(call).await
    }

    /// Room comes with the commit of what the queue holds. Flushed first:
    /// the commit's ledger record needs room too, which a queue smaller
    /// than the window (`queue.buffering.max.messages` below it) does not
    /// have while its records are in flight.
    async fn make_room(s: &mut Session<'_, Self>) -> Step {
        if let Some(end) = s.flush().await? {
            return Ok(Some(end));
        }
        s.commit().await
    }

    /// Alone inside the open Kafka transaction, flushed before and after,
    /// so that no batch-mate shares its produce request; its verdict comes
    /// with the commit or the abort. Committing what is open before it
    /// instead would split its database transaction: its first events
    /// visible without the rest and without its dead-letter copy.
    async fn trial(s: &mut Session<'_, Self>, mut entry: InFlight) -> Step {
        if let Some(end) = s.settle_commit().await? {
            return Ok(Some(end));
        }
        if let Some(end) = s.flush().await? {
            return Ok(Some(end));
        }
        Window::isolate(&mut entry);
        if let Some(end) = s.deliver(entry).await? {
            return Ok(Some(end));
        }
        s.flush().await
    }

    /// The transaction cannot commit now: abort it, resume from the ledger
    /// (or stop, when fenced).
    async fn refused(
        s: &mut Session<'_, Self>,
        entry: InFlight,
        code: RDKafkaErrorCode,
        _kind: FailureKind,
        message: String,
    ) -> Step {
        s.window.hold(entry);
        let error = TransactionError::Abortable { code, message };
        s.transaction_failed(error).await
    }

    /// Commits when due, then confirms (up to the last committed entry:
    /// the ledger entries go with the commits).
    async fn end_turn(s: &mut Session<'_, Self>) -> Step {
        if s.window.halted().is_some() {
            // Nothing of the halted transaction becomes visible.
            s.abort("the relay halted").await;
        }
        if let Some(end) = s.commit_if_due().await? {
            return Ok(Some(end));
        }
        s.confirm();
        Ok(None)
    }

    async fn drain(s: &mut Session<'_, Self>) -> Result<Drain, RelayError> {
        if s.window.halted().is_some() {
            // Halted: the open transaction never commits.
            s.abort("the relay is halted and stopping").await;
            return Ok(Drain::Done);
        }
        if let Some(end) = s.settle_commit().await? {
            return Ok(Drain::End(end));
        }
        // What was read until the stream drained is acked by its commit.
        if s.stream.drained {
            let moved = s.ledger_position().through > s.delivery.committed;
            if s.delivery.producer.open_transaction().is_some() || moved {
                if let Some(end) = s.commit().await? {
                    return Ok(Drain::End(end));
                }
            }
        }
        let done = s.stream.drained && s.window.in_flight() == 0;
        Ok(if done { Drain::Done } else { Drain::Going })
    }

    /// The last entry went with the last commit.
    async fn finish(_s: &mut Session<'_, Self>, _confirmed: Lsn) {}

    /// A commit under way ends (within `transaction.timeout.ms`) before
    /// the session does: left to itself it could land after the next
    /// session read the ledger, which would then start from an older
    /// entry than Kafka has, and name it in a gap.
    async fn close(s: &mut Session<'_, Self>) {
        s.close_commit().await;
    }

    /// The commit under way, or a flush the session waits for.
    fn holding_since(s: &mut Session<'_, Self>, _now: Instant) -> Option<Instant> {
        let commit = s.delivery.pending.as_ref().map(|p| p.started);
        earliest(commit, s.delivery.producer.flushing_since())
    }

    fn holding(s: &Session<'_, Self>) -> (String, BTreeSet<String>) {
        let what = match &s.delivery.pending {
            Some(p) => format!(
                "the Kafka transaction commit under way ({} event(s), position ledger entry \
                 through {})",
                p.events, p.entry.confirmed_lsn
            ),
            None => match s.delivery.producer.open_transaction() {
                Some((events, _)) if s.delivery.producer.flushing_since().is_some() => {
                    format!("the flush of the open Kafka transaction ({events} event(s))")
                }
                _ => "no commit".into(),
            },
        };
        let mut topics = s.window.topics_with_producer();
        topics.insert(s.settings.config.kafka.ledger_topic.clone());
        (what, topics)
    }

    /// Gives the producer up with its commit (or a flush) still under way,
    /// and ends the session to resume from the ledger: the next session's
    /// producer fences this one as it initialises its transactions (same
    /// transactional id), which ends the transaction, aborted unless the
    /// coordinator had already begun to commit it; its first commit then
    /// waits for the ledger read after the fencing, which finds a commit
    /// that landed after all and starts again from it (see
    /// `commit::fencing_checked`). Nothing of the transaction was booked as
    /// acknowledged, so the slot stays where the last committed entry put
    /// it.
    async fn replace_stuck(s: &mut Session<'_, Self>, stuck: Stuck<'_>) -> Step {
        s.telemetry.emit(TelemetryEvent::ProducerStuck {
            age: stuck.age,
            holding: stuck.holding,
            leaders: stuck.leaders,
            then: "giving the producer up without waiting for transaction.timeout.ms; the next \
                   session fences it and resumes from the position ledger",
        });
        s.delivery.producer.abandon_commit();
        s.delivery.producer.abandon_flush();
        s.delivery.pending = None;
        let cause = format!(
            "the producer was stuck: {} for {:.1} s",
            stuck.holding,
            stuck.age.as_secs_f64()
        );
        Ok(Some(s.give_up(&cause)))
    }
}

impl Session<'_, ExactlyOnce> {
    /// Flushes the open transaction (see `Transactional::start_flush`),
    /// the watchdog racing the wait; a failed flush aborts it.
    async fn flush(&mut self) -> Step {
        self.delivery.producer.start_flush();
        let flushed = self
            .watched(|mode: &mut ExactlyOnce| Box::pin(mode.producer.flush_call()))
            .await?;
        match flushed {
            Watched::Done(Ok(())) => Ok(None),
            Watched::Done(Err(e)) => self.transaction_failed(e).await,
            Watched::Replaced(end) => Ok(end),
        }
    }
}
