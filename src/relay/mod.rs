//! The relay: source → outbox mapping → Kafka sink → ack tracker, in one
//! task, plus reconnecting with backoff, or standing by while another
//! instance streams the slot (`standby`).
//!
//! Guarantees, and where each is kept:
//! - **No loss, no gap**: the slot is confirmed only at positions the
//!   ack tracker (`progress::AckTracker`) allows, i.e. below every
//!   unacknowledged event. Any transport failure throws away the producer and
//!   the stream and resumes from the slot, so a message librdkafka gave up on
//!   is read again rather than skipped.
//! - **Per-key order**: records are enqueued from this one task in WAL order
//!   to an idempotent producer, so each partition keeps commit order.
//! - **Bounded duplicates**: after a crash only the unacknowledged window
//!   (at most `relay.max_in_flight_events`, plus the rest of the open
//!   transactions) is delivered again. A graceful stop drains it first.

mod dead_letter;
mod ledger;
mod schemas;
mod session;
mod slot_record;
mod standby;
mod table_watch;
mod telemetry;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::{Config, OnError};
use crate::metrics::Health;
use crate::outbox::{MappingConfigError, TableMappers};
use crate::progress::ledger::StartGap;
use crate::registry::RegistryError;
use crate::sink::{LedgerTopicError, SinkError, TransactionError};
use crate::source::admin::{self, AdminError};
use crate::source::replication::error::Disposition;
use crate::source::session::{SourceError, SourceSettings};

pub use session::EVENTS_TARGET;
// The relay's dead-letter records, for `outboxd backfill`.
pub(crate) use dead_letter::{
    from_record as dead_letter_refused, from_unmappable as dead_letter_unmappable,
};
use session::{PoisonMemory, SessionEnd, DEAD_LETTER_REASONS};
use slot_record::SlotRecord;
use telemetry::{ReconnectCause, RelayEvent, RelayTelemetry};

/// A session that ran this long without failing resets the backoff.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Mapping(#[from] MappingConfigError),
    /// The schema registry refused what the config asks of it (an
    /// unreachable registry is retried before the first session instead).
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The position ledger's topic cannot be used (the message names the
    /// fix).
    #[error(transparent)]
    Ledger(#[from] LedgerTopicError),
    /// Exactly-once: the transactional producer failed. A fencing (another
    /// instance took the transactional id over) stops the relay.
    #[error(transparent)]
    Transaction(#[from] TransactionError),
    /// The ledger, the server and the slot disagree: events may have been
    /// lost. The message names the slot, both positions and the recovery.
    #[error("{0}")]
    Gap(Box<StartGap>),
    /// The last error is rendered here rather than kept as the source, so
    /// the message says it once.
    #[error(
        "gave up after {attempts} attempts in a row failed for a reason reconnecting cannot fix \
         (relay.max_permanent_failures = {attempts}): {last}"
    )]
    GaveUp {
        attempts: u32,
        last: Box<RelayError>,
    },
    /// The slot was streamed by this process and is gone now: dropped, or
    /// lost in a failover to a server that does not have it. A new slot
    /// would start at the server's current position and skip everything
    /// committed since `confirmed`, so none is created.
    #[error(
        "replication slot {slot:?} disappeared while outboxd was relaying it (dropped, or lost in a \
         failover to a server without it). outboxd last confirmed {confirmed} at {confirmed_at}; \
         outbox events committed after that were not relayed, and a new slot would skip them, so \
         outboxd created none and stopped. To recover: run `outboxd backfill --since '{confirmed_at}'` \
         (a little earlier is safer: duplicates carry the same id), then start outboxd once with \
         `outboxd run --accept-gap`, which creates the slot and records the accepted range in the \
         position ledger (a plain restart refuses, naming the gap)"
    )]
    SlotLost {
        slot: String,
        confirmed: crate::Lsn,
        confirmed_at: String,
    },
}

impl RelayError {
    /// Reconnect (how often), or stop.
    fn disposition(&self) -> Disposition {
        let by_retry = |retryable: bool| {
            if retryable {
                Disposition::Transient
            } else {
                Disposition::Fatal
            }
        };
        match self {
            RelayError::Source(SourceError::Admin(e)) => e.disposition(),
            RelayError::Source(SourceError::Replication(e)) => e.disposition(),
            RelayError::Source(e) => by_retry(e.is_retryable()),
            RelayError::Sink(e) => by_retry(e.is_retryable()),
            RelayError::Ledger(LedgerTopicError::Sink(e)) => by_retry(e.is_retryable()),
            RelayError::Ledger(LedgerTopicError::Read { .. } | LedgerTopicError::Write { .. }) => {
                Disposition::Transient
            }
            RelayError::Transaction(
                TransactionError::Abortable { .. } | TransactionError::Unfinished { .. },
            ) => Disposition::Transient,
            RelayError::Transaction(_)
            | RelayError::Mapping(_)
            | RelayError::Registry(_)
            | RelayError::GaveUp { .. }
            | RelayError::SlotLost { .. }
            | RelayError::Ledger(_)
            | RelayError::Gap(_) => Disposition::Fatal,
        }
    }
}

/// Everything a relay needs, derived from the configuration file.
pub struct RelaySettings {
    pub source: SourceSettings,
    pub brokers: String,
    pub config: Config,
    pub dead_letter_topic: Option<Arc<str>>,
    /// Shared with the health endpoint: the relay reports into it.
    pub health: Arc<Health>,
    /// `outboxd run --accept-gap`: resume past a gap the position ledger
    /// names (once), recording the range in the ledger.
    pub accept_gap: bool,
}

impl RelaySettings {
    pub fn new(source: SourceSettings, config: Config) -> RelaySettings {
        let brokers = config.kafka.brokers.clone().unwrap_or_default();
        let dead_letter_topic = match config.relay.on_error {
            OnError::DeadLetter => config.relay.dead_letter_topic.as_deref().map(Arc::from),
            OnError::Stop => None,
        };
        RelaySettings {
            source,
            brokers,
            health: Arc::new(Health::new(&config)),
            config,
            dead_letter_topic,
            accept_gap: false,
        }
    }
}

/// Runs until `shutdown` resolves (then drains and returns Ok) or a
/// non-retryable error.
pub async fn run(
    mut settings: RelaySettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RelayError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let Some(schemas) = schemas::fetch(&settings, &stop_rx).await? else {
        return Ok(());
    };
    let mut mapper = TableMappers::with_schemas(&settings.config.tables(), &schemas)?;
    let mut poison = PoisonMemory::default();
    let relay = settings.config.relay.clone();
    let telemetry = RelayTelemetry::new(&settings.health);
    telemetry.emit(RelayEvent::Starting {
        config: &settings.config,
        mappers: &mapper,
        dead_letter_reasons: &DEAD_LETTER_REASONS,
    });
    // Opened before the first session, again after a failure that
    // reconnecting may fix (Kafka unreachable at start).
    let mut ledger: Option<ledger::RelayLedger> = None;
    // What the sessions found of the slot: the decisions below are made
    // from it, not from the health endpoint's state.
    let mut slot_record = SlotRecord::new();
    // The outbox tables as the first session found them (`TableBaseline`).
    let mut tables = table_watch::TableBaseline::default();
    let mut backoff = relay.reconnect_backoff_min;
    // Permanent failures in a row; anything else starts the count over.
    let mut permanent = 0;
    loop {
        let started = Instant::now();
        let result = async {
            let ledger = match &mut ledger {
                Some(l) => l,
                None => {
                    // PostgreSQL first: a wrong password or a missing
                    // privilege must be reported as such (and stop the
                    // relay) even while Kafka is unreachable too.
                    let client = admin::connect_sql(&settings.source.conn)
                        .await
                        .map_err(SourceError::from)?;
                    admin::preflight(&client).await.map_err(SourceError::from)?;
                    drop(client);
                    ledger.insert(ledger::RelayLedger::open(&settings).await?)
                }
            };
            let stop = stop_rx.clone();
            session::run(
                &settings,
                &mut mapper,
                &mut poison,
                ledger,
                &mut slot_record,
                &mut tables,
                stop,
            )
            .await
        }
        .await;
        // Once this process has streamed the slot, it never creates one: a
        // slot missing now was dropped or lost, and a new one would start
        // past the events committed meanwhile (see `RelayError::SlotLost`).
        if slot_record.session_ended() {
            settings.source.create_slot = false;
            if let Some(l) = &mut ledger {
                l.streaming();
            }
        }
        telemetry.emit(RelayEvent::SessionEnded);
        let (cause, detail) = match result {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            // Kafka-side ends; the session marked Kafka down if it was a
            // transport failure (a refused event is no outage).
            Ok(SessionEnd::Reconnect(end)) => {
                permanent = 0;
                (end.cause, end.detail)
            }
            // Another instance streams the slot: stand by, quietly, until
            // it is released (see `standby`); no backoff, not a reconnect.
            Err(e) if standby::slot_holder(&e).is_some() => {
                let pid = standby::slot_holder(&e).flatten();
                permanent = 0;
                backoff = relay.reconnect_backoff_min;
                match standby::wait(&settings, &telemetry, pid, &mut stop_rx.clone()).await {
                    standby::Wait::Released => {
                        if let Some(l) = &mut ledger {
                            l.taking_over();
                        }
                        tables.forget();
                        continue;
                    }
                    standby::Wait::Stopped => return Ok(()),
                }
            }
            Err(RelayError::Source(SourceError::Admin(AdminError::SlotMissing { slot })))
                if slot_record.streamed() =>
            {
                let (confirmed, at_us) = slot_record.last_confirmed();
                return Err(RelayError::SlotLost {
                    slot,
                    confirmed,
                    confirmed_at: crate::progress::ledger::format_time_us(at_us),
                });
            }
            Err(e) => {
                match e.disposition() {
                    Disposition::Fatal => return Err(e),
                    Disposition::Permanent => {
                        permanent += 1;
                        if permanent >= relay.max_permanent_failures {
                            return Err(RelayError::GaveUp {
                                attempts: permanent,
                                last: Box::new(e),
                            });
                        }
                    }
                    Disposition::Transient => permanent = 0,
                }
                let detail = e.to_string();
                let cause = match e {
                    RelayError::Source(_) => ReconnectCause::Postgres,
                    _ => ReconnectCause::Kafka,
                };
                telemetry.emit(RelayEvent::Down {
                    side: cause,
                    cause: &detail,
                });
                (cause, detail)
            }
        };
        if started.elapsed() >= HEALTHY_SESSION {
            backoff = relay.reconnect_backoff_min;
        }
        telemetry.emit(RelayEvent::Reconnecting {
            cause,
            detail: &detail,
            backoff,
            permanent,
            max_permanent: relay.max_permanent_failures,
        });
        let mut stop = stop_rx.clone();
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
        backoff = (backoff * 2).min(relay.reconnect_backoff_max);
    }
}
