//! Rows to events: what an outbox event is, and (with the Kafka sink) how it
//! maps to a Kafka record.

pub(crate) mod avro;
pub(crate) mod bytea;
mod cloudevents;
pub(crate) mod envelope;
mod error;
pub(crate) mod event;
mod fields;
mod headers;
mod json;
mod json_schema;
pub(crate) mod mapper;
mod message;
pub(crate) mod record;
pub(crate) mod registered;
mod route;
mod schema_routes;
mod tables;
pub(crate) mod topic;
mod trace;

pub(crate) use event::{ColumnInfo, ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
pub use headers::BACKFILL_HEADER;
pub(crate) use mapper::{MappingConfigError, RecordMapper};
pub(crate) use record::{KafkaRecord, RecordHeader};
pub(crate) use schema_routes::registry_subjects;
pub(crate) use tables::TableMappers;
