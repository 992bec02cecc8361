//! Mapping an event whose value needs a schema the mapper has not met: the
//! schema id a `framed` payload names, or a subject that varies per event
//! (`routing.subject = "com.acme.${event_type}"`). The mapper is pure, so it
//! says what it lacks (`MappingError::SchemaIdUnchecked`,
//! `SchemaSubjectUnchecked`); the session asks the registry, tells the
//! mapper, and maps the event again. Each id or subject is asked once, so in
//! steady state no event costs a request.
//!
//! While the registry cannot be reached, the session waits here with the
//! reconnect backoff: nothing after the event is read, sent or confirmed.

use std::sync::Arc;

use super::mode::DeliveryMode;
use super::parts::{Session, SessionEnd};
use crate::config::value_format::SchemaVersion;
use crate::outbox::mapper::MappingError;
use crate::outbox::registered::RegisteredSchema;
use crate::outbox::{KafkaRecord, OutboxEvent};
use crate::registry::{RegistryError, SchemaRegistry};
use crate::relay::error::RelayError;

/// What became of an event.
pub(super) enum Mapped {
    Record(KafkaRecord),
    /// Why it cannot be a record: for `on_error`.
    Unmapped(MappingError),
    /// A shutdown was asked for while waiting for the registry: the session
    /// ends without draining, so nothing more is confirmed (the records in
    /// flight are sent again after a restart: duplicates, never a loss).
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

/// What the mapper lacks.
enum Need {
    Id(u32),
    Subject(String, SchemaVersion),
}

/// The registry's answer about a need.
enum Answer {
    /// The id exists.
    Id,
    Schema(Arc<RegisteredSchema>),
    /// Not there: the reason, for the event's error.
    Missing(MappingError),
}

impl<D: DeliveryMode> Session<'_, D> {
    /// Maps the event, asking the registry about a schema id or subject met
    /// for the first time. `Err` for a registry error no event can fix
    /// (wrong credentials).
    pub(super) async fn map_event(&mut self, event: &OutboxEvent) -> Result<Mapped, RelayError> {
        loop {
            let (event_id, need) = match self.mapper.map(event) {
                Err(MappingError::SchemaIdUnchecked { event_id, id }) => (event_id, Need::Id(id)),
                Err(MappingError::SchemaSubjectUnchecked {
                    event_id,
                    subject,
                    version,
                }) => (event_id, Need::Subject(subject, version)),
                other => return Ok(other.into()),
            };
            let Some(registry) = self.registry.as_mut() else {
                return Ok(Mapped::Unmapped(MappingError::SchemaUnavailable {
                    event_id,
                    reason: "no schema registry to ask".into(),
                }));
            };
            let relay = &self.settings.config.relay;
            let mut backoff = relay.reconnect_backoff_min;
            let answer = loop {
                match ask(registry, &event_id, &need).await {
                    Ok(answer) => break answer,
                    Err(e) if e.is_retryable() => {
                        tracing::warn!(error = %e, ?backoff, "asking the schema registry again");
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
            match (answer, need) {
                (Answer::Id, Need::Id(id)) => self.mapper.learn_schema_id(id),
                (Answer::Schema(schema), Need::Subject(subject, _)) => {
                    tracing::info!(
                        subject = %subject,
                        version = schema.version,
                        schema_id = schema.id,
                        "schema from the registry"
                    );
                    self.mapper.learn_subject(&subject, &schema);
                }
                (Answer::Missing(e), _) => return Ok(Mapped::Unmapped(e)),
                _ => unreachable!("an answer of the kind asked"),
            }
        }
    }
}

/// Asks the registry about `need`. Errors about the subject itself (it does
/// not exist, has no such version, or its schema does not parse) are the
/// event's; the others (outage, credentials) the relay's.
async fn ask(
    registry: &mut SchemaRegistry,
    event_id: &str,
    need: &Need,
) -> Result<Answer, RegistryError> {
    let missing = |reason: String| {
        Answer::Missing(MappingError::SchemaUnavailable {
            event_id: event_id.to_owned(),
            reason,
        })
    };
    match need {
        Need::Id(id) => Ok(match registry.has_schema_id(*id).await? {
            Ok(()) => Answer::Id,
            Err(url) => Answer::Missing(MappingError::UnknownSchemaId {
                event_id: event_id.to_owned(),
                id: *id,
                url,
            }),
        }),
        Need::Subject(subject, version) => match registry.resolve(subject, *version).await {
            Ok(schema) => Ok(Answer::Schema(schema)),
            Err(
                e @ (RegistryError::SubjectNotFound { .. }
                | RegistryError::VersionNotFound { .. }
                | RegistryError::BadSchema { .. }),
            ) => Ok(missing(e.to_string())),
            Err(e) => Err(e),
        },
    }
}
