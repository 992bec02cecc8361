//! `routing.value_format`, `routing.subject` and `routing.schema_version`:
//! how the record value is encoded, and which registered schema encodes it.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::config::outbox::COLUMN_ROLES;

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
pub(crate) fn is_fixed_topic(template: &str) -> bool {
    !template.contains("${")
}

/// The subject for events routed to `topic` (a subject that passed
/// `RoutingConfig`'s checks: only literals and `${topic}`).
pub(crate) fn render_fixed_subject(template: &str, topic: &str) -> String {
    template.replace("${topic}", topic)
}
