//! One relay session: a replication stream (run by its own task, see
//! [`driver`](crate::source::driver)), a producer ([`Delivery`]) and the
//! in-flight window ([`Window`]) that live and die together. The main
//! `select!` is biased, by priority:
//! 1. shutdown (drain in-flight acks, confirm, exit), then a change of the
//!    outbox table ([`TableWatch`]: halt),
//! 2. delivery reports (acks move the confirmable position; a transport
//!    failure ends the session),
//! 3. the drain deadline,
//! 4. a status update the driver sent, or the end of the ledger's interval
//!    while the ledger has not taken what the driver confirmed (after every
//!    turn the ledger is offered that position),
//! 5. what the driver read, only while in-flight events and bytes are under
//!    their limits (or else only the driver's failure).
//!
//! The walsender ends a connection it hears nothing from for
//! `wal_sender_timeout`; the driver sees to that on its own, whatever this
//! task waits for (a topic, a report, room in the producer's queue).
//!
//! This file holds the session's I/O and its loop. Its submodules:
//! [`window`] owns what is in flight (pure: the ack tracker, the records
//! waiting to be sent again, the poison [`verdicts`], the halt);
//! [`delivery`] is the seam to Kafka, one implementation per delivery mode;
//! [`send`] takes events to the producer and reports back to the window;
//! [`poison`] applies `relay.on_error`; [`telemetry`] writes metrics, health
//! and log lines.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::ledger::{self, FencingCheck, RelayLedger, Start};
use super::slot_record::SlotRecord;
mod commit;
mod delivery;
mod poison;
mod send;
mod telemetry;
mod transactional;
mod verdicts;
mod window;

pub(super) use super::telemetry::ReconnectCause;
pub(super) use poison::DEAD_LETTER_REASONS;
pub use telemetry::EVENTS_TARGET;
pub(super) use verdicts::PoisonMemory;

use super::table_watch::{TableBaseline, TableWatch, WatchNews};
use super::{RelayError, RelaySettings};
use crate::config::DeliveryMode;
use crate::outbox::TableMappers;
use crate::progress::ledger::LedgerWriter;
use crate::sink::TopicManager;
use crate::source::driver::{DriverOptions, SourceHandle, StatusUpdates, Streamed};
use crate::source::session::{SourceError, SourceSession};
use crate::Lsn;
use delivery::{AtLeastOnce, Delivery};
use telemetry::{Telemetry, TelemetryEvent};
use transactional::Transactional;
use window::{Halt, Limits, Relayed, Window};

/// Items taken from the driver per wake-up at most, so that reports and
/// shutdown are looked at in between.
const BATCH: usize = 64;

/// Least time a graceful stop waits for the table watch to vouch for the
/// last acked position (beyond three status intervals): two looks on a
/// slow connection.
const MIN_SETTLE: Duration = Duration::from_secs(2);

pub(crate) enum SessionEnd {
    Shutdown,
    /// Kafka-side trouble: reconnect, resuming from the slot.
    Reconnect(Reconnect),
}

/// Why a session ends for a reconnect: the metric's cause and the message.
pub(crate) struct Reconnect {
    pub(super) cause: ReconnectCause,
    pub(super) detail: String,
}

impl Reconnect {
    /// A delivery failed: Kafka may have a gap after it.
    pub(super) fn delivery(detail: impl std::fmt::Display) -> SessionEnd {
        SessionEnd::Reconnect(Reconnect {
            cause: ReconnectCause::KafkaDelivery,
            detail: format!("delivery failed: {detail}"),
        })
    }

    /// The producer's report channel closed.
    pub(super) fn producer_stopped() -> SessionEnd {
        SessionEnd::Reconnect(Reconnect {
            cause: ReconnectCause::Kafka,
            detail: "Kafka producer stopped".into(),
        })
    }
}

/// Runs one session, in the configured delivery mode (see [`delivery`]).
pub(super) async fn run(
    settings: &RelaySettings,
    mapper: &mut TableMappers,
    poison: &mut PoisonMemory,
    ledger: &mut RelayLedger,
    slot: &mut SlotRecord,
    tables: &mut TableBaseline,
    stop: watch::Receiver<bool>,
) -> Result<SessionEnd, RelayError> {
    match settings.config.relay.delivery {
        DeliveryMode::AtLeastOnce => {
            Session::<AtLeastOnce>::run(settings, mapper, poison, ledger, slot, tables, stop).await
        }
        DeliveryMode::ExactlyOnce => {
            // From what Kafka committed, not from what this process
            // believes it committed.
            ledger.refresh().await?;
            Session::<Transactional>::run(settings, mapper, poison, ledger, slot, tables, stop)
                .await
        }
    }
}

struct Session<'a, D> {
    settings: &'a RelaySettings,
    /// The replication stream's driver.
    source: SourceHandle,
    /// Its status updates, which wake the loop to offer the ledger what
    /// was confirmed.
    status_updates: StatusUpdates,
    /// The driver said the open transaction is complete after a drain
    /// request: nothing more comes.
    drained: bool,
    mapper: &'a mut TableMappers,
    /// What is in flight: every decision about it is the window's.
    window: Window<'a>,
    delivery: D,
    topics: TopicManager,
    /// When the message being processed arrived.
    received_at: Instant,
    telemetry: Telemetry,
    /// Keeps confirmation behind the last look that found the outbox table
    /// intact; reports a change.
    table_watch: TableWatch,
    ledger: &'a mut RelayLedger,
    /// Offered what the driver confirmed; `None` before the server is known.
    ledger_writer: Option<LedgerWriter>,
    /// Told that the stream opened and what the driver confirmed, for the
    /// relay's decisions about the slot.
    slot: &'a mut SlotRecord,
    /// The relay's name in the ledger, which a transactional id derives
    /// from.
    ledger_key: String,
    /// Exactly-once: the ledger read after this session's producer fenced
    /// the last one, under way until the first commit waits for it.
    fencing_check: Option<FencingCheck>,
    /// Exactly-once: the position of the last committed ledger entry, which
    /// the slot is never confirmed past.
    committed: Lsn,
    /// The walsender said it has nothing more for now (a keepalive between
    /// transactions) since the last item: the stream is idle.
    idle: bool,
}

impl<'a, D: Delivery> Session<'a, D> {
    async fn run(
        settings: &'a RelaySettings,
        mapper: &'a mut TableMappers,
        poison: &'a mut PoisonMemory,
        ledger: &'a mut RelayLedger,
        slot: &'a mut SlotRecord,
        tables: &mut TableBaseline,
        mut stop: watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        let mut start = Start::default();
        let source = SourceSession::open_gated(&settings.source, |found| {
            ledger.gate(settings, found, &mut start)
        })
        .await?;
        let start_lsn = source.start_lsn;
        let interval = settings.config.postgres.status_interval;
        let table_watch = TableWatch::start(&settings.source, start_lsn, interval, tables)
            .await
            .map_err(SourceError::from)?;
        let source = source.start(DriverOptions {
            status_interval: interval,
            stream_timeout: settings.config.postgres.stream_timeout,
            ceiling: Some(table_watch.ceiling()),
        });
        let mut telemetry = Telemetry::new(std::sync::Arc::clone(&settings.health));
        slot.stream_opened(start_lsn);
        telemetry.emit(TelemetryEvent::StreamOpened { start: start_lsn });
        let ledger_key = match &start.identity {
            Some(identity) => identity.key(),
            None => settings.source.slot.clone(),
        };
        let delivery = D::open(settings, &ledger_key).await?;
        let fencing_check = if D::TRANSACTIONAL {
            ledger.check_after_fencing(&start)
        } else {
            None
        };
        let topics = TopicManager::new(&settings.brokers, &settings.config.kafka)?;
        telemetry.emit(TelemetryEvent::Started);
        let relay = &settings.config.relay;
        let limits = Limits {
            events: relay.window_events(),
            bytes: relay.max_in_flight_bytes,
        };
        let relayed = Relayed {
            through: start.skip_through,
            inside: start.inside,
        };
        let mut s = Session {
            settings,
            status_updates: source.status_updates(),
            source,
            drained: false,
            mapper,
            window: Window::new(start_lsn, relayed, poison, limits),
            delivery,
            topics,
            received_at: Instant::now(),
            telemetry,
            table_watch,
            ledger_writer: ledger.writer(&start, interval),
            ledger,
            slot,
            ledger_key,
            fencing_check,
            // The ledger has everything up to its position in Kafka.
            committed: relayed.through.map_or(start_lsn, |t| t.max(start_lsn)),
            idle: false,
        };
        let mut drain_deadline: Option<Instant> = None;
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        loop {
            if let Some(deadline) = drain_deadline {
                let drained = if s.window.halted().is_some() && D::TRANSACTIONAL {
                    // Halted: the open transaction never commits.
                    s.abort("the relay is halted and stopping").await;
                    true
                } else if s.window.halted().is_some() {
                    // Halted: nothing after the poison event is read, so its
                    // transaction never finishes, and the poison event holds
                    // its tracker slot for good. Only what the producer still
                    // holds can be acked: once its reports are all on the
                    // channel, take them and stop.
                    let flushed = s.delivery.in_queue() == 0;
                    if flushed {
                        while let Some(report) = s.delivery.try_report() {
                            if let Some(end) = s.on_report(report).await? {
                                return Ok(end);
                            }
                        }
                    }
                    flushed
                } else {
                    // Exactly-once: what was read until the stream drained
                    // is acked by its commit.
                    if D::TRANSACTIONAL && s.drained {
                        let moved = s.ledger_position().through > s.committed;
                        if s.delivery.open_transaction().is_some() || moved {
                            if let Some(end) = s.commit().await? {
                                return Ok(end);
                            }
                        }
                    }
                    s.drained && s.window.in_flight() == 0
                };
                if drained || Instant::now() >= deadline {
                    let confirmed = s
                        .table_watch
                        .settle(s.confirmable(), interval * 3 + MIN_SETTLE)
                        .await;
                    tracing::info!(%confirmed, unacked = s.window.in_flight(), drained, "shutting down");
                    s.source.finish(confirmed).await?;
                    let confirmed = s.source.reported().confirmed;
                    s.slot.confirmed(confirmed);
                    s.telemetry.emit(TelemetryEvent::Finished { confirmed });
                    // Exactly-once wrote its last entry with its last commit.
                    let entry = s
                        .ledger_writer
                        .as_mut()
                        .filter(|_| !D::TRANSACTIONAL)
                        .and_then(|w| w.flush(confirmed, ledger::now_us()));
                    if let Some(entry) = entry {
                        s.ledger.flush(entry).await;
                    }
                    return Ok(SessionEnd::Shutdown);
                }
            }
            if s.window.resend_due() {
                if let Some(end) = s.resend_pending().await? {
                    return Ok(end);
                }
            }
            // While draining, the driver reads on only to finish the open
            // transaction, so a restart does not repeat half of it.
            let reading = s.may_read();
            let ledger_due = s.ledger_due();
            tokio::select! {
                biased;
                _ = stop.wait_for(|v| *v), if drain_deadline.is_none() => {
                    tracing::info!(in_flight = s.window.in_flight(), "shutdown requested; draining");
                    drain_deadline = Some(Instant::now() + relay.shutdown_timeout);
                    s.source.drain();
                }
                // Also while halted: a server shutting down waits for our
                // confirmation, which a halted relay never sends.
                news = s.table_watch.news() => match news {
                    WatchNews::Changed(reason) => s.halt(Halt::TableChanged(reason)),
                    WatchNews::Lost(e) => return Err(SourceError::from(e).into()),
                },
                report = s.delivery.next_report() => {
                    let Some(report) = report else {
                        return Ok(Reconnect::producer_stopped());
                    };
                    if let Some(end) = s.on_report(report).await? {
                        return Ok(end);
                    }
                    // Take every report already waiting: one wake-up per
                    // burst of acks instead of one per ack.
                    while let Some(report) = s.delivery.try_report() {
                        if let Some(end) = s.on_report(report).await? {
                            return Ok(end);
                        }
                    }
                }
                _ = tokio::time::sleep_until(drain_deadline.unwrap_or(far)), if drain_deadline.is_some() => {}
                // The driver confirmed something new, or the ledger may take
                // what it confirmed: offered below. An idle relay wakes for
                // nothing else, so the ledger would lag the slot until the
                // next keepalive.
                _ = s.status_updates.changed() => {}
                _ = tokio::time::sleep_until(ledger_due.unwrap_or(far)), if ledger_due.is_some() => {}
                // Not reading (a full window, a halt), only the driver's end.
                streamed = s.source.next(reading) => {
                    if let Some(end) = s.on_streamed(streamed?).await? {
                        return Ok(end);
                    }
                    // What else is waiting, while there is room for it.
                    for _ in 1..BATCH {
                        if !s.may_read() {
                            break;
                        }
                        let Some(streamed) = s.source.try_recv() else {
                            break;
                        };
                        if let Some(end) = s.on_streamed(streamed).await? {
                            return Ok(end);
                        }
                    }
                    // The walsender reached the head of the WAL (its
                    // keepalive between transactions, see `send_now`): no
                    // batch mate is near, so lingering would only add
                    // latency. An empty hand-over channel is
                    // no such sign: in a backlog the relay often empties it
                    // before the driver reads on, and sending then made
                    // small requests that kept the drain slow (19.5 against
                    // 50 events per request, 0.85 x the release).
                    if s.idle {
                        s.delivery.send_now();
                    }
                }
            }
            if D::TRANSACTIONAL {
                if s.window.halted().is_some() {
                    // Nothing of the halted transaction becomes visible.
                    s.abort("the relay halted").await;
                }
                if let Some(end) = s.commit_if_due().await? {
                    return Ok(end);
                }
            }
            s.source.confirm(s.confirmable());
            let reported = s.source.reported();
            s.slot.confirmed(reported.confirmed);
            s.tell_turn(reported);
            // What the driver confirmed, which the tracker called
            // confirmable: the ledger never leads the acknowledgements.
            // (Exactly-once writes it inside its transactions instead.)
            if let Some(writer) = s.ledger_writer.as_mut().filter(|_| !D::TRANSACTIONAL) {
                if let Some(entry) = writer.offer(
                    reported.confirmed,
                    std::time::Instant::now(),
                    ledger::now_us(),
                ) {
                    s.ledger.submit(entry);
                }
            }
        }
    }

    /// The window as it is now and the positions the driver `reported`:
    /// the in-flight gauges, the positions, and the health's view of
    /// progress.
    fn tell_turn(&mut self, reported: crate::source::driver::Reported) {
        self.telemetry.emit(TelemetryEvent::Turn {
            in_flight: self.window.in_flight(),
            in_flight_bytes: self.window.in_flight_bytes(),
            reported,
        });
    }

    /// Stops reading (a table change, or poison under `on_error = "stop"`):
    /// `outboxd_halted` = 1 and `/readyz` says why. For a table change the
    /// ceiling already keeps the slot before the change.
    fn halt(&mut self, halt: Halt) {
        let halt = self.window.halt(halt);
        self.telemetry.emit(TelemetryEvent::Halted(halt));
    }

    /// Tells of a halt the window made itself (a refused dead-letter copy).
    fn tell_halt(&mut self) {
        if let Some(halt) = self.window.halted() {
            self.telemetry.emit(TelemetryEvent::Halted(halt));
        }
    }

    /// Whether to take more from the driver: the window has room and
    /// nothing waiting, and the stream is not drained.
    fn may_read(&self) -> bool {
        self.window.may_read() && !self.drained
    }

    /// What the slot may be confirmed to: every event up to it is
    /// acknowledged (exactly-once: committed, and in the ledger).
    fn confirmable(&self) -> Lsn {
        let acked = self.window.confirmable();
        if D::TRANSACTIONAL {
            acked.min(self.committed)
        } else {
            acked
        }
    }

    /// When the ledger writer would take the position the driver last
    /// confirmed, if it has not yet (exactly-once: when the open
    /// transaction, or an idle ledger move, is due).
    fn ledger_due(&self) -> Option<Instant> {
        if D::TRANSACTIONAL {
            return self.commit_due(Instant::now());
        }
        let writer = self.ledger_writer.as_ref()?;
        let at = writer.due_at(self.source.reported().confirmed, std::time::Instant::now())?;
        Some(Instant::from_std(at))
    }

    /// A Commit handed to the window: the ledger entry at its end carries
    /// its commit time.
    fn note_commit(&mut self, commit: crate::progress::ledger::CommitPosition) {
        if let Some(writer) = &mut self.ledger_writer {
            writer.note_commit(commit);
        }
    }

    /// One item from the driver, in WAL order.
    async fn on_streamed(&mut self, streamed: Streamed) -> Result<Option<SessionEnd>, RelayError> {
        match streamed {
            Streamed::Item { item, received_at } => {
                self.received_at = received_at;
                self.idle = false;
                self.on_item(item).await
            }
            // Halted: nothing after the poison event becomes a checkpoint.
            Streamed::Idle(wal_end) => {
                self.window.keepalive(wal_end);
                self.idle = true;
                Ok(None)
            }
            Streamed::Drained => {
                self.drained = true;
                Ok(None)
            }
        }
    }
}

impl<D> Drop for Session<'_, D> {
    /// The driver may have confirmed past filtered changes since the loop
    /// last counted them: count them before the session is gone.
    fn drop(&mut self) {
        self.telemetry.filtered(self.source.reported());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dashboards and alerts select on these values.
    #[test]
    fn reconnect_causes_keep_their_metric_labels() {
        let labels = ReconnectCause::ALL.map(ReconnectCause::label);
        assert_eq!(labels, ["kafka_delivery", "kafka", "postgres"]);
        match Reconnect::delivery("timed out") {
            SessionEnd::Reconnect(r) => {
                assert_eq!(r.cause, ReconnectCause::KafkaDelivery);
                assert_eq!(r.detail, "delivery failed: timed out");
            }
            SessionEnd::Shutdown => panic!("a delivery failure is no shutdown"),
        }
    }
}
