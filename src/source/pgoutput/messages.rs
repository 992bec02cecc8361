//! The pgoutput messages, one struct per message of the PostgreSQL docs
//! ("Logical Replication Message Formats"), with the docs' field names.
//!
//! Conventions: LSNs are [`Lsn`]; timestamps are `i64` microseconds since the
//! PostgreSQL epoch (see [`pg_time_to_unix_us`]); xids and OIDs are `u32`;
//! names are `String`; payloads are [`Bytes`] slices of the decoded frame.
//! `xid: Option<u32>` is `Some` only inside a stream block (protocol >= 2),
//! where changes of an in-progress transaction carry their transaction's xid.

use bytes::Bytes;

use crate::Lsn;

/// Microseconds from the Unix epoch (1970-01-01) to the PostgreSQL epoch
/// (2000-01-01): 10,957 days of 86,400 s.
pub const PG_EPOCH_OFFSET_US: i64 = 10_957 * 86_400 * 1_000_000;

/// Converts a PostgreSQL timestamp to microseconds since the Unix epoch.
///
/// Saturates instead of overflowing: PostgreSQL's `infinity` is `i64::MAX`
/// and must stay the largest value rather than wrap.
pub fn pg_time_to_unix_us(t: i64) -> i64 {
    t.saturating_add(PG_EPOCH_OFFSET_US)
}

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    Begin(Begin),
    Commit(Commit),
    Origin(Origin),
    Relation(Relation),
    Type(TypeMessage),
    Insert(Insert),
    Update(Update),
    Delete(Delete),
    Truncate(Truncate),
    Message(Message),
    StreamStart(StreamStart),
    StreamStop,
    StreamCommit(StreamCommit),
    StreamAbort(StreamAbort),
    BeginPrepare(BeginPrepare),
    Prepare(Prepare),
    CommitPrepared(CommitPrepared),
    RollbackPrepared(RollbackPrepared),
    StreamPrepare(StreamPrepare),
}

/// 'B': start of a transaction that is sent whole at commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    /// Equals the matching [`Commit::commit_lsn`].
    pub final_lsn: Lsn,
    pub commit_time: i64,
    pub xid: u32,
}

/// 'C': end of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Currently unused by PostgreSQL (always 0).
    pub flags: u8,
    pub commit_lsn: Lsn,
    /// The position to confirm once the transaction is handled: confirming
    /// `commit_lsn` instead makes the server resend this transaction.
    pub end_lsn: Lsn,
    pub commit_time: i64,
}

/// 'O': the transaction was replicated into this server from `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub commit_lsn: Lsn,
    pub name: String,
}

/// 'R': the schema of a table, sent before its first change and after every
/// schema change. Changes name tables only by OID, so keep these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub xid: Option<u32>,
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    /// `relreplident`: see the `REPLICA_IDENTITY_*` constants.
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

impl Relation {
    /// Primary key (or nothing if there is none).
    pub const REPLICA_IDENTITY_DEFAULT: u8 = b'd';
    /// No old values at all.
    pub const REPLICA_IDENTITY_NOTHING: u8 = b'n';
    /// All columns of the old row.
    pub const REPLICA_IDENTITY_FULL: u8 = b'f';
    /// The columns of a chosen unique index.
    pub const REPLICA_IDENTITY_INDEX: u8 = b'i';
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Bit 1 ([`RelationColumn::FLAG_KEY`]): the column is part of the key.
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    /// `atttypmod`; -1 when the type has none.
    pub type_modifier: i32,
}

impl RelationColumn {
    pub const FLAG_KEY: u8 = 1;

    pub fn is_key(&self) -> bool {
        self.flags & Self::FLAG_KEY != 0
    }
}

/// 'Y': a non-builtin column type, so its OID can be named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMessage {
    pub xid: Option<u32>,
    pub oid: u32,
    pub namespace: String,
    pub name: String,
}

/// 'I'
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    pub xid: Option<u32>,
    pub relation_oid: u32,
    pub new: TupleData,
}

/// 'U'
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub xid: Option<u32>,
    pub relation_oid: u32,
    /// Present only when the key changed or the replica identity is FULL.
    pub old: Option<OldTuple>,
    pub new: TupleData,
}

/// 'D'
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    pub xid: Option<u32>,
    pub relation_oid: u32,
    pub old: OldTuple,
}

/// 'T'
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    pub xid: Option<u32>,
    /// See [`Truncate::CASCADE`] and [`Truncate::RESTART_IDENTITY`].
    pub options: u8,
    pub relation_oids: Vec<u32>,
}

impl Truncate {
    pub const CASCADE: u8 = 1;
    pub const RESTART_IDENTITY: u8 = 2;

    pub fn cascade(&self) -> bool {
        self.options & Self::CASCADE != 0
    }

    pub fn restart_identity(&self) -> bool {
        self.options & Self::RESTART_IDENTITY != 0
    }
}

/// 'M': a `pg_logical_emit_message` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub xid: Option<u32>,
    /// Transactional messages arrive between Begin and Commit; others arrive
    /// on their own as soon as they are decoded, even if their transaction
    /// later aborts.
    pub transactional: bool,
    pub lsn: Lsn,
    pub prefix: String,
    pub content: Bytes,
}

/// 'S': the following changes (until Stream Stop) belong to in-progress
/// transaction `xid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStart {
    pub xid: u32,
    /// The first block of this transaction.
    pub first_segment: bool,
}

/// 'c': a streamed transaction committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCommit {
    pub xid: u32,
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: i64,
}

/// 'A': a streamed (sub)transaction aborted; drop what was streamed for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAbort {
    pub xid: u32,
    /// Equals `xid` when the top-level transaction aborted.
    pub subxid: u32,
    /// Sent only with protocol 4 and `streaming = parallel`.
    pub abort_lsn: Option<Lsn>,
    /// Sent only with protocol 4 and `streaming = parallel`.
    pub abort_time: Option<i64>,
}

/// 'b': start of a prepared (two-phase) transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginPrepare {
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: i64,
    pub xid: u32,
    pub gid: String,
}

/// 'P': end of a transaction's changes at PREPARE TRANSACTION.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    pub flags: u8,
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: i64,
    pub xid: u32,
    pub gid: String,
}

/// 'K': COMMIT PREPARED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPrepared {
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: i64,
    pub xid: u32,
    pub gid: String,
}

/// 'r': ROLLBACK PREPARED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPrepared {
    pub flags: u8,
    pub prepare_end_lsn: Lsn,
    pub rollback_end_lsn: Lsn,
    pub prepare_time: i64,
    pub rollback_time: i64,
    pub xid: u32,
    pub gid: String,
}

/// 'p': PREPARE TRANSACTION of a streamed transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPrepare {
    pub flags: u8,
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: i64,
    pub xid: u32,
    pub gid: String,
}

/// The column values of one row, in the relation's column order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TupleData(pub Vec<TupleValue>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    /// 'n'
    Null,
    /// 'u': a TOASTed value that did not change; its value is not sent, so the
    /// consumer must not overwrite the column with it.
    UnchangedToast,
    /// 't': the type's text output.
    Text(Bytes),
    /// 'b': the type's binary send format (only with `binary = true`).
    Binary(Bytes),
}

/// The old row of an Update or Delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// 'K': only the replica identity columns; others are Null.
    Key(TupleData),
    /// 'O': the whole old row (replica identity FULL).
    Full(TupleData),
}

impl OldTuple {
    pub fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_epoch_offset_matches_the_calendar() {
        // 2000-01-01T00:00:00Z is 946684800 s after the Unix epoch.
        assert_eq!(PG_EPOCH_OFFSET_US, 946_684_800_000_000);
        assert_eq!(pg_time_to_unix_us(0), 946_684_800_000_000);
        assert_eq!(pg_time_to_unix_us(-PG_EPOCH_OFFSET_US), 0);
        assert_eq!(pg_time_to_unix_us(i64::MAX), i64::MAX);
    }

    #[test]
    fn flag_helpers() {
        let column = |flags| RelationColumn {
            flags,
            name: "id".into(),
            type_oid: 23,
            type_modifier: -1,
        };
        assert!(column(1).is_key());
        assert!(!column(0).is_key());
        let truncate = |options| Truncate {
            xid: None,
            options,
            relation_oids: vec![],
        };
        assert!(truncate(3).cascade() && truncate(3).restart_identity());
        assert!(!truncate(0).cascade() && !truncate(0).restart_identity());
    }
}
