//! The delivery mode: how the session's records reach Kafka, what a
//! report means, and the mode's policy at each point where the two modes
//! differ. The session's loop and its in-flight window
//! ([`Window`](super::window::Window)) are the same for every mode, and the
//! loop calls every hook of [`DeliveryMode`] in both; a mode that has
//! nothing to do at one does nothing.
//!
//! **At-least-once** ([`AtLeastOnce`](super::at_least_once::AtLeastOnce)):
//! one idempotent producer with the gapless guarantee. A report is final
//! when librdkafka has it, so an acknowledgement moves the confirmable
//! position at once. A broker's refusal makes the producer fatal: the
//! session takes back what it held and opens a fresh one, keeping the
//! stream.
//!
//! **Exactly-once** ([`ExactlyOnce`](super::exactly_once::ExactlyOnce),
//! `relay.delivery = "exactly-once"`) fits the same window: it withholds
//! every report of the open Kafka transaction and books them only once its
//! commit succeeded. An acknowledgement then means "visible to
//! `read_committed` consumers", so the window confirms the slot only up to
//! committed transactions while knowing nothing of transactions. An abort
//! books the reports as failures; the session then resumes from the
//! ledger.

use std::collections::BTreeSet;
use std::sync::Arc;

use rdkafka::types::RDKafkaErrorCode;
use tokio::time::Instant;

use super::parts::{Session, SessionEnd};
use super::window::InFlight;
use crate::metrics as m;
use crate::relay::error::RelayError;
use crate::relay::ledger::{RelayLedger, Start};
use crate::relay::settings::RelaySettings;
use crate::sink::{FailureKind, KafkaSink, QueueBound, SendError, TransactionControl};
use crate::Lsn;

/// What a draining turn found.
pub(super) enum Drain {
    /// Nothing more will be acknowledged: finish now.
    Done,
    /// Still waiting for acknowledgements or the end of the open
    /// transaction.
    Going,
    /// The session ends (the mode's commit failed).
    End(SessionEnd),
}

/// The result of a step that may end the session.
pub(super) type Step = Result<Option<SessionEnd>, RelayError>;

/// What the session asks of Kafka, and the mode's decisions. Records are
/// handed over from the session's one task in WAL order; reports come back
/// by delivery id.
pub(super) trait DeliveryMode: Sized {
    /// The session's producer, once the stream is open at `start_lsn` and
    /// the ledger's gate found `start`. `ledger_key` names the relay (the
    /// position ledger's key).
    async fn start(
        settings: &RelaySettings,
        ledger: &RelayLedger,
        start: &Start,
        start_lsn: Lsn,
        ledger_key: &str,
    ) -> Result<Self, RelayError>;

    /// Hands one record over; its report comes back with its id. What the
    /// window keeps of a sent record is the mode's to say: only what a
    /// resend from memory would need.
    fn send(&mut self, entry: &mut InFlight) -> Result<(), SendError>;

    /// Sends what lingers at once: the session caught up with the
    /// walsender, so no batch mate is coming.
    fn send_now(&self);

    /// What the mode waits for besides the stream: a delivery report
    /// (at-least-once), the end of a commit under way (exactly-once).
    type News;

    /// The next news; cancel-safe.
    async fn news(&mut self) -> Self::News;

    /// Whether the producer takes no records for now (a commit under way):
    /// the loop reads on meanwhile, as far as the window allows, and keeps
    /// what it read for when the producer takes records again.
    fn busy(&self) -> bool;

    /// The slot is never confirmed past this, whatever was acknowledged.
    fn ceiling(&self) -> Lsn;

    /// When the loop must wake for the mode even if nothing else happens.
    fn wake_at(s: &Session<'_, Self>) -> Option<Instant>;

    /// Handles news from [`DeliveryMode::news`].
    async fn on_news(s: &mut Session<'_, Self>, news: Self::News) -> Step;

    /// The producer's queue is full: make room for one more record.
    async fn make_room(s: &mut Session<'_, Self>) -> Step;

    /// Sends a suspect alone, so that its verdict is its own.
    async fn trial(s: &mut Session<'_, Self>, entry: InFlight) -> Step;

    /// The producer refused `entry` for a reason not its own (the producer
    /// failed, or is failing).
    async fn refused(
        s: &mut Session<'_, Self>,
        entry: InFlight,
        code: RDKafkaErrorCode,
        kind: FailureKind,
        message: String,
    ) -> Step;

    /// Ends a turn of the loop: confirms what may be confirmed, and does
    /// what the mode does after each turn.
    async fn end_turn(s: &mut Session<'_, Self>) -> Step;

    /// One step of a graceful stop: is everything that can be acknowledged
    /// acknowledged?
    async fn drain(s: &mut Session<'_, Self>) -> Result<Drain, RelayError>;

    /// The stream was finished at `confirmed`: the mode's last word.
    async fn finish(s: &mut Session<'_, Self>, confirmed: Lsn);

    /// The session ends, whyever: what the mode still has under way ends
    /// first, so that the next session starts from what it did.
    async fn close(s: &mut Session<'_, Self>);

    /// Since when the producer has held progress back, for the watchdog:
    /// the oldest record it holds (at-least-once), the commit under way
    /// (exactly-once); `None` while it holds nothing. Asked once a turn.
    fn holding_since(s: &mut Session<'_, Self>, now: Instant) -> Option<Instant>;

    /// What the producer holds, in words for the log, and the topics
    /// whose leaders decide whether the producer or the cluster is stuck.
    fn holding(s: &Session<'_, Self>) -> (String, BTreeSet<String>);

    /// The watchdog found the producer stuck while every partition has a
    /// leader (`leaders`): give it up without waiting for its timeouts.
    async fn replace_stuck(s: &mut Session<'_, Self>, stuck: Stuck<'_>) -> Step;
}

/// What the watchdog found, for [`DeliveryMode::replace_stuck`] to tell.
pub(super) struct Stuck<'a> {
    pub(super) age: std::time::Duration,
    pub(super) holding: &'a str,
    pub(super) leaders: &'a str,
}

/// Destroying a librdkafka client joins its threads: not on this one.
pub(super) fn retire(sink: KafkaSink) {
    tokio::task::spawn_blocking(move || drop(sink));
}

/// The session's producer (transactional with `transactional_id`), with
/// delivery reports on its channel and statistics to the health endpoint
/// when there is one.
pub(super) fn producer(
    settings: &RelaySettings,
    transactional_id: Option<&str>,
) -> Result<(KafkaSink, Option<TransactionControl>), RelayError> {
    let health = &settings.health;
    // Statistics feed only the endpoint's gauges: none without one.
    let metrics_on = settings.config.metrics.listen.is_some();
    let stats = metrics_on.then(|| m::kafka::stats_hook(Arc::clone(health)));
    let window = QueueBound::of(&settings.config.relay);
    let (brokers, kafka) = (&settings.brokers, &settings.config.kafka);
    let (sink, control) = match transactional_id {
        None => (KafkaSink::with_stats(brokers, kafka, window, stats)?, None),
        Some(id) => {
            let (sink, control) = KafkaSink::transactional(brokers, kafka, window, stats, id)?;
            (sink, Some(control))
        }
    };
    health.new_producer();
    // Ready as soon as a broker answers, not at the first statistics or
    // ack. On librdkafka's thread, so straight to the shared state.
    let health = Arc::clone(health);
    sink.when_connected(move || health.kafka_broker_up());
    Ok((sink, control))
}
