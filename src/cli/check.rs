//! `outboxd check`: a preflight for `outboxd run`. One line per check with a
//! verdict, and for every failure the fix, so "it doesn't relay" becomes a
//! list of things to change before the first deploy, not a log to read after.
//!
//! It only looks: no slot, publication or topic is created (topic creation
//! is validated with CreateTopics `validate_only`). Checks that cannot run
//! because an earlier one failed (no connection, no brokers) are printed as
//! `skip`, so the output always has the same shape.

mod columns;
mod grantee;
mod kafka;
mod kafka_reach;
mod line;
mod postgres;
mod postgres_facts;
mod registry;
mod rights;
mod transactions;

use std::io::Write;
use std::path::Path;

use crate::cli::settings;
use crate::config::{Config, ConfigError, DeliveryMode, Origin, Setting};
use crate::progress::ledger::LedgerIdentity;

use line::{Line, Verdict};

/// Every check passed (warnings allowed).
pub(crate) const EXIT_OK: u8 = 0;
/// At least one check failed.
pub(crate) const EXIT_FAIL: u8 = 1;
/// The configuration file cannot be read or parsed: nothing else was checked.
pub const EXIT_CONFIG: u8 = 2;

/// Application name of the check's connections, so a DBA seeing them in
/// pg_stat_activity knows they are not the relay.
const APPLICATION_NAME: &str = "outboxd-check";

/// Prints lines as they come and counts verdicts.
struct Report<'a> {
    out: &'a mut dyn Write,
    lines: Vec<Line>,
}

impl Report<'_> {
    fn add(&mut self, line: Line) {
        // A detail of several lines (a TOML error pointing at the line) is
        // indented under the first, so every check still starts a line.
        let detail = line.detail.replace('\n', &format!("\n{:25}", ""));
        // A closed stdout (`outboxd check | head`) must not change the verdict.
        let _ = writeln!(
            self.out,
            "{:<4}  {:<17}  {detail}",
            line.verdict.label(),
            line.name,
        );
        let _ = self.out.flush();
        self.lines.push(line);
    }

    fn count(&self, v: Verdict) -> usize {
        self.lines.iter().filter(|l| l.verdict == v).count()
    }

    /// Prints the summary; returns the exit code.
    fn finish(&mut self) -> u8 {
        let failed = self.count(Verdict::Fail);
        let mut summary = format!(
            "summary: {} ok, {} warn, {} FAIL",
            self.count(Verdict::Ok),
            self.count(Verdict::Warn),
            failed
        );
        let skipped = self.count(Verdict::Skip);
        if skipped > 0 {
            summary.push_str(&format!(", {skipped} skipped"));
        }
        summary.push_str(if failed == 0 {
            ": ready for `outboxd run`"
        } else {
            ": not ready; fix the FAIL lines above and run `outboxd check` again"
        });
        let _ = writeln!(self.out, "{summary}");
        let _ = self.out.flush();
        if failed == 0 {
            EXIT_OK
        } else {
            EXIT_FAIL
        }
    }
}

/// Runs every check against the configuration at `path`, printing to `out`;
/// returns the process exit code ([`EXIT_OK`], [`EXIT_FAIL`], [`EXIT_CONFIG`]).
pub async fn run(path: Option<&Path>, out: &mut dyn Write) -> u8 {
    run_sampled(path, None, out).await
}

/// As [`run`], and with `sample = Some(n)` the newest `n` rows of each
/// outbox table are encoded as the relay would (nothing is sent); the rows
/// that would fail are listed.
pub async fn run_sampled(path: Option<&Path>, sample: Option<usize>, out: &mut dyn Write) -> u8 {
    let mut report = Report {
        out,
        lines: Vec::new(),
    };
    let source_name = path.map_or("the environment".to_owned(), |p| p.display().to_string());
    let loaded = match Config::load_with_origins(path) {
        Ok(loaded) => loaded,
        Err(e) => {
            // An I/O error names the path itself; `{:#}` adds the cause
            // (e.g. "No such file or directory").
            let detail = match e {
                ConfigError::Io { .. } => format!("{:#}", anyhow::Error::new(e)),
                e => format!("{source_name}: {e}"),
            };
            report.add(Line::fail("config", detail));
            report.finish();
            return EXIT_CONFIG;
        }
    };
    let cfg = loaded.config;
    let for_relay = cfg.validate_for_relay();
    let source = settings::source_settings(&cfg);
    match (&for_relay, &source) {
        (Ok(()), Ok(_)) => report.add(Line::ok(
            "config",
            format!(
                "{source_name}: valid (slot {:?}, publication {:?}, {} {}, brokers {})\n{}",
                cfg.postgres.slot,
                cfg.postgres.publication,
                if cfg.tables().len() == 1 {
                    "table"
                } else {
                    "tables"
                },
                cfg.tables()
                    .iter()
                    .map(|t| t.table.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                cfg.kafka.brokers.as_deref().unwrap_or_default(),
                effective(&loaded.settings),
            ),
        )),
        (Err(e), _) | (_, Err(e)) => {
            report.add(Line::fail("config", format!("{source_name}: {e}")))
        }
    }

    // Kafka runs meanwhile: an unreachable cluster takes its full metadata
    // timeout, PostgreSQL usually answers at once.
    let config_ok = for_relay.is_ok();
    let kafka = for_relay
        .ok()
        .and(cfg.kafka.brokers.clone())
        .map(|brokers| tokio::spawn(kafka::check(brokers, cfg.clone())));
    let sample_conn = source.as_ref().ok().map(|s| {
        let mut conn = s.conn.clone();
        conn.application_name = APPLICATION_NAME.into();
        conn
    });
    let (pg_lines, ledger_identity) = match source {
        Ok(mut s) => {
            s.conn.application_name = APPLICATION_NAME.into();
            let (lines, system_id) = postgres::check(&cfg, &s).await;
            let identity = system_id.map(|system_identifier| LedgerIdentity {
                system_identifier,
                database: s.conn.dbname.clone(),
                slot: cfg.postgres.slot.clone(),
            });
            (lines, identity)
        }
        Err(_) => (
            postgres::skipped("the configuration is not usable (see config)"),
            None,
        ),
    };
    for line in pg_lines {
        report.add(line);
    }
    let kafka_lines = match kafka {
        Some(task) => task.await.unwrap_or_else(|e| {
            vec![Line::fail(
                "kafka",
                format!("the Kafka checks stopped unexpectedly: {e}"),
            )]
        }),
        None => kafka::skipped("kafka.brokers is not set (see config)"),
    };
    let kafka_ok = kafka_lines
        .first()
        .is_some_and(|l| l.verdict == Verdict::Ok);
    for line in kafka_lines {
        report.add(grantee::named(
            line,
            cfg.kafka.brokers.as_deref(),
            &cfg.kafka.properties,
        ));
    }
    if cfg.relay.delivery == DeliveryMode::ExactlyOnce {
        let lines = match cfg.kafka.brokers.clone() {
            Some(brokers) if kafka_ok => {
                let id = transactional_id(&cfg, ledger_identity.as_ref());
                transactions::check(brokers, cfg.clone(), id).await
            }
            _ => transactions::skipped("Kafka is not usable (see kafka)"),
        };
        for line in lines {
            report.add(grantee::named(
                line,
                cfg.kafka.brokers.as_deref(),
                &cfg.kafka.properties,
            ));
        }
    }
    let schemas = if config_ok {
        let (lines, schemas) = registry::check(&cfg).await;
        for line in lines {
            report.add(line);
        }
        schemas
    } else {
        None
    };
    if let Some(n) = sample {
        let lines = match (schemas, sample_conn) {
            (Some(schemas), Some(conn)) => match crate::source::admin::connect_sql(&conn).await {
                Ok(client) => registry::sample(&client, &cfg, &schemas, n).await,
                Err(e) => vec![Line::skip("sample", &format!("PostgreSQL: {e}"))],
            },
            _ => vec![Line::skip(
                "sample",
                "the configuration or the registry is not usable (see above)",
            )],
        };
        for line in lines {
            report.add(line);
        }
    }
    report.finish()
}

/// The relay's transactional id: `kafka.transactional_id`, or derived from
/// the ledger key, which needs PostgreSQL's system identifier.
fn transactional_id(
    cfg: &Config,
    ledger: Option<&LedgerIdentity>,
) -> Result<transactions::TransactionalId, String> {
    if let Some(id) = &cfg.kafka.transactional_id {
        return Ok(transactions::TransactionalId {
            id: id.clone(),
            origin: "kafka.transactional_id",
        });
    }
    match ledger {
        Some(identity) => Ok(transactions::TransactionalId {
            id: cfg.kafka.default_transactional_id(&identity.key()),
            origin: "derived from the ledger key",
        }),
        None => Err(
            "the transactional id derives from PostgreSQL's system identifier \
                     (see postgres); or set kafka.transactional_id"
                .to_owned(),
        ),
    }
}

/// The effective configuration, one key a line with where its value came
/// from; secrets are masked by [`Config::load_with_origins`].
fn effective(settings: &[Setting]) -> String {
    let shown: Vec<(String, String)> = settings
        .iter()
        .map(|s| {
            let kv = match &s.value {
                Some(v) => format!("{} = {v}", s.key),
                None => format!("{} (not set)", s.key),
            };
            let origin = match &s.origin {
                Origin::File => "file".to_owned(),
                Origin::Env(var) => format!("environment {var}"),
                Origin::Default => "default".to_owned(),
            };
            (kv, origin)
        })
        .collect();
    let width = shown
        .iter()
        .map(|(kv, _)| kv.chars().count())
        .max()
        .unwrap_or(0)
        .min(64);
    let mut text = String::from("effective configuration (value, then where it came from):");
    for (kv, origin) in shown {
        text.push_str(&format!("\n  {kv:<width$}  {origin}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_prints_lines_and_summary() {
        let mut buf = Vec::new();
        let mut r = Report {
            out: &mut buf,
            lines: Vec::new(),
        };
        r.add(Line::ok("config", "valid"));
        r.add(Line::warn("slot", "unreserved"));
        assert_eq!(r.finish(), EXIT_OK);
        r.add(Line::fail("kafka", "down"));
        assert_eq!(r.finish(), EXIT_FAIL);
        let text = String::from_utf8(buf).unwrap();
        assert!(
            text.starts_with("ok    config             valid\n"),
            "{text}"
        );
        assert!(text.contains("FAIL  kafka"), "{text}");
        assert!(
            text.contains("summary: 1 ok, 1 warn, 1 FAIL: not ready"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn unreadable_config_exits_2() {
        let mut buf = Vec::new();
        let code = run(Some(Path::new("/nonexistent/outboxd.toml")), &mut buf).await;
        assert_eq!(code, EXIT_CONFIG);
        let text = String::from_utf8(buf).unwrap();
        assert!(text.starts_with("FAIL  config"), "{text}");
        assert!(text.contains("No such file"), "{text}");
    }
}
