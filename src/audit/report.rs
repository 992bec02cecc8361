//! What an audit found, its verdict and exit code, printed for a person
//! (text: counts and the first ids of each list) or a program (JSON: every
//! id, streamed from the lists' files).

use std::io::{self, Write};
use std::time::Duration;

use serde::Serialize;

use super::compare::Findings;
use super::exit::{EXIT_CANNOT, EXIT_CLEAN, EXIT_FOUND};
use super::listing::{Listing, SHOWN};
use super::records::RecordCounts;
use crate::config::DeliveryMode;

/// Where the operator reads what to do next.
const RUNBOOK: &str = "docs/operations.md, \"After an incident\"";
const KEEPING_ROWS: &str = "docs/operations.md, \"Keeping rows to backfill from\"";

/// One table's audit.
pub(crate) struct TableAudit {
    pub table: String,
    pub time_column: String,
    /// The range as PostgreSQL read it.
    pub since: String,
    pub until: Option<String>,
    pub topics: Vec<String>,
    pub counts: RecordCounts,
    pub findings: Findings,
    /// Whether the table holds any row at all (looked up when the range has
    /// none).
    pub table_has_rows: bool,
    /// `message_prefix`, when configured: such events are in no table.
    pub message_prefix: Option<String>,
    /// Runs spilled to disk (how much the range outgrew memory).
    pub spilled_runs: usize,
    /// Reading the rows, reading the records, comparing.
    pub phases: [Duration; 3],
    pub elapsed: Duration,
}

/// What one table's audit says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every row delivered, in order per key (duplicates allowed
    /// at-least-once).
    Complete,
    /// Missing or out-of-order events (or duplicates, exactly-once): why.
    Incomplete(Vec<String>),
    /// The range has no rows, and no record in the range lacks one.
    NoRows,
    /// Nothing to compare with: why.
    CannotAudit(String),
}

impl Verdict {
    fn name(&self) -> &'static str {
        match self {
            Verdict::Complete => "complete",
            Verdict::Incomplete(_) => "incomplete",
            Verdict::NoRows => "no_rows",
            Verdict::CannotAudit(_) => "cannot_audit",
        }
    }
}

impl TableAudit {
    pub(crate) fn verdict(&self, mode: DeliveryMode) -> Verdict {
        let f = &self.findings;
        if f.rows == 0 {
            if !self.table_has_rows {
                return Verdict::CannotAudit(format!(
                    "{} holds no rows at all, so there is nothing to compare Kafka with: rows \
                     written with outbox_emit() without keep => true are deleted in their own \
                     transaction. Keep rows for as long as you may need to audit or backfill \
                     ({KEEPING_ROWS})",
                    self.table
                ));
            }
            if f.in_range_without_row > 0 {
                return Verdict::CannotAudit(format!(
                    "the range has no rows, but {} records are stamped inside it: their rows \
                     were deleted (outbox_emit() without keep => true, or a retention job), so \
                     they cannot be compared ({KEEPING_ROWS})",
                    f.in_range_without_row
                ));
            }
            return Verdict::NoRows;
        }
        let mut why = Vec::new();
        if !f.missing.is_empty() {
            why.push(format!("{} missing", f.missing.count()));
        }
        if !f.out_of_order.is_empty() {
            why.push(format!("{} out of order", f.out_of_order.count()));
        }
        if mode == DeliveryMode::ExactlyOnce && !f.duplicates.is_empty() {
            why.push(format!(
                "{} duplicated (exactly-once)",
                f.duplicates.count()
            ));
        }
        if why.is_empty() {
            Verdict::Complete
        } else {
            Verdict::Incomplete(why)
        }
    }
}

/// Every table's audit: the verdicts, the exit code, and the report for a
/// person or a program.
pub struct Report {
    pub(crate) mode: DeliveryMode,
    pub(crate) tables: Vec<TableAudit>,
    pub(crate) elapsed: Duration,
}

impl Report {
    /// [`EXIT_FOUND`] if a table is incomplete, else [`EXIT_CANNOT`] if a
    /// table could not be audited, else [`EXIT_CLEAN`].
    pub fn exit_code(&self) -> u8 {
        let verdicts: Vec<Verdict> = self.tables.iter().map(|t| t.verdict(self.mode)).collect();
        if verdicts.iter().any(|v| matches!(v, Verdict::Incomplete(_))) {
            EXIT_FOUND
        } else if verdicts
            .iter()
            .any(|v| matches!(v, Verdict::CannotAudit(_)))
        {
            EXIT_CANNOT
        } else {
            EXIT_CLEAN
        }
    }

    /// Counts and the first ids of each list.
    pub fn write_text(mut self, out: &mut dyn Write) -> io::Result<()> {
        let mode = self.mode;
        let (mut rows, mut delivered, mut missing, mut dup, mut order) = (0, 0, 0, 0, 0);
        for t in &mut self.tables {
            write_table_text(t, mode, out)?;
            let f = &t.findings;
            rows += f.rows;
            delivered += f.delivered;
            missing += f.missing.count();
            dup += f.duplicates.count();
            order += f.out_of_order.count();
        }
        let verdict = match self.exit_code() {
            EXIT_CLEAN => "complete",
            EXIT_FOUND => "INCOMPLETE",
            _ => "CANNOT AUDIT",
        };
        writeln!(
            out,
            "audit: {} table{}, {rows} rows, {delivered} delivered, {missing} missing, {dup} \
             duplicated, {order} out of order, in {}: {verdict} (delivery mode {}, exit {})",
            self.tables.len(),
            if self.tables.len() == 1 { "" } else { "s" },
            seconds(self.elapsed),
            mode_name(mode),
            self.exit_code()
        )
    }

    /// One JSON object with every id kept (all of them with
    /// [`AuditOptions::keep_all_ids`](super::AuditOptions::keep_all_ids)).
    pub fn write_json(mut self, out: &mut dyn Write) -> io::Result<()> {
        let code = self.exit_code();
        write!(
            out,
            "{{\"delivery_mode\":{},\"exit_code\":{code},\"elapsed_seconds\":{:.3},\"tables\":[",
            json(mode_name(self.mode))?,
            self.elapsed.as_secs_f64()
        )?;
        let mode = self.mode;
        for (i, t) in self.tables.iter_mut().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            write_table_json(t, mode, out)?;
        }
        writeln!(out, "]}}")
    }
}

/// The mode as `relay.delivery` spells it.
fn mode_name(mode: DeliveryMode) -> &'static str {
    match mode {
        DeliveryMode::AtLeastOnce => "at-least-once",
        DeliveryMode::ExactlyOnce => "exactly-once",
    }
}

/// Seconds with one decimal, for reports.
fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn json<T: Serialize + ?Sized>(v: &T) -> io::Result<String> {
    Ok(serde_json::to_string(v)?)
}

fn write_table_text(t: &mut TableAudit, mode: DeliveryMode, out: &mut dyn Write) -> io::Result<()> {
    let verdict = t.verdict(mode);
    let f = &t.findings;
    writeln!(
        out,
        "{}: rows with {} from {} to {}; records of {} from the first offset stamped at or after \
         {} to the end",
        t.table,
        t.time_column,
        t.since,
        t.until.as_deref().unwrap_or("now"),
        if t.topics.is_empty() {
            "no topic".to_owned()
        } else {
            t.topics.join(", ")
        },
        t.since,
    )?;
    writeln!(
        out,
        "  rows {}, delivered {}, missing {}, duplicated {} ({} extra copies), backfill copies {} \
         (of {} events), out of order {}, wrong key or topic {}, unmappable {}",
        f.rows,
        f.delivered,
        f.missing.count(),
        f.duplicates.count(),
        f.duplicate_copies,
        f.backfill_copies,
        f.backfilled_again.count(),
        f.out_of_order.count(),
        f.misplaced.count(),
        f.unmappable.count(),
    )?;
    writeln!(
        out,
        "  records read {}: {} of other rows, {} without an id header; {} stamped in the range \
         without a row in it",
        t.counts.read, f.records_without_row, t.counts.without_id, f.in_range_without_row
    )?;
    for topic in &t.counts.absent_topics {
        writeln!(out, "  topic {topic} does not exist: its rows are missing")?;
    }
    let ids = |l: &Listing<String>| {
        let more = l.count().saturating_sub(l.first().len() as u64);
        let mut s = l.first().join(", ");
        if more > 0 {
            s.push_str(&format!(", and {more} more (--format json lists all)"));
        }
        s
    };
    let lists: [(&str, &Listing<String>); 4] = [
        ("missing", &f.missing),
        ("duplicated by the relay", &f.duplicates),
        (
            "backfilled again (outboxd.backfill copies)",
            &f.backfilled_again,
        ),
        ("unmappable (relay.on_error decided)", &f.unmappable),
    ];
    for (what, l) in lists {
        if !l.is_empty() {
            writeln!(out, "  {what} ({}): {}", l.count(), ids(l))?;
        }
    }
    if !f.out_of_order.is_empty() {
        writeln!(out, "  out of order ({}):", f.out_of_order.count())?;
        for o in f.out_of_order.first() {
            writeln!(
                out,
                "    {} (key {}, {}[{}] offset {}) after {}, committed later",
                o.id, o.key, o.topic, o.partition, o.offset, o.after
            )?;
        }
    }
    if !f.misplaced.is_empty() {
        writeln!(out, "  wrong key or topic ({}):", f.misplaced.count())?;
        for m in f.misplaced.first() {
            writeln!(
                out,
                "    {} on {}[{}] offset {} key {}; expected {} key {}",
                m.id,
                m.topic,
                m.partition,
                m.offset,
                m.key.as_deref().unwrap_or("(null)"),
                m.expected_topic,
                m.expected_key.as_deref().unwrap_or("(null)")
            )?;
        }
    }
    let listed = [f.out_of_order.count(), f.misplaced.count()];
    if listed.iter().any(|&n| n > SHOWN as u64) {
        writeln!(
            out,
            "    (the first {SHOWN} of each; --format json lists all)"
        )?;
    }
    if let Some(prefix) = &t.message_prefix {
        writeln!(
            out,
            "  (events emitted with pg_logical_emit_message, prefix {prefix:?}, are in no table: \
             not audited)"
        )?;
    }
    let [rows, records, compare] = t.phases;
    writeln!(
        out,
        "  read the rows in {}, the records in {}, compared in {}; {} sorted runs on disk",
        seconds(rows),
        seconds(records),
        seconds(compare),
        t.spilled_runs
    )?;
    match &verdict {
        Verdict::Complete => writeln!(out, "  verdict: complete, in {}", seconds(t.elapsed)),
        Verdict::NoRows => writeln!(
            out,
            "  verdict: no rows in the range, and no record stamped in it: nothing to audit"
        ),
        Verdict::CannotAudit(why) => writeln!(out, "  verdict: cannot audit: {why}"),
        Verdict::Incomplete(why) => writeln!(
            out,
            "  verdict: INCOMPLETE ({}); the way back: {RUNBOOK}",
            why.join(", ")
        ),
    }
}

fn write_list<T: Serialize + serde::de::DeserializeOwned>(
    out: &mut dyn Write,
    name: &str,
    extra: Option<(&str, u64)>,
    items: &str,
    l: &mut Listing<T>,
) -> io::Result<()> {
    write!(out, ",{}:{{\"count\":{}", json(name)?, l.count())?;
    if let Some((k, v)) = extra {
        write!(out, ",{}:{v}", json(k)?)?;
    }
    write!(out, ",{}:[", json(items)?)?;
    let mut first = true;
    l.for_each(|item| {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        serde_json::to_writer(&mut *out, item)?;
        Ok(())
    })?;
    write!(out, "]}}")
}

fn write_table_json(t: &mut TableAudit, mode: DeliveryMode, out: &mut dyn Write) -> io::Result<()> {
    let verdict = t.verdict(mode);
    let reasons: Vec<String> = match &verdict {
        Verdict::Incomplete(why) => why.clone(),
        Verdict::CannotAudit(why) => vec![why.clone()],
        _ => Vec::new(),
    };
    let head = serde_json::json!({
        "table": t.table,
        "time_column": t.time_column,
        "since": t.since,
        "until": t.until,
        "topics": t.topics,
        "absent_topics": t.counts.absent_topics,
        "verdict": verdict.name(),
        "reasons": reasons,
        "rows": t.findings.rows,
        "delivered": t.findings.delivered,
        "records": {
            "read": t.counts.read,
            "of_other_rows": t.findings.records_without_row,
            "in_range_without_row": t.findings.in_range_without_row,
            "without_id": t.counts.without_id,
        },
        "repeated_row_ids": t.findings.repeated_ids,
        "message_prefix_not_audited": t.message_prefix,
        "spilled_runs": t.spilled_runs,
        "phase_seconds": {
            "rows": t.phases[0].as_secs_f64(),
            "records": t.phases[1].as_secs_f64(),
            "compare": t.phases[2].as_secs_f64(),
        },
        "elapsed_seconds": t.elapsed.as_secs_f64(),
    });
    let head = serde_json::to_string(&head)?;
    // The object without its closing brace; the lists follow.
    out.write_all(&head.as_bytes()[..head.len() - 1])?;
    let f = &mut t.findings;
    write_list(out, "missing", None, "ids", &mut f.missing)?;
    let copies = f.duplicate_copies;
    write_list(
        out,
        "duplicates",
        Some(("copies", copies)),
        "ids",
        &mut f.duplicates,
    )?;
    let copies = f.backfill_copies;
    write_list(
        out,
        "backfill_copies",
        Some(("copies", copies)),
        "ids",
        &mut f.backfilled_again,
    )?;
    write_list(out, "out_of_order", None, "records", &mut f.out_of_order)?;
    write_list(out, "wrong_key_or_topic", None, "records", &mut f.misplaced)?;
    write_list(out, "unmappable", None, "ids", &mut f.unmappable)?;
    out.write_all(b"}")
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
