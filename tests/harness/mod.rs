//! Real servers for the tests: private PostgreSQL clusters and a Kafka broker.

pub mod outboxd;
pub mod pg;
