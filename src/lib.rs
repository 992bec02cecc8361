//! outboxd: relays transactional-outbox events from a PostgreSQL logical
//! replication slot (pgoutput) to Kafka, confirming the slot only after Kafka
//! has acknowledged every event up to the confirmed position.
//!
//! Data flows `source` → `outbox` → `sink` → `progress`, wired by `relay`.

pub mod audit;
pub mod cli;
pub mod clock;
pub mod config;
pub mod lsn;
pub mod metrics;
pub mod outbox;
pub mod progress;
pub mod registry;
pub mod relay;
pub mod sink;
pub mod source;

pub use lsn::Lsn;
