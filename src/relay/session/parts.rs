//! What a session is made of, owner by owner: what the relay lends it
//! ([`Lent`]), the replication stream as the loop knows it ([`Stream`]),
//! the window, the delivery mode and the rest ([`Session`]); and how it
//! ends ([`SessionEnd`]). The loop that drives it is the parent module's;
//! what each delivery mode does with it, the modes'.

use std::collections::VecDeque;

use tokio::sync::watch;
use tokio::time::Instant;

use super::super::ledger::RelayLedger;
use super::super::settings::RelaySettings;
use super::super::slot_record::SlotRecord;
use super::super::table_watch::{TableBaseline, TableWatch};
use super::super::telemetry::ReconnectCause;
use super::telemetry::Telemetry;
use super::verdicts::PoisonMemory;
use super::window::Window;
use crate::outbox::TableMappers;
use crate::progress::ledger::LedgerWriter;
use crate::registry::SchemaRegistry;
use crate::sink::TopicManager;
use crate::source::driver::{SourceHandle, StatusUpdates, Streamed};

pub(crate) enum SessionEnd {
    Shutdown,
    /// Kafka-side trouble: reconnect, resuming from the slot.
    Reconnect(Reconnect),
}

/// Why a session ends for a reconnect: the metric's cause and the message.
pub(crate) struct Reconnect {
    pub(in crate::relay) cause: ReconnectCause,
    pub(in crate::relay) detail: String,
}

impl Reconnect {
    /// A delivery failed: Kafka may have a gap after it.
    pub(in crate::relay) fn delivery(detail: impl std::fmt::Display) -> SessionEnd {
        SessionEnd::Reconnect(Reconnect {
            cause: ReconnectCause::KafkaDelivery,
            detail: format!("delivery failed: {detail}"),
        })
    }

    /// The producer's report channel closed.
    pub(in crate::relay) fn producer_stopped() -> SessionEnd {
        SessionEnd::Reconnect(Reconnect {
            cause: ReconnectCause::Kafka,
            detail: "Kafka producer stopped".into(),
        })
    }
}

/// What the relay lends each session: the state that outlives it (see
/// `RelayState`).
pub(in crate::relay) struct Lent<'a> {
    pub(in crate::relay) mapper: &'a mut TableMappers,
    /// `Some` when a table's value format meets schema ids or subjects
    /// only at run time (`framed`).
    pub(in crate::relay) registry: &'a mut Option<SchemaRegistry>,
    pub(in crate::relay) poison: &'a mut PoisonMemory,
    pub(in crate::relay) ledger: &'a mut RelayLedger,
    pub(in crate::relay) slot: &'a mut SlotRecord,
    pub(in crate::relay) tables: &'a mut TableBaseline,
    pub(in crate::relay) stop: watch::Receiver<bool>,
}

/// The replication stream, as the loop knows it.
pub(super) struct Stream {
    /// The driver.
    pub(super) source: SourceHandle,
    /// Its status updates, which wake the loop to offer the ledger what
    /// was confirmed.
    pub(super) status_updates: StatusUpdates,
    /// When the message being processed arrived.
    pub(super) received_at: Instant,
    /// The walsender said it has nothing more for now (a keepalive between
    /// transactions) since the last item: the stream is idle.
    pub(super) idle: bool,
    /// The driver said the open transaction is complete after a drain
    /// request: nothing more comes.
    pub(super) drained: bool,
    /// Read while the producer was busy (a commit under way), in WAL
    /// order: handled once it takes records again, before anything newer.
    pub(super) backlog: VecDeque<Streamed>,
}

pub(super) struct Session<'a, D> {
    pub(super) settings: &'a RelaySettings,
    /// Owned by the relay, lent for this session.
    pub(super) mapper: &'a mut TableMappers,
    pub(super) registry: &'a mut Option<SchemaRegistry>,
    pub(super) ledger: &'a mut RelayLedger,
    /// Told that the stream opened and what the driver confirmed, for the
    /// relay's decisions about the slot.
    pub(super) slot: &'a mut SlotRecord,
    pub(super) stop: watch::Receiver<bool>,
    /// Owned by the session: the stream, and the watch that keeps its
    /// confirmation behind the last look that found the outbox table
    /// intact (and reports a change).
    pub(super) stream: Stream,
    pub(super) table_watch: TableWatch,
    /// What is in flight: every decision about it is the window's.
    pub(super) window: Window<'a>,
    /// The producer, and the state of the delivery mode's own policy.
    pub(super) delivery: D,
    pub(super) topics: TopicManager,
    /// Makes the position ledger's entries; `None` before the server is
    /// known.
    pub(super) ledger_writer: Option<LedgerWriter>,
    pub(super) telemetry: Telemetry,
    /// Once a shutdown was asked for: when the drain gives up.
    pub(super) drain_deadline: Option<Instant>,
}

impl<D> Drop for Session<'_, D> {
    /// The driver may have confirmed past filtered changes since the loop
    /// last counted them: count them before the session is gone.
    fn drop(&mut self) {
        self.telemetry.filtered(self.stream.source.reported());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dashboards and alerts select on these values.
    #[test]
    fn reconnect_causes_keep_their_metric_labels() {
        let labels = ReconnectCause::ALL.map(ReconnectCause::label);
        assert_eq!(labels, ["kafka_delivery", "kafka", "postgres"]);
        match Reconnect::delivery("timed out") {
            SessionEnd::Reconnect(r) => {
                assert_eq!(r.cause, ReconnectCause::KafkaDelivery);
                assert_eq!(r.detail, "delivery failed: timed out");
            }
            SessionEnd::Shutdown => panic!("a delivery failure is no shutdown"),
        }
    }
}
