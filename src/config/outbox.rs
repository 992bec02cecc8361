//! `[outbox]` and `[outbox.columns]`: which table holds events and which of
//! its columns play which role. Column names default to Debezium's outbox
//! event router conventions so an existing outbox table works unchanged.

use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::postgres::MAX_IDENTIFIER_BYTES;

/// Debezium's conventional outbox table, in the default schema.
pub const DEFAULT_TABLE: &str = "public.outbox";
/// Schema assumed when `outbox.table` has no `schema.` part, as PostgreSQL
/// itself does with the default `search_path`.
pub const DEFAULT_SCHEMA: &str = "public";
/// `pg_logical_emit_message` prefix whose messages are treated as events.
/// Named after the feature so it is unlikely to collide with other emitters.
pub const DEFAULT_MESSAGE_PREFIX: &str = "outbox";
pub const DEFAULT_ID_COLUMN: &str = "id";
/// Debezium names the key column `aggregateid`; we use the snake_case spelling
/// common in hand-written schemas. Override it for a Debezium-shaped table.
pub const DEFAULT_KEY_COLUMN: &str = "aggregate_id";
pub const DEFAULT_AGGREGATE_TYPE_COLUMN: &str = "aggregate_type";
pub const DEFAULT_EVENT_TYPE_COLUMN: &str = "event_type";
pub const DEFAULT_PAYLOAD_COLUMN: &str = "payload";

/// Column roles usable as `${role}` placeholders and as header sources.
pub const COLUMN_ROLES: [&str; 8] = [
    "id",
    "key",
    "aggregate_type",
    "event_type",
    "payload",
    "headers",
    "timestamp",
    "topic",
];

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxConfig {
    /// `schema.table`, or `table` meaning `public.table`. Names as stored in
    /// the catalog (case-sensitive, no quotes).
    pub table: String,
    /// Prefix of logical decoding messages to relay; "" disables messages.
    pub message_prefix: String,
    pub columns: ColumnsConfig,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            table: DEFAULT_TABLE.to_owned(),
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
        }
    }
}

impl OutboxConfig {
    /// The schema part of `table` (`public` when omitted).
    pub fn table_schema(&self) -> &str {
        self.table
            .split_once('.')
            .map_or(DEFAULT_SCHEMA, |(schema, _)| schema)
    }

    /// The table part of `table`.
    pub fn table_name(&self) -> &str {
        self.table
            .split_once('.')
            .map_or(self.table.as_str(), |(_, name)| name)
    }

    /// `None` when logical decoding messages are not relayed.
    pub fn message_prefix(&self) -> Option<&str> {
        Some(self.message_prefix.as_str()).filter(|p| !p.is_empty())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let parts: Vec<&str> = self.table.split('.').collect();
        let well_formed = parts.len() <= 2
            && parts.iter().all(|p| {
                !p.is_empty() && p.len() <= MAX_IDENTIFIER_BYTES && !p.contains(['"', ' ', '\t'])
            });
        if !well_formed {
            return Err(ConfigError::invalid(
                "outbox.table",
                format!(
                    "`{}` is not `schema.table` or `table`; write names as stored in the catalog, \
                     without quotes or spaces, each at most {MAX_IDENTIFIER_BYTES} bytes, \
                     e.g. \"{DEFAULT_TABLE}\"",
                    self.table
                ),
            ));
        }
        self.columns.validate()
    }
}

impl ColumnsConfig {
    /// The configured column for a role: `None` for an unknown role or an
    /// optional role left empty.
    pub fn column_for_role(&self, role: &str) -> Option<&str> {
        let col = match role {
            "id" => &self.id,
            "key" => &self.key,
            "aggregate_type" => &self.aggregate_type,
            "event_type" => &self.event_type,
            "payload" => &self.payload,
            "headers" => &self.headers,
            "timestamp" => &self.timestamp,
            "topic" => &self.topic,
            _ => return None,
        };
        Some(col.as_str()).filter(|c| !c.is_empty())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
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
        o.table = "events".into();
        assert_eq!((o.table_schema(), o.table_name()), ("public", "events"));
        o.table = "billing.Outbox".into();
        assert_eq!((o.table_schema(), o.table_name()), ("billing", "Outbox"));
    }

    #[test]
    fn message_prefix_empty_disables() {
        let mut o = OutboxConfig::default();
        assert_eq!(o.message_prefix(), Some("outbox"));
        o.message_prefix.clear();
        assert_eq!(o.message_prefix(), None);
    }
}
