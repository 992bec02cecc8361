//! The position ledger in `outboxd run` (see `progress::ledger` for what it
//! is and `sink::LedgerTopic` for where it lives):
//!
//! - at relay start the ledger topic is ensured and this database's and
//!   slot's entries are read, once;
//! - before each session may create a slot, [`RelayLedger::gate`] compares
//!   the ledger with the server and the slot (`decide_start`): a gap stops
//!   the relay unless `--accept-gap` was given;
//! - during a session a [`LedgerWriter`] is offered the position the driver
//!   actually confirmed to the slot (never above the tracker's confirmable,
//!   so never ahead of the acks), and the entries it hands out are written
//!   by a task of their own, so the relay loop never waits for the ledger.
//!
//! With `relay.delivery = "exactly-once"` the session writes the entries
//! itself, inside its Kafka transactions (`session::commit`), and tells the
//! ledger here what committed ([`RelayLedger::committed`]); each session
//! starts from the entries read again, `read_committed`
//! ([`RelayLedger::refresh`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::error::RelayError;
use super::settings::RelaySettings;
use super::telemetry::{RelayEvent, RelayTelemetry};
use crate::progress::ledger::{
    decide_start, format_time_us, select_entry, AcceptedGap, GapReason, InsideTransaction,
    LedgerEntry, LedgerIdentity, LedgerWriter, SlotState, StartDecision, StartGap, StartInputs,
};
use crate::sink::{LedgerReader, LedgerTopic, LedgerTopicError, ReadTo};
use crate::source::session::{Identified, SlotPlan};
use crate::Lsn;

/// How long a graceful stop waits for the final entry.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before writing a failed entry again.
const RETRY: Duration = Duration::from_secs(1);

/// The ledger for one relay process.
pub(super) struct RelayLedger {
    database: String,
    slot: String,
    /// For the reads after the first (exactly-once).
    reader: LedgerReader,
    /// The entries of this database and slot: as read at start, then as
    /// written since.
    known: Arc<Mutex<Vec<LedgerEntry>>>,
    /// The newest entry to write, numbered; the writer task takes it.
    pending: watch::Sender<(u64, Option<LedgerEntry>)>,
    /// The number of the last entry Kafka acknowledged.
    written: watch::Receiver<u64>,
    /// `--accept-gap`: honoured for the first gap only; a gap found later
    /// in the same run stops the relay again.
    accept_gap: bool,
    /// A session of this process has streamed: a missing slot is a lost
    /// one.
    streamed: bool,
    /// A slot ahead of the ledger is expected (logged at INFO): this
    /// process streamed it, or takes it over from an instance that stopped
    /// (likely uncleanly) while this one stood by; the ledger lags the slot
    /// by up to an interval.
    expect_ahead: bool,
    /// The entries were read from the topic and no session used them yet.
    fresh: bool,
    telemetry: RelayTelemetry,
}

/// What the gate found, for the session.
#[derive(Debug, Default)]
pub(super) struct Start {
    /// The ledger entry that speaks for this server, if any.
    pub(super) previous: Option<LedgerEntry>,
    pub(super) identity: Option<LedgerIdentity>,
    pub(super) timeline: u32,
    /// Events whose commit lies below this were relayed already.
    pub(super) skip_through: Option<Lsn>,
    /// And the first events of this transaction (exactly-once split it).
    pub(super) inside: Option<InsideTransaction>,
    /// A gap the operator accepted: recorded with the next entry.
    pub(super) accepted: Option<AcceptedGap>,
    /// Exactly-once: the slot is past the entry read so far; a gap unless
    /// the read to the end after the fencing finds a newer entry.
    pub(super) unconfirmed_gap: Option<StartGap>,
}

/// The ledger read after a fencing, under way (see
/// [`RelayLedger::check_after_fencing`]); dropping it stops the read.
pub(super) struct FencingCheck {
    read: tokio::task::JoinHandle<Result<AfterFencing, RelayError>>,
    topic: String,
}

/// The entries read after a fencing, whether the one that speaks for the
/// session moved since its gate, and the gap the gate left to this read.
pub(super) struct AfterFencing {
    entries: Vec<LedgerEntry>,
    moved: bool,
    unconfirmed_gap: Option<StartGap>,
}

impl FencingCheck {
    pub(super) async fn finish(mut self) -> Result<AfterFencing, RelayError> {
        (&mut self.read).await.unwrap_or_else(|e| {
            Err(LedgerTopicError::Read {
                topic: std::mem::take(&mut self.topic),
                reason: format!("the read after the fencing did not finish: {e}"),
            }
            .into())
        })
    }
}

impl Drop for FencingCheck {
    fn drop(&mut self) {
        self.read.abort();
    }
}

impl RelayLedger {
    /// Ensures the topic (created compacted when `kafka.create_topics`,
    /// else verified) and reads the entries for this database and slot.
    pub(super) async fn open(settings: &RelaySettings) -> Result<RelayLedger, RelayError> {
        let started = std::time::Instant::now();
        let topic = LedgerTopic::new(&settings.brokers, &settings.config.kafka)?;
        let database = settings.source.conn.dbname.clone();
        let slot = settings.source.slot.clone();
        // Checked and read at once: both take a broker round trip or more,
        // and every start waits for them. A read that found no topic is
        // done again once `ensure` has made it.
        // Not waiting for transactions open on the topic: a start is
        // checked again once its transactional id is initialised
        // (`check_after_fencing`).
        let reader = topic.reader().clone();
        let (ensured, read) = tokio::join!(
            topic.ensure(),
            reader.entries_for(&database, &slot, ReadTo::Stable)
        );
        ensured?;
        let entries = match read {
            Ok(entries) => entries,
            Err(_) => reader.entries_for(&database, &slot, ReadTo::Stable).await?,
        };
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            entries = entries.len(),
            "read the position ledger"
        );
        let telemetry = RelayTelemetry::new(&settings.health);
        let newest = entries.iter().max_by_key(|e| e.written_at_us);
        telemetry.emit(RelayEvent::LedgerRead {
            newest: newest.map(|e| e.confirmed_lsn),
        });
        let known = Arc::new(Mutex::new(entries));
        let (pending, rx) = watch::channel((0, None));
        let (done, written) = watch::channel(0);
        let writer = Writer {
            known: Arc::clone(&known),
            telemetry: telemetry.clone(),
        };
        tokio::spawn(write_entries(topic, rx, done, writer));
        Ok(RelayLedger {
            database,
            slot,
            reader,
            known,
            pending,
            written,
            accept_gap: settings.accept_gap,
            streamed: false,
            expect_ahead: false,
            fresh: true,
            telemetry,
        })
    }

    /// Decides whether the session may go on, and on what terms; called by
    /// `SourceSession::open_gated` before any slot is created.
    pub(super) fn gate(
        &mut self,
        settings: &RelaySettings,
        found: &Identified,
        start: &mut Start,
    ) -> Result<SlotPlan, RelayError> {
        let identity = LedgerIdentity {
            system_identifier: found.system_id.clone(),
            database: self.database.clone(),
            slot: self.slot.clone(),
        };
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let ledger = select_entry(&known, &identity);
        let decision = decide_start(StartInputs {
            ledger,
            identity: &identity,
            timeline: found.timeline,
            xlogpos: found.xlogpos,
            slot: found.slot,
            create_slot: settings.source.create_slot,
            accept_gap: self.accept_gap,
            exactly_once: matches!(
                settings.config.relay.delivery,
                crate::config::DeliveryMode::ExactlyOnce
            ),
        });
        let decision = self.failover_resume(decision, ledger, &identity, found);
        start.previous = ledger.cloned();
        // A split transaction's first events are in Kafka: only for this
        // server's own entry (a resume from it).
        start.inside = ledger
            .filter(|l| l.identity() == identity && l.timeline == found.timeline)
            .and_then(|l| l.inside);
        if let Some(inside) = start.inside {
            tracing::info!(slot = %self.slot, commit_lsn = %inside.commit_lsn, events = inside.events, "resuming inside a database transaction split over Kafka transactions: its first events are in Kafka already and are skipped");
        }
        start.identity = Some(identity);
        start.timeline = found.timeline;
        let plan = self.plan(decision, start)?;
        self.telemetry.emit(RelayEvent::Gap(None));
        Ok(plan)
    }

    /// A failover slot synchronised to the promoted standby carries its
    /// position over the promotion: no gap. The synchronised copy lags the
    /// relay, so what the ledger has below the branch point (the same WAL
    /// on both timelines) is skipped; above it the new timeline may reuse
    /// LSNs.
    fn failover_resume(
        &self,
        decision: StartDecision,
        ledger: Option<&LedgerEntry>,
        identity: &LedgerIdentity,
        found: &Identified,
    ) -> StartDecision {
        match decision {
            StartDecision::Gap(gap)
                if found.failover_slot
                    && matches!(gap.reason, GapReason::TimelineChanged { .. })
                    && matches!(found.slot, SlotState::Present { .. }) =>
            {
                let skip_through = ledger
                    .filter(|l| l.identity() == *identity)
                    .zip(found.timeline_history.as_deref())
                    .and_then(|(l, history)| {
                        Some(l.confirmed_lsn.min(branch_point(history, l.timeline)?))
                    })
                    .filter(|&through| through > gap.resume_lsn);
                tracing::warn!(slot = %self.slot, reason = %gap.reason, resume = %gap.resume_lsn, skip_through = ?skip_through, "timeline changed; the failover slot was synchronised to this server, resuming from it");
                StartDecision::Resume {
                    from: gap.resume_lsn,
                    skip_through,
                }
            }
            other => other,
        }
    }

    /// What the session does with the slot, by the ledger's decision: the
    /// terms go into `start`; a gap not accepted stops the relay.
    fn plan(&mut self, decision: StartDecision, start: &mut Start) -> Result<SlotPlan, RelayError> {
        Ok(match decision {
            StartDecision::FirstStart | StartDecision::NoSlot => SlotPlan::AsConfigured,
            StartDecision::Resume { from, skip_through } => {
                if let Some(through) = skip_through {
                    tracing::info!(slot = %self.slot, %from, ledger = %through, "resuming behind the ledger: events committed up to the ledger's position were relayed already and are skipped");
                }
                start.skip_through = skip_through;
                SlotPlan::AsConfigured
            }
            StartDecision::SlotAheadOfLedger {
                ledger,
                ledger_commit_time_us,
                slot,
            } => {
                let time = ledger_commit_time_us.map_or("unknown".into(), format_time_us);
                if self.expect_ahead {
                    tracing::info!(slot = %self.slot, %ledger, %slot, "slot confirmed past the ledger (the ledger lags by up to a status interval)");
                } else {
                    tracing::warn!(
                        slot = %self.slot,
                        ledger = %ledger,
                        ledger_commit_time = %time,
                        slot_confirmed = %slot,
                        "the slot is confirmed past the position ledger: the events committed from {ledger} to {slot} were relayed in the last status interval before an unclean stop, or the slot was advanced by hand (pg_replication_slot_advance) and they never were; if in doubt, run `outboxd backfill --since '{time}'`"
                    );
                }
                SlotPlan::AsConfigured
            }
            // Read to the stable offset only: a transaction of another relay
            // open on the shared topic may hide this one's last entry. The
            // read to the end after the fencing settles it.
            StartDecision::Gap(gap) if gap.reason == GapReason::SlotPastLedger => {
                tracing::info!(slot = %self.slot, ledger = ?gap.ledger_lsn, slot_confirmed = %gap.resume_lsn, "the slot is confirmed past the position ledger read so far; reading the ledger to its end before the first commit");
                start.unconfirmed_gap = Some(gap);
                SlotPlan::AsConfigured
            }
            StartDecision::Gap(gap) => {
                self.telemetry.emit(RelayEvent::Gap(Some(&gap)));
                // Streamed by this process and gone: the relay names it as
                // a lost slot, with what it confirmed itself.
                if self.streamed && gap.reason == GapReason::SlotMissing {
                    return Err(RelayError::Source(
                        crate::source::admin::AdminError::SlotMissing { slot: gap.slot }.into(),
                    ));
                }
                return Err(RelayError::Gap(Box::new(gap)));
            }
            StartDecision::AcceptGap { gap, recreate_slot } => {
                let accepted = gap.accepted(crate::clock::now_unix_micros());
                tracing::warn!(
                    slot = %gap.slot,
                    from = %accepted.from_lsn,
                    to = %accepted.to_lsn,
                    from_commit_time = %accepted.from_time_us.map_or("unknown".into(), format_time_us),
                    reason = %gap.reason,
                    "accepting a gap (--accept-gap): events committed in this range were not relayed by this slot; the range is recorded in the ledger"
                );
                self.accept_gap = false;
                start.accepted = Some(accepted);
                if recreate_slot {
                    SlotPlan::Recreate
                } else {
                    SlotPlan::AsConfigured
                }
            }
        })
    }

    /// A session streams: from now on a missing slot is a lost one.
    pub(super) fn streaming(&mut self) {
        self.streamed = true;
        self.expect_ahead = true;
    }

    /// The instance that streamed the slot released it and this one takes
    /// over (see `relay::standby`).
    pub(super) fn taking_over(&mut self) {
        self.expect_ahead = true;
    }

    /// Exactly-once: `entry` was committed in a Kafka transaction; the next
    /// session's gate starts from it (until the ledger is read again).
    pub(super) fn committed(&self, entry: LedgerEntry) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|e| e.identity() != entry.identity());
        known.push(entry);
    }

    /// Reads this database's and slot's entries again (`read_committed`),
    /// unless no session used them since they were read: exactly-once
    /// resumes from what Kafka committed, not from what this process
    /// believes it committed (a commit whose answer was lost may have
    /// happened).
    pub(super) async fn refresh(&mut self) -> Result<(), RelayError> {
        if std::mem::replace(&mut self.fresh, false) {
            return Ok(());
        }
        let entries = self.read_entries(ReadTo::Stable).await?;
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) = entries;
        Ok(())
    }

    /// This database's and slot's entries, read from the topic now, as far
    /// as `to` says.
    async fn read_entries(&self, to: ReadTo) -> Result<Vec<LedgerEntry>, RelayError> {
        Ok(self
            .reader
            .entries_for(&self.database, &self.slot, to)
            .await?)
    }

    /// The read of the entries again after this session initialised its
    /// transactional id, as a task of its own: the session streams into its
    /// first transaction meanwhile, and commits nothing before the read
    /// says whether the entry that speaks for it moved since its gate read
    /// it ([`FencingCheck`]). Initialising the id fences the instance that
    /// had it, but that one may have committed one last transaction between
    /// the gate's read and the fencing: its events are in Kafka, and the
    /// session must start again from the entry it wrote.
    pub(super) fn check_after_fencing(&self, start: &Start) -> Option<FencingCheck> {
        let identity = start.identity.clone()?;
        let previous = start.previous.clone();
        let unconfirmed_gap = start.unconfirmed_gap.clone();
        let reader = self.reader.clone();
        let topic = reader.topic().to_owned();
        let (database, slot) = (self.database.clone(), self.slot.clone());
        let read = tokio::spawn(async move {
            // To the end, not to the stable offset: another relay's commit
            // under way on the shared topic would hide the entry this check
            // is for (the fenced instance's last one), and the session
            // would repeat that transaction. The fencing aborted this id's
            // own open one, so only other relays' commits are waited for.
            let started = std::time::Instant::now();
            let entries = reader.entries_for(&database, &slot, ReadTo::End).await?;
            let moved = select_entry(&entries, &identity) != previous.as_ref();
            tracing::debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                moved,
                "read the position ledger again after taking the transactional id over"
            );
            Ok(AfterFencing {
                entries,
                moved,
                unconfirmed_gap,
            })
        });
        Some(FencingCheck { read, topic })
    }

    /// What the read after the fencing found: the next session's gate
    /// starts from these entries when the ledger moved (`Ok(true)`). When
    /// it did not, a slot the gate found past it is a gap: the events in
    /// between are not in Kafka.
    pub(super) fn after_fencing(&mut self, found: AfterFencing) -> Result<bool, RelayError> {
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) = found.entries;
        self.fresh = found.moved;
        match found.unconfirmed_gap {
            Some(gap) if !found.moved => {
                self.telemetry.emit(RelayEvent::Gap(Some(&gap)));
                Err(RelayError::Gap(Box::new(gap)))
            }
            _ => Ok(found.moved),
        }
    }

    /// A writer for the session `start` describes.
    pub(super) fn writer(&self, start: &Start, interval: Duration) -> Option<LedgerWriter> {
        let identity = start.identity.clone()?;
        let mut writer =
            LedgerWriter::new(identity, start.timeline, interval, start.previous.as_ref());
        if let Some(gap) = start.accepted.clone() {
            writer.accept_gap(gap);
        }
        Some(writer)
    }

    /// Hands `entry` to the writer task (replacing one not yet written: only
    /// the newest matters). Never waits.
    pub(super) fn submit(&self, entry: LedgerEntry) -> u64 {
        let mut number = 0;
        self.pending.send_modify(|(n, e)| {
            *n += 1;
            number = *n;
            *e = Some(entry);
        });
        number
    }

    /// Writes `entry` and waits (bounded) until Kafka acknowledged it: at a
    /// graceful stop, so the ledger ends where the slot does.
    pub(super) async fn flush(&mut self, entry: LedgerEntry) {
        let lsn = entry.confirmed_lsn;
        let number = self.submit(entry);
        let wait = self.written.wait_for(|w| *w >= number);
        match tokio::time::timeout(FLUSH_TIMEOUT, wait).await {
            Ok(Ok(_)) => tracing::debug!(%lsn, "ledger written"),
            _ => {
                tracing::warn!(%lsn, timeout_s = FLUSH_TIMEOUT.as_secs(), "the final ledger entry was not acknowledged in time; the ledger lags the slot, so the next start re-delivers a little more")
            }
        }
    }
}

/// What the writer task shares with the relay.
struct Writer {
    known: Arc<Mutex<Vec<LedgerEntry>>>,
    telemetry: RelayTelemetry,
}

/// The writer task: writes the newest pending entry, again after a failure
/// (unless a newer one came meanwhile), until the relay is gone.
async fn write_entries(
    mut topic: LedgerTopic,
    mut pending: watch::Receiver<(u64, Option<LedgerEntry>)>,
    done: watch::Sender<u64>,
    writer: Writer,
) {
    while pending.changed().await.is_ok() {
        let (number, entry) = pending.borrow_and_update().clone();
        let Some(entry) = entry else { continue };
        loop {
            match topic.write(&entry).await {
                Ok(_) => {
                    writer
                        .telemetry
                        .emit(RelayEvent::LedgerWritten(entry.confirmed_lsn));
                    let mut known = writer.known.lock().unwrap_or_else(|e| e.into_inner());
                    known.retain(|e| e.identity() != entry.identity());
                    known.push(entry);
                    done.send_replace(number);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write the position ledger; retrying with a new producer (the ledger lags meanwhile, the relay goes on)");
                    if e.is_refused_by_authorizer() {
                        writer
                            .telemetry
                            .emit(RelayEvent::LedgerRefused(&e.to_string()));
                    }
                    if let Err(e) = topic.renew_producer() {
                        tracing::debug!(error = %e, "cannot make a new ledger producer; retrying with the old one");
                    }
                    tokio::time::sleep(RETRY).await;
                    if pending.has_changed().unwrap_or(true) {
                        break;
                    }
                }
            }
        }
    }
}

/// Where `timeline` ended, from a later timeline's history file (a line per
/// ancestor: `parent<TAB>switchpoint<TAB>reason`): WAL below it is the same
/// on both.
fn branch_point(history: &str, timeline: u32) -> Option<Lsn> {
    history.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let parent: u32 = fields.next()?.parse().ok()?;
        let switchpoint: Lsn = fields.next()?.parse().ok()?;
        (parent == timeline).then_some(switchpoint)
    })
}

#[cfg(test)]
mod tests {
    use super::branch_point;
    use crate::Lsn;

    #[test]
    fn the_branch_point_of_each_ancestor_timeline() {
        let history = "1\t0/3000060\tno recovery target specified\n\
                       \n\
                       2\t0/5A000A0\tno recovery target specified\n";
        assert_eq!(branch_point(history, 1), Some(Lsn(0x300_0060)));
        assert_eq!(branch_point(history, 2), Some(Lsn(0x5A0_00A0)));
        assert_eq!(branch_point(history, 3), None, "the current timeline");
        assert_eq!(branch_point("# a comment\nnot a line", 1), None);
    }
}
