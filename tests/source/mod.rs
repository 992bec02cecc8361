//! The PostgreSQL source and `outboxd tail`, against private clusters.
//! The whole module also runs on PostgreSQL 14, 16, 17 and 18
//! (`OUTBOXD_TEST_PG_VERSION`).

mod auth;
mod exact_rows;
mod failover;
mod messages;
mod names;
mod preflight;
mod restart;
mod schema_change;
mod support;
