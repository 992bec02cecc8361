//! One test per rule of the in-flight window, without Kafka: reports are
//! made by hand, as librdkafka would send them.

use std::sync::Arc;

use rdkafka::types::RDKafkaErrorCode as C;
use tokio::time::Instant;

use super::*;

const LIMITS: Limits = Limits {
    events: 4,
    bytes: 1000,
};

fn event(commit: u64) -> OutboxEvent {
    OutboxEvent::test_message(Lsn(commit))
}

fn record(size: usize) -> KafkaRecord {
    KafkaRecord {
        topic: Arc::from("t"),
        key: None,
        value: None,
        headers: Vec::new(),
        timestamp_ms: None,
        event_id: None,
        size,
    }
}

/// An event of the transaction committing at `commit`, admitted and sent.
fn send(w: &mut Window<'_>, commit: u64) -> DeliveryId {
    let entry = admit(w, commit);
    let id = entry.id;
    assert!(!w.must_wait(id), "nothing waits to be sent again");
    w.sent(entry);
    id
}

fn admit(w: &mut Window<'_>, commit: u64) -> InFlight {
    let identity = w.arrive(Lsn(commit)).expect("not skipped");
    w.admit(event(commit), record(10), identity, false, Instant::now())
}

fn ack(id: DeliveryId) -> DeliveryReport {
    DeliveryReport {
        id: id.get(),
        result: Ok(Delivered {
            partition: 0,
            offset: 1,
        }),
    }
}

fn failed(id: DeliveryId, code: C) -> DeliveryReport {
    DeliveryReport {
        id: id.get(),
        result: Err(DeliveryFailure {
            code,
            message: format!("{code:?}"),
            kind: crate::sink::classify(code),
        }),
    }
}

#[test]
fn acks_move_the_confirmable_position_past_each_commit() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(1), Relayed::default(), &mut poison, LIMITS);
    let a = send(&mut w, 10);
    let b = send(&mut w, 10);
    w.commit(Lsn(11));
    assert_eq!((w.in_flight(), w.in_flight_bytes()), (2, 20));
    assert_eq!(w.with_producer(), 2);
    assert!(matches!(w.report(ack(b)), Reported::Acked(e, _) if e.id == b));
    assert_eq!(w.confirmable(), Lsn(1), "a is not acknowledged yet");
    assert!(matches!(w.report(ack(a)), Reported::Acked(..)));
    assert_eq!(w.confirmable(), Lsn(11));
    assert_eq!((w.in_flight(), w.with_producer()), (0, 0));
    assert!(matches!(w.report(ack(a)), Reported::Stale));
}

#[test]
fn events_are_numbered_within_their_transaction() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    assert_eq!(w.arrive(Lsn(10)), Some((Lsn(10), 0)));
    assert_eq!(w.arrive(Lsn(10)), Some((Lsn(10), 1)));
    w.commit(Lsn(11));
    assert_eq!(w.arrive(Lsn(20)), Some((Lsn(20), 0)));
}

#[test]
fn events_the_ledger_has_as_relayed_are_skipped() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(
        Lsn(0),
        Relayed {
            through: Some(Lsn(21)),
            inside: None,
        },
        &mut poison,
        LIMITS,
    );
    assert_eq!(w.arrive(Lsn(20)), None);
    w.commit(Lsn(21));
    assert_eq!(w.arrive(Lsn(21)), Some((Lsn(21), 0)));
}

#[test]
fn the_first_events_of_a_split_transaction_the_ledger_has_are_skipped() {
    let mut poison = PoisonMemory::default();
    let relayed = Relayed {
        through: Some(Lsn(11)),
        inside: Some(InsideTransaction {
            commit_lsn: Lsn(20),
            events: 2,
        }),
    };
    let mut w = Window::new(Lsn(0), relayed, &mut poison, LIMITS);
    let ledger = Position {
        through: Lsn(11),
        inside: relayed.inside,
    };
    assert_eq!(w.position(), ledger, "starts at the ledger's position");
    assert_eq!(w.arrive(Lsn(10)), None, "below the ledger's commit");
    w.commit(Lsn(11));
    assert_eq!(w.position(), ledger, "never behind the ledger");
    assert_eq!(w.arrive(Lsn(20)), None);
    assert_eq!(w.arrive(Lsn(20)), None);
    assert_eq!(w.arrive(Lsn(20)), Some((Lsn(20), 2)), "the third is new");
    w.commit(Lsn(21));
    assert_eq!(w.position().through, Lsn(21));
    assert_eq!(w.arrive(Lsn(30)), Some((Lsn(30), 0)));
}

#[test]
fn the_position_follows_what_was_handed_over() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(5), Relayed::default(), &mut poison, LIMITS);
    let at = |through, inside: Option<(u64, u32)>| Position {
        through: Lsn(through),
        inside: inside.map(|(c, events)| InsideTransaction {
            commit_lsn: Lsn(c),
            events,
        }),
    };
    assert_eq!(w.position(), at(5, None));
    w.keepalive(Lsn(8));
    assert_eq!(w.position(), at(8, None), "idle WAL passed");
    let first = admit(&mut w, 10);
    assert_eq!(w.position(), at(8, None), "read, not handed over yet");
    w.sent(first);
    assert_eq!(w.position(), at(8, Some((10, 1))));
    send(&mut w, 10);
    w.keepalive(Lsn(9));
    assert_eq!(w.position(), at(8, Some((10, 2))), "no idle move inside");
    w.commit(Lsn(11));
    assert_eq!(w.position(), at(11, None));
    let entry = admit(&mut w, 20);
    w.halt(Halt::TableChanged("x".into()));
    w.sent(entry);
    w.commit(Lsn(21));
    assert_eq!(w.position(), at(11, None), "halted: nothing moves");
}

#[test]
fn reading_stops_at_either_limit() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    for _ in 0..3 {
        send(&mut w, 10);
    }
    assert!(w.may_read());
    send(&mut w, 10);
    assert!(!w.may_read(), "4 events in flight");

    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    let identity = w.arrive(Lsn(10)).unwrap();
    let big = w.admit(event(10), record(1000), identity, false, Instant::now());
    w.sent(big);
    assert!(!w.may_read(), "1000 bytes in flight");
}

#[test]
fn a_refusal_in_company_makes_a_suspect_and_alone_confirmed_poison() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    let a = send(&mut w, 10);
    let b = send(&mut w, 10);
    assert!(matches!(
        w.report(failed(a, C::MessageSizeTooLarge)),
        Reported::Suspect(_)
    ));
    // Its batch-mate is refused too: also a suspect.
    assert!(matches!(
        w.report(failed(b, C::MessageSizeTooLarge)),
        Reported::Suspect(_)
    ));
    assert!(!w.may_read(), "records wait to be sent again");
    // Sent again in WAL order, each on trial.
    let (route, mut first) = w.next_to_send().unwrap();
    assert!(matches!(route, Route::Trial) && first.id == a);
    Window::isolate(&mut first);
    w.sent(first);
    assert!(matches!(w.report(ack(a)), Reported::Acked(..)));
    assert!(matches!(w.route(&(Lsn(10), 0)), Route::Send), "acquitted");
    let (route, mut second) = w.next_to_send().unwrap();
    assert!(matches!(route, Route::Trial) && second.id == b);
    Window::isolate(&mut second);
    w.sent(second);
    assert!(matches!(
        w.report(failed(b, C::MessageSizeTooLarge)),
        Reported::Suspect(_)
    ));
    let (route, entry) = w.next_to_send().unwrap();
    assert!(matches!(route, Route::Poison(r) if r.code == C::MessageSizeTooLarge));
    assert_eq!(entry.id, b, "the poison keeps its slot");
    assert_eq!(w.in_flight(), 1);
    assert!(w.next_to_send().is_none());
}

#[test]
fn a_refused_dead_letter_copy_halts_and_keeps_its_slot() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    let entry = admit(&mut w, 10);
    let copy = entry.into_dead_letter(record(5));
    let id = copy.id;
    w.sent(copy);
    w.commit(Lsn(11));
    let reported = w.report(failed(id, C::TopicAuthorizationFailed));
    assert!(matches!(reported, Reported::Refused(_)));
    assert!(matches!(w.halted(), Some(Halt::DeadLetterRefused { .. })));
    assert!(!w.may_read() && !w.resend_due());
    assert!(w.next_to_send().is_none(), "nothing is sent while halted");
    w.keepalive(Lsn(50));
    assert_eq!(w.confirmable(), Lsn(0), "held below the copy");
    assert_eq!(w.in_flight(), 1);
}

#[test]
fn a_copy_refused_at_hand_over_halts_and_an_original_goes_to_the_policy() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    let refusal = || Refusal {
        code: C::MessageSizeTooLarge,
        error: "too large".into(),
    };
    let entry = admit(&mut w, 10);
    let (entry, _) = w.rejected(entry, refusal()).expect("to the policy");
    assert!(matches!(w.route(&entry.identity), Route::Poison(_)));
    let copy = entry.into_dead_letter(record(5));
    assert!(w.rejected(copy, refusal()).is_none());
    assert_eq!(
        w.halted().map(ToString::to_string).as_deref(),
        Some("the dead-letter topic refused an event too: too large")
    );
}

#[test]
fn transport_failures_wait_to_be_resent_and_say_whether_kafka_is_down() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    let a = send(&mut w, 10);
    let b = send(&mut w, 10);
    assert!(matches!(
        w.report(failed(a, C::PurgeInflight)),
        Reported::ProducerEnded(_)
    ));
    assert!(matches!(
        w.report(failed(b, C::MessageTimedOut)),
        Reported::Outage(_)
    ));
    assert_eq!(w.waiting(), 2);
    assert!(matches!(w.next_to_send(), Some((Route::Send, e)) if e.id == a));
}

#[test]
fn newer_records_queue_behind_those_waiting_to_be_resent() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    let a = send(&mut w, 10);
    let b = send(&mut w, 10);
    // The producer's reports never come: both are taken back.
    w.take_back_unreported();
    assert_eq!((w.with_producer(), w.waiting()), (0, 2));
    let newer = admit(&mut w, 10);
    let newer_id = newer.id;
    assert!(w.must_wait(newer_id));
    w.queue(newer);
    let order: Vec<_> = std::iter::from_fn(|| w.next_to_send().map(|(_, e)| e.id)).collect();
    assert_eq!(order, [a, b, newer_id]);
}

#[test]
fn a_frozen_window_confirms_nothing_more() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    let a = send(&mut w, 10);
    w.commit(Lsn(11));
    w.freeze();
    assert!(matches!(w.report(ack(a)), Reported::Acked(..)));
    assert_eq!(w.confirmable(), Lsn(0));
}

#[test]
fn verdicts_outlive_the_window() {
    let mut poison = PoisonMemory::default();
    {
        let mut w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
        let a = send(&mut w, 10);
        w.report(failed(a, C::MessageSizeTooLarge));
    }
    let w = Window::new(Lsn(0), Relayed::default(), &mut poison, LIMITS);
    assert!(matches!(w.route(&(Lsn(10), 0)), Route::Trial));
}

#[test]
fn halt_reasons_read_as_before() {
    let refused = Halt::Refused {
        xid: 7,
        commit_lsn: Lsn(0x10),
        error: "too large".into(),
    };
    assert_eq!(
        refused.to_string(),
        "Kafka refused an event of transaction 7 (commit LSN 0/10): too large; the relay will \
         not move past it (relay.on_error = \"stop\")"
    );
    let undeliverable = Halt::Undeliverable {
        xid: 7,
        commit_lsn: Lsn(0x10),
        error: "no topic".into(),
    };
    assert_eq!(
        undeliverable.to_string(),
        "event in transaction 7 (commit LSN 0/10) cannot be delivered: no topic; the relay will \
         not move past it (relay.on_error = \"stop\")"
    );
    assert_eq!(Halt::TableChanged("x".into()).to_string(), "x");
}

#[test]
fn a_lightened_entry_lets_go_of_its_wal_frame_and_is_acked_as_before() {
    let mut poison = PoisonMemory::default();
    let mut w = Window::new(Lsn(1), Relayed::default(), &mut poison, LIMITS);
    let frame = bytes::Bytes::from_static(b"id-7 key payload");
    let identity = w.arrive(Lsn(10)).expect("not skipped");
    let mut rec = record(300);
    rec.event_id = Some(frame.slice(0..4));
    rec.key = Some(frame.slice(5..8));
    rec.value = Some(frame.slice(9..));
    rec.headers = vec![(Arc::from("id"), Some(frame.slice(0..4)))];
    let mut ev = event(10);
    ev.kind = EventKind::Message {
        transactional: true,
        prefix: "outbox".into(),
        content: frame.clone(),
    };
    let mut entry = w.admit(ev, rec, identity, false, Instant::now());
    let id = entry.id;
    entry.lighten();
    assert_eq!((&entry.record.key, &entry.record.value), (&None, &None));
    assert!(entry.record.headers.is_empty());
    assert!(matches!(&entry.event.kind, EventKind::Message { content, .. } if content.is_empty()));
    let event_id = entry
        .record
        .event_id
        .clone()
        .expect("the id stays, for the logs");
    assert_eq!(&event_id[..], b"id-7");
    assert!(
        !frame.as_ptr_range().contains(&event_id.as_ptr()),
        "the id is a copy, not a slice of the frame"
    );
    w.sent(entry);
    w.commit(Lsn(11));
    assert_eq!(w.in_flight_bytes(), 300, "accounted as admitted");
    let acked = w.report(ack(id));
    assert!(
        matches!(&acked, Reported::Acked(e, _) if &*e.record.topic == "t" && e.record.size == 300 && e.event.commit_lsn == Lsn(10)),
        "topic, size and commit LSN are what the ack reports"
    );
    assert_eq!((w.confirmable(), w.in_flight_bytes()), (Lsn(11), 0));
}
