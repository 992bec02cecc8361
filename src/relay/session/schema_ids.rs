//! Mapping an event whose value names a schema the mapper has not met: the
//! schema ids of `framed` payloads. The mapper is pure, so it says what it
//! lacks (`MappingError::SchemaIdUnchecked`); the session asks the registry,
//! tells the mapper, and maps the event again. An id is asked once, so in
//! steady state no event costs a request.
//!
//! While the registry cannot be reached, the session waits here with the
//! reconnect backoff: nothing after the event is read, sent or confirmed.

use super::mode::DeliveryMode;
use super::parts::{Session, SessionEnd};
use crate::outbox::mapper::MappingError;
use crate::outbox::{KafkaRecord, OutboxEvent};
use crate::relay::error::RelayError;

/// What became of an event.
pub(super) enum Mapped {
    Record(KafkaRecord),
    /// Why it cannot be a record: for `on_error`.
    Unmapped(MappingError),
    /// A shutdown was asked for while waiting for the registry.
    Stopped(SessionEnd),
}

impl From<Result<KafkaRecord, MappingError>> for Mapped {
    fn from(r: Result<KafkaRecord, MappingError>) -> Mapped {
        match r {
            Ok(record) => Mapped::Record(record),
            Err(e) => Mapped::Unmapped(e),
        }
    }
}

impl<D: DeliveryMode> Session<'_, D> {
    /// Maps the event, asking the registry about a schema id met for the
    /// first time. `Err` for a registry error no event can fix (wrong
    /// credentials).
    pub(super) async fn map_event(&mut self, event: &OutboxEvent) -> Result<Mapped, RelayError> {
        loop {
            let (event_id, id) = match self.mapper.map(event) {
                Err(MappingError::SchemaIdUnchecked { event_id, id }) => (event_id, id),
                other => return Ok(other.into()),
            };
            let Some(registry) = self.registry.as_mut() else {
                return Ok(Mapped::Unmapped(MappingError::SchemaIdUnchecked {
                    event_id,
                    id,
                }));
            };
            let relay = &self.settings.config.relay;
            let mut backoff = relay.reconnect_backoff_min;
            let found = loop {
                match registry.has_schema_id(id).await {
                    Ok(found) => break found,
                    Err(e) if e.is_retryable() => {
                        tracing::warn!(error = %e, ?backoff, schema_id = id, "asking the schema registry again");
                        let mut stop = self.stop.clone();
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = stop.wait_for(|s| *s) => return Ok(Mapped::Stopped(SessionEnd::Shutdown)),
                        }
                        backoff = (backoff * 2).min(relay.reconnect_backoff_max);
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            match found {
                Ok(()) => self.mapper.learn_schema_id(id),
                Err(url) => {
                    return Ok(Mapped::Unmapped(MappingError::UnknownSchemaId {
                        event_id,
                        id,
                        url,
                    }));
                }
            }
        }
    }
}
