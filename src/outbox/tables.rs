//! Several outbox tables in one relay: each event is mapped by its own
//! table's columns and routing. A row belongs to the table pgoutput names
//! in its Relation (partitions arrive as their root, see the publication);
//! a logical decoding message to the table whose `message_prefix` it has.
//! The source only hands on events of configured tables and prefixes.

use std::sync::Arc;

use bytes::Bytes;

use crate::config::OutboxTable;
use crate::outbox::error::{MappingConfigError, MappingError};
use crate::outbox::event::{EventKind, OutboxEvent};
use crate::outbox::mapper::RecordMapper;
use crate::outbox::record::KafkaRecord;
use crate::outbox::registered::{FramedSchema, RegisteredSchema, SchemaSet};

#[derive(Debug)]
struct Entry {
    schema: String,
    name: String,
    message_prefix: Option<String>,
    /// `schema.name`, the `table` label of the event metrics.
    label: String,
    mapper: RecordMapper,
}

/// One [`RecordMapper`] per outbox table, chosen per event.
#[derive(Debug)]
pub(crate) struct TableMappers {
    /// In configuration order; never empty.
    entries: Vec<Entry>,
}

impl TableMappers {
    #[cfg(test)]
    pub(crate) fn new(tables: &[OutboxTable]) -> Result<TableMappers, MappingConfigError> {
        TableMappers::with_schemas(tables, &SchemaSet::new())
    }

    /// As [`new`](Self::new), with the registered schemas of the tables
    /// whose value format needs them (fetched before, see
    /// `registry::SchemaRegistry::schemas_for`).
    pub(crate) fn with_schemas(
        tables: &[OutboxTable],
        schemas: &SchemaSet,
    ) -> Result<TableMappers, MappingConfigError> {
        let entries = tables
            .iter()
            .map(|t| {
                Ok(Entry {
                    schema: t.table.schema().to_owned(),
                    name: t.table.name().to_owned(),
                    message_prefix: t.message_prefix.clone(),
                    label: t.label(),
                    mapper: RecordMapper::with_schemas(
                        &t.columns,
                        &t.routing,
                        &t.ce_source(),
                        schemas,
                    )?,
                })
            })
            .collect::<Result<Vec<_>, MappingConfigError>>()?;
        assert!(!entries.is_empty(), "the configuration has an outbox table");
        Ok(TableMappers { entries })
    }

    /// The entry an event belongs to. With one table, always it (as before
    /// several tables existed); otherwise by relation or prefix, the first
    /// entry when neither matches, which the source never hands on.
    fn index(&self, event: &OutboxEvent) -> usize {
        if self.entries.len() == 1 {
            return 0;
        }
        let found = match &event.kind {
            EventKind::Row(row) => self
                .entries
                .iter()
                .position(|e| e.schema == row.table.schema && e.name == row.table.name),
            EventKind::Message { prefix, .. } => self
                .entries
                .iter()
                .position(|e| e.message_prefix.as_deref() == Some(prefix.as_str())),
        };
        found.unwrap_or(0)
    }

    /// The record for one event, by its table's mapping.
    pub(crate) fn map(&mut self, event: &OutboxEvent) -> Result<KafkaRecord, MappingError> {
        let i = self.index(event);
        self.entries[i].mapper.map(event)
    }

    /// A new `latest` version of a subject, for every table whose routes
    /// follow it; whether any schema was replaced.
    pub(crate) fn use_latest(&mut self, schema: &Arc<RegisteredSchema>) -> bool {
        let mut changed = false;
        for e in &mut self.entries {
            changed |= e.mapper.use_latest(schema);
        }
        changed
    }

    /// Notes that the registry has a schema with `id` (every table: the
    /// registry's ids are global).
    pub(crate) fn learn_schema_id(&mut self, id: u32, schema: &FramedSchema) {
        for e in &mut self.entries {
            e.mapper.learn_schema_id(id, schema.clone());
        }
    }

    /// Remembers `schema` as `subject`'s, for every table (one registry
    /// serves them all).
    pub(crate) fn learn_subject(&mut self, subject: &str, schema: &Arc<RegisteredSchema>) {
        for e in &mut self.entries {
            e.mapper.learn_subject(subject, schema);
        }
    }

    pub(crate) fn key_and_id(&self, event: &OutboxEvent) -> (Option<Bytes>, Option<Bytes>) {
        self.entries[self.index(event)].mapper.key_and_id(event)
    }

    /// The `table` metric label of an event (`schema.name`).
    pub(crate) fn label(&self, event: &OutboxEvent) -> &str {
        &self.entries[self.index(event)].label
    }

    /// Every table's label, for registering the labelled metrics at start.
    pub(crate) fn labels(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.label.as_str())
    }
}
