//! Real servers for the tests: private PostgreSQL clusters and a Kafka broker.

pub mod http;
pub mod kafka;
pub mod outboxd;
pub mod pg;
pub mod proxy;
pub mod python;
pub mod registry;
pub mod standby;
pub mod watchdog;
