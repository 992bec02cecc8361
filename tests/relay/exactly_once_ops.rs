//! Issue 18: exactly-once under an operator's hand. The slot dropped under
//! the relay, the outbox table created again, a standby taking over in the
//! middle of a split database transaction: the relay either delivers every
//! event once or stops naming the way back, and the ledger, which decides
//! where an exactly-once relay starts whatever the slot says, never vouches
//! for a position past what Kafka holds.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::exactly_once::{
    active_and_standby, assert_resumed_inside, ledger_entry_inside, spawn_writers, verify_once,
    EXACTLY_ONCE,
};
use super::faults::join;
use super::slot_loss::{
    failover_without_a_failover_slot, restored_on_another_cluster, slot_dropped_under_the_relay,
};
use super::standby::readyz_until;
use super::table_watch::{
    assert_halted, change_under_the_relay_in, readyz, RelayMode, RECREATE_OUTBOX, RENAME_OUTBOX,
    UNPUBLISH_OUTBOX,
};
use crate::harness::events::{
    aggregates, ledger_entries, payload_texts, verify_reading, write, Copies, ReadBack,
};
use crate::harness::kafka::{shared, KafkaBroker};
use crate::harness::outboxd::tail;
use crate::harness::relay::{
    backfill_from, confirmed_lsn, env, lsn_now, named_since, relayed_then_stopped, slot_active,
    use_ledger_topic, Env, Relay,
};
use crate::harness::wait::wait_for;

/// The slot dropped under an exactly-once relay: it stops naming the gap,
/// as at-least-once does, and the way back (backfill, `--accept-gap`)
/// brings every event. The backfill re-sends its window on purpose, marked
/// by its header; what the relay itself wrote is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_dropped_under_an_exactly_once_relay_stops_it_and_what_it_wrote_is_there_once() {
    let (_e, sent, v) =
        slot_dropped_under_the_relay("eos_slotloss", EXACTLY_ONCE, ReadBack::ToEnd).await;
    let broker = shared();
    let topics: HashSet<&str> = sent.iter().map(|s| s.topic.as_str()).collect();
    let copies = Copies::read(broker, topics);
    let repeated = copies.repeated();
    let backfilled = copies.backfilled.len();
    eprintln!(
        "exactly-once, slot dropped: {} committed, {} delivered, {} relayed by the relay \
         ({repeated} more than once), {backfilled} backfilled",
        sent.len(),
        v.delivered,
        copies.relayed.len()
    );
    assert!(backfilled > 0, "the backfill sent nothing");
    assert_eq!(repeated, 0, "the relay's own records repeated");
}

/// The outbox table created again under an exactly-once relay: it halts
/// before the lost events, as at-least-once does, and its ledger vouches
/// for none of them. Had the ledger passed them, a restart after the fix
/// would skip those events whatever the slot says. The ledger stays at or
/// below the position the halt names, as the slot does: a keepalive
/// carries the walsender past the change's unpublished WAL, and an idle
/// relay's ledger-only move stops at the table watch's ceiling (before
/// that cap, CI saw the ledger at the change's end, past the halt's
/// position).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_outbox_table_halts_an_exactly_once_relay_with_its_ledger_before_the_change() {
    halts_with_its_ledger_before_the_change(
        "eos_recreated",
        RECREATE_OUTBOX,
        &["was dropped or renamed", "was replaced"],
    )
    .await;
}

/// The outbox table renamed with a new one in its place: as re-created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_outbox_table_halts_an_exactly_once_relay_with_its_ledger_before_the_change() {
    halts_with_its_ledger_before_the_change(
        "eos_renamed",
        RENAME_OUTBOX,
        &["was dropped or renamed", "was replaced"],
    )
    .await;
}

/// The outbox table taken out of the publication: its inserts are no
/// longer in the stream, and the walsender's keepalives carry the stream
/// past them, so only the table watch's ceiling keeps the ledger before
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpublished_outbox_table_halts_an_exactly_once_relay_with_its_ledger_before_the_change()
{
    halts_with_its_ledger_before_the_change(
        "eos_unpublished",
        UNPUBLISH_OUTBOX,
        &["left the publication"],
    )
    .await;
}

/// Runs `change` under an exactly-once relay and checks that it halted
/// naming one of `changes`, and that no ledger entry passes the position
/// the halt names, which is before the change.
async fn halts_with_its_ledger_before_the_change(slot: &str, change: &str, changes: &[&str]) {
    let ledger_topic = format!("{slot}-ledger-{}", uuid::Uuid::new_v4().simple());
    let mode = RelayMode {
        extra: EXACTLY_ONCE,
        ledger_topic: Some(&ledger_topic),
        read: ReadBack::ToEnd,
    };
    let h = change_under_the_relay_in(slot, &mode, change).await;
    assert_halted(&h, changes, &["ADD TABLE \"public\".\"outbox\""]);
    let entries = tokio::task::block_in_place(|| ledger_entries(shared(), &ledger_topic));
    assert!(
        !entries.is_empty(),
        "no ledger entry; log:\n{}",
        h.relay.log()
    );
    let last = &entries.last().unwrap().1;
    eprintln!(
        "exactly-once, {slot}: halted; {} ledger entries, the last at {} (change at {})",
        entries.len(),
        last.confirmed_lsn,
        h.changed_at
    );
    let (_, reason) = readyz(h.port);
    let kept: outboxd::Lsn = reason
        .split("confirmed nothing past ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| c == '.' || c.is_whitespace()).next())
        .and_then(|lsn| lsn.parse().ok())
        .unwrap_or_else(|| panic!("no position in the halt: {reason}"));
    assert!(kept <= h.changed_at, "{reason}");
    for (_, entry) in &entries {
        assert!(
            entry.confirmed_lsn <= kept,
            "the ledger vouches for {} past the halt's {kept} (change at {}); log:\n{}",
            entry.confirmed_lsn,
            h.changed_at,
            h.relay.log()
        );
    }
}

/// A failover to a standby without a failover slot (PostgreSQL before 17,
/// or none configured) while Kafka is down: an exactly-once relay stops
/// naming the gap, as at-least-once does, the restart refuses, and the way
/// back (backfill, `--accept-gap`) brings every event; what the relay wrote
/// itself is there once, before the failover and after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_without_a_failover_slot_stops_an_exactly_once_relay_and_what_it_wrote_is_there_once(
) {
    let repeated = failover_without_a_failover_slot(
        "eos_failover15",
        "delivery = \"exactly-once\"\n",
        ReadBack::ToEnd,
    )
    .await;
    assert_eq!(repeated, 0, "the relay's own records repeated");
}

/// A database transaction split over Kafka transactions is in flight when
/// the active is killed: the standby takes over from the ledger's entry
/// inside it and repeats nothing, while other writers go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_inside_a_split_database_transaction_and_repeats_nothing() {
    const ROWS: usize = 30_000;
    const PER_KAFKA_TRANSACTION: usize = 2_000;
    let broker = shared();
    let slot = "eos_split_takeover";
    let ledger_topic = format!("{slot}-ledger-{}", uuid::Uuid::new_v4().simple());
    let e = env(
        broker.bootstrap(),
        slot,
        &format!(
            "{EXACTLY_ONCE}transaction_max_events = {PER_KAFKA_TRANSACTION}\n\
             max_in_flight_events = {PER_KAFKA_TRANSACTION}\n"
        ),
    );
    use_ledger_topic(&e, &ledger_topic);
    let (mut active, standby, port_b) = active_and_standby(&e);

    let url = e.pg.url("postgres", Some("postgres"), "app");
    let big = tokio::spawn(async move {
        let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        write(&mut client, slot, &aggregates(40), ROWS, &[ROWS], 0).await
    });
    let mut writers = spawn_writers(&e, slot, 3_000, 2);
    writers.push(big);
    let reached = ledger_entry_inside(broker, &ledger_topic, ROWS / 3, &active);
    // Frozen inside the transaction (two thirds of it, about 0.7 s of
    // relaying, were still ahead), then the ledger read to its end: what
    // the frozen relay committed last is what the standby resumes from,
    // however fast the host, so the kill lands where the test says.
    active.signal("-STOP");
    let last = tokio::task::block_in_place(|| ledger_entries(broker, &ledger_topic))
        .pop()
        .map(|(_, entry)| entry);
    let inside = match last.as_ref().and_then(|entry| entry.inside.as_ref()) {
        Some(inside) if inside.commit_lsn == reached.commit_lsn => *inside,
        _ => panic!(
            "frozen past the split transaction (reached {reached:?}): the ledger's last entry is \
             {last:?}"
        ),
    };
    active.signal("-KILL");
    let killed = Instant::now();
    assert!(active.wait(Duration::from_secs(10)).is_some());
    let after = tokio::task::block_in_place(|| {
        readyz_until(port_b, Duration::from_secs(60), |s, _| s == 200)
    });
    let takeover = killed.elapsed();
    assert_eq!(after.map(|r| r.0), Some(200), "{}", standby.log());
    assert_resumed_inside(&standby, &inside);
    let sent = join(writers).await;
    verify_once(broker, &e, sent).await;
    eprintln!(
        "split transaction at a takeover: {ROWS} rows, {} of them committed to Kafka at the kill; \
         takeover in {takeover:?}",
        inside.events
    );
    let log = standby.log();
    assert!(log.contains("Kafka transactions initialised"), "{log}");
}

/// The instance a new one fences may have committed a last transaction
/// between the new one's read of the ledger and its fencing. The new one
/// streams into its first transaction while it reads the ledger again, and
/// commits nothing until that read is done: the ledger moved, so it aborts
/// that transaction and starts again from the newer entry.
///
/// The race is made certain here: another transactional writer holds an
/// entry for this relay open on the ledger topic while the relay starts
/// (so its gate's `read_committed` read stops before it), and commits it
/// once the relay has initialised its transactions. The entry vouches for
/// events the relay never sent (as the fenced instance's last transaction
/// would have), written with aggregates of their own: if the move were
/// missed, the relay would commit them and the read-back would fail on
/// events it was not told about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_entry_committed_while_taking_over_restarts_the_session_from_it() {
    use rdkafka::producer::Producer;

    let broker = shared();
    let slot = "eos_moved";
    let (e, ledger_topic, mut client) = exactly_once_env(broker, slot).await;
    let aggs = aggregates(10);

    let mut sent = relayed_then_stopped(&e, &mut client, slot, &aggs, 200).await;
    let pg = &e.pg;
    let last = ledger_entries(broker, &ledger_topic)
        .pop()
        .expect("a ledger entry")
        .1;

    // Committed while the relay is stopped: the entry below vouches for
    // them, so they must never reach Kafka.
    let vouched_aggs: Vec<String> = (0..4).map(|i| format!("vouched-{i}")).collect();
    write(&mut client, slot, &vouched_aggs, 100, &[1, 10], 0).await;
    let vouched_to = lsn_now(pg);
    let moved = outboxd::progress::ledger::LedgerEntry {
        confirmed_lsn: vouched_to,
        inside: None,
        ..last.clone()
    };
    assert!(moved.confirmed_lsn > last.confirmed_lsn);
    let (key, value) = outboxd::sink::ledger_record(&moved);
    let (id, topic) = (format!("{ledger_topic}-other"), ledger_topic.clone());
    let other = tokio::task::spawn_blocking(move || {
        broker.open_transaction(&id, &topic, key.as_bytes(), &value)
    })
    .await
    .unwrap();

    let relay = Relay::start(&e);
    tokio::task::block_in_place(|| {
        wait_for("transactions initialised", Duration::from_secs(60), || {
            relay.log().contains("Kafka transactions initialised")
        });
        // The first transaction fills meanwhile.
        std::thread::sleep(Duration::from_secs(1));
        other.commit_transaction(Duration::from_secs(30)).unwrap();
        wait_for(
            "the session to see the move",
            Duration::from_secs(60),
            || relay.log().contains("the position ledger moved"),
        );
    });
    sent.extend(write(&mut client, slot, &aggs, 200, &[1, 10], 0).await);
    // Fails on any of the vouched events ("never committed" among `sent`),
    // on a duplicate, and on a reordered or missing one.
    verify_once(broker, &e, sent).await;
    let log = relay.log();
    assert!(log.contains("Kafka transaction aborted"), "{log}");
}

/// What operators do to look at the next events, on an exactly-once slot
/// after a `kill -9` (the slot may lag the ledger): `outboxd tail` prints
/// them and moves nothing, and the restarted relay delivers every event
/// once, the ones tail printed included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_on_an_exactly_once_slot_moves_nothing_and_the_relay_delivers_what_it_printed_once() {
    let broker = shared();
    let slot = "eos_tail";
    let (e, ledger_topic, mut client) = exactly_once_env(broker, slot).await;
    let aggs = aggregates(4);
    let pg = &e.pg;

    let mut relay = Relay::start(&e);
    let mut sent = write(&mut client, slot, &aggs, 200, &[1, 10], 0).await;
    let end = lsn_now(pg);
    tokio::task::block_in_place(|| {
        wait_for("the ledger at the end", Duration::from_secs(120), || {
            ledger_entries(broker, &ledger_topic)
                .last()
                .is_some_and(|(_, entry)| entry.confirmed_lsn >= end)
        })
    });
    relay.signal("-KILL");
    tokio::task::block_in_place(|| {
        assert!(relay.wait(Duration::from_secs(10)).is_some());
        wait_for("the slot released", Duration::from_secs(30), || {
            !slot_active(pg, slot)
        });
    });

    let waiting = write(&mut client, slot, &aggs, 20, &[1, 10], 0).await;
    let before = confirmed_lsn(pg, slot);
    let peek = tokio::task::block_in_place(|| {
        tail(&e.config, &["--limit", "20"], Duration::from_secs(60))
    });
    assert!(peek.success, "{}", peek.stderr);
    assert_eq!(peek.events.len(), 20, "{}", peek.stderr);
    assert_eq!(confirmed_lsn(pg, slot), before, "tail moved the slot");
    sent.extend(waiting);
    // From the slot, which may lag the ledger: committed events, relayed
    // already or not.
    let committed: HashSet<&str> = sent.iter().map(|s| s.id.as_str()).collect();
    for ev in &peek.events {
        let id = ev["row"]["id"].as_str().unwrap_or_default();
        assert!(committed.contains(id), "tail printed {ev}");
    }

    let _relay = Relay::start(&e);
    sent.extend(write(&mut client, slot, &aggs, 50, &[1, 10], 0).await);
    verify_once(broker, &e, sent).await;
}

/// A database restored on another cluster under the same database and slot
/// names: an exactly-once relay stops naming it, as at-least-once does, and
/// `--accept-gap` relays the new cluster's events once, none of them taken
/// for ones the old cluster's ledger entry vouches for (both clusters'
/// positions are in the same range).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cluster_under_the_same_names_stops_an_exactly_once_relay_and_accept_gap_relays_once(
) {
    let v = restored_on_another_cluster(
        "eos_restored",
        "delivery = \"exactly-once\"\n",
        ReadBack::ToEnd,
    )
    .await;
    assert_eq!(v.duplicates, 0);
}

/// The slot advanced by hand past an exactly-once relay's ledger (a DBA
/// "unsticking" a slot): exactly-once never confirms the slot past its last
/// committed ledger entry, so the events in between are not in Kafka. The
/// relay stops naming the gap and the way back (before, it logged that the
/// ledger lags by up to an interval, an at-least-once reading, and resumed
/// from the slot without them); the backfill it names, then
/// `--accept-gap`, bring every event, and what the relay wrote is there
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_advanced_past_an_exactly_once_ledger_stops_the_relay_and_backfill_recovers() {
    let broker = shared();
    let slot = "eos_advanced";
    let (e, _, mut client) = exactly_once_env(broker, slot).await;
    let aggs = aggregates(4);
    let pg = &e.pg;
    let mut sent = relayed_then_stopped(&e, &mut client, slot, &aggs, 100).await;

    // Committed while the relay is stopped, then skipped by hand.
    let skipped = write(&mut client, slot, &aggs, 40, &[1, 10], 0).await;
    pg.psql(
        "app",
        &format!("SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"),
    );
    let mut relay = Relay::start(&e);
    // The gap is confirmed before the first commit, which these make due.
    let held = write(&mut client, slot, &aggs, 20, &[1, 10], 0).await;
    let status = tokio::task::block_in_place(|| relay.wait(Duration::from_secs(90)));
    let log = relay.log();
    let status = status.unwrap_or_else(|| panic!("the relay kept running; its log:\n{log}"));
    assert!(!status.success(), "exit {status:?}; log:\n{log}");
    for needle in [
        "the slot is confirmed past the position ledger",
        "outboxd backfill --since",
        "outboxd run --accept-gap",
    ] {
        assert!(log.contains(needle), "{needle:?} not in the log:\n{log}");
    }

    // The way back the error names.
    backfill_from(pg, &e.config, &named_since(&log));
    let accepted = Relay::start_with(&e, &[], &["--accept-gap"]);
    let later = write(&mut client, slot, &aggs, 30, &[1, 10], 0).await;
    sent.extend(skipped.iter().cloned());
    sent.extend(held.iter().cloned());
    sent.extend(later);
    let texts = payload_texts(pg);
    let logs = e.dir.path().to_path_buf();
    let v = tokio::task::block_in_place(|| {
        verify_reading(
            broker,
            &sent,
            &texts,
            Duration::from_secs(120),
            true,
            true,
            ReadBack::ToEnd,
            &logs,
        )
    });
    assert!(
        accepted.log().contains("accepting a gap (--accept-gap)"),
        "{}",
        accepted.log()
    );
    let topics: HashSet<&str> = sent.iter().map(|s| s.topic.as_str()).collect();
    let copies = Copies::read(broker, topics);
    for s in &skipped {
        assert!(copies.backfilled.contains(&s.id), "{} not backfilled", s.id);
        assert!(!copies.relayed.contains_key(&s.id), "{} relayed", s.id);
    }
    eprintln!(
        "slot advanced past the exactly-once ledger: {} committed, {} delivered, {} skipped and \
         backfilled",
        sent.len(),
        v.delivered,
        skipped.len()
    );
    assert_eq!(copies.repeated(), 0, "the relay's own records repeated");
}

/// The first step of the recovery from a ledger read held by an open
/// transaction (docs/operations.md): another producer's transaction left
/// open on the ledger partition, with a 10-minute timeout, holds every
/// start of the relay (each waits 30 s for the ledger, aborts and is
/// retried); `kafka-transactions.sh describe-producers` names where it
/// starts and `kafka-transactions.sh abort` ends it, and the relay then
/// delivers what waited, each event once. A transaction Kafka left open for
/// good (KAFKA-20734) looks the same to the relay and to both commands;
/// when it is the relay's own last entry, the rest of that recovery is the
/// slot-past-the-ledger stop tested above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_held_open_on_the_ledger_holds_the_relay_until_aborted_by_hand() {
    let broker = shared();
    let slot = "eos_held";
    let (e, ledger_topic, mut client) = exactly_once_env(broker, slot).await;
    let aggs = aggregates(4);
    let mut sent = relayed_then_stopped(&e, &mut client, slot, &aggs, 100).await;

    let holder = format!("{slot}-holder-{}", uuid::Uuid::new_v4().simple());
    let _held = tokio::task::block_in_place(|| {
        broker.open_transaction_for(
            &holder,
            &ledger_topic,
            b"holder",
            b"{}",
            Duration::from_secs(600),
        )
    });
    let relay = Relay::start(&e);
    let waiting = write(&mut client, slot, &aggs, 50, &[1, 10], 0).await;
    let start = tokio::task::block_in_place(|| {
        wait_for(
            "a start held by the ledger read",
            Duration::from_secs(90),
            || relay.log().contains("not read to the end within 30s"),
        );
        open_transaction_start(broker, &ledger_topic)
    });
    let start = start.expect("describe-producers shows no open transaction");
    let before = confirmed_lsn(&e.pg, slot);
    let end = lsn_now(&e.pg);
    assert!(
        before < end,
        "the slot was confirmed past events written while the ledger was held"
    );

    let offset = start.to_string();
    tokio::task::block_in_place(|| {
        broker.transactions_command(&[
            "abort",
            "--topic",
            &ledger_topic,
            "--partition",
            "0",
            "--start-offset",
            &offset,
        ]);
        assert_eq!(open_transaction_start(broker, &ledger_topic), None);
    });
    sent.extend(waiting);
    sent.extend(write(&mut client, slot, &aggs, 50, &[1, 10], 0).await);
    eprintln!(
        "ledger held open at offset {start}: {} starts held, then aborted by hand",
        relay
            .log()
            .matches("not read to the end within 30s")
            .count()
    );
    verify_once(broker, &e, sent).await;
}

/// An exactly-once relay's environment on `slot` with a ledger topic of its
/// own (so its entries are the only ones there), and a client of `app`.
async fn exactly_once_env(
    broker: &KafkaBroker,
    slot: &str,
) -> (Env, String, tokio_postgres::Client) {
    let ledger_topic = format!("{slot}-ledger-{}", uuid::Uuid::new_v4().simple());
    let e = env(broker.bootstrap(), slot, EXACTLY_ONCE);
    use_ledger_topic(&e, &ledger_topic);
    let client = e.pg.client("app").await;
    (e, ledger_topic, client)
}

/// The first offset of the transaction open on `topic`'s partition 0, from
/// `kafka-transactions.sh describe-producers` (its last column,
/// CurrentTransactionStartOffset, is -1 or "None" for a producer without one).
fn open_transaction_start(broker: &KafkaBroker, topic: &str) -> Option<i64> {
    let out =
        broker.transactions_command(&["describe-producers", "--topic", topic, "--partition", "0"]);
    out.lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().last()?.parse::<i64>().ok())
        .find(|&offset| offset >= 0)
}
