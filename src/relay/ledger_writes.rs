//! The ledger's writer task (at-least-once): writes the entries the
//! sessions hand to [`RelayLedger::submit`](super::ledger::RelayLedger),
//! as [`LedgerWrites`] decides. Lives as long as the relay, beside its
//! loop, which never waits for it.
//!
//! What it adds to that decision is the I/O: each write is a future of its
//! own ([`LedgerTopic::start_write`]), so a write past its age limit is
//! dropped and the producer replaced while the write still hangs, and the
//! telemetry: a failure by reason, and the ledger's lag, sampled every
//! [`LAG_TICK`] while it is behind.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::telemetry::{RelayEvent, RelayTelemetry};
use crate::progress::ledger::{LedgerEntry, LedgerWrites, NextWrite, WriteFailure};
use crate::sink::{LedgerTopic, LedgerTopicError, LedgerWrite};

/// Pause before writing again after a failed write: a deleted or refused
/// topic fails at once, and is not asked again in a loop.
const RETRY: Duration = Duration::from_secs(1);
/// How often the lag is sampled while the ledger is behind: a scrape sees
/// it grow second by second; while the ledger is caught up it stays 0
/// without waking the task.
const LAG_TICK: Duration = Duration::from_secs(1);

/// What the writer task shares with the relay.
pub(super) struct Writer {
    pub(super) known: Arc<Mutex<Vec<LedgerEntry>>>,
    pub(super) telemetry: RelayTelemetry,
    /// A write with no answer past this is abandoned (the ledger's
    /// `message.timeout.ms` too: `kafka.ledger_write_timeout`).
    pub(super) age_limit: Duration,
}

/// The writer task: until the relay drops its end of `pending`, writes the
/// newest entry, numbered, and publishes on `done` the number of the newest
/// one Kafka acknowledged.
pub(super) async fn write_entries(
    mut topic: LedgerTopic,
    mut pending: watch::Receiver<(u64, Option<LedgerEntry>)>,
    done: watch::Sender<u64>,
    writer: Writer,
) {
    let mut writes = LedgerWrites::new(writer.age_limit, RETRY);
    let mut in_flight: Option<(u64, LedgerWrite)> = None;
    loop {
        let now = Instant::now();
        let wake = loop {
            match writes.next(now.into_std()) {
                NextWrite::Send { number, entry } => {
                    in_flight = Some((number, topic.start_write(&entry)));
                }
                NextWrite::Abandon { number } => {
                    // Its answer would be ignored; and the old producer
                    // goes only once nothing holds it.
                    in_flight = None;
                    let detail = format!(
                        "entry {number} not acknowledged within {:?}",
                        writer.age_limit
                    );
                    writer.fail(WriteFailure::Stuck, &detail);
                    renew(&mut topic);
                }
                NextWrite::Wait(until) => break until.map(Instant::from_std),
            }
        };
        let lag = writes.lag(now.into_std());
        writer.telemetry.emit(RelayEvent::LedgerLag(lag));
        let wake = if lag.is_zero() {
            wake
        } else {
            Some(wake.map_or(now + LAG_TICK, |w| w.min(now + LAG_TICK)))
        };
        let answer = async {
            match in_flight.as_mut() {
                Some((_, write)) => write.await,
                None => std::future::pending().await,
            }
        };
        let timer = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = pending.changed() => {
                if changed.is_err() {
                    return;
                }
                let (number, entry) = pending.borrow_and_update().clone();
                if let Some(entry) = entry {
                    writes.want(number, entry, std::time::Instant::now());
                }
            }
            answer = answer => {
                let (number, _) = in_flight.take().expect("a write answered");
                match answer {
                    Ok(_) => {
                        if let Some(entry) = writes.acked(number) {
                            writer.written(entry);
                            done.send_replace(writes.durable());
                        }
                    }
                    Err(e) => {
                        writes.failed(number, std::time::Instant::now());
                        writer.fail(failure_of(&e), &e.to_string());
                        if e.is_refused_by_authorizer() {
                            // /readyz names the ACL until a write succeeds.
                            writer
                                .telemetry
                                .emit(RelayEvent::LedgerRefused(&e.to_string()));
                        }
                        renew(&mut topic);
                    }
                }
            }
            () = timer => {}
        }
    }
}

impl Writer {
    fn written(&self, entry: LedgerEntry) {
        self.telemetry
            .emit(RelayEvent::LedgerWritten(entry.confirmed_lsn));
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|e| e.identity() != entry.identity());
        known.push(entry);
    }

    fn fail(&self, reason: WriteFailure, detail: &str) {
        self.telemetry
            .emit(RelayEvent::LedgerWriteFailed { reason, detail });
    }
}

fn failure_of(e: &LedgerTopicError) -> WriteFailure {
    if e.is_write_timeout() {
        WriteFailure::TimedOut
    } else {
        WriteFailure::Refused
    }
}

/// A new producer for the next write: the old one may be the stuck one, and
/// a fresh one (a new producer id, new connections) writes at once.
fn renew(topic: &mut LedgerTopic) {
    if let Err(e) = topic.renew_producer() {
        tracing::debug!(error = %e, "cannot make a new ledger producer; retrying with the old one");
    }
}
