//! The delivery seam: how the session's records reach Kafka, and what a
//! delivery report means. The session's loop and its in-flight window
//! ([`Window`](super::window::Window)) are the same for every mode; a mode is
//! one implementation of [`Delivery`], chosen where the session starts.
//!
//! **At-least-once** ([`AtLeastOnce`], today's only mode): one idempotent
//! producer with the gapless guarantee. A report is final when librdkafka
//! has it, so an acknowledgement moves the confirmable position at once. A
//! broker's refusal makes the producer fatal: the session takes back what it
//! held and opens a fresh one ([`Delivery::open`]), keeping the stream.
//!
//! **Transactional** ([`Transactional`](super::transactional::Transactional),
//! `relay.delivery = "exactly-once"`) fits the same seam without a change
//! to the window: it withholds every report of the open Kafka transaction
//! and hands them over only from [`Delivery::commit`], once the commit
//! succeeded. An acknowledgement then means "visible to `read_committed`
//! consumers", so the window confirms the slot only up to committed
//! transactions while knowing nothing of transactions. An abort hands the
//! reports back as failures ([`Delivery::abort`]); the session then resumes
//! from the ledger.

use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

use crate::metrics as m;
use crate::outbox::KafkaRecord;
use crate::progress::ledger::CommitPosition;
use crate::progress::DeliveryId;
use crate::relay::{RelayError, RelaySettings};
use crate::sink::{
    DeliveryReport, KafkaSink, QueueBound, SendError, TransactionControl, TransactionError,
};

/// How an abort ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AbortOutcome {
    /// The brokers aborted it: nothing of it is visible.
    Aborted,
    /// The abort call failed (e.g. a commit that timed out goes on in
    /// librdkafka and refuses it): the transaction may still commit. The
    /// next producer with the transactional id ends it one way or the
    /// other, and the next session's read of the ledger to its end finds
    /// out which.
    Unconfirmed(String),
}
/// What the session asks of Kafka. Records are handed over from the
/// session's one task in WAL order; reports come back by delivery id.
pub(super) trait Delivery: Sized {
    /// Reports wait for a Kafka transaction's commit (exactly-once).
    const TRANSACTIONAL: bool = false;

    /// A producer for a session, or a fresh one after a refusal ended the
    /// last. `ledger_key` names the relay (the position ledger's key).
    fn open(
        settings: &RelaySettings,
        ledger_key: &str,
    ) -> impl Future<Output = Result<Self, RelayError>> + Send;

    /// Hands one record over; its report comes back with `id`.
    fn send(&mut self, id: DeliveryId, record: &KafkaRecord) -> Result<(), SendError>;

    /// Sends what lingers at once: the session caught up with the
    /// walsender, so no batch mate is coming.
    fn send_now(&self);

    /// A database transaction ended, after its last record was handed over.
    fn checkpoint(&mut self, _commit: CommitPosition) {}

    /// The next report; cancel-safe. `None` once the producer is gone.
    fn next_report(&mut self) -> impl Future<Output = Option<DeliveryReport>> + Send;

    /// A report already waiting, if any.
    fn try_report(&mut self) -> Option<DeliveryReport>;

    /// Records handed over whose reports have not come back.
    fn in_queue(&self) -> i32;

    /// Fails what no broker has yet: their reports come back as purged.
    fn purge_queued(&self);

    /// Fails everything not reported on, in flight too.
    fn purge(&self);

    /// Ends this producer, without waiting for it on this thread.
    fn retire(self);

    /// The open Kafka transaction's records and when it began; `None` when
    /// none is open.
    fn open_transaction(&self) -> Option<(usize, Instant)> {
        None
    }

    /// Commits the open Kafka transaction (beginning one if none is open)
    /// with `ledger`, the position ledger's record for what it holds, and
    /// hands over the reports of its records, every one an ack.
    fn commit(
        &mut self,
        _ledger: LedgerRecord,
    ) -> impl Future<Output = Result<Vec<DeliveryReport>, TransactionError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Aborts the open Kafka transaction: nothing of it becomes visible,
    /// and the reports of its records come back, every one a failure.
    fn abort(&mut self) -> impl Future<Output = (Vec<DeliveryReport>, AbortOutcome)> + Send {
        async { (Vec::new(), AbortOutcome::Aborted) }
    }

    /// Sends everything handed over and waits for its reports to be in
    /// (exactly-once, where they still wait for the commit): a record sent
    /// between two flushes is alone in its produce request.
    fn flush(&mut self) -> impl Future<Output = Result<(), TransactionError>> + Send {
        async { Ok(()) }
    }

    /// Another producer with this one's transactional id fenced it.
    fn fenced(&self) -> Option<TransactionError> {
        None
    }
}

/// The position ledger's record, for a transaction to hold.
pub(super) struct LedgerRecord {
    pub(super) topic: String,
    pub(super) key: String,
    pub(super) value: Vec<u8>,
}

/// Today's mode: an idempotent producer whose acknowledgements are final.
pub(super) struct AtLeastOnce {
    sink: KafkaSink,
}

impl Delivery for AtLeastOnce {
    /// Delivery reports on the producer's channel, statistics to the health
    /// endpoint when there is one.
    async fn open(settings: &RelaySettings, _ledger_key: &str) -> Result<Self, RelayError> {
        let sink = producer(settings, None)?.0;
        Ok(AtLeastOnce { sink })
    }

    #[inline]
    fn send(&mut self, id: DeliveryId, record: &KafkaRecord) -> Result<(), SendError> {
        self.sink.send_record(id.get(), record)
    }

    fn send_now(&self) {
        self.sink.send_now();
    }

    fn next_report(&mut self) -> impl Future<Output = Option<DeliveryReport>> + Send {
        self.sink.next_report()
    }

    #[inline]
    fn try_report(&mut self) -> Option<DeliveryReport> {
        self.sink.try_report()
    }

    fn in_queue(&self) -> i32 {
        self.sink.in_queue()
    }

    fn purge_queued(&self) {
        self.sink.purge_queued();
    }

    fn purge(&self) {
        self.sink.purge();
    }

    fn retire(self) {
        retire(self.sink);
    }
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
