//! `routing.value_format`, `routing.subject` and `routing.schema_version`:
//! how the record value is encoded, and which registered schema encodes it.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::config::cloudevents::EventFormat;
use crate::config::error::ConfigError;
use crate::config::outbox::{ColumnsConfig, COLUMN_ROLES};
use crate::config::routing::{RoutingConfig, ValueFormat};

/// Confluent's TopicNameStrategy: what their serializers use by default, so a
/// consumer's registry lookups find the schema without extra settings.
pub(crate) const DEFAULT_SUBJECT: &str = "${topic}-value";

/// How the record value is encoded (`routing.value_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ValueEncoding {
    /// The payload's JSON text as it is.
    #[default]
    Json,
    /// The payload encoded with the subject's Avro schema, in the Confluent
    /// wire format.
    Avro,
    /// The payload validated against the subject's JSON Schema and framed.
    JsonSchema,
    /// The payload column already holds a framed record.
    Framed,
}

impl ValueEncoding {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ValueEncoding::Json => "json",
            ValueEncoding::Avro => "avro",
            ValueEncoding::JsonSchema => "json-schema",
            ValueEncoding::Framed => "framed",
        }
    }

    /// Needs `[schema_registry]`.
    pub(crate) fn uses_registry(self) -> bool {
        self != ValueEncoding::Json
    }
}

/// Which version of the subject (`routing.schema_version`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SchemaVersion {
    /// The subject's newest version when the relay starts.
    #[default]
    Latest,
    /// One version, pinned.
    Number(u32),
}

impl fmt::Display for SchemaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaVersion::Latest => f.write_str("latest"),
            SchemaVersion::Number(n) => write!(f, "{n}"),
        }
    }
}

impl<'de> Deserialize<'de> for SchemaVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SchemaVersion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"latest\" or a version number (1, 2, ...)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SchemaVersion, E> {
                match v {
                    "latest" => Ok(SchemaVersion::Latest),
                    n => match n.parse::<u32>() {
                        Ok(n) if n >= 1 => Ok(SchemaVersion::Number(n)),
                        _ => Err(E::custom(format!(
                            "`{v}` is neither \"latest\" nor a version number (1, 2, ...)"
                        ))),
                    },
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SchemaVersion, E> {
                u32::try_from(v)
                    .ok()
                    .filter(|n| *n >= 1)
                    .map(SchemaVersion::Number)
                    .ok_or_else(|| E::custom(format!("{v} is not a version number (1, 2, ...)")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SchemaVersion, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
        }
        d.deserialize_any(V)
    }
}

/// A piece of a parsed `routing.subject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubjectPart<'a> {
    Literal(&'a str),
    /// `${topic}`: the topic the event is routed to.
    Topic,
    /// `${event_type}` etc.: the column playing that role.
    Role(&'a str),
    /// `${column:tenant}`.
    Column(&'a str),
}

/// Splits a subject template into parts, checking every placeholder exists.
pub(crate) fn parse_subject(template: &str) -> Result<Vec<SubjectPart<'_>>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        let lit_end = rest.find("${").unwrap_or(rest.len());
        if lit_end > 0 {
            parts.push(SubjectPart::Literal(&rest[..lit_end]));
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
        parts.push(match inner.strip_prefix("column:") {
            Some(c) if !c.is_empty() => SubjectPart::Column(c),
            Some(_) => return Err(format!("`{template}`: `${{column:}}` needs a column name")),
            None if inner == "topic" => SubjectPart::Topic,
            None if COLUMN_ROLES.contains(&inner) => SubjectPart::Role(inner),
            None => {
                return Err(format!(
                    "`{template}`: unknown placeholder `${{{inner}}}`; use ${{topic}}, \
                     ${{column:<name>}} or a role: {}",
                    COLUMN_ROLES.join(", ")
                ))
            }
        });
        rest = &rest[close + 1..];
    }
    Ok(parts)
}

/// Whether a topic template has no placeholder (the same topic for every
/// event it routes).
fn is_fixed_topic(template: &str) -> bool {
    !template.contains("${")
}

/// The value-format keys of one routing config: known placeholders, the
/// combinations that cannot work, and (for now) what is not built yet.
pub(crate) fn validate(
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
    let encoding = routing.value_format;
    if encoding == ValueEncoding::Json {
        return Ok(());
    }
    if matches!(encoding, ValueEncoding::JsonSchema | ValueEncoding::Framed) {
        return Err(ConfigError::invalid(
            "routing.value_format",
            format!(
                "\"{}\" is not implemented yet; use \"json\" or \"avro\"",
                encoding.as_str()
            ),
        ));
    }
    match routing.format {
        EventFormat::Plain => {}
        EventFormat::CloudeventsStructured => {
            return Err(ConfigError::invalid(
                "routing.value_format",
                format!(
                    "\"{}\" cannot be combined with routing.format = \"cloudevents-structured\": \
                     a structured CloudEvent is JSON with the payload inside; use \
                     \"cloudevents-binary\" or routing.value_format = \"json\"",
                    encoding.as_str()
                ),
            ))
        }
        EventFormat::CloudeventsBinary => {
            return Err(ConfigError::invalid(
                "routing.value_format",
                format!(
                    "\"{}\" with routing.format = \"cloudevents-binary\" is not implemented yet; \
                     use routing.format = \"plain\"",
                    encoding.as_str()
                ),
            ))
        }
    }
    if routing.value == ValueFormat::Envelope {
        return Err(ConfigError::invalid(
            "routing.value",
            format!(
                "\"envelope\" is JSON; with routing.value_format = \"{}\" the payload itself is \
                 encoded: set routing.value = \"payload\"",
                encoding.as_str()
            ),
        ));
    }
    // The subjects are resolved when the relay starts, so each event's must
    // follow from the config alone.
    for part in &parts {
        let per_event = match part {
            SubjectPart::Literal(_) => None,
            SubjectPart::Role(r) => Some(format!("${{{r}}}")),
            SubjectPart::Column(c) => Some(format!("${{column:{c}}}")),
            SubjectPart::Topic => {
                if columns.column_for_role("topic").is_some() {
                    Some("${topic} with outbox.columns.topic set".to_owned())
                } else {
                    std::iter::once(&routing.topic)
                        .chain(routing.rules.iter().map(|r| &r.topic))
                        .find(|t| !is_fixed_topic(t))
                        .map(|t| format!("${{topic}} with the topic template `{t}`"))
                }
            }
        };
        if let Some(what) = per_event {
            return Err(ConfigError::invalid(
                "routing.subject",
                format!(
                    "`{}` uses {what}, which varies per event: subjects resolved per event are \
                     not implemented yet; use fixed topics (routing.topic and \
                     routing.rules[].topic without placeholders) or a fixed subject",
                    routing.subject
                ),
            ));
        }
    }
    Ok(())
}

/// The subject for events routed to `topic` (a subject that passed
/// [`validate`]: only literals and `${topic}`).
pub(crate) fn render_fixed_subject(template: &str, topic: &str) -> String {
    template.replace("${topic}", topic)
}
