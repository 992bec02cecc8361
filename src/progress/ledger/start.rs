//! What a (re)start does, given the ledger, the server and the slot:
//! [`decide_start`]. Slot loss and server identity changes are never silent.
//!
//! | ledger | server / slot | decision |
//! |---|---|---|
//! | none | no slot | [`StartDecision::FirstStart`] (or `NoSlot` without `create_slot`) |
//! | none | slot | `Resume` from the slot |
//! | any | slot invalidated | `Gap` (`SlotInvalidated`) |
//! | entry | other system identifier | `Gap` (`SystemIdentifierChanged`): another server |
//! | entry | other timeline | `Gap` (`TimelineChanged`): promotion or restore |
//! | entry | no slot | `Gap` (`SlotMissing`): dropped, or lost in a failover |
//! | entry | slot at or behind it | `Resume` (skipping what the ledger has) |
//! | entry | slot ahead of it | `SlotAheadOfLedger`: resume, report the range |
//! | exactly-once entry, in exactly-once | slot ahead of it | `Gap` (`SlotPastLedger`) |
//!
//! A `Gap` stops the relay unless the operator accepted it
//! (`--accept-gap`), which gives `AcceptGap`: resume from the server's
//! position and record the range in the ledger.

use std::fmt;

use super::entry::{format_time_us, AcceptedGap, LedgerEntry, LedgerIdentity};
use crate::Lsn;

/// The slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    Missing,
    /// `wal_status = 'lost'` (or `invalidation_reason` set, PostgreSQL 17+):
    /// the WAL it needs is gone.
    Invalidated,
    Present {
        confirmed_flush: Lsn,
    },
}

/// Everything [`decide_start`] looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StartInputs<'a> {
    /// The ledger entry for this database and slot, from
    /// [`select_entry`]: this server's, or else another server's.
    pub ledger: Option<&'a LedgerEntry>,
    /// This server (IDENTIFY_SYSTEM's system identifier), database and slot.
    pub identity: &'a LedgerIdentity,
    /// IDENTIFY_SYSTEM's timeline.
    pub timeline: u32,
    /// IDENTIFY_SYSTEM's xlogpos: where a new slot would start.
    pub xlogpos: Lsn,
    pub slot: SlotState,
    /// `postgres.create_slot`.
    pub create_slot: bool,
    /// `outboxd run --accept-gap`.
    pub accept_gap: bool,
    /// `relay.delivery = "exactly-once"`: the ledger was read
    /// `read_committed`, and the relay reads it again to the end before
    /// its first commit, so an entry it finds is the last one committed.
    pub exactly_once: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartDecision {
    /// Nothing known anywhere: create the slot and start at the current WAL.
    FirstStart,
    /// Nothing known and `postgres.create_slot = false`: the slot must be
    /// created first.
    NoSlot,
    /// Resume from the slot. Events at or below `skip_through` (the ledger's
    /// position, when the slot is behind it) were relayed already.
    Resume {
        from: Lsn,
        skip_through: Option<Lsn>,
    },
    /// Resume from the slot, and report (WARN) that it was confirmed past the
    /// ledger: the events in between were relayed in the last interval
    /// before an unclean stop, or the slot was advanced by hand and they
    /// never were.
    SlotAheadOfLedger {
        ledger: Lsn,
        ledger_commit_time_us: Option<i64>,
        slot: Lsn,
    },
    /// Events may be lost: stop with the error ([`StartGap`]'s `Display`).
    Gap(StartGap),
    /// The operator accepted the gap: record it in the ledger, (re)create
    /// the slot when `recreate_slot`, and resume from `gap.resume_lsn`.
    AcceptGap { gap: StartGap, recreate_slot: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GapReason {
    SlotMissing,
    SlotInvalidated,
    SystemIdentifierChanged {
        ledger: String,
        server: String,
    },
    TimelineChanged {
        ledger: u32,
        server: u32,
    },
    /// Exactly-once: the slot is confirmed past an entry committed in the
    /// same Kafka transaction as its events. Such a relay never confirms
    /// the slot past its last committed entry, so the ledger does not lag:
    /// the events in between are not in Kafka.
    SlotPastLedger,
}

impl fmt::Display for GapReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GapReason::SlotMissing => write!(
                f,
                "the slot does not exist (dropped, or lost in a failover to a standby \
                 before PostgreSQL 17)"
            ),
            GapReason::SlotInvalidated => write!(
                f,
                "the slot is invalidated: the WAL it needs was removed \
                 (max_slot_wal_keep_size)"
            ),
            GapReason::SystemIdentifierChanged { ledger, server } => write!(
                f,
                "the server is another PostgreSQL cluster (system identifier {server}, the \
                 ledger's is {ledger}): a failover to a new server or a restore elsewhere"
            ),
            GapReason::TimelineChanged { ledger, server } => write!(
                f,
                "the server is on timeline {server}, the ledger's is {ledger}: a promotion \
                 or a point-in-time restore"
            ),
            GapReason::SlotPastLedger => write!(
                f,
                "the slot is confirmed past the position ledger, which exactly-once delivery \
                 commits in the same Kafka transaction as the events and never confirms the \
                 slot beyond: the slot was advanced by hand (pg_replication_slot_advance), or \
                 Kafka no longer holds a transaction the relay committed"
            ),
        }
    }
}

/// A position the relay cannot resume from without losing events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartGap {
    pub reason: GapReason,
    pub slot: String,
    /// The ledger's position and its commit time (`None`: no ledger entry).
    pub ledger_lsn: Option<Lsn>,
    pub ledger_commit_time_us: Option<i64>,
    /// Where relaying would resume: the slot's confirmed position, or the
    /// server's current WAL position when the slot has to be created.
    pub resume_lsn: Lsn,
}

impl StartGap {
    /// The ledger's record of this gap once accepted.
    pub(crate) fn accepted(&self, accepted_at_us: i64) -> AcceptedGap {
        AcceptedGap {
            from_lsn: self.ledger_lsn.unwrap_or(Lsn::ZERO),
            to_lsn: self.resume_lsn,
            from_time_us: self.ledger_commit_time_us,
            accepted_at_us,
        }
    }
}

impl fmt::Display for StartGap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replication slot {:?}: {}. ", self.slot, self.reason)?;
        match self.ledger_lsn {
            Some(lsn) => {
                let time = self
                    .ledger_commit_time_us
                    .map_or("unknown".to_owned(), format_time_us);
                write!(
                    f,
                    "The ledger (kafka.ledger_topic) has every event relayed up to {lsn} \
                     (commit time {time}); "
                )?;
            }
            None => write!(
                f,
                "The ledger (kafka.ledger_topic) has no position for it; "
            )?,
        }
        let backfill = match self.ledger_commit_time_us {
            Some(us) => format!("`outboxd backfill --since '{}'`", format_time_us(us)),
            None => "`outboxd backfill --since '<last relayed commit time>'`".to_owned(),
        };
        write!(
            f,
            "the server would resume at {}, so events committed in between would never reach \
             Kafka. To recover: backfill them with {backfill} (a little earlier is safer: \
             duplicates carry the same id; docs/operations.md, \"Position ledger\"), then \
             start once with `outboxd run --accept-gap`, which resumes at the server's position and \
             records the accepted range in the ledger",
            self.resume_lsn
        )
    }
}

/// The ledger entry that speaks for `identity`: its own, or else the newest
/// one for the same database and slot on another server (which is how a
/// changed system identifier is noticed).
pub(crate) fn select_entry<'a>(
    entries: impl IntoIterator<Item = &'a LedgerEntry>,
    identity: &LedgerIdentity,
) -> Option<&'a LedgerEntry> {
    let mut other: Option<&LedgerEntry> = None;
    for e in entries {
        if e.identity() == *identity {
            return Some(e);
        }
        if e.database == identity.database
            && e.slot == identity.slot
            && other.map_or(true, |o| e.written_at_us > o.written_at_us)
        {
            other = Some(e);
        }
    }
    other
}

/// Decides a (re)start; see the module documentation for the table.
pub(crate) fn decide_start(inputs: StartInputs<'_>) -> StartDecision {
    let slot_position = match inputs.slot {
        SlotState::Present { confirmed_flush } => Some(confirmed_flush),
        SlotState::Missing | SlotState::Invalidated => None,
    };
    let gap = |reason| StartGap {
        reason,
        slot: inputs.identity.slot.clone(),
        ledger_lsn: inputs.ledger.map(|l| l.confirmed_lsn),
        ledger_commit_time_us: inputs.ledger.and_then(|l| l.commit_time_us),
        resume_lsn: slot_position.unwrap_or(inputs.xlogpos),
    };
    let reason = match (inputs.ledger, inputs.slot) {
        (_, SlotState::Invalidated) => Some(GapReason::SlotInvalidated),
        (None, SlotState::Missing) if inputs.create_slot => return StartDecision::FirstStart,
        (None, SlotState::Missing) => return StartDecision::NoSlot,
        (None, SlotState::Present { confirmed_flush }) => {
            return StartDecision::Resume {
                from: confirmed_flush,
                skip_through: None,
            }
        }
        (Some(l), _) if l.system_identifier != inputs.identity.system_identifier => {
            Some(GapReason::SystemIdentifierChanged {
                ledger: l.system_identifier.clone(),
                server: inputs.identity.system_identifier.clone(),
            })
        }
        (Some(l), _) if l.timeline != inputs.timeline => Some(GapReason::TimelineChanged {
            ledger: l.timeline,
            server: inputs.timeline,
        }),
        (Some(_), SlotState::Missing) => Some(GapReason::SlotMissing),
        (Some(_), SlotState::Present { .. }) => None,
    };
    if let Some(reason) = reason {
        let gap = gap(reason);
        return if inputs.accept_gap {
            StartDecision::AcceptGap {
                gap,
                recreate_slot: slot_position.is_none(),
            }
        } else {
            StartDecision::Gap(gap)
        };
    }
    // Same server and timeline, slot present.
    let (ledger, slot) = match (inputs.ledger, slot_position) {
        (Some(l), Some(s)) => (l, s),
        // Every other combination returned above.
        _ => unreachable!("ledger and slot present"),
    };
    if slot > ledger.confirmed_lsn && inputs.exactly_once && ledger.transactional {
        let gap = gap(GapReason::SlotPastLedger);
        if inputs.accept_gap {
            StartDecision::AcceptGap {
                gap,
                recreate_slot: false,
            }
        } else {
            StartDecision::Gap(gap)
        }
    } else if slot > ledger.confirmed_lsn {
        StartDecision::SlotAheadOfLedger {
            ledger: ledger.confirmed_lsn,
            ledger_commit_time_us: ledger.commit_time_us,
            slot,
        }
    } else {
        StartDecision::Resume {
            from: slot,
            skip_through: (ledger.confirmed_lsn > slot).then_some(ledger.confirmed_lsn),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::ledger::entry::LEDGER_VERSION;

    const SYSID: &str = "7443001228541284437";

    fn identity(sysid: &str) -> LedgerIdentity {
        LedgerIdentity {
            system_identifier: sysid.into(),
            database: "app".into(),
            slot: "outboxd".into(),
        }
    }

    fn ledger(lsn: u64) -> LedgerEntry {
        LedgerEntry {
            version: LEDGER_VERSION,
            system_identifier: SYSID.into(),
            database: "app".into(),
            slot: "outboxd".into(),
            timeline: 1,
            confirmed_lsn: Lsn(lsn),
            commit_time_us: Some(1_764_569_428_123_456),
            outboxd_version: "0.1.0".into(),
            written_at_us: 10,
            accepted_gaps: Vec::new(),
            inside: None,
            transactional: false,
        }
    }

    fn decide(
        ledger: Option<&LedgerEntry>,
        sysid: &str,
        timeline: u32,
        slot: SlotState,
    ) -> StartDecision {
        decide_start(StartInputs {
            ledger,
            identity: &identity(sysid),
            timeline,
            xlogpos: Lsn(0x9000),
            slot,
            create_slot: true,
            accept_gap: false,
            exactly_once: false,
        })
    }

    fn present(lsn: u64) -> SlotState {
        SlotState::Present {
            confirmed_flush: Lsn(lsn),
        }
    }

    fn expect_gap(d: StartDecision) -> StartGap {
        match d {
            StartDecision::Gap(g) => g,
            other => panic!("expected a gap, got {other:?}"),
        }
    }

    #[test]
    fn genuine_first_start_creates_the_slot_only_when_allowed() {
        assert_eq!(
            decide(None, SYSID, 1, SlotState::Missing),
            StartDecision::FirstStart
        );
        let d = decide_start(StartInputs {
            create_slot: false,
            ..inputs_for(None, SlotState::Missing)
        });
        assert_eq!(d, StartDecision::NoSlot);
    }

    fn inputs_for<'a>(ledger: Option<&'a LedgerEntry>, slot: SlotState) -> StartInputs<'a> {
        // Leaked: a test-only identity that outlives the inputs.
        let identity: &'static LedgerIdentity = Box::leak(Box::new(identity(SYSID)));
        StartInputs {
            ledger,
            identity,
            timeline: 1,
            xlogpos: Lsn(0x9000),
            slot,
            create_slot: true,
            accept_gap: false,
            exactly_once: false,
        }
    }

    #[test]
    fn an_existing_slot_without_ledger_is_adopted() {
        assert_eq!(
            decide(None, SYSID, 1, present(0x500)),
            StartDecision::Resume {
                from: Lsn(0x500),
                skip_through: None
            }
        );
    }

    #[test]
    fn normal_restart_resumes_and_skips_what_the_ledger_has() {
        let l = ledger(0x500);
        assert_eq!(
            decide(Some(&l), SYSID, 1, present(0x500)),
            StartDecision::Resume {
                from: Lsn(0x500),
                skip_through: None
            }
        );
        // A crash before the slot's state was checkpointed: duplicates.
        assert_eq!(
            decide(Some(&l), SYSID, 1, present(0x400)),
            StartDecision::Resume {
                from: Lsn(0x400),
                skip_through: Some(Lsn(0x500))
            }
        );
    }

    #[test]
    fn slot_dropped_is_a_gap_even_with_create_slot() {
        let l = ledger(0x500);
        let g = expect_gap(decide(Some(&l), SYSID, 1, SlotState::Missing));
        assert_eq!(g.reason, GapReason::SlotMissing);
        assert_eq!(
            (g.ledger_lsn, g.resume_lsn),
            (Some(Lsn(0x500)), Lsn(0x9000))
        );
        let text = g.to_string();
        for needle in [
            "\"outboxd\"",
            "does not exist",
            "0/500",
            "2025-12-01T06:10:28.123Z",
            "0/9000",
            "outboxd backfill --since '2025-12-01T06:10:28.123Z'",
            "outboxd run --accept-gap",
        ] {
            assert!(text.contains(needle), "{needle:?} not in: {text}");
        }
    }

    #[test]
    fn invalidated_slot_is_a_gap_with_or_without_ledger() {
        let l = ledger(0x500);
        for ledger in [Some(&l), None] {
            let g = expect_gap(decide(ledger, SYSID, 1, SlotState::Invalidated));
            assert_eq!(g.reason, GapReason::SlotInvalidated);
            assert!(g.to_string().contains("invalidated"), "{g}");
        }
    }

    #[test]
    fn failover_to_a_new_server_is_a_gap_even_if_it_has_the_slot() {
        let l = ledger(0x5_0000_0000);
        for slot in [SlotState::Missing, present(0x700)] {
            let g = expect_gap(decide(Some(&l), "999", 1, slot));
            assert_eq!(
                g.reason,
                GapReason::SystemIdentifierChanged {
                    ledger: SYSID.into(),
                    server: "999".into()
                }
            );
            assert!(g.to_string().contains("system identifier 999"), "{g}");
        }
    }

    #[test]
    fn timeline_change_is_a_gap() {
        let l = ledger(0x500);
        let g = expect_gap(decide(Some(&l), SYSID, 2, present(0x500)));
        assert_eq!(
            g.reason,
            GapReason::TimelineChanged {
                ledger: 1,
                server: 2
            }
        );
        assert_eq!(g.resume_lsn, Lsn(0x500));
    }

    #[test]
    fn slot_advanced_by_hand_is_reported_with_the_range() {
        let l = ledger(0x500);
        assert_eq!(
            decide(Some(&l), SYSID, 1, present(0x800)),
            StartDecision::SlotAheadOfLedger {
                ledger: Lsn(0x500),
                ledger_commit_time_us: l.commit_time_us,
                slot: Lsn(0x800)
            }
        );
    }

    #[test]
    fn in_exactly_once_a_slot_past_a_transactional_entry_is_a_gap() {
        let l = LedgerEntry {
            transactional: true,
            ..ledger(0x500)
        };
        let inputs = StartInputs {
            exactly_once: true,
            ..inputs_for(Some(&l), present(0x800))
        };
        let g = expect_gap(decide_start(inputs));
        assert_eq!(g.reason, GapReason::SlotPastLedger);
        assert_eq!((g.ledger_lsn, g.resume_lsn), (Some(Lsn(0x500)), Lsn(0x800)));
        let text = g.to_string();
        for needle in [
            "confirmed past the position ledger",
            "pg_replication_slot_advance",
            "0/500",
            "0/800",
            "outboxd backfill --since '2025-12-01T06:10:28.123Z'",
            "outboxd run --accept-gap",
        ] {
            assert!(text.contains(needle), "{needle:?} not in: {text}");
        }
        let accepted = decide_start(StartInputs {
            accept_gap: true,
            ..inputs
        });
        assert!(
            matches!(
                accepted,
                StartDecision::AcceptGap {
                    recreate_slot: false,
                    ..
                }
            ),
            "{accepted:?}"
        );
        // At or behind the entry: the usual resume.
        assert!(matches!(
            decide_start(StartInputs {
                slot: present(0x500),
                ..inputs
            }),
            StartDecision::Resume { .. }
        ));
        // An at-least-once entry lags the slot by up to an interval, and
        // an at-least-once relay reads no further than the stable offset.
        for (transactional, exactly_once) in [(false, true), (true, false)] {
            let l = LedgerEntry {
                transactional,
                ..ledger(0x500)
            };
            let d = decide_start(StartInputs {
                exactly_once,
                ..inputs_for(Some(&l), present(0x800))
            });
            assert!(
                matches!(d, StartDecision::SlotAheadOfLedger { .. }),
                "{transactional} {exactly_once}: {d:?}"
            );
        }
    }

    #[test]
    fn an_accepted_gap_resumes_and_is_recorded() {
        let l = ledger(0x500);
        let d = decide_start(StartInputs {
            accept_gap: true,
            ..inputs_for(Some(&l), SlotState::Missing)
        });
        let StartDecision::AcceptGap { gap, recreate_slot } = d else {
            panic!("{d:?}")
        };
        assert!(recreate_slot);
        let record = gap.accepted(42);
        assert_eq!(
            (record.from_lsn, record.to_lsn, record.from_time_us),
            (Lsn(0x500), Lsn(0x9000), l.commit_time_us)
        );
        // Nothing to accept: the flag changes nothing.
        let d = decide_start(StartInputs {
            accept_gap: true,
            ..inputs_for(Some(&l), present(0x500))
        });
        assert!(matches!(d, StartDecision::Resume { .. }), "{d:?}");
    }

    #[test]
    fn own_entry_wins_then_the_newest_of_another_server() {
        let mine = ledger(1);
        let mut old = ledger(2);
        old.system_identifier = "1".into();
        old.written_at_us = 1;
        let mut newer = ledger(3);
        newer.system_identifier = "2".into();
        newer.written_at_us = 99;
        let mut other_slot = ledger(4);
        other_slot.slot = "x".into();
        other_slot.system_identifier = "3".into();
        let all = [old.clone(), newer.clone(), mine.clone(), other_slot.clone()];
        assert_eq!(select_entry(&all, &identity(SYSID)), Some(&mine));
        assert_eq!(select_entry(&all, &identity("5")), Some(&newer));
        assert_eq!(select_entry([&other_slot], &identity(SYSID)), None);
    }
}
