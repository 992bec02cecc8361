//! The PostgreSQL side: the walsender connection, pgoutput decoding, and
//! slot/publication administration on an ordinary SQL connection.

pub mod admin;
mod confirmation_lag;
pub(crate) mod driver;
pub mod outbox_rows;
pub mod pgoutput;
pub mod replication;
pub mod session;
pub(crate) mod transactions;
