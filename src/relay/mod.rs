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
mod error;
mod ledger;
mod ledger_writes;
mod mapping;
mod schemas;
mod session;
mod settings;
mod slot_record;
mod standby;
mod state;
mod table_watch;
mod telemetry;

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::RelayConfig;
use crate::source::admin::AdminError;
use crate::source::error::SourceError;
use crate::source::replication::error::Disposition;

pub use error::RelayError;
pub use session::EVENTS_TARGET;
pub use settings::RelaySettings;
// The relay's dead-letter records, for `outboxd backfill`.
pub(crate) use dead_letter::{
    from_record as dead_letter_refused, from_unmappable as dead_letter_unmappable,
};
use mapping::RelayMapper;
use session::SessionEnd;
use state::RelayState;
use telemetry::{ReconnectCause, RelayEvent, RelayTelemetry};

/// A session that ran this long without failing resets the backoff.
const HEALTHY_SESSION: Duration = Duration::from_secs(30);

/// What the relay does after a session ended.
enum Next {
    /// Stop, with this result.
    Stop(Result<(), RelayError>),
    /// Another instance released the slot: start a session at once.
    TakeOver,
    /// Start again after the backoff.
    Retry {
        cause: ReconnectCause,
        detail: String,
    },
}

/// Runs until `shutdown` resolves (then drains and returns Ok) or a
/// non-retryable error.
pub async fn run(
    mut settings: RelaySettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RelayError> {
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    // Before the first session: the mappers are built with the schemas.
    let Some(fetched) = schemas::fetch(&settings, &stop).await? else {
        return Ok(());
    };
    let telemetry = RelayTelemetry::new(&settings.health);
    // The refresh task stops when `_refresh` is dropped, as the relay returns.
    let (mapper, _refresh) = RelayMapper::start(&settings, fetched)?;
    let mut state = RelayState::new(mapper, stop);
    state.tell_start(&settings, &telemetry);
    let relay = settings.config.relay.clone();
    let mut retries = Retries::new(&relay);
    loop {
        let started = Instant::now();
        let result = state.session(&settings).await;
        // Once this process has streamed the slot, it never creates one: a
        // slot missing now was dropped or lost, and a new one would start
        // past the events committed meanwhile (see `RelayError::SlotLost`).
        if state.session_ended() {
            settings.source.create_slot = false;
        }
        telemetry.emit(RelayEvent::SessionEnded);
        let (cause, detail) =
            match next(&settings, &mut state, &telemetry, &mut retries, result).await {
                Next::Stop(result) => return result,
                Next::TakeOver => continue,
                Next::Retry { cause, detail } => (cause, detail),
            };
        if started.elapsed() >= HEALTHY_SESSION {
            retries.backoff = relay.reconnect_backoff_min;
        }
        telemetry.emit(RelayEvent::Reconnecting {
            cause,
            detail: &detail,
            backoff: retries.backoff,
            permanent: retries.permanent,
            max_permanent: relay.max_permanent_failures,
        });
        if state.stopped_within(retries.backoff).await {
            return Ok(());
        }
        retries.backoff = (retries.backoff * 2).min(relay.reconnect_backoff_max);
    }
}

/// The reconnect backoff, and the permanent failures in a row (anything
/// else starts that count over).
struct Retries {
    backoff: Duration,
    permanent: u32,
    min: Duration,
    max_permanent: u32,
}

impl Retries {
    fn new(relay: &RelayConfig) -> Self {
        Retries {
            backoff: relay.reconnect_backoff_min,
            permanent: 0,
            min: relay.reconnect_backoff_min,
            max_permanent: relay.max_permanent_failures,
        }
    }
}

/// Decides what follows a session's end: stop, stand by for the slot, or
/// reconnect (telling why).
async fn next(
    settings: &RelaySettings,
    state: &mut RelayState,
    telemetry: &RelayTelemetry,
    retries: &mut Retries,
    result: Result<SessionEnd, RelayError>,
) -> Next {
    match result {
        Ok(SessionEnd::Shutdown) => Next::Stop(Ok(())),
        // Kafka-side ends; the session marked Kafka down if it was a
        // transport failure (a refused event is no outage).
        Ok(SessionEnd::Reconnect(end)) => {
            retries.permanent = 0;
            Next::Retry {
                cause: end.cause,
                detail: end.detail,
            }
        }
        // Another instance streams the slot: stand by, quietly, until it is
        // released (see `standby`); no backoff, not a reconnect.
        Err(e) if standby::slot_holder(&e).is_some() => {
            let pid = standby::slot_holder(&e).flatten();
            retries.permanent = 0;
            retries.backoff = retries.min;
            let mut stop = state.stop.clone();
            match standby::wait(settings, telemetry, pid, &mut stop).await {
                standby::Wait::Released => {
                    state.taking_over();
                    Next::TakeOver
                }
                standby::Wait::Stopped => Next::Stop(Ok(())),
            }
        }
        Err(RelayError::Source(SourceError::Admin(AdminError::SlotMissing { slot })))
            if state.slot.streamed() =>
        {
            let (confirmed, at_us) = state.slot.last_confirmed();
            Next::Stop(Err(RelayError::SlotLost {
                slot,
                confirmed,
                confirmed_at: crate::progress::ledger::format_time_us(at_us),
            }))
        }
        Err(e) => {
            match e.disposition() {
                Disposition::Fatal => return Next::Stop(Err(e)),
                Disposition::Permanent => {
                    retries.permanent += 1;
                    if retries.permanent >= retries.max_permanent {
                        return Next::Stop(Err(RelayError::GaveUp {
                            attempts: retries.permanent,
                            last: Box::new(e),
                        }));
                    }
                }
                Disposition::Transient => retries.permanent = 0,
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
            Next::Retry { cause, detail }
        }
    }
}
