//! The database restarted under a running relay: a fast restart, then a
//! crash (immediate stop, recovery on start). The slot's position survives
//! as PostgreSQL persisted it, so a crash may repeat events; none is lost and
//! per-aggregate order holds.

use std::time::{Duration, Instant};

use super::support::{aggregates, confirmed_lsn, env, payload_texts, verify, wait_for, Relay};
use crate::harness::kafka::shared;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_restart_and_crash_lose_nothing() {
    let broker = shared();
    let e = env(
        broker.bootstrap(),
        "pgrestart",
        "[relay]\nreconnect_backoff_max = \"2s\"\n",
    );
    let relay = Relay::start(&e);
    let aggs = aggregates(20);
    let pg = &e.pg;
    let start = confirmed_lsn(pg, "pgrestart");
    let mut sent = Vec::new();

    let mut client = pg.client("app").await;
    sent.extend(
        super::support::write(&mut client, "pgrestart", &aggs, 3_000, &[1, 10, 100], 0).await,
    );
    drop(client);
    tokio::task::block_in_place(|| {
        wait_for("first confirmations", Duration::from_secs(60), || {
            confirmed_lsn(pg, "pgrestart") > start
        });
        pg.restart();
    });

    let mut client = pg.client("app").await;
    sent.extend(super::support::write(&mut client, "pgrestart", &aggs, 3_000, &[10, 50], 0).await);
    drop(client);
    tokio::task::block_in_place(|| {
        pg.crash();
        pg.start_again();
    });

    let mut client = pg.client("app").await;
    sent.extend(super::support::write(&mut client, "pgrestart", &aggs, 2_000, &[5, 100], 0).await);

    // The slot catching up is the relay's own word that it recovered.
    let end: outboxd::Lsn = pg
        .psql("app", "SELECT pg_current_wal_lsn()")
        .trim()
        .parse()
        .unwrap();
    let caught_up = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            if confirmed_lsn(pg, "pgrestart") >= end {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    let log = relay.log();
    assert!(
        caught_up,
        "the relay did not recover from the restarts; its log:\n{log}"
    );
    assert!(
        log.contains("resuming from the slot"),
        "the restarts should have forced reconnects:\n{log}"
    );
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(pg);
    let v = tokio::task::block_in_place(|| {
        verify(broker, &sent, &texts, Duration::from_secs(180), true, &logs)
    });
    eprintln!(
        "database restart + crash: {} delivered, {} duplicates",
        v.delivered, v.duplicates
    );
}

/// A fast shutdown makes each walsender wait until its client has confirmed
/// everything sent, the shutdown checkpoint included. A relay that cannot
/// confirm (its table watch cannot look at a server that is shutting down;
/// a halted relay never confirms past the poison event) must let go of the
/// stream, or `pg_ctl stop` waits until it gives up (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_shutdown_is_not_held_up_by_a_running_or_a_halted_relay() {
    let broker = shared();
    let e = env(
        broker.bootstrap(),
        "pgstop",
        "[relay]\nreconnect_backoff_max = \"2s\"\n",
    );
    let relay = Relay::start(&e);
    let pg = &e.pg;
    let start = confirmed_lsn(pg, "pgstop");
    let insert = |n: u32| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('p', 'a', 'small', '{{\"n\": {n}}}')"
        )
    };
    tokio::task::block_in_place(|| {
        pg.psql("app", &insert(1));
        wait_for("a first confirmation", Duration::from_secs(60), || {
            confirmed_lsn(pg, "pgstop") > start
        });
        let t = Instant::now();
        pg.stop();
        let running = t.elapsed();
        pg.start_again();

        // Halted: an event over the broker's message.max.bytes under the
        // default on_error = "stop".
        pg.psql(
            "app",
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'p', 'a', 'huge', jsonb_build_object('blob', string_agg(md5(i::text), '')) \
             FROM generate_series(1, 48000) i",
        );
        wait_for("the halt", Duration::from_secs(90), || {
            relay.log().contains("relay halted")
        });
        let t = Instant::now();
        pg.stop();
        let halted = t.elapsed();
        eprintln!("fast shutdown with a running relay: {running:?}, with a halted one: {halted:?}");
        for (what, took) in [("running", running), ("halted", halted)] {
            assert!(
                took < Duration::from_secs(20),
                "pg_ctl stop -m fast took {took:?} with a {what} relay; relay log:\n{}",
                relay.log()
            );
        }
        pg.start_again();
    });
}
