//! The `outboxd` binary.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use outboxd::cli::{audit, backfill, check, health, settings, tail};
use outboxd::config::{Config, ConfigError, LogFormat};
use outboxd::source::session::SourceSettings;

/// Exit code of `run`, `tail` and `backfill` when they fail after the configuration was
/// accepted.
const EXIT_FAILED: u8 = 1;
/// Exit code of every subcommand when the configuration cannot be read,
/// parsed or validated: nothing was started, and retrying will not help
/// (a supervisor can tell this from an outage). The same as `check`'s.
const EXIT_CONFIG: u8 = check::EXIT_CONFIG;

#[derive(Parser)]
#[command(
    name = "outboxd",
    version,
    about = "Relays transactional-outbox events from PostgreSQL to Kafka"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Relay outbox events to Kafka, confirming the slot only after acks.
    /// Exit code 0: stopped on request (SIGTERM, Ctrl-C); 1: failed;
    /// 2: invalid configuration.
    Run {
        /// Configuration file (TOML). Optional when OUTBOXD_<SECTION>__<KEY>
        /// variables supply every required key; they win over the file.
        #[arg(long, short, env = "OUTBOXD_CONFIG")]
        config: Option<PathBuf>,
        /// Resume past a gap the position ledger names (a lost or dropped
        /// slot, another server or timeline) after backfilling it: the
        /// accepted range is recorded in the ledger and logged at WARN.
        #[arg(long)]
        accept_gap: bool,
    },
    /// Print decoded outbox events from the replication slot as JSON lines.
    /// Peeks: the slot does not move unless --confirm is given.
    /// Exit code 0: done; 1: failed; 2: invalid configuration.
    Tail {
        /// Configuration file (TOML). Optional when OUTBOXD_<SECTION>__<KEY>
        /// variables supply every required key; they win over the file.
        #[arg(long, short, env = "OUTBOXD_CONFIG")]
        config: Option<PathBuf>,
        /// Confirm the slot up to the last transaction printed in full, so the
        /// next tail starts after it. This consumes the events from the slot:
        /// an `outboxd run` on the same slot will never relay them.
        #[arg(long)]
        confirm: bool,
        /// Peek without moving the slot (the default; kept for old scripts).
        #[arg(long, hide = true, conflicts_with = "confirm")]
        no_confirm: bool,
        /// Stop after printing this many events.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Publish the outbox rows still in the table whose time column is in
    /// [--since, --until), as `run` would plus the header
    /// `outboxd.backfill: true`. Reads the table, not the slot.
    /// Exit code 0: every row read was acknowledged (or dead-lettered);
    /// 1: failed or stopped early (the summary says what was not sent);
    /// 2: invalid configuration.
    Backfill {
        /// Configuration file (TOML). Optional when OUTBOXD_<SECTION>__<KEY>
        /// variables supply every required key; they win over the file.
        #[arg(long, short, env = "OUTBOXD_CONFIG")]
        config: Option<PathBuf>,
        /// Rows from this time on (inclusive): RFC 3339
        /// (2026-12-01T10:00:00Z) or any PostgreSQL timestamptz literal
        /// ('2026-12-01 10:00:00+01', 'yesterday'); without an offset, in
        /// the server's TimeZone.
        #[arg(long)]
        since: String,
        /// Rows before this time (exclusive); default: no upper bound.
        #[arg(long)]
        until: Option<String>,
        /// Read and map the rows and count them per topic; send nothing.
        #[arg(long)]
        dry_run: bool,
        /// The column the window applies to. Default: outbox.columns.timestamp
        /// if set, else created_at.
        #[arg(long)]
        time_column: Option<String>,
        /// Rows read per query.
        #[arg(long, default_value_t = backfill::DEFAULT_BATCH)]
        batch_size: usize,
        /// The outbox table to read (schema.name), when [[outbox]] lists
        /// several; one table per backfill.
        #[arg(long)]
        table: Option<String>,
    },
    /// Compare the outbox rows committed in [--since, --until) with the
    /// records of the topics they route to: missing, duplicated, out of
    /// order per key, wrong key or topic. Reads the table and Kafka
    /// (read_committed); sends nothing, moves no slot.
    /// Exit code 0: nothing missing or out of order (duplicates allowed
    /// at-least-once); 1: events missing or out of order (or duplicated,
    /// exactly-once); 2: invalid configuration; 3: cannot audit (no rows
    /// left to compare, or PostgreSQL or Kafka failed).
    Audit {
        /// Configuration file (TOML). Optional when OUTBOXD_<SECTION>__<KEY>
        /// variables supply every required key; they win over the file.
        #[arg(long, short, env = "OUTBOXD_CONFIG")]
        config: Option<PathBuf>,
        /// Rows from this time on (inclusive), as for backfill: RFC 3339 or
        /// any PostgreSQL timestamptz literal.
        #[arg(long)]
        since: String,
        /// Rows before this time (exclusive); default: when the audit starts.
        #[arg(long)]
        until: Option<String>,
        /// The outbox table to audit (schema.name); default: every one.
        #[arg(long)]
        table: Option<String>,
        /// The column the range applies to. Default: outbox.columns.timestamp
        /// if set, else created_at.
        #[arg(long)]
        time_column: Option<String>,
        /// text: counts and the first 20 ids of each list; json: everything.
        #[arg(long, value_enum, default_value_t = audit::Format::Text)]
        format: audit::Format,
        /// Judge duplicates as this delivery mode does. Default: the
        /// relay's mode (`relay.delivery`).
        #[arg(long, value_parser = audit::mode_parser())]
        mode: Option<audit::DeliveryMode>,
        /// Rows fetched at a time (the range is one query, read through a
        /// cursor).
        #[arg(long, default_value_t = audit::DEFAULT_BATCH)]
        batch_size: usize,
    },
    /// Check that PostgreSQL and Kafka are ready for `run`, creating nothing.
    /// Exit code 0: ready; 1: a check failed; 2: unreadable configuration.
    Check {
        /// Configuration file (TOML). Optional when OUTBOXD_<SECTION>__<KEY>
        /// variables supply every required key; they win over the file.
        #[arg(long, short, env = "OUTBOXD_CONFIG")]
        config: Option<PathBuf>,
        /// Also map and encode the newest N rows of each outbox table as
        /// `run` would (with the registry's schemas), sending nothing, and
        /// list the rows that would fail.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        sample: Option<u32>,
    },
    /// Ask the running relay's /readyz at `[metrics] listen` of the same
    /// configuration (the container image's HEALTHCHECK).
    /// Exit code 0: ready; 1: not ready or not answering; 2: invalid
    /// configuration or no `[metrics] listen`.
    Health {
        /// Configuration file (TOML). Optional when OUTBOXD_<SECTION>__<KEY>
        /// variables supply every required key; they win over the file.
        #[arg(long, short, env = "OUTBOXD_CONFIG")]
        config: Option<PathBuf>,
    },
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OUTBOXD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colours only for a person at a terminal: escape codes in a log file,
    // journald or `docker logs` get in the way of grep and log shippers.
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr);
    let quiet = outboxd::sink::QuietRdkafka;
    match format {
        LogFormat::Json => builder.json().finish().with(quiet).init(),
        LogFormat::Text => builder.finish().with(quiet).init(),
    }
}

/// Why a subcommand stopped with an error, which decides its exit code.
enum Failure {
    /// The configuration cannot be read, parsed or validated ([`EXIT_CONFIG`]).
    Config(anyhow::Error),
    /// Anything after the configuration was accepted ([`EXIT_FAILED`]).
    Runtime(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Runtime(e)
    }
}

/// Reads and validates the configuration (with what the relay needs too
/// when `for_relay`), starts logging, and derives the source settings.
fn load(path: Option<&Path>, for_relay: bool) -> Result<(Config, SourceSettings), Failure> {
    let invalid = |e: ConfigError| {
        let what = path.map_or("(from the environment)".into(), |p| p.display().to_string());
        Failure::Config(anyhow::Error::new(e).context(format!("invalid configuration {what}")))
    };
    let cfg = Config::load(path).map_err(invalid)?;
    init_logging(cfg.log.format, &cfg.log.level);
    if for_relay {
        cfg.validate_for_relay().map_err(invalid)?;
    }
    let source = settings::source_settings(&cfg).map_err(invalid)?;
    Ok((cfg, source))
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Run { config, accept_gap } => {
            let (cfg, source) = load(config.as_deref(), true)?;
            let slot = cfg.postgres.slot.clone();
            let mut relay = outboxd::relay::RelaySettings::new(source, cfg);
            relay.accept_gap = accept_gap;
            if let Some(addr) = relay.config.metrics.listen {
                let health = std::sync::Arc::clone(&relay.health);
                outboxd::metrics::serve(addr, std::sync::Arc::clone(&health))
                    .map_err(anyhow::Error::new)?;
                let every = relay.config.metrics.slot_sample_interval;
                outboxd::metrics::slot::spawn_sampler(
                    relay.source.conn.clone(),
                    slot.clone(),
                    every,
                    health,
                );
            }
            outboxd::relay::run(relay, shutdown_signal())
                .await
                .with_context(|| format!("relay of slot {slot:?} stopped"))?;
        }
        Command::Tail {
            config,
            confirm,
            no_confirm: _,
            limit,
        } => {
            let (cfg, source) = load(config.as_deref(), false)?;
            let opts = tail::TailOptions {
                confirm,
                limit,
                status_interval: cfg.postgres.status_interval,
            };
            let mut stdout = std::io::stdout();
            tail::run(&source, &opts, &mut stdout, shutdown_signal())
                .await
                .with_context(|| format!("tail of slot {:?} failed", cfg.postgres.slot))?;
        }
        Command::Backfill {
            config,
            since,
            until,
            dry_run,
            time_column,
            batch_size,
            table,
        } => {
            let (cfg, source) = load(config.as_deref(), !dry_run)?;
            let opts = backfill::BackfillOptions {
                since,
                until,
                dry_run,
                time_column,
                batch: batch_size,
                table,
            };
            let progress = backfill::Progress::for_stderr();
            let summary = backfill::run(&cfg, &source, &opts, &progress, shutdown_signal())
                .await
                .context("backfill failed before sending anything")?;
            println!("{summary}");
            if !summary.complete() {
                return Err(Failure::Runtime(anyhow::anyhow!(
                    "backfill incomplete: {} of {} rows read were not acknowledged by Kafka \
                     (failed {}, not sent {}); running it again is safe, consumers drop \
                     duplicates by id",
                    summary.failed + summary.not_sent(),
                    summary.read,
                    summary.failed,
                    summary.not_sent()
                )));
            }
        }
        // Dispatched in `main`: they have exit codes of their own.
        Command::Check { .. } => unreachable!("`check` is run by main"),
        Command::Audit { .. } => unreachable!("`audit` is run by main"),
        Command::Health { .. } => unreachable!("`health` is run by main"),
    }
    Ok(())
}

/// `outboxd audit`: its report on stdout, its own exit codes.
async fn run_audit(config: Option<&Path>, args: &audit::AuditArgs) -> u8 {
    let (cfg, source) = match load(config, true) {
        Ok(loaded) => loaded,
        Err(Failure::Config(e)) | Err(Failure::Runtime(e)) => {
            eprintln!("outboxd: {e:#}");
            return EXIT_CONFIG;
        }
    };
    let progress = audit::Progress::for_stderr();
    let mut stdout = std::io::stdout();
    match audit::run(&cfg, &source, args, &mut stdout, &progress).await {
        Ok(code) => code,
        Err(e) => {
            progress.finish();
            eprintln!("outboxd: cannot audit: {e:#}");
            audit::EXIT_CANNOT
        }
    }
}

/// `outboxd health`: the configuration gives the address; no logging is set
/// up, so a health check every few seconds writes one line, not a log.
fn health_check(path: Option<&Path>) -> u8 {
    let listen = match Config::load(path) {
        Ok(cfg) => cfg.metrics.listen,
        Err(e) => {
            let what = path.map_or("(from the environment)".into(), |p| p.display().to_string());
            eprintln!("outboxd: invalid configuration {what}: {e}");
            return EXIT_CONFIG;
        }
    };
    let Some(listen) = listen else {
        eprintln!("outboxd: metrics.listen is not set: there is no /readyz to ask");
        return EXIT_CONFIG;
    };
    health::run(listen, &mut std::io::stdout())
}

fn main() -> ExitCode {
    outboxd::cli::malloc::limit_arenas();
    let cli = Cli::parse();
    if let Command::Health { config } = &cli.command {
        return ExitCode::from(health_check(config.as_deref()));
    }
    // One thread for every task: the replication driver hands each WAL item
    // to the relay, and on one thread that hand-over is a queue push, not a
    // wake-up of another core, which drains much faster
    // (docs/benchmarks.md, "One runtime thread"; librdkafka has threads of
    // its own). Nothing may block this thread: the walsender's keepalives
    // are answered on it too, so blocking calls go to `spawn_blocking`.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outboxd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Command::Check { config, sample } = &cli.command {
        return ExitCode::from(rt.block_on(check::run_sampled(
            config.as_deref(),
            sample.map(|n| n as usize),
            &mut std::io::stdout(),
        )));
    }
    if let Command::Audit {
        config,
        since,
        until,
        table,
        time_column,
        format,
        mode,
        batch_size,
    } = cli.command
    {
        let args = audit::AuditArgs {
            since,
            until,
            table,
            time_column,
            format,
            mode,
            batch: batch_size,
        };
        return ExitCode::from(rt.block_on(run_audit(config.as_deref(), &args)));
    }
    let (code, e) = match rt.block_on(run(cli)) {
        Ok(()) => return ExitCode::SUCCESS,
        Err(Failure::Config(e)) => (EXIT_CONFIG, e),
        Err(Failure::Runtime(e)) => (EXIT_FAILED, e),
    };
    eprintln!("outboxd: {e:#}");
    ExitCode::from(code)
}
