//! The `avro` value format: a JSON payload encoded with a registered Avro
//! schema (framed in Confluent's wire format by `outbox::registered`).
//!
//! Pure: the schema comes in as text (the registry client fetches it) and
//! is parsed by the Apache Avro project's crate, then compiled once
//! (`plan`) into what each event's encode needs. The mapping from JSON to
//! Avro, written straight as Avro binary, is in `encode`, and
//! docs/schema-registry.md writes it down for users.

mod binary;
mod decimal;
mod encode;
mod error;
pub(crate) mod json;
mod logical;
mod plan;
mod schema;

#[cfg(test)]
mod bench;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub(crate) use error::EncodeError;
pub(crate) use schema::AvroSchema;
