//! Verdicts, exit codes and the two report formats.

use super::*;

fn table(rows: u64, f: impl FnOnce(&mut Findings)) -> TableAudit {
    let mut findings = Findings::new(false);
    findings.rows = rows;
    findings.delivered = rows;
    f(&mut findings);
    TableAudit {
        table: "public.outbox".into(),
        time_column: "created_at".into(),
        since: "2026-12-01 10:00:00+00".into(),
        until: None,
        topics: vec!["t.order".into()],
        counts: RecordCounts::default(),
        findings,
        table_has_rows: true,
        message_prefix: None,
        spilled_runs: 0,
        phases: [Duration::ZERO; 3],
        elapsed: Duration::ZERO,
    }
}

fn report(mode: DeliveryMode, tables: Vec<TableAudit>) -> Report {
    Report {
        mode,
        tables,
        elapsed: Duration::ZERO,
    }
}

#[test]
fn duplicates_pass_at_least_once_and_fail_exactly_once() {
    let dup = || {
        table(10, |f| {
            f.duplicates.push("a".into()).unwrap();
            f.backfilled_again.push("b".into()).unwrap();
        })
    };
    assert_eq!(
        report(DeliveryMode::AtLeastOnce, vec![dup()]).exit_code(),
        EXIT_CLEAN
    );
    let exactly = report(DeliveryMode::ExactlyOnce, vec![dup()]);
    assert_eq!(exactly.exit_code(), EXIT_FOUND);
    assert_eq!(
        exactly.tables[0].verdict(DeliveryMode::ExactlyOnce),
        Verdict::Incomplete(vec!["1 duplicated (exactly-once)".into()])
    );
    // Backfill copies alone do not fail exactly-once.
    let backfilled = table(10, |f| f.backfilled_again.push("b".into()).unwrap());
    assert_eq!(
        backfilled.verdict(DeliveryMode::ExactlyOnce),
        Verdict::Complete
    );
}

#[test]
fn missing_or_out_of_order_fail_and_win_over_cannot_audit() {
    let missing = table(10, |f| f.missing.push("a".into()).unwrap());
    let mut gone = table(0, |_| {});
    gone.table_has_rows = false;
    assert!(
        matches!(gone.verdict(DeliveryMode::AtLeastOnce), Verdict::CannotAudit(w) if w.contains("keep => true"))
    );
    assert_eq!(
        report(DeliveryMode::AtLeastOnce, vec![gone]).exit_code(),
        EXIT_CANNOT
    );
    let mut gone = table(0, |_| {});
    gone.table_has_rows = false;
    assert_eq!(
        report(DeliveryMode::AtLeastOnce, vec![gone, missing]).exit_code(),
        EXIT_FOUND
    );
}

#[test]
fn an_empty_range_is_no_rows_unless_records_lack_theirs() {
    assert_eq!(
        table(0, |_| {}).verdict(DeliveryMode::AtLeastOnce),
        Verdict::NoRows
    );
    let deleted = table(0, |f| f.in_range_without_row = 3);
    assert!(matches!(
        deleted.verdict(DeliveryMode::AtLeastOnce),
        Verdict::CannotAudit(w) if w.contains("3 records are stamped inside it")
    ));
}

#[test]
fn the_text_report_ends_with_the_summary_and_json_lists_everything() {
    let t = table(30, |f| {
        f.delivered = 25;
        for i in 0..25 {
            f.missing.push(format!("id-{i}")).unwrap();
        }
    });
    let mut text = Vec::new();
    report(DeliveryMode::AtLeastOnce, vec![t])
        .write_text(&mut text)
        .unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains("and 5 more (--format json lists all)"),
        "{text}"
    );
    assert!(
        text.lines().last().unwrap().starts_with(
            "audit: 1 table, 30 rows, 25 delivered, 25 missing, 0 duplicated, 0 out of order"
        ),
        "{text}"
    );
    let mut t = table(30, |_| {});
    t.findings = Findings::new(true);
    t.findings.rows = 30;
    for i in 0..25 {
        t.findings.missing.push(format!("id-{i}")).unwrap();
    }
    let mut json = Vec::new();
    report(DeliveryMode::AtLeastOnce, vec![t])
        .write_json(&mut json)
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["exit_code"], 1);
    assert_eq!(
        v["tables"][0]["missing"]["ids"].as_array().unwrap().len(),
        25
    );
    assert_eq!(v["tables"][0]["verdict"], "incomplete");
}
