//! Which registered schema encodes an event's value: the subject follows
//! from `routing.subject` and the topic. Subjects are resolved before the
//! mapper is built (config validation keeps them fixed per topic), so
//! choosing one per event is a lookup among a few topics.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::routing::RoutingConfig;
use crate::config::value_format::{render_fixed_subject, SchemaVersion, ValueEncoding};
use crate::outbox::avro::schema::RegisteredSchema;
use crate::outbox::error::MappingConfigError;

/// Registered schemas by subject, as fetched for the relay's start.
pub(crate) type SchemaSet = HashMap<String, Arc<RegisteredSchema>>;

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

/// Every subject the routing's events are encoded with; empty for `json`.
pub(crate) fn avro_subjects(routing: &RoutingConfig) -> Vec<String> {
    if routing.value_format != ValueEncoding::Avro {
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
pub(crate) struct AvroRoutes {
    by_topic: Vec<(Box<str>, Arc<RegisteredSchema>)>,
    /// `routing.schema_version = "latest"`: a newer version replaces the
    /// schema (see [`AvroRoutes::use_latest`]).
    latest: bool,
}

impl AvroRoutes {
    /// `None` for the `json` value format. Every subject the routing needs
    /// must be in `schemas`.
    pub(crate) fn new(
        routing: &RoutingConfig,
        schemas: &SchemaSet,
    ) -> Result<Option<AvroRoutes>, MappingConfigError> {
        if routing.value_format != ValueEncoding::Avro {
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
                Ok((Box::from(topic), schema.clone()))
            })
            .collect::<Result<Vec<_>, MappingConfigError>>()?;
        Ok(Some(AvroRoutes {
            by_topic,
            latest: routing.schema_version == SchemaVersion::Latest,
        }))
    }

    /// A version of one of its subjects the registry now calls `latest`:
    /// from now on it encodes that subject's events, unless the version is
    /// pinned. Whether anything changed.
    pub(crate) fn use_latest(&mut self, schema: &Arc<RegisteredSchema>) -> bool {
        if !self.latest {
            return false;
        }
        let mut changed = false;
        for (_, s) in &mut self.by_topic {
            if s.subject == schema.subject && s.id != schema.id {
                *s = schema.clone();
                changed = true;
            }
        }
        changed
    }

    /// The schema of events sent to `topic`.
    pub(crate) fn schema_for(&self, topic: &str) -> Option<&RegisteredSchema> {
        self.by_topic
            .iter()
            .find(|(t, _)| &**t == topic)
            .map(|(_, s)| &**s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::avro::AvroSchema;

    fn registered(id: u32, version: u32) -> Arc<RegisteredSchema> {
        Arc::new(RegisteredSchema {
            id,
            subject: "orders-value".into(),
            version,
            avro: AvroSchema::parse(r#""long""#).unwrap(),
        })
    }

    fn routes(version: SchemaVersion) -> AvroRoutes {
        let routing = RoutingConfig {
            topic: "orders".into(),
            value_format: ValueEncoding::Avro,
            schema_version: version,
            ..RoutingConfig::default()
        };
        let schemas = SchemaSet::from([("orders-value".to_owned(), registered(7, 1))]);
        AvroRoutes::new(&routing, &schemas).unwrap().unwrap()
    }

    #[test]
    fn a_newer_latest_version_replaces_the_schema_unless_pinned() {
        let mut latest = routes(SchemaVersion::Latest);
        assert!(!latest.use_latest(&registered(7, 1)), "the same id");
        assert!(latest.use_latest(&registered(9, 2)));
        assert_eq!(latest.schema_for("orders").unwrap().id, 9);
        let other = Arc::new(RegisteredSchema {
            subject: "payments-value".into(),
            ..(*registered(11, 1)).clone()
        });
        assert!(!latest.use_latest(&other), "another subject");

        let mut pinned = routes(SchemaVersion::Number(1));
        assert!(!pinned.use_latest(&registered(9, 2)));
        assert_eq!(pinned.schema_for("orders").unwrap().id, 7);
    }
}
