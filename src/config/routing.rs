//! `[routing]`: which topic each event goes to, what the record value is, and
//! which columns become headers.
//!
//! Topic templates use `${role}` (a column role from `[outbox.columns]`, e.g.
//! `${aggregate_type}`) or `${column:<name>}` (any column of the table). These
//! are lower-case, so config-level `${ENV_VAR}` substitution (upper-case only)
//! leaves them alone.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config::cloudevents::{CloudEventsConfig, EventFormat};
use crate::config::error::ConfigError;
use crate::config::outbox::{ColumnsConfig, COLUMN_ROLES};
use crate::config::value_format::{
    parse_subject, SchemaVersion, SubjectPart, ValueEncoding, DEFAULT_SUBJECT,
};

/// Debezium's outbox event router default (`outbox.event.<aggregatetype>`),
/// so consumers migrating from Debezium keep their topics.
pub(crate) const DEFAULT_TOPIC: &str = "outbox.event.${aggregate_type}";
/// Kafka rejects longer topic names.
pub(crate) const MAX_TOPIC_LEN: usize = 249;

/// The headers Debezium's router adds by default, keyed by header name.
pub(crate) fn default_additional_headers() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("eventType".to_owned(), "event_type".to_owned()),
        ("aggregateType".to_owned(), "aggregate_type".to_owned()),
    ])
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// Topic template used when no rule matches.
    pub topic: String,
    pub value: ValueFormat,
    /// How the value is encoded: JSON as written, or with a registered schema.
    pub value_format: ValueEncoding,
    /// The registry subject of the value's schema (a template).
    pub subject: String,
    /// Which version of the subject encodes the values.
    pub schema_version: SchemaVersion,
    /// Register `schema_file` under the route's subject at start
    /// (development only).
    pub auto_register: bool,
    /// The local schema file `auto_register` registers.
    pub schema_file: Option<PathBuf>,
    /// Plain outbox records or CloudEvents.
    pub format: EventFormat,
    /// What the CloudEvents formats take from the config.
    pub cloudevents: CloudEventsConfig,
    /// Send a tombstone (null value) when the payload is NULL or empty, for
    /// log-compacted topics. Off by default: deleting a key is a strong act
    /// that an empty payload should not trigger by accident.
    pub tombstone_on_empty_payload: bool,
    /// Header name -> column role or column name. Replaces the default map
    /// wholesale when given (`{}` = no extra headers).
    pub additional_headers: BTreeMap<String, String>,
    /// Ordered overrides of `topic`; the first matching rule wins.
    pub rules: Vec<RoutingRule>,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            topic: DEFAULT_TOPIC.to_owned(),
            value: ValueFormat::default(),
            value_format: ValueEncoding::default(),
            subject: DEFAULT_SUBJECT.to_owned(),
            schema_version: SchemaVersion::default(),
            auto_register: false,
            schema_file: None,
            format: EventFormat::default(),
            cloudevents: CloudEventsConfig::default(),
            tombstone_on_empty_payload: false,
            additional_headers: default_additional_headers(),
            rules: Vec::new(),
        }
    }
}

/// What the Kafka record value holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueFormat {
    /// The payload column as-is: what Debezium's router emits, and what
    /// consumers of an outbox usually want.
    #[default]
    Payload,
    /// A JSON envelope wrapping the payload with the event's metadata, for
    /// consumers that want it without reading headers. The sink defines the
    /// exact shape.
    Envelope,
}

/// One routing override. Set matchers must all match; at least one is needed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingRule {
    /// Matches this event type exactly.
    pub event_type: Option<String>,
    /// Matches event types starting with this.
    pub event_type_prefix: Option<String>,
    /// Matches this aggregate type exactly.
    pub aggregate_type: Option<String>,
    /// Topic template for matching events.
    pub topic: String,
    /// How matching events' values are encoded; `routing.value_format`
    /// when not set.
    pub value_format: Option<ValueEncoding>,
    /// The schema file `routing.auto_register` registers under this rule's
    /// subject; `routing.schema_file` when not set.
    pub schema_file: Option<PathBuf>,
}

impl RoutingRule {
    pub(crate) fn matches(&self, event_type: &str, aggregate_type: &str) -> bool {
        self.event_type.as_deref().map_or(true, |e| e == event_type)
            && self
                .event_type_prefix
                .as_deref()
                .map_or(true, |p| event_type.starts_with(p))
            && self
                .aggregate_type
                .as_deref()
                .map_or(true, |a| a == aggregate_type)
    }
}

impl RoutingConfig {
    /// Every value format the routing can use, with the key that sets it:
    /// `routing.value_format`, then each rule's own.
    pub(crate) fn value_formats(&self) -> impl Iterator<Item = (String, ValueEncoding)> + '_ {
        std::iter::once(("routing.value_format".to_owned(), self.value_format)).chain(
            self.rules.iter().enumerate().filter_map(|(i, r)| {
                r.value_format
                    .map(|f| (format!("routing.rules[{i}].value_format"), f))
            }),
        )
    }

    /// Whether any of its value formats needs `[schema_registry]`.
    pub(crate) fn uses_registry(&self) -> bool {
        self.value_formats().any(|(_, f)| f.uses_registry())
    }

    /// The topic template for an event: the first matching rule's, else `topic`.
    #[cfg(test)]
    pub(crate) fn topic_template_for(&self, event_type: &str, aggregate_type: &str) -> &str {
        self.rules
            .iter()
            .find(|r| r.matches(event_type, aggregate_type))
            .map_or(&self.topic, |r| &r.topic)
    }

    pub(crate) fn validate(&self, columns: &ColumnsConfig) -> Result<(), ConfigError> {
        validate_template("routing.topic", &self.topic, columns)?;
        if self.format.is_cloudevents() && self.value == ValueFormat::Envelope {
            return Err(ConfigError::invalid(
                "routing.value",
                "\"envelope\" cannot be combined with a CloudEvents routing.format: the \
                 CloudEvent is the envelope; set routing.value = \"payload\"",
            ));
        }
        self.cloudevents.validate(self.format, columns)?;
        validate_value_format(self, columns)?;
        crate::config::auto_register::validate(self, columns)?;
        for (name, source) in &self.additional_headers {
            let key = format!("routing.additional_headers.{name}");
            if name.is_empty() {
                return Err(ConfigError::invalid(key, "header name must not be empty"));
            }
            if source.is_empty() {
                return Err(ConfigError::invalid(
                    key,
                    "must name a column role (e.g. \"event_type\") or a column; remove the entry to drop the header",
                ));
            }
        }
        for (i, rule) in self.rules.iter().enumerate() {
            let at = |field: &str| format!("routing.rules[{i}].{field}");
            if rule.event_type.is_none()
                && rule.event_type_prefix.is_none()
                && rule.aggregate_type.is_none()
            {
                return Err(ConfigError::invalid(
                    format!("routing.rules[{i}]"),
                    "has no matcher; set event_type, event_type_prefix or aggregate_type (for a catch-all, change routing.topic)",
                ));
            }
            if rule.event_type.is_some() && rule.event_type_prefix.is_some() {
                return Err(ConfigError::invalid(
                    at("event_type_prefix"),
                    "cannot be combined with event_type in one rule; keep one of them",
                ));
            }
            for (field, v) in [
                ("event_type", &rule.event_type),
                ("event_type_prefix", &rule.event_type_prefix),
                ("aggregate_type", &rule.aggregate_type),
            ] {
                if v.as_deref() == Some("") {
                    return Err(ConfigError::invalid(
                        at(field),
                        "is empty; remove it to match any value",
                    ));
                }
            }
            validate_template(&at("topic"), &rule.topic, columns)?;
        }
        Ok(())
    }
}

/// The column a header source or role refers to: a role name configured in
/// `[outbox.columns]` maps to its column, anything else is a column name.
pub(crate) fn resolve_column<'a>(columns: &'a ColumnsConfig, source: &'a str) -> &'a str {
    columns.column_for_role(source).unwrap_or(source)
}

/// A piece of a parsed topic template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TemplatePart<'a> {
    Literal(&'a str),
    /// `${aggregate_type}`: the column playing that role.
    Role(&'a str),
    /// `${column:tenant}`: the named column.
    Column(&'a str),
}

/// Splits a topic template into parts, checking placeholders are terminated
/// and well-formed and literal parts use only characters Kafka allows in
/// topic names (letters, digits, `.`, `_`, `-`).
pub(crate) fn parse_template(template: &str) -> Result<Vec<TemplatePart<'_>>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        let lit_end = rest.find("${").unwrap_or(rest.len());
        let lit = &rest[..lit_end];
        if let Some(c) = lit
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "`{template}` contains `{c}`; topic names allow only letters, digits, '.', '_' and '-' \
                 outside ${{...}} placeholders"
            ));
        }
        if !lit.is_empty() {
            parts.push(TemplatePart::Literal(lit));
        }
        rest = &rest[lit_end..];
        if rest.is_empty() {
            break;
        }
        let Some(close) = rest.find('}') else {
            return Err(format!(
                "`{template}` has an unterminated `${{`; close the placeholder with `}}`"
            ));
        };
        let inner = &rest[2..close];
        let part = match inner.strip_prefix("column:") {
            Some(col) if !col.is_empty() && !col.contains("${") => TemplatePart::Column(col),
            Some(_) => return Err(format!("`{template}`: `${{{inner}}}` needs a column name, e.g. ${{column:tenant}}")),
            None if COLUMN_ROLES.contains(&inner) => TemplatePart::Role(inner),
            None => {
                return Err(format!(
                    "`{template}`: unknown placeholder `${{{inner}}}`; use ${{column:<name>}} or a role: {}",
                    COLUMN_ROLES.join(", ")
                ))
            }
        };
        parts.push(part);
        rest = &rest[close + 1..];
    }
    Ok(parts)
}

fn validate_template(
    key: &str,
    template: &str,
    columns: &ColumnsConfig,
) -> Result<(), ConfigError> {
    if template.is_empty() {
        return Err(ConfigError::invalid(
            key,
            format!("must not be empty; e.g. \"{DEFAULT_TOPIC}\""),
        ));
    }
    let parts = parse_template(template).map_err(|r| ConfigError::invalid(key, r))?;
    for part in &parts {
        if let TemplatePart::Role(role) = part {
            if columns.column_for_role(role).is_none() {
                return Err(ConfigError::invalid(
                    key,
                    format!("uses ${{{role}}} but outbox.columns.{role} is empty; set that column or change the template"),
                ));
            }
        }
    }
    if parts.iter().all(|p| matches!(p, TemplatePart::Literal(_))) && template.len() > MAX_TOPIC_LEN
    {
        return Err(ConfigError::invalid(
            key,
            format!("topic names are at most {MAX_TOPIC_LEN} characters"),
        ));
    }
    Ok(())
}

/// Checks a plain (non-template) topic name, e.g. the dead-letter topic.
pub(crate) fn validate_topic_name(key: &str, topic: &str) -> Result<(), ConfigError> {
    let ok = !topic.is_empty()
        && topic.len() <= MAX_TOPIC_LEN
        && topic != "."
        && topic != ".."
        && topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            key,
            format!(
                "`{topic}` is not a Kafka topic name; use 1 to {MAX_TOPIC_LEN} letters, digits, '.', '_' or '-'"
            ),
        ))
    }
}

/// The value-format keys of one routing config: known placeholders, and
/// the combinations that cannot work.
fn validate_value_format(
    routing: &RoutingConfig,
    columns: &ColumnsConfig,
) -> Result<(), ConfigError> {
    let parts = parse_subject(&routing.subject)
        .map_err(|reason| ConfigError::invalid("routing.subject", reason))?;
    if routing.subject.is_empty() {
        return Err(ConfigError::invalid(
            "routing.subject",
            format!("must not be empty; e.g. \"{DEFAULT_SUBJECT}\""),
        ));
    }
    if !routing.uses_registry() {
        return Ok(());
    }
    for (key, encoding) in routing.value_formats() {
        if encoding == ValueEncoding::Json {
            continue;
        }
        match routing.format {
            EventFormat::Plain => {}
            EventFormat::CloudeventsStructured => {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                    "\"{}\" cannot be combined with routing.format = \"cloudevents-structured\": \
                         a structured CloudEvent is JSON with the payload inside; use \
                         \"cloudevents-binary\" or value_format = \"json\"",
                    encoding.as_str()
                ),
                ))
            }
            EventFormat::CloudeventsBinary => {
                if !routing.cloudevents.data_content_type.is_empty() {
                    return Err(ConfigError::invalid(
                        "routing.cloudevents.data_content_type",
                        format!(
                            "cannot be set with {key} = \"{}\": the content type is the \
                             format's ({}); remove routing.cloudevents.data_content_type",
                            encoding.as_str(),
                            match encoding {
                                ValueEncoding::Avro => "application/avro",
                                ValueEncoding::JsonSchema => "application/schema+json",
                                _ =>
                                    "that of the schema the frame names: application/avro, \
                                      application/schema+json or application/protobuf",
                            }
                        ),
                    ));
                }
            }
        }
        if routing.value == ValueFormat::Envelope {
            return Err(ConfigError::invalid(
                "routing.value",
                format!(
                    "\"envelope\" is JSON; with {key} = \"{}\" the payload itself is \
                     encoded: set routing.value = \"payload\"",
                    encoding.as_str()
                ),
            ));
        }
    }
    // Subjects met first at run time are fetched then; a role placeholder
    // needs its column configured.
    for part in &parts {
        if let SubjectPart::Role(role) = part {
            if columns.column_for_role(role).is_none() {
                return Err(ConfigError::invalid(
                    "routing.subject",
                    format!(
                        "uses ${{{role}}} but outbox.columns.{role} is empty; set that column or \
                         change the template"
                    ),
                ));
            }
        }
    }
    Ok(())
}
