//! The relay's mapper: the tables' mappers (pure, see `outbox`) with the
//! registry behind them, the one place the relay asks it while running.
//!
//! - A schema the mappers have not met (the id a `framed` payload names, or
//!   a subject that varies per event, `routing.subject =
//!   "com.acme.${event_type}"`): the mapper says what it lacks
//!   (`MappingError::SchemaIdUnchecked`, `SchemaSubjectUnchecked`), this
//!   asks the registry once, tells the mappers, and maps the event again.
//!   Each id or subject is asked once, so in steady state no event costs a
//!   request.
//! - Between events it takes the newer `latest` versions the refresh task
//!   found (see `schemas::Refresh`): a version registered while the relay
//!   runs encodes the events read from then on.
//! - A payload that does not fit a `latest` subject's schema makes it read
//!   the subject's latest version once more; a newer one gets its chance
//!   before the row is given up on (`relay.on_error`).
//! - When the registry cannot be reached for any of these, the event is
//!   not mapped at all: the caller ends the session (`Reconnect::registry`,
//!   `/readyz` naming the registry) and resumes from the slot after the
//!   backoff, so nothing past the event is confirmed. One way to wait for
//!   the registry, shared with every other outage, rather than a retry
//!   loop inside the session.

use std::ops::Deref;
use std::sync::Arc;

use tokio::sync::watch;

use super::schemas::{Fetched, LatestSchemas, LatestSubjects, Refresh, SharedRegistry};
use super::settings::RelaySettings;
use crate::config::value_format::SchemaVersion;
use crate::metrics::{Health, ENCODE_FAILURES};
use crate::outbox::mapper::{MappingConfigError, MappingError};
use crate::outbox::registered::RegisteredSchema;
use crate::outbox::{KafkaRecord, OutboxEvent, TableMappers};
use crate::registry::{latest_subjects, RegistryError};

/// The tables' mappers, and what keeps their schemas current.
pub(crate) struct RelayMapper {
    tables: TableMappers,
    live: Option<LiveSchemas>,
}

/// The registry side of a [`RelayMapper`] whose tables use a registry value
/// format.
pub(super) struct LiveSchemas {
    pub(super) registry: SharedRegistry,
    /// The subjects that follow `latest` (a pinned one is never re-read),
    /// shared with the refresh task.
    pub(super) latest: LatestSubjects,
    pub(super) updates: watch::Receiver<LatestSchemas>,
    pub(super) health: Arc<Health>,
}

impl RelayMapper {
    /// The tables' mappers with the schemas fetched at start, and the task
    /// that reads the `latest` subjects again (stopped when dropped).
    pub(super) fn start(
        settings: &RelaySettings,
        fetched: Fetched,
    ) -> Result<(RelayMapper, Refresh), MappingConfigError> {
        let tables = settings.config.tables();
        let mappers = TableMappers::with_schemas(&tables, &fetched.schemas)?;
        let Some(registry) = fetched.registry else {
            return Ok((RelayMapper::new(mappers, None), Refresh::none()));
        };
        let (found, updates) = watch::channel(Vec::new());
        let latest: LatestSubjects = Arc::new(std::sync::Mutex::new(
            latest_subjects(&tables).into_iter().collect(),
        ));
        let refresh = Refresh::start(settings, &registry, &latest, found);
        let live = LiveSchemas {
            registry,
            latest,
            updates,
            health: settings.health.clone(),
        };
        Ok((RelayMapper::new(mappers, Some(live)), refresh))
    }

    pub(super) fn new(tables: TableMappers, live: Option<LiveSchemas>) -> RelayMapper {
        RelayMapper { tables, live }
    }

    /// The record for one event, or why it cannot be relayed (`Ok(Err)`);
    /// `Err` when the registry had to be asked and could not answer: the
    /// event is then neither relayed nor given up on.
    pub(crate) async fn map(
        &mut self,
        event: &OutboxEvent,
    ) -> Result<Result<KafkaRecord, MappingError>, RegistryError> {
        let Some(live) = &mut self.live else {
            return Ok(self.tables.map(event).map_err(|e| match e {
                MappingError::SchemaIdUnchecked { event_id, .. }
                | MappingError::SchemaSubjectUnchecked { event_id, .. } => {
                    MappingError::SchemaUnavailable {
                        event_id,
                        reason: "no schema registry to ask".into(),
                    }
                }
                other => other,
            }));
        };
        live.take_updates(&mut self.tables);
        let mut mapped = live.map_learning(&mut self.tables, event).await?;
        if let Err(MappingError::SchemaMismatch {
            subject, schema_id, ..
        }) = &mapped
        {
            if live.follows_latest(subject) {
                let (subject, old) = (subject.clone(), *schema_id);
                let newest = live.read_latest(&subject).await?;
                if newest.id != old && self.tables.use_latest(&newest) {
                    tracing::info!(
                        %subject,
                        version = newest.version,
                        schema_id = newest.id,
                        "a payload did not fit schema id {old}; the subject's newer version \
                         encodes from now on"
                    );
                    mapped = self.tables.map(event);
                }
            }
        }
        if let Err(e) = &mapped {
            count_encode_failure(e);
        }
        Ok(mapped)
    }
}

/// Counts a payload its value format refuses: one that does not fit its
/// subject's schema (`avro`, `json-schema`), or a `framed` payload that is
/// no frame or names an id the registry does not have (no subject there:
/// the payload names its schema itself).
fn count_encode_failure(e: &MappingError) {
    let (subject, reason) = match e {
        MappingError::SchemaMismatch { subject, kind, .. } => (subject.clone(), *kind),
        MappingError::NotFramed { .. } => (String::new(), "not_framed"),
        MappingError::UnknownSchemaId { .. } => (String::new(), "unknown_schema_id"),
        _ => return,
    };
    metrics::counter!(ENCODE_FAILURES, "subject" => subject, "reason" => reason).increment(1);
}

/// What a mapper lacks, asked of the registry.
enum Need {
    Id(u32),
    Subject(String, SchemaVersion),
}

impl LiveSchemas {
    /// Takes what the refresh task found since the last look: one atomic
    /// load when nothing is new.
    fn take_updates(&mut self, tables: &mut TableMappers) {
        if !self.updates.has_changed().unwrap_or(false) {
            return;
        }
        let newest = self.updates.borrow_and_update().clone();
        for schema in newest {
            if tables.use_latest(&schema) {
                tracing::info!(
                    subject = %schema.subject,
                    version = schema.version,
                    schema_id = schema.id,
                    "a newer version of the subject encodes from now on"
                );
            }
        }
    }

    fn follows_latest(&self, subject: &str) -> bool {
        self.latest
            .lock()
            .expect("no panic while holding the subjects")
            .contains(subject)
    }

    /// Maps the event, asking the registry first about each schema id or
    /// subject the mappers meet for the first time.
    async fn map_learning(
        &mut self,
        tables: &mut TableMappers,
        event: &OutboxEvent,
    ) -> Result<Result<KafkaRecord, MappingError>, RegistryError> {
        loop {
            let (event_id, need) = match tables.map(event) {
                Err(MappingError::SchemaIdUnchecked { event_id, id }) => (event_id, Need::Id(id)),
                Err(MappingError::SchemaSubjectUnchecked {
                    event_id,
                    subject,
                    version,
                }) => (event_id, Need::Subject(subject, version)),
                other => return Ok(other),
            };
            match need {
                Need::Id(id) => {
                    match self.told(self.registry.lock().await.has_schema_id(id).await)? {
                        Ok(schema) => tables.learn_schema_id(id, &schema),
                        Err(url) => {
                            return Ok(Err(MappingError::UnknownSchemaId { event_id, id, url }))
                        }
                    }
                }
                Need::Subject(subject, version) => {
                    let answer =
                        self.told(self.registry.lock().await.resolve(&subject, version).await);
                    let schema = match answer {
                        Ok(schema) => schema,
                        // The subject's own faults are the event's (it
                        // follows `relay.on_error`); the others the relay's.
                        Err(e) if e.is_subjects_fault() => {
                            return Ok(Err(MappingError::SchemaUnavailable {
                                event_id,
                                reason: e.to_string(),
                            }))
                        }
                        Err(e) => return Err(e),
                    };
                    tracing::info!(
                        %subject,
                        version = schema.version,
                        schema_id = schema.id,
                        "schema from the registry"
                    );
                    if version == SchemaVersion::Latest {
                        self.latest
                            .lock()
                            .expect("no panic while holding the subjects")
                            .insert(subject.clone());
                    }
                    tables.learn_subject(&subject, &schema);
                }
            }
        }
    }

    /// The subject's latest version, asked now.
    async fn read_latest(&mut self, subject: &str) -> Result<Arc<RegisteredSchema>, RegistryError> {
        let answer = self
            .registry
            .lock()
            .await
            .resolve(subject, SchemaVersion::Latest)
            .await;
        self.told(answer)
    }

    /// A registry answer, after telling the health endpoint of an outage or
    /// its end.
    fn told<T>(&self, answer: Result<T, RegistryError>) -> Result<T, RegistryError> {
        match &answer {
            Ok(_) => self.health.registry_up(),
            Err(e) if e.is_retryable() => self.health.registry_down(&e.to_string()),
            Err(_) => {}
        }
        answer
    }
}

/// The tables' mappers as they are (labels, keys and ids need no registry).
impl Deref for RelayMapper {
    type Target = TableMappers;

    fn deref(&self) -> &TableMappers {
        &self.tables
    }
}

#[cfg(test)]
#[path = "mapping_tests.rs"]
mod tests;
