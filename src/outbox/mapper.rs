//! From an [`OutboxEvent`] to a [`KafkaRecord`], following `[outbox.columns]`
//! and `[routing]`. Pure: no I/O, and the only state is caches.
//!
//! Everything that can be worked out from the config is done once in
//! [`RecordMapper::new`]: templates are parsed and every column the mapper
//! reads gets a "slot". For table rows the slots are resolved to column
//! positions once per table shape (pgoutput Relation), so mapping a row is
//! index lookups and `Bytes` clones of the WAL frame. Per event, the mapper
//! allocates the headers `Vec`, and in envelope mode the value buffer; topic
//! strings are interned.
//!
//! Logical decoding messages carry a JSON object whose field names are the
//! configured column names; they are parsed (messages are rare) and then
//! mapped exactly as a row. In a message an absent optional field (anything
//! but the id, key, aggregate type, event type and payload columns) counts
//! as NULL; in a row a configured column that is missing is an error, since
//! it means the table and the config disagree.

use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::outbox::ColumnsConfig;
use crate::config::routing::{resolve_column, RoutingConfig, RoutingRule, ValueFormat};
use crate::config::ConfigError;
use crate::outbox::envelope::{write_envelope, EnvelopeFields};
use crate::outbox::event::{ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
use crate::outbox::record::{parse_timestamp_ms, KafkaRecord};
use crate::outbox::topic::{TopicCache, TopicPart, TopicTemplate};

/// Header carrying the event id, as Debezium's router names it.
pub const ID_HEADER: &str = "id";
/// Column whose value becomes the envelope's `occurredAt` when no
/// `outbox.columns.timestamp` is configured, if the table has it.
pub const CREATED_AT_COLUMN: &str = "created_at";
/// Distinct header names from the `headers` column remembered before the
/// cache is emptied.
pub const MAX_CACHED_HEADER_NAMES: usize = 1024;

const JSON_TYPE_OID: u32 = 114;
const JSONB_TYPE_OID: u32 = 3802;
/// Longest column value quoted in an error.
const MAX_QUOTED: usize = 64;

const ID_SETTING: &str = "outbox.columns.id";
const KEY_SETTING: &str = "outbox.columns.key";
const AGGREGATE_TYPE_SETTING: &str = "outbox.columns.aggregate_type";
const EVENT_TYPE_SETTING: &str = "outbox.columns.event_type";
const PAYLOAD_SETTING: &str = "outbox.columns.payload";
const HEADERS_SETTING: &str = "outbox.columns.headers";
const TIMESTAMP_SETTING: &str = "outbox.columns.timestamp";
const TOPIC_SETTING: &str = "outbox.columns.topic";

/// Why one event cannot become a record. Each is about that event alone (a
/// poison event: the relay applies `relay.on_error`), and says which column
/// or setting to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    /// A configured column is not in the row (the table was altered) or a
    /// required field is not in the message. `role` is the setting naming it.
    #[error(
        "column `{column}` ({role}) is not in the event: the outbox table or message has no \
         such column; restore it or change {role}"
    )]
    MissingColumn { column: String, role: String },

    #[error(
        "the payload column (outbox.columns.payload) is NULL; write a payload, or set \
         routing.tombstone_on_empty_payload = true to send NULL and empty payloads as tombstones"
    )]
    NullPayload,

    #[error(
        "topic placeholder {placeholder} has no value: its column is NULL, empty or not in the \
         event; fill it in, or change the template in routing.topic / routing.rules"
    )]
    TopicPlaceholder { placeholder: String },

    #[error(
        "topic `{topic}` is not a valid Kafka topic name: {reason}; fix the row's value \
         (outbox.columns.topic, or the columns used in the routing template) or the template"
    )]
    InvalidTopic { topic: String, reason: String },

    #[error(
        "logical decoding message is not an outbox event: {reason}; emit a JSON object whose \
         fields are named like the [outbox.columns] columns, with the payload as JSON"
    )]
    InvalidMessage { reason: String },

    #[error(
        "timestamp column `{column}` (outbox.columns.timestamp) holds `{value}`, which is \
         neither a timestamp like 2026-11-30 02:04:20.875+00 nor epoch milliseconds; fix the \
         value or set outbox.columns.timestamp = \"\" to use the commit time"
    )]
    InvalidTimestamp { column: String, value: String },

    #[error(
        "headers column `{column}` (outbox.columns.headers) is not a JSON object of header \
         name to value: {reason}"
    )]
    InvalidHeaders { column: String, reason: String },

    /// pgoutput sent "unchanged TOAST" instead of a value, which happens only
    /// for updates; outbox rows are relayed from inserts.
    #[error(
        "column `{column}` has no value in the change (an unchanged TOASTed value); outbox \
         rows must be inserted, not updated"
    )]
    UnavailableValue { column: String },

    #[error(
        "column `{column}` ({role}) is not valid UTF-8, so routing.rules cannot match it; \
         use a UTF8 database encoding"
    )]
    InvalidText { column: String, role: String },
}

/// The config cannot drive a mapper. `RecordMapper::new` re-runs the config
/// validation, so a validated config never fails here.
#[derive(Debug, thiserror::Error)]
pub enum MappingConfigError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
}

/// Turns outbox events into Kafka records. Holds caches, hence `&mut self`;
/// use one per relay task.
#[derive(Debug)]
pub struct RecordMapper {
    plan: Plan,
    /// Slot positions for the last table shape seen.
    layout: Option<Layout>,
    state: State,
}

impl RecordMapper {
    /// Checks the config and pre-parses templates and rules.
    pub fn new(
        columns: &ColumnsConfig,
        routing: &RoutingConfig,
    ) -> Result<RecordMapper, MappingConfigError> {
        columns.validate()?;
        routing.validate(columns)?;
        Ok(RecordMapper {
            plan: Plan::new(columns, routing)?,
            layout: None,
            state: State::default(),
        })
    }

    /// The record for one event, or why the event cannot be relayed.
    pub fn map(&mut self, event: &OutboxEvent) -> Result<KafkaRecord, MappingError> {
        match &event.kind {
            EventKind::Row(row) => {
                if !self
                    .layout
                    .as_ref()
                    .is_some_and(|l| Arc::ptr_eq(&l.table, &row.table))
                {
                    self.layout = Some(self.plan.layout(&row.table));
                }
                let layout = self.layout.as_ref().expect("layout set above");
                let fields = Fields::Row {
                    row,
                    index: &layout.index,
                };
                self.plan.map(
                    &mut self.state,
                    &fields,
                    layout.payload_is_json,
                    event.commit_time_us,
                )
            }
            EventKind::Message { content, .. } => {
                let values = self.plan.message_values(content)?;
                self.plan.map(
                    &mut self.state,
                    &Fields::Message(&values),
                    true,
                    event.commit_time_us,
                )
            }
        }
    }

    /// Which template a rule or the default gives these values: `Some(i)` for
    /// `routing.rules[i]`, `None` for `routing.topic`. The same choice as
    /// [`RoutingConfig::topic_template_for`].
    pub fn rule_for(&self, event_type: &str, aggregate_type: &str) -> Option<usize> {
        self.plan
            .rules
            .iter()
            .position(|(r, _)| r.matches(event_type, aggregate_type))
    }

    /// Topics currently interned.
    pub fn cached_topics(&self) -> usize {
        self.state.topics.len()
    }
}

/// Mutable caches, kept apart from the plan so both can be borrowed at once.
#[derive(Debug, Default)]
struct State {
    topics: TopicCache,
    header_names: HashMap<Box<str>, Arc<str>>,
    /// Reused buffer for rendering templates.
    scratch: Vec<u8>,
}

#[derive(Debug)]
struct Layout {
    table: Arc<TableInfo>,
    /// Slot -> position in the row.
    index: Vec<Option<usize>>,
    payload_is_json: bool,
}

#[derive(Debug)]
struct ExtraHeader {
    name: Arc<str>,
    slot: usize,
    /// `routing.additional_headers.<name>`, for errors.
    setting: Box<str>,
}

/// The config, compiled.
#[derive(Debug)]
struct Plan {
    /// Slot -> column name; every column the mapper reads, once.
    columns: Vec<Box<str>>,
    id: usize,
    key: usize,
    aggregate_type: usize,
    event_type: usize,
    payload: usize,
    timestamp: Option<usize>,
    topic: Option<usize>,
    headers_column: Option<usize>,
    created_at: Option<usize>,
    id_header: Arc<str>,
    extra_headers: Vec<ExtraHeader>,
    default_topic: TopicTemplate,
    rules: Vec<(RoutingRule, TopicTemplate)>,
    value: ValueFormat,
    tombstone: bool,
}

/// Hands out one slot per distinct column name.
#[derive(Default)]
struct Slots(Vec<Box<str>>);

impl Slots {
    fn slot(&mut self, column: &str) -> usize {
        match self.0.iter().position(|c| &**c == column) {
            Some(i) => i,
            None => {
                self.0.push(column.into());
                self.0.len() - 1
            }
        }
    }
}

impl Plan {
    fn new(columns: &ColumnsConfig, routing: &RoutingConfig) -> Result<Plan, MappingConfigError> {
        let mut slots = Slots::default();
        let mut required = |role: &str| {
            columns
                .column_for_role(role)
                .map(|c| slots.slot(c))
                .ok_or_else(|| MappingConfigError::Invalid {
                    key: format!("outbox.columns.{role}"),
                    reason: "must name a column of the outbox table; it is required".into(),
                })
        };
        let id = required("id")?;
        let key = required("key")?;
        let aggregate_type = required("aggregate_type")?;
        let event_type = required("event_type")?;
        let payload = required("payload")?;
        let mut optional = |role: &str| columns.column_for_role(role).map(|c| slots.slot(c));
        let timestamp = optional("timestamp");
        let topic = optional("topic");
        let headers_column = optional("headers");
        let created_at = (routing.value == ValueFormat::Envelope && timestamp.is_none())
            .then(|| slots.slot(CREATED_AT_COLUMN));
        let extra_headers = routing
            .additional_headers
            .iter()
            .map(|(name, source)| ExtraHeader {
                name: Arc::from(name.as_str()),
                slot: slots.slot(resolve_column(columns, source)),
                setting: format!("routing.additional_headers.{name}").into(),
            })
            .collect();
        let mut compile = |key: String, template: &str| {
            TopicTemplate::compile(template, columns, |c| slots.slot(c))
                .map_err(|reason| MappingConfigError::Invalid { key, reason })
        };
        let default_topic = compile("routing.topic".into(), &routing.topic)?;
        let rules = routing
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                let t = compile(format!("routing.rules[{i}].topic"), &rule.topic)?;
                Ok((rule.clone(), t))
            })
            .collect::<Result<Vec<_>, MappingConfigError>>()?;
        Ok(Plan {
            columns: slots.0,
            id,
            key,
            aggregate_type,
            event_type,
            payload,
            timestamp,
            topic,
            headers_column,
            created_at,
            id_header: Arc::from(ID_HEADER),
            extra_headers,
            default_topic,
            rules,
            value: routing.value,
            tombstone: routing.tombstone_on_empty_payload,
        })
    }

    fn layout(&self, table: &Arc<TableInfo>) -> Layout {
        let index: Vec<Option<usize>> =
            self.columns.iter().map(|c| table.column_index(c)).collect();
        let payload_is_json = index[self.payload]
            .and_then(|i| table.columns.get(i))
            .is_some_and(|c| matches!(c.type_oid, JSON_TYPE_OID | JSONB_TYPE_OID));
        Layout {
            table: table.clone(),
            index,
            payload_is_json,
        }
    }

    fn map(
        &self,
        st: &mut State,
        f: &Fields<'_>,
        payload_is_json: bool,
        commit_time_us: i64,
    ) -> Result<KafkaRecord, MappingError> {
        let id = self.text(f, self.id, ID_SETTING, false)?;
        let key = self.text(f, self.key, KEY_SETTING, false)?;
        let aggregate_type = self.text(f, self.aggregate_type, AGGREGATE_TYPE_SETTING, false)?;
        let event_type = self.text(f, self.event_type, EVENT_TYPE_SETTING, false)?;
        let payload = self.text(f, self.payload, PAYLOAD_SETTING, false)?;

        let commit_ms = commit_time_us.div_euclid(1000);
        let column_ms =
            match self.timestamp {
                Some(slot) => match self.text(f, slot, TIMESTAMP_SETTING, true)? {
                    Some(t) => Some(parse_timestamp_ms(t).ok_or_else(|| {
                        MappingError::InvalidTimestamp {
                            column: self.columns[slot].to_string(),
                            value: quote(t),
                        }
                    })?),
                    None => None,
                },
                None => None,
            };

        let value = match payload {
            None if self.tombstone => None,
            None => return Err(MappingError::NullPayload),
            Some(p) if p.is_empty() && self.tombstone => None,
            Some(p) => Some(match self.value {
                ValueFormat::Payload => p.clone(),
                ValueFormat::Envelope => {
                    let occurred_at_ms = column_ms
                        .or_else(|| match self.created_at.and_then(|s| f.get(s)) {
                            Some(ColumnValue::Text(t)) => parse_timestamp_ms(t),
                            _ => None,
                        })
                        .unwrap_or(commit_ms);
                    Bytes::from(write_envelope(&EnvelopeFields {
                        id: id.map(|b| &b[..]),
                        event_type: event_type.map(|b| &b[..]),
                        aggregate_id: key.map(|b| &b[..]),
                        aggregate_type: aggregate_type.map(|b| &b[..]),
                        payload: Some(p),
                        payload_is_json,
                        occurred_at_ms,
                    }))
                }
            }),
        };

        let topic = self.topic(st, f, event_type, aggregate_type)?;

        let mut headers = Vec::with_capacity(
            1 + self.extra_headers.len() + if self.headers_column.is_some() { 4 } else { 0 },
        );
        if let Some(id) = id {
            headers.push((self.id_header.clone(), id.clone()));
        }
        for h in &self.extra_headers {
            if let Some(v) = self.text(f, h.slot, &h.setting, true)? {
                headers.push((h.name.clone(), v.clone()));
            }
        }
        if let Some(slot) = self.headers_column {
            if let Some(json) = self.text(f, slot, HEADERS_SETTING, true)? {
                append_json_headers(json, &mut headers, &mut st.header_names).map_err(
                    |reason| MappingError::InvalidHeaders {
                        column: self.columns[slot].to_string(),
                        reason,
                    },
                )?;
            }
        }

        let key = key.cloned();
        let size = KafkaRecord::compute_size(key.as_ref(), value.as_ref(), &headers);
        Ok(KafkaRecord {
            topic,
            key,
            value,
            headers,
            timestamp_ms: Some(column_ms.unwrap_or(commit_ms)),
            event_id: id.cloned(),
            size,
        })
    }

    /// A column's text: `None` for NULL (or, in a message, an absent
    /// optional field).
    fn text<'a>(
        &self,
        f: &Fields<'a>,
        slot: usize,
        setting: &str,
        optional: bool,
    ) -> Result<Option<&'a Bytes>, MappingError> {
        match f.get(slot) {
            Some(ColumnValue::Text(b)) => Ok(Some(b)),
            Some(ColumnValue::Null) => Ok(None),
            Some(ColumnValue::UnchangedToast) => Err(MappingError::UnavailableValue {
                column: self.columns[slot].to_string(),
            }),
            None if optional && f.is_message() => Ok(None),
            None => Err(MappingError::MissingColumn {
                column: self.columns[slot].to_string(),
                role: setting.to_owned(),
            }),
        }
    }

    /// The `topic` column if set, else the first matching rule's template,
    /// else `routing.topic`.
    fn topic(
        &self,
        st: &mut State,
        f: &Fields<'_>,
        event_type: Option<&Bytes>,
        aggregate_type: Option<&Bytes>,
    ) -> Result<Arc<str>, MappingError> {
        let invalid = |name: &[u8], reason| MappingError::InvalidTopic {
            topic: String::from_utf8_lossy(name).into_owned(),
            reason,
        };
        if let Some(slot) = self.topic {
            if let Some(name) = self
                .text(f, slot, TOPIC_SETTING, true)?
                .filter(|t| !t.is_empty())
            {
                return st.topics.intern(name).map_err(|r| invalid(name, r));
            }
        }
        let template = self.template_for(event_type, aggregate_type)?;
        if let Some(fixed) = &template.fixed {
            return Ok(fixed.clone());
        }
        st.scratch.clear();
        for part in &template.parts {
            match part {
                TopicPart::Literal(l) => st.scratch.extend_from_slice(l.as_bytes()),
                TopicPart::Column { slot, placeholder } => match f.get(*slot) {
                    Some(ColumnValue::Text(v)) if !v.is_empty() => st.scratch.extend_from_slice(v),
                    _ => {
                        return Err(MappingError::TopicPlaceholder {
                            placeholder: placeholder.to_string(),
                        })
                    }
                },
            }
        }
        st.topics
            .intern(&st.scratch)
            .map_err(|r| invalid(&st.scratch, r))
    }

    fn template_for(
        &self,
        event_type: Option<&Bytes>,
        aggregate_type: Option<&Bytes>,
    ) -> Result<&TopicTemplate, MappingError> {
        if self.rules.is_empty() {
            return Ok(&self.default_topic);
        }
        let et = self.rule_text(event_type, self.event_type, EVENT_TYPE_SETTING)?;
        let at = self.rule_text(aggregate_type, self.aggregate_type, AGGREGATE_TYPE_SETTING)?;
        Ok(self
            .rules
            .iter()
            .find(|(r, _)| r.matches(et, at))
            .map_or(&self.default_topic, |(_, t)| t))
    }

    /// A value rules match on, as text; NULL matches as "".
    fn rule_text<'b>(
        &self,
        v: Option<&'b Bytes>,
        slot: usize,
        role: &str,
    ) -> Result<&'b str, MappingError> {
        match v {
            None => Ok(""),
            Some(b) => std::str::from_utf8(b).map_err(|_| MappingError::InvalidText {
                column: self.columns[slot].to_string(),
                role: role.to_owned(),
            }),
        }
    }

    /// A message's fields by slot: `None` where the field is absent.
    fn message_values(&self, content: &Bytes) -> Result<Vec<Option<ColumnValue>>, MappingError> {
        let invalid = |reason: String| MappingError::InvalidMessage { reason };
        let fields: HashMap<JsonStr<'_>, &RawValue> = serde_json::from_slice(content)
            .map_err(|e| invalid(format!("not a JSON object: {e}")))?;
        let mut values = Vec::with_capacity(self.columns.len());
        for (slot, column) in self.columns.iter().enumerate() {
            let Some(raw) = fields.get(&**column) else {
                values.push(None);
                continue;
            };
            let text = raw.get();
            let value = if text == "null" {
                ColumnValue::Null
            } else if slot == self.payload || Some(slot) == self.headers_column {
                ColumnValue::Text(sub_bytes(content, text.as_bytes()))
            } else {
                ColumnValue::Text(
                    json_value_text(content, raw)
                        .map_err(|e| invalid(format!("field `{column}`: {e}")))?,
                )
            };
            values.push(Some(value));
        }
        Ok(values)
    }
}

/// Column values by slot, from a row or a parsed message.
enum Fields<'a> {
    Row {
        row: &'a Row,
        index: &'a [Option<usize>],
    },
    Message(&'a [Option<ColumnValue>]),
}

impl<'a> Fields<'a> {
    /// `None` when the column is not in the row / the field not in the message.
    fn get(&self, slot: usize) -> Option<&'a ColumnValue> {
        match *self {
            Fields::Row { row, index } => index[slot].and_then(|i| row.values.get(i)),
            Fields::Message(values) => values[slot].as_ref(),
        }
    }

    fn is_message(&self) -> bool {
        matches!(self, Fields::Message(_))
    }
}

/// A column value quoted in an error: lossy UTF-8, at most [`MAX_QUOTED`]
/// characters.
fn quote(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    match s.char_indices().nth(MAX_QUOTED) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.into_owned(),
    }
}

/// `part` as a slice of `src` when it lies inside it (no copy), else a copy.
fn sub_bytes(src: &Bytes, part: &[u8]) -> Bytes {
    let start = src.as_ptr() as usize;
    let p = part.as_ptr() as usize;
    if p >= start && p + part.len() <= start + src.len() {
        src.slice_ref(part)
    } else {
        Bytes::copy_from_slice(part)
    }
}

/// A JSON value as header/column text: strings unescaped (without copying
/// when they have no escapes), other values as their JSON text.
fn json_value_text(src: &Bytes, raw: &RawValue) -> Result<Bytes, String> {
    let text = raw.get();
    if !text.starts_with('"') {
        return Ok(sub_bytes(src, text.as_bytes()));
    }
    let inner = &text[1..text.len() - 1];
    if inner.contains('\\') {
        let s: String = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Ok(Bytes::from(s))
    } else {
        Ok(sub_bytes(src, inner.as_bytes()))
    }
}

/// Appends the entries of a JSON object of header name to value. Strings are
/// sent unquoted, other values as JSON text, `null` entries left out.
fn append_json_headers(
    json: &Bytes,
    out: &mut Vec<(Arc<str>, Bytes)>,
    names: &mut HashMap<Box<str>, Arc<str>>,
) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(json);
    de.deserialize_map(HeaderVisitor {
        src: json,
        out,
        names,
    })
    .and_then(|()| de.end())
    .map_err(|e| e.to_string())
}

struct HeaderVisitor<'a> {
    src: &'a Bytes,
    out: &'a mut Vec<(Arc<str>, Bytes)>,
    names: &'a mut HashMap<Box<str>, Arc<str>>,
}

impl<'de> Visitor<'de> for HeaderVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(JsonStr(name)) = map.next_key::<JsonStr<'de>>()? {
            let raw: &'de RawValue = map.next_value()?;
            if raw.get() == "null" {
                continue;
            }
            let value = json_value_text(self.src, raw).map_err(de::Error::custom)?;
            let name = match self.names.get(&*name) {
                Some(n) => n.clone(),
                None => {
                    if self.names.len() >= MAX_CACHED_HEADER_NAMES {
                        self.names.clear();
                    }
                    let n: Arc<str> = Arc::from(&*name);
                    self.names.insert(name.into(), n.clone());
                    n
                }
            };
            self.out.push((name, value));
        }
        Ok(())
    }
}

/// A JSON string, borrowed from the input when it has no escapes.
#[derive(Debug, PartialEq, Eq, Hash)]
struct JsonStr<'a>(Cow<'a, str>);

impl Borrow<str> for JsonStr<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for JsonStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
#[path = "mapper_tests.rs"]
mod tests;
