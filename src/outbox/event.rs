//! The outbox event as the source hands it on: one committed outbox row, or one
//! logical decoding message, tagged with the position of its transaction.

use std::sync::Arc;

use bytes::Bytes;

use crate::Lsn;

/// Shape of the outbox table as last described by a pgoutput Relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableInfo {
    pub oid: u32,
    pub schema: String,
    pub name: String,
    pub columns: Vec<ColumnInfo>,
}

impl TableInfo {
    /// `schema.name`, the form used in config and output.
    pub(crate) fn qualified_name(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    pub(crate) fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnInfo {
    pub name: String,
    pub type_oid: u32,
}

/// A column value in pgoutput's text format. `Text` is a slice of the WAL frame
/// it arrived in (no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ColumnValue {
    Null,
    Text(Bytes),
    /// An unchanged TOASTed value; never produced for inserts, kept so updates
    /// decoded for other purposes are representable.
    UnchangedToast,
}

impl ColumnValue {
    /// The value as UTF-8 text, if it is text and valid UTF-8.
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            ColumnValue::Text(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    pub(crate) fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            ColumnValue::Text(b) => Some(b),
            _ => None,
        }
    }
}

/// One inserted outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub table: Arc<TableInfo>,
    /// In the table's column order.
    pub values: Vec<ColumnValue>,
}

impl Row {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EventKind {
    Row(Row),
    /// A `pg_logical_emit_message` whose prefix matched the configured one.
    Message {
        transactional: bool,
        prefix: String,
        content: Bytes,
    },
}

/// An event with the transaction it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxEvent {
    /// LSN of the transaction's commit record (pgoutput's Begin final LSN),
    /// known from the first event on; the end LSN that gets confirmed arrives
    /// later as a checkpoint. For a non-transactional message, its own LSN.
    pub commit_lsn: Lsn,
    /// 0 for non-transactional messages.
    pub xid: u32,
    /// Commit time in microseconds since the Unix epoch.
    pub commit_time_us: i64,
    pub kind: EventKind,
}

impl OutboxEvent {
    /// An empty transactional message of transaction 7 committing at
    /// `commit_lsn`, for tests of what comes after the mapping.
    #[cfg(test)]
    pub(crate) fn test_message(commit_lsn: Lsn) -> OutboxEvent {
        OutboxEvent {
            commit_lsn,
            xid: 7,
            commit_time_us: 0,
            kind: EventKind::Message {
                transactional: true,
                prefix: "outbox".into(),
                content: Bytes::new(),
            },
        }
    }
}
