//! The relay's telemetry around its sessions (a session's own is
//! `session::telemetry`): each thing worth telling is one [`RelayEvent`],
//! and [`RelayTelemetry::emit`] writes everything it means together: the
//! metric, the health endpoint's state and the log line. Nothing here is
//! read back to decide anything; the relay decides from what the sessions
//! return and from its [`SlotRecord`](super::slot_record::SlotRecord).

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, DeliveryMode};
use crate::metrics::{self as m, Health};
use crate::outbox::TableMappers;
use crate::progress::ledger::{StartGap, WriteFailure};
use crate::Lsn;

/// The `cause` label of the reconnect counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReconnectCause {
    /// A delivery failed (timed out, fatal): reconnect from the slot.
    KafkaDelivery,
    /// Kafka otherwise: the producer, a topic, the cluster.
    Kafka,
    /// The source: PostgreSQL, the walsender, the stream.
    Postgres,
    /// The schema registry could not answer for an event.
    Registry,
}

impl ReconnectCause {
    pub(super) const ALL: [ReconnectCause; 4] = [
        ReconnectCause::KafkaDelivery,
        ReconnectCause::Kafka,
        ReconnectCause::Postgres,
        ReconnectCause::Registry,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            ReconnectCause::KafkaDelivery => "kafka_delivery",
            ReconnectCause::Kafka => "kafka",
            ReconnectCause::Postgres => "postgres",
            ReconnectCause::Registry => "schema_registry",
        }
    }
}

/// Something that happened to the relay, between or around sessions.
pub(super) enum RelayEvent<'e> {
    /// The relay starts: its limits, and every labelled series at 0 (so
    /// `rate()` and `absent()` work from the start).
    Starting {
        config: &'e Config,
        mappers: &'e TableMappers,
        /// The `reason` labels of dead-lettered events.
        dead_letter_reasons: &'e [&'static str],
    },
    /// The position ledger was read; its newest position, if any.
    LedgerRead { newest: Option<Lsn> },
    /// A ledger entry is in Kafka (written, or committed in a transaction).
    LedgerWritten(Lsn),
    /// A ledger write failed (the writer goes on with the newest entry).
    LedgerWriteFailed {
        reason: WriteFailure,
        detail: &'e str,
    },
    /// How long the ledger has not held the newest entry wanted.
    LedgerLag(Duration),
    /// The authoriser refused a ledger write (the error names the ACL).
    LedgerRefused(&'e str),
    /// The start decision: the gap that stops the relay, or none.
    Gap(Option<&'e StartGap>),
    /// A session ended; what it had in flight is re-read by the next one.
    SessionEnded,
    /// A session could not start or failed on `side`'s account.
    Down {
        side: ReconnectCause,
        cause: &'e str,
    },
    /// The relay starts a new session after `backoff`; `permanent` failures
    /// in a row so far (of `max_permanent`).
    Reconnecting {
        cause: ReconnectCause,
        detail: &'e str,
        backoff: Duration,
        permanent: u32,
        max_permanent: u32,
    },
    /// Another instance streams the slot (on walsender `pid`, when known).
    StandingBy { pid: Option<i32> },
}

/// Writes [`RelayEvent`]s; cheap to clone (the writer task of the ledger
/// has one).
#[derive(Clone)]
pub(super) struct RelayTelemetry {
    health: Arc<Health>,
}

impl RelayTelemetry {
    pub(super) fn new(health: &Arc<Health>) -> RelayTelemetry {
        RelayTelemetry {
            health: Arc::clone(health),
        }
    }

    pub(super) fn emit(&self, event: RelayEvent<'_>) {
        use RelayEvent as E;
        match event {
            E::Starting {
                config,
                mappers,
                dead_letter_reasons,
            } => register(config, mappers, dead_letter_reasons),
            E::LedgerRead { newest } => {
                // Exported from the start, 0 until the first entry: a
                // dashboard or alert on it sees "nothing written yet", not
                // a missing series for a whole status interval.
                m::gauge_lsn(m::LEDGER_LSN, newest.unwrap_or(Lsn::ZERO));
                metrics::gauge!(m::LEDGER_GAP).set(0.0);
                metrics::counter!(m::EVENTS_SKIPPED).increment(0);
                metrics::gauge!(m::LEDGER_LAG_SECONDS).set(0.0);
                for reason in WriteFailure::ALL {
                    metrics::counter!(m::LEDGER_WRITE_FAILURES, "reason" => reason.label())
                        .increment(0);
                }
            }
            E::LedgerWritten(lsn) => {
                m::gauge_lsn(m::LEDGER_LSN, lsn);
                self.health.set_ledger_refused(None);
            }
            E::LedgerRefused(error) => self.health.set_ledger_refused(Some(error.to_owned())),
            E::LedgerWriteFailed { reason, detail } => {
                metrics::counter!(m::LEDGER_WRITE_FAILURES, "reason" => reason.label())
                    .increment(1);
                tracing::warn!(reason = reason.label(), error = %detail, "cannot write the position ledger; writing the newest entry with a new producer (the ledger lags meanwhile, the relay goes on)");
            }
            E::LedgerLag(lag) => metrics::gauge!(m::LEDGER_LAG_SECONDS).set(lag.as_secs_f64()),
            E::Gap(gap) => {
                metrics::gauge!(m::LEDGER_GAP).set(if gap.is_some() { 1.0 } else { 0.0 });
                self.health.set_gap(gap.map(ToString::to_string));
            }
            E::SessionEnded => {
                self.health.session_ended();
                metrics::gauge!(m::IN_FLIGHT_EVENTS).set(0.0);
                metrics::gauge!(m::IN_FLIGHT_BYTES).set(0.0);
            }
            E::Down { side, cause } => match side {
                ReconnectCause::Postgres => self.health.postgres_down(Some(cause)),
                ReconnectCause::Kafka | ReconnectCause::KafkaDelivery => {
                    self.health.kafka_down(cause)
                }
                ReconnectCause::Registry => self.health.registry_down(cause),
            },
            E::Reconnecting {
                cause,
                detail,
                backoff,
                permanent,
                max_permanent,
            } => {
                metrics::counter!(m::RECONNECTS, "cause" => cause.label()).increment(1);
                let backoff_ms = backoff.as_millis() as u64;
                if permanent > 0 {
                    tracing::error!(
                        cause = %detail,
                        attempt = permanent,
                        max_permanent_failures = max_permanent,
                        backoff_ms,
                        "cannot start the relay; retrying, then stopping unless the cause is fixed"
                    );
                } else {
                    tracing::warn!(cause = %detail, backoff_ms, "relay interrupted; resuming from the slot");
                }
            }
            // Health logs the first look of a standby, once.
            E::StandingBy { pid } => self.health.stand_by(pid),
        }
    }
}

/// The configured limits, and every known label value at 0.
fn register(config: &Config, mappers: &TableMappers, dead_letter_reasons: &[&'static str]) {
    metrics::gauge!(m::IN_FLIGHT_EVENTS_LIMIT).set(config.relay.window_events() as f64);
    metrics::gauge!(m::IN_FLIGHT_BYTES_LIMIT).set(config.relay.max_in_flight_bytes as f64);
    metrics::gauge!(m::HALTED).set(0.0);
    if config.relay.delivery == DeliveryMode::ExactlyOnce {
        for outcome in ["committed", "aborted"] {
            metrics::counter!(m::KAFKA_TRANSACTIONS, "outcome" => outcome).increment(0);
        }
        metrics::counter!(m::FENCED).increment(0);
    }
    for cause in ReconnectCause::ALL {
        metrics::counter!(m::RECONNECTS, "cause" => cause.label()).increment(0);
    }
    // Exported from the start: an alert on replacements sees 0, not nothing.
    for reason in m::PRODUCER_REPLACEMENT_REASONS {
        metrics::counter!(m::PRODUCER_REPLACEMENTS, "reason" => reason).increment(0);
    }
    for outcome in crate::registry::OUTCOMES {
        metrics::counter!(m::SCHEMA_REGISTRY_REQUESTS, "outcome" => outcome).increment(0);
    }
    for table in mappers.labels() {
        for &reason in dead_letter_reasons {
            metrics::counter!(m::EVENTS_DEAD_LETTERED, "reason" => reason, "table" => table.to_owned())
                .increment(0);
        }
    }
}
