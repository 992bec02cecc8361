//! One test per rule of the ack tracker; the model-based proptest is in
//! `model_tests.rs`.

use super::tracker::{AckTracker, DeliveryId, TrackerError};
use crate::Lsn;

fn lsn(n: u64) -> Lsn {
    Lsn(n)
}

/// Pushes a transaction with `events` events ending at `end`; returns the ids.
fn txn(t: &mut AckTracker, events: usize, end: u64) -> Vec<DeliveryId> {
    let ids = (0..events).map(|_| t.push_event(0)).collect();
    t.commit(lsn(end));
    ids
}

#[test]
fn starts_idle_at_the_start_lsn() {
    let t = AckTracker::<()>::new(lsn(100));
    assert_eq!(t.confirmable(), lsn(100));
    assert_eq!(t.last_checkpoint_lsn(), lsn(100));
    assert_eq!(t.pending_checkpoint_lsn(), None);
    assert_eq!((t.in_flight(), t.in_flight_bytes()), (0, 0));
    assert_eq!(t.oldest_unacked(), None);
    assert!(t.is_idle() && !t.is_failed());
}

#[test]
fn ids_increase_by_one() {
    let mut t = AckTracker::<()>::with_capacity(lsn(0), 4);
    let ids: Vec<u64> = (0..5).map(|_| t.push_event(1).get()).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4]);
}

#[test]
fn in_order_acks_confirm_each_commit() {
    let mut t = AckTracker::<()>::new(lsn(1));
    let a = txn(&mut t, 2, 10);
    let b = txn(&mut t, 1, 20);
    assert_eq!(t.pending_checkpoint_lsn(), Some(lsn(10)));
    t.ack(a[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(1), "txn 1 still has an unacked event");
    t.ack(a[1]).unwrap();
    assert_eq!(t.confirmable(), lsn(10));
    assert_eq!(t.pending_checkpoint_lsn(), Some(lsn(20)));
    t.ack(b[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(20));
    assert!(t.is_idle());
}

#[test]
fn out_of_order_acks_within_a_transaction() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 3, 10);
    t.ack(a[2]).unwrap();
    t.ack(a[1]).unwrap();
    assert_eq!(t.confirmable(), lsn(0));
    assert_eq!(t.oldest_unacked(), Some(a[0]));
    t.ack(a[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(10));
    assert_eq!(t.oldest_unacked(), None);
}

#[test]
fn later_transaction_acked_first_waits_for_the_earlier_one() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 10);
    let b = txn(&mut t, 2, 20);
    // The last event of txn 2 before anything of txn 1.
    t.ack(b[1]).unwrap();
    t.ack(b[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(0));
    assert_eq!(t.pending_checkpoint_lsn(), Some(lsn(10)));
    t.ack(a[0]).unwrap();
    assert_eq!(
        t.confirmable(),
        lsn(20),
        "both commits become confirmable at once"
    );
}

#[test]
fn ack_of_middle_transaction_moves_only_up_to_the_gap() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 10);
    let b = txn(&mut t, 1, 20);
    let c = txn(&mut t, 1, 30);
    t.ack(a[0]).unwrap();
    t.ack(c[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(10), "txn 2 is unacked: 20 and 30 wait");
    t.ack(b[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(30));
}

#[test]
fn transaction_without_events_is_confirmable_at_once_when_idle() {
    let mut t = AckTracker::<()>::new(lsn(5));
    t.commit(lsn(10));
    assert_eq!(t.confirmable(), lsn(10));
    assert!(t.is_idle());
}

#[test]
fn transaction_without_events_waits_behind_pending_ones() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 10);
    t.commit(lsn(15)); // no events
    let b = txn(&mut t, 1, 20);
    t.commit(lsn(25)); // no events
    t.commit(lsn(26)); // no events
    assert_eq!(t.confirmable(), lsn(0));
    t.ack(a[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(15));
    // The two event-less commits after txn 2 were coalesced into the higher.
    assert_eq!(t.pending_checkpoint_lsn(), Some(lsn(26)));
    t.ack(b[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(26));
}

#[test]
fn keepalive_while_idle_is_confirmable_at_once() {
    let mut t = AckTracker::<()>::new(lsn(0));
    t.keepalive(lsn(40));
    assert_eq!(t.confirmable(), lsn(40));
    assert_eq!(t.last_checkpoint_lsn(), lsn(40));
}

#[test]
fn keepalive_while_events_pending_waits_for_their_acks() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 2, 10);
    t.keepalive(lsn(30));
    assert_eq!(t.confirmable(), lsn(0));
    assert_eq!(t.last_checkpoint_lsn(), lsn(30));
    t.ack(a[1]).unwrap();
    assert_eq!(t.confirmable(), lsn(0));
    t.ack(a[0]).unwrap();
    assert_eq!(
        t.confirmable(),
        lsn(30),
        "skips to the keepalive past the commit"
    );
}

#[test]
fn keepalive_inside_an_open_transaction_is_ignored() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = t.push_event(0);
    t.keepalive(lsn(30)); // caller contract broken: a transaction is open
    assert_eq!(t.last_checkpoint_lsn(), lsn(0));
    t.ack(a).unwrap();
    assert_eq!(
        t.confirmable(),
        lsn(0),
        "a position inside a transaction is not a checkpoint"
    );
    t.commit(lsn(40));
    assert_eq!(t.confirmable(), lsn(40));
    t.keepalive(lsn(50)); // the transaction is closed again
    assert_eq!(t.confirmable(), lsn(50));
}

#[test]
fn keepalive_not_above_the_last_checkpoint_is_ignored() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 50);
    t.keepalive(lsn(40));
    t.keepalive(lsn(50));
    assert_eq!(t.last_checkpoint_lsn(), lsn(50));
    assert_eq!(t.pending_checkpoint_lsn(), Some(lsn(50)));
    t.ack(a[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(50));
    t.keepalive(lsn(45));
    assert_eq!(t.confirmable(), lsn(50));
}

#[test]
fn lower_checkpoints_never_lower_progress() {
    let mut t = AckTracker::<()>::new(lsn(100));
    t.commit(lsn(50));
    assert_eq!(t.confirmable(), lsn(100), "below the start");
    t.commit(lsn(200));
    t.commit(lsn(150));
    t.commit(lsn(200));
    assert_eq!(t.confirmable(), lsn(200));
    assert_eq!(t.last_checkpoint_lsn(), lsn(200));
    assert!(t.is_idle(), "ignored checkpoints are not queued");
}

#[test]
fn failure_freezes_progress() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 10);
    let b = txn(&mut t, 1, 20);
    t.ack(a[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(10));
    t.fail(b[0]).unwrap();
    assert!(t.is_failed());
    assert_eq!(t.failed_delivery(), Some(b[0]));
    // Nothing moves it any more: later checkpoints, keepalives, acks.
    t.commit(lsn(30));
    t.keepalive(lsn(40));
    let c = t.push_event(0);
    t.commit(lsn(50));
    t.ack(c).unwrap();
    assert_eq!(t.confirmable(), lsn(10));
    assert!(!t.is_idle());
}

#[test]
fn failure_of_an_earlier_delivery_blocks_acked_later_ones() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 10);
    let b = txn(&mut t, 1, 20);
    t.ack(b[0]).unwrap();
    t.fail(a[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(0));
}

#[test]
fn reports_after_a_failure_are_ignored() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 3, 10);
    t.ack(a[0]).unwrap();
    t.fail(a[1]).unwrap();
    // Duplicates, unknown ids and further failures all return Ok, change nothing.
    t.ack(a[0]).unwrap();
    t.ack(a[2]).unwrap();
    t.ack(DeliveryId::from_raw(99)).unwrap();
    t.fail(a[2]).unwrap();
    assert_eq!(t.failed_delivery(), Some(a[1]), "the first failure is kept");
    assert_eq!(t.in_flight(), 2, "counters stay as at the failure");
    assert_eq!(t.oldest_unacked(), Some(a[1]));
    assert_eq!(t.confirmable(), lsn(0));
}

#[test]
fn reset_starts_over() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 2, 10);
    t.fail(a[0]).unwrap();
    t.reset(lsn(5));
    assert_eq!(t.confirmable(), lsn(5));
    assert_eq!(t.last_checkpoint_lsn(), lsn(5));
    assert_eq!((t.in_flight(), t.in_flight_bytes()), (0, 0));
    assert_eq!(
        (t.oldest_unacked(), t.pending_checkpoint_lsn()),
        (None, None)
    );
    assert!(t.is_idle() && !t.is_failed());
    assert_eq!(t.failed_delivery(), None);

    let b = txn(&mut t, 1, 10);
    assert!(b[0] > a[1], "ids keep increasing across resets");
    t.ack(b[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(10));
}

#[test]
fn reset_may_go_below_the_previous_progress() {
    let mut t = AckTracker::<()>::new(lsn(0));
    t.commit(lsn(100));
    t.reset(lsn(60)); // the slot never got 100: it is the only offset that counts
    assert_eq!(t.confirmable(), lsn(60));
    t.commit(lsn(80));
    assert_eq!(t.confirmable(), lsn(80));
}

#[test]
fn reset_drops_an_open_transaction() {
    let mut t = AckTracker::<()>::new(lsn(0));
    t.push_event(0);
    t.reset(lsn(0));
    t.keepalive(lsn(30));
    assert_eq!(
        t.confirmable(),
        lsn(30),
        "no transaction is open after a reset"
    );
}

#[test]
fn reports_from_before_a_reset_are_stale() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 2, 10);
    t.ack(a[0]).unwrap();
    t.reset(lsn(0));
    let b = txn(&mut t, 1, 20);
    assert_eq!(t.ack(a[0]), Err(TrackerError::Stale(a[0])));
    assert_eq!(t.ack(a[1]), Err(TrackerError::Stale(a[1])));
    assert_eq!(t.fail(a[1]), Err(TrackerError::Stale(a[1])));
    assert!(
        !t.is_failed(),
        "a stale failure does not poison the new epoch"
    );
    t.ack(b[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(20));
}

#[test]
fn duplicate_acks_are_errors_and_change_nothing() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 2, 10);
    let b = txn(&mut t, 1, 20);
    // Acked but still queued (behind the unacked a[0]).
    t.ack(a[1]).unwrap();
    assert_eq!(t.ack(a[1]), Err(TrackerError::AlreadyAcked(a[1])));
    // Acked and popped.
    t.ack(a[0]).unwrap();
    assert_eq!(t.ack(a[0]), Err(TrackerError::AlreadyAcked(a[0])));
    assert_eq!(t.in_flight(), 1);
    assert_eq!(t.confirmable(), lsn(10));
    t.ack(b[0]).unwrap();
    assert_eq!(t.ack(b[0]), Err(TrackerError::AlreadyAcked(b[0])));
    assert_eq!(t.confirmable(), lsn(20));
    assert!(!t.is_failed());
}

#[test]
fn unknown_acks_are_errors_and_change_nothing() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 10);
    let unknown = DeliveryId::from_raw(a[0].get() + 1);
    assert_eq!(t.ack(unknown), Err(TrackerError::Unknown(unknown)));
    assert_eq!(
        t.ack(DeliveryId::from_raw(u64::MAX)),
        Err(TrackerError::Unknown(DeliveryId::from_raw(u64::MAX)))
    );
    assert_eq!(t.in_flight(), 1);
    assert!(!t.is_failed());
    // The next push gets the id that was unknown a moment ago.
    assert_eq!(t.push_event(0), unknown);
}

#[test]
fn failing_an_unmatched_id_poisons_and_reports() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 10);
    let unknown = DeliveryId::from_raw(7);
    assert_eq!(t.fail(unknown), Err(TrackerError::Unknown(unknown)));
    assert!(t.is_failed());
    t.ack(a[0]).unwrap();
    assert_eq!(t.confirmable(), lsn(0));

    let mut t = AckTracker::<()>::new(lsn(0));
    let a = txn(&mut t, 1, 10);
    t.ack(a[0]).unwrap();
    assert_eq!(t.fail(a[0]), Err(TrackerError::AlreadyAcked(a[0])));
    assert!(t.is_failed());
    t.commit(lsn(20));
    assert_eq!(
        t.confirmable(),
        lsn(10),
        "progress made before the failure stays"
    );
}

#[test]
fn byte_accounting_follows_acks_in_any_order() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let a = t.push_event(100);
    let b = t.push_event(20);
    let c = t.push_event(3);
    t.commit(lsn(10));
    assert_eq!((t.in_flight(), t.in_flight_bytes()), (3, 123));
    t.ack(b).unwrap();
    assert_eq!((t.in_flight(), t.in_flight_bytes()), (2, 103));
    assert_eq!(t.ack(b), Err(TrackerError::AlreadyAcked(b)));
    assert_eq!(
        t.in_flight_bytes(),
        103,
        "a rejected ack does not count twice"
    );
    t.ack(a).unwrap();
    assert_eq!((t.in_flight(), t.in_flight_bytes()), (1, 3));
    assert_eq!(t.oldest_unacked(), Some(c));
    t.ack(c).unwrap();
    assert_eq!((t.in_flight(), t.in_flight_bytes()), (0, 0));
}

#[test]
fn oldest_unacked_skips_acked_deliveries() {
    let mut t = AckTracker::<()>::new(lsn(0));
    let ids = txn(&mut t, 4, 10);
    t.ack(ids[1]).unwrap();
    t.ack(ids[2]).unwrap();
    assert_eq!(t.oldest_unacked(), Some(ids[0]));
    t.ack(ids[0]).unwrap();
    assert_eq!(t.oldest_unacked(), Some(ids[3]));
}

#[test]
fn many_transactions_with_windowed_reverse_acks() {
    // 10k transactions of 10 events, acked newest-first within windows of 64
    // deliveries: exercises deque growth, popping and checkpoint draining.
    let mut t = AckTracker::<()>::new(lsn(0));
    let mut window = Vec::with_capacity(64);
    for n in 1..=10_000u64 {
        for _ in 0..10 {
            window.push(t.push_event(1));
            if window.len() == 64 {
                for id in window.drain(..).rev() {
                    t.ack(id).unwrap();
                }
            }
        }
        t.commit(lsn(n * 100));
        assert!(t.confirmable() < lsn(n * 100) || t.in_flight() == 0);
    }
    for id in window.drain(..).rev() {
        t.ack(id).unwrap();
    }
    assert_eq!(t.confirmable(), lsn(1_000_000));
    assert!(t.is_idle());
}

#[test]
fn errors_and_ids_display_readably() {
    let id = DeliveryId::from_raw(42);
    assert_eq!(id.to_string(), "#42");
    assert_eq!(
        TrackerError::Unknown(id).to_string(),
        "delivery #42 was never issued"
    );
    assert_eq!(
        TrackerError::AlreadyAcked(id).to_string(),
        "delivery #42 was already acked"
    );
    assert_eq!(
        TrackerError::Stale(id).to_string(),
        "delivery #42 was dropped by a reset"
    );
}

#[test]
fn keeps_what_was_sent_until_its_report() {
    let mut t: AckTracker<&str> = AckTracker::new(lsn(0));
    let a = t.push_event(1);
    let b = t.push_event(1);
    t.commit(lsn(10));
    assert_eq!(t.sent(a, "a"), Ok(()));
    assert_eq!(t.sent(b, "b"), Ok(()));
    assert!(t.is_sent(a) && t.is_sent(b));
    assert_eq!(t.sent_count(), 2);
    // A report takes it back; the slot stays until acked.
    assert_eq!(t.take_sent(b.get()), Some("b"));
    assert_eq!(t.take_sent(b.get()), None);
    assert!(!t.is_sent(b));
    assert_eq!((t.sent_count(), t.in_flight()), (1, 2));
    t.ack(b).unwrap();
    // Acking drops what is still kept.
    t.ack(a).unwrap();
    assert_eq!((t.sent_count(), t.confirmable()), (0, lsn(10)));
    // Not pending: handed back.
    assert_eq!(t.sent(a, "again"), Err("again"));
    assert_eq!(t.take_sent(99), None);
}

#[test]
fn takes_back_everything_sent_in_id_order() {
    let mut t: AckTracker<u64> = AckTracker::new(lsn(0));
    let ids: Vec<_> = (0..4).map(|_| t.push_event(1)).collect();
    for id in [ids[2], ids[0], ids[3]] {
        t.sent(id, id.get()).unwrap();
    }
    assert_eq!(t.take_all_sent(), [0, 2, 3]);
    assert_eq!((t.sent_count(), t.in_flight()), (0, 4));
    // A reset drops what was kept with the slots.
    t.sent(ids[1], 1).unwrap();
    t.reset(lsn(0));
    assert_eq!(t.sent_count(), 0);
}

#[test]
fn the_oldest_sent_is_the_lowest_id_the_producer_still_holds() {
    let mut t: AckTracker<u64> = AckTracker::new(lsn(0));
    assert!(t.oldest_sent().is_none());
    let ids: Vec<_> = (0..4).map(|_| t.push_event(1)).collect();
    // The first is not with the producer (waiting to be sent again).
    for id in [ids[2], ids[1], ids[3]] {
        t.sent(id, id.get()).unwrap();
    }
    assert_eq!(t.oldest_sent(), Some((ids[1], &1)));
    assert_eq!(t.iter_sent().copied().collect::<Vec<_>>(), [1, 2, 3]);
    // Reported: no longer held, the next one is the oldest.
    t.take_sent(ids[1].get());
    t.ack(ids[1]).unwrap();
    assert_eq!(t.oldest_sent(), Some((ids[2], &2)));
    t.take_all_sent();
    assert!(t.oldest_sent().is_none());
}
