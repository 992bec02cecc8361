//! [`Target`]: the slot, publication and outbox table outboxd administers,
//! and how their names are written in SQL ([`quote_ident`]).

use crate::source::table::SourceTable;

/// What outboxd needs to know about its database objects.
#[derive(Debug, Clone)]
pub(crate) struct Target<'a> {
    pub slot: &'a str,
    pub publication: &'a str,
    pub table_schema: &'a str,
    pub table_name: &'a str,
    /// Every outbox table, `table_*` among them: the publication is
    /// created with all of them.
    pub all_tables: &'a [SourceTable],
    pub create_slot: bool,
    pub create_publication: bool,
    /// `postgres.failover_slot`: the slot must be a PostgreSQL 17 failover slot.
    pub failover_slot: bool,
}

impl Target<'_> {
    pub(super) fn qualified_table(&self) -> String {
        format!(
            "{}.{}",
            quote_ident(self.table_schema),
            quote_ident(self.table_name)
        )
    }
}

/// `s` as an SQL identifier: double-quoted, inner quotes doubled.
pub(crate) fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}
