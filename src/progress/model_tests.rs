//! Model-based test: random operation sequences against a deliberately naive
//! reference (a plain list of events and checkpoints, rescanned after every
//! step), checking after every step that the tracker agrees with it, that
//! the confirmable LSN never decreases within an epoch, and the invariant:
//! the confirmable LSN is below the end LSN of every transaction with an
//! unacked event.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use super::tracker::{AckTracker, DeliveryId, TrackerError};
use crate::Lsn;

#[derive(Clone, Debug)]
enum Op {
    Event {
        bytes: usize,
    },
    /// `back` (only honoured without open events) pushes a commit below the
    /// cursor, which must be ignored; otherwise the end LSN moves forward.
    Commit {
        delta: u64,
        back: bool,
    },
    /// Relative to the cursor; may be below it (ignored by the tracker).
    Keepalive {
        offset: i64,
    },
    Ack {
        pick: usize,
    },
    Duplicate {
        pick: usize,
    },
    Unknown {
        ahead: u64,
    },
    Stale {
        pick: usize,
    },
    Fail {
        pick: usize,
    },
    Reset {
        start: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0usize..1000).prop_map(|bytes| Op::Event { bytes }),
        4 => (1u64..50, any::<bool>()).prop_map(|(delta, back)| Op::Commit { delta, back }),
        2 => (-40i64..=40).prop_map(|offset| Op::Keepalive { offset }),
        10 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Duplicate { pick }),
        1 => (0u64..5).prop_map(|ahead| Op::Unknown { ahead }),
        1 => any::<usize>().prop_map(|pick| Op::Stale { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Fail { pick }),
        1 => (0u64..2000).prop_map(|start| Op::Reset { start }),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Item {
    Event { id: u64, bytes: usize, acked: bool },
    Checkpoint(Lsn),
}

/// The specification, written as directly as possible.
struct Model {
    start: Lsn,
    /// This epoch's pushes in WAL order, checkpoints raw (even ignored ones).
    items: Vec<Item>,
    /// Committed transactions of this epoch: (event ids, end LSN).
    txns: Vec<(Vec<u64>, Lsn)>,
    open: Vec<u64>,
    next_id: u64,
    epoch_start: u64,
    /// The confirmable LSN at the failure, if one happened this epoch.
    frozen: Option<Lsn>,
}

impl Model {
    fn new(start: Lsn) -> Self {
        Model {
            start,
            items: vec![],
            txns: vec![],
            open: vec![],
            next_id: 0,
            epoch_start: 0,
            frozen: None,
        }
    }

    fn confirmable(&self) -> Lsn {
        if let Some(lsn) = self.frozen {
            return lsn;
        }
        // The greatest checkpoint before the first unacked event.
        let mut best = self.start;
        for item in &self.items {
            match *item {
                Item::Event { acked: false, .. } => break,
                Item::Checkpoint(lsn) => best = best.max(lsn),
                Item::Event { .. } => {}
            }
        }
        best
    }

    fn last_checkpoint(&self) -> Lsn {
        self.items.iter().fold(self.start, |m, i| match *i {
            Item::Checkpoint(lsn) => m.max(lsn),
            Item::Event { .. } => m,
        })
    }

    fn events(&self) -> impl Iterator<Item = (u64, usize, bool)> + '_ {
        self.items.iter().filter_map(|i| match *i {
            Item::Event { id, bytes, acked } => Some((id, bytes, acked)),
            Item::Checkpoint(_) => None,
        })
    }

    fn pending(&self) -> Vec<u64> {
        self.events().filter(|e| !e.2).map(|e| e.0).collect()
    }

    fn is_acked(&self, id: u64) -> bool {
        self.events().any(|e| e.0 == id && e.2)
    }

    /// What `ack`/`fail` must answer for `id`, outside a failure.
    fn expected(&self, id: u64) -> Result<(), TrackerError> {
        let d = DeliveryId::from_raw(id);
        if id >= self.next_id {
            Err(TrackerError::Unknown(d))
        } else if id < self.epoch_start {
            Err(TrackerError::Stale(d))
        } else if self.is_acked(id) {
            Err(TrackerError::AlreadyAcked(d))
        } else {
            Ok(())
        }
    }

    fn ack(&mut self, id: u64) -> Result<(), TrackerError> {
        if self.frozen.is_some() {
            return Ok(());
        }
        let result = self.expected(id);
        if result.is_ok() {
            for item in &mut self.items {
                if let Item::Event { id: i, acked, .. } = item {
                    if *i == id {
                        *acked = true;
                    }
                }
            }
        }
        result
    }

    fn fail(&mut self, id: u64) -> Result<(), TrackerError> {
        if self.frozen.is_some() {
            return Ok(());
        }
        let result = self.expected(id);
        if !matches!(result, Err(TrackerError::Stale(_))) {
            self.frozen = Some(self.confirmable());
        }
        result
    }

    fn reset(&mut self, start: Lsn) {
        *self = Model {
            epoch_start: self.next_id,
            next_id: self.next_id,
            ..Model::new(start)
        };
    }
}

/// Applies one op to both; returns the cursor (highest WAL position seen).
fn step(t: &mut AckTracker, m: &mut Model, cursor: u64, op: &Op) -> u64 {
    match *op {
        Op::Event { bytes } => {
            let id = t.push_event(bytes);
            assert_eq!(id.get(), m.next_id, "ids are a +1 sequence");
            m.items.push(Item::Event {
                id: m.next_id,
                bytes,
                acked: false,
            });
            m.open.push(m.next_id);
            m.next_id += 1;
            cursor
        }
        Op::Commit { delta, back } => {
            // WAL order: a transaction with events ends above every earlier
            // position; only an event-less commit is sent below the cursor.
            let (end, cursor) = if back && m.open.is_empty() {
                (cursor.saturating_sub(delta), cursor)
            } else {
                (cursor + delta, cursor + delta)
            };
            t.commit(Lsn(end));
            m.items.push(Item::Checkpoint(Lsn(end)));
            m.txns.push((std::mem::take(&mut m.open), Lsn(end)));
            cursor
        }
        Op::Keepalive { offset } => {
            let lsn = cursor.saturating_add_signed(offset);
            t.keepalive(Lsn(lsn));
            if m.open.is_empty() {
                m.items.push(Item::Checkpoint(Lsn(lsn)));
                return cursor.max(lsn);
            }
            cursor
        }
        Op::Ack { pick } => {
            let pending = m.pending();
            let id = if pending.is_empty() {
                m.next_id
            } else {
                pending[pick % pending.len()]
            };
            assert_eq!(t.ack(DeliveryId::from_raw(id)), m.ack(id));
            cursor
        }
        Op::Duplicate { pick } => {
            let acked: Vec<u64> = m.events().filter(|e| e.2).map(|e| e.0).collect();
            if !acked.is_empty() {
                let id = acked[pick % acked.len()];
                assert_eq!(t.ack(DeliveryId::from_raw(id)), m.ack(id));
            }
            cursor
        }
        Op::Unknown { ahead } => {
            let id = m.next_id + ahead;
            assert_eq!(t.ack(DeliveryId::from_raw(id)), m.ack(id));
            cursor
        }
        Op::Stale { pick } => {
            if m.epoch_start > 0 {
                let id = (pick as u64) % m.epoch_start;
                assert_eq!(t.ack(DeliveryId::from_raw(id)), m.ack(id));
                assert_eq!(t.fail(DeliveryId::from_raw(id)), m.fail(id));
            }
            cursor
        }
        Op::Fail { pick } => {
            // Mostly a pending delivery; otherwise any id up to two ahead.
            let pending = m.pending();
            let id = if pending.is_empty() {
                pick as u64 % (m.next_id + 2)
            } else {
                pending[pick % pending.len()]
            };
            assert_eq!(t.fail(DeliveryId::from_raw(id)), m.fail(id));
            cursor
        }
        Op::Reset { start } => {
            t.reset(Lsn(start));
            m.reset(Lsn(start));
            start
        }
    }
}

fn check(t: &AckTracker, m: &Model, previous: Lsn) {
    let confirmable = t.confirmable();
    assert_eq!(confirmable, m.confirmable());
    assert!(
        confirmable >= previous,
        "confirmable went back from {previous} to {confirmable}"
    );
    assert!(confirmable <= t.last_checkpoint_lsn());
    assert_eq!(t.last_checkpoint_lsn(), m.last_checkpoint());
    assert_eq!(t.is_failed(), m.frozen.is_some());
    let pending = m.pending();
    assert_eq!(t.in_flight(), pending.len());
    assert_eq!(
        t.in_flight_bytes(),
        m.events().filter(|e| !e.2).map(|e| e.1).sum::<usize>()
    );
    assert_eq!(
        t.oldest_unacked().map(DeliveryId::get),
        pending.first().copied()
    );
    if t.is_idle() {
        assert_eq!(confirmable, t.last_checkpoint_lsn());
    }
    if let Some(next) = t.pending_checkpoint_lsn() {
        assert!(next > confirmable && next <= t.last_checkpoint_lsn());
    }
    // The invariant from the module doc.
    for (ids, end) in &m.txns {
        if ids.iter().any(|id| pending.contains(id)) {
            assert!(
                confirmable < *end,
                "confirmed {confirmable} with an unacked event in txn ending {end}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1000,
        // Next to this file, not in a crate-level folder other people own.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn tracker_matches_the_model(start in 0u64..1000, ops in prop::collection::vec(op(), 0..200)) {
        let mut t = AckTracker::<()>::new(Lsn(start));
        let mut m = Model::new(Lsn(start));
        let mut cursor = start;
        let mut previous = t.confirmable();
        for op in &ops {
            cursor = step(&mut t, &mut m, cursor, op);
            if matches!(op, Op::Reset { .. }) {
                previous = Lsn(0); // monotone within an epoch only
            }
            check(&t, &m, previous);
            previous = t.confirmable();
        }
    }
}
