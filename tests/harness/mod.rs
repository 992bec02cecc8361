//! Real servers for the tests: private PostgreSQL clusters and a Kafka
//! broker; `outboxd run` against them, events written and read back.

pub mod admin_ffi;
pub mod cargo;
pub mod events;
pub mod http;
pub mod kafka;
pub mod kafka_acl;
pub mod kafka_cluster;
pub mod kafka_secure;
pub mod outboxd;
pub mod pg;
pub mod pg_tls;
pub mod proxy;
pub mod python;
pub mod registry;
pub mod registry_auth;
pub mod registry_tls;
pub mod relay;
pub mod standby;
pub mod topic_reader;
pub mod wait;
pub mod watchdog;
pub mod writers;
