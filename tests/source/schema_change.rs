//! Acceptance 6: `ALTER TABLE outbox ADD COLUMN` mid-stream: rows after it
//! carry the new column, rows before it do not.

use std::time::Duration;

use super::support::{create_slot, row, setup};
use crate::harness::outboxd::tail;

#[test]
fn rows_after_add_column_carry_the_new_column() {
    let s = setup("alter");
    create_slot(&s.pg, "alter");
    let insert = "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'a', 'e', '{}');";
    s.pg.psql("app", &format!("{insert}\n{insert}"));
    s.pg.psql(
        "app",
        "ALTER TABLE outbox ADD COLUMN tenant text DEFAULT 'acme'",
    );
    s.pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant) VALUES ('t', 'a', 'e', '{}', 'globex');",
    );
    s.pg.psql("app", insert);
    let out = tail(&s.config, &["--limit", "4"], Duration::from_secs(60));
    assert_eq!(out.events.len(), 4, "{}", out.stderr);
    assert!(!row(&out.events[0]).contains_key("tenant"));
    assert!(!row(&out.events[1]).contains_key("tenant"));
    assert_eq!(row(&out.events[2])["tenant"], "globex");
    assert_eq!(row(&out.events[3])["tenant"], "acme");
}
