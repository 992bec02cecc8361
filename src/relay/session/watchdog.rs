//! The producer watchdog's decision (`kafka.stuck_after`): pure, no I/O,
//! no Kafka. The session feeds it the time, since when the producer has
//! held back progress, and, once asked for, what fresh metadata said.
//!
//! A producer holds progress back from the moment the oldest record it
//! holds was sent (at-least-once) or its Kafka transaction's commit began
//! (exactly-once). Past the limit, the watchdog asks for fresh metadata.
//! When it shows a leader for every partition the relay writes, and still
//! does [`CONFIRM_AFTER`] later with the same record held, the cluster is
//! fine and the client is stuck: replace the producer now rather than wait
//! for `message.timeout.ms` (or `transaction.timeout.ms`). When it does
//! not, or no metadata comes, the cluster is what is wrong: the producer's
//! own timeouts and retries deal with that, and the watchdog looks again one
//! limit later.

use std::time::Duration;

use tokio::time::Instant;

/// How long after a first answer with every leader the watchdog asks again
/// before it calls the producer stuck. A broker that was only paused
/// answers a metadata request asked during the pause the moment it
/// resumes, a little before the producer's own requests are answered
/// (seen in `relay::faults::paused_broker…`: a replacement 12 s into a 10 s
/// pause, with 500 records that the old producer's acks were about to
/// cover). A producer that is not stuck has its acks within a round trip of
/// the cluster answering again.
pub(super) const CONFIRM_AFTER: Duration = Duration::from_secs(2);

/// What the watchdog makes of the producer now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nothing held back long enough (or the watchdog is off): nothing to do
    /// before the time given, if any.
    Fine { look_at: Option<Instant> },
    /// Held back past the limit: ask fresh metadata, then check again with
    /// its answer.
    AskLeaders,
    /// Held back past the limit while some partition has no leader (or
    /// nobody answered): the cluster's trouble, not the client's.
    ClusterTrouble,
    /// Held back `age` while every partition has a leader: replace the
    /// producer.
    Stuck { age: Duration },
}

pub(super) struct Watchdog {
    /// `kafka.stuck_after`; `None`: off.
    limit: Option<Duration>,
    /// After cluster trouble, no new look before this.
    quiet_until: Option<Instant>,
    /// When metadata first showed every leader while the producer held
    /// what it has held since the first `Instant`.
    led: Option<(Instant, Instant)>,
}

impl Watchdog {
    /// `stuck_after` zero turns it off.
    pub(super) fn new(stuck_after: Duration) -> Watchdog {
        Watchdog {
            limit: (!stuck_after.is_zero()).then_some(stuck_after),
            quiet_until: None,
            led: None,
        }
    }

    /// The verdict at `now`, for a producer that has held progress back
    /// since `holding_since` (`None`: holds nothing), and, when asked for,
    /// whether fresh metadata showed a leader for every partition
    /// (`Some(false)` also when it did not answer).
    pub(super) fn check(
        &mut self,
        now: Instant,
        holding_since: Option<Instant>,
        leaders_known: Option<bool>,
    ) -> Verdict {
        let (Some(limit), Some(since)) = (self.limit, holding_since) else {
            self.led = None;
            return Verdict::Fine { look_at: None };
        };
        // A first answer for an earlier hold says nothing about this one.
        let led_at = match self.led {
            Some((held, at)) if held == since => Some(at),
            _ => None,
        };
        let confirm_at = led_at.map(|at| at + CONFIRM_AFTER);
        let due = (since + limit)
            .max(self.quiet_until.unwrap_or(since))
            .max(confirm_at.unwrap_or(since));
        if now < due {
            return Verdict::Fine { look_at: Some(due) };
        }
        match leaders_known {
            None => Verdict::AskLeaders,
            Some(false) => {
                self.quiet_until = Some(now + limit);
                self.led = None;
                Verdict::ClusterTrouble
            }
            Some(true) if led_at.is_none() => {
                self.quiet_until = None;
                self.led = Some((since, now));
                Verdict::Fine {
                    look_at: Some(now + CONFIRM_AFTER),
                }
            }
            Some(true) => {
                self.led = None;
                Verdict::Stuck { age: now - since }
            }
        }
    }
}

/// The earlier of two holds (either may be `None`: holds nothing): a
/// producer holds progress back from the first thing it was asked for and
/// has not done.
pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Since when the oldest record with the producer has been there, sampled
/// once per turn of the loop: keeping the time each record was sent would
/// cost a clock read per event on the hot path. A record that becomes the
/// oldest is timed from the turn that first saw it so, at most one turn
/// late, or later when the record before it was acknowledged after a long
/// wait: the age is never overstated, and a record that is really stuck
/// stays the oldest.
#[derive(Debug, Default)]
pub(super) struct OldestSample {
    seen: Option<(u64, Instant)>,
}

impl OldestSample {
    /// `oldest`, the delivery id of the oldest record the producer holds,
    /// seen at `now`: since when it has been the oldest.
    pub(super) fn observe(&mut self, now: Instant, oldest: Option<u64>) -> Option<Instant> {
        let Some(id) = oldest else {
            self.seen = None;
            return None;
        };
        match self.seen {
            Some((seen, since)) if seen == id => Some(since),
            _ => {
                self.seen = Some((id, now));
                Some(now)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(10);

    #[test]
    fn off_or_idle_is_always_fine() {
        let now = Instant::now();
        let mut off = Watchdog::new(Duration::ZERO);
        let long_ago = now - Duration::from_secs(600);
        let fine = Verdict::Fine { look_at: None };
        assert_eq!(off.check(now, Some(long_ago), Some(true)), fine);
        let mut on = Watchdog::new(LIMIT);
        assert_eq!(on.check(now, None, Some(true)), fine);
    }

    #[test]
    fn under_the_limit_it_names_when_to_look_again() {
        let now = Instant::now();
        let mut w = Watchdog::new(LIMIT);
        let since = now - Duration::from_secs(4);
        assert_eq!(
            w.check(now, Some(since), None),
            Verdict::Fine {
                look_at: Some(since + LIMIT)
            }
        );
        // Even with metadata at hand, nothing is judged before the limit.
        assert!(matches!(
            w.check(now, Some(since), Some(true)),
            Verdict::Fine { .. }
        ));
    }

    /// Asks, hears "every leader", and asks again `CONFIRM_AFTER` later.
    fn led_twice(w: &mut Watchdog, now: Instant, since: Instant) -> Verdict {
        assert_eq!(w.check(now, Some(since), None), Verdict::AskLeaders);
        assert_eq!(
            w.check(now, Some(since), Some(true)),
            Verdict::Fine {
                look_at: Some(now + CONFIRM_AFTER)
            }
        );
        let later = now + CONFIRM_AFTER;
        assert_eq!(w.check(later, Some(since), None), Verdict::AskLeaders);
        w.check(later, Some(since), Some(true))
    }

    #[test]
    fn past_the_limit_it_replaces_only_when_every_leader_is_seen_twice() {
        let now = Instant::now();
        let mut w = Watchdog::new(LIMIT);
        let since = now - Duration::from_secs(12);
        assert_eq!(
            led_twice(&mut w, now, since),
            Verdict::Stuck {
                age: Duration::from_secs(12) + CONFIRM_AFTER
            }
        );
    }

    #[test]
    fn an_ack_between_the_two_answers_starts_over() {
        let now = Instant::now();
        let mut w = Watchdog::new(LIMIT);
        let since = now - Duration::from_secs(12);
        assert_eq!(w.check(now, Some(since), None), Verdict::AskLeaders);
        assert!(matches!(
            w.check(now, Some(since), Some(true)),
            Verdict::Fine { .. }
        ));
        // The held record was acked; the next one has been held for 11 s.
        let later = now + CONFIRM_AFTER;
        let next = later - Duration::from_secs(11);
        assert_eq!(w.check(later, Some(next), None), Verdict::AskLeaders);
        assert!(matches!(
            w.check(later, Some(next), Some(true)),
            Verdict::Fine { .. }
        ));
    }

    #[test]
    fn cluster_trouble_between_the_two_answers_starts_over() {
        let now = Instant::now();
        let mut w = Watchdog::new(LIMIT);
        let since = now - Duration::from_secs(12);
        assert_eq!(w.check(now, Some(since), None), Verdict::AskLeaders);
        assert!(matches!(
            w.check(now, Some(since), Some(true)),
            Verdict::Fine { .. }
        ));
        let later = now + CONFIRM_AFTER;
        assert_eq!(
            w.check(later, Some(since), Some(false)),
            Verdict::ClusterTrouble
        );
        let after = later + LIMIT;
        assert_eq!(w.check(after, Some(since), None), Verdict::AskLeaders);
        assert!(matches!(
            w.check(after, Some(since), Some(true)),
            Verdict::Fine { .. }
        ));
    }

    #[test]
    fn cluster_trouble_waits_one_limit_before_looking_again() {
        let now = Instant::now();
        let mut w = Watchdog::new(LIMIT);
        let since = now - Duration::from_secs(11);
        assert_eq!(w.check(now, Some(since), None), Verdict::AskLeaders);
        assert_eq!(
            w.check(now, Some(since), Some(false)),
            Verdict::ClusterTrouble
        );
        let soon = now + Duration::from_secs(3);
        assert_eq!(
            w.check(soon, Some(since), None),
            Verdict::Fine {
                look_at: Some(now + LIMIT)
            }
        );
        let later = now + LIMIT;
        assert_eq!(
            led_twice(&mut w, later, since),
            Verdict::Stuck {
                age: Duration::from_secs(21) + CONFIRM_AFTER
            }
        );
        // A replacement ends the quiet time: the next producer is judged
        // from its own records.
        let next = later + CONFIRM_AFTER + Duration::from_secs(1);
        assert_eq!(
            w.check(next, Some(next), None),
            Verdict::Fine {
                look_at: Some(next + LIMIT)
            }
        );
    }

    #[test]
    fn two_holds_count_from_the_earlier() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(earliest(None, None), None);
        assert_eq!(earliest(Some(t1), None), Some(t1));
        assert_eq!(earliest(None, Some(t1)), Some(t1));
        assert_eq!(earliest(Some(t1), Some(t0)), Some(t0));
        assert_eq!(earliest(Some(t0), Some(t1)), Some(t0));
    }

    #[test]
    fn the_oldest_is_timed_from_the_turn_that_first_saw_it() {
        let t0 = Instant::now();
        let mut s = OldestSample::default();
        assert_eq!(s.observe(t0, None), None);
        assert_eq!(s.observe(t0, Some(7)), Some(t0));
        let t1 = t0 + Duration::from_secs(3);
        assert_eq!(s.observe(t1, Some(7)), Some(t0), "still the same record");
        assert_eq!(s.observe(t1, Some(8)), Some(t1), "the next one, from now");
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(s.observe(t2, None), None, "nothing held");
        assert_eq!(s.observe(t2, Some(8)), Some(t2));
    }
}
