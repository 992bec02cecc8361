//! The `avro` value format: a JSON payload encoded with a registered Avro
//! schema (framed in Confluent's wire format by `outbox::registered`).
//!
//! Pure: the schema comes in parsed (the registry client fetches it); the
//! mapping from JSON to Avro is in `value`, and docs/schema-registry.md
//! writes it down for users. Schemas are parsed and datums encoded by the
//! Apache Avro project's crate.

mod decimal;
mod error;
pub(crate) mod json;
mod logical;
mod schema;
mod value;

#[cfg(test)]
mod bench;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub(crate) use error::EncodeError;
pub(crate) use schema::AvroSchema;
