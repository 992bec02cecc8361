//! How long what may be confirmed waits to be confirmed: the time the
//! oldest position the consumer called confirmable (acked by Kafka, in
//! exactly-once committed with its ledger entry, or an idle keepalive) has
//! waited for a status update to carry it. The table watch's ceiling and
//! the least gap between status updates are what it measures; a `kill -9`
//! repeats what was acked within it.
//!
//! Positions are kept with the time they became confirmable, at most one
//! per [`GRAIN`]: a later position within the grain joins the entry before
//! it, so the lag reads at most a grain long, never short. Past
//! [`MAX_WAITING`] entries (a confirmation stalled for minutes) every new
//! position joins the last entry: the oldest, which is what the lag
//! reports, stays exact.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::Lsn;

/// Positions confirmable within this of an entry join it: under load the
/// consumer confirms after every ack burst, and one entry per status gap
/// (100 ms) is all the precision a lag in seconds needs.
const GRAIN: Duration = Duration::from_millis(100);

/// Entries kept: 100 s of a steady flow at one per [`GRAIN`].
const MAX_WAITING: usize = 1000;

#[derive(Debug, Default)]
pub(crate) struct ConfirmationLag {
    /// Confirmable positions above the confirmed one, ascending, each with
    /// when it (or the first position that joined the entry) became
    /// confirmable.
    waiting: VecDeque<(Lsn, Instant)>,
    confirmed: Lsn,
}

impl ConfirmationLag {
    /// Everything up to `lsn` is confirmable as of `now`.
    pub(crate) fn confirmable(&mut self, lsn: Lsn, now: Instant) {
        if lsn <= self.confirmed {
            return;
        }
        let full = self.waiting.len() >= MAX_WAITING;
        match self.waiting.back_mut() {
            Some((last, _)) if lsn <= *last => {}
            Some((last, since)) if full || now.saturating_duration_since(*since) < GRAIN => {
                *last = lsn
            }
            _ => self.waiting.push_back((lsn, now)),
        }
    }

    /// A status update confirmed everything up to `lsn`.
    pub(crate) fn confirmed(&mut self, lsn: Lsn) {
        self.confirmed = self.confirmed.max(lsn);
        while self.waiting.front().is_some_and(|(l, _)| *l <= lsn) {
            self.waiting.pop_front();
        }
    }

    /// How long the oldest unconfirmed position has waited; zero when
    /// everything confirmable is confirmed.
    pub(crate) fn lag(&self, now: Instant) -> Duration {
        self.waiting.front().map_or(Duration::ZERO, |(_, since)| {
            now.saturating_duration_since(*since)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_lag_is_the_wait_of_the_oldest_unconfirmed_position() {
        let t0 = Instant::now();
        let mut lag = ConfirmationLag::default();
        assert_eq!(lag.lag(t0), Duration::ZERO);
        lag.confirmable(Lsn(100), t0);
        lag.confirmable(Lsn(200), t0 + ms(300));
        assert_eq!(lag.lag(t0 + ms(500)), ms(500));
        // Part confirmed: the wait of what is left counts from when it
        // became confirmable, not from the first.
        lag.confirmed(Lsn(150));
        assert_eq!(lag.lag(t0 + ms(500)), ms(200));
        lag.confirmed(Lsn(200));
        assert_eq!(lag.lag(t0 + ms(500)), Duration::ZERO);
        // Confirmable at or below the confirmed position: nothing waits.
        lag.confirmable(Lsn(200), t0 + ms(600));
        assert_eq!(lag.lag(t0 + ms(700)), Duration::ZERO);
    }

    #[test]
    fn positions_within_a_grain_join_the_entry_before_them_and_never_read_short() {
        let t0 = Instant::now();
        let mut lag = ConfirmationLag::default();
        lag.confirmable(Lsn(100), t0);
        lag.confirmable(Lsn(150), t0 + ms(50));
        assert_eq!(lag.waiting.len(), 1);
        lag.confirmed(Lsn(120));
        // 150 became confirmable at 50 ms; read from the entry's 0 ms.
        assert_eq!(lag.lag(t0 + ms(200)), ms(200));
        lag.confirmed(Lsn(150));
        assert_eq!(lag.lag(t0 + ms(200)), Duration::ZERO);
    }

    #[test]
    fn a_long_stall_keeps_the_oldest_entry_exact_and_the_memory_bounded() {
        let t0 = Instant::now();
        let mut lag = ConfirmationLag::default();
        for i in 0..5 * MAX_WAITING as u64 {
            lag.confirmable(Lsn(100 + i), t0 + GRAIN * (i as u32));
        }
        assert_eq!(lag.waiting.len(), MAX_WAITING);
        let now = t0 + GRAIN * (5 * MAX_WAITING as u32);
        assert_eq!(lag.lag(now), now - t0);
    }
}
