//! Events that cannot be delivered as they are, and the `relay.on_error`
//! policy for them: which events are poison ([`PoisonMemory`], kept across
//! reconnects) and what becomes of one ([`Session::poisoned`]: a copy on the
//! dead-letter topic in its place, or a halt before it).

use std::collections::HashMap;
use std::sync::Arc;

use rdkafka::types::RDKafkaErrorCode;
use tokio::time::Instant;

use super::{InFlight, Session, SessionEnd};
use crate::config::OnError;
use crate::metrics as m;
use crate::outbox::{KafkaRecord, OutboxEvent};
use crate::progress::DeliveryId;
use crate::relay::{dead_letter, RelayError};
use crate::Lsn;

/// `reason` values of the dead-letter counter (see [`Cause::label`]).
pub(crate) const DEAD_LETTER_REASONS: [&str; 2] = ["mapping", "delivery"];

/// An event's place in the WAL, stable across reconnects: its transaction's
/// commit LSN and its position within the transaction.
pub(super) type EventIdentity = (Lsn, u32);

/// Events the broker refused, remembered across reconnects.
///
/// A broker refuses a whole batch when one record in it is too large, so a
/// broker-reported per-event failure only makes an event a *suspect*: sent
/// again on the next producer, it goes alone, after everything before it is
/// acked. Refused again alone, it is *confirmed* poison and the policy
/// applies without another try (which would only end the producer again).
#[derive(Default)]
pub(crate) struct PoisonMemory(HashMap<EventIdentity, Verdict>);

#[derive(Clone)]
pub(super) enum Verdict {
    Suspect,
    Confirmed(Refusal),
}

/// Why Kafka will not take a record: librdkafka's code and description.
#[derive(Clone, Debug)]
pub(super) struct Refusal {
    pub(super) code: RDKafkaErrorCode,
    pub(super) error: String,
}

impl Refusal {
    /// Refused for its size: the DLQ copy goes without the value.
    fn too_large(&self) -> bool {
        use RDKafkaErrorCode as C;
        matches!(
            self.code,
            C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge
        )
    }
}

/// Why an event goes to the `on_error` policy.
pub(super) enum Cause {
    /// It cannot be mapped to a record (the mapping error's text).
    Mapping(String),
    /// Kafka refused its record.
    Refused(Refusal),
}

impl Cause {
    /// The `reason` label of the dead-letter counter.
    fn label(&self) -> &'static str {
        match self {
            Cause::Mapping(_) => DEAD_LETTER_REASONS[0],
            Cause::Refused(_) => DEAD_LETTER_REASONS[1],
        }
    }

    fn error(&self) -> &str {
        match self {
            Cause::Mapping(e) => e,
            Cause::Refused(r) => &r.error,
        }
    }
}

impl PoisonMemory {
    /// The verdict on an event, if it has one.
    pub(super) fn verdict(&self, identity: &EventIdentity) -> Option<Verdict> {
        // Asked once per event and nearly always empty: skip the lookup then.
        if self.0.is_empty() {
            None
        } else {
            self.0.get(identity).cloned()
        }
    }

    /// Gives an event a verdict, replacing any earlier one.
    pub(super) fn judge(&mut self, identity: EventIdentity, verdict: Verdict) {
        self.0.insert(identity, verdict);
    }

    /// Forgets an event's verdict.
    pub(super) fn acquit(&mut self, identity: &EventIdentity) {
        self.0.remove(identity);
    }
}

/// How far a poison event got before `on_error` applied to it.
pub(super) enum Stage {
    /// Mapping failed: there is no record, only the raw event.
    Unmapped,
    /// Mapped but known poison, so never sent: it holds no tracker slot.
    Mapped(KafkaRecord),
    /// Kafka refused it when it was handed over. Its tracker slot stays; the
    /// DLQ copy (or nothing, when halted) is what acks it.
    Refused {
        record: KafkaRecord,
        id: DeliveryId,
        received_at: Instant,
    },
}

impl<'a> Session<'a> {
    /// Applies `on_error` to an event that cannot be delivered as it is:
    /// sends a copy to the dead-letter topic in its place, or halts.
    pub(super) async fn poisoned(
        &mut self,
        event: OutboxEvent,
        identity: EventIdentity,
        stage: Stage,
        cause: Cause,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let error = cause.error();
        let Some(dlq) = self.dead_letter_topic() else {
            let what = match stage {
                Stage::Refused { .. } => format!(
                    "Kafka refused an event of transaction {} (commit LSN {})",
                    event.xid, event.commit_lsn
                ),
                Stage::Unmapped | Stage::Mapped(_) => format!(
                    "event in transaction {} (commit LSN {}) cannot be delivered",
                    event.xid, event.commit_lsn
                ),
            };
            self.halt(format!(
                "{what}: {error}; the relay will not move past it (relay.on_error = \"stop\")"
            ));
            if let Stage::Refused {
                record,
                id,
                received_at,
            } = stage
            {
                // Held, never sent: its tracker slot keeps the slot below it.
                self.hold_for_resend(InFlight {
                    id,
                    record,
                    event,
                    identity,
                    dead_lettered: false,
                    isolated: false,
                    received_at,
                });
            }
            return Ok(None);
        };
        let dlq_record = match &stage {
            Stage::Unmapped => {
                let (key, id) = self.mapper.key_and_id(&event);
                dead_letter::from_unmappable(&event, dlq, error, key, id)
            }
            Stage::Mapped(record) | Stage::Refused { record, .. } => {
                let too_large = matches!(&cause, Cause::Refused(r) if r.too_large());
                dead_letter::from_record(record, dlq, &event, cause.label(), error, too_large)
            }
        };
        tracing::warn!(lsn = %event.commit_lsn, xid = event.xid, %error, "event sent to the dead-letter topic");
        let table = self.mapper.label(&event).to_owned();
        metrics::counter!(m::EVENTS_DEAD_LETTERED, "reason" => cause.label(), "table" => table)
            .increment(1);
        self.ensure_topic(dlq).await?;
        let (id, received_at) = match stage {
            Stage::Refused {
                id, received_at, ..
            } => (id, received_at),
            Stage::Unmapped | Stage::Mapped(_) => {
                (self.tracker.push_event(dlq_record.size), self.received_at)
            }
        };
        Box::pin(self.enqueue(InFlight {
            id,
            record: dlq_record,
            event,
            identity,
            dead_lettered: true,
            isolated: false,
            received_at,
        }))
        .await
    }

    /// The dead-letter topic refused an event's copy too: nothing is left to
    /// try. The entry is held (never sent while halted), keeping its tracker
    /// slot.
    pub(super) fn dead_letter_refused(&mut self, entry: InFlight, error: &str) {
        self.halt(format!(
            "the dead-letter topic refused an event too: {error}"
        ));
        self.hold_for_resend(entry);
    }

    /// Where poison goes: the dead-letter topic, or `None` for a halt.
    fn dead_letter_topic(&self) -> Option<&'a Arc<str>> {
        let settings = self.settings;
        match (&settings.config.relay.on_error, &settings.dead_letter_topic) {
            (OnError::DeadLetter, Some(dlq)) => Some(dlq),
            _ => None,
        }
    }
}
