//! The position ledger: where the relay is, kept outside PostgreSQL (in a
//! compacted Kafka topic, see `crate::sink::LedgerTopic`), so a lost slot,
//! a failover or a restore is noticed instead of silently starting over at
//! the current WAL position.
//!
//! # Invariant
//!
//! **The ledger is never ahead of the acknowledgements.** Every position it
//! records is one the ack tracker called confirmable at that moment: every
//! event up to it is in Kafka. It may lag the slot by about one status
//! interval (it is written at most once per interval), never lead it by an
//! unacked event. [`LedgerWriter`] is the only way to make an entry.
//!
//! # Format (version 1)
//!
//! One record per relay identity ([`LedgerIdentity`]), keyed
//! `<system_identifier>/<database>/<slot>`: the system identifier is
//! decimal digits and a slot name is `[a-z0-9_]`, so splitting at the first
//! and the last `/` is unambiguous even for a database name containing `/`.
//! The value is JSON ([`LedgerEntry`]), e.g.
//!
//! ```json
//! {"version":1,"system_identifier":"7443001228541284437","database":"app",
//!  "slot":"outboxd","timeline":1,"confirmed_lsn":"0/1A2B3C8",
//!  "commit_time_us":1764569428123456,"outboxd_version":"0.1.0",
//!  "written_at_us":1764569429000000,"accepted_gaps":[]}
//! ```
//!
//! Fields may be added within version 1 (readers ignore unknown ones); a
//! change old readers would misread bumps `version`, and a reader refuses a
//! version it does not know ([`LedgerFormatError::UnsupportedVersion`])
//! rather than guess. Times are microseconds since the Unix epoch, LSNs
//! PostgreSQL's `X/Y` text.
//!
//! Files: `entry` (identity, entry, parsing), `writer` (when to write),
//! `writes` (what the writer task sends next: supersede, age limit),
//! `start` (what a (re)start finds and decides). Pure: no I/O, no clock.

mod entry;
mod start;
mod writer;
mod writes;

#[cfg(test)]
mod writer_proptest;

pub use entry::{
    format_time_us, AcceptedGap, InsideTransaction, LedgerEntry, LedgerFormatError, LedgerIdentity,
    LEDGER_VERSION,
};
pub(crate) use start::{
    decide_start, select_entry, GapReason, SlotState, StartDecision, StartGap, StartInputs,
};
pub(crate) use writer::{CommitPosition, LedgerWriter};
pub(crate) use writes::{LedgerWrites, Next as NextWrite, WriteFailure};
