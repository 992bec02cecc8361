//! The `json-schema` value format: the JSON payload checked against the
//! subject's registered JSON Schema; the bytes sent are the payload's own,
//! behind the Confluent frame.
//!
//! Schemas are compiled by the `boon` crate (drafts 4, 6, 7, 2019-09 and
//! 2020-12, the meta-schemas built in). Nothing is ever loaded from outside:
//! a `$ref` that leaves the registered schema fails when the schema is
//! parsed, at start, rather than making the relay fetch a URL or read a file.

use std::error::Error;

use boon::{Compiler, Draft, ErrorKind, SchemaIndex, Schemas, UrlLoader, ValidationError};

use crate::outbox::avro::EncodeError;

/// Where the registered schema is filed inside the compiler: a name of our
/// own, since a registry schema need not have an `$id`; hierarchical, so a
/// relative `$ref` resolves (to a URL that is then refused, not fetched).
const SCHEMA_LOCATION: &str = "https://outboxd.invalid/registered-schema.json";

/// A compiled JSON Schema.
pub(crate) struct JsonSchema {
    schemas: Schemas,
    root: SchemaIndex,
}

impl std::fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JsonSchema")
    }
}

/// Refuses every URL: a schema's references must resolve inside it (or to
/// the drafts' meta-schemas, which `boon` carries).
struct NoLoader;

impl UrlLoader for NoLoader {
    fn load(&self, url: &str) -> Result<serde_json::Value, Box<dyn Error>> {
        Err(format!(
            "`{url}` is outside the registered schema, and outboxd loads no remote or local \
             references; inline it under $defs"
        )
        .into())
    }
}

impl JsonSchema {
    /// Compiles a JSON Schema's text (as the registry serves it). Without a
    /// `$schema`, draft-07 applies: what Confluent's JSON Schema serializer
    /// assumes.
    pub(crate) fn parse(text: &str) -> Result<JsonSchema, String> {
        let doc: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let mut compiler = Compiler::new();
        compiler.set_default_draft(Draft::V7);
        compiler.use_loader(Box::new(NoLoader));
        compiler
            .add_resource(SCHEMA_LOCATION, doc)
            .map_err(|e| e.to_string())?;
        let mut schemas = Schemas::new();
        let root = compiler
            .compile(SCHEMA_LOCATION, &mut schemas)
            .map_err(|e| format!("{e:#}"))?;
        Ok(JsonSchema { schemas, root })
    }

    /// Checks `payload` (JSON text) against the schema.
    pub(crate) fn validate(&self, payload: &[u8]) -> Result<(), EncodeError> {
        let value: serde_json::Value = serde_json::from_slice(payload)
            .map_err(|e| EncodeError::NotJson(format!("the payload is not JSON: {e}")))?;
        self.schemas
            .validate(&value, self.root)
            .map_err(|e| mismatch(&e))
    }
}

/// The first leaf of boon's error tree: where in the payload (a JSON
/// pointer), which keyword, and what it says.
fn mismatch(error: &ValidationError<'_, '_>) -> EncodeError {
    let mut leaf = error;
    while let Some(first) = leaf.causes.first() {
        leaf = first;
    }
    let pointer = leaf.instance_location.to_string();
    let keyword = match &leaf.kind {
        // boon 0.6 names this one `additionalProperty`.
        ErrorKind::AdditionalProperties { .. } => "additionalProperties".to_owned(),
        // A `false` subschema: where it sits in the schema.
        ErrorKind::FalseSchema => format!(
            "false (schema location {})",
            leaf.schema_url
                .split_once('#')
                .map_or(leaf.schema_url, |(_, f)| f)
        ),
        kind => kind
            .keyword_path()
            .map_or_else(|| "(schema)".to_owned(), |k| k.keyword.to_owned()),
    };
    EncodeError::Invalid {
        pointer,
        keyword,
        reason: leaf.kind.to_string(),
    }
}

#[cfg(test)]
#[path = "json_schema_tests.rs"]
mod tests;
