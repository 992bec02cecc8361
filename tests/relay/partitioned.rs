//! A partitioned outbox table (`PARTITION BY RANGE (created_at)`), as
//! operators run it: published through its root, so its rows are relayed
//! whichever partition holds them, including partitions attached later.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::events::{aggregates, verify_env, write};
use crate::harness::kafka::shared;
use crate::harness::outboxd::{bin, wait_with_timeout};
use crate::harness::relay::{env, slot_active, Env, Relay};
use crate::harness::wait::wait_for;

/// Replaces the migrations' outbox table by a partitioned one with the same
/// columns, one partition holding every row written with `now()`.
const PARTITIONED_OUTBOX: &str = "\
    DROP TABLE outbox; \
    CREATE TABLE outbox ( \
        id uuid NOT NULL DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, \
        aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, \
        headers jsonb, created_at timestamptz NOT NULL DEFAULT now(), \
        PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at); \
    CREATE TABLE outbox_before_3000 PARTITION OF outbox FOR VALUES FROM (MINVALUE) TO ('3000-01-01')";

fn partitioned_env(slot: &str) -> Env {
    let e = env(shared().bootstrap(), slot, "");
    e.pg.psql("app", PARTITIONED_OUTBOX);
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_outbox_is_relayed_including_a_partition_attached_later() {
    let e = partitioned_env("part");
    // outboxd creates the publication (create_publication = true).
    e.pg.psql("app", "DROP PUBLICATION outboxd");
    let relay = Relay::start(&e);
    tokio::task::block_in_place(|| {
        wait_for("the relay streaming", Duration::from_secs(60), || {
            slot_active(&e.pg, "part")
        })
    });
    let aggs = aggregates(10);
    let mut client = e.pg.client("app").await;
    let mut sent = write(&mut client, "part", &aggs, 100, &[10], 0).await;
    // A partition attached under the running relay, and rows routed to it.
    e.pg.psql(
        "app",
        "CREATE TABLE outbox_from_3000 (LIKE outbox INCLUDING DEFAULTS); \
         ALTER TABLE outbox ATTACH PARTITION outbox_from_3000 FOR VALUES FROM ('3000-01-01') TO (MAXVALUE); \
         ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT '3000-06-01'",
    );
    sent.extend(write(&mut client, "part", &aggs, 100, &[10], 0).await);
    assert_eq!(
        e.pg.psql("app", "SELECT count(*) FROM outbox_from_3000")
            .trim(),
        "100"
    );
    let v = verify_env(&e, &sent, Duration::from_secs(60));
    assert_eq!(v.delivered, 200);
    assert_eq!(
        e.pg.psql(
            "app",
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'outboxd'"
        )
        .trim(),
        "t",
        "publication created without publish_via_partition_root; log:\n{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publication_by_partition_is_refused_by_run_and_check_with_the_fix() {
    let e = partitioned_env("bypart");
    // The migrations' publication, given the partitioned table without
    // publish_via_partition_root: rows would carry the partitions' names.
    e.pg.psql("app", "ALTER PUBLICATION outboxd ADD TABLE outbox");
    let fix = "ALTER PUBLICATION \"outboxd\" SET (publish_via_partition_root = true)";

    let mut relay = Relay::start(&e);
    let status = tokio::task::block_in_place(|| relay.wait(Duration::from_secs(30)))
        .unwrap_or_else(|| panic!("outboxd run kept running; log:\n{}", relay.log()));
    assert!(!status.success(), "log:\n{}", relay.log());
    assert!(relay.log().contains(fix), "log:\n{}", relay.log());

    let mut child = Command::new(bin())
        .args(["check", "--config"])
        .arg(&e.config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let status = wait_with_timeout(&mut child, Duration::from_secs(90)).expect("check finished");
    assert_eq!(status.code(), Some(1), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("FAIL  publication "))
        .unwrap_or_else(|| panic!("no FAIL publication line in:\n{out}"));
    assert!(line.contains(fix), "{line}");
}
