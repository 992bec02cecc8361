//! [`SourceTable`]: one outbox table as the source sees it, shared by the
//! settings, the slot and publication checks, and the assembler.

/// One outbox table as the source sees it: where its rows come from and
/// which `pg_logical_emit_message` prefix belongs to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTable {
    pub schema: String,
    pub name: String,
    /// Prefix of messages treated as this table's events; `None` = off.
    pub message_prefix: Option<String>,
}
