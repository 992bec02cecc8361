//! The verdicts on events Kafka refused ([`PoisonMemory`]), kept across
//! reconnects: the in-flight window asks them how each event goes out and
//! records what each refusal proved. Pure: no I/O.

use std::collections::HashMap;

use rdkafka::types::RDKafkaErrorCode;

use crate::Lsn;

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
    pub(super) fn too_large(&self) -> bool {
        use RDKafkaErrorCode as C;
        matches!(
            self.code,
            C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge
        )
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
