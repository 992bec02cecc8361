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

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::harness::events::{
    aggregates, ledger_entries, payload_texts, verify_reading, write, Copies, ReadBack, Sent,
    Verdict,
};
use crate::harness::kafka::{session_outlasting, shared};
use crate::harness::relay::{
    backfill_from, confirmed_lsn, env, env_with_broker_props, lsn_now, named_since,
    relayed_then_stopped, use_ledger_topic, Env, Relay,
};
use crate::harness::standby::{promote, start_standby};
use crate::harness::wait::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_dropped_under_the_relay_stops_it_naming_the_gap_and_backfill_recovers() {
    slot_dropped_under_the_relay("slotloss", "", ReadBack::Count).await;
}

/// What [`slot_dropped_under_the_relay`] leaves: its cluster, every event
/// committed, and what the read-back found.
pub(super) type SlotDropped = (Env, Vec<Sent>, Verdict);

/// The slot `slot` dropped under a relay configured with `extra`, then the
/// way back the relay names (backfill, `--accept-gap`); every committed
/// event is read back as `read` says, duplicates allowed (the backfill's
/// window overlaps what was relayed).
pub(super) async fn slot_dropped_under_the_relay(
    slot: &str,
    extra: &str,
    read: ReadBack,
) -> SlotDropped {
    let broker = shared();
    let e = env(broker.bootstrap(), slot, extra);
    let pg = &e.pg;
    let aggs = aggregates(10);
    let mut relay = Relay::start(&e);
    let start = confirmed_lsn(pg, slot);
    let mut client = pg.client("app").await;
    let mut sent = write(&mut client, slot, &aggs, 500, &[1, 10], 0).await;
    tokio::task::block_in_place(|| {
        wait_for("a first confirmation", Duration::from_secs(60), || {
            confirmed_lsn(pg, slot) > start
        })
    });

    // A writer keeps going while the DBA drops the slot.
    let writer = {
        let pg_url = pg.url("postgres", Some("postgres"), "app");
        let aggs = aggs.clone();
        let slot = slot.to_owned();
        tokio::spawn(async move {
            let (mut client, conn) = tokio_postgres::connect(&pg_url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            write(&mut client, &slot, &aggs, 1_500, &[1, 5, 20], 0).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| {
        // The relay reconnects at once; drop the slot between its attempts.
        let dropped = Instant::now() + Duration::from_secs(30);
        loop {
            let out = pg.psql(
                "app",
                &format!(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                       WHERE slot_name = '{slot}' AND active_pid IS NOT NULL; \
                     SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots \
                       WHERE slot_name = '{slot}' AND NOT active"
                ),
            );
            if pg
                .psql(
                    "app",
                    &format!(
                        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
                    ),
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
        format!("\"{slot}\" disappeared").as_str(),
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
        &format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"),
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
        format!("replication slot \"{slot}\": the slot does not exist").as_str(),
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
        &format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    );
    assert_eq!(
        slots.trim(),
        "0",
        "the restart created a slot:\n{again_log}"
    );

    // The way back: backfill from the time named (a little earlier, for
    // transactions open at that moment), then start once with --accept-gap.
    let out = backfill_from(pg, &e.config, &named_since(&log));
    let accepted = Relay::start_with(&e, &[], &["--accept-gap"]);
    // Rows committed before the new slot exists are the backfill's.
    tokio::task::block_in_place(|| {
        wait_for("the new slot to stream", Duration::from_secs(60), || {
            pg.psql(
                "app",
                &format!(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active"
                ),
            )
            .trim()
                == "1"
        })
    });
    let mut client = pg.client("app").await;
    sent.extend(write(&mut client, slot, &aggs, 100, &[1, 10], 0).await);
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
        verify_reading(
            broker,
            &sent,
            &texts,
            Duration::from_secs(120),
            true,
            true,
            read,
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
    drop(accepted);
    (e, sent, v)
}

/// Issue 8: a failover to a promoted PostgreSQL standby that has no copy of
/// the logical slot (every standby before PostgreSQL 17), with events
/// committed while Kafka was down. Before the ledger, the relay created a
/// new slot on the promoted server and the events committed on the old
/// primary after its last ack were gone (300 in the issue), with one INFO
/// line. Now it stops naming the gap, a restart refuses again, and
/// `outboxd backfill` from the ledger's commit time plus `run --accept-gap`
/// bring every committed event to Kafka.
///
/// The standby streams from the primary (the harness's cold-copy standby);
/// the test waits until it has replayed everything the primary committed,
/// then kills the primary (immediate stop), promotes the standby and moves
/// it to the primary's address, so the relay's configuration is unchanged:
/// every event the writer saw committed exists on the new primary (checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_a_promoted_standby_with_kafka_down_refuses_naming_the_gap_and_backfill_recovers(
) {
    failover_without_a_failover_slot("failover15", "", ReadBack::Count).await;
}

/// The failover above, for a relay whose `[relay]` table also holds
/// `relay_extra`; every committed event is read back as `read` says.
/// Returns how many events the relay itself (not the backfill) wrote more
/// than once.
pub(super) async fn failover_without_a_failover_slot(
    slot: &str,
    relay_extra: &str,
    read: ReadBack,
) -> usize {
    let ledger_topic = format!("{slot}-ledger");
    // Kafka is paused through the failover below (its waits allow 60 s for
    // the standby's replay); a hung broker, not a fenced one.
    let (broker, e) = tokio::task::block_in_place(|| {
        env_with_broker_props(
            slot,
            &format!("[relay]\nreconnect_backoff_max = \"1s\"\n{relay_extra}"),
            &session_outlasting(Duration::from_secs(90)),
        )
    });
    use_ledger_topic(&e, &ledger_topic);
    let mut standby = tokio::task::block_in_place(|| start_standby(&e.pg, "standby1"));
    let pg = &e.pg;
    let aggs = aggregates(10);
    let mut relay = Relay::start(&e);
    let mut client = pg.client("app").await;
    let mut sent = write(&mut client, slot, &aggs, 500, &[1, 10], 0).await;
    let acked_end = lsn_now(pg);
    tokio::task::block_in_place(|| {
        wait_for("the first events acked", Duration::from_secs(60), || {
            confirmed_lsn(pg, slot) >= acked_end
        });
        wait_for("the ledger to pass them", Duration::from_secs(60), || {
            ledger_entries(&broker, &ledger_topic)
                .last()
                .is_some_and(|(_, l)| l.confirmed_lsn >= acked_end)
        });
    });

    // Kafka down; the application goes on committing.
    broker.pause();
    let while_down = write(&mut client, slot, &aggs, 300, &[1, 10], 0).await;
    sent.extend(while_down.iter().cloned());
    drop(client);
    let primary_end = lsn_now(pg);
    tokio::task::block_in_place(|| {
        wait_for(
            "the standby to replay the primary's last commit",
            Duration::from_secs(60),
            || {
                let replayed: outboxd::Lsn = standby
                    .psql("app", "SELECT pg_last_wal_replay_lsn()")
                    .trim()
                    .parse()
                    .unwrap();
                replayed >= primary_end
            },
        );
        // The primary dies; the standby is promoted and takes its address.
        pg.crash();
        promote(&standby);
        standby.move_to_port(pg.port());
    });
    // Committed on the new primary before the relay is back: also a gap.
    let mut client = standby.client("app").await;
    let after_promotion = write(&mut client, slot, &aggs, 100, &[1, 10], 0).await;
    sent.extend(after_promotion.iter().cloned());
    drop(client);
    let rows = standby.psql("app", "SELECT count(*) FROM outbox");
    assert_eq!(
        rows.trim(),
        sent.len().to_string(),
        "the new primary lacks committed events"
    );
    broker.resume();

    let needles = |log: &str| {
        for needle in [
            &format!("replication slot \"{slot}\""),
            "timeline 2, the ledger's is 1",
            "The ledger (kafka.ledger_topic) has every event relayed up to",
            "(commit time 20",
            "the server would resume at",
            "outboxd backfill --since",
            "outboxd run --accept-gap",
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
    };
    let status = tokio::task::block_in_place(|| relay.wait(Duration::from_secs(90)));
    let log = relay.log();
    let status = status.unwrap_or_else(|| panic!("the relay kept running; its log:\n{log}"));
    assert!(!status.success(), "exit {status:?}; log:\n{log}");
    needles(&log);
    let no_slot = || {
        let slots = standby.psql(
            "app",
            &format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"),
        );
        assert_eq!(slots.trim(), "0", "a slot was created on the new primary");
    };
    no_slot();

    let mut again = Relay::start(&e);
    let status = tokio::task::block_in_place(|| again.wait(Duration::from_secs(60)));
    let again_log = again.log();
    let status =
        status.unwrap_or_else(|| panic!("the restart kept running; its log:\n{again_log}"));
    assert!(!status.success(), "exit {status:?}; log:\n{again_log}");
    needles(&again_log);
    no_slot();

    // The way back, as the error says: backfill from the ledger's commit
    // time (a little earlier), then --accept-gap once.
    let ledger = tokio::task::block_in_place(|| ledger_entries(&broker, &ledger_topic))
        .pop()
        .map(|(_, l)| l)
        .expect("a ledger entry");
    let since = named_since(&log);
    assert_eq!(
        since,
        outboxd::progress::ledger::format_time_us(ledger.commit_time_us.unwrap()),
        "the time named is not the ledger's"
    );
    let out = backfill_from(&standby, &e.config, &since);
    let accepted = Relay::start_with(&e, &[], &["--accept-gap"]);
    tokio::task::block_in_place(|| {
        wait_for("the new slot to stream", Duration::from_secs(60), || {
            standby
                .psql(
                    "app",
                    &format!(
                        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active"
                    ),
                )
                .trim()
                == "1"
        })
    });
    let mut client = standby.client("app").await;
    sent.extend(write(&mut client, slot, &aggs, 100, &[1, 10], 0).await);
    let accepted_log = accepted.log();
    assert!(
        accepted_log.contains("accepting a gap (--accept-gap)"),
        "no WARN naming the accepted gap:\n{accepted_log}"
    );
    let texts = payload_texts(&standby);
    let logs = e.dir.path().to_path_buf();
    let b = &broker;
    let v = tokio::task::block_in_place(|| {
        verify_reading(
            b,
            &sent,
            &texts,
            Duration::from_secs(120),
            true,
            true,
            read,
            &logs,
        )
    });
    // Every duplicate is flagged: one of its copies came from the backfill.
    let topics = ["payment", "order"].map(|kind| format!("{slot}.{kind}"));
    let copies = Copies::read(b, topics.iter().map(String::as_str));
    let (flagged, repeated) = (&copies.backfilled, copies.repeated());
    let unflagged = v.duplicated_ids.difference(flagged).count();
    assert_eq!(unflagged, 0, "duplicates without a backfilled copy");
    let gap_ids: HashSet<&str> = while_down
        .iter()
        .chain(&after_promotion)
        .map(|s| s.id.as_str())
        .collect();
    let gap_backfilled = gap_ids.iter().filter(|id| flagged.contains(**id)).count();
    eprintln!(
        "failover to a promoted standby (PostgreSQL {}) with Kafka down: {} committed ({} while \
         Kafka was down, {} on the new primary before the relay), 0 lost, {} delivered, {} \
         duplicates (all flagged; the relay's own records repeated: {repeated}); ledger at {} \
         (commit time {since}); gap events backfilled: {gap_backfilled} of {}; backfill: {}",
        standby.major(),
        sent.len(),
        while_down.len(),
        after_promotion.len(),
        v.delivered,
        v.duplicates,
        ledger.confirmed_lsn,
        gap_ids.len(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    assert_eq!(v.delivered, sent.len());
    repeated
}

/// A database restored on another cluster (another system identifier)
/// under the same database and slot names, which the relay's configuration
/// points at unchanged: it stops naming the other cluster, and `--accept-gap`
/// relays what the new cluster's slot holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cluster_under_the_same_names_stops_the_relay_and_accept_gap_resumes() {
    let v = restored_on_another_cluster("restored", "", ReadBack::Count).await;
    assert_eq!(v.duplicates, 0);
}

/// The relay streams a first cluster (with `relay_extra` in its `[relay]`
/// table) until the slot is confirmed to the end and stops; then a second
/// cluster, with events of its own already in a slot of the same name,
/// takes the first one's place in the configuration. The relay must refuse
/// it naming both system identifiers and the way back; with
/// `--accept-gap` it relays the second cluster's events. Returns the
/// read-back of both clusters' events.
pub(super) async fn restored_on_another_cluster(
    slot: &str,
    relay_extra: &str,
    read: ReadBack,
) -> Verdict {
    let broker = shared();
    let ledger_topic = format!("{slot}-ledger-{}", uuid::Uuid::new_v4().simple());
    let extra = format!("[relay]\n{relay_extra}");
    let first = env(broker.bootstrap(), slot, &extra);
    use_ledger_topic(&first, &ledger_topic);
    let mut client = first.pg.client("app").await;
    let mut sent = relayed_then_stopped(&first, &mut client, slot, &aggregates(4), 50).await;

    let second = env(broker.bootstrap(), slot, &extra);
    use_ledger_topic(&second, &ledger_topic);
    let sysid = |e: &Env| {
        e.pg.psql("app", "SELECT system_identifier FROM pg_control_system()")
            .trim()
            .to_owned()
    };
    let (old, new) = (sysid(&first), sysid(&second));
    assert_ne!(old, new);
    let restored: Vec<String> = aggregates(4).iter().map(|a| format!("r{a}")).collect();
    let mut client = second.pg.client("app").await;
    sent.extend(write(&mut client, slot, &restored, 30, &[1, 10], 0).await);

    let held = confirmed_lsn(&second.pg, slot);
    let mut refused = Relay::start(&second);
    let status = tokio::task::block_in_place(|| refused.wait(Duration::from_secs(60)));
    let log = refused.log();
    let status = status.unwrap_or_else(|| panic!("the relay kept running; its log:\n{log}"));
    assert!(!status.success(), "exit {status:?}; log:\n{log}");
    for needle in [
        "another PostgreSQL cluster",
        &format!("system identifier {new}, the ledger's is {old}"),
        "outboxd run --accept-gap",
    ] {
        assert!(
            log.contains(needle),
            "{needle:?} not in the relay's log:\n{log}"
        );
    }
    assert_eq!(
        confirmed_lsn(&second.pg, slot),
        held,
        "the refused relay moved the slot"
    );

    let accepted = Relay::start_with(&second, &[], &["--accept-gap"]);
    let mut texts = payload_texts(&first.pg);
    texts.extend(payload_texts(&second.pg));
    let logs = second.dir.path().to_path_buf();
    let v = tokio::task::block_in_place(|| {
        verify_reading(
            broker,
            &sent,
            &texts,
            Duration::from_secs(120),
            false,
            true,
            read,
            &logs,
        )
    });
    let accepted_log = accepted.log();
    assert!(
        accepted_log.contains("accepting a gap (--accept-gap)"),
        "no WARN naming the accepted gap:\n{accepted_log}"
    );
    eprintln!(
        "restored on another cluster: {} committed on both, {} delivered, {} duplicates",
        sent.len(),
        v.delivered,
        v.duplicates
    );
    v
}
