//! Issue 38: a real cluster's life under load. Three brokers (replication
//! factor 3, `min.insync.replicas` 2, the default 9 s session), four
//! writers committing 1-row transactions at about 1,500 events a second,
//! and two relays decoding them side by side from one database, one per
//! delivery mode, each to topics of its own: both meet the same load and
//! the same faults, each fault runs once. The faults follow one another
//! under the one load: a preferred-leader election with reassignments, a
//! `kill -9` of the broker made leader of every partition of the run, a
//! rolling restart, and the active KRaft controller, made leader of every
//! partition of the run, cut off from everyone for 60 s. Each is followed
//! by calm: the next starts once both modes delivered everything committed
//! until the cluster was whole again, and a few seconds of normal flow
//! after that. Meanwhile, beside the relays' start and the calm before the
//! first fault, 20 first starts on a database of their own
//! (`first_starts`).
//!
//! Each committed event belongs to the phase (fault and its aftermath) in
//! which its commit returned; per phase and mode the test prints, and
//! checks: nothing lost; no duplicate read `read_committed` in
//! exactly-once (at-least-once: no more than the in-flight window); the
//! longest gap between broker appends, the longest the live consumer went
//! without a new event, the longest commit → `read_committed` sight of one
//! event, against the bounds in both modes: 10 s through an
//! election or a rolling restart, the session + 10 s (19 s) through a kill
//! or a cut, but for at-least-once through the cut (below). It also prints
//! what each relay's `/metrics` counted over the phase: events
//! acknowledged a second and, exactly-once, events per Kafka transaction.
//! Over the whole run: per-key order kept by the first copy of each event
//! and by its last (docs/guarantees.md), outboxd never exits.
//!
//! The cut comes right after the rolling restart, which makes it the hard
//! case: a restarted broker holds no block of producer ids until it is
//! asked for one, and a producer the watchdog replaces during the cut needs
//! a new id from a broker left, which asks the controller: the node cut
//! off. Its request there is given up only after the brokers'
//! `controller.socket.timeout.ms`, then goes to the controller elected
//! meanwhile. With Kafka's 30 s, at-least-once's longest delay through
//! this cut was 25.8 s and 36.9 s (2026-12-05). The cluster runs with 5 s,
//! as docs/operations.md advises ("The active controller cut off"):
//! 15.8 s and 16.3 s, and 18.2-20.4 s in 5 runs on a host at a load
//! average of 15-50. So at-least-once is held there to the session + 10 s + that
//! timeout (24 s), the id's wait being Kafka's; exactly-once, whose
//! producer keeps its id (a new epoch from the transaction coordinator),
//! to 19 s.
//!
//! The faults share one test: the cluster can serve only one at a time (a
//! fault must not meet another's relays), and each more test of the module
//! would hold one of the suite's threads idle while it waited for its
//! turn. Run it, as root, with
//! `cargo test --locked --test main relay::cluster -- --nocapture`.

mod faults;
mod first_starts;
mod load;
mod relays;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::task::block_in_place;

use super::faults::notable_lines;
use crate::harness::events::now_ms;
use crate::harness::kafka_cluster::KafkaCluster;
use crate::harness::relay::{edit_config, env};
use faults::Fault;
use load::{figures, out_of_order, sighted, Figures, Load, OrderBy};
use relays::{Counted, Mode, Side};

/// The writers' total rate, events a second (the load).
const RATE: f64 = 1_500.0;
const WRITERS: usize = 4;
/// Normal flow before the first fault and after each one.
const CALM: Duration = Duration::from_secs(2);
/// How long both modes may take, after the cluster is whole again, to
/// deliver everything committed until then.
const CATCH_UP: Duration = Duration::from_secs(180);
/// The relay's default in-flight window: at-least-once may repeat what was
/// in flight when a session ended, no more.
const IN_FLIGHT_WINDOW: usize = 1536;
const FIRST_STARTS: usize = 20;
/// Stands for the cluster's address in a config made while it starts.
const PENDING_BOOTSTRAP: &str = "cluster-still-starting:9092";

fn cluster() -> &'static KafkaCluster {
    static CLUSTER: OnceLock<KafkaCluster> = OnceLock::new();
    CLUSTER.get_or_init(KafkaCluster::start)
}

/// One fault and its aftermath, as the clock and the relays' logs saw it.
struct Phase {
    fault: Fault,
    /// Commits returned in [from, to] (ms since the epoch) belong to it.
    from_ms: i64,
    to_ms: i64,
    took: Duration,
    /// Per mode: sessions resumed (each with a new producer), Kafka
    /// transactions aborted and producers the watchdog replaced during the
    /// phase.
    resumed: [usize; 2],
    aborted: [usize; 2],
    stuck: [usize; 2],
    /// Per mode, from the relay's `/metrics`: acknowledged events a second
    /// and mean events per committed Kafka transaction over the phase.
    rates: [Option<(f64, Option<f64>)>; 2],
}

fn log_counts(side: &Side) -> (usize, usize, usize) {
    let log = side.relay.log();
    (
        log.matches("resuming from the slot").count(),
        log.matches("Kafka transaction aborted").count(),
        log.matches("the Kafka producer is stuck").count(),
    )
}

/// The election, the kill, the rolling restart and the cut, after the first
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_of_a_3_broker_cluster_under_load_in_both_modes() {
    life(
        "cl",
        &[
            Fault::ElectionAndReassignment,
            Fault::Kill,
            Fault::RollingRestart,
            Fault::Cut,
        ],
        FIRST_STARTS,
    )
    .await;
}

/// One cluster's life for a run called `run` (its slots' and topics'
/// prefix): `first_starts` first starts, then both modes under one load
/// through `faults`, one after the other.
async fn life(run: &str, faults: &[Fault], first_starts: usize) {
    // Where the test's time goes, step by step (the suite's longest test).
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("CLUSTER at {:5.1} s: {what}", t0.elapsed().as_secs_f64());
    // The cluster (15 s and three JVMs) starts while the databases do.
    let starting = std::thread::spawn(|| {
        cluster();
    });
    let (first_db, db) = block_in_place(|| {
        let first = (first_starts > 0).then(|| env(PENDING_BOOTSTRAP, "clfirst0", ""));
        let db = relays::database(PENDING_BOOTSTRAP, run);
        (first, db)
    });
    starting.join().expect("the cluster started");
    mark("the cluster and the databases up");
    let c = cluster();
    edit_config(&db, PENDING_BOOTSTRAP, c.bootstrap());
    let mut failures: Vec<String> = Vec::new();

    // The first starts, on a database of their own, go on beside the
    // relays' start and the calm before the first fault (not beside a
    // fault: the 2-core host is then busy enough).
    let mut starting_first = first_db.map(|first_db| {
        edit_config(&first_db, PENDING_BOOTSTRAP, c.bootstrap());
        std::thread::spawn(move || first_starts::first_starts(&first_db, first_starts))
    });
    let mut first_starts_done = |failures: &mut Vec<String>| {
        let Some(starting) = starting_first.take() else {
            return;
        };
        let exits = block_in_place(|| starting.join().expect("the first starts"));
        if !exits.is_empty() {
            failures.push(format!(
                "{} of {first_starts} first starts exited: {exits:#?}",
                exits.len()
            ));
        }
    };

    let sides: Vec<Side> = block_in_place(|| {
        c.restore();
        [Mode::AtLeastOnce, Mode::ExactlyOnce]
            .into_iter()
            .map(|mode| relays::start(c, &db, run, mode))
            .collect()
    });
    mark("both relays started");
    let prefixes: Vec<&str> = sides.iter().map(|s| s.slot.as_str()).collect();
    let load = Load::start(&db.pg, &Mode::AtLeastOnce.slot(run), WRITERS, RATE);
    let load_from_ms = now_ms();
    tokio::time::sleep(CALM).await;
    if let Err(e) = calm_after(&load, &sides, now_ms()).await {
        failures.push(format!("before the first fault: {e}"));
    }
    mark("calm before the first fault");
    // From here on both relays serve their metrics (a relay starts serving
    // them once it is up; the first phase's rates start here).
    let mut counted: Vec<Counted> = block_in_place(|| sides.iter().map(Side::counted).collect());
    // outboxd made its ledger with `kafka.ledger_replication_factor` = 3.
    let ledgers: Vec<_> = block_in_place(|| c.layout())
        .unwrap_or_default()
        .into_iter()
        .filter(|((t, _), _)| {
            prefixes
                .iter()
                .any(|p| t.starts_with(&format!("{p}.ledger.")))
        })
        .map(|((t, p), (_, replicas, _))| (t, p, replicas.len()))
        .collect();
    if ledgers.len() != 2 || ledgers.iter().any(|&(_, _, n)| n != 3) {
        failures.push(format!(
            "the ledgers, (topic, partition, replicas): {ledgers:?}; wanted one partition each \
             on 3 replicas"
        ));
    }
    let mut phases: Vec<Phase> = Vec::new();
    for (n, &fault) in faults.iter().enumerate() {
        if n == 0 {
            first_starts_done(&mut failures);
            mark("first starts done");
        }
        if !failures.is_empty() {
            break;
        }
        let from_ms = phases.last().map_or(load_from_ms, |p| p.to_ms + 1);
        let before: Vec<_> = block_in_place(|| sides.iter().map(log_counts).collect());
        let victim = block_in_place(|| fault.prepare(c, &prefixes));
        mark(&format!("{fault:?} prepared"));
        let started = Instant::now();
        block_in_place(|| fault.run(c, &prefixes, victim));
        let took = started.elapsed();
        mark(&format!("{fault:?} over, the cluster whole"));
        let whole_at = now_ms();
        if let Err(e) = calm_after(&load, &sides, whole_at).await {
            failures.push(format!("{fault:?}: {e}"));
        }
        mark(&format!(
            "{fault:?}: both modes delivered what was committed until then"
        ));
        tokio::time::sleep(CALM).await;
        let after: Vec<_> = block_in_place(|| sides.iter().map(log_counts).collect());
        let now_counted: Vec<Counted> =
            block_in_place(|| sides.iter().map(Side::counted).collect());
        let rates = [0, 1].map(|i| counted[i].rates(&now_counted[i]));
        counted = now_counted;
        phases.push(Phase {
            fault,
            from_ms,
            to_ms: now_ms(),
            took,
            resumed: [0, 1].map(|i| after[i].0 - before[i].0),
            aborted: [0, 1].map(|i| after[i].1 - before[i].1),
            stuck: [0, 1].map(|i| after[i].2 - before[i].2),
            rates,
        });
    }
    first_starts_done(&mut failures);
    // Still writing, all four, through every fault: the writers' failures
    // would shrink the load the figures stand for.
    let writing = load.writing();
    let committed = load.finish().await;
    if let Some(last) = phases.last_mut() {
        last.to_ms = now_ms();
    }
    mark("writers stopped");
    if writing != WRITERS {
        failures.push(format!(
            "{} of {WRITERS} writers stopped",
            WRITERS - writing
        ));
    }
    for (i, side) in sides.iter().enumerate() {
        let mode = side.mode.name();
        let seen = block_in_place(|| {
            relays::caught_up(&db, side);
            side.watch.wait_for(&committed, CATCH_UP)
        });
        mark(&format!("{mode}: caught up and read"));
        let sighted = sighted(&seen);
        let mut failed = false;
        for phase in &phases {
            let f = figures(&committed, &seen, &sighted, (phase.from_ms, phase.to_ms));
            report(side.mode, phase, i, &f);
            let found = judge(side.mode, phase.fault, &f);
            failed |= !found.is_empty();
            failures.extend(found);
        }
        if failed {
            failures.push(format!(
                "{mode} relay, its log without debug lines (last 40):\n{}",
                notable_lines(&side.relay.log(), 40)
            ));
        }
        // What docs/guarantees.md promises: the last copies in order, and
        // the first copies too unless librdkafka timed a data record out
        // (the session then ends with that cause) and went on with later
        // ones.
        let timed_out = side
            .relay
            .log()
            .contains("delivery failed: Local: Message timed out");
        for by in [OrderBy::FirstCopy, OrderBy::LastCopy] {
            let unordered = out_of_order(&committed, &seen, by);
            if unordered.is_empty() {
                continue;
            }
            let what = format!("{mode}: per-key order ({by:?}) broken for {unordered:?}");
            if by == OrderBy::FirstCopy && timed_out {
                eprintln!("{what}, after librdkafka timed a record out (allowed)");
            } else {
                failures.push(what);
            }
        }
        if side.relay.exited() {
            failures.push(format!("{mode}: outboxd exited:\n{}", side.relay.log()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Waits until both modes have delivered every event committed by
/// `at_ms`.
async fn calm_after(load: &Load, sides: &[Side], at_ms: i64) -> Result<(), String> {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let unseen: Vec<(Mode, usize)> = sides
            .iter()
            .map(|s| (s.mode, load.unseen_by(&s.watch, at_ms)))
            .filter(|&(_, n)| n > 0)
            .collect();
        if unseen.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline || sides.iter().any(|s| s.relay.exited()) {
            return Err(format!(
                "events committed by then not delivered {CATCH_UP:?} later: {unseen:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn report(mode: Mode, phase: &Phase, i: usize, f: &Figures) {
    eprintln!(
        "CLUSTER {:?} ({}): fault took {:.1} s; {} committed at {:.0} ev/s, {} delivered, \
         {} lost, {} duplicates; longest gap between broker appends {:.1} s, without a new \
         event at the consumer {:.1} s; longest commit -> read_committed {:.1} s; relay: {} \
         sessions resumed, {} Kafka transactions aborted, {} producers replaced as stuck; \
         its metrics: {}",
        phase.fault,
        mode.name(),
        phase.took.as_secs_f64(),
        f.committed,
        f.rate,
        f.delivered,
        f.lost,
        f.duplicates,
        f.append_gap.as_secs_f64(),
        f.seen_gap.as_secs_f64(),
        f.max_delay.as_secs_f64(),
        phase.resumed[i],
        phase.aborted[i],
        phase.stuck[i],
        match phase.rates[i] {
            None => "no answer".to_string(),
            Some((acked, None)) => format!("{acked:.0} events acked a second"),
            Some((acked, Some(per))) =>
                format!("{acked:.0} events acked a second, {per:.1} events per Kafka transaction"),
        },
    );
}

/// What in `f` breaks the expectations for `fault` in `mode`.
fn judge(mode: Mode, fault: Fault, f: &Figures) -> Vec<String> {
    let name = format!("{fault:?} ({})", mode.name());
    let mut out = Vec::new();
    if f.lost > 0 {
        out.push(format!(
            "{name}: {} of {} committed events lost",
            f.lost, f.committed
        ));
    }
    match mode {
        Mode::ExactlyOnce if f.duplicates > 0 => out.push(format!(
            "{name}: {} duplicates read read_committed",
            f.duplicates
        )),
        Mode::AtLeastOnce if f.duplicates > IN_FLIGHT_WINDOW => out.push(format!(
            "{name}: {} duplicates, more than the in-flight window",
            f.duplicates
        )),
        _ => {}
    }
    let limit = fault.bound(mode);
    if f.append_gap <= limit && f.seen_gap <= limit && f.max_delay <= limit {
        return out;
    }
    out.push(format!(
        "{name}: the issue's bound is {limit:?} for the gap in acks and each event's \
         commit -> read_committed delay; measured {:?} (appends), {:?} (consumer), {:?} (delay)",
        f.append_gap, f.seen_gap, f.max_delay
    ));
    out
}
