//! Issue 8: the position ledger is never ahead of the acknowledgements,
//! against a real broker that is paused (SIGSTOP) under load and resumed.
//! The property test of the writer (`progress::ledger::writer_proptest`)
//! covers the writer alone; this covers the relay's wiring of it.
//!
//! Every topic is made with `message.timestamp.type=LogAppendTime`, so a
//! record's timestamp is when the broker appended it, on one clock for the
//! data and the ledger. For every ledger entry (position P, appended at T),
//! every event whose transaction's commit end LSN (from a test_decoding
//! observer slot) is at or below P must have been appended before T.
//!
//! Why a writer fed the received position instead of the acked one fails
//! here: while the broker is stopped the relay goes on reading the stream
//! up to `relay.max_in_flight_events`, so the received position runs far
//! ahead of the acks; such a writer would hand out an entry for that
//! position during the pause, and on the resume its single small record
//! races the queued batches of three partitions (or, once a delivery times
//! out, precedes their re-sending after the reconnect by seconds): an entry
//! appended before events at or below its position. Outside the pause the
//! same writer leads the acks by the linger and one round trip on every
//! entry, which a millisecond clock catches less reliably; the pause makes
//! the lead seconds long.

use std::collections::HashMap;
use std::time::Duration;

use super::faults::{commit_end_by_id, join, spawn_writers};
use crate::harness::events::{aggregates, ledger_entries, now_ms, payload_texts, verify, write};
use crate::harness::kafka::{session_outlasting, KafkaBroker};
use crate::harness::relay::{
    confirmed_lsn, env, env_with_broker_props, lsn_now, use_ledger_topic, Relay,
};
use crate::harness::wait::wait_for;

const APPEND_TIME: (&str, &str) = ("message.timestamp.type", "LogAppendTime");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_entries_never_lead_the_acks_with_the_broker_paused() {
    let slot = "ledgeracks";
    let ledger_topic = format!("{slot}-ledger");
    // Paused for 8 s: a hung broker, not a fenced one (`session_outlasting`).
    let (broker, e) = tokio::task::block_in_place(|| {
        env_with_broker_props(slot, "", &session_outlasting(Duration::from_secs(10)))
    });
    use_ledger_topic(&e, &ledger_topic);
    tokio::task::block_in_place(|| {
        for kind in ["payment", "order"] {
            broker.create_topic_with(&format!("{slot}.{kind}"), 3, &[APPEND_TIME]);
        }
        // As outboxd makes it (compacted, one partition), plus append times.
        broker.create_topic_with(
            &ledger_topic,
            1,
            &[("cleanup.policy", "compact"), APPEND_TIME],
        );
    });
    e.pg.psql(
        "app",
        "SELECT pg_create_logical_replication_slot('observer', 'test_decoding')",
    );
    let relay = Relay::start(&e);
    let pg = &e.pg;
    let start = confirmed_lsn(pg, slot);
    let writers = spawn_writers(&e, slot, 30_000, 30);
    let b = &broker;
    tokio::task::block_in_place(|| {
        wait_for("first confirmations", Duration::from_secs(120), || {
            confirmed_lsn(pg, slot) > start
        });
        wait_for("ledger entries", Duration::from_secs(60), || {
            ledger_entries(b, &ledger_topic).len() >= 3
        });
    });
    let paused_at_lsn = lsn_now(pg);
    let paused_at = now_ms();
    // The background writers may be done by now (their 30,000 events take a
    // few seconds; the relay's start and first ledger entries sometimes take
    // as long): then nothing would follow the pause position and no entry
    // could pass it (the one failure seen). A writer of its own, on
    // aggregates of its own (not queued behind the others' row locks),
    // writes during the pause whatever their pace.
    let writers_done = writers.iter().filter(|h| h.is_finished()).count();
    broker.pause();
    let in_pause = {
        let url = pg.url("postgres", Some("postgres"), "app");
        let aggs = aggregates(40)[30..].to_vec();
        let slot = slot.to_string();
        tokio::spawn(async move {
            let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            write(&mut client, &slot, &aggs, 2_000, &[1, 10, 50], 0).await
        })
    };
    // The broker keeps its session through the pause. With the harness's
    // 3 s its own controller often fenced it at the resume, and librdkafka
    // found no leader until its producers were replaced: a fenced broker is
    // `relay::stuck_producer`'s test.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let received_in_pause = lsn_now(pg);
    broker.resume();
    let resumed_at = now_ms();
    let mut sent = join(writers).await;
    sent.extend(in_pause.await.unwrap());
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(pg);
    let v = tokio::task::block_in_place(|| {
        verify(b, &sent, &texts, Duration::from_secs(240), true, &logs)
    });
    let end = lsn_now(pg);
    tokio::task::block_in_place(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let last = ledger_entries(b, &ledger_topic)
                .last()
                .map(|(_, l)| l.confirmed_lsn);
            if last.is_some_and(|l| l >= end) {
                break;
            }
            if std::time::Instant::now() >= deadline {
                let log = std::fs::read_to_string(&relay.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                panic!(
                    "the ledger did not pass the end {end} within 60 s: last entry {last:?}, \
                     slot confirmed {}; relay log (last lines first):\n{}",
                    confirmed_lsn(pg, slot),
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });

    let mut first_append: HashMap<String, i64> = HashMap::new();
    tokio::task::block_in_place(|| {
        for kind in ["payment", "order"] {
            let topic = format!("{slot}.{kind}");
            for r in b.consume_all(&topic, b.record_count(&topic), Duration::from_secs(60)) {
                let id = String::from_utf8(r.header("id").unwrap().to_vec()).unwrap();
                let t = r.timestamp.expect("LogAppendTime");
                let first = first_append.entry(id).or_insert(t);
                *first = (*first).min(t);
            }
        }
    });
    let commit_end = commit_end_by_id(pg);
    let entries = tokio::task::block_in_place(|| ledger_entries(b, &ledger_topic));
    let mut checked = 0;
    let mut closest_ms = i64::MAX;
    for (appended_at, entry) in &entries {
        for (id, end) in &commit_end {
            if *end > entry.confirmed_lsn {
                continue;
            }
            let first = first_append
                .get(id)
                .unwrap_or_else(|| panic!("event {id} at or below a ledger entry is not in Kafka"));
            // Milliseconds: an event and the entry after it may share one.
            assert!(
                first <= appended_at,
                "ledger entry {} appended at {appended_at} leads event {id} (commit end {end}), \
                 appended only at {first}",
                entry.confirmed_lsn
            );
            closest_ms = closest_ms.min(appended_at - first);
            checked += 1;
        }
    }
    // The pause must have been tested: entries for positions past it.
    let after_pause = entries
        .iter()
        .filter(|(_, l)| l.confirmed_lsn > paused_at_lsn)
        .count();
    let written_in_pause = entries
        .iter()
        .filter(|(t, _)| (paused_at..resumed_at).contains(t))
        .count();
    let first_past_ms = entries
        .iter()
        .find(|(_, l)| l.confirmed_lsn > paused_at_lsn)
        .map(|(t, _)| t - resumed_at);
    eprintln!(
        "ledger vs acks, broker paused {} ms: {} events, {} delivered, {} duplicates; {} ledger \
         entries ({after_pause} past the pause position {paused_at_lsn}, WAL at {received_in_pause} \
         at the resume; {written_in_pause} appended during the pause; the first past the pause \
         position {first_past_ms:?} ms after the resume; {writers_done} of 2 background writers \
         done at the pause); {checked} (entry, event) pairs checked, closest entry {closest_ms} ms \
         after an event it covers",
        resumed_at - paused_at,
        sent.len(),
        v.delivered,
        v.duplicates,
        entries.len()
    );
    assert!(after_pause > 0, "no ledger entry past the pause");
    drop(relay);
}

/// An idle relay's slot moves on keepalives only; the ledger must follow
/// within about a status interval, not at whatever next wakes the relay (the
/// next keepalive, seconds later: the ledger then lagged the slot by that
/// much, and a restart saw a slot "ahead of the ledger").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relays_ledger_follows_the_slot_within_an_interval() {
    let broker = crate::harness::kafka::shared();
    let slot = "ledgeridle";
    let ledger_topic = format!("{slot}-ledger");
    let e = env(broker.bootstrap(), slot, "");
    use_ledger_topic(&e, &ledger_topic);
    let relay = Relay::start(&e);
    let pg = &e.pg;
    pg.psql(
        "app",
        "SELECT outbox_emit('idle', 'a' || g, 'created', '{}'::jsonb) FROM generate_series(1, 10) g",
    );
    let written = lsn_now(pg);
    let last_entry = || {
        ledger_entries(broker, &ledger_topic)
            .last()
            .map(|(_, l)| l.confirmed_lsn)
    };
    tokio::task::block_in_place(|| {
        wait_for("the events in the ledger", Duration::from_secs(60), || {
            last_entry().is_some_and(|l| l >= written)
        });
        // WAL the publication does not carry: only a keepalive moves the slot
        // past it (the driver asks for one after a third of
        // postgres.stream_timeout of silence).
        pg.psql("app", "INSERT INTO unpublished (note) VALUES ('idle')");
        let target = lsn_now(pg);
        wait_for(
            "the slot past unpublished WAL",
            Duration::from_secs(60),
            || confirmed_lsn(pg, slot) >= target,
        );
        let slot_there = std::time::Instant::now();
        let mut behind = Duration::ZERO;
        while !last_entry().is_some_and(|l| l >= target) {
            behind = slot_there.elapsed();
            assert!(
                behind < Duration::from_secs(3),
                "the ledger stays behind the idle slot (at {target}) for more than 3 s \
                 (status interval 200 ms); last entry {:?}",
                last_entry()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "idle: the ledger reached the slot's position {target} {behind:?} after the slot"
        );
    });
    drop(relay);
}

/// An operator deletes the ledger topic under a running relay. The ledger is
/// the only way a later start can tell a dropped slot from a first start, so
/// losing it must not pass in silence: the relay goes on delivering every
/// event (the slot, not the ledger, holds its position), says at WARN that
/// it cannot write the ledger, and the next start makes the topic again and
/// writes the slot's position into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_topic_deleted_under_a_running_relay_is_loud_loses_nothing_and_comes_back() {
    let broker = crate::harness::kafka::shared();
    let slot = "ledgerdeleted";
    let ledger_topic = format!("{slot}-ledger");
    let e = env(
        broker.bootstrap(),
        slot,
        "[kafka.properties]\n\"message.timeout.ms\" = \"5000\"\n",
    );
    use_ledger_topic(&e, &ledger_topic);
    let mut relay = Relay::start(&e);
    let pg = &e.pg;
    let aggs = aggregates(8);
    let mut client = pg.client("app").await;
    let mut sent = write(&mut client, slot, &aggs, 200, &[1, 10], 0).await;
    let first = lsn_now(pg);
    let last_entry = || {
        ledger_entries(broker, &ledger_topic)
            .last()
            .map(|(_, l)| l.confirmed_lsn)
    };
    tokio::task::block_in_place(|| {
        wait_for(
            "the first events in the ledger",
            Duration::from_secs(60),
            || last_entry().is_some_and(|l| l >= first),
        );
        broker.delete_topic(&ledger_topic);
    });
    sent.extend(write(&mut client, slot, &aggs, 200, &[1, 10], 0).await);
    let second = lsn_now(pg);
    let log = tokio::task::block_in_place(|| {
        wait_for(
            "confirmation past the second writes",
            Duration::from_secs(60),
            || confirmed_lsn(pg, slot) >= second,
        );
        wait_for("a WARN about the ledger", Duration::from_secs(120), || {
            relay.log().contains("cannot write the position ledger")
        });
        relay.log()
    });
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("cannot write the position ledger")),
        "{log}"
    );
    let texts = payload_texts(pg);
    let delivered = tokio::task::block_in_place(|| {
        let v = verify(
            broker,
            &sent,
            &texts,
            Duration::from_secs(60),
            false,
            e.dir.path(),
        );
        relay.signal("-TERM");
        assert!(
            relay.wait(Duration::from_secs(30)).is_some(),
            "{}",
            relay.log()
        );
        v.delivered
    });
    assert_eq!(delivered, sent.len());
    // kafka.create_topics (the default) makes the topic again at the start,
    // and the first entry brings the ledger to the slot.
    let slot_at = confirmed_lsn(pg, slot);
    let relay = Relay::start(&e);
    tokio::task::block_in_place(|| {
        wait_for(
            "the ledger topic made again",
            Duration::from_secs(60),
            || relay.log().contains("created the ledger topic"),
        );
        wait_for(
            "the ledger back at the slot",
            Duration::from_secs(60),
            || last_entry().is_some_and(|l| l >= slot_at),
        );
    });
    eprintln!(
        "ledger deleted: {delivered} of {} events delivered, the ledger back at {slot_at} after the restart",
        sent.len()
    );
    drop(relay);
}

/// Issue 38 §4: a ledger write that never gets an answer, made
/// deterministic. The broker is reached through a proxy that, once armed,
/// freezes every connection open at that moment as soon as it sends the
/// ledger topic's name: the ledger producer's next Produce hangs on a
/// connection that never answers (as one stuck after a fenced broker does)
/// while the relay's data producer and every new client work. The ledger
/// must catch up with the slot within its write timeout and a few status
/// intervals. The writer that waited on one write at a time took
/// `socket.timeout.ms` (30 s) and a retry: about 31 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_ledger_write_is_replaced_within_a_few_status_intervals() {
    use crate::harness::http::{free_port, Scrape};
    use crate::harness::proxy::Proxy;

    /// `kafka.ledger_write_timeout` as derived for the harness's 200 ms
    /// status interval (five intervals, at least 5 s).
    const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
    /// The write timeout, a new producer's connection and metadata, a
    /// status interval, and this test's polling (a fresh consumer per look).
    const BUDGET: Duration = Duration::from_secs(10);

    let port = free_port();
    let proxy = Proxy::start(([127, 0, 0, 1], port).into());
    let broker = tokio::task::block_in_place(|| KafkaBroker::start_behind(proxy.port(), port));
    let slot = "ledgerstuck";
    let ledger_topic = format!("{slot}-ledger");
    let metrics = free_port();
    let e = env(
        broker.bootstrap(),
        slot,
        &format!("[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n"),
    );
    use_ledger_topic(&e, &ledger_topic);
    let relay = Relay::start(&e);
    let pg = &e.pg;
    let b = &broker;
    let last_entry = || {
        ledger_entries(b, &ledger_topic)
            .last()
            .map(|(_, l)| l.confirmed_lsn)
    };
    let emit = |tag: &str| {
        pg.psql(
            "app",
            &format!(
                "SELECT outbox_emit('stuck', '{tag}' || g, 'created', '{{}}'::jsonb) \
                 FROM generate_series(1, 10) g"
            ),
        );
        lsn_now(pg)
    };
    let before = emit("before");
    tokio::task::block_in_place(|| {
        wait_for(
            "the first events in the ledger",
            Duration::from_secs(60),
            || last_entry().is_some_and(|l| l >= before),
        );
    });

    proxy.freeze_existing_on(ledger_topic.as_bytes());
    let target = emit("after");
    // The lag the relay exports while its ledger is behind, at its highest.
    let mut lag_seen = 0f64;
    let behind = tokio::task::block_in_place(|| {
        wait_for("the slot past the events", Duration::from_secs(60), || {
            confirmed_lsn(pg, slot) >= target
        });
        let slot_there = std::time::Instant::now();
        let deadline = slot_there + Duration::from_secs(60);
        while !last_entry().is_some_and(|l| l >= target) {
            let lag = Scrape::take(metrics).get("outboxd_ledger_lag_seconds", "");
            lag_seen = lag_seen.max(lag.unwrap_or(0.0));
            assert!(
                std::time::Instant::now() < deadline,
                "the ledger stays behind the slot (at {target}) for 60 s; last entry {:?}; \
                 relay log:\n{}",
                last_entry(),
                relay.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        slot_there.elapsed()
    });
    let scrape = Scrape::take(metrics);
    let stuck = scrape
        .get("outboxd_ledger_write_failures_total", "reason=\"stuck\"")
        .unwrap_or(0.0);
    eprintln!(
        "stuck ledger write: {} connection(s) frozen; the ledger reached the slot's position \
         {target} {behind:?} after the slot (write timeout {WRITE_TIMEOUT:?}, budget {BUDGET:?}); \
         {stuck} write(s) abandoned; lag at most {lag_seen} s, now {:?} s",
        proxy.frozen(),
        scrape.get("outboxd_ledger_lag_seconds", "")
    );
    assert!(
        proxy.frozen() >= 1,
        "no ledger connection was frozen: the fault was not injected"
    );
    assert!(
        behind <= BUDGET,
        "the ledger reached the slot {behind:?} after it (budget {BUDGET:?}); relay log:\n{}",
        relay.log()
    );
    assert!(stuck >= 1.0, "no write counted as stuck");
    assert!(
        lag_seen >= 1.0,
        "outboxd_ledger_lag_seconds never showed the ledger behind (at most {lag_seen})"
    );
    assert!(
        relay.log().contains("cannot write the position ledger"),
        "{}",
        relay.log()
    );
    drop(relay);
}
