//! Issue 38 §4 and §6: a producer stuck while the cluster is healthy. The
//! broker sits behind a proxy it advertises; the proxy freezes every
//! connection open so far (nothing passes, no RST, no FIN) while new ones
//! pass, so the relay's producer hangs on its connections while fresh
//! metadata, and a fresh producer, reach the broker at once. The broker's
//! connections to itself (transaction markers) bypass the proxy: the
//! cluster stays healthy. That is what
//! librdkafka 2.12.1 does on its own after a broker was fenced ("new
//! leader -1 not found in cache"), made deterministic.
//!
//! Without the watchdog the relay waits for `message.timeout.ms` (30 s, at
//! least-once) or the commit's `transaction.timeout.ms` (exactly-once)
//! before it lets go; with `kafka.stuck_after` it replaces the producer
//! once the oldest record it holds (or the commit under way) is that old.
//! Each test gives recovery twice the message timeout, so the code without
//! the watchdog fails by the time it took, not by a timeout.
//!
//! Each test freezes twice, on one broker and one relay. The first time a
//! few events fit in the producer's queue, so the relay waits in its
//! loop's `select!`. The second time more are written than the queue holds
//! ([`QUEUE`], below the window): the relay waits for room in it, outside
//! the loop (at-least-once for a report, exactly-once for the flush before
//! the commit that makes room), and the watchdog must reach it there too.

use std::time::{Duration, Instant};

use super::exactly_once::EXACTLY_ONCE;
use crate::harness::events::{aggregates, payload_texts, verify_reading, write, ReadBack};
use crate::harness::http::{free_port, Scrape};
use crate::harness::kafka::KafkaBroker;
use crate::harness::proxy::Proxy;
use crate::harness::relay::{confirmed_lsn, edit_config, env, lsn_now, use_ledger_topic, Relay};
use crate::harness::wait::wait_for;

/// `kafka.stuck_after` in these tests.
const STUCK_AFTER: &str = "3s";
/// The relay's `message.timeout.ms` (its default, which the tests leave).
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// From the freeze to the slot confirmed past everything written after it:
/// the limit, the fresh metadata (asked twice, 2 s apart), taking back what the producer held (or a
/// new session's start, exactly-once) and the resend, with slack for a
/// loaded host. Without the watchdog it takes the message timeout or more.
const RECOVERY_BOUND: Duration = Duration::from_secs(15);
/// The producer's `queue.buffering.max.messages`, below the window.
const QUEUE: usize = 20;
/// Events written after the first freeze: fewer than [`QUEUE`].
const FEW: usize = 10;
/// Events written after the second freeze, in four transactions: each
/// more than [`QUEUE`].
const MANY: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_replaces_a_stuck_producer_without_waiting_for_the_timeout() {
    stuck_producer("stuck_alo", "", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_gives_a_stuck_commit_up_without_waiting_for_the_timeout() {
    stuck_producer("stuck_eos", EXACTLY_ONCE, true).await;
}

async fn stuck_producer(slot: &str, extra: &str, exactly_once: bool) {
    let port = free_port();
    let proxy = Proxy::start(([127, 0, 0, 1], port).into());
    let broker =
        tokio::task::block_in_place(|| KafkaBroker::start_behind_for_clients(proxy.port(), port));
    let metrics = free_port();
    let extra = format!(
        "{extra}[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
         [kafka.properties]\n\"queue.buffering.max.messages\" = \"{QUEUE}\"\n"
    );
    let e = env(broker.bootstrap(), slot, &extra);
    edit_config(
        &e,
        "topic_partitions = 3\n",
        &format!("topic_partitions = 3\nstuck_after = \"{STUCK_AFTER}\"\n"),
    );
    if exactly_once {
        use_ledger_topic(&e, &format!("{slot}-ledger"));
    }
    let relay = Relay::start(&e);
    let aggs = aggregates(10);
    let mut client = e.pg.client("app").await;
    let mut sent = write(&mut client, slot, &aggs, 200, &[1, 5], 0).await;
    tokio::task::block_in_place(|| {
        let end = lsn_now(&e.pg);
        wait_for(
            "the first events confirmed",
            Duration::from_secs(90),
            || confirmed_lsn(&e.pg, slot) >= end,
        );
    });

    let mut recovered = Vec::new();
    // The second time in transactions larger than the queue: exactly-once
    // commits early when the stream is idle, so only a transaction that
    // fills the queue by itself has it wait for room.
    let phases: [(usize, &[usize], &str); 2] = [
        (FEW, &[1, 5], "the loop"),
        (MANY, &[MANY / 4], "a full queue"),
    ];
    for (n, sizes, waits_in) in phases {
        proxy.freeze_existing();
        let frozen = Instant::now();
        sent.extend(write(&mut client, slot, &aggs, n, sizes, 0).await);
        let end = lsn_now(&e.pg);
        let budget = MESSAGE_TIMEOUT * 2 + Duration::from_secs(30);
        let took = tokio::task::block_in_place(|| {
            wait_for(
                "the slot confirmed past the events written after the freeze",
                budget,
                || confirmed_lsn(&e.pg, slot) >= end,
            );
            frozen.elapsed()
        });
        eprintln!(
            "{slot}: {n} event(s) after the freeze (waiting in {waits_in}): recovered {:.1} s \
             after it (bound {} s, kafka.stuck_after = {STUCK_AFTER})",
            took.as_secs_f64(),
            RECOVERY_BOUND.as_secs()
        );
        recovered.push((waits_in, took));
    }
    let replaced = Scrape::take(metrics)
        .get(
            "outboxd_kafka_producer_replacements_total",
            "reason=\"stuck\"",
        )
        .unwrap_or(0.0);
    eprintln!("{slot}: {replaced} producer(s) replaced as stuck");

    // Nothing lost, per-key order kept; duplicates only at least once.
    let texts = payload_texts(&e.pg);
    let read = if exactly_once {
        ReadBack::ToEnd
    } else {
        ReadBack::Count
    };
    let v = tokio::task::block_in_place(|| {
        verify_reading(
            &broker,
            &sent,
            &texts,
            Duration::from_secs(120),
            !exactly_once,
            true,
            read,
            e.dir.path(),
        )
    });
    if exactly_once {
        assert_eq!(v.duplicates, 0, "read_committed saw duplicates");
    } else {
        assert!(
            v.duplicates <= FEW + QUEUE,
            "{} duplicates: more than the records in flight",
            v.duplicates
        );
    }
    for (waits_in, took) in recovered {
        assert!(
            took <= RECOVERY_BOUND,
            "the relay, waiting in {waits_in}, took {:.1} s to recover from a stuck producer \
             (bound {} s); log:\n{}",
            took.as_secs_f64(),
            RECOVERY_BOUND.as_secs(),
            relay.log()
        );
    }
    assert!(
        replaced >= 2.0,
        "not one replacement counted as stuck per freeze; log:\n{}",
        relay.log()
    );
    let log = relay.log();
    for line in log
        .lines()
        .filter(|l| l.contains("the Kafka producer is stuck"))
    {
        eprintln!("{slot}: {line}");
    }
    if exactly_once {
        // The second freeze caught it flushing to make room, outside the
        // loop's `select!`.
        assert!(
            log.contains("the flush of the open Kafka transaction"),
            "the watchdog did not give up the flush that made room; log:\n{log}"
        );
    }
    assert!(
        relay.log().contains("the Kafka producer is stuck"),
        "the log does not say why; log:\n{}",
        relay.log()
    );
    drop(proxy);
}
