//! `outboxd backfill`: publishes the outbox rows still in the table whose
//! time column falls in a window, through the relay's mapping and the same
//! idempotent producer, each record with an `outboxd.backfill: true`
//! header. The way back from an accepted gap, and "send yesterday's events
//! to a new consumer" (consumers drop duplicates by the `id` header).
//!
//! Guarantees: rows are read in time order then storage order (see
//! `source::outbox_rows`) and enqueued in that order from this one task,
//! so records of one key keep that order in their partition; every
//! record's acknowledgement is awaited, and the [`Summary`] counts what was
//! acked, dead-lettered, failed or never sent.
//! Nothing is lost silently: a failed delivery stops the backfill (the rest
//! is "not sent") and the exit code says so; running it again is safe.
//!
//! The slot is not involved: a backfill neither reads nor moves it.

mod error;
mod mark;
mod send;
mod summary;

use std::sync::Arc;
use std::time::Instant;

use crate::config::{Config, OnError, OutboxTable};
use crate::outbox::{OutboxEvent, RecordMapper};
use crate::source::admin;
use crate::source::outbox_rows::{ReadOptions, RowReader};
use crate::source::session::SourceSettings;

pub use crate::cli::progress_bar::Progress;
pub use crate::outbox::BACKFILL_HEADER;
pub use error::BackfillError;
pub use summary::Summary;

/// Rows read per page: big enough that the round trips do not matter, small
/// enough that a page of large payloads stays a few MB.
pub const DEFAULT_BATCH: usize = 1000;

#[derive(Debug, Clone)]
pub struct BackfillOptions {
    /// Lower bound (inclusive), anything a `timestamptz` literal takes.
    pub since: String,
    /// Upper bound (exclusive); none = up to now and on.
    pub until: Option<String>,
    /// Read and map, count per topic, send nothing.
    pub dry_run: bool,
    /// The column the window applies to, over `outbox.columns.timestamp`
    /// and `created_at`.
    pub time_column: Option<String>,
    pub batch: usize,
    /// `--table schema.name`: which `[[outbox]]` table to read; needed only
    /// when several are configured (one table per backfill, so each run's
    /// summary and window are about one table).
    pub table: Option<String>,
}

/// The table a backfill reads: the one named by `--table` (`schema.name`,
/// or `name` for `public.name`), or the only one configured.
pub(crate) fn choose_table(cfg: &Config, wanted: Option<&str>) -> Result<OutboxTable, String> {
    let tables = cfg.tables();
    let labels = || {
        tables
            .iter()
            .map(OutboxTable::label)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match wanted {
        Some(w) => {
            let w = if w.contains('.') {
                w.to_owned()
            } else {
                format!("public.{w}")
            };
            tables
                .iter()
                .find(|t| t.label() == w)
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "--table {w} is not a configured outbox table; the tables are {}",
                        labels()
                    )
                })
        }
        None if tables.len() == 1 => Ok(tables[0].clone()),
        None => Err(format!(
            "{} outbox tables are configured; name the one to backfill with --table (one of {})",
            tables.len(),
            labels()
        )),
    }
}

/// Runs the backfill to its end. `Err` only when it could not start
/// (nothing was sent); once rows were read, the [`Summary`] tells, and
/// [`Summary::complete`] decides the exit code.
pub async fn run(
    cfg: &Config,
    source: &SourceSettings,
    opts: &BackfillOptions,
    progress: &Progress,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Summary, BackfillError> {
    let started = Instant::now();
    let table = choose_table(cfg, opts.table.as_deref()).map_err(BackfillError::TableChoice)?;
    let mut mapper = RecordMapper::new(&table.columns, &table.routing, &table.ce_source())?;
    let client = admin::connect_sql(&source.conn).await?;
    let read = ReadOptions {
        since: opts.since.clone(),
        until: opts.until.clone(),
        time_column: opts.time_column.clone(),
        batch: opts.batch,
    };
    let mut reader = RowReader::open(
        &client,
        table.table.schema(),
        table.table.name(),
        &table.columns,
        &read,
    )
    .await?;
    let (since, until) = reader.window();
    let mut summary = Summary {
        dry_run: opts.dry_run,
        table: table.label(),
        time_column: reader.time_column().to_owned(),
        since: since.to_owned(),
        until: until.map(str::to_owned),
        ..Summary::default()
    };
    if progress.is_visible() {
        progress.set_total("rows", reader.count(&client).await?);
    }
    let mut sender = if opts.dry_run {
        None
    } else {
        let dead_letter_topic = match cfg.relay.on_error {
            OnError::DeadLetter => cfg.relay.dead_letter_topic.as_deref().map(Arc::from),
            OnError::Stop => None,
        };
        Some(send::Sender::new(cfg, dead_letter_topic)?)
    };
    tokio::pin!(stop);
    'pages: loop {
        let page = tokio::select! {
            biased;
            _ = &mut stop => {
                summary.stopped = Some("interrupted".into());
                break;
            }
            page = reader.next_page(&client) => page,
        };
        let page = match page {
            Ok(p) if p.is_empty() => break,
            Ok(p) => p,
            Err(e) => {
                summary.stopped = Some(e.to_string());
                break;
            }
        };
        for event in page {
            summary.read += 1;
            progress.inc(1);
            let outcome = match &mut sender {
                None => dry_run(&mut mapper, &event, &mut summary),
                Some(s) => s.publish(&mut mapper, event, &mut summary).await,
            };
            if let Err(why) = outcome {
                summary.stopped = Some(why);
                break 'pages;
            }
        }
    }
    if let Some(s) = sender {
        s.finish(&mut summary).await;
    }
    progress.finish();
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Maps one event and counts it; sends nothing.
fn dry_run(
    mapper: &mut RecordMapper,
    event: &OutboxEvent,
    summary: &mut Summary,
) -> Result<(), String> {
    match mapper.map(event) {
        Ok(record) => {
            *summary
                .published
                .entry(record.topic.to_string())
                .or_default() += 1
        }
        Err(e) => {
            let (_, id) = mapper.key_and_id(event);
            tracing::warn!(
                id = %id.as_deref().map(String::from_utf8_lossy).unwrap_or_default(),
                error = %e,
                "this row cannot be mapped (relay.on_error decides what a real run does)"
            );
            summary.unmappable += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_only_one_or_the_one_named() {
        let cfg = |outbox: &str| {
            Config::from_toml_str_with_env(
                &format!("{outbox}\n[postgres]\nurl = \"postgresql://u@h/db\"\n"),
                |_| None,
            )
            .unwrap()
        };
        let one = cfg("[outbox]\ntable = \"events\"");
        assert_eq!(choose_table(&one, None).unwrap().label(), "public.events");
        assert_eq!(
            choose_table(&one, Some("events")).unwrap().label(),
            "public.events"
        );
        let two = cfg("[[outbox]]\ntable = \"a.outbox\"\n[[outbox]]\ntable = \"b.outbox\"");
        let e = choose_table(&two, None).unwrap_err();
        assert!(
            e.contains("--table") && e.contains("a.outbox, b.outbox"),
            "{e}"
        );
        assert_eq!(
            choose_table(&two, Some("b.outbox")).unwrap().key,
            "outbox[1]"
        );
        let e = choose_table(&two, Some("c.outbox")).unwrap_err();
        assert!(
            e.contains("c.outbox") && e.contains("a.outbox, b.outbox"),
            "{e}"
        );
    }
}
