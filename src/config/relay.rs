//! `[relay]`: flow control, failure policy and timing of the pipeline.

use std::time::Duration;

use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::routing::validate_topic_name;
use crate::config::units::{de_duration, de_size};

/// Events read but not yet acknowledged by Kafka. Each costs about 3 KiB
/// while in flight (its window entry, the decoded row, the WAL it was read
/// from, the record and headers, librdkafka's copy), and a broker outage or
/// a backlog drain on a busy host fills the window. 1,536 rather than 2,048:
/// about 3 MiB lower peak RSS in the bench's drains at the same CPU per
/// event, which keeps every value format under the 32 MiB target
/// (docs/benchmarks.md, "The in-flight window's default"). It also bounds
/// what is replayed after a crash.
pub(crate) const DEFAULT_MAX_IN_FLIGHT_EVENTS: usize = 1536;
/// Bytes of payload in flight. 64 MiB caps memory when payloads are large,
/// fitting comfortably in a 256 MiB container, whichever limit is hit first.
pub(crate) const DEFAULT_MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;
/// Time allowed on shutdown to drain in-flight events. 30s is Kubernetes'
/// default grace period; being cut off is safe (unacknowledged events are
/// re-read), it only means more duplicates.
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// First reconnect delay: short enough to ride out a failover quickly.
pub(crate) const DEFAULT_RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest reconnect delay: bounds time-to-recover after a long outage
/// without hammering a database that is coming back up.
pub(crate) const DEFAULT_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Attempts in a row that fail for a reason retrying cannot fix (a wrong
/// password, pg_hba.conf, an unknown database, a missing privilege, an
/// untrusted certificate, slot or publication settings) before `run` exits.
/// A few ride out a change being rolled out (a password rotated on both
/// sides); an orchestrator then sees the failure instead of a process that
/// looks alive.
pub(crate) const DEFAULT_MAX_PERMANENT_FAILURES: u32 = 3;

/// How often a standby (an instance that found the slot streamed by
/// another) looks whether the slot was released. A killed instance's
/// walsender ends as soon as PostgreSQL sees its socket close, so takeover
/// comes at most this long, plus a session start, after the active instance
/// dies: 1 s keeps that well under 5 s for one cheap query per second.
pub(crate) const DEFAULT_STANDBY_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Events per Kafka transaction at most (exactly-once). A transaction's
/// records stay in the window until it commits, so in this mode the window
/// holds at least this many ([`RelayConfig::window_events`]). Each costs
/// little there: exactly-once drops a record's payload once the producer
/// has it (an abort resumes from the ledger, never from memory). Each
/// commit waits for its transaction's last record, so fewer, larger ones
/// drain faster, but the producer keeps a copy of every record until the
/// commit. 3072 is the largest that kept a drain's peak RSS within the
/// 32 MiB target, at a small cost in 100-row drains against 4096
/// (docs/benchmarks.md, "Exactly-once's transaction size").
pub(crate) const DEFAULT_TRANSACTION_MAX_EVENTS: usize = 3072;
/// Longest a Kafka transaction stays open (exactly-once) while the stream
/// is busy: a `read_committed` consumer sees nothing of it until it commits,
/// so this bounds the latency a steady stream adds. An idle stream commits
/// at once.
pub(crate) const DEFAULT_TRANSACTION_MAX_DELAY: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelayConfig {
    pub max_in_flight_events: usize,
    #[serde(deserialize_with = "de_size")]
    pub max_in_flight_bytes: u64,
    pub on_error: OnError,
    /// Where undeliverable events go when `on_error = "dead_letter"`.
    pub dead_letter_topic: Option<String>,
    #[serde(deserialize_with = "de_duration")]
    pub shutdown_timeout: Duration,
    #[serde(deserialize_with = "de_duration")]
    pub reconnect_backoff_min: Duration,
    #[serde(deserialize_with = "de_duration")]
    pub reconnect_backoff_max: Duration,
    pub max_permanent_failures: u32,
    #[serde(deserialize_with = "de_duration")]
    pub standby_poll_interval: Duration,
    pub delivery: DeliveryMode,
    pub transaction_max_events: usize,
    #[serde(deserialize_with = "de_duration")]
    pub transaction_max_delay: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            max_in_flight_events: DEFAULT_MAX_IN_FLIGHT_EVENTS,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            on_error: OnError::default(),
            dead_letter_topic: None,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            reconnect_backoff_min: DEFAULT_RECONNECT_BACKOFF_MIN,
            reconnect_backoff_max: DEFAULT_RECONNECT_BACKOFF_MAX,
            max_permanent_failures: DEFAULT_MAX_PERMANENT_FAILURES,
            standby_poll_interval: DEFAULT_STANDBY_POLL_INTERVAL,
            delivery: DeliveryMode::default(),
            transaction_max_events: DEFAULT_TRANSACTION_MAX_EVENTS,
            transaction_max_delay: DEFAULT_TRANSACTION_MAX_DELAY,
        }
    }
}

/// What to do with an event that cannot be routed or produced (bad topic
/// value, message too large, ...).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop without confirming past the event, so nothing is skipped silently;
    /// the default because an outbox promises delivery.
    #[default]
    Stop,
    /// Send it to `dead_letter_topic` and carry on.
    DeadLetter,
}

/// What a consumer may rely on (`relay.delivery`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryMode {
    /// Every event at least once, per-key order kept; a crash or a takeover
    /// repeats what was acknowledged after the last confirmation.
    #[default]
    AtLeastOnce,
    /// Whole database transactions in Kafka transactions with the position
    /// ledger inside: a `read_committed` consumer sees every event once.
    ExactlyOnce,
}

impl RelayConfig {
    /// The in-flight window's size in events: `max_in_flight_events`, and
    /// in exactly-once at least `transaction_max_events`, as an open
    /// transaction's records stay in the window until it commits (a smaller
    /// window would cut every transaction short).
    pub(crate) fn window_events(&self) -> usize {
        match self.delivery {
            DeliveryMode::AtLeastOnce => self.max_in_flight_events,
            DeliveryMode::ExactlyOnce => self.max_in_flight_events.max(self.transaction_max_events),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.transaction_max_events == 0 {
            return Err(ConfigError::invalid(
                "relay.transaction_max_events",
                format!("must be at least 1 (default {DEFAULT_TRANSACTION_MAX_EVENTS})"),
            ));
        }
        if self.transaction_max_delay.is_zero() {
            return Err(ConfigError::invalid(
                "relay.transaction_max_delay",
                "must be greater than zero, e.g. \"100ms\"",
            ));
        }
        if self.max_in_flight_events == 0 {
            return Err(ConfigError::invalid(
                "relay.max_in_flight_events",
                format!("must be at least 1 (default {DEFAULT_MAX_IN_FLIGHT_EVENTS})"),
            ));
        }
        if self.max_in_flight_bytes == 0 {
            return Err(ConfigError::invalid(
                "relay.max_in_flight_bytes",
                "must be greater than zero, e.g. \"64MiB\"",
            ));
        }
        if self.reconnect_backoff_min.is_zero() {
            return Err(ConfigError::invalid(
                "relay.reconnect_backoff_min",
                "must be greater than zero, e.g. \"500ms\", so reconnects do not spin",
            ));
        }
        if self.max_permanent_failures == 0 {
            return Err(ConfigError::invalid(
                "relay.max_permanent_failures",
                format!("must be at least 1 (default {DEFAULT_MAX_PERMANENT_FAILURES})"),
            ));
        }
        if self.standby_poll_interval.is_zero() {
            return Err(ConfigError::invalid(
                "relay.standby_poll_interval",
                "must be greater than zero, e.g. \"1s\", so a standby does not spin",
            ));
        }
        if self.reconnect_backoff_min > self.reconnect_backoff_max {
            return Err(ConfigError::invalid(
                "relay.reconnect_backoff_min",
                format!(
                    "{:?} is greater than relay.reconnect_backoff_max ({:?}); lower it or raise the maximum",
                    self.reconnect_backoff_min, self.reconnect_backoff_max
                ),
            ));
        }
        match (self.on_error, self.dead_letter_topic.as_deref()) {
            (OnError::DeadLetter, None) => Err(ConfigError::invalid(
                "relay.dead_letter_topic",
                "required when relay.on_error = \"dead_letter\"; set it, e.g. \"outbox.dlq\", or use on_error = \"stop\"",
            )),
            (_, Some(topic)) => validate_topic_name("relay.dead_letter_topic", topic),
            (OnError::Stop, None) => Ok(()),
        }
    }
}
