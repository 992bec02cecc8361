//! The audit: did we lose or double anything? Compares the outbox rows
//! committed in a time range with the records of the topics they route to,
//! and reports per table the rows, what was delivered, what is missing,
//! what was doubled (backfill copies apart), records of a key out of commit
//! order, and records with a wrong key or topic. `outboxd audit`
//! (`cli::audit`) chooses the tables, prints the [`Report`] and exits with
//! its code.
//!
//! - **Rows** are read and mapped exactly as `outboxd backfill` reads and
//!   maps them (same reader, `source::outbox_rows`, same mapper): in
//!   time-column then storage order, which numbers them (the order a key's
//!   records must follow). Unlike a backfill, the range is one statement
//!   fetched through a cursor in one read-only transaction, sorted once by
//!   PostgreSQL (`Paging::Cursor`): keyset pages were each planned alone,
//!   and on a table without statistics each sorted the rest of the range.
//! - **Records** are read `read_committed` from the first offset stamped at
//!   or after `--since` to the end of each partition (see `records`).
//! - **Memory** is bounded: both sides are kept as small entries in an
//!   external sort (`spill`: in memory up to a budget, then sorted runs in
//!   anonymous temporary files), merged by id (`compare::join`), then the
//!   first copies sorted by (topic, partition, key, offset) for the order
//!   check (`compare::check_order`). Long lists of ids go to disk too.
//!
//! Exit codes: [`EXIT_CLEAN`], [`EXIT_FOUND`], 2 for the configuration (as
//! every subcommand), [`EXIT_CANNOT`].

mod compare;
mod entries;
mod error;
mod exit;
mod listing;
mod progress;
mod records;
mod report;
mod rows;
mod spill;

use std::time::Instant;

use crate::config::{Config, DeliveryMode, OutboxTable};
use crate::outbox::record::parse_timestamp_ms;
use crate::outbox::RecordMapper;
use crate::source::admin;
use crate::source::outbox_rows::{self, Paging, ReadOptions, RowReader};
use crate::source::session::SourceSettings;

pub use error::AuditError;
pub use exit::{EXIT_CANNOT, EXIT_CLEAN, EXIT_FOUND};
pub use progress::ProgressReporter;
pub use report::Report;

/// Rows fetched at a time: five times a backfill's, since the audit waits
/// for no broker between pages. The range is one statement read through a
/// cursor (`Paging::Cursor`), not a query per page as for a backfill.
pub const DEFAULT_BATCH: usize = 5_000;

/// What each side may hold in memory before it spills to disk.
const SORT_BUDGET: usize = 8 << 20;

/// What to audit, and how to judge it.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// Lower bound (inclusive), anything a `timestamptz` literal takes.
    pub since: String,
    /// Upper bound (exclusive); none = up to the time the audit starts.
    pub until: Option<String>,
    pub time_column: Option<String>,
    /// The mode duplicates are judged by: allowed at-least-once, a failure
    /// exactly-once (backfill copies apart).
    pub mode: DeliveryMode,
    /// Keep every id of each list for the report, not only the first few
    /// (they go to temporary files): for a report that lists them all.
    pub keep_all_ids: bool,
    /// Rows fetched at a time.
    pub batch: usize,
}

/// Audits the range of each table in `tables` and returns the report.
/// `Err` when it could not audit a table at all.
pub async fn run(
    cfg: &Config,
    source: &SourceSettings,
    tables: &[OutboxTable],
    opts: &AuditOptions,
    progress: &impl ProgressReporter,
) -> Result<Report, AuditError> {
    let started = Instant::now();
    let client = admin::connect_sql(&source.conn).await?;
    let kafka = records::consumer_config(crate::sink::admin_client_config(
        cfg.kafka.brokers.as_deref().unwrap_or_default(),
        &cfg.kafka.properties,
    )?);
    let mut audits = Vec::new();
    for table in tables {
        audits.push(audit_table(&client, &kafka, table, opts, progress).await?);
    }
    Ok(Report {
        mode: opts.mode,
        tables: audits,
        elapsed: started.elapsed(),
    })
}

/// One table's comparison.
async fn audit_table(
    client: &tokio_postgres::Client,
    kafka: &rdkafka::ClientConfig,
    table: &OutboxTable,
    opts: &AuditOptions,
    progress: &impl ProgressReporter,
) -> Result<report::TableAudit, AuditError> {
    let started = Instant::now();
    let mut mapper = RecordMapper::new(&table.columns, &table.routing, &table.ce_source())?;
    // Without --until the range ends when the audit starts (PostgreSQL
    // reads `now` once): rows committed meanwhile are left out, not missing.
    let read_opts = ReadOptions {
        since: opts.since.clone(),
        until: Some(opts.until.clone().unwrap_or_else(|| "now".into())),
        time_column: opts.time_column.clone(),
        batch: opts.batch,
    };
    let mut reader = RowReader::open(
        client,
        table.table.schema(),
        table.table.name(),
        &table.columns,
        &read_opts,
    )
    .await?
    .with_paging(Paging::Cursor);
    let (since, until) = reader.window();
    let (since, until) = (since.to_owned(), until.map(str::to_owned));
    let ms = |t: &str| parse_timestamp_ms(t.as_bytes()).ok_or_else(|| AuditError::Bound(t.into()));
    let range = records::TimeRange {
        since_ms: ms(&since)?,
        until_ms: until.as_deref().map(ms).transpose()?,
    };
    let keep_all = opts.keep_all_ids;

    let total = if progress.is_visible() {
        Some(reader.count(client).await?)
    } else {
        None
    };
    progress.start_phase(&format!("rows of {}", table.label()), total);
    let mut topics = rows::Topics::default();
    let mut row_sort = spill::Sorter::new(SORT_BUDGET);
    rows::read(
        client,
        &mut reader,
        &mut mapper,
        &mut topics,
        &mut row_sort,
        progress,
    )
    .await?;
    let rows_took = started.elapsed();
    let table_has_rows = row_sort.len() > 0
        || outbox_rows::table_has_rows(client, table.table.schema(), table.table.name()).await?;
    if row_sort.len() == 0 && table_has_rows {
        let any_time = ReadOptions {
            since: "0001-01-01T00:00:00Z".into(),
            until: None,
            ..read_opts.clone()
        };
        let sample = RowReader::open(
            client,
            table.table.schema(),
            table.table.name(),
            &table.columns,
            &any_time,
        )
        .await?;
        rows::sample_topics(client, sample, &mut mapper, &mut topics).await?;
    }
    let spilled = row_sort.runs();

    // The Kafka client blocks: off the runtime's threads.
    let names = topics.names().to_vec();
    let (kafka, names2, bar) = (kafka.clone(), names.clone(), progress.clone());
    let read = tokio::task::spawn_blocking(move || {
        let mut sort = spill::Sorter::new(SORT_BUDGET);
        let counts = records::read(&kafka, &names2, range, &mut sort, &bar)?;
        Ok::<_, AuditError>((sort, counts))
    })
    .await
    .map_err(|e| AuditError::Spill(std::io::Error::other(e.to_string())))?;
    let (record_sort, counts) = read?;
    let records_took = started.elapsed() - rows_took;
    let spilled = spilled + record_sort.runs();

    let mut findings = compare::Findings::new(keep_all);
    let names3 = names.clone();
    let (findings, order_runs) = tokio::task::spawn_blocking(move || {
        let mut order = spill::Sorter::new(SORT_BUDGET);
        let rows = row_sort.finish()?;
        let records = record_sort.finish()?;
        compare::join(rows, records, &names3, &mut findings, &mut order)?;
        let runs = order.runs();
        compare::check_order(order.finish()?, &names3, &mut findings)?;
        Ok::<_, std::io::Error>((findings, runs))
    })
    .await
    .map_err(|e| AuditError::Spill(std::io::Error::other(e.to_string())))?
    .map_err(AuditError::Spill)?;

    Ok(report::TableAudit {
        table: table.label(),
        time_column: reader.time_column().to_owned(),
        since,
        until,
        topics: names,
        counts,
        findings,
        table_has_rows,
        message_prefix: table.message_prefix.clone(),
        spilled_runs: spilled + order_runs,
        phases: [
            rows_took,
            records_took,
            started.elapsed() - rows_took - records_took,
        ],
        elapsed: started.elapsed(),
    })
}
