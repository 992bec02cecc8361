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
//! **Transactional** (exactly-once, not built yet) fits the same seam
//! without a change to the window. It will have to:
//! - initialise transactions with a `transactional.id` derived from the
//!   ledger key, in [`Delivery::open`], and only in a session that holds the
//!   slot (a standby never does, so it fences nobody);
//! - begin a Kafka transaction before its first record, and commit it at a
//!   database transaction's end ([`Delivery::checkpoint`]) once its event or
//!   time limit is reached or the stream is idle, with the ledger entry for
//!   the last position it holds sent inside it; a database transaction above
//!   the limit is split, its entries saying how far into it each reached;
//! - withhold every report of the open transaction and hand the reports over
//!   only once the commit succeeded: an acknowledgement then means "visible
//!   to `read_committed` consumers", so the window confirms the slot only up
//!   to committed transactions while knowing nothing of transactions;
//! - on an abort, report the open transaction's records as purged (a failure
//!   that ends with the producer): the window holds them and the session
//!   sends them again, in WAL order, in the next transaction; a fencing is
//!   an outage the session must not retry (it ends or stands by);
//! - keep a dead-letter copy in the transaction of the rest of its database
//!   transaction (the session sends it through the same [`Delivery::send`]);
//! - make librdkafka's blocking calls (init, commit, abort) off the async
//!   thread, and answer [`Delivery::in_queue`] with what is not committed.

use std::future::Future;
use std::sync::Arc;

use crate::metrics as m;
use crate::outbox::KafkaRecord;
use crate::progress::ledger::CommitPosition;
use crate::progress::DeliveryId;
use crate::relay::{RelayError, RelaySettings};
use crate::sink::{DeliveryReport, KafkaSink, QueueBound, SendError};

/// What the session asks of Kafka. Records are handed over from the
/// session's one task in WAL order; reports come back by delivery id.
pub(super) trait Delivery: Sized {
    /// A producer for a session, or a fresh one after a refusal ended the
    /// last.
    fn open(settings: &RelaySettings) -> Result<Self, RelayError>;

    /// Hands one record over; its report comes back with `id`.
    fn send(&self, id: DeliveryId, record: &KafkaRecord) -> Result<(), SendError>;

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
}

/// Today's mode: an idempotent producer whose acknowledgements are final.
pub(super) struct AtLeastOnce {
    sink: KafkaSink,
}

impl Delivery for AtLeastOnce {
    /// Delivery reports on the producer's channel, statistics to the health
    /// endpoint when there is one.
    fn open(settings: &RelaySettings) -> Result<Self, RelayError> {
        let health = &settings.health;
        // Statistics feed only the endpoint's gauges: none without one.
        let metrics_on = settings.config.metrics.listen.is_some();
        let stats = metrics_on.then(|| m::kafka::stats_hook(Arc::clone(health)));
        let window = QueueBound::of(&settings.config.relay);
        let sink = KafkaSink::with_stats(&settings.brokers, &settings.config.kafka, window, stats)?;
        health.new_producer();
        // Ready as soon as a broker answers, not at the first statistics or
        // ack. On librdkafka's thread, so straight to the shared state.
        let health = Arc::clone(health);
        sink.when_connected(move || health.kafka_broker_up());
        Ok(AtLeastOnce { sink })
    }

    #[inline]
    fn send(&self, id: DeliveryId, record: &KafkaRecord) -> Result<(), SendError> {
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
        // Destroying a librdkafka client joins its threads: not on this one.
        tokio::task::spawn_blocking(move || drop(self.sink));
    }
}
