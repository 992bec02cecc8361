//! From pgoutput messages to outbox events (pure).
//!
//! With protocol version 1 the server sends a transaction only once it has
//! committed, whole, between Begin and Commit, so every outbox row seen here
//! is committed and can be handed on at once; rolled-back work never reaches
//! us. What the relay needs from the framing is the commit's *end* LSN, emitted
//! as a checkpoint after the transaction's last event: confirming it (and not
//! the commit LSN) is what keeps the server from resending the transaction.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::outbox::{ColumnInfo, ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
use crate::source::pgoutput::{
    pg_time_to_unix_us, LogicalMessage, Relation, TupleData, TupleValue,
};
use crate::source::table::SourceTable;
use crate::Lsn;

/// What the assembler hands on, in WAL order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SourceItem {
    /// An outbox row or message to deliver.
    Event(OutboxEvent),
    /// Everything before this position has been handed on: once all earlier
    /// events are acked, `lsn` may be confirmed.
    Checkpoint {
        lsn: Lsn,
        xid: u32,
        commit_time_us: i64,
        events: u64,
    },
}

/// Changes seen and deliberately not published, by reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IgnoredCounts {
    pub other_table_changes: u64,
    pub outbox_updates: u64,
    pub outbox_deletes: u64,
    pub outbox_truncates: u64,
    pub other_prefix_messages: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AssembleError {
    #[error("pgoutput sent a change for relation OID {0} before describing it")]
    UnknownRelation(u32),
    #[error("pgoutput sent {0} outside a transaction")]
    OutsideTransaction(&'static str),
    #[error("pgoutput sent Begin for xid {new} while xid {open} was still open")]
    NestedBegin { open: u32, new: u32 },
    #[error("column {column} of {table} arrived in binary format, which outboxd never requests")]
    BinaryValue { table: String, column: String },
    #[error("outbox row has {values} values but {table} has {columns} columns")]
    ColumnCountMismatch {
        table: String,
        values: usize,
        columns: usize,
    },
    #[error(
        "pgoutput sent {0}, which needs streaming or two-phase options outboxd does not enable"
    )]
    UnsupportedMessage(&'static str),
}

#[derive(Debug, Clone, Copy)]
struct OpenTxn {
    xid: u32,
    commit_lsn: Lsn,
    commit_time_us: i64,
    events: u64,
}

pub(crate) struct TransactionAssembler {
    /// `(schema, name)` of every outbox table. Several tables share the one
    /// WAL stream, so their events stay in commit order among themselves.
    outbox_tables: HashSet<(String, String)>,
    /// The prefixes of messages that are events; empty disables messages.
    message_prefixes: HashSet<String>,
    relations: HashMap<u32, Arc<TableInfo>>,
    open: Option<OpenTxn>,
    ignored: IgnoredCounts,
}

impl TransactionAssembler {
    pub(crate) fn new(tables: &[SourceTable]) -> Self {
        TransactionAssembler {
            outbox_tables: tables
                .iter()
                .map(|t| (t.schema.clone(), t.name.clone()))
                .collect(),
            message_prefixes: tables
                .iter()
                .filter_map(|t| t.message_prefix.clone())
                .filter(|p| !p.is_empty())
                .collect(),
            relations: HashMap::new(),
            open: None,
            ignored: IgnoredCounts::default(),
        }
    }

    pub(crate) fn ignored(&self) -> IgnoredCounts {
        self.ignored
    }

    /// The prefixes of the messages that are outbox events (none: messages
    /// are disabled).
    pub(crate) fn message_prefixes(&self) -> impl Iterator<Item = &str> {
        self.message_prefixes.iter().map(String::as_str)
    }

    /// True between Begin and Commit: keepalive positions must not be
    /// confirmed then, since they may lie inside the open transaction.
    pub(crate) fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Handles one decoded message; appends what it yields to `out`.
    pub(crate) fn handle(
        &mut self,
        msg: LogicalMessage,
        out: &mut Vec<SourceItem>,
    ) -> Result<(), AssembleError> {
        match msg {
            LogicalMessage::Begin(b) => {
                if let Some(open) = self.open {
                    return Err(AssembleError::NestedBegin {
                        open: open.xid,
                        new: b.xid,
                    });
                }
                self.open = Some(OpenTxn {
                    xid: b.xid,
                    commit_lsn: b.final_lsn,
                    commit_time_us: pg_time_to_unix_us(b.commit_time),
                    events: 0,
                });
            }
            LogicalMessage::Commit(c) => {
                let open = self
                    .open
                    .take()
                    .ok_or(AssembleError::OutsideTransaction("Commit"))?;
                out.push(SourceItem::Checkpoint {
                    lsn: c.end_lsn,
                    xid: open.xid,
                    commit_time_us: open.commit_time_us,
                    events: open.events,
                });
            }
            LogicalMessage::Relation(r) => {
                let info = Arc::new(table_info(&r));
                self.relations.insert(r.oid, info);
            }
            LogicalMessage::Insert(ins) => {
                let table = self.relation(ins.relation_oid)?;
                if !self.is_outbox(&table) {
                    self.ignored.other_table_changes += 1;
                    return Ok(());
                }
                let open = self
                    .open
                    .as_mut()
                    .ok_or(AssembleError::OutsideTransaction("Insert"))?;
                let row = to_row(table, ins.new)?;
                open.events += 1;
                out.push(SourceItem::Event(OutboxEvent {
                    commit_lsn: open.commit_lsn,
                    xid: open.xid,
                    commit_time_us: open.commit_time_us,
                    kind: EventKind::Row(row),
                }));
            }
            LogicalMessage::Update(u) => {
                self.count_change(u.relation_oid, |c| c.outbox_updates += 1)?
            }
            LogicalMessage::Delete(d) => {
                self.count_change(d.relation_oid, |c| c.outbox_deletes += 1)?
            }
            LogicalMessage::Truncate(t) => {
                for oid in t.relation_oids {
                    self.count_change(oid, |c| c.outbox_truncates += 1)?;
                }
            }
            LogicalMessage::Message(m) => {
                if !self.message_prefixes.contains(&m.prefix) {
                    self.ignored.other_prefix_messages += 1;
                    return Ok(());
                }
                let kind = EventKind::Message {
                    transactional: m.transactional,
                    prefix: m.prefix,
                    content: m.content,
                };
                match (m.transactional, self.open.as_mut()) {
                    (true, Some(open)) => {
                        open.events += 1;
                        out.push(SourceItem::Event(OutboxEvent {
                            commit_lsn: open.commit_lsn,
                            xid: open.xid,
                            commit_time_us: open.commit_time_us,
                            kind,
                        }));
                    }
                    (true, None) => {
                        return Err(AssembleError::OutsideTransaction("a transactional Message"))
                    }
                    // Non-transactional: delivered on its own. The server skips
                    // messages below the confirmed position on restart, so the
                    // checkpoint is just past the message's LSN.
                    (false, _) => {
                        let now = crate::source::pgoutput::pg_time_to_unix_us(
                            crate::source::replication::protocol::pg_now_us(),
                        );
                        out.push(SourceItem::Event(OutboxEvent {
                            commit_lsn: m.lsn,
                            xid: 0,
                            commit_time_us: now,
                            kind,
                        }));
                        if self.open.is_none() {
                            out.push(SourceItem::Checkpoint {
                                lsn: Lsn(m.lsn.0 + 1),
                                xid: 0,
                                commit_time_us: now,
                                events: 1,
                            });
                        }
                    }
                }
            }
            LogicalMessage::Origin(_) | LogicalMessage::Type(_) => {}
            LogicalMessage::StreamStart(_) => {
                return Err(AssembleError::UnsupportedMessage("Stream Start"))
            }
            LogicalMessage::StreamStop => {
                return Err(AssembleError::UnsupportedMessage("Stream Stop"))
            }
            LogicalMessage::StreamCommit(_) => {
                return Err(AssembleError::UnsupportedMessage("Stream Commit"))
            }
            LogicalMessage::StreamAbort(_) => {
                return Err(AssembleError::UnsupportedMessage("Stream Abort"))
            }
            LogicalMessage::StreamPrepare(_) => {
                return Err(AssembleError::UnsupportedMessage("Stream Prepare"))
            }
            LogicalMessage::BeginPrepare(_) => {
                return Err(AssembleError::UnsupportedMessage("Begin Prepare"))
            }
            LogicalMessage::Prepare(_) => return Err(AssembleError::UnsupportedMessage("Prepare")),
            LogicalMessage::CommitPrepared(_) => {
                return Err(AssembleError::UnsupportedMessage("Commit Prepared"))
            }
            LogicalMessage::RollbackPrepared(_) => {
                return Err(AssembleError::UnsupportedMessage("Rollback Prepared"))
            }
        }
        Ok(())
    }

    fn relation(&self, oid: u32) -> Result<Arc<TableInfo>, AssembleError> {
        self.relations
            .get(&oid)
            .cloned()
            .ok_or(AssembleError::UnknownRelation(oid))
    }

    fn is_outbox(&self, table: &TableInfo) -> bool {
        // Allocates two strings per lookup; a borrowed-key map would avoid
        // it, but this runs once per published change, next to a Kafka send.
        self.outbox_tables
            .contains(&(table.schema.clone(), table.name.clone()))
    }

    fn count_change(
        &mut self,
        oid: u32,
        bump: impl FnOnce(&mut IgnoredCounts),
    ) -> Result<(), AssembleError> {
        let table = self.relation(oid)?;
        if self.is_outbox(&table) {
            bump(&mut self.ignored);
        } else {
            self.ignored.other_table_changes += 1;
        }
        Ok(())
    }
}

fn table_info(r: &Relation) -> TableInfo {
    TableInfo {
        oid: r.oid,
        schema: r.namespace.clone(),
        name: r.name.clone(),
        columns: r
            .columns
            .iter()
            .map(|c| ColumnInfo {
                name: c.name.clone(),
                type_oid: c.type_oid,
            })
            .collect(),
    }
}

fn to_row(table: Arc<TableInfo>, tuple: TupleData) -> Result<Row, AssembleError> {
    if tuple.0.len() != table.columns.len() {
        return Err(AssembleError::ColumnCountMismatch {
            table: table.qualified_name(),
            values: tuple.0.len(),
            columns: table.columns.len(),
        });
    }
    let mut values = Vec::with_capacity(tuple.0.len());
    for (i, v) in tuple.0.into_iter().enumerate() {
        values.push(match v {
            TupleValue::Null => ColumnValue::Null,
            TupleValue::UnchangedToast => ColumnValue::UnchangedToast,
            TupleValue::Text(b) => ColumnValue::Text(b),
            TupleValue::Binary(_) => {
                return Err(AssembleError::BinaryValue {
                    table: table.qualified_name(),
                    column: table.columns[i].name.clone(),
                })
            }
        });
    }
    Ok(Row { table, values })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::source::pgoutput::{Begin, Commit, Insert, Message, RelationColumn};

    fn relation(oid: u32, schema: &str, name: &str) -> LogicalMessage {
        LogicalMessage::Relation(Relation {
            xid: None,
            oid,
            namespace: schema.into(),
            name: name.into(),
            replica_identity: b'd',
            columns: vec![RelationColumn {
                flags: 0,
                name: "id".into(),
                type_oid: 25,
                type_modifier: -1,
            }],
        })
    }

    fn insert(oid: u32, id: &str) -> LogicalMessage {
        LogicalMessage::Insert(Insert {
            xid: None,
            relation_oid: oid,
            new: TupleData(vec![TupleValue::Text(Bytes::copy_from_slice(
                id.as_bytes(),
            ))]),
        })
    }

    fn message(prefix: &str) -> LogicalMessage {
        LogicalMessage::Message(Message {
            xid: None,
            transactional: true,
            lsn: Lsn(10),
            prefix: prefix.into(),
            content: Bytes::from_static(b"{}"),
        })
    }

    /// Several tables: inserts of every configured table are events, in
    /// WAL order, with one checkpoint for the transaction; other tables'
    /// inserts and other prefixes' messages are not.
    #[test]
    fn every_configured_table_and_prefix_and_nothing_else() {
        let table = |schema: &str, name: &str, prefix: Option<&str>| SourceTable {
            schema: schema.into(),
            name: name.into(),
            message_prefix: prefix.map(str::to_owned),
        };
        let mut a = TransactionAssembler::new(&[
            table("orders", "outbox", Some("orders")),
            table("billing", "events", None),
        ]);
        let mut out = Vec::new();
        let msgs = [
            relation(1, "orders", "outbox"),
            relation(2, "billing", "events"),
            relation(3, "public", "outbox"),
            LogicalMessage::Begin(Begin {
                final_lsn: Lsn(20),
                commit_time: 0,
                xid: 7,
            }),
            insert(2, "b1"),
            insert(1, "o1"),
            insert(3, "x1"),
            message("orders"),
            message("billing"),
            insert(2, "b2"),
            LogicalMessage::Commit(Commit {
                flags: 0,
                commit_lsn: Lsn(20),
                end_lsn: Lsn(30),
                commit_time: 0,
            }),
        ];
        for m in msgs {
            a.handle(m, &mut out).unwrap();
        }
        let got: Vec<String> = out
            .iter()
            .map(|i| match i {
                SourceItem::Event(e) => match &e.kind {
                    EventKind::Row(r) => format!(
                        "{}:{}",
                        r.table.qualified_name(),
                        r.values[0].as_str().unwrap()
                    ),
                    EventKind::Message { prefix, .. } => format!("message:{prefix}"),
                },
                SourceItem::Checkpoint { lsn, events, .. } => format!("checkpoint:{lsn}:{events}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                "billing.events:b1",
                "orders.outbox:o1",
                "message:orders",
                "billing.events:b2",
                "checkpoint:0/1E:4"
            ]
        );
        assert_eq!(a.ignored().other_table_changes, 1);
        assert_eq!(a.ignored().other_prefix_messages, 1);
    }
}
