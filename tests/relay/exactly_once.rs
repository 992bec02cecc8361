//! Issue 18: `relay.delivery = "exactly-once"`. A `read_committed` consumer
//! sees every committed event once, in per-key commit order, also across
//! `kill -9`; the position ledger's entries are inside the transactions.

use std::time::{Duration, Instant};

use outboxd::progress::ledger::{InsideTransaction, LedgerEntry};

use super::faults::join;
use super::standby::{readyz_until, start_on_port};
use crate::harness::events::{
    aggregates, ledger_entries, payload_texts, verify_reading, write, ReadBack, Sent,
};
use crate::harness::http::free_port;
use crate::harness::kafka::shared;
use crate::harness::relay::{confirmed_lsn, env, lsn_now, use_ledger_topic, Env, Relay};
use crate::harness::wait::wait_for;
use crate::harness::writers::Writers;

pub(super) const EXACTLY_ONCE: &str = "[relay]\ndelivery = \"exactly-once\"\n";

/// Starts `n` events from `writers` writers in the background, in
/// transactions of mixed sizes.
pub(super) fn spawn_writers(
    e: &Env,
    prefix: &str,
    n: usize,
    writers: usize,
) -> Vec<tokio::task::JoinHandle<Vec<Sent>>> {
    let aggs = aggregates(40);
    let shapes = [
        vec![1, 10, 100],
        vec![50, 1, 300],
        vec![1, 1, 5],
        vec![20, 2],
    ];
    (0..writers)
        .map(|w| {
            let aggs = aggs.clone();
            let url = e.pg.url("postgres", Some("postgres"), "app");
            let prefix = prefix.to_string();
            let sizes = shapes[w % shapes.len()].clone();
            tokio::spawn(async move {
                let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                write(&mut client, &prefix, &aggs, n / writers, &sizes, 0).await
            })
        })
        .collect()
}

/// The shapes of [`spawn_writers`]' four writers, for [`Writers`] that go
/// on until stopped.
fn four_writers(e: &Env, prefix: &str) -> Writers {
    Writers::start(
        e,
        prefix,
        &[&[1, 10, 100], &[50, 1, 300], &[1, 1, 5], &[20, 2]],
        40,
    )
}

/// Reads every topic back `read_committed` and fails on a missing,
/// duplicated or reordered event.
pub(super) async fn verify_once(
    broker: &'static crate::harness::kafka::KafkaBroker,
    e: &Env,
    sent: Vec<Sent>,
) {
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(&e.pg);
    let v = tokio::task::spawn_blocking(move || {
        verify_reading(
            broker,
            &sent,
            &texts,
            Duration::from_secs(240),
            false,
            true,
            ReadBack::ToEnd,
            &logs,
        )
    })
    .await
    .unwrap();
    assert_eq!(v.duplicates, 0);
    eprintln!("exactly-once: {} delivered, 0 duplicates", v.delivered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_once_in_commit_order_with_the_ledger_inside_the_transactions() {
    let broker = shared();
    let slot = "eos_e2e";
    let ledger_topic = format!("{slot}-ledger-{}", uuid::Uuid::new_v4().simple());
    let e = env(broker.bootstrap(), slot, EXACTLY_ONCE);
    use_ledger_topic(&e, &ledger_topic);
    let relay = Relay::start(&e);
    let sent = join(spawn_writers(&e, slot, 6_000, 2)).await;
    verify_once(broker, &e, sent).await;
    // The ledger reached the end of what was written, read read_committed:
    // its entries are in committed transactions.
    let pg = &e.pg;
    let end = lsn_now(pg);
    tokio::task::block_in_place(|| {
        wait_for(
            "the slot confirmed to the end",
            Duration::from_secs(60),
            || confirmed_lsn(pg, slot) >= end,
        );
        let entries = ledger_entries(broker, &ledger_topic);
        let last = entries.last().expect("a ledger entry").1.clone();
        assert!(
            last.confirmed_lsn >= confirmed_lsn(pg, slot),
            "the ledger ({}) is never behind the slot ({})",
            last.confirmed_lsn,
            confirmed_lsn(pg, slot)
        );
    });
    let log = relay.log();
    assert!(log.contains("Kafka transactions initialised"), "{log}");
}

/// A graceful stop under load commits what was read until the stream
/// drained, exits 0, and the next start repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_zero_and_repeats_nothing() {
    let broker = shared();
    let slot = "eos_term";
    let e = env(
        broker.bootstrap(),
        slot,
        &format!("{EXACTLY_ONCE}shutdown_timeout = \"20s\"\n"),
    );
    let mut relay = Relay::start(&e);
    let pg = &e.pg;
    let start = confirmed_lsn(pg, slot);
    let writers = four_writers(&e, slot);
    tokio::task::block_in_place(|| {
        wait_for("first confirmations", Duration::from_secs(120), || {
            confirmed_lsn(pg, slot) > start
        })
    });
    assert_eq!(writers.writing(), 4, "under load");
    relay.signal("-TERM");
    let status = tokio::task::block_in_place(|| relay.wait(Duration::from_secs(25)));
    let status = status.unwrap_or_else(|| panic!("no exit in time; log:\n{}", relay.log()));
    assert!(status.success(), "exit {status:?}; log:\n{}", relay.log());
    let _relay = Relay::start(&e);
    let sent = writers.stop().await;
    verify_once(broker, &e, sent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_twice_under_four_writers_repeats_nothing() {
    let broker = shared();
    let slot = "eos_kill9";
    let e = env(broker.bootstrap(), slot, EXACTLY_ONCE);
    let mut relay = Relay::start(&e);
    let pg = &e.pg;
    let start = confirmed_lsn(pg, slot);
    let writers = four_writers(&e, slot);
    for kill in 0..2 {
        let before = confirmed_lsn(pg, slot).max(start);
        // Killed as soon as this relay confirmed something, not after a
        // fixed time: on a fast host the writers were done 2 s later.
        tokio::task::block_in_place(|| {
            wait_for("confirmations", Duration::from_secs(120), || {
                confirmed_lsn(pg, slot) > before
            });
        });
        // Under load: the writers go on until told to stop.
        let writing = writers.writing();
        assert_eq!(writing, 4, "kill {kill}: a writer failed");
        relay.signal("-KILL");
        assert!(relay.wait(Duration::from_secs(10)).is_some());
        eprintln!("kill -9 number {}, {writing} writers writing", kill + 1);
        relay = Relay::start(&e);
    }
    let sent = writers.stop().await;
    verify_once(broker, &e, sent).await;
    drop(relay);
}

/// Waits (up to 300 s) until a ledger entry inside a split database
/// transaction has at least `events` of it committed, and returns it.
/// It follows the ledger with one consumer, which sees an entry within a
/// poll of its commit: the relay takes a whole 30,000-row transaction
/// through Kafka in about a second, less than reading the topic again
/// from the start takes. On a timeout the panic shows the newest entries
/// and the tail of `relay`'s log.
pub(super) fn ledger_entry_inside(
    broker: &crate::harness::kafka::KafkaBroker,
    ledger_topic: &str,
    events: usize,
    relay: &Relay,
) -> InsideTransaction {
    const TIMEOUT: Duration = Duration::from_secs(300);
    tokio::task::block_in_place(|| {
        let start = Instant::now();
        let tail = broker.tail(ledger_topic, Duration::from_secs(60));
        let (mut seen, mut newest, mut newest_inside) = (0, None, None);
        loop {
            if let Some(value) = tail.next(Duration::from_millis(100)).and_then(|r| r.value) {
                let entry = LedgerEntry::from_json(&value)
                    .unwrap_or_else(|e| panic!("a ledger record: {e}"));
                seen += 1;
                if let Some(inside) = entry.inside {
                    if inside.events as usize >= events {
                        return inside;
                    }
                    newest_inside = Some(inside);
                }
                newest = Some(entry);
            }
            if start.elapsed() > TIMEOUT {
                let log = relay.log();
                let tail: Vec<&str> = log.lines().rev().take(80).collect();
                panic!(
                    "timed out after {TIMEOUT:?} waiting for a ledger entry {events} events \
                     inside the split transaction; {seen} entries, the newest: {newest:?}; \
                     newest inside: {newest_inside:?}; the relay's log, newest line first:\n{}",
                    tail.join("\n")
                );
            }
        }
    })
}

/// After a kill meant to land inside the split transaction `inside`: the
/// relay that carries on (`resumed`) says, within 60 s, that it resumes
/// inside that transaction, so the test tests a resume in its middle (a
/// kill after its end would pass the rest of the test too).
pub(super) fn assert_resumed_inside(resumed: &Relay, inside: &InsideTransaction) {
    let at = format!("commit_lsn={}", inside.commit_lsn);
    let said = |log: &str| {
        log.lines()
            .any(|l| l.contains("resuming inside a database transaction") && l.contains(&at))
    };
    tokio::task::block_in_place(|| {
        wait_for(
            "the resume inside the transaction",
            Duration::from_secs(60),
            || said(&resumed.log()),
        )
    });
}

/// A database transaction larger than `transaction_max_events` is split
/// over Kafka transactions; a `kill -9` in its middle resumes inside it,
/// from the ledger's entry (`inside`), without a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_inside_a_split_database_transaction_repeats_nothing() {
    // The 1,000,000 rows take minutes in a debug build:
    // OUTBOXD_TEST_SPLIT_ROWS=1000000 runs them.
    let rows: usize = std::env::var("OUTBOXD_TEST_SPLIT_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    const PER_KAFKA_TRANSACTION: usize = 10_000;
    // Far below what holding the transaction would take (about 1.6 KiB per
    // event in flight): only the window is held.
    const PEAK_RSS_BOUND_KIB: u64 = 128 * 1024;
    let broker = shared();
    let slot = "eos_split";
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
    // No per-event trail: a line per event is too much at a million.
    let quiet = [("OUTBOXD_LOG", "info")];
    let mut relay = Relay::start_with_env(&e, &quiet);
    let url = e.pg.url("postgres", Some("postgres"), "app");
    let writer = tokio::spawn(async move {
        let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let aggs = aggregates(40);
        write(&mut client, slot, &aggs, rows, &[rows], 0).await
    });
    // Killed once the ledger holds a position in the middle of the
    // transaction.
    let inside = ledger_entry_inside(broker, &ledger_topic, rows / 2, &relay);
    let peak_before = relay.peak_rss_kib();
    relay.signal("-KILL");
    assert!(relay.wait(Duration::from_secs(10)).is_some());
    let relay = Relay::start_with_env(&e, &quiet);
    assert_resumed_inside(&relay, &inside);
    let sent = writer.await.unwrap();
    verify_once(broker, &e, sent).await;
    let peak_after = relay.peak_rss_kib();
    eprintln!(
        "split transaction: {rows} rows, killed with {} of them committed to Kafka; \
         peak RSS {peak_before} KiB before the kill, {peak_after} KiB after the restart",
        inside.events
    );
    for peak in [peak_before, peak_after] {
        assert!(
            peak > 0 && peak <= PEAK_RSS_BOUND_KIB,
            "peak RSS {peak} KiB"
        );
    }
}

/// An active relay, ready, and its standby, standing by (each with its
/// metrics port; the standby's is returned).
pub(super) fn active_and_standby(e: &Env) -> (Relay, Relay, u16) {
    let (port_a, port_b) = (free_port(), free_port());
    let active = start_on_port(e, port_a);
    let ready = tokio::task::block_in_place(|| {
        readyz_until(port_a, Duration::from_secs(60), |s, _| s == 200)
    });
    assert_eq!(ready.map(|r| r.0), Some(200), "{}", active.log());
    let standby = start_on_port(e, port_b);
    let waiting = tokio::task::block_in_place(|| {
        readyz_until(port_b, Duration::from_secs(30), |_, body| {
            body.starts_with("standby")
        })
    });
    assert!(waiting.is_some_and(|(s, _)| s == 503), "{}", standby.log());
    (active, standby, port_b)
}

/// An active relay and its standby (each with its metrics port; the
/// standby's is returned), under 4 writers that go on until stopped, once
/// the active confirmed a first position.
fn active_and_standby_under_load(e: &Env, slot: &str) -> (Relay, Relay, u16, Writers) {
    let (active, standby, port_b) = active_and_standby(e);
    let pg = &e.pg;
    let start = confirmed_lsn(pg, slot);
    let writers = four_writers(e, slot);
    tokio::task::block_in_place(|| {
        wait_for("first confirmations", Duration::from_secs(120), || {
            confirmed_lsn(pg, slot) > start
        });
    });
    (active, standby, port_b, writers)
}

/// The hot standby of an exactly-once relay shares its transactional id:
/// taking over after a `kill -9` of the active fences it, within 5 s, and
/// repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_a_killed_active_within_5s_and_repeats_nothing() {
    let broker = shared();
    let slot = "eos_standby";
    let e = env(broker.bootstrap(), slot, EXACTLY_ONCE);
    let (mut active, standby, port_b, writers) = active_and_standby_under_load(&e, slot);
    tokio::task::block_in_place(|| std::thread::sleep(Duration::from_secs(1)));
    assert_eq!(writers.writing(), 4, "under load");
    active.signal("-KILL");
    let killed = Instant::now();
    assert!(active.wait(Duration::from_secs(10)).is_some());
    let after = tokio::task::block_in_place(|| {
        readyz_until(port_b, Duration::from_secs(60), |s, _| s == 200)
    });
    let takeover = killed.elapsed();
    assert_eq!(after.map(|r| r.0), Some(200), "{}", standby.log());
    let sent = writers.stop().await;
    verify_once(broker, &e, sent).await;
    eprintln!("exactly-once takeover after kill -9: {takeover:?}");
    assert!(
        takeover <= Duration::from_secs(5),
        "takeover took {takeover:?}"
    );
}

/// A zombie: the active is paused (SIGSTOP) until the walsender gave up on
/// it (`wal_sender_timeout` 4 s) and the standby took over, then resumed.
/// Nothing it had in flight becomes visible, it stops writing, and it says
/// it was fenced (or, had it nothing to commit, stands by).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_active_woken_after_the_takeover_is_fenced_and_repeats_nothing() {
    let broker = shared();
    let slot = "eos_zombie";
    let e = env(broker.bootstrap(), slot, EXACTLY_ONCE);
    e.pg.psql("app", "ALTER SYSTEM SET wal_sender_timeout = '4s'");
    e.pg.psql("app", "SELECT pg_reload_conf()");
    let (mut zombie, standby, port_b, writers) = active_and_standby_under_load(&e, slot);
    zombie.signal("-STOP");
    let took_over = tokio::task::block_in_place(|| {
        let over = readyz_until(port_b, Duration::from_secs(60), |s, _| s == 200);
        std::thread::sleep(Duration::from_secs(2));
        over
    });
    assert_eq!(took_over.map(|r| r.0), Some(200), "{}", standby.log());
    zombie.signal("-CONT");
    // It either commits what it held, is told it was fenced and exits, or
    // finds its stream gone first and stands by.
    let exit = tokio::task::block_in_place(|| zombie.wait(Duration::from_secs(30)));
    let log = zombie.log();
    match exit {
        Some(status) => {
            assert!(!status.success(), "a fenced relay exits non-zero");
            assert!(log.contains("fenced"), "says it was fenced:\n{log}");
        }
        None => assert!(
            log.contains("standing by"),
            "neither fenced nor standing by:\n{log}"
        ),
    }
    let sent = writers.stop().await;
    verify_once(broker, &e, sent).await;
    eprintln!(
        "zombie: {}",
        match exit {
            Some(status) => format!("fenced, exited with {status}"),
            None => "stood by".into(),
        }
    );
}
