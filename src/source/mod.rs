//! The PostgreSQL side: the walsender connection, pgoutput decoding, and
//! slot/publication administration on an ordinary SQL connection.
//!
//! Imports run one way: `table` and `ceiling` at the bottom, then `admin`,
//! `assembler` (pgoutput messages to outbox events), `error`, `driver` (the
//! task that owns the stream) and `session` (opening the stream) on top.

pub mod admin;
pub(crate) mod assembler;
pub(crate) mod ceiling;
mod confirmation_lag;
pub(crate) mod driver;
pub mod error;
pub mod outbox_rows;
pub mod pgoutput;
pub mod replication;
pub mod session;
pub mod table;
