//! The `avro` value format: a JSON payload encoded with a registered Avro
//! schema, framed in Confluent's wire format (a zero byte, the schema id as
//! 4 bytes big-endian, then the Avro binary datum).
//!
//! Pure: the schema comes in parsed (the registry client fetches it); the
//! mapping from JSON to Avro is in `value`, and docs/schema-registry.md
//! writes it down for users. Schemas are parsed and datums encoded by the
//! Apache Avro project's crate.

mod decimal;
mod error;
pub(crate) mod json;
mod logical;
mod routes;
mod schema;
mod value;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub(crate) use routes::{avro_subjects, AvroRoutes, SchemaSet};
pub(crate) use schema::{AvroSchema, RegisteredSchema};
