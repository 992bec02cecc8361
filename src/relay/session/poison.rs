//! Events that cannot be delivered as they are, and the `relay.on_error`
//! policy for them: what becomes of one ([`Session::dead_letter`]: a copy
//! on the dead-letter topic in its place, or a halt before it). Which
//! events are poison is the window's to know (see `verdicts`).

use std::sync::Arc;

use super::mode::DeliveryMode;
use super::parts::Session;
use super::telemetry::TelemetryEvent;
use super::verdicts::{EventIdentity, Refusal};
use super::window::{Halt, InFlight};
use crate::config::OnError;
use crate::outbox::{KafkaRecord, OutboxEvent};
use crate::relay::dead_letter;
use crate::relay::error::RelayError;

/// `reason` values of the dead-letter counter: a mapping failed, or Kafka
/// refused the record.
pub(crate) const DEAD_LETTER_REASONS: [&str; 2] = ["mapping", "delivery"];

/// An event that cannot be delivered as it is, and how far it got.
pub(super) enum Undeliverable {
    /// Mapping failed: there is no record, only the raw event.
    Unmapped {
        event: OutboxEvent,
        identity: EventIdentity,
        error: String,
    },
    /// Mapped but known poison, so never sent: it holds no tracker slot.
    KnownPoison {
        event: OutboxEvent,
        identity: EventIdentity,
        record: KafkaRecord,
        refusal: Refusal,
    },
    /// Kafka refused it when it was handed over. Its tracker slot stays; the
    /// DLQ copy (or nothing, when halted) is what acks it.
    Refused { entry: InFlight, refusal: Refusal },
}

impl Undeliverable {
    fn event(&self) -> &OutboxEvent {
        match self {
            Undeliverable::Unmapped { event, .. } | Undeliverable::KnownPoison { event, .. } => {
                event
            }
            Undeliverable::Refused { entry, .. } => &entry.event,
        }
    }

    /// The `reason` label of the dead-letter counter, and the error.
    fn cause(&self) -> (&'static str, &str) {
        match self {
            Undeliverable::Unmapped { error, .. } => (DEAD_LETTER_REASONS[0], error),
            Undeliverable::KnownPoison { refusal, .. } | Undeliverable::Refused { refusal, .. } => {
                (DEAD_LETTER_REASONS[1], &refusal.error)
            }
        }
    }

    /// Why the relay halts before it under `on_error = "stop"`, and the
    /// entry to hold (a refused one keeps its tracker slot, never sent).
    fn halt(self) -> (Halt, Option<InFlight>) {
        match self {
            Undeliverable::Unmapped { event, error, .. } => (
                Halt::Undeliverable {
                    xid: event.xid,
                    commit_lsn: event.commit_lsn,
                    error,
                },
                None,
            ),
            Undeliverable::KnownPoison { event, refusal, .. } => (
                Halt::Undeliverable {
                    xid: event.xid,
                    commit_lsn: event.commit_lsn,
                    error: refusal.error,
                },
                None,
            ),
            Undeliverable::Refused { entry, refusal } => (
                Halt::Refused {
                    xid: entry.event.xid,
                    commit_lsn: entry.event.commit_lsn,
                    error: refusal.error,
                },
                Some(entry),
            ),
        }
    }
}

impl<'a, D: DeliveryMode> Session<'a, D> {
    /// Applies `on_error` to an event that cannot be delivered as it is:
    /// its copy on the dead-letter topic, for the caller to send in its
    /// place, or a halt before it (`None`). Sends nothing itself.
    pub(super) async fn dead_letter(
        &mut self,
        poison: Undeliverable,
    ) -> Result<Option<InFlight>, RelayError> {
        let Some(dlq) = self.dead_letter_topic() else {
            let (halt, held) = poison.halt();
            self.halt(halt);
            if let Some(entry) = held {
                // Held, never sent: its tracker slot keeps the slot below it.
                self.window.hold(entry);
            }
            return Ok(None);
        };
        let copy = match &poison {
            Undeliverable::Unmapped { event, error, .. } => {
                let (key, id) = self.mapper.key_and_id(event);
                dead_letter::from_unmappable(event, dlq, error, key, id)
            }
            Undeliverable::KnownPoison {
                event,
                record,
                refusal,
                ..
            } => dead_letter::from_record(
                record,
                dlq,
                event,
                DEAD_LETTER_REASONS[1],
                &refusal.error,
                refusal.too_large(),
            ),
            Undeliverable::Refused { entry, refusal } => dead_letter::from_record(
                &entry.record,
                dlq,
                &entry.event,
                DEAD_LETTER_REASONS[1],
                &refusal.error,
                refusal.too_large(),
            ),
        };
        // The topic first: without it (say no DESCRIBE on it) the relay
        // stops, and no line or count may say the copy went out.
        self.ensure_topic(dlq).await?;
        let (reason, error) = poison.cause();
        let event = poison.event();
        self.telemetry.emit(TelemetryEvent::DeadLettered {
            event,
            table: self.mapper.label(event),
            reason,
            error,
        });
        Ok(Some(match poison {
            Undeliverable::Refused { entry, .. } => entry.into_dead_letter(copy),
            Undeliverable::Unmapped {
                event, identity, ..
            }
            | Undeliverable::KnownPoison {
                event, identity, ..
            } => self
                .window
                .admit(event, copy, identity, true, self.stream.received_at),
        }))
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
