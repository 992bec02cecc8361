//! The SQL that reads a window of outbox rows, built from the table's
//! shape (pure).
//!
//! Rows are read with the simple query protocol, whose results are each
//! value's output function text: exactly what pgoutput (protocol 1) sends.
//! A `::text` cast would not do: `boolean::text` is `true` where the output
//! function gives `t`, and `inet::text` adds the netmask. The simple
//! protocol takes no parameters, hence the literals quoted here.
//!
//! A backfill reads pages by keyset, `(time, ctid) > (last time, last
//! ctid)` in `ORDER BY time, ctid`, each page its own statement: no
//! transaction stays open while Kafka acknowledges (it would hold back
//! vacuum), and a big table is never loaded whole. The price: each page is
//! planned on its own, and without statistics on the table (written since
//! the last `ANALYZE`) PostgreSQL sorts every row left in the window for
//! each page, quadratic in the window. A reader that waits on nothing
//! between pages (the audit) reads [`PageQuery::ordered`] instead, once,
//! through a cursor (see [`Paging`](super::Paging)).
//!
//! Rows with the same time (the rows of one
//! transaction share `now()`) go by `ctid`, the order they are stored in:
//! their insertion order in an outbox that is only appended to. The id
//! would not do: a random uuid puts one transaction's events of an
//! aggregate out of order. The order is not guaranteed once the heap
//! reuses space (rows deleted by age and vacuumed, then a transaction's
//! rows spread over pages) or was rewritten (`VACUUM FULL`, `CLUSTER`).

use crate::source::admin::quote_ident;

/// One column of the outbox table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    pub name: String,
    pub type_oid: u32,
    /// `format_type(atttypid, atttypmod)`, to cast keyset literals back.
    pub type_name: String,
}

/// How the time column compares with a `timestamptz` bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeKind {
    /// `timestamptz`, `timestamp` or `date`: compared as timestamps.
    Timestamp,
    /// An integer column of epoch milliseconds (as `outbox.columns.timestamp`
    /// accepts).
    EpochMillis,
}

impl TimeKind {
    /// The kind for a column type, `None` when it holds no time.
    pub(crate) fn of(type_oid: u32) -> Option<TimeKind> {
        match type_oid {
            // timestamptz, timestamp, date
            1184 | 1114 | 1082 => Some(TimeKind::Timestamp),
            // int8, int4
            20 | 23 => Some(TimeKind::EpochMillis),
            _ => None,
        }
    }
}

/// A SQL string literal for `s`, safe whatever `standard_conforming_strings`
/// says (as PostgreSQL's own `quote_literal` writes it).
pub(crate) fn literal(s: &str) -> String {
    if s.contains('\\') {
        format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// What every page query shares: the table, its columns, the time column,
/// the id column and the window.
#[derive(Debug, Clone)]
pub(crate) struct PageQuery {
    /// `"schema"."table"`.
    pub table: String,
    pub columns: Vec<Column>,
    /// Position in `columns`.
    pub time: usize,
    pub time_kind: TimeKind,
    /// Bounds as PostgreSQL printed them (absolute `timestamptz` text).
    pub since: String,
    pub until: Option<String>,
    pub batch: usize,
}

impl PageQuery {
    /// `WHERE` terms of the window, without the keyset.
    fn window(&self) -> String {
        let time = quote_ident(&self.columns[self.time].name);
        let bound = |text: &str| match self.time_kind {
            TimeKind::Timestamp => format!("{}::timestamptz", literal(text)),
            TimeKind::EpochMillis => format!(
                "(extract(epoch from {}::timestamptz) * 1000)::bigint",
                literal(text)
            ),
        };
        let mut w = format!("{time} >= {}", bound(&self.since));
        if let Some(until) = &self.until {
            w.push_str(&format!(" AND {time} < {}", bound(until)));
        }
        w
    }

    /// Rows in the window: for the progress bar.
    pub(crate) fn count(&self) -> String {
        format!(
            "SELECT count(*) FROM {} WHERE {}",
            self.table,
            self.window()
        )
    }

    /// The next page after `after` (the last row's time and ctid text), or
    /// the first page. Each row ends with its `ctid`, after the columns.
    pub(crate) fn page(&self, after: Option<(&str, &str)>) -> String {
        self.select(after, Some(self.batch))
    }

    /// The whole window in page order, as one statement (each row ends with
    /// its `ctid`, as in a page): for a cursor.
    pub(crate) fn ordered(&self) -> String {
        self.select(None, None)
    }

    fn select(&self, after: Option<(&str, &str)>, limit: Option<usize>) -> String {
        let select: Vec<String> = self.columns.iter().map(|c| quote_ident(&c.name)).collect();
        let time = &self.columns[self.time];
        let time_q = quote_ident(&time.name);
        let mut sql = format!(
            "SELECT {}, ctid FROM {} WHERE {}",
            select.join(", "),
            self.table,
            self.window()
        );
        if let Some((t, c)) = after {
            sql.push_str(&format!(
                " AND ({time_q}, ctid) > ({}::{}, {}::tid)",
                literal(t),
                time.type_name,
                literal(c),
            ));
        }
        sql.push_str(&format!(" ORDER BY {time_q}, ctid"));
        if let Some(n) = limit {
            sql.push_str(&format!(" LIMIT {n}"));
        }
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, oid: u32, ty: &str) -> Column {
        Column {
            name: name.into(),
            type_oid: oid,
            type_name: ty.into(),
        }
    }

    fn query(kind: TimeKind, until: Option<&str>) -> PageQuery {
        PageQuery {
            table: "\"public\".\"outbox\"".into(),
            columns: vec![
                col("id", 2950, "uuid"),
                col("payload", 3802, "jsonb"),
                col("created_at", 1184, "timestamp with time zone"),
            ],
            time: 2,
            time_kind: kind,
            since: "2026-12-01 10:00:00+00".into(),
            until: until.map(String::from),
            batch: 500,
        }
    }

    #[test]
    fn literals_survive_quotes_and_backslashes() {
        assert_eq!(literal("a'b"), "'a''b'");
        assert_eq!(literal(r"a\'b"), r"E'a\\''b'");
        assert_eq!(literal(""), "''");
    }

    #[test]
    fn first_page_is_the_window_in_time_then_storage_order() {
        let q = query(TimeKind::Timestamp, Some("2026-12-01 11:00:00+00"));
        assert_eq!(
            q.page(None),
            "SELECT \"id\", \"payload\", \"created_at\", ctid FROM \"public\".\"outbox\" \
             WHERE \"created_at\" >= '2026-12-01 10:00:00+00'::timestamptz \
             AND \"created_at\" < '2026-12-01 11:00:00+00'::timestamptz \
             ORDER BY \"created_at\", ctid LIMIT 500"
        );
    }

    #[test]
    fn next_page_starts_after_the_last_row() {
        let q = query(TimeKind::Timestamp, None);
        let sql = q.page(Some(("2026-12-01 10:00:01.5+00", "(0,7)")));
        assert!(
            sql.ends_with(
                "WHERE \"created_at\" >= '2026-12-01 10:00:00+00'::timestamptz \
                 AND (\"created_at\", ctid) > ('2026-12-01 10:00:01.5+00'::timestamp with time zone, '(0,7)'::tid) \
                 ORDER BY \"created_at\", ctid LIMIT 500"
            ),
            "{sql}"
        );
    }

    #[test]
    fn the_whole_window_is_one_statement_in_page_order() {
        let q = query(TimeKind::Timestamp, Some("2026-12-01 11:00:00+00"));
        assert_eq!(
            q.ordered(),
            "SELECT \"id\", \"payload\", \"created_at\", ctid FROM \"public\".\"outbox\" \
             WHERE \"created_at\" >= '2026-12-01 10:00:00+00'::timestamptz \
             AND \"created_at\" < '2026-12-01 11:00:00+00'::timestamptz \
             ORDER BY \"created_at\", ctid"
        );
    }

    #[test]
    fn epoch_millis_columns_compare_with_converted_bounds() {
        let q = query(TimeKind::EpochMillis, None);
        assert!(q.count().ends_with(
            "WHERE \"created_at\" >= (extract(epoch from '2026-12-01 10:00:00+00'::timestamptz) * 1000)::bigint"
        ));
        assert_eq!(TimeKind::of(20), Some(TimeKind::EpochMillis));
        assert_eq!(TimeKind::of(1114), Some(TimeKind::Timestamp));
        assert_eq!(TimeKind::of(25), None);
    }
}
