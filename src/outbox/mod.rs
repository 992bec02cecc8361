//! Rows to events: what an outbox event is, and (with the Kafka sink) how it
//! maps to a Kafka record.

pub mod bytea;
pub mod envelope;
mod error;
pub mod event;
mod fields;
mod headers;
mod json;
pub mod mapper;
mod message;
pub mod record;
mod route;
mod tables;
pub mod topic;

pub use event::{ColumnInfo, ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
pub use mapper::{MappingConfigError, MappingError, RecordMapper};
pub use record::KafkaRecord;
pub use tables::TableMappers;
