//! The slot dropped under a running relay (a DBA cleaning up slots:
//! `pg_terminate_backend(active_pid)`, then `pg_drop_replication_slot`).
//! Before, the relay reconnected, created a new slot at the current WAL
//! position and never relayed what was committed meanwhile (61 of 1,180
//! events lost in one run, one INFO line). Now it creates no slot once it
//! has streamed one, stops with a non-zero exit naming the slot, the last
//! confirmed position and time and the way back; `outboxd backfill` from
//! that time, then a restart with `--accept-gap`, bring every committed
//! event to Kafka. A plain restart (postgres.create_slot = true) refuses,
//! naming the gap from the position ledger: before the ledger was wired
//! into `run`, it created a new slot and skipped the gap silently.

use std::process::Command;
use std::time::{Duration, Instant};

use super::support::{
    aggregates, confirmed_lsn, env, payload_texts, verify_checking, wait_for, Relay,
};
use crate::harness::kafka::shared;
use crate::harness::outboxd::bin;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_dropped_under_the_relay_stops_it_naming_the_gap_and_backfill_recovers() {
    let broker = shared();
    let e = env(broker.bootstrap(), "slotloss", "");
    let pg = &e.pg;
    let aggs = aggregates(10);
    let mut relay = Relay::start(&e);
    let start = confirmed_lsn(pg, "slotloss");
    let mut client = pg.client("app").await;
    let mut sent = super::support::write(&mut client, "slotloss", &aggs, 500, &[1, 10], 0).await;
    tokio::task::block_in_place(|| {
        wait_for("a first confirmation", Duration::from_secs(60), || {
            confirmed_lsn(pg, "slotloss") > start
        })
    });

    // A writer keeps going while the DBA drops the slot.
    let writer = {
        let pg_url = pg.url("postgres", Some("postgres"), "app");
        let aggs = aggs.clone();
        tokio::spawn(async move {
            let (mut client, conn) = tokio_postgres::connect(&pg_url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            super::support::write(&mut client, "slotloss", &aggs, 1_500, &[1, 5, 20], 0).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| {
        // The relay reconnects at once; drop the slot between its attempts.
        let dropped = Instant::now() + Duration::from_secs(30);
        loop {
            let out = pg.psql(
                "app",
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                   WHERE slot_name = 'slotloss' AND active_pid IS NOT NULL; \
                 SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots \
                   WHERE slot_name = 'slotloss' AND NOT active",
            );
            if pg
                .psql(
                    "app",
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slotloss'",
                )
                .trim()
                == "0"
            {
                break;
            }
            assert!(Instant::now() < dropped, "could not drop the slot: {out}");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    sent.extend(writer.await.unwrap());

    let status = tokio::task::block_in_place(|| relay.wait(Duration::from_secs(60)));
    let log = relay.log();
    let status = status.unwrap_or_else(|| panic!("the relay kept running; its log:\n{log}"));
    assert!(!status.success(), "exit {status:?}; log:\n{log}");
    for needle in [
        "\"slotloss\" disappeared",
        "outboxd backfill --since",
        "created none",
    ] {
        assert!(
            log.contains(needle),
            "{needle:?} not in the relay's log:\n{log}"
        );
    }
    assert!(
        !log.contains("created replication slot"),
        "the relay created a slot:\n{log}"
    );
    let slots = pg.psql(
        "app",
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slotloss'",
    );
    assert_eq!(slots.trim(), "0", "a new slot was created");

    // A plain restart (create_slot = true) must not create a slot over the
    // gap: the ledger names it, and the process exits non-zero.
    let mut again = Relay::start(&e);
    let status = tokio::task::block_in_place(|| again.wait(Duration::from_secs(60)));
    let again_log = again.log();
    let status =
        status.unwrap_or_else(|| panic!("the restart kept running; its log:\n{again_log}"));
    assert!(!status.success(), "exit {status:?}; log:\n{again_log}");
    for needle in [
        "replication slot \"slotloss\": the slot does not exist",
        "The ledger (kafka.ledger_topic) has every event relayed up to",
        "outboxd backfill --since",
        "outboxd run --accept-gap",
    ] {
        assert!(
            again_log.contains(needle),
            "{needle:?} not in the restarted relay's log:\n{again_log}"
        );
    }
    let slots = pg.psql(
        "app",
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slotloss'",
    );
    assert_eq!(
        slots.trim(),
        "0",
        "the restart created a slot:\n{again_log}"
    );

    // The way back: backfill from the time named (a little earlier, for
    // transactions open at that moment), then start once with --accept-gap.
    let since = log
        .split("--since '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no --since time in:\n{log}"))
        .to_owned();
    let earlier = pg.psql(
        "app",
        &format!("SELECT (timestamptz '{since}' - interval '10 seconds')::text"),
    );
    let out = Command::new(bin())
        .args(["backfill", "--config"])
        .arg(&e.config)
        .args(["--since", earlier.trim()])
        .env("OUTBOXD_LOG", "info")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "backfill failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let accepted = Relay::start_with(&e, &[], &["--accept-gap"]);
    // Rows committed before the new slot exists are the backfill's.
    tokio::task::block_in_place(|| {
        wait_for("the new slot to stream", Duration::from_secs(60), || {
            pg.psql(
                "app",
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slotloss' AND active",
            )
            .trim()
                == "1"
        })
    });
    let mut client = pg.client("app").await;
    sent.extend(super::support::write(&mut client, "slotloss", &aggs, 100, &[1, 10], 0).await);
    let accepted_log = accepted.log();
    assert!(
        accepted_log.contains("accepting a gap (--accept-gap)"),
        "no WARN naming the accepted gap:\n{accepted_log}"
    );
    let texts = payload_texts(pg);
    let logs = e.dir.path().to_path_buf();
    let v = tokio::task::block_in_place(|| {
        // The gap's events come from the backfill alone, in (created_at,
        // ctid) order: commit order for this one sequential writer.
        verify_checking(
            broker,
            &sent,
            &texts,
            Duration::from_secs(120),
            true,
            true,
            &logs,
        )
    });
    eprintln!(
        "slot dropped under load: {} committed, {} delivered after backfill, {} duplicates; backfill: {}",
        sent.len(),
        v.delivered,
        v.duplicates,
        String::from_utf8_lossy(&out.stdout).trim()
    );
}
