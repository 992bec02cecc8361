//! Our walsender connection, built on postgres-protocol's codecs because
//! tokio-postgres has no replication mode.
//!
//! One file per flow: `connect` (startup, TLS, auth), `framed` (cancel-safe
//! frames), `commands` (IDENTIFY_SYSTEM, START_REPLICATION), `stream`
//! (receive, status updates), `protocol` (the pure CopyData sub-protocol).

pub mod commands;
pub mod conn_params;
pub mod connect;
pub mod error;
pub mod framed;
pub(crate) mod message_skip;
pub mod protocol;
pub(crate) mod stream;
pub mod tls;

pub use commands::{StartOptions, SystemIdentity};
pub use conn_params::{ConnParams, SslMode};
pub use connect::{connect, WalConnection};
pub use error::{ReplicationError, ServerError};
pub(crate) use message_skip::MessageSkip;
pub use protocol::ServerMessage;
pub(crate) use stream::ReplicationStream;
