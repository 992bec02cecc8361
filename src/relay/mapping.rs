//! The relay's mapper: the tables' mappers (pure, see `outbox`) with their
//! schemas kept current while the relay runs.
//!
//! - Between events it takes the newer `latest` versions the refresh task
//!   found (see `schemas::Refresh`): a version registered while the relay
//!   runs encodes the events read from then on.
//! - A payload that does not fit a `latest` subject's schema makes it read
//!   the subject's latest version once more; a newer one gets its chance
//!   before the row is given up on (`relay.on_error`).
//! - When that read finds the registry unreachable, the event is not
//!   mapped at all: the caller ends the session and resumes from the slot
//!   after the backoff, so nothing past the event is confirmed.

use std::collections::HashSet;
use std::ops::Deref;
use std::sync::Arc;

use tokio::sync::watch;

use super::schemas::{Fetched, LatestSchemas, Refresh, SharedRegistry};
use super::settings::RelaySettings;
use crate::config::value_format::SchemaVersion;
use crate::metrics::{Health, ENCODE_FAILURES};
use crate::outbox::mapper::{MappingConfigError, MappingError};
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
    /// The subjects that follow `latest` (a pinned one is never re-read).
    pub(super) latest: HashSet<String>,
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
        let refresh = Refresh::start(settings, &registry, found);
        let live = LiveSchemas {
            registry,
            latest: latest_subjects(&tables).into_iter().collect(),
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
            return Ok(self.tables.map(event));
        };
        live.take_updates(&mut self.tables);
        let mut mapped = self.tables.map(event);
        if let Err(MappingError::SchemaMismatch {
            subject, schema_id, ..
        }) = &mapped
        {
            if live.latest.contains(subject) {
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
        if let Err(MappingError::SchemaMismatch { subject, kind, .. }) = &mapped {
            metrics::counter!(ENCODE_FAILURES, "subject" => subject.clone(), "reason" => *kind)
                .increment(1);
        }
        Ok(mapped)
    }
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

    /// The subject's latest version, asked now; an outage is told to the
    /// health endpoint.
    async fn read_latest(
        &mut self,
        subject: &str,
    ) -> Result<Arc<crate::outbox::avro::RegisteredSchema>, RegistryError> {
        let answer = self
            .registry
            .lock()
            .await
            .resolve(subject, SchemaVersion::Latest)
            .await;
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
