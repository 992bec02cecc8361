//! `outboxd audit`: chooses the tables, runs the audit (`crate::audit`)
//! and prints its report, for a person or a program; the report's verdict
//! is the exit code.

use std::io::Write;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use crate::audit::{AuditError, AuditOptions};
use crate::cli::backfill::choose_table;
use crate::config::Config;
use crate::source::session::SourceSettings;

pub use crate::audit::{DEFAULT_BATCH, EXIT_CANNOT, EXIT_CLEAN, EXIT_FOUND};
pub use crate::cli::progress_bar::Progress;
/// The delivery mode duplicates are judged by (`relay.delivery`).
pub use crate::config::relay::DeliveryMode;

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// For a person: counts and the first 20 ids of each list.
    #[default]
    Text,
    /// For a program: one JSON object with every id.
    Json,
}

/// The command's arguments.
#[derive(Debug, Clone)]
pub struct AuditArgs {
    /// Lower bound (inclusive), anything a `timestamptz` literal takes.
    pub since: String,
    /// Upper bound (exclusive); none = up to the time the audit starts.
    pub until: Option<String>,
    /// `--table schema.name`; none = every configured table.
    pub table: Option<String>,
    pub time_column: Option<String>,
    pub format: Format,
    /// Overrides the configuration's delivery mode (`relay.delivery`).
    pub mode: Option<DeliveryMode>,
    /// Rows fetched at a time.
    pub batch: usize,
}

/// Why the command could not audit.
#[derive(Debug, thiserror::Error)]
pub enum AuditCommandError {
    #[error("{0}")]
    TableChoice(String),
    #[error(transparent)]
    Audit(#[from] AuditError),
}

/// `--mode`: a delivery mode as `relay.delivery` spells it, each value
/// told by what the audit does with duplicates.
pub fn mode_parser() -> impl TypedValueParser<Value = DeliveryMode> {
    PossibleValuesParser::new([
        PossibleValue::new("at-least-once").help(
            "Duplicates are allowed (consumers drop them by the `id` header): reported, and \
             exit 0 when nothing else is wrong",
        ),
        PossibleValue::new("exactly-once").help(
            "Every event exactly once: a duplicate sent by the relay fails the audit. Backfill \
             copies do not: the operator asked for them, and they carry the `outboxd.backfill` \
             header",
        ),
    ])
    .map(|mode| match mode.as_str() {
        "exactly-once" => DeliveryMode::ExactlyOnce,
        _ => DeliveryMode::AtLeastOnce,
    })
}

/// Audits the range of every table chosen, writes the report to `out` and
/// returns the exit code. `Err` when it could not audit a table at all.
pub async fn run(
    cfg: &Config,
    source: &SourceSettings,
    args: &AuditArgs,
    out: &mut (dyn Write + Send),
    progress: &Progress,
) -> Result<u8, AuditCommandError> {
    let tables = match &args.table {
        Some(wanted) => {
            vec![choose_table(cfg, Some(wanted)).map_err(AuditCommandError::TableChoice)?]
        }
        None => cfg.tables(),
    };
    let opts = AuditOptions {
        since: args.since.clone(),
        until: args.until.clone(),
        time_column: args.time_column.clone(),
        mode: args.mode.unwrap_or(cfg.relay.delivery),
        keep_all_ids: args.format == Format::Json,
        batch: args.batch,
    };
    let report = crate::audit::run(cfg, source, &tables, &opts, progress).await?;
    progress.finish();
    let code = report.exit_code();
    let written = match args.format {
        Format::Text => report.write_text(out),
        Format::Json => report.write_json(out),
    };
    written.map_err(AuditError::Spill)?;
    Ok(code)
}
