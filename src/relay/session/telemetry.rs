//! The session's telemetry: each thing worth telling is one
//! [`TelemetryEvent`], and [`Telemetry::emit`] writes everything it means
//! together: the metric, the health endpoint's state and the log line. So
//! a number on the dashboard, `/readyz` and the log cannot tell different
//! stories, and the session's code says what happened, not how it is
//! recorded.
//!
//! The handles of the per-event and per-turn metrics are looked up once per
//! session: a registry lookup per event shows at a drain's rates
//! (docs/benchmarks.md, "Metric handles looked up once per session").
//! Nothing here is read back to decide anything.

use std::collections::HashMap;
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram};

use super::window::{Halt, InFlight};
use crate::metrics::{self as m, Health};
use crate::outbox::{KafkaRecord, OutboxEvent};
use crate::sink::{Delivered, DeliveryFailure};
use crate::source::driver::Reported;
use crate::Lsn;

/// Log target of the per-event audit trail: one TRACE line when an event is
/// handed to the producer and one when Kafka acknowledges it (with partition
/// and offset). Off unless asked for (`OUTBOXD_LOG=info,outboxd::events=trace`),
/// and then free of cost on the hot path when off: fields are only
/// evaluated for an enabled callsite.
pub const EVENTS_TARGET: &str = "outboxd::events";

/// A table's published events and bytes counters, by topic.
type TopicCounters = HashMap<Arc<str>, (Counter, Counter)>;

/// Something that happened in a session.
pub(super) enum TelemetryEvent<'e> {
    /// The replication stream is open at `start`.
    StreamOpened { start: Lsn },
    /// The session is set up. A halt belongs to its session: the next one
    /// re-reads the event and decides again.
    Started,
    /// An outbox event was read from the WAL.
    EventSeen,
    /// A transaction's commit was read.
    TransactionRead,
    /// An event the ledger has as relayed was not sent again.
    EventSkipped,
    /// A record went to the producer.
    Sent(&'e InFlight),
    /// Kafka acknowledged a record; `table` is its event's table label.
    Acked {
        entry: &'e InFlight,
        delivered: Delivered,
        table: &'e str,
    },
    /// A delivery failed (whatever the session makes of it).
    DeliveryFailed(&'e DeliveryFailure),
    /// An event goes to the dead-letter topic instead (`reason`: one of
    /// [`DEAD_LETTER_REASONS`](super::DEAD_LETTER_REASONS)).
    DeadLettered {
        event: &'e OutboxEvent,
        table: &'e str,
        reason: &'static str,
        error: &'e str,
    },
    /// The session stopped moving.
    Halted(&'e Halt),
    /// Kafka is unreachable, or a delivery failed for good: the session
    /// ends for a reconnect.
    KafkaDown(&'e str),
    /// A refusal ended the producer; a fresh one sends again what waits.
    ProducerReplaced { waiting: usize },
    /// The watchdog (`kafka.stuck_after`) found the producer holding
    /// `holding` for `age` while fresh metadata showed `leaders` (every
    /// partition led): it is given up, `then` says for what.
    ProducerStuck {
        age: std::time::Duration,
        holding: &'e str,
        leaders: &'e str,
        then: &'e str,
    },
    /// The watchdog found the producer holding `holding` for `age`, but
    /// the cluster lacks a leader or did not answer (`leaders`): the
    /// producer's own timeouts deal with that.
    ClusterTrouble {
        age: std::time::Duration,
        holding: &'e str,
        leaders: &'e str,
    },
    /// A turn of the loop ended: what is in flight, and what the driver
    /// last told the server.
    Turn {
        in_flight: usize,
        in_flight_bytes: usize,
        reported: Reported,
    },
    /// The last status update before the session ends.
    Finished { confirmed: Lsn },
    /// A Kafka transaction committed `events` events and the ledger entry
    /// for `through`, in `seconds`.
    TransactionCommitted {
        events: usize,
        seconds: f64,
        through: Lsn,
    },
    /// A Kafka transaction was given up: aborted (nothing of it is
    /// visible), or left to the next producer when the abort failed.
    TransactionAborted {
        events: usize,
        cause: &'e str,
        /// Why the brokers did not confirm the abort, if they did not.
        unconfirmed: Option<&'e str>,
    },
    /// Another instance took this one's transactional id over.
    Fenced(&'e str),
}

pub(super) struct Telemetry {
    health: Arc<Health>,
    events_seen: Counter,
    transactions: Counter,
    skipped: Counter,
    in_flight_events: Gauge,
    in_flight_bytes: Gauge,
    confirmed_lsn: Gauge,
    received_lsn: Gauge,
    halted: Gauge,
    commit_to_ack: Histogram,
    wal_to_ack: Histogram,
    /// By table label, then topic, registered on their first ack.
    published: Vec<(String, TopicCounters)>,
    /// Filtered changes, from what the driver counted when it last
    /// confirmed: once confirmed past, they are never read again.
    filtered: m::Filtered,
}

impl Telemetry {
    pub(super) fn new(health: Arc<Health>) -> Self {
        Telemetry {
            health,
            events_seen: metrics::counter!(m::EVENTS_SEEN),
            transactions: metrics::counter!(m::TRANSACTIONS),
            skipped: metrics::counter!(m::EVENTS_SKIPPED),
            in_flight_events: metrics::gauge!(m::IN_FLIGHT_EVENTS),
            in_flight_bytes: metrics::gauge!(m::IN_FLIGHT_BYTES),
            confirmed_lsn: metrics::gauge!(m::CONFIRMED_LSN),
            received_lsn: metrics::gauge!(m::RECEIVED_LSN),
            halted: metrics::gauge!(m::HALTED),
            commit_to_ack: metrics::histogram!(m::COMMIT_TO_ACK_SECONDS),
            wal_to_ack: metrics::histogram!(m::WAL_RECEIVE_TO_ACK_SECONDS),
            published: Vec::new(),
            filtered: m::Filtered::new(),
        }
    }

    #[inline]
    pub(super) fn emit(&mut self, event: TelemetryEvent<'_>) {
        use TelemetryEvent as E;
        match event {
            E::StreamOpened { start } => {
                self.health.postgres_up();
                self.health.progress(0, start);
            }
            E::Started => {
                self.health.set_halted(None);
                self.halted.set(0.0);
            }
            E::EventSeen => {
                self.events_seen.increment(1);
                self.health.event_seen();
            }
            E::TransactionRead => self.transactions.increment(1),
            E::EventSkipped => self.skipped.increment(1),
            E::Sent(entry) => {
                tracing::trace!(
                    target: EVENTS_TARGET,
                    event_id = %event_id(&entry.record),
                    lsn = %entry.event.commit_lsn,
                    topic = &*entry.record.topic,
                    "sent"
                );
            }
            E::Acked {
                entry,
                delivered,
                table,
            } => self.acked(entry, delivered, table),
            E::DeliveryFailed(failure) => {
                metrics::counter!(m::DELIVERY_FAILURES, "code" => format!("{:?}", failure.code), "kind" => format!("{:?}", failure.kind)).increment(1);
            }
            E::DeadLettered {
                event,
                table,
                reason,
                error,
            } => {
                tracing::warn!(lsn = %event.commit_lsn, xid = event.xid, %error, "event sent to the dead-letter topic");
                metrics::counter!(m::EVENTS_DEAD_LETTERED, "reason" => reason, "table" => table.to_owned())
                    .increment(1);
            }
            E::Halted(halt) => {
                let reason = halt.to_string();
                tracing::error!(%reason, "relay halted");
                self.halted.set(1.0);
                self.health.set_halted(Some(reason));
            }
            // Health logs the outage's start, once.
            E::KafkaDown(cause) => self.health.kafka_down(cause),
            E::ProducerReplaced { waiting } => {
                tracing::info!(
                    resend = waiting,
                    "Kafka refused a record: new producer, sending again what the old one had not delivered"
                );
                metrics::counter!(m::PRODUCER_REPLACEMENTS, "reason" => "refused").increment(1);
            }
            E::ProducerStuck {
                age,
                holding,
                leaders,
                then,
            } => {
                tracing::warn!(
                    age_s = age.as_secs_f64(),
                    %holding,
                    metadata = %leaders,
                    "the Kafka producer is stuck: {holding} unacknowledged for {:.1} s (kafka.stuck_after) while fresh metadata shows a leader for every partition the relay writes ({leaders}); {then}",
                    age.as_secs_f64()
                );
                metrics::counter!(m::PRODUCER_REPLACEMENTS, "reason" => "stuck").increment(1);
            }
            // Once per kafka.stuck_after while it lasts: the outage itself
            // is told by the health's KafkaDown, once.
            E::ClusterTrouble {
                age,
                holding,
                leaders,
            } => {
                tracing::info!(
                    age_s = age.as_secs_f64(),
                    %holding,
                    metadata = %leaders,
                    "{holding} unacknowledged for {:.1} s, but fresh metadata does not show a leader for every partition ({leaders}): waiting for the cluster, within message.timeout.ms",
                    age.as_secs_f64()
                );
            }
            E::Turn {
                in_flight,
                in_flight_bytes,
                reported,
            } => {
                self.confirmed_lsn.set(reported.confirmed.0 as f64);
                self.received_lsn.set(reported.received.0 as f64);
                self.filtered.update(reported.ignored);
                self.in_flight_events.set(in_flight as f64);
                self.in_flight_bytes.set(in_flight_bytes as f64);
                self.health.progress(in_flight, reported.confirmed);
            }
            E::Finished { confirmed } => self.confirmed_lsn.set(confirmed.0 as f64),
            E::TransactionCommitted {
                events,
                seconds,
                through,
            } => {
                tracing::debug!(events, commit_ms = seconds * 1e3, %through, "Kafka transaction committed");
                metrics::counter!(m::KAFKA_TRANSACTIONS, "outcome" => "committed").increment(1);
                metrics::histogram!(m::KAFKA_TRANSACTION_EVENTS).record(events as f64);
                metrics::histogram!(m::KAFKA_TRANSACTION_COMMIT_SECONDS).record(seconds);
                m::gauge_lsn(m::LEDGER_LSN, through);
            }
            E::TransactionAborted {
                events,
                cause,
                unconfirmed,
            } => aborted(events, cause, unconfirmed),
            E::Fenced(error) => {
                tracing::error!(%error, "fenced by another outboxd: this instance stops writing; nothing it had in flight becomes visible");
                metrics::counter!(m::FENCED).increment(1);
            }
        }
    }

    /// Counts what the driver filtered since the last turn, as the session
    /// ends: it may have confirmed past more since.
    pub(super) fn filtered(&mut self, reported: Reported) {
        self.filtered.update(reported.ignored);
    }

    fn acked(&mut self, entry: &InFlight, delivered: Delivered, table: &str) {
        tracing::trace!(
            target: EVENTS_TARGET,
            event_id = %event_id(&entry.record),
            lsn = %entry.event.commit_lsn,
            topic = &*entry.record.topic,
            partition = delivered.partition,
            offset = delivered.offset,
            "acked"
        );
        // Per-table and topic handles, created on their first ack only;
        // found without allocating (a few tables, each with its topics).
        let i = match self.published.iter().position(|(l, _)| l == table) {
            Some(i) => i,
            None => {
                self.published.push((table.to_owned(), HashMap::new()));
                self.published.len() - 1
            }
        };
        let (table, topics) = &mut self.published[i];
        let (events, bytes) = topics
            .entry(Arc::clone(&entry.record.topic))
            .or_insert_with_key(|topic| {
                let (table, topic) = (table.clone(), topic.to_string());
                (
                    metrics::counter!(m::EVENTS_PUBLISHED, "topic" => topic.clone(), "table" => table.clone()),
                    metrics::counter!(m::BYTES_PUBLISHED, "topic" => topic, "table" => table),
                )
            });
        events.increment(1);
        bytes.increment(entry.record.size as u64);
        let behind_us = (crate::clock::now_unix_micros() - entry.event.commit_time_us).max(0);
        self.commit_to_ack.record(behind_us as f64 / 1e6);
        self.wal_to_ack
            .record(entry.received_at.elapsed().as_secs_f64());
        self.health.acked(behind_us / 1000);
        self.health.kafka_up();
    }
}

/// A Kafka transaction given up, said the way its outcome warrants.
fn aborted(events: usize, cause: &str, unconfirmed: Option<&str>) {
    match unconfirmed {
        None => {
            tracing::warn!(events, %cause, "Kafka transaction aborted: none of its records is visible to read_committed consumers; resuming from the position ledger")
        }
        Some(error) => {
            tracing::warn!(events, %cause, abort_error = %error, "Kafka transaction aborted, but the brokers did not confirm the abort: it may still commit (a commit still unfinished within transaction.timeout.ms goes on in the background). The next producer with this transactional id ends it, and the next session reads the position ledger to its end to learn whether it did")
        }
    }
    // Counted either way: the relay gave it up.
    metrics::counter!(m::KAFKA_TRANSACTIONS, "outcome" => "aborted").increment(1);
}

fn event_id(record: &KafkaRecord) -> std::borrow::Cow<'_, str> {
    record
        .event_id
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or(std::borrow::Cow::Borrowed("-"))
}
