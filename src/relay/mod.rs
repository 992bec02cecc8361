//! The relay: source → outbox mapping → Kafka sink → ack tracker, in one
//! task, plus reconnecting with backoff.
//!
//! Guarantees, and where each is kept:
//! - **No loss, no gap**: the slot is confirmed only at positions the
//!   [`AckTracker`](crate::progress::AckTracker) allows, i.e. below every
//!   unacknowledged event. Any transport failure throws away the producer and
//!   the stream and resumes from the slot, so a message librdkafka gave up on
//!   is read again rather than skipped.
//! - **Per-key order**: records are enqueued from this one task in WAL order
//!   to an idempotent producer, so each partition keeps commit order.
//! - **Bounded duplicates**: after a crash only the unacknowledged window
//!   (at most `relay.max_in_flight_events`, plus the rest of the open
//!   transactions) is delivered again. A graceful stop drains it first.

mod dead_letter;
mod session;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::{Config, OnError};
use crate::outbox::{MappingConfigError, RecordMapper};
use crate::sink::SinkError;
use crate::source::session::{SourceError, SourceSettings};

pub use dead_letter::{
    HEADER_ERROR, HEADER_ERROR_KIND, HEADER_LSN, HEADER_TOPIC, HEADER_VALUE_SIZE, HEADER_XID,
};
use session::{Session, SessionEnd};

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
}

impl RelayError {
    fn is_retryable(&self) -> bool {
        match self {
            RelayError::Source(e) => e.is_retryable(),
            RelayError::Sink(e) => e.is_retryable(),
            RelayError::Mapping(_) => false,
        }
    }
}

/// Everything a relay needs, derived from the configuration file.
pub struct RelaySettings {
    pub source: SourceSettings,
    pub brokers: String,
    pub config: Config,
    pub dead_letter_topic: Option<Arc<str>>,
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
            config,
            dead_letter_topic,
        }
    }
}

/// Runs until `shutdown` resolves (then drains and returns Ok) or a
/// non-retryable error.
pub async fn run(
    settings: RelaySettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RelayError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut mapper = RecordMapper::new(&settings.config.outbox.columns, &settings.config.routing)?;
    let mut poison = session::PoisonMemory::default();
    let relay = &settings.config.relay;
    let mut backoff = relay.reconnect_backoff_min;
    loop {
        let started = Instant::now();
        let result = Session::run(&settings, &mut mapper, &mut poison, stop_rx.clone()).await;
        let cause = match result {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            Ok(SessionEnd::Reconnect(cause)) => cause,
            Err(e) if e.is_retryable() => e.to_string(),
            Err(e) => return Err(e),
        };
        if started.elapsed() >= HEALTHY_SESSION {
            backoff = relay.reconnect_backoff_min;
        }
        metrics::counter!(crate::metrics::RECONNECTS, "cause" => cause_label(&cause)).increment(1);
        tracing::warn!(%cause, backoff_ms = backoff.as_millis() as u64, "relay interrupted; resuming from the slot");
        let mut stop = stop_rx.clone();
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
        backoff = (backoff * 2).min(relay.reconnect_backoff_max);
    }
}

/// A short, bounded label for the reconnect metric.
fn cause_label(cause: &str) -> &'static str {
    if cause.starts_with("delivery") {
        "kafka_delivery"
    } else if cause.contains("Kafka") || cause.contains("kafka") {
        "kafka"
    } else {
        "postgres"
    }
}
