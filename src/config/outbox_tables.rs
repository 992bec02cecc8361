//! `[outbox]` (one table) or `[[outbox]]` (several tables, one relay, one
//! slot, one publication). Each `[[outbox]]` entry names its table, its
//! columns and, optionally, its own routing:
//!
//! - `routing` absent: the entry uses the top-level `[routing]` (inherited
//!   whole); present: it replaces `[routing]` whole for that entry's events
//!   (missing keys take the documented defaults, not `[routing]`'s values:
//!   one table, one place to read its routing).
//! - `message_prefix`: empty by default in an entry. A
//!   `pg_logical_emit_message` event with an entry's prefix is mapped with
//!   that entry's columns and routing; two entries cannot share a prefix.
//!
//! Every error of an entry names it by index: `outbox[1].columns.key`.

use std::collections::BTreeMap;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::Deserializer;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::outbox::{ColumnsConfig, OutboxConfig, TableRef};
use crate::config::routing::RoutingConfig;

/// The `outbox` key as written: one table or a list of entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboxSection {
    /// `[outbox]`: routed by the top-level `[routing]`.
    Single(Box<OutboxConfig>),
    /// `[[outbox]]`: at least one entry.
    Entries(Vec<OutboxEntry>),
}

impl Default for OutboxSection {
    fn default() -> Self {
        OutboxSection::Single(Box::default())
    }
}

/// One `[[outbox]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxEntry {
    pub table: TableRef,
    /// "" (the default in an entry) relays no logical decoding messages.
    #[serde(default)]
    pub message_prefix: String,
    #[serde(default)]
    pub columns: ColumnsConfig,
    /// `None`: the top-level `[routing]`.
    #[serde(default)]
    pub routing: Option<RoutingConfig>,
}

/// One outbox table with everything that decides how its events are
/// mapped, whichever form configured it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// `outbox` or `outbox[i]`: the prefix of this table's keys in errors.
    pub key: String,
    pub table: TableRef,
    pub message_prefix: Option<String>,
    pub columns: ColumnsConfig,
    pub routing: RoutingConfig,
    /// `routing` or `outbox[i].routing`: where `routing` was configured.
    pub routing_key: String,
    /// The database of `postgres.url` ("" when it cannot be told), for the
    /// default CloudEvents `source`.
    pub database: String,
}

impl OutboxTable {
    /// `schema.name`, the label of this table's metrics.
    pub(crate) fn label(&self) -> String {
        format!("{}.{}", self.table.schema(), self.table.name())
    }

    /// The CloudEvents `source` of this table's events:
    /// `routing.cloudevents.source`, or `/outboxd/<database>/<schema>.<table>`
    /// with each name percent-encoded (a URI reference, as the spec wants).
    pub(crate) fn ce_source(&self) -> String {
        let configured = &self.routing.cloudevents.source;
        if !configured.is_empty() {
            return configured.clone();
        }
        let mut s = String::from("/outboxd/");
        percent_encode(&mut s, &self.database);
        s.push('/');
        percent_encode(&mut s, self.table.schema());
        s.push('.');
        percent_encode(&mut s, self.table.name());
        s
    }

    /// Renames a validation error from the single-table key names to this
    /// table's (`outbox.columns.key` -> `outbox[1].columns.key`).
    fn rekey(&self, e: ConfigError) -> ConfigError {
        match e {
            ConfigError::Invalid { key, reason } => {
                let reason = reason
                    .replace("outbox.columns.", &format!("{}.columns.", self.key))
                    .replace("outbox.table", &format!("{}.table", self.key));
                let key = if let Some(rest) = key.strip_prefix("outbox") {
                    format!("{}{rest}", self.key)
                } else if let Some(rest) = key.strip_prefix("routing") {
                    format!("{}{rest}", self.routing_key)
                } else {
                    key
                };
                ConfigError::Invalid { key, reason }
            }
            other => other,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let single = OutboxConfig {
            table: self.table.clone(),
            message_prefix: self.message_prefix.clone().unwrap_or_default(),
            columns: self.columns.clone(),
        };
        single.validate().map_err(|e| self.rekey(e))?;
        self.routing
            .validate(&self.columns)
            .map_err(|e| self.rekey(e))
    }
}

impl OutboxSection {
    /// Every configured table, in the order written, with its routing
    /// resolved against the top-level `[routing]`.
    pub(crate) fn tables(&self, routing: &RoutingConfig) -> Vec<OutboxTable> {
        match self {
            OutboxSection::Single(o) => vec![OutboxTable {
                key: "outbox".into(),
                table: o.table.clone(),
                message_prefix: o.message_prefix().map(str::to_owned),
                columns: o.columns.clone(),
                routing: routing.clone(),
                routing_key: "routing".into(),
                database: String::new(),
            }],
            OutboxSection::Entries(entries) => entries
                .iter()
                .enumerate()
                .map(|(i, e)| OutboxTable {
                    key: format!("outbox[{i}]"),
                    table: e.table.clone(),
                    message_prefix: Some(e.message_prefix.clone()).filter(|p| !p.is_empty()),
                    columns: e.columns.clone(),
                    routing: e.routing.clone().unwrap_or_else(|| routing.clone()),
                    routing_key: match e.routing {
                        Some(_) => format!("outbox[{i}].routing"),
                        None => "routing".into(),
                    },
                    database: String::new(),
                })
                .collect(),
        }
    }

    /// Each table on its own, then what only the list can break: no
    /// entries, a table twice, a message prefix twice.
    pub(crate) fn validate(&self, routing: &RoutingConfig) -> Result<(), ConfigError> {
        if matches!(self, OutboxSection::Entries(e) if e.is_empty()) {
            return Err(ConfigError::invalid(
                "outbox",
                "has no entries; write at least one [[outbox]] with its table, or use [outbox]",
            ));
        }
        let tables = self.tables(routing);
        let mut seen_tables = BTreeMap::new();
        let mut seen_prefixes = BTreeMap::new();
        for t in &tables {
            t.validate()?;
            let name = (t.table.schema().to_owned(), t.table.name().to_owned());
            if let Some(first) = seen_tables.insert(name, t.key.clone()) {
                return Err(ConfigError::invalid(
                    format!("{}.table", t.key),
                    format!(
                        "`{}` is already the table of {first}; each table is listed once",
                        t.label()
                    ),
                ));
            }
            if let Some(prefix) = &t.message_prefix {
                if let Some(first) = seen_prefixes.insert(prefix.clone(), t.key.clone()) {
                    return Err(ConfigError::invalid(
                        format!("{}.message_prefix", t.key),
                        format!(
                            "`{prefix}` is already the message prefix of {first}; \
                             a message is mapped by one entry, give each its own prefix"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Appends `text` with every byte but RFC 3986's unreserved characters
/// (letters, digits, `-._~`) percent-encoded.
fn percent_encode(out: &mut String, text: &str) {
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

impl<'de> Deserialize<'de> for OutboxSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SectionVisitor;
        impl<'de> Visitor<'de> for SectionVisitor {
            type Value = OutboxSection;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an [outbox] table or [[outbox]] entries")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<OutboxSection, A::Error> {
                OutboxConfig::deserialize(MapAccessDeserializer::new(map))
                    .map(|o| OutboxSection::Single(Box::new(o)))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<OutboxSection, A::Error> {
                Vec::<OutboxEntry>::deserialize(SeqAccessDeserializer::new(seq))
                    .map(OutboxSection::Entries)
            }
        }
        d.deserialize_any(SectionVisitor)
    }
}
