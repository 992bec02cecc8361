//! One relay session: a replication stream, a producer and an ack tracker
//! that live and die together. The main `select!` is biased, by priority:
//! 1. shutdown (stop reading, drain in-flight acks, confirm, exit), then a
//!    change of the outbox table ([`TableWatch`]: halt),
//! 2. delivery reports (acks move the confirmable position; a transport
//!    failure ends the session),
//! 3. the status-update timer (keeps the walsender alive while we are not
//!    reading, e.g. under backpressure),
//! 4. the drain deadline,
//! 5. new WAL, only while in-flight events and bytes are under their limits.
//!
//! The walsender ends a connection it hears nothing from for
//! `wal_sender_timeout`, so the status updates must never stop: not while
//! the window is full (3), and not while a handler waits on Kafka for a
//! topic, a report or room in the producer's queue ([`keep_alive`]).
//!
//! This file holds the session's state and its loop; the handlers live
//! beside it: [`deliver`](super::deliver) takes events to the producer and
//! handles delivery reports, [`poison`](super::poison) applies
//! `relay.on_error` to events that cannot be delivered.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use tokio::sync::watch;
use tokio::time::Instant;

use super::poison::{EventIdentity, PoisonMemory};
use super::table_watch::{TableWatch, WatchNews};
use super::{RelayError, RelaySettings};
use crate::metrics as m;
use crate::outbox::{KafkaRecord, OutboxEvent, RecordMapper};
use crate::progress::{AckTracker, DeliveryId};
use crate::sink::{KafkaSink, TopicManager};
use crate::source::session::{Received, SourceError, SourceSession};
use crate::Lsn;

/// Least time between two status updates while the confirmable position
/// moves: batches updates under load, still confirms within a blink.
const MIN_STATUS_GAP: Duration = Duration::from_millis(100);

/// Least time a graceful stop waits for the table watch to vouch for the
/// last acked position (beyond three status intervals): two looks on a
/// slow connection.
const MIN_SETTLE: Duration = Duration::from_secs(2);

pub enum SessionEnd {
    Shutdown,
    Reconnect(String),
}

/// A record handed to the producer and not yet reported on, keyed in
/// [`Session::in_flight`] by its delivery id.
pub(super) struct InFlight {
    pub(super) id: DeliveryId,
    pub(super) record: KafkaRecord,
    pub(super) event: OutboxEvent,
    pub(super) identity: EventIdentity,
    pub(super) dead_lettered: bool,
    /// Sent with nothing else in flight (a suspect on trial).
    pub(super) isolated: bool,
    /// When the WAL carrying it arrived, for the receive-to-ack histogram.
    pub(super) received_at: Instant,
}

pub struct Session<'a> {
    pub(super) settings: &'a RelaySettings,
    /// The replication stream. Handlers that wait (for a topic, for room in
    /// the producer's queue, for a report) keep it alive through
    /// [`keep_alive`].
    pub(super) source: SourceSession,
    pub(super) mapper: &'a mut RecordMapper,
    pub(super) poison: &'a mut PoisonMemory,
    pub(super) sink: KafkaSink,
    pub(super) topics: TopicManager,
    pub(super) tracker: AckTracker,
    pub(super) in_flight: HashMap<u64, InFlight>,
    /// Records taken back from a producer that Kafka's refusal of one of them
    /// ended, by delivery id (WAL order): sent again, on a fresh producer,
    /// before anything newer (see [`deliver`](super::deliver)).
    pub(super) resend: BTreeMap<u64, InFlight>,
    /// Position of the next event within its transaction.
    pub(super) ordinal: u32,
    /// Set when a poison event stopped the relay (`on_error = "stop"`).
    pub(super) halted: Option<String>,
    pub(super) published: HashMap<Arc<str>, (Counter, Counter)>,
    /// When the message being processed arrived.
    pub(super) received_at: Instant,
    filtered: m::Filtered,
    pub(super) wal_to_ack: Histogram,
    /// Handles of the per-event and per-loop metrics, looked up once: a
    /// registry lookup per event is measurable at 100k events/s.
    pub(super) hot: HotMetrics,
    /// Keeps confirmation behind the last look that found the outbox table
    /// intact; reports a change.
    table_watch: TableWatch,
}

pub(super) struct HotMetrics {
    pub(super) events_seen: Counter,
    pub(super) transactions: Counter,
    in_flight_events: Gauge,
    in_flight_bytes: Gauge,
    pub(super) commit_to_ack: Histogram,
}

impl HotMetrics {
    fn new() -> Self {
        HotMetrics {
            events_seen: metrics::counter!(m::EVENTS_SEEN),
            transactions: metrics::counter!(m::TRANSACTIONS),
            in_flight_events: metrics::gauge!(m::IN_FLIGHT_EVENTS),
            in_flight_bytes: metrics::gauge!(m::IN_FLIGHT_BYTES),
            commit_to_ack: metrics::histogram!(m::COMMIT_TO_ACK_SECONDS),
        }
    }
}

/// Awaits `fut` while sending the walsender a status update (confirming
/// `confirmed`) every `interval`. A handler that waits on Kafka, for a topic,
/// a report or room in the producer's queue, reads nothing from the stream
/// meanwhile, and without these updates the server would end the connection
/// after `wal_sender_timeout`.
pub(super) async fn keep_alive<T>(
    source: &mut SourceSession,
    confirmed: Lsn,
    interval: Duration,
    fut: impl Future<Output = T>,
) -> Result<T, SourceError> {
    let mut fut = std::pin::pin!(fut);
    loop {
        let at = Instant::from_std(source.stream().next_status_deadline(interval));
        tokio::select! {
            biased;
            out = &mut fut => return Ok(out),
            _ = tokio::time::sleep_until(at) => {
                let confirmed = source.limit(confirmed);
                source.stream().send_status(confirmed, false).await?;
            }
        }
    }
}

impl<'a> Session<'a> {
    pub async fn run(
        settings: &'a RelaySettings,
        mapper: &'a mut RecordMapper,
        poison: &'a mut PoisonMemory,
        mut stop: watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        let health = &settings.health;
        let mut source = SourceSession::open(&settings.source).await?;
        let interval = settings.config.postgres.status_interval;
        let table_watch = TableWatch::start(&settings.source, source.start_lsn, interval)
            .await
            .map_err(SourceError::from)?;
        source.set_ceiling(table_watch.ceiling());
        health.postgres_up();
        health.progress(0, source.start_lsn);
        let sink = super::deliver::new_sink(settings)?;
        let topics = TopicManager::new(&settings.brokers, &settings.config.kafka)?;
        // A halt belongs to its session; the next one re-reads the event and
        // decides again.
        health.set_halted(None);
        metrics::gauge!(m::HALTED).set(0.0);
        let start_lsn = source.start_lsn;
        let mut s = Session {
            settings,
            source,
            mapper,
            poison,
            sink,
            topics,
            tracker: AckTracker::new(start_lsn),
            in_flight: HashMap::new(),
            resend: BTreeMap::new(),
            ordinal: 0,
            halted: None,
            published: HashMap::new(),
            received_at: Instant::now(),
            filtered: m::Filtered::new(),
            wal_to_ack: metrics::histogram!(m::WAL_RECEIVE_TO_ACK_SECONDS),
            hot: HotMetrics::new(),
            table_watch,
        };
        let relay = &settings.config.relay;
        s.source
            .stream()
            .set_stream_timeout(settings.config.postgres.stream_timeout);
        let mut items = Vec::new();
        let mut drain_deadline: Option<Instant> = None;
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        loop {
            if let Some(deadline) = drain_deadline {
                let drained = if s.halted.is_some() {
                    // Halted: nothing after the poison event is read, so its
                    // transaction never finishes, and the poison event holds
                    // its tracker slot for good. Only what the producer still
                    // holds can be acked: once its reports are all on the
                    // channel, take them and stop.
                    let flushed = s.sink.in_queue() == 0;
                    if flushed {
                        while let Some(report) = s.sink.try_report() {
                            if let Some(end) = s.on_report(report).await? {
                                return Ok(end);
                            }
                        }
                    }
                    flushed
                } else {
                    !s.source.in_transaction() && s.tracker.in_flight() == 0
                };
                if drained || Instant::now() >= deadline {
                    let confirmed = s
                        .table_watch
                        .settle(s.tracker.confirmable(), interval * 3 + MIN_SETTLE)
                        .await;
                    tracing::info!(%confirmed, unacked = s.tracker.in_flight(), drained, "shutting down");
                    s.filtered.update(s.source.ignored());
                    s.source.finish(confirmed).await?;
                    m::gauge_lsn(m::CONFIRMED_LSN, confirmed);
                    return Ok(SessionEnd::Shutdown);
                }
            }
            if !s.resend.is_empty() && s.halted.is_none() {
                if let Some(end) = s.resend_pending().await? {
                    return Ok(end);
                }
            }
            let full = s.tracker.in_flight() >= relay.max_in_flight_events
                || s.tracker.in_flight_bytes() as u64 >= relay.max_in_flight_bytes;
            // While draining, read on only to finish the open transaction, so
            // a restart does not repeat half of it.
            let reading = !full
                && s.halted.is_none()
                && s.resend.is_empty()
                && (drain_deadline.is_none() || s.source.in_transaction());
            if !reading {
                // Not listening is no silence (see `reset_silence`).
                s.source.stream().reset_silence();
            }
            let stream = s.source.stream();
            let status_at = Instant::from_std(
                stream
                    .next_status_deadline(interval)
                    .min(stream.next_probe()),
            );
            let dead_at = Instant::from_std(stream.dead_at());
            tokio::select! {
                biased;
                _ = stop.wait_for(|v| *v), if drain_deadline.is_none() => {
                    tracing::info!(in_flight = s.tracker.in_flight(), "shutdown requested; draining");
                    drain_deadline = Some(Instant::now() + relay.shutdown_timeout);
                }
                // Also while halted: a server shutting down waits for our
                // confirmation, which a halted relay never sends.
                news = s.table_watch.news() => match news {
                    WatchNews::Changed(reason) => s.table_changed(reason),
                    WatchNews::Lost(e) => return Err(SourceError::from(e).into()),
                },
                report = s.sink.next_report() => {
                    let Some(report) = report else {
                        return Ok(SessionEnd::Reconnect("Kafka producer stopped".into()));
                    };
                    // A report may be handled at length (a suspect retried,
                    // a dead letter sent); that time is no silence.
                    let busy_from = std::time::Instant::now();
                    if let Some(end) = s.on_report(report).await? {
                        return Ok(end);
                    }
                    // Take every report already waiting: one wake-up per
                    // burst of acks instead of one per ack.
                    while let Some(report) = s.sink.try_report() {
                        if let Some(end) = s.on_report(report).await? {
                            return Ok(end);
                        }
                    }
                    s.source.stream().not_listening_since(busy_from);
                }
                _ = tokio::time::sleep_until(status_at) => {}
                _ = tokio::time::sleep_until(drain_deadline.unwrap_or(far)), if drain_deadline.is_some() => {}
                // Nothing arrived, not even the answer to a reply request.
                _ = tokio::time::sleep_until(dead_at), if reading => {
                    return Err(SourceError::from(s.source.stream().silent_error()).into());
                }
                received = s.source.next(&mut items), if reading => {
                    let received = received?;
                    s.received_at = Instant::now();
                    for item in items.drain(..) {
                        if let Some(end) = s.on_item(item).await? {
                            return Ok(end);
                        }
                    }
                    if let Received::Keepalive { wal_end, reply_requested } = received {
                        if !s.source.in_transaction() {
                            s.tracker.keepalive(wal_end);
                        }
                        if reply_requested {
                            let confirmable = s.source.limit(s.tracker.confirmable());
                            s.source.stream().send_status(confirmable, false).await.map_err(SourceError::from)?;
                        }
                    }
                    // The handlers may have waited on Kafka meanwhile.
                    s.source.stream().reset_silence();
                }
            }
            let confirmable = s.source.limit(s.tracker.confirmable());
            let probe = s.source.stream().probe_due();
            if probe
                || s.source
                    .stream()
                    .status_due(confirmable, interval, MIN_STATUS_GAP)
            {
                s.source
                    .stream()
                    .send_status(confirmable, probe)
                    .await
                    .map_err(SourceError::from)?;
                m::gauge_lsn(m::CONFIRMED_LSN, s.source.stream().last_sent());
                m::gauge_lsn(m::RECEIVED_LSN, s.source.stream().received());
            }
            // Every iteration, not only with a status update: a status update
            // sent while a handler waits (`keep_alive`) may confirm past
            // filtered changes, and if the session then ends they are never
            // read, or counted, again.
            s.filtered.update(s.source.ignored());
            s.hot.in_flight_events.set(s.tracker.in_flight() as f64);
            s.hot
                .in_flight_bytes
                .set(s.tracker.in_flight_bytes() as f64);
            health.progress(s.tracker.in_flight(), s.source.stream().last_sent());
        }
    }
}
