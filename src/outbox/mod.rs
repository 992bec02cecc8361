//! Rows to events: what an outbox event is, and (with the Kafka sink) how it
//! maps to a Kafka record.

pub mod envelope;
pub mod event;
pub mod mapper;
pub mod record;
pub mod topic;

pub use event::{ColumnInfo, ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
pub use mapper::{MappingConfigError, MappingError, RecordMapper};
pub use record::KafkaRecord;
