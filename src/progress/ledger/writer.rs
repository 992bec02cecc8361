//! [`LedgerWriter`]: decides when a ledger entry is written and what it says.
//!
//! The relay offers it the ack tracker's confirmable LSN
//! ([`AckTracker::confirmable`](crate::progress::AckTracker::confirmable))
//! whenever that may have moved and on every status tick; the writer answers
//! with an entry to write, or nothing. It writes
//!
//! - only the position offered in the same call, never one remembered from
//!   earlier: after a reconnect the tracker restarts from the slot, which may
//!   be lower, and an old offer is no longer known to be acked;
//! - only when that position is above the last one written (or a rewrite is
//!   due), so entries never go back;
//! - at most once per interval (the status interval: the ledger then lags
//!   the slot by about one interval), except [`LedgerWriter::flush`] at
//!   shutdown, which writes the final position at once.
//!
//! The exactly-once mode does not offer acked positions: it asks
//! [`LedgerWriter::at`] for the entry of the position a Kafka transaction
//! reaches and sends it inside that transaction, so the entry and the
//! records commit together.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::entry::{AcceptedGap, InsideTransaction, LedgerEntry, LedgerIdentity, LEDGER_VERSION};
use crate::Lsn;

/// A transaction's Commit as the writer needs it: end LSN and commit time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommitPosition {
    pub end_lsn: Lsn,
    /// Microseconds since the Unix epoch.
    pub commit_time_us: i64,
}

/// When to write the ledger; see the module documentation. Pure: the caller
/// passes the clock.
#[derive(Debug)]
pub(crate) struct LedgerWriter {
    identity: LedgerIdentity,
    timeline: u32,
    interval: Duration,
    /// Commits noted and not yet at or below an offered position, in WAL
    /// order: where the commit time of a future entry comes from.
    commits: VecDeque<CommitPosition>,
    /// Commit time of the last commit at or below the last offered position.
    commit_time_us: Option<i64>,
    /// The last position handed out (or the ledger's, at start).
    written: Option<Lsn>,
    /// When [`LedgerWriter::offer`] last handed out an entry.
    written_at: Option<Instant>,
    /// Write again even if the position did not move: the last entry was not
    /// written, or a gap was accepted.
    rewrite: bool,
    accepted_gaps: Vec<AcceptedGap>,
}

impl LedgerWriter {
    /// A writer for `identity` on `timeline`, entries at most once per
    /// `interval`. `previous` is what the ledger holds (if anything): its
    /// accepted gaps are kept, and when it is this identity's, its position
    /// is the floor of what will be written.
    pub(crate) fn new(
        identity: LedgerIdentity,
        timeline: u32,
        interval: Duration,
        previous: Option<&LedgerEntry>,
    ) -> LedgerWriter {
        let same = previous.filter(|p| p.identity() == identity);
        LedgerWriter {
            identity,
            timeline,
            interval,
            commits: VecDeque::new(),
            commit_time_us: same.and_then(|p| p.commit_time_us),
            written: same.map(|p| p.confirmed_lsn),
            written_at: None,
            rewrite: false,
            accepted_gaps: previous
                .map(|p| p.accepted_gaps.clone())
                .unwrap_or_default(),
        }
    }

    /// Notes a Commit, in WAL order, when the relay hands it to the tracker
    /// ([`AckTracker::commit`](crate::progress::AckTracker::commit)), so an
    /// entry can carry its commit time.
    pub(crate) fn note_commit(&mut self, commit: CommitPosition) {
        self.commits.push_back(commit);
    }

    /// `acked` is the tracker's confirmable LSN now. Returns the entry to
    /// write when it moved past the last one written (or a rewrite is due)
    /// and the last one is at least an interval old.
    pub(crate) fn offer(&mut self, acked: Lsn, now: Instant, wall_us: i64) -> Option<LedgerEntry> {
        self.settle_commits(acked);
        let due = self.written_at.map_or(true, |at| {
            now.saturating_duration_since(at) >= self.interval
        });
        if !due || !self.wants(acked) {
            return None;
        }
        self.written_at = Some(now);
        Some(self.emit(acked, wall_us))
    }

    /// When [`offer`](Self::offer) would hand out an entry for `acked`: now
    /// (`now`) if it is due already, the end of the interval if only the
    /// interval holds it back, `None` if `acked` is nothing new. Lets the
    /// caller come back for a position it was refused within the interval,
    /// rather than wait for whatever wakes it next (an idle relay: the next
    /// keepalive, many seconds later).
    pub(crate) fn due_at(&self, acked: Lsn, now: Instant) -> Option<Instant> {
        if !self.wants(acked) {
            return None;
        }
        Some(
            self.written_at
                .map_or(now, |at| (at + self.interval).max(now)),
        )
    }

    /// As [`offer`](Self::offer), ignoring the interval: at shutdown, after
    /// the producer flushed, so the ledger ends where the slot does.
    pub(crate) fn flush(&mut self, acked: Lsn, wall_us: i64) -> Option<LedgerEntry> {
        self.settle_commits(acked);
        self.wants(acked).then(|| self.emit(acked, wall_us))
    }

    /// Exactly-once: the entry inside a Kafka transaction about to commit,
    /// which holds every event up to `through` and, past it, the first
    /// events of `inside`. Whatever the interval; `through` never goes back.
    pub(crate) fn at(
        &mut self,
        through: Lsn,
        inside: Option<InsideTransaction>,
        now: Instant,
        wall_us: i64,
    ) -> LedgerEntry {
        self.settle_commits(through);
        self.written_at = Some(now);
        let mut entry = self.emit(through, wall_us);
        entry.inside = inside;
        entry.transactional = true;
        entry
    }

    /// Records a gap the operator accepted; the next due offer writes it.
    pub(crate) fn accept_gap(&mut self, gap: AcceptedGap) {
        self.accepted_gaps.push(gap);
        self.rewrite = true;
    }

    fn wants(&self, acked: Lsn) -> bool {
        match self.written {
            None => true,
            Some(w) => acked > w || (self.rewrite && acked == w),
        }
    }

    fn emit(&mut self, acked: Lsn, wall_us: i64) -> LedgerEntry {
        debug_assert!(self.written.map_or(true, |w| acked >= w));
        self.written = Some(acked);
        self.rewrite = false;
        LedgerEntry {
            version: LEDGER_VERSION,
            system_identifier: self.identity.system_identifier.clone(),
            database: self.identity.database.clone(),
            slot: self.identity.slot.clone(),
            timeline: self.timeline,
            confirmed_lsn: acked,
            commit_time_us: self.commit_time_us,
            outboxd_version: env!("CARGO_PKG_VERSION").to_owned(),
            written_at_us: wall_us,
            accepted_gaps: self.accepted_gaps.clone(),
            inside: None,
            transactional: false,
        }
    }

    /// Moves the commit time up to the last noted commit at or below `acked`.
    fn settle_commits(&mut self, acked: Lsn) {
        while let Some(c) = self.commits.front().copied() {
            if c.end_lsn > acked {
                break;
            }
            self.commit_time_us = Some(c.commit_time_us);
            self.commits.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> LedgerIdentity {
        LedgerIdentity {
            system_identifier: "1".into(),
            database: "app".into(),
            slot: "s".into(),
        }
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn writes_at_most_once_per_interval_and_only_when_moved() {
        let t0 = Instant::now();
        let mut w = LedgerWriter::new(identity(), 1, 10 * SEC, None);
        w.note_commit(CommitPosition {
            end_lsn: Lsn(100),
            commit_time_us: 7,
        });
        let e = w.offer(Lsn(100), t0, 1).unwrap();
        assert_eq!((e.confirmed_lsn, e.commit_time_us), (Lsn(100), Some(7)));
        assert_eq!(
            w.offer(Lsn(200), t0 + 9 * SEC, 2),
            None,
            "within the interval"
        );
        assert_eq!(w.offer(Lsn(100), t0 + 11 * SEC, 3), None, "not moved");
        let e = w.offer(Lsn(300), t0 + 12 * SEC, 4).unwrap();
        assert_eq!(e.confirmed_lsn, Lsn(300));
        assert_eq!(e.commit_time_us, Some(7), "no later commit at or below");
        assert_eq!(e.written_at_us, 4);
    }

    #[test]
    fn only_entries_written_inside_a_kafka_transaction_say_so() {
        let t0 = Instant::now();
        let mut w = LedgerWriter::new(identity(), 1, 10 * SEC, None);
        assert!(!w.offer(Lsn(100), t0, 1).unwrap().transactional);
        assert!(!w.flush(Lsn(200), 2).unwrap().transactional);
        let inside = InsideTransaction {
            commit_lsn: Lsn(400),
            events: 3,
        };
        let e = w.at(Lsn(300), Some(inside), t0, 3);
        assert!(e.transactional);
        assert_eq!((e.confirmed_lsn, e.inside), (Lsn(300), Some(inside)));
    }

    #[test]
    fn due_at_says_when_a_refused_position_would_be_written() {
        let t0 = Instant::now();
        let mut w = LedgerWriter::new(identity(), 1, 10 * SEC, None);
        assert_eq!(w.due_at(Lsn(100), t0), Some(t0), "nothing written yet");
        w.offer(Lsn(100), t0, 1).unwrap();
        assert_eq!(w.due_at(Lsn(100), t0 + SEC), None, "not moved");
        assert_eq!(w.due_at(Lsn(200), t0 + SEC), Some(t0 + 10 * SEC));
        assert_eq!(w.offer(Lsn(200), t0 + SEC, 2), None);
        assert_eq!(w.due_at(Lsn(200), t0 + 11 * SEC), Some(t0 + 11 * SEC));
        assert!(w.offer(Lsn(200), t0 + 10 * SEC, 3).is_some(), "due then");
    }

    #[test]
    fn never_writes_below_the_last_entry_or_the_ledger() {
        let t0 = Instant::now();
        let mut previous = LedgerWriter::new(identity(), 1, SEC, None)
            .flush(Lsn(500), 0)
            .unwrap();
        previous.commit_time_us = Some(9);
        let mut w = LedgerWriter::new(identity(), 1, SEC, Some(&previous));
        assert_eq!(w.offer(Lsn(400), t0, 1), None, "slot behind the ledger");
        assert_eq!(w.flush(Lsn(500), 1), None);
        let e = w.offer(Lsn(501), t0, 1).unwrap();
        assert_eq!(e.commit_time_us, Some(9));
        // After a reconnect the session's new writer starts from the last
        // entry, and the tracker may restart lower.
        let mut w = LedgerWriter::new(identity(), 1, SEC, Some(&e));
        assert_eq!(w.offer(Lsn(450), t0 + 5 * SEC, 2), None);
    }

    #[test]
    fn flush_ignores_the_interval() {
        let t0 = Instant::now();
        let mut w = LedgerWriter::new(identity(), 1, 10 * SEC, None);
        w.offer(Lsn(1), t0, 0).unwrap();
        assert_eq!(w.flush(Lsn(2), 1).unwrap().confirmed_lsn, Lsn(2));
        assert_eq!(w.flush(Lsn(2), 1), None);
    }

    #[test]
    fn an_accepted_gap_is_written_again() {
        let t0 = Instant::now();
        let mut w = LedgerWriter::new(identity(), 1, SEC, None);
        w.offer(Lsn(10), t0, 0).unwrap();
        assert_eq!(
            w.offer(Lsn(10), t0 + 2 * SEC, 2),
            None,
            "the position did not move"
        );
        let gap = AcceptedGap {
            from_lsn: Lsn(10),
            to_lsn: Lsn(99),
            from_time_us: None,
            accepted_at_us: 3,
        };
        w.accept_gap(gap.clone());
        let e = w.offer(Lsn(10), t0 + 3 * SEC, 3).unwrap();
        assert_eq!(e.accepted_gaps, vec![gap]);
    }

    #[test]
    fn another_identitys_entry_gives_its_gaps_but_not_its_position() {
        let mut other = LedgerWriter::new(identity(), 1, SEC, None)
            .flush(Lsn(900), 0)
            .unwrap();
        other.system_identifier = "2".into();
        other.accepted_gaps.push(AcceptedGap {
            from_lsn: Lsn(900),
            to_lsn: Lsn(5),
            from_time_us: Some(1),
            accepted_at_us: 2,
        });
        let mut w = LedgerWriter::new(identity(), 2, SEC, Some(&other));
        let e = w.offer(Lsn(5), Instant::now(), 3).unwrap();
        assert_eq!((e.confirmed_lsn, e.timeline), (Lsn(5), 2));
        assert_eq!(e.accepted_gaps, other.accepted_gaps);
    }
}
