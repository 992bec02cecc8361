//! One relay session: a replication stream (run by its own task, see
//! [`driver`](crate::source::driver)), a producer in the configured
//! delivery mode ([`DeliveryMode`]) and the in-flight window ([`Window`])
//! that live and die together.
//!
//! [`Session::run`] opens them, then turns until the session ends: an
//! active turn while relaying, a draining turn once a shutdown was asked
//! for ([`shutdown`]). Each turn waits in one biased `select!`, by
//! priority:
//! 1. shutdown (start draining), then a change of the outbox table
//!    ([`TableWatch`]: halt),
//! 2. delivery reports (acks move the confirmable position; a transport
//!    failure ends the session),
//! 3. the drain deadline,
//! 4. a status update the driver sent, or the time the delivery mode asked
//!    to be woken at ([`DeliveryMode::wake_at`]: the ledger's interval, a
//!    Kafka transaction's commit),
//! 5. what the driver read, only while in-flight events and bytes are under
//!    their limits (or else only the driver's failure),
//!
//! and ends in the mode's [`DeliveryMode::end_turn`], which confirms what
//! may be confirmed.
//!
//! The walsender ends a connection it hears nothing from for
//! `wal_sender_timeout`; the driver sees to that on its own, whatever this
//! task waits for (a topic, a report, room in the producer's queue).
//!
//! Submodules: [`window`] owns what is in flight (pure: the ack tracker,
//! the records waiting to be sent again, the poison [`verdicts`], the
//! halt); [`mode`] is the seam to Kafka and the delivery mode's policy, one
//! implementation per mode ([`at_least_once`], [`exactly_once`]); [`send`]
//! takes events to the producer and reports back to the window; [`poison`]
//! applies `relay.on_error`; [`telemetry`] writes metrics, health and log
//! lines.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

mod at_least_once;
mod exactly_once;
mod mode;
mod parts;
mod poison;
mod schema_ids;
mod send;
mod shutdown;
mod telemetry;
mod verdicts;
mod window;

pub(super) use parts::{Lent, SessionEnd};
pub(super) use poison::DEAD_LETTER_REASONS;
pub use telemetry::EVENTS_TARGET;
pub(super) use verdicts::PoisonMemory;

use super::error::RelayError;
use super::ledger::Start;
use super::settings::RelaySettings;
use super::table_watch::{TableWatch, WatchNews};
use crate::config::DeliveryMode as Configured;
use crate::sink::TopicManager;
use crate::source::driver::{DriverOptions, Reported, Streamed};
use crate::source::error::SourceError;
use crate::source::session::SourceSession;
use crate::Lsn;
use at_least_once::AtLeastOnce;
use exactly_once::ExactlyOnce;
use mode::DeliveryMode;
use parts::{Session, Stream};
use telemetry::{Telemetry, TelemetryEvent};
use window::{Halt, Limits, Relayed, Window};

/// Items taken from the driver per wake-up at most, so that reports and
/// shutdown are looked at in between.
const BATCH: usize = 64;

/// Runs one session, in the configured delivery mode.
pub(super) async fn run(
    settings: &RelaySettings,
    lent: Lent<'_>,
) -> Result<SessionEnd, RelayError> {
    match settings.config.relay.delivery {
        Configured::AtLeastOnce => {
            Session::<AtLeastOnce>::open(settings, lent)
                .await?
                .run()
                .await
        }
        Configured::ExactlyOnce => {
            // From what Kafka committed, not from what this process
            // believes it committed.
            lent.ledger.refresh().await?;
            Session::<ExactlyOnce>::open(settings, lent)
                .await?
                .run()
                .await
        }
    }
}

impl<'a, D: DeliveryMode> Session<'a, D> {
    /// Opens the stream (past the ledger's gate), the table watch and the
    /// producer.
    async fn open(settings: &'a RelaySettings, lent: Lent<'a>) -> Result<Self, RelayError> {
        let Lent {
            mapper,
            registry,
            poison,
            ledger,
            slot,
            tables,
            stop,
        } = lent;
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
            lag_gauge: Some(metrics::gauge!(crate::metrics::CONFIRMATION_LAG_SECONDS)),
        });
        let mut telemetry = Telemetry::new(std::sync::Arc::clone(&settings.health));
        slot.stream_opened(start_lsn);
        telemetry.emit(TelemetryEvent::StreamOpened { start: start_lsn });
        let ledger_key = match &start.identity {
            Some(identity) => identity.key(),
            None => settings.source.slot.clone(),
        };
        let delivery = D::start(settings, ledger, &start, start_lsn, &ledger_key).await?;
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
        Ok(Session {
            settings,
            mapper,
            registry,
            ledger_writer: ledger.writer(&start, interval),
            ledger,
            slot,
            stop,
            stream: Stream {
                status_updates: source.status_updates(),
                source,
                received_at: Instant::now(),
                idle: false,
                drained: false,
                backlog: VecDeque::new(),
            },
            table_watch,
            window: Window::new(start_lsn, relayed, poison, limits),
            delivery,
            topics,
            telemetry,
            drain_deadline: None,
        })
    }

    /// Turns until the session ends: active turns, then draining ones once
    /// a shutdown was asked for.
    async fn run(mut self) -> Result<SessionEnd, RelayError> {
        let end = loop {
            let turn = match self.drain_deadline {
                None => self.active_turn().await,
                Some(deadline) => self.drain_turn(deadline).await,
            };
            match turn {
                Ok(None) => {}
                Ok(Some(end)) => break Ok(end),
                Err(e) => break Err(e),
            }
        };
        D::close(&mut self).await;
        end
    }

    /// Sends what waits to be sent again, waits for the most urgent of the
    /// loop's wake-ups (see the module's list) and handles it, then ends
    /// the turn in the delivery mode.
    async fn active_turn(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        if self.window.resend_due() && !self.delivery.busy() {
            if let Some(end) = self.resend_pending().await? {
                return Ok(Some(end));
            }
        }
        if let Some(end) = self.catch_up().await? {
            return Ok(Some(end));
        }
        // While draining, the driver reads on only to finish the open
        // transaction, so a restart does not repeat half of it.
        let reading = self.may_read();
        let wake_at = D::wake_at(self);
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        let draining = self.drain_deadline.is_some();
        let end = tokio::select! {
            biased;
            _ = stop_asked(&mut self.stop), if !draining => {
                self.start_draining();
                None
            }
            // Also while halted: a server shutting down waits for our
            // confirmation, which a halted relay never sends.
            news = self.table_watch.news() => match news {
                WatchNews::Changed(reason) => {
                    self.halt(Halt::TableChanged(reason));
                    None
                }
                WatchNews::Lost(e) => return Err(SourceError::from(e).into()),
            },
            news = self.delivery.news() => D::on_news(self, news).await?,
            _ = tokio::time::sleep_until(self.drain_deadline.unwrap_or(far)), if draining => None,
            // The driver confirmed something new, or the ledger may take
            // what it confirmed: the mode offers it at the turn's end. An
            // idle relay wakes for nothing else, so the ledger would lag
            // the slot until the next keepalive.
            _ = self.stream.status_updates.changed() => None,
            _ = tokio::time::sleep_until(wake_at.unwrap_or(far)), if wake_at.is_some() => None,
            // Not reading (a full window, a halt), only the driver's end.
            streamed = self.stream.source.next(reading) => self.on_stream(streamed?).await?,
        };
        if end.is_some() {
            return Ok(end);
        }
        D::end_turn(self).await
    }

    /// Handles what was read while the producer was busy, in WAL order, as
    /// far as the window allows.
    async fn catch_up(&mut self) -> Result<Option<SessionEnd>, RelayError> {
        while !self.delivery.busy() && self.window.may_read() {
            let Some(streamed) = self.stream.backlog.pop_front() else {
                break;
            };
            if let Some(end) = self.on_streamed(streamed).await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// What the driver read, and what else is waiting while there is room
    /// for it.
    async fn on_stream(&mut self, first: Streamed) -> Result<Option<SessionEnd>, RelayError> {
        if self.delivery.busy() || !self.stream.backlog.is_empty() {
            self.keep_for_later(first);
            return Ok(None);
        }
        if let Some(end) = self.on_streamed(first).await? {
            return Ok(Some(end));
        }
        for _ in 1..BATCH {
            if !self.may_read() {
                break;
            }
            let Some(streamed) = self.stream.source.try_recv() else {
                break;
            };
            if let Some(end) = self.on_streamed(streamed).await? {
                return Ok(Some(end));
            }
        }
        // The walsender reached the head of the WAL (its keepalive between
        // transactions, see `send_now`): no batch mate is near, so
        // lingering would only add latency. An empty hand-over channel is
        // no such sign: in a backlog the relay often empties it before the
        // driver reads on, and sending then made small requests that kept
        // the drain slow (docs/benchmarks.md, "The linger cut short at the
        // head of the WAL").
        if self.stream.idle {
            self.delivery.send_now();
        }
        Ok(None)
    }

    /// Keeps what the driver read, and what else is waiting while there is
    /// room for it, for when the producer takes records again: the
    /// walsender is not kept waiting on a slow commit.
    fn keep_for_later(&mut self, first: Streamed) {
        self.stream.backlog.push_back(first);
        for _ in 1..BATCH {
            if !self.may_read() {
                break;
            }
            let Some(streamed) = self.stream.source.try_recv() else {
                break;
            };
            self.stream.backlog.push_back(streamed);
        }
    }

    /// One item from the driver, in WAL order.
    async fn on_streamed(&mut self, streamed: Streamed) -> Result<Option<SessionEnd>, RelayError> {
        match streamed {
            Streamed::Item { item, received_at } => {
                self.stream.received_at = received_at;
                self.stream.idle = false;
                self.on_item(item).await
            }
            // Halted: nothing after the poison event becomes a checkpoint.
            Streamed::Idle(wal_end) => {
                self.window.keepalive(wal_end);
                self.stream.idle = true;
                Ok(None)
            }
            Streamed::Drained => {
                self.stream.drained = true;
                Ok(None)
            }
        }
    }

    /// Confirms what may be confirmed and tells the turn: the driver's
    /// positions, for the slot record and the telemetry.
    fn confirm(&mut self) -> Reported {
        self.stream.source.confirm(self.confirmable());
        let reported = self.stream.source.reported();
        self.slot.confirmed(reported.confirmed);
        self.tell_turn(reported);
        reported
    }

    /// The window as it is now and the positions the driver `reported`:
    /// the in-flight gauges, the positions, and the health's view of
    /// progress.
    fn tell_turn(&mut self, reported: Reported) {
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
    /// nothing waiting, and the stream is not drained. While the producer
    /// is busy, what is read waits in the backlog, which takes at most a
    /// window's worth of items.
    fn may_read(&self) -> bool {
        if self.stream.drained {
            return false;
        }
        if self.delivery.busy() {
            let room = self.stream.backlog.len() < self.settings.config.relay.window_events();
            return room && self.window.halted().is_none();
        }
        self.stream.backlog.is_empty() && self.window.may_read()
    }

    /// What the slot may be confirmed to: every event up to it is
    /// acknowledged, and the delivery mode allows it (exactly-once:
    /// committed, and in the ledger).
    fn confirmable(&self) -> Lsn {
        self.window.confirmable().min(self.delivery.ceiling())
    }

    /// A Commit handed to the window: the ledger entry at its end carries
    /// its commit time.
    fn note_commit(&mut self, commit: crate::progress::ledger::CommitPosition) {
        if let Some(writer) = &mut self.ledger_writer {
            writer.note_commit(commit);
        }
    }
}

/// Resolves once a shutdown is asked for (or nobody can ask any more).
/// Its output borrows nothing, so the handler may use the whole session.
async fn stop_asked(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|v| *v).await;
}
