//! Rows to events: what an outbox event is, and (with the Kafka sink) how it
//! maps to a Kafka record.

pub mod event;

pub use event::{ColumnInfo, ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
