//! `routing.format = "cloudevents-binary" | "cloudevents-structured"`: the
//! event as a CloudEvent 1.0.2, laid out by the Kafka protocol binding.
//!
//! | attribute         | from                                              |
//! |-------------------|---------------------------------------------------|
//! | `specversion`     | `1.0`                                             |
//! | `id`              | the id column                                     |
//! | `source`          | `routing.cloudevents.source`, or the table's default |
//! | `type`            | the event type column                             |
//! | `time`            | the commit time, RFC 3339 with microseconds       |
//! | `subject`         | the aggregate id (the key column), when not empty |
//! | `datacontenttype` | `routing.cloudevents.data_content_type`, or the registry value format's (`application/avro`, `application/schema+json`) |
//! | `dataschema`      | a registry value format: `<registry url>/schemas/ids/<id>` |
//! | extensions        | `routing.cloudevents.extensions`, `ce_extensions` |
//!
//! The record key stays the aggregate id: the binding's `partitionkey`.
//! Binary mode adds `ce_<attribute>` headers (and `content-type`) and leaves
//! the value as the payload's bytes; structured mode writes one JSON object
//! with the payload verbatim as `data`. Everything that is the same for
//! every event of the table (names, `specversion`, `source`, the content
//! type, structured mode's leading JSON) is built once here.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::config::cloudevents::{check_extension_name, CloudEventsConfig, EventFormat};
use crate::config::outbox::ColumnsConfig;
use crate::config::routing::resolve_column;
use crate::outbox::envelope::{is_json_text, write_text};
use crate::outbox::error::{MappingError, CE_EXTENSIONS_SETTING};
use crate::outbox::fields::Fields;
use crate::outbox::record::{write_rfc3339_us, RecordHeader};

const SPEC_VERSION: &str = "1.0";
/// Structured mode's `content-type`: the JSON event format.
const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
/// The binding's name for the header of `datacontenttype`.
const CONTENT_TYPE_HEADER: &str = "content-type";
/// Extensions a `ce_extensions` value may hold.
const MAX_EXTENSIONS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Binary,
    Structured,
}

/// A header name and value built once, cloned per event. Never null.
type Fixed = RecordHeader;

/// The CloudEvents settings of one table, compiled.
#[derive(Debug)]
pub(super) struct CloudEventsPlan {
    mode: Mode,
    specversion: Fixed,
    source: Fixed,
    /// `content-type` = `datacontenttype` (binary mode).
    data_content_type: Fixed,
    /// `content-type` = the JSON event format (structured mode).
    structured_content_type: Fixed,
    id: Arc<str>,
    type_: Arc<str>,
    time: Arc<str>,
    subject: Arc<str>,
    dataschema: Arc<str>,
    /// From `routing.cloudevents.extensions`, in name order.
    extensions: Vec<Extension>,
    /// Slot of the `ce_extensions` column.
    extensions_column: Option<usize>,
    /// `{"specversion":"1.0","source":…,"datacontenttype":…` for structured
    /// mode, the same for every event.
    json_head: Vec<u8>,
}

#[derive(Debug)]
struct Extension {
    attribute: Box<str>,
    header: Arc<str>,
    slot: usize,
    /// `routing.cloudevents.extensions.<name>`, for errors.
    setting: Box<str>,
}

/// One event's own attributes.
pub(super) struct Attributes<'a> {
    pub id: Option<&'a Bytes>,
    pub event_type: Option<&'a Bytes>,
    pub subject: Option<&'a Bytes>,
    /// A registry value format's: the content type (which replaces
    /// `routing.cloudevents.data_content_type`; config validation refuses
    /// both at once), and where the value's schema is.
    pub content_type: Option<&'static str>,
    pub dataschema: Option<&'a Bytes>,
    pub commit_time_us: i64,
}

/// An extension attribute's value as the CloudEvents type system has it.
enum ExtValue {
    /// A String, as its bytes.
    Text(Bytes),
    /// A Boolean or an Integer, as its canonical text and JSON.
    Literal(String),
}

impl CloudEventsPlan {
    /// `None` for the plain format. `source` is the table's `source`.
    pub(super) fn new(
        format: EventFormat,
        config: &CloudEventsConfig,
        columns: &ColumnsConfig,
        source: &str,
        extensions_column: Option<usize>,
        mut slot_for: impl FnMut(&str) -> usize,
    ) -> Option<CloudEventsPlan> {
        let mode = match format {
            EventFormat::Plain => return None,
            EventFormat::CloudeventsBinary => Mode::Binary,
            EventFormat::CloudeventsStructured => Mode::Structured,
        };
        let fixed = |name: &str, value: &str| -> Fixed {
            (
                Arc::from(name),
                Some(Bytes::copy_from_slice(value.as_bytes())),
            )
        };
        let content_type = config.data_content_type();
        let mut json_head = Vec::with_capacity(96 + source.len());
        json_head.extend_from_slice(b"{\"specversion\":\"1.0\",\"source\":");
        write_text(&mut json_head, Some(source.as_bytes()));
        json_head.extend_from_slice(b",\"datacontenttype\":");
        write_text(&mut json_head, Some(content_type.as_bytes()));
        Some(CloudEventsPlan {
            mode,
            specversion: fixed("ce_specversion", SPEC_VERSION),
            source: fixed("ce_source", source),
            data_content_type: fixed(CONTENT_TYPE_HEADER, content_type),
            structured_content_type: fixed(CONTENT_TYPE_HEADER, STRUCTURED_CONTENT_TYPE),
            id: Arc::from("ce_id"),
            type_: Arc::from("ce_type"),
            time: Arc::from("ce_time"),
            subject: Arc::from("ce_subject"),
            dataschema: Arc::from("ce_dataschema"),
            extensions: config
                .extensions
                .iter()
                .map(|(name, column)| Extension {
                    attribute: name.as_str().into(),
                    header: Arc::from(format!("ce_{name}")),
                    slot: slot_for(resolve_column(columns, column)),
                    setting: format!("routing.cloudevents.extensions.{name}").into(),
                })
                .collect(),
            extensions_column,
            json_head,
        })
    }

    /// Headers a CloudEvent adds at most, besides extensions.
    pub(super) fn extra_headers(&self) -> usize {
        8 + self.extensions.len()
    }

    /// Makes the record a CloudEvent: appends its headers to `headers` and
    /// returns its value. `payload` is the value the plain format would
    /// send (`None`: a tombstone, which carries its attributes in binary
    /// mode's headers whichever the mode, having no value to put them in).
    pub(super) fn apply(
        &self,
        event: &Attributes<'_>,
        f: &Fields<'_>,
        payload: Option<Bytes>,
        payload_is_json: bool,
        headers: &mut Vec<RecordHeader>,
        last_time: &mut Option<(i64, Bytes)>,
    ) -> Result<Option<Bytes>, MappingError> {
        let required = |v: Option<&Bytes>, attribute: &str, setting: &str| match v {
            Some(b) if !b.is_empty() => Ok(b.clone()),
            _ => Err(MappingError::CloudEvent {
                reason: format!(
                    "its {attribute} ({setting}) is NULL or empty; CloudEvents require one"
                ),
            }),
        };
        let id = required(event.id, "id", "outbox.columns.id")?;
        let type_ = required(event.event_type, "type", "outbox.columns.event_type")?;
        let subject = event.subject.filter(|s| !s.is_empty());
        // The events of one transaction share their commit time: its text
        // is written once.
        let time = match last_time {
            Some((us, text)) if *us == event.commit_time_us => text.clone(),
            _ => {
                let mut text = Vec::with_capacity(27);
                write_rfc3339_us(&mut text, event.commit_time_us);
                let text = Bytes::from(text);
                *last_time = Some((event.commit_time_us, text.clone()));
                text
            }
        };
        let extensions = self.extension_values(f)?;

        let binary = self.mode == Mode::Binary || payload.is_none();
        if binary {
            match (&payload, event.content_type) {
                (None, _) => {}
                (Some(_), None) => headers.push(self.data_content_type.clone()),
                (Some(_), Some(t)) => headers.push((
                    self.data_content_type.0.clone(),
                    Some(Bytes::from_static(t.as_bytes())),
                )),
            }
            headers.push(self.specversion.clone());
            headers.push((self.id.clone(), Some(id)));
            headers.push(self.source.clone());
            headers.push((self.type_.clone(), Some(type_)));
            headers.push((self.time.clone(), Some(time)));
            // An unset attribute is no header (CloudEvents treat null as unset).
            if let Some(s) = subject {
                headers.push((self.subject.clone(), Some(s.clone())));
            }
            if let Some(d) = event.dataschema {
                headers.push((self.dataschema.clone(), Some(d.clone())));
            }
            for (header, value) in extensions {
                let value = match value {
                    ExtValue::Text(b) => b,
                    ExtValue::Literal(s) => Bytes::from(s),
                };
                headers.push((header, Some(value)));
            }
            return Ok(payload);
        }
        headers.push(self.structured_content_type.clone());
        let data = payload.expect("a tombstone takes the binary path");
        let mut v = Vec::with_capacity(self.json_head.len() + 160 + data.len());
        v.extend_from_slice(&self.json_head);
        v.extend_from_slice(b",\"id\":");
        write_text(&mut v, Some(&id[..]));
        v.extend_from_slice(b",\"type\":");
        write_text(&mut v, Some(&type_[..]));
        v.extend_from_slice(b",\"time\":\"");
        v.extend_from_slice(&time);
        v.push(b'"');
        if let Some(s) = subject {
            v.extend_from_slice(b",\"subject\":");
            write_text(&mut v, Some(&s[..]));
        }
        for (header, value) in &extensions {
            v.push(b',');
            write_text(&mut v, Some(&header.as_bytes()[3..]));
            v.push(b':');
            match value {
                ExtValue::Text(b) => write_text(&mut v, Some(&b[..])),
                ExtValue::Literal(s) => v.extend_from_slice(s.as_bytes()),
            }
        }
        v.extend_from_slice(b",\"data\":");
        // JSON data goes in as JSON (verbatim: no parse and re-serialise);
        // anything else as a JSON string.
        if payload_is_json || is_json_text(&data) {
            v.extend_from_slice(&data);
        } else {
            write_text(&mut v, Some(&data));
        }
        v.push(b'}');
        Ok(Some(Bytes::from(v)))
    }

    /// The event's extension attributes: the configured ones, then the
    /// `ce_extensions` column's; NULL values left out. A name is checked
    /// against the spec's rule and may appear once.
    fn extension_values(&self, f: &Fields<'_>) -> Result<Vec<(Arc<str>, ExtValue)>, MappingError> {
        let mut out: Vec<(Arc<str>, ExtValue)> = Vec::new();
        for e in &self.extensions {
            if let Some(v) = f.text(e.slot, &e.setting, true)? {
                out.push((e.header.clone(), ExtValue::Text(v.clone())));
            }
        }
        let Some(slot) = self.extensions_column else {
            return Ok(out);
        };
        let Some(json) = f.text(slot, CE_EXTENSIONS_SETTING, true)? else {
            return Ok(out);
        };
        let column = f.column(slot);
        let bad = |reason: String| MappingError::CloudEvent {
            reason: format!("extensions column `{column}` ({CE_EXTENSIONS_SETTING}): {reason}"),
        };
        let object: serde_json::Map<String, Value> = serde_json::from_slice(json)
            .map_err(|e| bad(format!("not a JSON object of attribute name to value: {e}")))?;
        if object.len() > MAX_EXTENSIONS {
            return Err(bad(format!(
                "{} attributes; at most {MAX_EXTENSIONS} are allowed",
                object.len()
            )));
        }
        for (name, value) in object {
            check_extension_name(&name).map_err(&bad)?;
            if self.extensions.iter().any(|e| *e.attribute == *name) {
                return Err(bad(format!(
                    "`{name}` is also set by routing.cloudevents.extensions.{name}; set it once"
                )));
            }
            let value = match value {
                Value::Null => continue,
                Value::String(s) => ExtValue::Text(Bytes::from(s)),
                Value::Bool(b) => ExtValue::Literal(b.to_string()),
                Value::Number(n) if n.as_i64().is_some_and(|i| i32::try_from(i).is_ok()) => {
                    ExtValue::Literal(n.to_string())
                }
                other => {
                    return Err(bad(format!(
                        "`{name}` is {other}; a CloudEvents attribute is a string, a boolean \
                         or an integer from -2147483648 to 2147483647"
                    )))
                }
            };
            out.push((Arc::from(format!("ce_{name}")), value));
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "cloudevents_tests.rs"]
mod tests;
