use std::time::{Duration, Instant};

use super::{LedgerWrites, Next};
use crate::progress::ledger::{LedgerEntry, LedgerIdentity, LedgerWriter};
use crate::Lsn;

const SEC: Duration = Duration::from_secs(1);
const AGE_LIMIT: Duration = Duration::from_secs(5);

fn entry(lsn: u64) -> LedgerEntry {
    let identity = LedgerIdentity {
        system_identifier: "1".into(),
        database: "app".into(),
        slot: "s".into(),
    };
    LedgerWriter::new(identity, 1, SEC, None)
        .flush(Lsn(lsn), 0)
        .unwrap()
}

fn writes() -> LedgerWrites {
    LedgerWrites::new(AGE_LIMIT, SEC)
}

/// The LSN of the entry `next` says to send, if it says to send one.
fn sends(w: &mut LedgerWrites, now: Instant) -> Option<(u64, Lsn)> {
    match w.next(now) {
        Next::Send { number, entry } => Some((number, entry.confirmed_lsn)),
        _ => None,
    }
}

#[test]
fn one_write_at_a_time_and_the_newest_waiting_entry_supersedes_the_others() {
    let t0 = Instant::now();
    let mut w = writes();
    assert_eq!(w.next(t0), Next::Wait(None), "nothing wanted");
    w.want(1, entry(100), t0);
    assert_eq!(sends(&mut w, t0), Some((1, Lsn(100))));
    w.want(2, entry(200), t0 + SEC);
    w.want(3, entry(300), t0 + 2 * SEC);
    assert_eq!(
        w.next(t0 + 2 * SEC),
        Next::Wait(Some(t0 + AGE_LIMIT)),
        "nothing else while a write is in flight"
    );
    assert_eq!(w.acked(1).map(|e| e.confirmed_lsn), Some(Lsn(100)));
    assert_eq!(w.durable(), 1);
    assert_eq!(
        sends(&mut w, t0 + 2 * SEC),
        Some((3, Lsn(300))),
        "entry 2 was superseded"
    );
    assert_eq!(w.acked(3).map(|e| e.confirmed_lsn), Some(Lsn(300)));
    assert_eq!(w.next(t0 + 3 * SEC), Next::Wait(None));
}

#[test]
fn a_write_past_the_age_limit_is_abandoned_for_the_newest_entry() {
    let t0 = Instant::now();
    let mut w = writes();
    w.want(1, entry(100), t0);
    sends(&mut w, t0).unwrap();
    w.want(2, entry(200), t0 + SEC);
    assert!(matches!(w.next(t0 + AGE_LIMIT - SEC), Next::Wait(Some(_))));
    assert_eq!(w.next(t0 + AGE_LIMIT), Next::Abandon { number: 1 });
    // On the new producer at once: no pause after an abandoned write.
    assert_eq!(sends(&mut w, t0 + AGE_LIMIT), Some((2, Lsn(200))));
    assert_eq!(w.acked(1), None, "an abandoned write's answer is ignored");
    assert_eq!(w.durable(), 0);
    assert!(w.acked(2).is_some());
    assert_eq!(w.durable(), 2);
}

#[test]
fn an_abandoned_write_with_nothing_newer_is_sent_again() {
    let t0 = Instant::now();
    let mut w = writes();
    w.want(1, entry(100), t0);
    sends(&mut w, t0).unwrap();
    assert_eq!(w.next(t0 + AGE_LIMIT), Next::Abandon { number: 1 });
    assert_eq!(sends(&mut w, t0 + AGE_LIMIT), Some((1, Lsn(100))));
    // The second attempt gets an age limit of its own.
    assert_eq!(
        w.next(t0 + AGE_LIMIT + SEC),
        Next::Wait(Some(t0 + 2 * AGE_LIMIT))
    );
}

#[test]
fn a_failed_write_pauses_then_sends_the_newest_entry() {
    let t0 = Instant::now();
    let mut w = writes();
    w.want(1, entry(100), t0);
    sends(&mut w, t0).unwrap();
    w.failed(1, t0 + SEC);
    assert_eq!(
        w.next(t0 + SEC),
        Next::Wait(Some(t0 + 2 * SEC)),
        "the pause"
    );
    w.want(2, entry(200), t0 + SEC);
    assert_eq!(
        w.next(t0 + SEC),
        Next::Wait(Some(t0 + 2 * SEC)),
        "a newer entry does not cut the pause short"
    );
    assert_eq!(sends(&mut w, t0 + 2 * SEC), Some((2, Lsn(200))));
    w.failed(2, t0 + 3 * SEC);
    assert_eq!(
        sends(&mut w, t0 + 4 * SEC),
        Some((2, Lsn(200))),
        "the same entry again when nothing newer came"
    );
    w.failed(1, t0 + 4 * SEC);
    assert!(
        matches!(w.next(t0 + 4 * SEC), Next::Wait(Some(_))),
        "a failure of a write not in flight changes nothing"
    );
}

#[test]
fn the_lag_counts_from_the_first_entry_the_ledger_has_not_caught_up_with() {
    let t0 = Instant::now();
    let mut w = writes();
    assert_eq!(w.lag(t0), Duration::ZERO);
    w.want(1, entry(100), t0);
    sends(&mut w, t0).unwrap();
    assert_eq!(w.lag(t0 + SEC), SEC);
    w.want(2, entry(200), t0 + 2 * SEC);
    assert_eq!(w.lag(t0 + 3 * SEC), 3 * SEC, "behind since entry 1");
    // Entry 1 durable: behind only since entry 2 was wanted.
    w.acked(1).unwrap();
    assert_eq!(w.lag(t0 + 3 * SEC), SEC);
    // A stuck write: the lag grows on, through the abandonment and the
    // entries that supersede the stuck one.
    sends(&mut w, t0 + 3 * SEC).unwrap();
    w.want(3, entry(300), t0 + 4 * SEC);
    assert_eq!(w.next(t0 + 8 * SEC), Next::Abandon { number: 2 });
    assert_eq!(w.lag(t0 + 8 * SEC), 6 * SEC);
    assert_eq!(sends(&mut w, t0 + 8 * SEC), Some((3, Lsn(300))));
    w.acked(3).unwrap();
    assert_eq!(w.lag(t0 + 9 * SEC), Duration::ZERO, "caught up");
}

/// Whatever happens to the writes, an entry sent is never older than one
/// sent before it, and the newest entry wanted is eventually durable once
/// writes succeed again.
#[test]
fn writes_never_go_back_and_the_newest_entry_lands() {
    let t0 = Instant::now();
    let mut w = writes();
    let mut now = t0;
    let mut sent: Vec<u64> = Vec::new();
    let mut wanted = 0u64;
    // A fixed mix of wants, answers and clock steps, including stuck writes.
    for step in 0..400u64 {
        now += Duration::from_millis(700);
        if step % 3 == 0 {
            wanted += 1;
            w.want(wanted, entry(wanted * 10), now);
        }
        match w.next(now) {
            Next::Send { number, .. } => sent.push(number),
            Next::Abandon { .. } | Next::Wait(_) => {}
        }
        if let Some(&last) = sent.last() {
            match step % 7 {
                0 | 1 => {
                    w.acked(last);
                }
                2 => w.failed(last, now),
                _ => {} // no answer: stuck until the age limit
            }
        }
    }
    assert!(sent.windows(2).all(|p| p[0] <= p[1]), "{sent:?}");
    for _ in 0..20 {
        now += AGE_LIMIT;
        if let Next::Send { number, .. } = w.next(now) {
            w.acked(number);
        }
    }
    assert_eq!(w.durable(), wanted);
    assert_eq!(w.lag(now), Duration::ZERO);
}

mod properties {
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Want,
        Tick { ms: u64 },
        Ack,
        Fail,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Want),
            4 => (0u64..3000).prop_map(|ms| Op::Tick { ms }),
            3 => Just(Op::Ack),
            1 => Just(Op::Fail),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
            ..ProptestConfig::default()
        })]

        /// Entries go out in the order they were wanted (a write again
        /// only after its failure or abandonment), never one older than a
        /// durable one; a write never stays in flight past the age limit;
        /// and once writes answer, the newest entry wanted is durable and
        /// the lag is 0.
        #[test]
        fn writes_keep_order_respect_the_age_limit_and_catch_up(
            ops in proptest::collection::vec(op(), 1..200)
        ) {
            let t0 = Instant::now();
            let mut w = writes();
            let (mut now, mut wanted) = (t0, 0u64);
            let mut in_flight: Option<(u64, Instant)> = None;
            let mut last_sent = 0u64;
            for op in ops {
                match op {
                    Op::Want => {
                        wanted += 1;
                        w.want(wanted, entry(wanted * 10), now);
                    }
                    Op::Tick { ms } => now += Duration::from_millis(ms),
                    Op::Ack => {
                        if let Some((number, _)) = in_flight.take() {
                            let e = w.acked(number).expect("the write in flight");
                            prop_assert_eq!(e.confirmed_lsn, Lsn(number * 10));
                            prop_assert_eq!(w.durable(), number);
                        }
                    }
                    Op::Fail => {
                        if let Some((number, _)) = in_flight.take() {
                            w.failed(number, now);
                        }
                    }
                }
                loop {
                    match w.next(now) {
                        Next::Send { number, entry } => {
                            prop_assert!(in_flight.is_none(), "two writes in flight");
                            prop_assert!(number >= last_sent && number > w.durable());
                            prop_assert_eq!(entry.confirmed_lsn, Lsn(number * 10));
                            last_sent = number;
                            in_flight = Some((number, now));
                        }
                        Next::Abandon { number } => {
                            let (n, sent_at) = in_flight.take().expect("a write to abandon");
                            prop_assert_eq!(n, number);
                            prop_assert!(now >= sent_at + AGE_LIMIT);
                        }
                        Next::Wait(until) => {
                            if let Some((_, sent_at)) = in_flight {
                                prop_assert_eq!(until, Some(sent_at + AGE_LIMIT));
                            }
                            break;
                        }
                    }
                }
            }
            // From now on every write is acknowledged.
            for _ in 0..4 {
                if let Some((number, _)) = in_flight.take() {
                    w.acked(number);
                }
                now += AGE_LIMIT;
                if let Next::Send { number, .. } = w.next(now) {
                    in_flight = Some((number, now));
                }
            }
            prop_assert_eq!(w.durable(), wanted);
            prop_assert_eq!(w.lag(now), Duration::ZERO);
        }
    }
}
