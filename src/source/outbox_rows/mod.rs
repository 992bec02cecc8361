//! The outbox rows still in the table whose time column falls in a window,
//! read on an ordinary SQL connection: the table's shape, the time column,
//! the window, and pages of rows as [`OutboxEvent`]s the mapper takes
//! exactly as it takes pgoutput's. `outboxd backfill` sends them again;
//! `outboxd audit` compares them with what Kafka holds.

mod error;
mod query;

use std::sync::Arc;

use bytes::Bytes;
use tokio_postgres::{Client, SimpleQueryMessage};

use self::error::pg_message;
pub use self::error::RowsError;
use self::query::{literal, Column, PageQuery, TimeKind};
use crate::config::outbox::ColumnsConfig;
use crate::outbox::mapper::CREATED_AT_COLUMN;
use crate::outbox::{ColumnInfo, ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
use crate::source::admin::quote_ident;
use crate::Lsn;

/// The window a [`RowReader`] reads, and how many rows a page holds.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Lower bound (inclusive), anything a `timestamptz` literal takes.
    pub since: String,
    /// Upper bound (exclusive); none = up to now and on.
    pub until: Option<String>,
    /// The column the window applies to, over `outbox.columns.timestamp`
    /// and `created_at`.
    pub time_column: Option<String>,
    /// Rows per page (at least one).
    pub batch: usize,
}

/// Where the time column comes from, for errors that name the fix.
pub(crate) const TIME_COLUMN_FLAG: &str = "--time-column";

/// The cursor [`Paging::Cursor`] reads from.
const CURSOR: &str = "outboxd_rows";

/// How a [`RowReader`] goes through the window; the rows and their order
/// are the same either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Paging {
    /// Each page its own statement, after the last row's time and ctid: no
    /// transaction stays open between pages, however long the reader waits
    /// (a backfill waits for Kafka's acknowledgements). Each page is
    /// planned alone, which on a table without statistics sorts the rest
    /// of the window for every page (see `query`).
    Keyset,
    /// One statement for the whole window, `FETCH`ed a page at a time from
    /// a cursor in one `REPEATABLE READ READ ONLY` transaction: planned and
    /// sorted once (a cursor's plan favours the index on the time column),
    /// one snapshot. The transaction holds back vacuum while it is open:
    /// for a reader that waits on nothing between pages (the audit). It
    /// ends with the last page, or with the connection.
    Cursor,
}

/// Pages of the window, in time order then storage order (`ctid`).
pub(crate) struct RowReader {
    query: PageQuery,
    table: Arc<TableInfo>,
    paging: Paging,
    /// Time and ctid text of the last row read ([`Paging::Keyset`]).
    after: Option<(String, String)>,
    /// The cursor's transaction is open ([`Paging::Cursor`]).
    in_cursor: bool,
    done: bool,
}

impl RowReader {
    /// Looks the table up, picks the time column (`time_column`, else
    /// `outbox.columns.timestamp`, else `created_at`) and has PostgreSQL
    /// read the bounds, so `since`/`until` take whatever a `timestamptz`
    /// literal takes.
    pub(crate) async fn open(
        client: &Client,
        schema: &str,
        name: &str,
        columns_cfg: &ColumnsConfig,
        opts: &ReadOptions,
    ) -> Result<RowReader, RowsError> {
        let id_column = columns_cfg.id.as_str();
        let (since, until, batch) = (opts.since.as_str(), opts.until.as_deref(), opts.batch);
        let table = format!("{}.{}", quote_ident(schema), quote_ident(name));
        let columns = columns(client, &table, &format!("{schema}.{name}")).await?;
        let find = |c: &str| columns.iter().position(|col| col.name == c);
        let configured_timestamp = columns_cfg.column_for_role("timestamp");
        let (time_name, from) = match (opts.time_column.as_deref(), configured_timestamp) {
            (Some(c), _) => (c, TIME_COLUMN_FLAG),
            (None, Some(c)) => (c, "outbox.columns.timestamp"),
            (None, None) => (CREATED_AT_COLUMN, "the default"),
        };
        let time = find(time_name).ok_or_else(|| RowsError::NoTimeColumn {
            table: format!("{schema}.{name}"),
            column: time_name.to_owned(),
            from,
        })?;
        let time_kind =
            TimeKind::of(columns[time].type_oid).ok_or_else(|| RowsError::NotATime {
                column: time_name.to_owned(),
                type_name: columns[time].type_name.clone(),
            })?;
        // The mapper needs it: say so before reading anything.
        find(id_column).ok_or_else(|| RowsError::NoIdColumn {
            table: format!("{schema}.{name}"),
            column: id_column.to_owned(),
        })?;
        let since = bound(client, "--since", since).await?;
        let until = match until {
            Some(u) => Some(bound(client, "--until", u).await?),
            None => None,
        };
        if let Some(until) = &until {
            let sql = format!(
                "SELECT {}::timestamptz < {}::timestamptz",
                literal(&since),
                literal(until)
            );
            let ordered = simple(client, &sql, "comparing --since and --until").await?;
            if ordered.first().and_then(|r| r.first().cloned().flatten()) != Some("t".into()) {
                return Err(RowsError::EmptyWindow {
                    since,
                    until: until.clone(),
                });
            }
        }
        let info = TableInfo {
            oid: 0,
            schema: schema.to_owned(),
            name: name.to_owned(),
            columns: columns
                .iter()
                .map(|c| ColumnInfo {
                    name: c.name.clone(),
                    type_oid: c.type_oid,
                })
                .collect(),
        };
        Ok(RowReader {
            query: PageQuery {
                table,
                columns,
                time,
                time_kind,
                since,
                until,
                batch: batch.max(1),
            },
            table: Arc::new(info),
            paging: Paging::Keyset,
            after: None,
            in_cursor: false,
            done: false,
        })
    }

    /// Reads the window as `paging` says (before the first page; a new
    /// reader pages by [`Paging::Keyset`]).
    pub(crate) fn with_paging(mut self, paging: Paging) -> RowReader {
        debug_assert!(self.after.is_none() && !self.in_cursor && !self.done);
        self.paging = paging;
        self
    }

    /// The time column's name.
    pub(crate) fn time_column(&self) -> &str {
        &self.query.columns[self.query.time].name
    }

    /// The bounds as PostgreSQL read them.
    pub(crate) fn window(&self) -> (&str, Option<&str>) {
        (&self.query.since, self.query.until.as_deref())
    }

    /// Rows in the window now (for the progress bar; rows written meanwhile
    /// may add to it).
    pub(crate) async fn count(&self, client: &Client) -> Result<u64, RowsError> {
        let rows = simple(client, &self.query.count(), "counting the rows to backfill").await?;
        Ok(rows
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// The next page of events; empty once the window is read.
    pub(crate) async fn next_page(
        &mut self,
        client: &Client,
    ) -> Result<Vec<OutboxEvent>, RowsError> {
        if self.done {
            return Ok(Vec::new());
        }
        let rows = match self.paging {
            Paging::Keyset => {
                let after = self.after.as_ref().map(|(t, i)| (t.as_str(), i.as_str()));
                simple(client, &self.query.page(after), "reading outbox rows").await?
            }
            Paging::Cursor => self.fetch(client).await?,
        };
        if rows.len() < self.query.batch {
            self.done = true;
            if self.in_cursor {
                self.in_cursor = false;
                simple(client, "COMMIT", "closing the cursor on outbox rows").await?;
            }
        }
        // Each row ends with its ctid (see `PageQuery::page`).
        let ctid = self.query.columns.len();
        if let Some(last) = rows.last() {
            let text = |i: usize| last.get(i).cloned().flatten().unwrap_or_default();
            self.after = Some((text(self.query.time), text(ctid)));
        }
        Ok(rows
            .into_iter()
            .map(|mut values| {
                values.truncate(ctid);
                self.event(values)
            })
            .collect())
    }

    /// The cursor's next page, the cursor declared first. A failed
    /// statement rolls the transaction back, so the connection is usable.
    async fn fetch(&mut self, client: &Client) -> Result<Vec<Vec<Option<String>>>, RowsError> {
        let result = if self.in_cursor {
            let sql = format!("FETCH FORWARD {} FROM {CURSOR}", self.query.batch);
            simple(client, &sql, "reading outbox rows").await
        } else {
            let sql = format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY; \
                 DECLARE {CURSOR} NO SCROLL CURSOR FOR {}; \
                 FETCH FORWARD {} FROM {CURSOR}",
                self.query.ordered(),
                self.query.batch
            );
            self.in_cursor = true;
            simple(client, &sql, "reading outbox rows").await
        };
        if result.is_err() && self.in_cursor {
            self.in_cursor = false;
            self.done = true;
            let _ = client.simple_query("ROLLBACK").await;
        }
        result
    }

    /// An event as the source would hand it on, but with no transaction
    /// behind it: LSN 0/0 and xid 0 (the commit is long gone), and now as
    /// its "commit time". That is what the record timestamp falls back to
    /// (as for the relay, the `outbox.columns.timestamp` column wins), so a
    /// backfilled record is not older than its topic's `retention.ms` or
    /// `message.timestamp.*.max.ms` allow; the envelope's `occurredAt`
    /// still comes from the row (timestamp column, else `created_at`).
    fn event(&self, values: Vec<Option<String>>) -> OutboxEvent {
        let values = values
            .into_iter()
            .map(|v| match v {
                Some(s) => ColumnValue::Text(Bytes::from(s)),
                None => ColumnValue::Null,
            })
            .collect();
        OutboxEvent {
            commit_lsn: Lsn::ZERO,
            xid: 0,
            commit_time_us: crate::clock::now_unix_micros(),
            kind: EventKind::Row(Row {
                table: Arc::clone(&self.table),
                values,
            }),
        }
    }
}

/// Whether the table holds any row at all, whatever its time (an audit
/// whose range has none asks: an empty table means rows are not kept).
pub(crate) async fn table_has_rows(
    client: &Client,
    schema: &str,
    name: &str,
) -> Result<bool, RowsError> {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {}.{})",
        quote_ident(schema),
        quote_ident(name)
    );
    let row = client
        .query_one(&sql, &[])
        .await
        .map_err(|source| RowsError::Sql {
            context: "looking for rows in the outbox table",
            source,
        })?;
    Ok(row.get(0))
}

/// The table's columns as pgoutput describes them: not dropped, not
/// generated (pgoutput leaves generated columns out), in column order.
async fn columns(client: &Client, table: &str, display: &str) -> Result<Vec<Column>, RowsError> {
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid::oid, format_type(a.atttypid, a.atttypmod) \
             FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 \
               AND NOT a.attisdropped AND a.attgenerated = '' \
             ORDER BY a.attnum",
            &[&table],
        )
        .await
        .map_err(|source| RowsError::Sql {
            context: "looking up the outbox table",
            source,
        })?;
    if rows.is_empty() {
        return Err(RowsError::NoTable {
            table: display.to_owned(),
        });
    }
    Ok(rows
        .iter()
        .map(|r| Column {
            name: r.get(0),
            type_oid: r.get(1),
            type_name: r.get(2),
        })
        .collect())
}

/// A `--since` / `--until` value as an absolute `timestamptz`, read once
/// (so `yesterday` or `now` means the same on every page).
async fn bound(client: &Client, flag: &'static str, text: &str) -> Result<String, RowsError> {
    let sql = format!("SELECT {}::timestamptz", literal(text));
    let rows = client
        .simple_query(&sql)
        .await
        .map_err(|source| RowsError::InvalidTime {
            flag,
            value: text.to_owned(),
            reason: pg_message(&source),
        })?;
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .ok_or_else(|| RowsError::InvalidTime {
            flag,
            value: text.to_owned(),
            reason: "PostgreSQL returned no value".into(),
        })
}

/// Runs one simple-protocol statement; each row as its columns' text.
async fn simple(
    client: &Client,
    sql: &str,
    context: &'static str,
) -> Result<Vec<Vec<Option<String>>>, RowsError> {
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|source| RowsError::Sql { context, source })?;
    Ok(messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect())
}
