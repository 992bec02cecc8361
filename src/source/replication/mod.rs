//! Our walsender connection, built on postgres-protocol's codecs because
//! tokio-postgres has no replication mode.
//!
//! One file per flow: `connect` (startup, TLS), `auth` (the login, with
//! `channel_binding` for SCRAM-SHA-256-PLUS), `framed` (cancel-safe frames),
//! `commands` (IDENTIFY_SYSTEM, START_REPLICATION), `stream` (receive,
//! status updates), `protocol` (the pure CopyData sub-protocol).

mod auth;
pub(crate) mod channel_binding;
pub(crate) mod commands;
pub mod connect;
pub(crate) mod error;
pub(crate) mod framed;
pub(crate) mod message_skip;
pub(crate) mod protocol;
pub(crate) mod stream;
pub(crate) mod tls;

pub use crate::config::conn_params::{ConnParams, SslMode};
pub(crate) use commands::StartOptions;
pub use connect::{connect, WalConnection};
pub use error::{ReplicationError, ServerError};
pub(crate) use message_skip::MessageSkip;
pub(crate) use protocol::ServerMessage;
pub(crate) use stream::ReplicationStream;
