//! Why an event or the config cannot be mapped, and the config keys those
//! errors name so the user knows what to fix.

use crate::config::value_format::SchemaVersion;
use crate::config::ConfigError;
use crate::outbox::trace::TraceContextError;

/// Longest column value quoted in an error.
const MAX_QUOTED: usize = 64;

pub(super) const ID_SETTING: &str = "outbox.columns.id";
pub(super) const KEY_SETTING: &str = "outbox.columns.key";
pub(super) const AGGREGATE_TYPE_SETTING: &str = "outbox.columns.aggregate_type";
pub(super) const EVENT_TYPE_SETTING: &str = "outbox.columns.event_type";
pub(super) const PAYLOAD_SETTING: &str = "outbox.columns.payload";
pub(super) const HEADERS_SETTING: &str = "outbox.columns.headers";
pub(super) const TIMESTAMP_SETTING: &str = "outbox.columns.timestamp";
pub(super) const TOPIC_SETTING: &str = "outbox.columns.topic";
pub(super) const TRACE_CONTEXT_SETTING: &str = "outbox.columns.trace_context";
pub(super) const CE_EXTENSIONS_SETTING: &str = "outbox.columns.ce_extensions";

/// Why one event cannot become a record. Each is about that event alone (a
/// poison event: the relay applies `relay.on_error`), and says which column
/// or setting to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MappingError {
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

    /// A `bytea` column whose text is not PostgreSQL's output for a bytea
    /// (only a bug on the way could do that).
    #[error(
        "column `{column}` is a bytea but its value `{value}` is not PostgreSQL's text form \
         of one (hex `\\x…` or escape)"
    )]
    InvalidBytea { column: String, value: String },

    #[error(
        "column `{column}` ({role}) is not valid UTF-8, so routing.rules cannot match it; \
         use a UTF8 database encoding"
    )]
    InvalidText { column: String, role: String },

    /// The trace context column holds something the W3C Trace Context
    /// recommendation refuses, or no trace context at all.
    #[error(
        "trace context column `{column}` (outbox.columns.trace_context) holds `{value}`: \
         {reason}; write a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), a JSON object \
         with traceparent and tracestate, or java.util.Properties text, or NULL for none"
    )]
    InvalidTraceContext {
        column: String,
        value: String,
        reason: TraceContextError,
    },

    /// The payload does not fit the Avro schema of its subject
    /// (routing.value_format = "avro").
    #[error(
        "event {event_id}: the payload does not fit schema id {schema_id} (subject `{subject}` \
         version {version}): {reason}; fix the row, or register a schema version it fits"
    )]
    SchemaMismatch {
        event_id: String,
        schema_id: u32,
        subject: String,
        version: u32,
        reason: String,
        /// `not_json`, `mismatch`, `invalid` (JSON Schema), `encode` or
        /// `schema_type` (a metric label).
        kind: &'static str,
    },

    /// A placeholder of `routing.subject` has no text for this event.
    #[error(
        "routing.subject uses {placeholder}, which is {value} for this event; a subject needs \
         its text"
    )]
    SubjectPlaceholder { placeholder: String, value: String },

    /// The event's subject was not fetched from the registry yet. The relay
    /// fetches it and maps the event again; a command that does not read
    /// the registry stops here.
    #[error(
        "event {event_id}: subject `{subject}` (routing.subject) was not looked up in the schema \
         registry (this command does not read the registry)"
    )]
    SchemaSubjectUnchecked {
        event_id: String,
        subject: String,
        version: SchemaVersion,
    },

    /// The registry has no usable schema for the event's subject: it does
    /// not exist, has no such version, or does not parse.
    #[error("event {event_id}: {reason}")]
    SchemaUnavailable { event_id: String, reason: String },

    /// `routing.value_format = "framed"`: the payload is not a record in
    /// Confluent's wire format.
    #[error(
        "event {event_id}: the payload is not a framed record (routing.value_format = \"framed\"): \
         {reason}; write the bytes a Confluent serializer produces into the payload column"
    )]
    NotFramed { event_id: String, reason: String },

    /// `routing.value_format = "framed"`: the payload names a schema id the
    /// mapper has not seen confirmed by the registry. The relay asks the
    /// registry and maps the event again; a command that does not read the
    /// registry stops here.
    #[error(
        "event {event_id}: the payload names schema id {id}, not looked up in the schema \
         registry (this command does not read the registry)"
    )]
    SchemaIdUnchecked { event_id: String, id: u32 },

    /// `routing.value_format = "framed"`: the registry has no schema with
    /// the id the payload names.
    #[error(
        "event {event_id}: the payload names schema id {id}, which the schema registry at {url} \
         does not have (routing.value_format = \"framed\"); register the writer's schema there, \
         or fix the row"
    )]
    UnknownSchemaId {
        event_id: String,
        id: u32,
        url: String,
    },

    /// The event cannot be a CloudEvent (routing.format = "cloudevents-*").
    #[error("the event cannot be a CloudEvent: {reason}")]
    CloudEvent { reason: String },
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

/// A column value quoted in an error: lossy UTF-8, at most [`MAX_QUOTED`]
/// characters.
pub(super) fn quote(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    match s.char_indices().nth(MAX_QUOTED) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.into_owned(),
    }
}
