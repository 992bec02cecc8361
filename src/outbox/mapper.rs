//! From an [`OutboxEvent`] to a [`KafkaRecord`], following `[outbox.columns]`
//! and `[routing]`. Pure: no I/O, and the only state is caches.
//!
//! Everything that can be worked out from the config is done once in
//! [`RecordMapper::new`]: templates are parsed and every column the mapper
//! reads gets a "slot". For table rows the slots are resolved to column
//! positions once per table shape (pgoutput Relation), so mapping a row is
//! index lookups and `Bytes` clones of the WAL frame. Per event, the mapper
//! allocates the headers `Vec`, and in envelope mode the value buffer; topic
//! strings are interned. The CloudEvents formats add the `time` text, once
//! per commit time (binary mode: nothing else; the payload is not touched),
//! and in structured mode the value buffer; their fixed headers are built
//! once per table.
//!
//! Logical decoding messages carry a JSON object whose field names are the
//! configured column names; they are parsed (messages are rare) and then
//! mapped exactly as a row. In a message an absent optional field (anything
//! but the id, key, aggregate type, event type and payload columns) counts
//! as NULL; in a row a configured column that is missing is an error, since
//! it means the table and the config disagree.
//!
//! This file holds the plan (slots, value mode, timestamps) and the per-table
//! layout. Beside it: `fields` (values by slot, from a row or a message),
//! `message` (a message's JSON to values), `route` (topic routing),
//! `headers` (record headers), `trace` (the trace context column),
//! `cloudevents` (the CloudEvents formats), `json` and `error`.

use std::sync::Arc;

use bytes::Bytes;

use crate::config::outbox::ColumnsConfig;
use crate::config::routing::{RoutingConfig, ValueFormat};
use crate::config::value_format::ValueEncoding;
use crate::outbox::bytea;
use crate::outbox::cloudevents::{Attributes, CloudEventsPlan};
use crate::outbox::envelope::{write_envelope, EnvelopeFields};
use crate::outbox::error::{
    quote, AGGREGATE_TYPE_SETTING, EVENT_TYPE_SETTING, ID_SETTING, KEY_SETTING, PAYLOAD_SETTING,
    TIMESTAMP_SETTING, TRACE_CONTEXT_SETTING,
};
use crate::outbox::event::{ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
use crate::outbox::fields::Fields;
use crate::outbox::headers::{HeaderNames, HeaderPlan};
use crate::outbox::message;
use crate::outbox::record::{parse_timestamp_ms, KafkaRecord};
use crate::outbox::registered::{framed_id, FramedSchema, RegisteredSchema, SchemaSet};
use crate::outbox::route::Router;
use crate::outbox::schema_routes::SchemaRoutes;
use crate::outbox::topic::TopicCache;
use crate::outbox::trace;

pub(crate) use crate::outbox::error::{MappingConfigError, MappingError};
pub(crate) use crate::outbox::headers::ID_HEADER;

/// Header names of the trace context, as OpenTelemetry's Kafka
/// instrumentation reads them.
pub(crate) const TRACEPARENT_HEADER: &str = "traceparent";
pub(crate) const TRACESTATE_HEADER: &str = "tracestate";

/// Column whose value becomes the envelope's `occurredAt` when no
/// `outbox.columns.timestamp` is configured, if the table has it.
pub(crate) const CREATED_AT_COLUMN: &str = "created_at";

const JSON_TYPE_OID: u32 = 114;
const JSONB_TYPE_OID: u32 = 3802;

/// Turns outbox events into Kafka records. Holds caches, hence `&mut self`;
/// use one per relay task.
#[derive(Debug)]
pub(crate) struct RecordMapper {
    plan: Plan,
    /// Slot positions for the last table shape seen.
    layout: Option<Layout>,
    state: State,
}

impl RecordMapper {
    /// Checks the config and pre-parses templates and rules. `ce_source`
    /// is the CloudEvents `source` of the table's events (see
    /// `OutboxTable::ce_source`), unused by the plain format. For commands
    /// that do not read the schema registry: a registry value format is
    /// refused.
    pub(crate) fn new(
        columns: &ColumnsConfig,
        routing: &RoutingConfig,
        ce_source: &str,
    ) -> Result<RecordMapper, MappingConfigError> {
        // Without the registry, every event would fail instead.
        if let Some((key, f)) = routing.value_formats().find(|(_, f)| f.uses_registry()) {
            return Err(MappingConfigError::Invalid {
                key,
                reason: format!(
                    "\"{}\" takes its schemas from the schema registry, which this command \
                     does not read yet",
                    f.as_str()
                ),
            });
        }
        RecordMapper::with_schemas(columns, routing, ce_source, &SchemaSet::new())
    }

    /// As [`new`](Self::new), with the registered schemas the value format
    /// encodes with (`routing.value_format = "avro"` or `"json-schema"`:
    /// every subject of the routing must be there).
    pub(crate) fn with_schemas(
        columns: &ColumnsConfig,
        routing: &RoutingConfig,
        ce_source: &str,
        schemas: &SchemaSet,
    ) -> Result<RecordMapper, MappingConfigError> {
        columns.validate()?;
        routing.validate(columns)?;
        let (plan, routes) = Plan::new(columns, routing, ce_source, schemas)?;
        Ok(RecordMapper {
            plan,
            layout: None,
            state: State {
                routes,
                ..State::default()
            },
        })
    }

    /// A new `latest` version of a subject (see `SchemaRoutes::use_latest`);
    /// whether it replaced a schema.
    pub(crate) fn use_latest(&mut self, schema: &Arc<RegisteredSchema>) -> bool {
        self.state
            .routes
            .as_mut()
            .is_some_and(|routes| routes.use_latest(schema))
    }

    /// The record for one event, or why the event cannot be relayed.
    pub(crate) fn map(&mut self, event: &OutboxEvent) -> Result<KafkaRecord, MappingError> {
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
                // Only tables with a bytea column in use pay for a copy.
                let decoded;
                let row = if layout.bytea.is_empty() {
                    row
                } else {
                    decoded = decode_bytea(row, &layout.bytea)?;
                    &decoded
                };
                let fields = Fields::row(&self.plan.columns, row, &layout.index);
                self.plan.map(
                    &mut self.state,
                    &fields,
                    layout.payload_is_json,
                    event.commit_time_us,
                )
            }
            EventKind::Message { content, .. } => {
                let values = message::values(
                    content,
                    &self.plan.columns,
                    self.plan.payload,
                    self.plan.headers.column(),
                )?;
                self.plan.map(
                    &mut self.state,
                    &Fields::message(&self.plan.columns, &values),
                    true,
                    event.commit_time_us,
                )
            }
        }
    }

    /// The event's key and id as [`map`](Self::map) would send them, for an
    /// event it could not map: whichever of the two the event has (not NULL,
    /// present, and for a message, a JSON object), so a dead-letter copy can
    /// still be found by key and deduplicated by id.
    pub(crate) fn key_and_id(&self, event: &OutboxEvent) -> (Option<Bytes>, Option<Bytes>) {
        let (key, id) = (self.plan.key, self.plan.id);
        let text = |f: &Fields<'_>, slot: usize| match f.get(slot) {
            Some(ColumnValue::Text(b)) => Some(b.clone()),
            _ => None,
        };
        match &event.kind {
            EventKind::Row(row) => {
                let layout = self.plan.layout(&row.table);
                let decoded;
                let row = match decode_bytea(row, &layout.bytea) {
                    Ok(d) => {
                        decoded = d;
                        &decoded
                    }
                    Err(_) => row,
                };
                let f = Fields::row(&self.plan.columns, row, &layout.index);
                (text(&f, key), text(&f, id))
            }
            EventKind::Message { content, .. } => {
                let Ok(values) = message::values(
                    content,
                    &self.plan.columns,
                    self.plan.payload,
                    self.plan.headers.column(),
                ) else {
                    return (None, None);
                };
                let f = Fields::message(&self.plan.columns, &values);
                (text(&f, key), text(&f, id))
            }
        }
    }

    /// Which template a rule or the default gives these values: `Some(i)` for
    /// `routing.rules[i]`, `None` for `routing.topic`. The same choice as
    /// [`RoutingConfig::topic_template_for`].
    #[cfg(test)]
    pub(crate) fn rule_for(&self, event_type: &str, aggregate_type: &str) -> Option<usize> {
        self.plan.router.rule_for(event_type, aggregate_type)
    }

    /// Notes that the registry has a schema with `id`: framed payloads
    /// naming it pass from now on (a CloudEvent says `schema`'s content
    /// type and URL).
    pub(crate) fn learn_schema_id(&mut self, id: u32, schema: FramedSchema) {
        self.state.known_ids.insert(id, schema);
    }

    /// Remembers `schema` as `subject`'s (fetched by the relay after
    /// `MappingError::SchemaSubjectUnchecked`).
    pub(crate) fn learn_subject(&mut self, subject: &str, schema: &Arc<RegisteredSchema>) {
        if let Some(routes) = &mut self.state.routes {
            routes.learn(subject, schema);
        }
    }

    /// Topics currently interned.
    #[cfg(test)]
    pub(crate) fn cached_topics(&self) -> usize {
        self.state.topics.len()
    }
}

/// Mutable caches, kept apart from the plan so both can be borrowed at once.
#[derive(Debug, Default)]
struct State {
    topics: TopicCache,
    header_names: HeaderNames,
    /// Reused buffer for rendering templates.
    scratch: Vec<u8>,
    /// The last CloudEvents `time`: commit time (µs) and its text.
    ce_time: Option<(i64, Bytes)>,
    /// `routing.value_format = "framed"`: the schema ids the registry
    /// confirmed (see [`RecordMapper::learn_schema_id`]).
    known_ids: std::collections::HashMap<u32, FramedSchema>,
    /// The subjects' schemas (a value format with a subject).
    routes: Option<SchemaRoutes>,
}

#[derive(Debug)]
struct Layout {
    table: Arc<TableInfo>,
    /// Slot -> position in the row.
    index: Vec<Option<usize>>,
    payload_is_json: bool,
    /// Positions in the row of the `bytea` columns the mapper reads.
    bytea: Vec<usize>,
}

/// The row with the `bytea` values at `positions` turned from their text
/// form into their bytes; every other value is shared, not copied.
fn decode_bytea(row: &Row, positions: &[usize]) -> Result<Row, MappingError> {
    let mut values = row.values.clone();
    for &i in positions {
        if let Some(ColumnValue::Text(text)) = values.get(i) {
            let bytes = bytea::decode(text).ok_or_else(|| MappingError::InvalidBytea {
                column: row.table.columns[i].name.clone(),
                value: quote(text),
            })?;
            values[i] = ColumnValue::Text(bytes);
        }
    }
    Ok(Row {
        table: Arc::clone(&row.table),
        values,
    })
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
    created_at: Option<usize>,
    trace_context: Option<usize>,
    headers: HeaderPlan,
    trace_names: (Arc<str>, Arc<str>),
    /// `None`: the plain format.
    cloudevents: Option<CloudEventsPlan>,
    router: Router,
    value: ValueFormat,
    /// `routing.value_format`.
    value_format: ValueEncoding,
    /// Each rule's value format, when one sets its own.
    rule_formats: Option<Vec<ValueEncoding>>,
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
    fn new(
        columns: &ColumnsConfig,
        routing: &RoutingConfig,
        ce_source: &str,
        schemas: &SchemaSet,
    ) -> Result<(Plan, Option<SchemaRoutes>), MappingConfigError> {
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
        let trace_context = optional("trace_context");
        let extensions_column = optional("ce_extensions");
        let created_at = (routing.value == ValueFormat::Envelope && timestamp.is_none())
            .then(|| slots.slot(CREATED_AT_COLUMN));
        let headers = HeaderPlan::new(columns, routing, headers_column, |c| slots.slot(c));
        let cloudevents = CloudEventsPlan::new(
            routing.format,
            &routing.cloudevents,
            columns,
            ce_source,
            extensions_column,
            |c| slots.slot(c),
        );
        let router = Router::new(columns, routing, topic, event_type, aggregate_type, |c| {
            slots.slot(c)
        })?;
        let routes = SchemaRoutes::new(routing, columns, schemas, |c| slots.slot(c))?;
        let plan = Plan {
            columns: slots.0,
            id,
            key,
            aggregate_type,
            event_type,
            payload,
            timestamp,
            created_at,
            trace_context,
            headers,
            trace_names: (Arc::from(TRACEPARENT_HEADER), Arc::from(TRACESTATE_HEADER)),
            cloudevents,
            router,
            value: routing.value,
            value_format: routing.value_format,
            rule_formats: routing
                .rules
                .iter()
                .any(|r| r.value_format.is_some())
                .then(|| {
                    routing
                        .rules
                        .iter()
                        .map(|r| r.value_format.unwrap_or(routing.value_format))
                        .collect()
                }),
            tombstone: routing.tombstone_on_empty_payload,
        };
        Ok((plan, routes))
    }

    fn layout(&self, table: &Arc<TableInfo>) -> Layout {
        let index: Vec<Option<usize>> =
            self.columns.iter().map(|c| table.column_index(c)).collect();
        let payload_is_json = index[self.payload]
            .and_then(|i| table.columns.get(i))
            .is_some_and(|c| matches!(c.type_oid, JSON_TYPE_OID | JSONB_TYPE_OID));
        let mut bytea: Vec<usize> = index
            .iter()
            .flatten()
            .copied()
            .filter(|&i| table.columns[i].type_oid == bytea::BYTEA_TYPE_OID)
            .collect();
        bytea.sort_unstable();
        bytea.dedup();
        Layout {
            table: table.clone(),
            index,
            payload_is_json,
            bytea,
        }
    }

    fn map(
        &self,
        st: &mut State,
        f: &Fields<'_>,
        payload_is_json: bool,
        commit_time_us: i64,
    ) -> Result<KafkaRecord, MappingError> {
        let id = f.text(self.id, ID_SETTING, false)?;
        let key = f.text(self.key, KEY_SETTING, false)?;
        let aggregate_type = f.text(self.aggregate_type, AGGREGATE_TYPE_SETTING, false)?;
        let event_type = f.text(self.event_type, EVENT_TYPE_SETTING, false)?;
        let payload = f.text(self.payload, PAYLOAD_SETTING, false)?;

        let commit_ms = commit_time_us.div_euclid(1000);
        let column_ms =
            match self.timestamp {
                Some(slot) => match f.text(slot, TIMESTAMP_SETTING, true)? {
                    Some(t) => Some(parse_timestamp_ms(t).ok_or_else(|| {
                        MappingError::InvalidTimestamp {
                            column: f.column(slot).to_string(),
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

        let topic = self.router.topic(
            &mut st.topics,
            &mut st.scratch,
            f,
            event_type,
            aggregate_type,
        )?;
        let encoding = match &self.rule_formats {
            None => self.value_format,
            Some(formats) => self
                .router
                .rule_index(f, event_type, aggregate_type)?
                .map_or(self.value_format, |i| formats[i]),
        };
        let mut registered = None;
        let value = match (encoding, value) {
            (ValueEncoding::Json, value) | (_, value @ None) => value,
            (ValueEncoding::Framed, Some(payload)) => {
                let schema = check_framed(&st.known_ids, id, &payload)?;
                registered = Some((schema.content_type, schema.dataschema.clone()));
                Some(payload)
            }
            (_, Some(payload)) => {
                let event_id = || id.map_or_else(|| "(no id)".to_owned(), |b| quote(b));
                let routes = st
                    .routes
                    .as_mut()
                    .ok_or_else(|| MappingError::InvalidTopic {
                        topic: topic.to_string(),
                        reason: "no schema subject for this value format (routing.subject)".into(),
                    })?;
                let route = routes.route_for(&topic, f, encoding, event_id)?;
                registered = Some((route.schema.schema.content_type(), route.dataschema.clone()));
                Some(encode_framed(&route.schema, id, &payload)?)
            }
        };
        let extra = self
            .cloudevents
            .as_ref()
            .map_or(0, CloudEventsPlan::extra_headers)
            + if self.trace_context.is_some() { 2 } else { 0 };
        let mut headers = self.headers.build(f, id, &mut st.header_names, extra)?;
        if let Some(slot) = self.trace_context {
            if let Some(text) = f.text(slot, TRACE_CONTEXT_SETTING, true)? {
                let context =
                    trace::parse(text).map_err(|reason| MappingError::InvalidTraceContext {
                        column: f.column(slot).to_string(),
                        value: quote(text),
                        reason,
                    })?;
                if let Some(c) = context {
                    headers.push((self.trace_names.0.clone(), Some(c.traceparent)));
                    if let Some(state) = c.tracestate {
                        headers.push((self.trace_names.1.clone(), Some(state)));
                    }
                }
            }
        }
        let value = match &self.cloudevents {
            None => value,
            Some(ce) => {
                let attributes = Attributes {
                    id,
                    event_type,
                    subject: key,
                    content_type: registered.as_ref().map(|(t, _)| *t),
                    dataschema: registered.as_ref().map(|(_, d)| d),
                    commit_time_us,
                };
                ce.apply(
                    &attributes,
                    f,
                    value,
                    payload_is_json,
                    &mut headers,
                    &mut st.ce_time,
                )?
            }
        };

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
}

/// The payload encoded with its topic's schema and framed.
fn encode_framed(
    schema: &RegisteredSchema,
    id: Option<&Bytes>,
    payload: &[u8],
) -> Result<Bytes, MappingError> {
    schema
        .encode_framed(payload)
        .map(Bytes::from)
        .map_err(|e| MappingError::SchemaMismatch {
            event_id: id.map_or_else(|| "(no id)".to_owned(), |b| quote(b)),
            schema_id: schema.id,
            subject: schema.subject.clone(),
            version: schema.version,
            reason: e.to_string(),
            kind: e.kind(),
        })
}

/// A framed payload names a schema id the registry confirmed (its
/// schema's content type and URL); the bytes are sent unchanged.
fn check_framed<'a>(
    known: &'a std::collections::HashMap<u32, FramedSchema>,
    id: Option<&Bytes>,
    payload: &[u8],
) -> Result<&'a FramedSchema, MappingError> {
    let event_id = || id.map_or_else(|| "(no id)".to_owned(), |b| quote(b));
    let schema_id = framed_id(payload).map_err(|reason| MappingError::NotFramed {
        event_id: event_id(),
        reason,
    })?;
    known
        .get(&schema_id)
        .ok_or_else(|| MappingError::SchemaIdUnchecked {
            event_id: event_id(),
            id: schema_id,
        })
}

#[cfg(test)]
#[path = "mapper_tests.rs"]
mod tests;
