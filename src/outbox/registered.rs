//! A schema as the registry knows it (id, subject, version, and the parsed
//! Avro or JSON Schema), and Confluent's wire format, which both registry
//! encodings share: a zero byte, the schema id as 4 bytes big-endian, then
//! the encoded value.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::value_format::ValueEncoding;
use crate::outbox::avro::{AvroSchema, EncodeError};
use crate::outbox::json_schema::JsonSchema;

/// Confluent's wire format starts every framed value with this byte.
pub(crate) const MAGIC_BYTE: u8 = 0;
/// The magic byte and the schema id.
pub(crate) const FRAME_HEADER_LEN: usize = 5;

/// Registered schemas by subject, as fetched for the relay's start.
pub(crate) type SchemaSet = HashMap<String, Arc<RegisteredSchema>>;

/// The parsed schema, by the registry's `schemaType`.
#[derive(Debug)]
pub(crate) enum SchemaKind {
    Avro(AvroSchema),
    Json(JsonSchema),
}

/// A schema as the registry knows it: what the framed value names (`id`)
/// and what errors and logs name (`subject`, `version`).
#[derive(Debug)]
pub(crate) struct RegisteredSchema {
    pub id: u32,
    pub subject: String,
    pub version: u32,
    pub schema: SchemaKind,
    /// The registry's base URL that served it (no trailing `/`): where a
    /// consumer finds it by id, e.g. for CloudEvents' `dataschema`.
    pub url: String,
}

impl SchemaKind {
    /// Parses a schema's text by the registry's `schemaType` (absent means
    /// AVRO, as in Confluent's API).
    pub(crate) fn parse(schema_type: Option<&str>, text: &str) -> Result<SchemaKind, String> {
        match schema_type.unwrap_or("AVRO") {
            "AVRO" => AvroSchema::parse(text)
                .map(SchemaKind::Avro)
                .map_err(|e| format!("the Avro schema does not parse: {e}")),
            "JSON" => JsonSchema::parse(text)
                .map(SchemaKind::Json)
                .map_err(|e| format!("the JSON Schema does not compile: {e}")),
            other => Err(format!(
                "is a {other} schema; outboxd encodes with AVRO and JSON schemas only"
            )),
        }
    }

    /// The registry's `schemaType`.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            SchemaKind::Avro(_) => "AVRO",
            SchemaKind::Json(_) => "JSON",
        }
    }

    /// The CloudEvents `datacontenttype` of values encoded with it.
    pub(crate) fn content_type(&self) -> &'static str {
        match self {
            SchemaKind::Avro(_) => "application/avro",
            SchemaKind::Json(_) => "application/schema+json",
        }
    }

    /// Whether `routing.value_format = encoding` encodes with this schema.
    pub(crate) fn serves(&self, encoding: ValueEncoding) -> bool {
        matches!(
            (self, encoding),
            (SchemaKind::Avro(_), ValueEncoding::Avro)
                | (SchemaKind::Json(_), ValueEncoding::JsonSchema)
        )
    }
}

impl RegisteredSchema {
    /// Where the schema is served by id: `<registry url>/schemas/ids/<id>`.
    pub(crate) fn by_id_url(&self) -> String {
        format!("{}/schemas/ids/{}", self.url, self.id)
    }

    /// The framed value: magic byte, schema id, then the Avro datum or (JSON
    /// Schema) the payload's own bytes once they pass the schema.
    pub(crate) fn encode_framed(&self, payload: &[u8]) -> Result<Vec<u8>, EncodeError> {
        if let SchemaKind::Json(schema) = &self.schema {
            schema.validate(payload)?;
        }
        let mut out = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
        out.push(MAGIC_BYTE);
        out.extend_from_slice(&self.id.to_be_bytes());
        match &self.schema {
            SchemaKind::Avro(schema) => schema.encode(payload, &mut out)?,
            SchemaKind::Json(_) => out.extend_from_slice(payload),
        }
        Ok(out)
    }
}

/// What a `framed` value's schema id tells a CloudEvent (binary mode):
/// the content type of its schema's type, and where the schema is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FramedSchema {
    pub content_type: &'static str,
    /// `<registry url>/schemas/ids/<id>`.
    pub dataschema: Bytes,
}

impl FramedSchema {
    /// For schema `id` of the registry's `schema_type` (absent means AVRO),
    /// served by the registry at `url` (no trailing `/`). outboxd does not
    /// parse a framed value's schema, so any type the registry serves goes.
    pub(crate) fn new(id: u32, schema_type: Option<&str>, url: &str) -> FramedSchema {
        FramedSchema {
            content_type: match schema_type.unwrap_or("AVRO") {
                "AVRO" => "application/avro",
                "JSON" => "application/schema+json",
                "PROTOBUF" => "application/protobuf",
                _ => "application/octet-stream",
            },
            dataschema: Bytes::from(format!("{url}/schemas/ids/{id}")),
        }
    }
}

/// The schema id of a framed value, or why `value` is not one.
pub(crate) fn framed_id(value: &[u8]) -> Result<u32, String> {
    match value {
        [MAGIC_BYTE, a, b, c, d, ..] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        [MAGIC_BYTE, ..] | [] => Err(format!(
            "{} bytes are too short for a framed value (a zero byte, a 4-byte schema id, \
             then the record)",
            value.len()
        )),
        [first, ..] => Err(format!(
            "the first byte is 0x{first:02x}, not the magic byte 0x00 of Confluent's wire format"
        )),
    }
}
