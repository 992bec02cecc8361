//! `routing.auto_register` and `routing.schema_file` (also per
//! `[[routing.rules]]` entry): a local schema registered under each route's
//! subject when the relay starts, for development (in production a team
//! registers and evolves its schemas itself, under the registry's
//! compatibility rules).
//!
//! The files are read and parsed when the relay starts (and by `outboxd
//! check`), not here: the config is also loaded by commands that never use
//! them.

use std::path::Path;

use crate::config::error::ConfigError;
use crate::config::outbox::ColumnsConfig;
use crate::config::routing::RoutingConfig;
use crate::config::value_format::{
    is_fixed_topic, parse_subject, render_fixed_subject, SubjectPart, ValueEncoding,
};

/// One subject `auto_register` registers a file under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaFileRoute<'a> {
    /// The key that names the file (`routing.schema_file` or
    /// `routing.rules[i].schema_file`), for errors.
    pub key: String,
    pub path: &'a Path,
    pub subject: String,
    /// `avro` or `json-schema`: how the file is parsed and registered.
    pub encoding: ValueEncoding,
}

/// Whether the format encodes with a subject's schema (one a file can give).
fn registers(encoding: ValueEncoding) -> bool {
    matches!(encoding, ValueEncoding::Avro | ValueEncoding::JsonSchema)
}

/// The routes that encode with a subject's schema, each with its topic,
/// value format, the key of its schema file and the file: `routing.topic`,
/// then each rule (a rule without a file of its own takes
/// `routing.schema_file`).
fn routes(routing: &RoutingConfig) -> Vec<(&str, ValueEncoding, String, Option<&Path>)> {
    let default = (
        "routing.schema_file".to_owned(),
        routing.schema_file.as_deref(),
    );
    let mut routes = vec![(
        routing.topic.as_str(),
        routing.value_format,
        default.0.clone(),
        default.1,
    )];
    for (i, r) in routing.rules.iter().enumerate() {
        let (key, file) = match &r.schema_file {
            Some(f) => (format!("routing.rules[{i}].schema_file"), Some(f.as_path())),
            None => default.clone(),
        };
        routes.push((
            r.topic.as_str(),
            r.value_format.unwrap_or(routing.value_format),
            key,
            file,
        ));
    }
    routes.retain(|(_, encoding, _, _)| registers(*encoding));
    routes
}

/// The subjects `auto_register` registers a file under, one entry per
/// subject (config validation keeps them fixed and unambiguous); empty
/// without `auto_register`.
pub(crate) fn schema_file_routes(routing: &RoutingConfig) -> Vec<SchemaFileRoute<'_>> {
    if !routing.auto_register {
        return Vec::new();
    }
    let mut out: Vec<SchemaFileRoute<'_>> = Vec::new();
    for (topic, encoding, key, file) in routes(routing) {
        let Some(path) = file else { continue };
        let subject = render_fixed_subject(&routing.subject, topic);
        if !out.iter().any(|r| r.subject == subject) {
            out.push(SchemaFileRoute {
                key,
                path,
                subject,
                encoding,
            });
        }
    }
    out
}

pub(crate) fn validate(
    routing: &RoutingConfig,
    columns: &ColumnsConfig,
) -> Result<(), ConfigError> {
    let rule_files = routing
        .rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.schema_file.is_some());
    if !routing.auto_register {
        if routing.schema_file.is_some() {
            return Err(not_read("routing.schema_file".to_owned()));
        }
        if let Some((i, _)) = rule_files.clone().next() {
            return Err(not_read(format!("routing.rules[{i}].schema_file")));
        }
        return Ok(());
    }
    for (i, r) in rule_files {
        let encoding = r.value_format.unwrap_or(routing.value_format);
        if !registers(encoding) {
            return Err(ConfigError::invalid(
                format!("routing.rules[{i}].schema_file"),
                format!(
                    "is registered for \"avro\" or \"json-schema\" routes; this rule's value \
                     format is \"{}\"{}",
                    encoding.as_str(),
                    if encoding == ValueEncoding::Framed {
                        " (the producer that frames the rows registers their schema)"
                    } else {
                        ""
                    }
                ),
            ));
        }
    }
    let routes = routes(routing);
    if routes.is_empty() {
        return Err(ConfigError::invalid(
            "routing.auto_register",
            match routing.value_format {
                ValueEncoding::Framed => {
                    "cannot be used with routing.value_format = \"framed\": the producer that \
                     frames the rows registers their schema"
                }
                _ => {
                    "needs a registry value format (routing.value_format = \"avro\" or \
                     \"json-schema\", here or in a [[routing.rules]] entry); \"json\" uses no \
                     schema"
                }
            },
        ));
    }
    if let Some((_, _, key, _)) = routes.iter().find(|(_, _, _, file)| file.is_none()) {
        return Err(ConfigError::invalid(
            key.clone(),
            "must name the local schema file (.avsc or .json) that routing.auto_register = \
             true registers at start",
        ));
    }
    // Registered before the first event, so the subject must follow from
    // the config alone.
    let parts = parse_subject(&routing.subject)
        .map_err(|reason| ConfigError::invalid("routing.subject", reason))?;
    let fixed_topics = columns.column_for_role("topic").is_none()
        && routes.iter().all(|(t, _, _, _)| is_fixed_topic(t));
    let per_event = parts.iter().any(|p| match p {
        SubjectPart::Literal(_) => false,
        SubjectPart::Topic => !fixed_topics,
        SubjectPart::Role(_) | SubjectPart::Column(_) => true,
    });
    if per_event {
        return Err(ConfigError::invalid(
            "routing.subject",
            format!(
                "`{}` varies per event, and routing.auto_register = true registers \
                 routing.schema_file at start: use a fixed subject (or ${{topic}} with fixed \
                 topics)",
                routing.subject
            ),
        ));
    }
    // One subject, one file: two files under one subject would make the
    // second registration a new version of the first's subject.
    for (n, (topic, encoding, key, file)) in routes.iter().enumerate() {
        let subject = render_fixed_subject(&routing.subject, topic);
        let earlier = routes[..n]
            .iter()
            .find(|(t, _, _, _)| render_fixed_subject(&routing.subject, t) == subject);
        if let Some((_, other_encoding, other_key, other_file)) = earlier {
            if other_file != file || other_encoding != encoding {
                return Err(ConfigError::invalid(
                    key.clone(),
                    format!(
                        "registers under subject `{subject}`, as {other_key} does with another \
                         file or value format: give the routes different topics (with \
                         routing.subject = \"${{topic}}-value\") or the same schema file"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn not_read(key: String) -> ConfigError {
    ConfigError::invalid(
        key,
        "is read only with routing.auto_register = true (development only); remove it or set \
         routing.auto_register",
    )
}
