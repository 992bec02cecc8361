//! The database restarted under a running relay: a fast restart, then a
//! crash (immediate stop, recovery on start). The slot's position survives
//! as PostgreSQL persisted it, so a crash may repeat events; none is lost and
//! per-aggregate order holds.

use std::time::{Duration, Instant};

use crate::harness::events::{aggregates, payload_texts, verify, write};
use crate::harness::kafka::shared;
use crate::harness::relay::{confirmed_lsn, env, kill_postmaster, Relay};
use crate::harness::wait::wait_for;

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
    sent.extend(write(&mut client, "pgrestart", &aggs, 3_000, &[1, 10, 100], 0).await);
    drop(client);
    tokio::task::block_in_place(|| {
        wait_for("first confirmations", Duration::from_secs(60), || {
            confirmed_lsn(pg, "pgrestart") > start
        });
        pg.restart();
    });

    let mut client = pg.client("app").await;
    sent.extend(write(&mut client, "pgrestart", &aggs, 3_000, &[10, 50], 0).await);
    drop(client);
    tokio::task::block_in_place(|| {
        pg.crash();
        pg.start_again();
    });

    let mut client = pg.client("app").await;
    sent.extend(write(&mut client, "pgrestart", &aggs, 2_000, &[5, 100], 0).await);

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

/// The postmaster SIGKILLed twice under four writers in a ~26 s run. A
/// crash sets the slot back to what PostgreSQL last persisted (the last
/// checkpoint), so the relay used to deliver everything since again (the
/// issue measured 130 % duplicates). Now it skips what the position ledger
/// has as acknowledged: re-delivery is about one status interval.
///
/// The writers pause for the kill itself (a commit cut off by the kill is
/// in doubt, neither lost nor known committed); the relay is still busy
/// with their backlog when it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postmaster_sigkill_twice_under_load_repeats_about_one_interval() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let broker = shared();
    let e = env(
        broker.bootstrap(),
        "pgkill",
        "[relay]\nreconnect_backoff_max = \"1s\"\n",
    );
    let relay = Relay::start(&e);
    let pg = &e.pg;
    let aggs = aggregates(40);
    // Long enough for a backlog before each kill and for writes to go on
    // after the second. What a kill repeats is about one status interval
    // whatever the run's length, which only sets how many events it is
    // compared with: measured 1.2 % of a 40 s run, 2.0 % of this one.
    let run = Duration::from_secs(26);
    let stop = Arc::new(AtomicBool::new(false));
    let pause = Arc::new(tokio::sync::RwLock::new(()));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (aggs, stop, pause) = (aggs.clone(), Arc::clone(&stop), Arc::clone(&pause));
            let url = pg.url("postgres", Some("postgres"), "app");
            tokio::spawn(async move {
                let mut sent = Vec::new();
                let sizes: &[usize] = if w % 2 == 0 {
                    &[1, 10, 50]
                } else {
                    &[20, 1, 5]
                };
                while !stop.load(Ordering::Relaxed) {
                    let _running = pause.read().await;
                    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                    let conn = tokio::spawn(conn);
                    sent.extend(write(&mut client, "pgkill", &aggs, 200, sizes, 0).await);
                    drop(client);
                    let _ = conn.await;
                    drop(_running);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                sent
            })
        })
        .collect();

    let started = Instant::now();
    for at in [Duration::from_secs(8), Duration::from_secs(17)] {
        tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
        // Wait for the writers' transactions in progress, then kill.
        let held = pause.write().await;
        tokio::task::block_in_place(|| kill_postmaster(pg));
        drop(held);
    }
    tokio::time::sleep(run.saturating_sub(started.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    let mut sent = Vec::new();
    for w in writers {
        sent.extend(w.await.unwrap());
    }

    let end: outboxd::Lsn = pg
        .psql("app", "SELECT pg_current_wal_lsn()")
        .trim()
        .parse()
        .unwrap();
    let caught_up = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if confirmed_lsn(pg, "pgkill") >= end {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    let log = relay.log();
    assert!(caught_up, "the relay did not recover; its log:\n{log}");
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(pg);
    let v = tokio::task::block_in_place(|| {
        verify(broker, &sent, &texts, Duration::from_secs(240), true, &logs)
    });
    let percent = v.duplicates as f64 * 100.0 / sent.len() as f64;
    eprintln!(
        "postmaster SIGKILL x2 under 4 writers: {} committed, {} delivered, 0 lost, 0 out of order, {} duplicates ({percent:.1} %)",
        sent.len(),
        v.delivered,
        v.duplicates
    );
    assert!(
        v.duplicates * 10 <= sent.len(),
        "{} duplicates of {} events ({percent:.1} %), more than 10 %; relay log:\n{}",
        v.duplicates,
        sent.len(),
        super::faults::tail_lines(&log, 60)
    );
}
