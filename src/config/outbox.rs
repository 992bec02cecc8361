//! `[outbox]` and `[outbox.columns]`: which table holds events and which of
//! its columns play which role. Column names default to Debezium's outbox
//! event router conventions so an existing outbox table works unchanged.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::postgres::MAX_IDENTIFIER_BYTES;

/// Debezium's conventional outbox table, in the default schema.
pub(crate) const DEFAULT_TABLE: &str = "public.outbox";
/// Schema assumed when `outbox.table` has no `schema.` part, as PostgreSQL
/// itself does with the default `search_path`.
pub(crate) const DEFAULT_SCHEMA: &str = "public";
/// `pg_logical_emit_message` prefix whose messages are treated as events.
/// Named after the feature so it is unlikely to collide with other emitters.
pub(crate) const DEFAULT_MESSAGE_PREFIX: &str = "outbox";
pub(crate) const DEFAULT_ID_COLUMN: &str = "id";
/// Debezium names the key column `aggregateid`; we use the snake_case spelling
/// common in hand-written schemas. Override it for a Debezium-shaped table.
pub(crate) const DEFAULT_KEY_COLUMN: &str = "aggregate_id";
pub(crate) const DEFAULT_AGGREGATE_TYPE_COLUMN: &str = "aggregate_type";
pub(crate) const DEFAULT_EVENT_TYPE_COLUMN: &str = "event_type";
pub(crate) const DEFAULT_PAYLOAD_COLUMN: &str = "payload";

/// Column roles usable as `${role}` placeholders and as header sources.
pub(crate) const COLUMN_ROLES: [&str; 10] = [
    "id",
    "key",
    "aggregate_type",
    "event_type",
    "payload",
    "headers",
    "timestamp",
    "topic",
    "trace_context",
    "ce_extensions",
];

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxConfig {
    pub table: TableRef,
    /// Prefix of logical decoding messages to relay; "" disables messages.
    pub message_prefix: String,
    pub columns: ColumnsConfig,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            table: TableRef::Dotted(DEFAULT_TABLE.to_owned()),
            message_prefix: DEFAULT_MESSAGE_PREFIX.to_owned(),
            columns: ColumnsConfig::default(),
        }
    }
}

/// Column names by role. Optional roles use "" for "not present", so the
/// example file can show every key with its default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ColumnsConfig {
    pub id: String,
    pub key: String,
    pub aggregate_type: String,
    pub event_type: String,
    pub payload: String,
    /// Optional jsonb column of extra Kafka headers.
    pub headers: String,
    /// Optional column for the Kafka record timestamp ("" = commit time).
    pub timestamp: String,
    /// Optional column naming the topic per row, overriding routing.
    pub topic: String,
    /// Optional column of W3C trace context (a `traceparent`, a JSON
    /// object, or Debezium's `java.util.Properties` text), sent as the
    /// `traceparent` and `tracestate` headers.
    pub trace_context: String,
    /// Optional json/jsonb column: an object of CloudEvents extension
    /// attributes per event (CloudEvents formats only).
    pub ce_extensions: String,
}

impl Default for ColumnsConfig {
    fn default() -> Self {
        ColumnsConfig {
            id: DEFAULT_ID_COLUMN.to_owned(),
            key: DEFAULT_KEY_COLUMN.to_owned(),
            aggregate_type: DEFAULT_AGGREGATE_TYPE_COLUMN.to_owned(),
            event_type: DEFAULT_EVENT_TYPE_COLUMN.to_owned(),
            payload: DEFAULT_PAYLOAD_COLUMN.to_owned(),
            headers: String::new(),
            timestamp: String::new(),
            topic: String::new(),
            trace_context: String::new(),
            ce_extensions: String::new(),
        }
    }
}

impl OutboxConfig {
    /// The schema part of `table` (`public` when omitted).
    #[cfg(test)]
    pub(crate) fn table_schema(&self) -> &str {
        self.table.schema()
    }

    /// The table part of `table`.
    #[cfg(test)]
    pub(crate) fn table_name(&self) -> &str {
        self.table.name()
    }

    /// `None` when logical decoding messages are not relayed.
    pub(crate) fn message_prefix(&self) -> Option<&str> {
        Some(self.message_prefix.as_str()).filter(|p| !p.is_empty())
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.table.validate()?;
        self.columns.validate()
    }
}

/// `outbox.table`: `"schema.table"` or `"table"` (meaning `public.table`),
/// or `{ schema = "...", name = "..." }` for any name PostgreSQL allows,
/// dots and double quotes included. Names as stored in the catalog:
/// case-sensitive, without SQL quoting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableRef {
    Dotted(String),
    Parts { schema: String, name: String },
}

impl TableRef {
    pub fn schema(&self) -> &str {
        match self {
            TableRef::Dotted(t) => t.split_once('.').map_or(DEFAULT_SCHEMA, |(s, _)| s),
            TableRef::Parts { schema, .. } => schema,
        }
    }

    pub(crate) fn name(&self) -> &str {
        match self {
            TableRef::Dotted(t) => t.split_once('.').map_or(t.as_str(), |(_, n)| n),
            TableRef::Parts { name, .. } => name,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let key = "outbox.table";
        if let TableRef::Dotted(t) = self {
            // A dot or a quote in a name is legal, but the string form
            // cannot say where one name ends; and `"Sales"."Outbox"` is more
            // likely SQL quoting than a name with quotes in it.
            let parts: Vec<&str> = t.split('.').collect();
            if parts.len() > 2 || parts.iter().any(|p| p.is_empty()) || t.contains('"') {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "`{t}` is not `schema.table` or `table`; write names as stored in the \
                         catalog, without SQL quotes, e.g. \"{DEFAULT_TABLE}\", or, for names \
                         with dots or double quotes, {{ schema = \"Sales\", name = \"Outbox Events\" }}"
                    ),
                ));
            }
        }
        for (part, value) in [("schema", self.schema()), ("name", self.name())] {
            if value.is_empty() || value.len() > MAX_IDENTIFIER_BYTES || value.contains('\0') {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "the table's {part} `{value}` must be 1 to {MAX_IDENTIFIER_BYTES} bytes \
                         (PostgreSQL's limit) without NUL characters"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// As written: `schema.table` (or `table`) for the string form.
impl std::fmt::Display for TableRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableRef::Dotted(t) => f.write_str(t),
            TableRef::Parts { schema, name } => write!(f, "{schema}.{name}"),
        }
    }
}

impl<'de> Deserialize<'de> for TableRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TableVisitor;
        impl<'de> Visitor<'de> for TableVisitor {
            type Value = TableRef;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"schema.table\" or { schema = \"...\", name = \"...\" }")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<TableRef, E> {
                Ok(TableRef::Dotted(v.to_owned()))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TableRef, A::Error> {
                let (mut schema, mut name) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "schema" => schema = Some(map.next_value::<String>()?),
                        "name" => name = Some(map.next_value::<String>()?),
                        other => return Err(de::Error::unknown_field(other, &["schema", "name"])),
                    }
                }
                Ok(TableRef::Parts {
                    schema: schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned()),
                    name: name.ok_or_else(|| de::Error::missing_field("name"))?,
                })
            }
        }
        d.deserialize_any(TableVisitor)
    }
}

impl ColumnsConfig {
    /// The configured column for a role: `None` for an unknown role or an
    /// optional role left empty.
    pub(crate) fn column_for_role(&self, role: &str) -> Option<&str> {
        let col = match role {
            "id" => &self.id,
            "key" => &self.key,
            "aggregate_type" => &self.aggregate_type,
            "event_type" => &self.event_type,
            "payload" => &self.payload,
            "headers" => &self.headers,
            "timestamp" => &self.timestamp,
            "topic" => &self.topic,
            "trace_context" => &self.trace_context,
            "ce_extensions" => &self.ce_extensions,
            _ => return None,
        };
        Some(col.as_str()).filter(|c| !c.is_empty())
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for role in &COLUMN_ROLES[..5] {
            if self.column_for_role(role).is_none() {
                return Err(ConfigError::invalid(
                    format!("outbox.columns.{role}"),
                    "must name a column of the outbox table; it is required",
                ));
            }
        }
        for role in COLUMN_ROLES {
            let col = self.column_for_role(role).unwrap_or("");
            if col.len() > MAX_IDENTIFIER_BYTES || col.contains('"') {
                return Err(ConfigError::invalid(
                    format!("outbox.columns.{role}"),
                    format!(
                        "`{col}` is not a column name; write it as stored in the catalog, \
                         without quotes, at most {MAX_IDENTIFIER_BYTES} bytes"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_parts() {
        let mut o = OutboxConfig::default();
        assert_eq!((o.table_schema(), o.table_name()), ("public", "outbox"));
        o.table = TableRef::Dotted("events".into());
        assert_eq!((o.table_schema(), o.table_name()), ("public", "events"));
        o.table = TableRef::Dotted("billing.Outbox".into());
        assert_eq!((o.table_schema(), o.table_name()), ("billing", "Outbox"));
        o.table = TableRef::Dotted("Sales.Outbox Events".into());
        assert_eq!(
            (o.table_schema(), o.table_name()),
            ("Sales", "Outbox Events")
        );
    }

    #[test]
    fn table_forms_from_toml() {
        let parse = |text: &str| toml::from_str::<OutboxConfig>(text).map(|o| o.table);
        assert_eq!(
            parse("table = \"Sales.Outbox Events\"").unwrap(),
            TableRef::Dotted("Sales.Outbox Events".into())
        );
        let t =
            parse("table = { schema = \"Ventes.EU\", name = 'Outbox \"Évènements\"' }").unwrap();
        assert_eq!(
            (t.schema(), t.name()),
            ("Ventes.EU", "Outbox \"Évènements\"")
        );
        t.validate().unwrap();
        let t = parse("table = { name = \"events\" }").unwrap();
        assert_eq!((t.schema(), t.name()), ("public", "events"));
        let e = parse("table = { schema = \"s\" }").unwrap_err().to_string();
        assert!(e.contains("name"), "{e}");
        let e = parse("table = { schema = \"s\", name = \"t\", nmae = \"x\" }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nmae"), "{e}");
    }

    #[test]
    fn message_prefix_empty_disables() {
        let mut o = OutboxConfig::default();
        assert_eq!(o.message_prefix(), Some("outbox"));
        o.message_prefix.clear();
        assert_eq!(o.message_prefix(), None);
    }
}
