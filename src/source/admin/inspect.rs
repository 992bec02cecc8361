//! Read-only inspection for `outboxd check`: the facts behind each readiness
//! verdict, gathered with plain catalog queries. Nothing here creates,
//! alters or locks anything, so the check is safe against production.
//!
//! The refusals `outboxd run` already makes are [`AdminError`]s; the few
//! findings only the check reports (privileges it cannot see fail until a
//! later step, column types) are [`Issue`]s, worded the same way: what is
//! wrong, then the fix.

use tokio_postgres::Client;

use super::error::{sql_err, AdminError};
use super::target::Target;

/// Server settings and the current role, from one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerFacts {
    pub version_num: i32,
    pub version: String,
    pub wal_level: String,
    pub user: String,
    pub database: String,
    pub superuser: bool,
    pub replication: bool,
    pub max_slots: i64,
    pub used_slots: i64,
    pub max_senders: i64,
    pub used_senders: i64,
}

pub(crate) async fn server_facts(client: &Client) -> Result<ServerFacts, AdminError> {
    let r = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'), \
                    current_setting('wal_level'), current_user::text, current_database()::text, \
                    r.rolsuper, r.rolreplication, \
                    current_setting('max_replication_slots')::bigint, \
                    (SELECT count(*) FROM pg_replication_slots), \
                    current_setting('max_wal_senders')::bigint, \
                    (SELECT count(*) FROM pg_stat_replication) \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(sql_err("reading server settings"))?;
    Ok(ServerFacts {
        version_num: r.get(0),
        version: r.get(1),
        wal_level: r.get(2),
        user: r.get(3),
        database: r.get(4),
        superuser: r.get(5),
        replication: r.get(6),
        max_slots: r.get(7),
        used_slots: r.get(8),
        max_senders: r.get(9),
        used_senders: r.get(10),
    })
}

/// What a PostgreSQL 17+ server shows of failover-slot synchronisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyncFacts {
    /// A standby: its failover slots are copies kept by slot sync.
    pub in_recovery: bool,
    /// The primary's `synchronized_standby_slots`: the physical slots whose
    /// standbys must have WAL before a failover slot's consumer is sent it.
    pub standby_slots: String,
}

/// Only on PostgreSQL 17+ (the setting is unknown before).
pub(crate) async fn sync_facts(client: &Client) -> Result<SyncFacts, AdminError> {
    let r = client
        .query_one(
            "SELECT pg_is_in_recovery(), current_setting('synchronized_standby_slots')",
            &[],
        )
        .await
        .map_err(sql_err("reading synchronized_standby_slots"))?;
    Ok(SyncFacts {
        in_recovery: r.get(0),
        standby_slots: r.get(1),
    })
}

/// One column of the outbox table. `base_type` and `category` are those of
/// the domain's base type for a domain column, so `CREATE DOMAIN ... AS
/// jsonb` counts as jsonb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnFacts {
    pub name: String,
    /// As `format_type` prints it, e.g. `character varying(64)`.
    pub type_name: String,
    pub base_type: String,
    /// `pg_type.typcategory`: `S` string, `N` numeric, `D` date/time, ...
    pub category: String,
    /// A generated column: pgoutput leaves it out before PostgreSQL 18.
    pub generated: bool,
}

/// The outbox table as the current role sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableFacts {
    pub can_select: bool,
    /// Owner, or member of the owning role: needed for CREATE PUBLICATION
    /// ... FOR TABLE.
    pub owned: bool,
    pub can_create_in_database: bool,
    /// `relkind = 'p'`: published through its root or not at all.
    pub partitioned: bool,
    pub columns: Vec<ColumnFacts>,
}

/// `None` when the table does not exist.
pub(crate) async fn table_facts(
    client: &Client,
    t: &Target<'_>,
) -> Result<Option<TableFacts>, AdminError> {
    let table = t.qualified_table();
    let Some(row) = client
        .query_opt(
            "SELECT c.oid, has_table_privilege(c.oid, 'SELECT'), pg_has_role(c.relowner, 'USAGE'), \
                    has_database_privilege(current_database(), 'CREATE'), c.relkind = 'p' \
             FROM pg_class c WHERE c.oid = to_regclass($1)",
            &[&table],
        )
        .await
        .map_err(sql_err("looking up the outbox table"))?
    else {
        return Ok(None);
    };
    let oid: u32 = row.get(0);
    let columns = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), bt.typname::text, \
                    bt.typcategory::text, a.attgenerated <> '' \
             FROM pg_attribute a \
             JOIN pg_type t ON t.oid = a.atttypid \
             JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&oid],
        )
        .await
        .map_err(sql_err("reading the outbox table's columns"))?
        .into_iter()
        .map(|r| ColumnFacts {
            name: r.get(0),
            type_name: r.get(1),
            base_type: r.get(2),
            category: r.get(3),
            generated: r.get(4),
        })
        .collect();
    Ok(Some(TableFacts {
        can_select: row.get(1),
        owned: row.get(2),
        can_create_in_database: row.get(3),
        partitioned: row.get(4),
        columns,
    }))
}

/// The publication and what it does with the outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublicationFacts {
    pub publishes_inserts: bool,
    /// `publish_via_partition_root`.
    pub via_root: bool,
    pub covers_table: bool,
    /// Columns published for the table (PostgreSQL 15+, where publications
    /// may have column lists); `None` on 14, where every column but
    /// generated ones is published.
    pub columns: Option<Vec<String>>,
    /// The table's row filter (PostgreSQL 15+).
    pub row_filter: Option<String>,
}

/// `None` when the publication does not exist.
pub(crate) async fn publication_facts(
    client: &Client,
    t: &Target<'_>,
    version_num: i32,
) -> Result<Option<PublicationFacts>, AdminError> {
    let Some(p) = client
        .query_opt(
            "SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&t.publication],
        )
        .await
        .map_err(sql_err("looking up the publication"))?
    else {
        return Ok(None);
    };
    // attnames and rowfilter appeared in PostgreSQL 15.
    let sql = if version_num >= 150000 {
        "SELECT attnames::text[], rowfilter FROM pg_publication_tables \
         WHERE pubname = $1 AND schemaname = $2 AND tablename = $3"
    } else {
        "SELECT NULL::text[], NULL::text FROM pg_publication_tables \
         WHERE pubname = $1 AND schemaname = $2 AND tablename = $3"
    };
    let covered = client
        .query_opt(sql, &[&t.publication, &t.table_schema, &t.table_name])
        .await
        .map_err(sql_err("checking the publication's tables"))?;
    Ok(Some(PublicationFacts {
        publishes_inserts: p.get(0),
        via_root: p.get(1),
        covers_table: covered.is_some(),
        columns: covered.as_ref().and_then(|r| r.get(0)),
        row_filter: covered.as_ref().and_then(|r| r.get(1)),
    }))
}

/// Bytes of WAL the slot still holds back: the server's current position
/// (on a standby, the last replayed one) minus the slot's confirmed_flush_lsn.
pub(crate) async fn slot_lag_bytes(client: &Client, slot: &str) -> Result<Option<i64>, AdminError> {
    let row = client
        .query_opt(
            "SELECT pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                                         ELSE pg_current_wal_lsn() END, confirmed_flush_lsn)::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(sql_err("measuring the slot's lag"))?;
    Ok(row.and_then(|r| r.get(0)))
}

/// Findings only `outboxd check` reports, each naming the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Issue {
    #[error(
        "role {user:?} may not SELECT from {table}; streaming does not need it, but the grant in \
         migrations/004_replication_role.sql lets the same role inspect the outbox: \
         GRANT SELECT ON {table} TO \"{user}\""
    )]
    NoSelect { user: String, table: String },
    #[error(
        "role {user:?} cannot create publication {publication:?} ({missing}): run the CREATE \
         PUBLICATION as the table's owner (migrations/003_publication.sql) and set \
         postgres.create_publication = false"
    )]
    CannotCreatePublication {
        user: String,
        publication: String,
        missing: String,
    },
    #[error(
        "replication slot {slot:?} is about to lose WAL it needs (wal_status = 'unreserved': \
         beyond max_slot_wal_keep_size): start outboxd on it now, or raise max_slot_wal_keep_size"
    )]
    SlotUnreserved { slot: String },
    #[error("column `{column}` ({setting}) is not in {table}: add it, or set {setting} to the column that holds it")]
    ColumnMissing {
        column: String,
        setting: String,
        table: String,
    },
    #[error(
        "column `{column}` ({setting}) is not published by {publication:?} (a column list or a \
         generated column), so every event would lack it: add it to the publication's column list"
    )]
    ColumnNotPublished {
        column: String,
        setting: String,
        publication: String,
    },
    #[error("column `{column}` ({setting}) is {type_name}: {reason}")]
    ColumnType {
        column: String,
        setting: String,
        type_name: String,
        reason: &'static str,
    },
    #[error(
        "publication {publication:?} filters the rows of {table} (WHERE {filter}): outbox rows \
         outside the filter are never relayed; drop the filter unless that is intended"
    )]
    RowFilter {
        publication: String,
        table: String,
        filter: String,
    },
}

/// How well a column type suits its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TypeFit {
    Good,
    /// Works, but probably not as intended; the reason says why.
    Doubtful(&'static str),
    /// Every event would fail to map.
    Unusable(&'static str),
}

/// The rules behind the column check. Every value reaches outboxd as its
/// text form, so the question is whether that text is what a consumer (or
/// the mapper) expects. `role` is a `[outbox.columns]` role, or `"header"`
/// for a routing.additional_headers or `${column:...}` source.
pub(crate) fn type_fit(role: &str, base_type: &str, category: &str) -> TypeFit {
    let text = category == "S";
    let json = matches!(base_type, "json" | "jsonb");
    let integer = matches!(base_type, "int2" | "int4" | "int8");
    // The relay sends a bytea's bytes, not its hex text.
    let bytes = base_type == "bytea";
    match role {
        "payload" if json || text || bytes => TypeFit::Good,
        "payload" => TypeFit::Doubtful("Kafka would get its text form; payloads are usually jsonb or text"),
        "key" | "id" if text || integer || bytes || base_type == "uuid" => TypeFit::Good,
        "key" | "id" => TypeFit::Doubtful("its text form is used; text, uuid or an integer is usual"),
        "headers" if json => TypeFit::Good,
        "headers" if text => TypeFit::Doubtful("each value must be a JSON object; jsonb makes sure it is"),
        "headers" => TypeFit::Unusable("must hold a JSON object of headers; use jsonb"),
        "timestamp" if base_type == "timestamptz" || integer => TypeFit::Good,
        "timestamp" if base_type == "timestamp" || text => TypeFit::Doubtful(
            "values without a time zone are read as UTC, text is parsed per event; timestamptz is exact",
        ),
        "timestamp" => TypeFit::Unusable(
            "must be a timestamp or epoch milliseconds; use timestamptz, or set outbox.columns.timestamp = \"\"",
        ),
        "trace_context" if text || json => TypeFit::Good,
        "trace_context" => TypeFit::Unusable(
            "must hold a W3C traceparent, a JSON object or java.util.Properties text; use text or jsonb",
        ),
        "ce_extensions" if json => TypeFit::Good,
        "ce_extensions" if text => TypeFit::Doubtful("each value must be a JSON object; jsonb makes sure it is"),
        "ce_extensions" => TypeFit::Unusable("must hold a JSON object of extension attributes; use jsonb"),
        _ if text => TypeFit::Good,
        _ => TypeFit::Doubtful("its text form is used in topic names and headers; text is usual"),
    }
}

/// `"schema"."table"`, as the admin messages print it.
pub(crate) fn qualified(t: &Target<'_>) -> String {
    t.qualified_table()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_types_by_role() {
        assert_eq!(type_fit("payload", "jsonb", "U"), TypeFit::Good);
        assert_eq!(type_fit("payload", "varchar", "S"), TypeFit::Good);
        assert_eq!(type_fit("payload", "bytea", "U"), TypeFit::Good);
        assert_eq!(type_fit("key", "bytea", "U"), TypeFit::Good);
        assert_eq!(type_fit("key", "uuid", "U"), TypeFit::Good);
        assert_eq!(type_fit("key", "int8", "N"), TypeFit::Good);
        assert!(matches!(
            type_fit("key", "numeric", "N"),
            TypeFit::Doubtful(_)
        ));
        assert!(matches!(
            type_fit("headers", "int4", "N"),
            TypeFit::Unusable(_)
        ));
        assert_eq!(type_fit("timestamp", "timestamptz", "D"), TypeFit::Good);
        assert!(matches!(
            type_fit("timestamp", "date", "D"),
            TypeFit::Unusable(_)
        ));
        assert_eq!(type_fit("event_type", "text", "S"), TypeFit::Good);
        assert_eq!(type_fit("trace_context", "text", "S"), TypeFit::Good);
        assert_eq!(type_fit("trace_context", "jsonb", "U"), TypeFit::Good);
        assert!(matches!(
            type_fit("trace_context", "int8", "N"),
            TypeFit::Unusable(_)
        ));
        assert!(matches!(
            type_fit("ce_extensions", "text", "S"),
            TypeFit::Doubtful(_)
        ));
        assert!(matches!(
            type_fit("aggregate_type", "int4", "N"),
            TypeFit::Doubtful(_)
        ));
    }

    #[test]
    fn issues_name_the_fix() {
        let e = Issue::ColumnMissing {
            column: "payload".into(),
            setting: "outbox.columns.payload".into(),
            table: "\"public\".\"outbox\"".into(),
        };
        assert!(e.to_string().contains("set outbox.columns.payload"), "{e}");
        let e = Issue::NoSelect {
            user: "o".into(),
            table: "\"public\".\"outbox\"".into(),
        };
        assert!(
            e.to_string()
                .contains("GRANT SELECT ON \"public\".\"outbox\" TO \"o\""),
            "{e}"
        );
    }
}
