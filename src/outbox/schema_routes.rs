//! Which registered schema encodes an event's value: the subject follows
//! from `routing.subject` (a template of `${topic}`, column roles and
//! `${column:<name>}`) rendered for the event. Subjects that follow from
//! the config alone are fetched before the mapper is built; the others are
//! met at run time: the mapper says which one it lacks
//! (`MappingError::SchemaSubjectUnchecked`), the relay fetches it and hands
//! it over ([`SchemaRoutes::learn`]), and from then on it is a map lookup.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::outbox::ColumnsConfig;
use crate::config::routing::RoutingConfig;
use crate::config::value_format::{
    is_fixed_topic, parse_subject, render_fixed_subject, SchemaVersion, SubjectPart, ValueEncoding,
};
use crate::outbox::error::{quote, MappingConfigError, MappingError};
use crate::outbox::event::ColumnValue;
use crate::outbox::fields::Fields;
use crate::outbox::registered::{RegisteredSchema, SchemaSet};

/// Distinct subjects remembered before the map is emptied: per-event
/// subjects usually yield a handful (one per event type), but a column
/// could yield many.
const MAX_CACHED_SUBJECTS: usize = 4096;

/// Whether the value format encodes with a subject's schema (`framed`
/// values name their schema themselves).
fn has_subject(encoding: ValueEncoding) -> bool {
    matches!(encoding, ValueEncoding::Avro | ValueEncoding::JsonSchema)
}

/// The topics a routing's registry-encoded events go to, with the key
/// setting their value format and the format, when the topics follow from
/// the config alone; `None` when one is a template or
/// `outbox.columns.topic` can set it.
fn fixed_topics<'a>(
    routing: &'a RoutingConfig,
    columns: &ColumnsConfig,
) -> Option<Vec<(&'a str, String, ValueEncoding)>> {
    if columns.column_for_role("topic").is_some() {
        return None;
    }
    let mut topics = Vec::new();
    if has_subject(routing.value_format) {
        topics.push((
            routing.topic.as_str(),
            "routing.value_format".to_owned(),
            routing.value_format,
        ));
    }
    for (i, r) in routing.rules.iter().enumerate() {
        let (key, encoding) = match r.value_format {
            Some(f) => (format!("routing.rules[{i}].value_format"), f),
            None => ("routing.value_format".to_owned(), routing.value_format),
        };
        if has_subject(encoding) {
            topics.push((r.topic.as_str(), key, encoding));
        }
    }
    topics
        .iter()
        .all(|(t, _, _)| is_fixed_topic(t))
        .then_some(topics)
}

/// The subjects the relay fetches when it starts, with the key setting
/// their value format and the format: when the subject follows from the
/// config alone (literals, and `${topic}` of fixed topics). Others are
/// fetched when first met. Empty for `json` and `framed`.
fn start_subjects(
    routing: &RoutingConfig,
    columns: &ColumnsConfig,
) -> Vec<(String, String, ValueEncoding)> {
    let Ok(parts) = parse_subject(&routing.subject) else {
        return Vec::new();
    };
    if parts
        .iter()
        .any(|p| matches!(p, SubjectPart::Role(_) | SubjectPart::Column(_)))
    {
        return Vec::new();
    }
    fixed_topics(routing, columns)
        .unwrap_or_default()
        .into_iter()
        .map(|(t, key, f)| (render_fixed_subject(&routing.subject, t), key, f))
        .collect()
}

/// The subjects fetched when the relay starts (see `start_subjects`).
pub(crate) fn registry_subjects(routing: &RoutingConfig, columns: &ColumnsConfig) -> Vec<String> {
    let mut subjects: Vec<String> = start_subjects(routing, columns)
        .into_iter()
        .map(|(s, _, _)| s)
        .collect();
    subjects.sort();
    subjects.dedup();
    subjects
}

/// A subject's schema, and where a consumer finds it.
#[derive(Debug)]
pub(crate) struct Route {
    pub schema: Arc<RegisteredSchema>,
    /// `<registry url>/schemas/ids/<id>`, CloudEvents' `dataschema`.
    pub dataschema: Bytes,
}

impl Route {
    fn new(schema: &Arc<RegisteredSchema>) -> Route {
        Route {
            dataschema: Bytes::from(schema.by_id_url()),
            schema: schema.clone(),
        }
    }
}

/// A compiled part of `routing.subject`.
#[derive(Debug)]
enum Part {
    Literal(Box<str>),
    Topic,
    Column {
        slot: usize,
        /// As written, e.g. `${event_type}`, for errors.
        placeholder: Box<str>,
    },
}

/// `routing.subject` compiled, and the schemas of the subjects met so far.
#[derive(Debug)]
pub(crate) struct SchemaRoutes {
    parts: Vec<Part>,
    version: SchemaVersion,
    by_subject: HashMap<Box<str>, Route>,
    /// A reused buffer for rendering subjects.
    scratch: String,
}

impl SchemaRoutes {
    /// `None` when no value format of the routing encodes with a subject's
    /// schema. The subjects [`registry_subjects`] names must be in
    /// `schemas`, of the kind the format encodes with.
    pub(crate) fn new(
        routing: &RoutingConfig,
        columns: &ColumnsConfig,
        schemas: &SchemaSet,
        mut slot_for: impl FnMut(&str) -> usize,
    ) -> Result<Option<SchemaRoutes>, MappingConfigError> {
        if !routing.value_formats().any(|(_, f)| has_subject(f)) {
            return Ok(None);
        }
        let invalid = |reason: String| MappingConfigError::Invalid {
            key: "routing.subject".into(),
            reason,
        };
        let parts = parse_subject(&routing.subject)
            .map_err(invalid)?
            .into_iter()
            .map(|p| {
                Ok(match p {
                    SubjectPart::Literal(l) => Part::Literal(l.into()),
                    SubjectPart::Topic => Part::Topic,
                    SubjectPart::Role(role) => Part::Column {
                        slot: slot_for(columns.column_for_role(role).ok_or_else(|| {
                            invalid(format!(
                                "uses ${{{role}}} but outbox.columns.{role} is empty"
                            ))
                        })?),
                        placeholder: format!("${{{role}}}").into(),
                    },
                    SubjectPart::Column(c) => Part::Column {
                        slot: slot_for(c),
                        placeholder: format!("${{column:{c}}}").into(),
                    },
                })
            })
            .collect::<Result<Vec<_>, MappingConfigError>>()?;
        let mut by_subject = HashMap::new();
        for (subject, key, encoding) in start_subjects(routing, columns) {
            let schema = schemas.get(&subject).ok_or_else(|| {
                invalid(format!(
                    "no schema was fetched from the registry for subject `{subject}` (this \
                     command does not read the registry yet)"
                ))
            })?;
            if !schema.schema.serves(encoding) {
                return Err(MappingConfigError::Invalid {
                    key,
                    reason: format!(
                        "\"{}\" cannot encode with subject `{subject}` version {} (schema id \
                         {}): its schema type is {}",
                        encoding.as_str(),
                        schema.version,
                        schema.id,
                        schema.schema.type_name()
                    ),
                });
            }
            by_subject.insert(subject.into_boxed_str(), Route::new(schema));
        }
        Ok(Some(SchemaRoutes {
            parts,
            version: routing.schema_version,
            by_subject,
            scratch: String::new(),
        }))
    }

    /// The schema of the event's subject for `encoding`, or what is missing.
    pub(crate) fn route_for(
        &mut self,
        topic: &str,
        f: &Fields<'_>,
        encoding: ValueEncoding,
        event_id: impl Fn() -> String,
    ) -> Result<&Route, MappingError> {
        self.scratch.clear();
        for part in &self.parts {
            match part {
                Part::Literal(l) => self.scratch.push_str(l),
                Part::Topic => self.scratch.push_str(topic),
                Part::Column { slot, placeholder } => match f.get(*slot) {
                    Some(ColumnValue::Text(v)) if !v.is_empty() => {
                        let text = std::str::from_utf8(v).map_err(|_| {
                            MappingError::SubjectPlaceholder {
                                placeholder: placeholder.to_string(),
                                value: quote(v),
                            }
                        })?;
                        self.scratch.push_str(text);
                    }
                    _ => {
                        return Err(MappingError::SubjectPlaceholder {
                            placeholder: placeholder.to_string(),
                            value: "NULL or empty".into(),
                        })
                    }
                },
            }
        }
        let Some(route) = self.by_subject.get(self.scratch.as_str()) else {
            return Err(MappingError::SchemaSubjectUnchecked {
                event_id: event_id(),
                subject: self.scratch.clone(),
                version: self.version,
            });
        };
        if !route.schema.schema.serves(encoding) {
            let s = &route.schema;
            return Err(MappingError::SchemaMismatch {
                event_id: event_id(),
                schema_id: s.id,
                subject: s.subject.clone(),
                version: s.version,
                reason: format!(
                    "its schema type is {}, and value_format \"{}\" needs {}",
                    s.schema.type_name(),
                    encoding.as_str(),
                    if encoding == ValueEncoding::Avro {
                        "AVRO"
                    } else {
                        "JSON"
                    }
                ),
                kind: "schema_type",
            });
        }
        Ok(route)
    }

    /// A version of one of its subjects the registry now calls `latest`:
    /// from now on it encodes that subject's events, unless the version is
    /// pinned or the subject is not one of its own. Whether anything
    /// changed.
    pub(crate) fn use_latest(&mut self, schema: &Arc<RegisteredSchema>) -> bool {
        if self.version != SchemaVersion::Latest {
            return false;
        }
        match self.by_subject.get_mut(schema.subject.as_str()) {
            Some(route) if route.schema.id != schema.id => {
                *route = Route::new(schema);
                true
            }
            _ => false,
        }
    }

    /// Remembers `schema` as `subject`'s, fetched by the relay.
    pub(crate) fn learn(&mut self, subject: &str, schema: &Arc<RegisteredSchema>) {
        if self.by_subject.len() >= MAX_CACHED_SUBJECTS {
            self.by_subject.clear();
        }
        self.by_subject.insert(subject.into(), Route::new(schema));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::avro::AvroSchema;
    use crate::outbox::registered::SchemaKind;

    fn registered(subject: &str, id: u32, version: u32) -> Arc<RegisteredSchema> {
        Arc::new(RegisteredSchema {
            id,
            subject: subject.into(),
            version,
            schema: SchemaKind::Avro(AvroSchema::parse(r#""long""#).unwrap()),
            url: "http://registry".into(),
        })
    }

    fn routes(version: SchemaVersion) -> SchemaRoutes {
        let routing = RoutingConfig {
            topic: "orders".into(),
            value_format: ValueEncoding::Avro,
            schema_version: version,
            ..RoutingConfig::default()
        };
        let schemas =
            SchemaSet::from([("orders-value".to_owned(), registered("orders-value", 7, 1))]);
        let mut slots = Vec::new();
        SchemaRoutes::new(&routing, &ColumnsConfig::default(), &schemas, |c| {
            slots.push(c.to_owned());
            slots.len() - 1
        })
        .unwrap()
        .unwrap()
    }

    fn id_for(routes: &SchemaRoutes, subject: &str) -> u32 {
        routes.by_subject[subject].schema.id
    }

    #[test]
    fn a_newer_latest_version_replaces_the_schema_unless_pinned() {
        let mut latest = routes(SchemaVersion::Latest);
        assert!(
            !latest.use_latest(&registered("orders-value", 7, 1)),
            "the same id"
        );
        assert!(latest.use_latest(&registered("orders-value", 9, 2)));
        assert_eq!(id_for(&latest, "orders-value"), 9);
        assert_eq!(
            latest.by_subject["orders-value"].dataschema,
            "http://registry/schemas/ids/9"
        );
        assert!(
            !latest.use_latest(&registered("payments-value", 11, 1)),
            "another subject"
        );

        let mut pinned = routes(SchemaVersion::Number(1));
        assert!(!pinned.use_latest(&registered("orders-value", 9, 2)));
        assert_eq!(id_for(&pinned, "orders-value"), 7);
    }

    #[test]
    fn a_subject_met_at_run_time_follows_latest_too() {
        let mut latest = routes(SchemaVersion::Latest);
        latest.learn(
            "com.acme.OrderPlaced",
            &registered("com.acme.OrderPlaced", 20, 1),
        );
        assert!(latest.use_latest(&registered("com.acme.OrderPlaced", 21, 2)));
        assert_eq!(id_for(&latest, "com.acme.OrderPlaced"), 21);
    }
}
