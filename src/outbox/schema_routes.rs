//! Which registered schema encodes an event's value: the subject follows
//! from `routing.subject` and the topic. Subjects are resolved before the
//! mapper is built (config validation keeps them fixed per topic), so
//! choosing one per event is a lookup among a few topics.

use std::sync::Arc;

use crate::config::routing::RoutingConfig;
use crate::config::value_format::{render_fixed_subject, ValueEncoding};
use crate::outbox::error::MappingConfigError;
use crate::outbox::registered::{RegisteredSchema, SchemaSet};

/// The topics a routing config can send to without looking at an event:
/// `routing.topic` and each rule's (all fixed when the value format is a
/// registry one: see `config::value_format::validate`).
fn fixed_topics(routing: &RoutingConfig) -> Vec<&str> {
    let mut topics: Vec<&str> = std::iter::once(routing.topic.as_str())
        .chain(routing.rules.iter().map(|r| r.topic.as_str()))
        .collect();
    topics.dedup();
    topics
}

/// Whether the value format encodes with a subject's schema (`framed`
/// values name their schema themselves).
fn has_subject(encoding: ValueEncoding) -> bool {
    matches!(encoding, ValueEncoding::Avro | ValueEncoding::JsonSchema)
}

/// Every subject the routing's events are encoded with; empty for `json`
/// and `framed`.
pub(crate) fn registry_subjects(routing: &RoutingConfig) -> Vec<String> {
    if !has_subject(routing.value_format) {
        return Vec::new();
    }
    let mut subjects: Vec<String> = fixed_topics(routing)
        .into_iter()
        .map(|t| render_fixed_subject(&routing.subject, t))
        .collect();
    subjects.sort();
    subjects.dedup();
    subjects
}

/// The schema of each topic.
#[derive(Debug)]
pub(crate) struct SchemaRoutes {
    by_topic: Vec<(Box<str>, Arc<RegisteredSchema>)>,
}

impl SchemaRoutes {
    /// `None` for the `json` and `framed` value formats. Every subject the
    /// routing needs must be in `schemas`, of the kind the format encodes
    /// with.
    pub(crate) fn new(
        routing: &RoutingConfig,
        schemas: &SchemaSet,
    ) -> Result<Option<SchemaRoutes>, MappingConfigError> {
        if !has_subject(routing.value_format) {
            return Ok(None);
        }
        let by_topic = fixed_topics(routing)
            .into_iter()
            .map(|topic| {
                let subject = render_fixed_subject(&routing.subject, topic);
                let schema = schemas
                    .get(&subject)
                    .ok_or_else(|| MappingConfigError::Invalid {
                        key: "routing.subject".into(),
                        reason: format!(
                            "no schema was fetched from the registry for subject `{subject}` \
                             (this command does not read the registry yet)"
                        ),
                    })?;
                if !schema.schema.serves(routing.value_format) {
                    return Err(MappingConfigError::Invalid {
                        key: "routing.value_format".into(),
                        reason: format!(
                            "\"{}\" cannot encode with subject `{subject}` version {} (schema id \
                             {}): it is a {} schema",
                            routing.value_format.as_str(),
                            schema.version,
                            schema.id,
                            schema.schema.type_name()
                        ),
                    });
                }
                Ok((Box::from(topic), schema.clone()))
            })
            .collect::<Result<Vec<_>, MappingConfigError>>()?;
        Ok(Some(SchemaRoutes { by_topic }))
    }

    /// The schema of events sent to `topic`.
    pub(crate) fn schema_for(&self, topic: &str) -> Option<&RegisteredSchema> {
        self.by_topic
            .iter()
            .find(|(t, _)| &**t == topic)
            .map(|(_, s)| &**s)
    }
}
