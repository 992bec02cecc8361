//! Acceptance 3: `pg_logical_emit_message` events with the configured prefix,
//! transactional ones in their transaction, non-transactional ones at once.

use std::time::Duration;

use super::support::{create_slot, setup, text};
use crate::harness::outboxd::tail;

#[test]
fn logical_messages_with_the_prefix_are_events() {
    let s = setup("msgs");
    create_slot(&s.pg, "msgs");
    s.pg.psql(
        "app",
        "BEGIN;\n\
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'a', 'row', '{}');\n\
         SELECT pg_logical_emit_message(true, 'outbox', 'in-transaction');\n\
         SELECT pg_logical_emit_message(true, 'other-prefix', 'ignored');\n\
         COMMIT;\n\
         SELECT pg_logical_emit_message(false, 'outbox', 'без транзакции 🎈');\n\
         BEGIN;\n\
         SELECT pg_logical_emit_message(true, 'outbox', 'rolled back');\n\
         ROLLBACK;\n\
         SELECT pg_logical_emit_message(true, 'outbox', convert_to('bytes', 'UTF8'));",
    );
    let out = tail(&s.config, &["--limit", "4"], Duration::from_secs(60));
    assert!(out.success, "{}", out.stderr);
    let e = &out.events;
    assert_eq!(e.len(), 4, "{e:?}");
    assert_eq!(text(&e[0], "event_type"), "row");
    assert_eq!(e[1]["message"]["prefix"], "outbox");
    assert_eq!(e[1]["message"]["content"], "in-transaction");
    assert_eq!(e[1]["message"]["transactional"], true);
    assert_eq!(
        e[1]["xid"], e[0]["xid"],
        "transactional message belongs to its transaction"
    );
    assert_eq!(e[1]["lsn"], e[0]["lsn"]);
    assert_eq!(e[2]["message"]["content"], "без транзакции 🎈");
    assert_eq!(e[2]["message"]["transactional"], false);
    assert_eq!(e[3]["message"]["content"], "bytes");
    assert!(out
        .events
        .iter()
        .all(|e| e["message"]["content"] != "rolled back" && e["message"]["content"] != "ignored"));
}
