//! Issue 18: `relay.delivery = "exactly-once"`. A `read_committed` consumer
//! sees every committed event once, in per-key commit order, also across
//! `kill -9`; the position ledger's entries are inside the transactions.

use std::time::Duration;

use super::faults::join;
use super::support::{
    aggregates, confirmed_lsn, env, ledger_entries, payload_texts, use_ledger_topic,
    verify_reading, wait_for, Env, ReadBack, Relay, Sent,
};
use crate::harness::kafka::shared;

const EXACTLY_ONCE: &str = "[relay]\ndelivery = \"exactly-once\"\n";

/// Starts `n` events from `writers` writers in the background, in
/// transactions of mixed sizes.
fn spawn_writers(
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
                super::support::write(&mut client, &prefix, &aggs, n / writers, &sizes, 0).await
            })
        })
        .collect()
}

/// Reads every topic back `read_committed` and fails on a missing,
/// duplicated or reordered event.
async fn verify_once(
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
    let end = super::support::lsn_now(pg);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_twice_under_four_writers_repeats_nothing() {
    let broker = shared();
    let slot = "eos_kill9";
    let e = env(broker.bootstrap(), slot, EXACTLY_ONCE);
    let mut relay = Relay::start(&e);
    let pg = &e.pg;
    let start = confirmed_lsn(pg, slot);
    let writers = spawn_writers(&e, slot, 80_000, 4);
    for kill in 0..2 {
        let before = confirmed_lsn(pg, slot).max(start);
        tokio::task::block_in_place(|| {
            wait_for("confirmations", Duration::from_secs(120), || {
                confirmed_lsn(pg, slot) > before
            });
            std::thread::sleep(Duration::from_secs(2));
        });
        // Under load: the writers are still writing.
        let writing = writers.iter().filter(|w| !w.is_finished()).count();
        assert!(writing > 0, "kill {kill}: the writers had finished");
        relay.signal("-KILL");
        assert!(relay.wait(Duration::from_secs(10)).is_some());
        eprintln!("kill -9 number {}, {writing} writers writing", kill + 1);
        relay = Relay::start(&e);
    }
    let sent = join(writers).await;
    verify_once(broker, &e, sent).await;
    drop(relay);
}
