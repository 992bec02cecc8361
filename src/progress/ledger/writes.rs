//! [`LedgerWrites`]: what the ledger's writer task does next with the
//! entries [`LedgerWriter`](super::LedgerWriter) hands out, at-least-once
//! (exactly-once commits its entries inside its Kafka transactions).
//!
//! The ledger topic is compacted by key and a reader keeps the last value
//! per key, so only the newest entry matters:
//!
//! - **One write at a time, the newest next.** An entry wanted while another
//!   is in flight waits, and a newer one replaces it there (it is never
//!   sent). A write on the same producer could not overtake the one in
//!   flight anyway: the topic has one partition, kept in order.
//! - **An age limit on each write.** A write with no answer past the limit
//!   is abandoned: the caller replaces the producer (librdkafka 2.12.1 can
//!   leave one stuck after a fenced broker comes back, see
//!   docs/operations.md) and the newest entry goes out on the new one, the
//!   abandoned one again if nothing newer came.
//! - **After a failure, a pause** before the next write, so a topic that is
//!   gone or refused is not hammered; the newest entry is what is sent then.
//!
//! Entries are numbered in the order they were wanted, and the writer only
//! ever hands out positions at or above the last one, so a write never
//! sends an older entry after a newer one. What it cannot rule out: a
//! record of an abandoned producer already on its way to the broker may
//! still be appended after a newer one. That entry is an older, acked
//! position: the ledger is back by one entry until the next one, which a
//! start reads as a slot ahead of the ledger (resume from the slot, WARN),
//! never as events to skip.
//!
//! Pure: the caller passes the clock and does the I/O.

use std::time::{Duration, Instant};

use super::entry::LedgerEntry;

/// Why a write did not make the entry durable (the `reason` label of
/// `outboxd_ledger_write_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteFailure {
    /// No answer within the age limit: abandoned, the producer replaced.
    Stuck,
    /// librdkafka gave up on it (`message.timeout.ms`).
    TimedOut,
    /// Kafka or the producer refused it (a missing topic, an ACL, ...).
    Refused,
}

impl WriteFailure {
    pub(crate) const ALL: [WriteFailure; 3] = [
        WriteFailure::Stuck,
        WriteFailure::TimedOut,
        WriteFailure::Refused,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            WriteFailure::Stuck => "stuck",
            WriteFailure::TimedOut => "timed_out",
            WriteFailure::Refused => "refused",
        }
    }
}

/// What the writer task does now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Next {
    /// Send entry `number` with the current producer.
    Send { number: u64, entry: LedgerEntry },
    /// The write of entry `number` passed the age limit: drop it and
    /// replace the producer, then ask again.
    Abandon { number: u64 },
    /// Nothing to do until `Some(instant)`, or until an entry is wanted or
    /// a write answers.
    Wait(Option<Instant>),
}

/// An entry not yet durable.
#[derive(Debug, Clone)]
struct Pending {
    number: u64,
    entry: LedgerEntry,
    /// When the first entry this one stands for was wanted: kept through
    /// the entries it superseded.
    behind_since: Instant,
}

/// The writer task's state; see the module documentation.
#[derive(Debug)]
pub(crate) struct LedgerWrites {
    age_limit: Duration,
    retry_pause: Duration,
    /// The newest entry wanted and not sent.
    waiting: Option<Pending>,
    /// The entry being written, and when it was sent.
    in_flight: Option<(Pending, Instant)>,
    /// No write before this (after a failure).
    retry_at: Option<Instant>,
    /// The number of the newest durable entry (0: none yet).
    durable: u64,
}

impl LedgerWrites {
    /// Writes answered within `age_limit`, and `retry_pause` after a failure.
    pub(crate) fn new(age_limit: Duration, retry_pause: Duration) -> LedgerWrites {
        LedgerWrites {
            age_limit,
            retry_pause,
            waiting: None,
            in_flight: None,
            retry_at: None,
            durable: 0,
        }
    }

    /// Entry `number` (higher than any before) is wanted: it supersedes the
    /// one waiting, if any.
    pub(crate) fn want(&mut self, number: u64, entry: LedgerEntry, now: Instant) {
        debug_assert!(number > self.durable);
        // The entry in flight keeps its own time: the lag counts from the
        // older of the two while both are pending, from this one once the
        // write in flight is durable.
        let behind_since = self.waiting.take().map_or(now, |w| w.behind_since);
        self.waiting = Some(Pending {
            number,
            entry,
            behind_since,
        });
    }

    /// What to do at `now`.
    pub(crate) fn next(&mut self, now: Instant) -> Next {
        if let Some((pending, sent_at)) = &self.in_flight {
            let deadline = *sent_at + self.age_limit;
            if now < deadline {
                return Next::Wait(Some(deadline));
            }
            let number = pending.number;
            self.put_back();
            return Next::Abandon { number };
        }
        match (&self.waiting, self.retry_at) {
            (None, _) => Next::Wait(None),
            (Some(_), Some(at)) if now < at => Next::Wait(Some(at)),
            (Some(_), _) => {
                self.retry_at = None;
                let pending = self.waiting.take().expect("matched Some");
                let (number, entry) = (pending.number, pending.entry.clone());
                self.in_flight = Some((pending, now));
                Next::Send { number, entry }
            }
        }
    }

    /// Kafka acknowledged entry `number`: it is durable. Returns it when it
    /// was the write in flight (an answer to an abandoned write is not one
    /// the caller still listens to; it is ignored).
    pub(crate) fn acked(&mut self, number: u64) -> Option<LedgerEntry> {
        if self.in_flight.as_ref().map(|(p, _)| p.number) != Some(number) {
            return None;
        }
        let (pending, _) = self.in_flight.take().expect("checked");
        self.durable = number;
        Some(pending.entry)
    }

    /// The write of entry `number` failed: the newest entry goes out after
    /// the pause.
    pub(crate) fn failed(&mut self, number: u64, now: Instant) {
        if self.in_flight.as_ref().map(|(p, _)| p.number) != Some(number) {
            return;
        }
        self.put_back();
        self.retry_at = Some(now + self.retry_pause);
    }

    /// The number of the newest durable entry (0: none yet).
    pub(crate) fn durable(&self) -> u64 {
        self.durable
    }

    /// How long the ledger has not held the newest entry wanted: 0 while it
    /// does, else since the first entry it has not caught up with was
    /// wanted. A healthy write keeps it at one round trip.
    pub(crate) fn lag(&self, now: Instant) -> Duration {
        let waiting = self.waiting.as_ref().map(|w| w.behind_since);
        let in_flight = self.in_flight.as_ref().map(|(p, _)| p.behind_since);
        waiting
            .into_iter()
            .chain(in_flight)
            .min()
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }

    /// The entry in flight goes back to waiting, unless a newer one waits.
    fn put_back(&mut self) {
        let Some((pending, _)) = self.in_flight.take() else {
            return;
        };
        match &mut self.waiting {
            Some(newer) => newer.behind_since = newer.behind_since.min(pending.behind_since),
            None => self.waiting = Some(pending),
        }
    }
}

#[cfg(test)]
#[path = "writes_tests.rs"]
mod tests;
