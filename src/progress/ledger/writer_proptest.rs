//! The ledger is never ahead of the acks: random streams of events,
//! commits, keepalives, out-of-order acks, failures, reconnects and clock
//! ticks drive the real [`AckTracker`]; after every step the writer is
//! offered the tracker's confirmable LSN, and every entry it hands out is
//! checked against the events themselves (not only against the tracker):
//! every event of a transaction at or below the entry's position is acked,
//! entries never go back, and at most one comes per interval.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use super::entry::{LedgerEntry, LedgerIdentity};
use super::writer::{CommitPosition, LedgerWriter};
use crate::progress::tracker::{AckTracker, DeliveryId};
use crate::Lsn;

const INTERVAL: Duration = Duration::from_millis(100);

#[derive(Clone, Debug)]
enum Op {
    Event,
    Commit {
        delta: u64,
    },
    Keepalive {
        delta: u64,
    },
    Ack {
        pick: usize,
    },
    Fail {
        pick: usize,
    },
    /// Reconnect: the tracker restarts from the slot, up to `back` below
    /// its confirmable LSN, and the new session gets a new writer from the
    /// last entry written, as the relay's session does.
    Reset {
        back: u64,
    },
    Tick {
        ms: u64,
    },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => Just(Op::Event),
        4 => (1u64..50).prop_map(|delta| Op::Commit { delta }),
        2 => (1u64..50).prop_map(|delta| Op::Keepalive { delta }),
        10 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Fail { pick }),
        1 => (0u64..300).prop_map(|back| Op::Reset { back }),
        4 => (0u64..80).prop_map(|ms| Op::Tick { ms }),
        1 => Just(Op::Flush),
    ]
}

/// One pushed event of the current epoch.
struct Event {
    id: DeliveryId,
    acked: bool,
    /// Its transaction's end LSN, once committed.
    end: Option<Lsn>,
}

struct Run {
    tracker: AckTracker,
    writer: LedgerWriter,
    events: Vec<Event>,
    /// Commits of the current epoch: (end LSN, commit time).
    commits: Vec<(Lsn, i64)>,
    /// Where the stream is: the last commit or keepalive position.
    cursor: Lsn,
    start: Instant,
    now: Instant,
    wall: i64,
    last: Option<Lsn>,
    last_entry: Option<LedgerEntry>,
    last_offer_at: Option<Instant>,
    identity: LedgerIdentity,
    written: usize,
}

impl Run {
    fn new(start: Lsn) -> Run {
        let identity = LedgerIdentity {
            system_identifier: "1".into(),
            database: "app".into(),
            slot: "s".into(),
        };
        let now = Instant::now();
        Run {
            tracker: AckTracker::new(start),
            writer: LedgerWriter::new(identity.clone(), 1, INTERVAL, None),
            events: Vec::new(),
            commits: Vec::new(),
            cursor: start,
            start: now,
            now,
            wall: 0,
            last: None,
            last_entry: None,
            last_offer_at: None,
            identity,
            written: 0,
        }
    }

    fn pending(&self, pick: usize) -> Option<DeliveryId> {
        let pending: Vec<DeliveryId> = self
            .events
            .iter()
            .filter(|e| !e.acked)
            .map(|e| e.id)
            .collect();
        (!pending.is_empty()).then(|| pending[pick % pending.len()])
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.wall += 1;
        match *op {
            Op::Event => {
                let id = self.tracker.push_event(0);
                self.events.push(Event {
                    id,
                    acked: false,
                    end: None,
                });
            }
            Op::Commit { delta } => {
                self.cursor = Lsn(self.cursor.0 + delta);
                let time = self.wall * 1000;
                self.tracker.commit(self.cursor);
                self.writer.note_commit(CommitPosition {
                    end_lsn: self.cursor,
                    commit_time_us: time,
                });
                self.commits.push((self.cursor, time));
                for e in self.events.iter_mut().filter(|e| e.end.is_none()) {
                    e.end = Some(self.cursor);
                }
            }
            Op::Keepalive { delta } => {
                if self.events.iter().all(|e| e.end.is_some()) {
                    self.cursor = Lsn(self.cursor.0 + delta);
                    self.tracker.keepalive(self.cursor);
                }
            }
            Op::Ack { pick } => {
                if let Some(id) = self.pending(pick) {
                    if !self.tracker.is_failed() {
                        self.tracker.ack(id).unwrap();
                        self.events.iter_mut().find(|e| e.id == id).unwrap().acked = true;
                    }
                }
            }
            Op::Fail { pick } => {
                if let Some(id) = self.pending(pick) {
                    let _ = self.tracker.fail(id);
                }
            }
            Op::Reset { back } => {
                let start = Lsn(self.tracker.confirmable().0.saturating_sub(back));
                self.tracker.reset(start);
                self.writer =
                    LedgerWriter::new(self.identity.clone(), 1, INTERVAL, self.last_entry.as_ref());
                self.last_offer_at = None;
                self.events.clear();
                self.commits.clear();
                self.cursor = start;
            }
            Op::Tick { ms } => self.now += Duration::from_millis(ms),
            Op::Flush => {
                let entry = self.writer.flush(self.tracker.confirmable(), self.wall);
                self.check(entry, false)?;
            }
        }
        let entry = self
            .writer
            .offer(self.tracker.confirmable(), self.now, self.wall);
        self.check(entry, true)
    }

    fn check(&mut self, entry: Option<LedgerEntry>, offered: bool) -> Result<(), TestCaseError> {
        let Some(entry) = entry else {
            return Ok(());
        };
        let lsn = entry.confirmed_lsn;
        let at = self.now.duration_since(self.start);
        prop_assert!(
            lsn <= self.tracker.confirmable(),
            "entry {lsn} ahead of the tracker's {} at {at:?}",
            self.tracker.confirmable()
        );
        for e in &self.events {
            match e.end {
                Some(end) if end <= lsn => prop_assert!(
                    e.acked,
                    "entry {lsn} covers unacked event {} of the transaction ending at {end}",
                    e.id
                ),
                Some(_) => {}
                // Its transaction ends above every position pushed so far.
                None => prop_assert!(lsn <= self.cursor, "entry {lsn} past an open transaction"),
            }
        }
        if let Some(last) = self.last {
            prop_assert!(lsn > last, "entry {lsn} not above the last one {last}");
        }
        if offered {
            if let Some(prev) = self.last_offer_at {
                prop_assert!(
                    self.now.duration_since(prev) >= INTERVAL,
                    "two entries within {:?}",
                    self.now.duration_since(prev)
                );
            }
            self.last_offer_at = Some(self.now);
        }
        if let Some(&(_, time)) = self.commits.iter().rev().find(|(end, _)| *end <= lsn) {
            prop_assert_eq!(entry.commit_time_us, Some(time), "commit time of {}", lsn);
        }
        self.last = Some(lsn);
        self.last_entry = Some(entry);
        self.written += 1;
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..ProptestConfig::default()
    })]

    #[test]
    fn ledger_is_never_ahead_of_the_acks(
        start in 0u64..1000,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let mut run = Run::new(Lsn(start));
        for op in &ops {
            run.apply(op)?;
        }
        // Once everything is acked and flushed, the ledger reaches the end.
        if !run.tracker.is_failed() {
            while let Some(id) = run.pending(0) {
                run.tracker.ack(id).unwrap();
                run.events.iter_mut().find(|e| e.id == id).unwrap().acked = true;
            }
            let end = run.tracker.confirmable();
            let entry = run.writer.flush(end, run.wall);
            run.check(entry, false)?;
            prop_assert!(run.last.map_or(end == Lsn(start), |l| l >= end));
        }
    }
}
