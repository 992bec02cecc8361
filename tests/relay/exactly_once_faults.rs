//! Issue 18, the faults: `relay.delivery = "exactly-once"` under a
//! postmaster SIGKILL, a paused broker, a killed and restarted broker, a
//! record the broker refuses (`on_error = "dead_letter"`) and a PostgreSQL 17
//! failover. Each reads everything back `read_committed` to the end of each
//! partition and fails on a lost, duplicated or reordered event. With
//! `DELIVERY = "at-least-once"` each fails: duplicates, or (dead letter)
//! part of a database transaction visible.

mod load;

use std::time::{Duration, Instant};

use tokio::task::block_in_place;

use super::faults::tail_lines;
use crate::harness::events::{ledger_entries, payload_texts, verify_reading, ReadBack, Sent};
use crate::harness::kafka::{session_outlasting, shared, KafkaBroker, Record};
use crate::harness::pg::{pg_install, PgCluster};
use crate::harness::relay::{
    confirmed_lsn, env, env_with_broker_from, env_with_broker_props, kill_postmaster, lsn_now,
    use_ledger_topic, Env, Relay,
};
use crate::harness::standby::{promote, start_standby, synchronize_standby_slot};
use crate::harness::wait::wait_for;
use load::{caught_up, confirmations, recoveries, Load};

/// The mode under test.
const DELIVERY: &str = "exactly-once";

/// Broker settings under which a 3 s stall does not get the broker fenced by
/// its controller (the harness's session is 3 s), so its partitions keep
/// their leader (see `broker_sigstop_for_10_s_under_load_repeats_nothing`),
/// and shorter than the kill test's 10 s down, so that its controller fences
/// the killed broker before the restart: a broker registers again only once
/// its killed incarnation's session has run out (with 30 s, on a single
/// node, a restart took 33 s; 11-12 s with 9 s).
const KEEPS_LEADERS_THROUGH_A_STALL: &str = "broker.session.timeout.ms=9000";

/// The `[relay]` section: the mode, a short reconnect backoff, and `extra`.
fn relay_config(extra: &str) -> String {
    format!("[relay]\ndelivery = \"{DELIVERY}\"\nreconnect_backoff_max = \"1s\"\n{extra}")
}

/// Reads every topic of `sent` back `read_committed`; fails on a missing or
/// reordered event, prints the figures, then fails on a duplicate.
fn verify_once(
    broker: &KafkaBroker,
    pg: &PgCluster,
    e: &Env,
    sent: &[Sent],
    fault: &str,
    took: Duration,
) {
    let read = Instant::now();
    let v = verify_reading(
        broker,
        sent,
        &payload_texts(pg),
        Duration::from_secs(240),
        true,
        true,
        ReadBack::ToEnd,
        e.dir.path(),
    );
    eprintln!(
        "{fault} ({DELIVERY}): {} committed, {} delivered, 0 lost, per-key order kept, {} duplicates; {:.1} s of load, read back in {:.1} s",
        sent.len(),
        v.delivered,
        v.duplicates,
        took.as_secs_f64(),
        read.elapsed().as_secs_f64()
    );
    assert_eq!(v.delivered, sent.len());
    assert_eq!(
        v.duplicates, 0,
        "{fault}: {} duplicates read back read_committed",
        v.duplicates
    );
}

/// A crash sets the slot back to the last checkpoint: at-least-once
/// repeats what was delivered since; exactly-once skips what the ledger
/// (read `read_committed`) has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postmaster_sigkill_twice_under_load_repeats_nothing() {
    let broker = shared();
    let slot = "eospgkill";
    let e = env(broker.bootstrap(), slot, &relay_config(""));
    let relay = Relay::start(&e);
    let pg = &e.pg;
    let load = Load::start(pg, slot, 4);
    // The second kill comes once the relay is back from the first, the
    // writers stop once it is back from the second (at 26 s and 40 s at the
    // latest, as before these waited on the relay).
    let mut restarted_at = None;
    for (kill, at) in [12, 26].into_iter().enumerate() {
        confirmations(pg, slot).await;
        match restarted_at {
            None => load.until(Duration::from_secs(at)).await,
            Some(wal) => {
                load.until_recovered(pg, slot, wal, Duration::from_secs(at))
                    .await
            }
        }
        let held = load.hold().await;
        assert_eq!(load.writing(), 4, "under load");
        block_in_place(|| kill_postmaster(pg));
        restarted_at = Some(block_in_place(|| lsn_now(pg)));
        drop(held);
        eprintln!(
            "postmaster SIGKILL number {} ({:.1} s into the load)",
            kill + 1,
            load.started.elapsed().as_secs_f64()
        );
    }
    let wal = restarted_at.expect("killed");
    load.until_recovered(pg, slot, wal, Duration::from_secs(40))
        .await;
    let took = load.started.elapsed();
    let sent = load.finish().await;
    block_in_place(|| {
        caught_up(pg, slot, &relay, None);
        eprintln!("relay: {}", recoveries(&relay));
        verify_once(broker, pg, &e, &sent, "postmaster SIGKILL x2", took);
    });
}

/// A dedicated broker SIGSTOPped for 10 s under four writers, with
/// `message.timeout.ms` and `socket.timeout.ms` 5 s so that records in
/// flight can fail: then the transaction is aborted once the coordinator
/// answers again and the session resumes from the ledger (4 of 6 runs);
/// otherwise the commit waiting on the broker is resumed and succeeds.
///
/// The broker's session with its controller outlasts the pause. With the
/// harness's 3 s, the controller fenced the paused broker and every
/// partition had no leader for a moment; a Kafka 4.4 coordinator completing
/// a transaction then skips the markers of leaderless partitions as if they
/// were deleted (apache/kafka KAFKA-20734), which left a transaction open on
/// the ledger partition for good in 2 of 43 runs (docs/guarantees.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_sigstop_for_10_s_under_load_repeats_nothing() {
    let slot = "eospause";
    let timeout = "[kafka.properties]\n\"message.timeout.ms\" = \"5000\"\n\
                   \"socket.timeout.ms\" = \"5000\"\n";
    let (broker, e) = block_in_place(|| {
        env_with_broker_props(
            slot,
            &format!("{}{timeout}", relay_config("")),
            &session_outlasting(Duration::from_secs(10)),
        )
    });
    let relay = Relay::start(&e);
    let pg = &e.pg;
    let load = Load::start(pg, slot, 4);
    confirmations(pg, slot).await;
    load.until(Duration::from_secs(8)).await;
    broker.pause();
    let paused = confirmed_lsn(pg, slot);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let written = lsn_now(pg);
    broker.resume();
    assert_eq!(load.writing(), 4, "under load");
    eprintln!("broker paused 10 s: slot at {paused}, WAL at {written} at the resume");
    load.until_recovered(pg, slot, written, Duration::from_secs(30))
        .await;
    let took = load.started.elapsed();
    let sent = load.finish().await;
    block_in_place(|| {
        caught_up(pg, slot, &relay, Some(&broker));
        eprintln!("relay: {}", recoveries(&relay));
        verify_once(&broker, pg, &e, &sent, "broker SIGSTOP 10 s", took);
    });
}

/// A dedicated broker SIGKILLed under four writers, busy with a backlog,
/// and started again 10 s later on the same data, with `message.timeout.ms`
/// 5 s. A kill of an idle-ish broker repeated nothing even at-least-once
/// (3 runs): the idempotent producer's retries cover it.
///
/// As in the SIGSTOP test, the broker's session with its controller
/// outlasts the 3 s stall before the kill (0 duplicates in 7 runs since;
/// at-least-once: 0, 6 and 1,749 in 3). With the harness's 3 s, the stall
/// can get it fenced, and in 1 of 2 runs in CI and once in 43 more a
/// transaction stayed open on the ledger partition: every later start
/// waited 30 s for the ledger and the relay never caught up. Most likely
/// Kafka's KAFKA-20734, as in the SIGSTOP test (not captured on this path).
///
/// The broker's controller runs in a JVM of its own, as in production. With
/// the harness's single node the kill took the controller too, and the
/// same stall came back about once in 10-40 runs with the session kept
/// (2026-12-05 and 06): a restarted node's controller fences the killed
/// incarnation only when its session runs out after the restart, while the
/// restarted broker, going by the metadata it replays, may already lead its
/// partitions and complete transactions; at the fencing they lose their
/// leader, and a completion under way then skips them (KAFKA-20734). A
/// controller that outlives the broker fences it while it is down (its
/// session, 9 s, is shorter than the 10 s down), so the restarted broker
/// leads nothing until it is registered and unfenced again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_sigkill_and_restart_under_load_repeats_nothing() {
    let slot = "eosbrokerkill";
    // Down longer than the message timeout: the records in flight fail, so
    // the relay has to resume (at-least-once from the slot).
    let timeout = "[kafka.properties]\n\"message.timeout.ms\" = \"5000\"\n\
                   \"socket.timeout.ms\" = \"5000\"\n";
    let (mut broker, e) = block_in_place(|| {
        env_with_broker_from(slot, &format!("{}{timeout}", relay_config("")), || {
            KafkaBroker::start_with_own_controller(KEEPS_LEADERS_THROUGH_A_STALL)
        })
    });
    let relay = Relay::start(&e);
    let pg = &e.pg;
    let load = Load::start(pg, slot, 4);
    confirmations(pg, slot).await;
    load.until(Duration::from_secs(8)).await;
    // Killed busy: a backlog of produce requests built up in a 3 s stall
    // is being appended when the SIGKILL comes, so some records are in
    // the log without their acknowledgement having reached the relay.
    broker.pause();
    tokio::time::sleep(Duration::from_secs(3)).await;
    broker.resume();
    std::thread::sleep(Duration::from_millis(30));
    block_in_place(|| broker.kill());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(load.writing(), 4, "under load");
    let down = Instant::now();
    block_in_place(|| broker.restart());
    let written = block_in_place(|| lsn_now(pg));
    eprintln!(
        "broker killed, restarted after 10 s (start took {:.1} s)",
        down.elapsed().as_secs_f64()
    );
    load.until_recovered(pg, slot, written, Duration::from_secs(40))
        .await;
    let took = load.started.elapsed();
    let sent = load.finish().await;
    block_in_place(|| {
        caught_up(pg, slot, &relay, Some(&broker));
        eprintln!("relay: {}", recoveries(&relay));
        verify_once(&broker, pg, &e, &sent, "broker SIGKILL + restart", took);
    });
}

/// The `n` of each small event on `topic`, in Kafka order.
fn numbers(records: &[Record]) -> Vec<u64> {
    records
        .iter()
        .filter(|r| r.header("eventType") == Some(&b"small"[..]))
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(r.value_str().unwrap()).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

/// The broker refuses one record of a database transaction (64 KB on a
/// topic whose `max.message.bytes` is 20,000, in a producer batch with its
/// neighbours): its dead-letter copy and the transaction's other 20 events
/// become visible together, each once. Each committed Kafka transaction
/// holds exactly one ledger entry, for where it ends: no entry inside a
/// database transaction means none was split, so the DLQ copy (sent in the
/// refused record's place) committed with the rest of its transaction. In
/// the data partition no commit marker lies between its events (consecutive
/// offsets). The `read_committed` read-back holds every event once, in
/// order, and one DLQ copy with the reason headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_copy_is_visible_together_with_the_rest_of_its_transaction() {
    let broker = shared();
    let slot = "eosdlq";
    let (data, dlq) = ("eosdlq.p", "eosdlq.dlq");
    let ledger_topic = format!("{slot}-ledger-{}", uuid::Uuid::new_v4().simple());
    let extra = format!(
        "{}on_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n\
         [kafka.properties]\n\"linger.ms\" = \"200\"\n\"compression.type\" = \"none\"\n",
        relay_config("")
    );
    let e = env(broker.bootstrap(), slot, &extra);
    use_ledger_topic(&e, &ledger_topic);
    block_in_place(|| broker.create_topic_with(data, 1, &[("max.message.bytes", "20000")]));
    let small = |from: u32, to: u32| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'p', 'a', 'small', jsonb_build_object('n', i) FROM generate_series({from}, {to}) i;\n"
        )
    };
    // Before, the poisoned one, after: 40 small events and one refused.
    e.pg.psql("app", &format!("BEGIN;\n{}COMMIT;", small(0, 9)));
    e.pg.psql(
        "app",
        &format!(
            "BEGIN;\n{}INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'p', 'a', 'huge', jsonb_build_object('blob', string_agg(md5(i::text), '')) \
             FROM generate_series(1, 2000) i;\n{}COMMIT;",
            small(10, 19),
            small(20, 29)
        ),
    );
    e.pg.psql("app", &format!("BEGIN;\n{}COMMIT;", small(30, 39)));
    let started = Instant::now();
    let relay = Relay::start(&e);
    let poisoned = |got: &[u64]| {
        let mut of_txn: Vec<u64> = got
            .iter()
            .copied()
            .filter(|n| (10..30).contains(n))
            .collect();
        of_txn.dedup();
        of_txn.len()
    };
    // Frozen as soon as a reader sees any of the poisoned transaction, the
    // relay must have made all of it visible, the DLQ copy included.
    let (of_txn, copies_then) = block_in_place(|| {
        wait_for(
            "a first event of the poisoned transaction",
            Duration::from_secs(120),
            || {
                poisoned(&numbers(
                    &broker.consume_to_end(data, Duration::from_secs(10)),
                )) > 0
            },
        );
        relay.signal("-STOP");
        // The commit markers of a commit under way.
        std::thread::sleep(Duration::from_secs(2));
        let of_txn = poisoned(&numbers(
            &broker.consume_to_end(data, Duration::from_secs(10)),
        ));
        let copies = broker.consume_to_end(dlq, Duration::from_secs(10)).len();
        relay.signal("-CONT");
        (of_txn, copies)
    });
    eprintln!("relay frozen at the first sight: {of_txn} of the transaction's 20 events and {copies_then} DLQ copies visible");
    assert!(
        of_txn == 20 && copies_then == 1,
        "part of a database transaction visible: {of_txn} of its 20 events, {copies_then} DLQ copies"
    );
    block_in_place(|| {
        wait_for(
            "every event and the DLQ copy",
            Duration::from_secs(120),
            || {
                numbers(&broker.consume_to_end(data, Duration::from_secs(10))).len() >= 40
                    && !broker
                        .consume_to_end(dlq, Duration::from_secs(10))
                        .is_empty()
            },
        )
    });
    let took = started.elapsed();
    let (got, copies, entries) = block_in_place(|| {
        caught_up(&e.pg, slot, &relay, None);
        (
            broker.consume_to_end(data, Duration::from_secs(30)),
            broker.consume_to_end(dlq, Duration::from_secs(30)),
            ledger_entries(broker, &ledger_topic),
        )
    });
    // Offsets in the one partition: a commit marker (or an aborted
    // record) between two events takes one, so consecutive offsets say
    // they were committed together.
    let offsets: Vec<i64> = got
        .iter()
        .filter(|r| r.header("eventType") == Some(&b"small"[..]))
        .map(|r| r.offset)
        .collect();
    let got = numbers(&got);
    let log = relay.log();
    let aborted = log.matches("Kafka transaction aborted").count();
    eprintln!(
        "dead letter ({DELIVERY}): {} small events read back ({} duplicates), {} DLQ copies, \
         {} ledger entries, {aborted} aborted transactions; {:.1} s",
        got.len(),
        got.len().saturating_sub(40),
        copies.len(),
        entries.len(),
        took.as_secs_f64()
    );
    assert_eq!(got, (0..40).collect::<Vec<u64>>(), "each once, in order");
    assert_eq!(
        copies.len(),
        1,
        "one DLQ copy; log:\n{}",
        tail_lines(&log, 60)
    );
    let copy = &copies[0];
    assert_eq!(copy.header("eventType"), Some(&b"huge"[..]));
    assert_eq!(copy.header("outboxd.original.topic"), Some(data.as_bytes()));
    assert_eq!(copy.header("outboxd.error.kind"), Some(&b"delivery"[..]));
    let error = String::from_utf8_lossy(copy.header("outboxd.error").expect("error header"));
    assert!(
        error.contains("MessageSizeTooLarge") || error.to_lowercase().contains("too large"),
        "{error}"
    );
    assert!(copy.header("outboxd.original.value_size").is_some());
    assert!(copy.header("id").is_some());
    if DELIVERY == "exactly-once" {
        let txn = &offsets[10..30];
        assert!(
            txn.windows(2).all(|w| w[1] == w[0] + 1),
            "the poisoned transaction's events are not in one run of offsets: {txn:?}"
        );
        let split: Vec<_> = entries.iter().filter(|(_, l)| l.inside.is_some()).collect();
        assert!(
            split.is_empty(),
            "committed Kafka transactions ended inside a database transaction: {split:?}; log:\n{}",
            tail_lines(&log, 60)
        );
    }
}

/// `pg_replication_slots`' failover/synced/temporary of `slot` on `pg`.
fn slot_flags(pg: &PgCluster, slot: &str) -> String {
    pg.psql(
        "app",
        &format!(
            "SELECT failover || '/' || synced || '/' || temporary FROM pg_replication_slots \
             WHERE slot_name = '{slot}'"
        ),
    )
}

/// PostgreSQL 17: the relay's slot is a failover slot, synchronised to a
/// standby; the primary stops under four writers, the standby is promoted
/// and the writers go on there. The synchronised slot is behind what the
/// relay delivered: at-least-once repeats it. Skipped before 17
/// (`OUTBOXD_TEST_PG_VERSION=17` runs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_slot_and_promote_under_load_repeat_nothing() {
    let major = pg_install().major;
    if major < 17 {
        println!("skipped: PostgreSQL {major} has no failover slots (OUTBOXD_TEST_PG_VERSION=17 runs this)");
        return;
    }
    let broker = shared();
    let slot = "eosfailover";
    let e = env(broker.bootstrap(), slot, &relay_config(""));
    let standby = block_in_place(|| start_standby(&e.pg, "standby1"));
    synchronize_standby_slot(&e.pg, "standby1");
    let url = format!(
        "postgresql://postgres:postgres@{}:{},{}:{}/app?sslmode=disable&target_session_attrs=read-write",
        e.pg.host(),
        e.pg.port(),
        standby.host(),
        standby.port()
    );
    let text = std::fs::read_to_string(&e.config).unwrap();
    let (head, rest) = text.split_once("\nslot = ").unwrap();
    let head = head.split_once("url = ").unwrap().0;
    std::fs::write(
        &e.config,
        format!("{head}url = \"{url}\"\nfailover_slot = true\nslot = {rest}"),
    )
    .unwrap();
    let mut relay = Relay::start(&e);
    block_in_place(|| {
        wait_for("a failover slot", Duration::from_secs(60), || {
            slot_flags(&e.pg, slot).starts_with("true/")
        })
    });
    let load = Load::start(&e.pg, slot, 4);
    confirmations(&e.pg, slot).await;
    block_in_place(|| {
        wait_for("the slot synchronised", Duration::from_secs(120), || {
            slot_flags(&standby, slot) == "true/true/false"
        })
    });
    load.until(Duration::from_secs(12)).await;
    let held = load.hold().await;
    assert_eq!(load.writing(), 4, "under load");
    block_in_place(|| {
        eprintln!(
            "at the stop: WAL at {}, slot confirmed {} on the primary, {} on the standby",
            lsn_now(&e.pg),
            confirmed_lsn(&e.pg, slot),
            confirmed_lsn(&standby, slot)
        );
        e.pg.stop();
        promote(&standby);
    });
    load.redirect(&standby);
    drop(held);
    load.until(Duration::from_secs(30)).await;
    let took = load.started.elapsed();
    let sent = load.finish().await;
    block_in_place(|| {
        caught_up(&standby, slot, &relay, None);
        eprintln!("relay: {}", recoveries(&relay));
        verify_once(broker, &standby, &e, &sent, "PostgreSQL 17 failover", took);
    });
    // The promoted standby's slot was behind what the relay had delivered:
    // the ledger said what to skip.
    let log = relay.log();
    let resumed = log
        .lines()
        .find(|l| l.contains("timeline changed"))
        .unwrap_or_else(|| panic!("no resume on the new timeline:\n{}", tail_lines(&log, 60)));
    eprintln!("relay: {resumed}");
    assert!(
        relay.child.try_wait().unwrap().is_none(),
        "the relay exited:\n{}",
        relay.log()
    );
}
