//! The load and the faults of the exactly-once fault tests: writers that
//! go on until told to stop, a postmaster SIGKILL, waits on the slot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{RwLock, RwLockWriteGuard};
use tokio::task::{block_in_place, JoinHandle};

use crate::harness::events::{aggregates, write, Sent};
use crate::harness::kafka::KafkaBroker;
use crate::harness::pg::PgCluster;
use crate::harness::relay::{confirmed_lsn, lsn_now, Relay};
use crate::harness::wait::wait_for;
use crate::relay::faults::{notable_lines, tail_lines};

/// Writers that go on until told to stop, in transactions of mixed sizes,
/// 100 events per connection. A fault that cuts a commit off leaves it in
/// doubt, so a fault on the database waits for the chunks in progress
/// ([`Load::hold`]); the relay still has their backlog to deliver.
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    pause: Arc<RwLock<()>>,
    url: Arc<Mutex<String>>,
    writers: Vec<JoinHandle<Vec<Sent>>>,
    pub(super) started: Instant,
}

impl Load {
    pub(super) fn start(pg: &PgCluster, prefix: &str, writers: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let pause = Arc::new(RwLock::new(()));
        let url = Arc::new(Mutex::new(pg.url("postgres", Some("postgres"), "app")));
        let aggs = aggregates(40);
        let writers = (0..writers)
            .map(|w| {
                let (stop, pause, url) = (stop.clone(), pause.clone(), url.clone());
                let (aggs, prefix) = (aggs.clone(), prefix.to_string());
                tokio::spawn(async move {
                    let sizes: &[usize] = if w % 2 == 0 {
                        &[1, 10, 50]
                    } else {
                        &[20, 1, 5]
                    };
                    let mut sent = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let running = pause.read().await;
                        let url = url.lock().unwrap().clone();
                        let (mut client, conn) =
                            tokio_postgres::connect(&url, tokio_postgres::NoTls)
                                .await
                                .unwrap();
                        let conn = tokio::spawn(conn);
                        sent.extend(write(&mut client, &prefix, &aggs, 100, sizes, 0).await);
                        drop(client);
                        let _ = conn.await;
                        drop(running);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    sent
                })
            })
            .collect();
        Load {
            stop,
            pause,
            url,
            writers,
            started: Instant::now(),
        }
    }

    /// Sleeps until `at` after the start.
    pub(super) async fn until(&self, at: Duration) {
        tokio::time::sleep(at.saturating_sub(self.started.elapsed())).await;
    }

    /// Keeps the writers going until the relay, back from a fault, confirmed
    /// the slot to `wal` (the WAL's end when the fault was over: it
    /// delivered everything written before, its recovery under load), or
    /// until `at` after the start, whichever comes first: a relay slower
    /// than the writers would never reach `wal` under load. Writing on
    /// after the recovery only adds events the resumed session already
    /// shows it delivers; the read-back checks every event either way.
    pub(super) async fn until_recovered(
        &self,
        pg: &PgCluster,
        slot: &str,
        wal: outboxd::Lsn,
        at: Duration,
    ) {
        let from = Instant::now();
        while self.started.elapsed() < at {
            if block_in_place(|| confirmed_lsn(pg, slot)) >= wal {
                eprintln!(
                    "relay recovered (slot confirmed to {wal}) {:.1} s after the fault, {:.1} s \
                     into the load",
                    from.elapsed().as_secs_f64(),
                    self.started.elapsed().as_secs_f64()
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "relay not yet confirmed to {wal} {:.1} s into the load; the load stops anyway",
            self.started.elapsed().as_secs_f64()
        );
    }

    /// Waits for the chunks in progress and keeps the writers off the
    /// database while the guard lives.
    pub(super) async fn hold(&self) -> RwLockWriteGuard<'_, ()> {
        self.pause.write().await
    }

    /// The writers' next connections go to `pg`.
    pub(super) fn redirect(&self, pg: &PgCluster) {
        *self.url.lock().unwrap() = pg.url("postgres", Some("postgres"), "app");
    }

    pub(super) fn writing(&self) -> usize {
        self.writers.iter().filter(|w| !w.is_finished()).count()
    }

    pub(super) async fn finish(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        let mut sent = Vec::new();
        for w in self.writers {
            sent.extend(w.await.unwrap());
        }
        sent
    }
}

/// Waits until the relay confirmed `pg`'s slot to the end of its WAL. With
/// the test's private `broker`, a failure also shows what its transaction
/// coordinator and controller logged: a transaction left open on the ledger
/// partition (Kafka's KAFKA-20734, docs/guarantees.md) shows there as
/// "Couldn't find leader endpoint ... likely deleted", and the broker's log
/// goes with its temp dir.
pub(super) fn caught_up(pg: &PgCluster, slot: &str, relay: &Relay, broker: Option<&KafkaBroker>) {
    let end = lsn_now(pg);
    let from = Instant::now();
    let deadline = from + Duration::from_secs(120);
    while confirmed_lsn(pg, slot) < end {
        if Instant::now() >= deadline || relay.exited() {
            // The summary first: a CI report may keep only a message's head.
            let log = relay.log();
            let broker_log = broker.map_or_else(String::new, |b| {
                let keys = [
                    " WARN ",
                    " ERROR ",
                    "leader endpoint",
                    "fenc",
                    "Transaction",
                ];
                format!(
                    "\nthe broker's warnings, fencing and transactions (last 40 lines):\n{}",
                    b.log_lines(|l| keys.iter().any(|k| l.contains(k)), 40)
                )
            });
            panic!(
                "the relay did not confirm {slot} to {end}: {}, confirmed {}, its log silent \
                 for {:.0} s, {}; its last lines above DEBUG:\n{}\nits last lines:\n{}{broker_log}",
                if relay.exited() {
                    "it exited"
                } else {
                    "still running after 120 s"
                },
                confirmed_lsn(pg, slot),
                relay.silent_for().as_secs_f64(),
                recoveries(relay),
                notable_lines(&log, 30),
                tail_lines(&log, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "relay caught up {:.1} s after the load",
        from.elapsed().as_secs_f64()
    );
}

/// What the relay's log says it went through: aborted Kafka transactions
/// and resumed sessions.
pub(super) fn recoveries(relay: &Relay) -> String {
    let log = relay.log();
    format!(
        "{} Kafka transactions aborted, {} sessions resumed",
        log.matches("Kafka transaction aborted").count(),
        log.matches("resuming from the slot").count()
    )
}

/// Waits until the slot moved past where it is now.
pub(super) async fn confirmations(pg: &PgCluster, slot: &str) {
    let before = confirmed_lsn(pg, slot);
    block_in_place(|| {
        wait_for("confirmations", Duration::from_secs(120), || {
            confirmed_lsn(pg, slot) > before
        })
    });
}
