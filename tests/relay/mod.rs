//! `outboxd run` (and `outboxd backfill`, `outboxd audit`) against a real PostgreSQL and a
//! real Kafka broker: the delivery guarantees, including under faults.

mod acl_rights;
mod audit;
mod backfill;
mod backpressure;
mod cluster;
mod column_types;
mod consumer_inbox;
mod dead_link;
mod e2e;
mod exactly_once;
mod exactly_once_faults;
mod exactly_once_ops;
mod faults;
mod formats;
mod ledger_acks;
mod ledger_acl;
mod memory;
mod names;
mod partitioned;
mod pg_restart;
mod pg_secure;
mod poison;
mod secure;
mod slot_loss;
mod slow_commits;
mod standby;
mod stuck_producer;
mod table_watch;
mod table_watch_idle;
mod tables;
