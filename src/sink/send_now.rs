//! Adaptive batching: records wait `linger.ms` for batch mates only while
//! more are coming.
//!
//! librdkafka holds a record up to `linger.ms` so that later ones share its
//! produce request. In a backlog drain that is what keeps the cost per event
//! low; at a trickle it is pure latency, since no mate is coming. The relay
//! knows which case it is in: when the walsender's keepalive comes between
//! transactions, it asks for the queue to go out now. The walsender sends
//! one each time its reader reaches the end of the WAL it knew to be flushed
//! (PostgreSQL's `WalSndWaitForWal`, before it looks for more): at the head
//! of the WAL, never in the middle of a backlog written before.
//!
//! librdkafka's only way to cut a linger short is `rd_kafka_flush`: for as
//! long as the call lasts, every broker thread treats the linger as expired.
//! The call blocks until the queue is empty or its timeout, so it runs on a
//! thread of its own, with the timeout set to the linger itself: a record
//! never waits longer than it would have anyway, and the relay's task never
//! blocks. Requests coalesce: asking while a flush runs costs nothing.

use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Weak};

use rdkafka::producer::{Producer, ThreadedProducer};

use super::delivery::DeliveryContext;

/// Handle to the thread that cuts lingers short. Dropping it ends the thread.
pub(crate) struct SendNow {
    wake: SyncSender<()>,
}

impl SendNow {
    /// Starts the thread, or `None` when there is no linger to cut short
    /// (`linger_ms` 0) or the thread cannot start (then records simply
    /// linger, as without this).
    pub(crate) fn start(
        producer: &Arc<ThreadedProducer<DeliveryContext>>,
        linger_ms: u32,
    ) -> Option<SendNow> {
        if linger_ms == 0 {
            return None;
        }
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        let producer: Weak<ThreadedProducer<DeliveryContext>> = Arc::downgrade(producer);
        let timeout_ms = i32::try_from(linger_ms).unwrap_or(i32::MAX);
        let run = move || {
            while woken.recv().is_ok() {
                let Some(producer) = producer.upgrade() else {
                    return;
                };
                // Its only effect that matters here is the expired linger
                // while it lasts; a timeout is the normal outcome under load.
                // SAFETY: the pointer is the live producer's handle, kept
                // alive by `producer` for the whole call; rd_kafka_flush is
                // thread-safe and, with delivery reports as events (as
                // rdkafka configures them), serves no callbacks here, so
                // reports stay on librdkafka's polling thread, in order.
                unsafe {
                    rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), timeout_ms);
                }
            }
        };
        match std::thread::Builder::new()
            .name("outboxd-kafka-send-now".into())
            .spawn(run)
        {
            Ok(_) => Some(SendNow { wake }),
            Err(e) => {
                tracing::debug!(error = %e, "cannot start the send-now thread; records wait for linger.ms");
                None
            }
        }
    }

    /// Asks for what is queued to go out now. Never blocks.
    pub(crate) fn request(&self) {
        match self.wake.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) => {}
            Err(TrySendError::Disconnected(())) => {}
        }
    }
}
