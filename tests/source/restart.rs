//! Acceptance 2: `tail` peeks unless told `--confirm`; what `tail --confirm`
//! confirmed is never shown again, and nothing after it is missed.

use std::time::Duration;

use super::support::{confirmed_flush_lsn, create_slot, setup, text};
use crate::harness::outboxd::tail;

fn write_batches(pg: &crate::harness::pg::PgCluster, batches: usize, per_txn: usize) {
    let mut sql = String::new();
    for b in 0..batches {
        sql.push_str("BEGIN;\n");
        for i in 0..per_txn {
            let n = b * per_txn + i;
            sql.push_str(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'a', 'e', '{{\"n\": {n}}}');\n"
            ));
        }
        sql.push_str("COMMIT;\n");
    }
    pg.psql("app", &sql);
}

fn numbers(events: &[serde_json::Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            serde_json::from_str::<serde_json::Value>(text(e, "payload")).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn restart_resumes_right_after_the_confirmed_position() {
    let s = setup("restart");
    create_slot(&s.pg, "restart");
    write_batches(&s.pg, 10, 10);
    let t = Duration::from_secs(60);

    // Peeking moves nothing (the old `--no-confirm` is still accepted).
    let before = confirmed_flush_lsn(&s.pg, "restart");
    let peek = tail(&s.config, &["--limit", "30", "--no-confirm"], t);
    assert_eq!(
        numbers(&peek.events),
        (0..30).collect::<Vec<_>>(),
        "{}",
        peek.stderr
    );
    assert_eq!(
        confirmed_flush_lsn(&s.pg, "restart"),
        before,
        "--no-confirm moved the slot"
    );

    // 50 = five whole transactions: confirmed up to the fifth commit.
    let first = tail(&s.config, &["--limit", "50", "--confirm"], t);
    assert!(first.success, "{}", first.stderr);
    assert_eq!(numbers(&first.events), (0..50).collect::<Vec<_>>());
    let x = first.events.last().unwrap()["lsn"]
        .as_str()
        .unwrap()
        .to_string();
    let confirmed: outboxd::Lsn = confirmed_flush_lsn(&s.pg, "restart").parse().unwrap();
    assert_eq!(
        confirmed,
        x.parse().unwrap(),
        "slot confirmed {confirmed}, tail printed up to {x}"
    );

    // 45 cuts the tenth... fifth remaining transaction in half: it is not
    // confirmed, so the next run shows it again in full.
    let second = tail(&s.config, &["--limit", "45", "--confirm"], t);
    assert_eq!(
        numbers(&second.events),
        (50..95).collect::<Vec<_>>(),
        "{}",
        second.stderr
    );
    let third = tail(&s.config, &["--limit", "10", "--confirm"], t);
    assert_eq!(
        numbers(&third.events),
        (90..100).collect::<Vec<_>>(),
        "{}",
        third.stderr
    );
    for e in second.events.iter().chain(&third.events) {
        let lsn: outboxd::Lsn = e["lsn"].as_str().unwrap().parse().unwrap();
        assert!(
            lsn > x.parse().unwrap(),
            "event at or before the confirmed position shown again"
        );
    }
}

/// An operator's `tail --limit 1` on the production slot must not consume
/// the event from under `run`: without `--confirm` the slot stays put and
/// the next reader sees the same event; with it, the slot moves past it.
#[test]
fn tail_peeks_unless_told_to_confirm() {
    let s = setup("peek");
    create_slot(&s.pg, "peek");
    write_batches(&s.pg, 3, 1);
    let t = Duration::from_secs(60);
    let before = confirmed_flush_lsn(&s.pg, "peek");

    for round in 0..2 {
        let out = tail(&s.config, &["--limit", "1"], t);
        assert!(out.success, "{}", out.stderr);
        assert_eq!(
            numbers(&out.events),
            vec![0],
            "round {round}: {}",
            out.stderr
        );
        assert_eq!(
            confirmed_flush_lsn(&s.pg, "peek"),
            before,
            "round {round}: a plain tail moved the slot"
        );
    }

    let confirmed = tail(&s.config, &["--limit", "1", "--confirm"], t);
    assert!(confirmed.success, "{}", confirmed.stderr);
    assert_eq!(numbers(&confirmed.events), vec![0], "{}", confirmed.stderr);
    let printed: outboxd::Lsn = confirmed.events[0]["lsn"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let moved: outboxd::Lsn = confirmed_flush_lsn(&s.pg, "peek").parse().unwrap();
    assert_eq!(moved, printed, "--confirm did not confirm what it printed");

    let next = tail(&s.config, &["--limit", "2"], t);
    assert_eq!(numbers(&next.events), vec![1, 2], "{}", next.stderr);
}
