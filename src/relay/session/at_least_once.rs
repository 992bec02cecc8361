//! At-least-once delivery (the default): one idempotent producer with the
//! gapless guarantee, whose acknowledgements are final. The slot follows
//! the acknowledgements; the position ledger is offered what the driver
//! confirmed after each turn and written by a task of its own.
//!
//! A record the broker refuses (too large for its topic, not authorised) is
//! no Kafka outage, but it ends its producer: with the gapless guarantee
//! librdkafka turns the refusal into a fatal error. So the session keeps its
//! replication stream and takes back what that producer held
//! ([`Session::take_back`]: acks stay acks, everything else waits in the
//! window), opens a fresh producer at once (no backoff, no reconnect) and
//! sends the taken-back records again in WAL order, each refused one alone,
//! before anything newer (`Session::resend_pending`). Duplicates are
//! bounded by the records in flight.
//!
//! A producer the watchdog finds stuck (`kafka.stuck_after`, see
//! [`watchdog`](super::watchdog)) is replaced the same way, its records
//! purged at once rather than waited for: they keep their tracker slots
//! until a fresh producer's acks, so the slot never passes them. A copy
//! the old producer had on the wire may still land later: a duplicate,
//! which consumers drop by the `id` header.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::types::RDKafkaErrorCode;
use tokio::time::Instant;

use super::mode::{producer, retire, DeliveryMode, Drain, Step, Stuck};
use super::parts::{Reconnect, Session};
use super::producer_watch::Watched;
use super::send::Trouble;
use super::telemetry::TelemetryEvent;
use super::watchdog::OldestSample;
use super::window::{ends_with_the_producer, InFlight, Window};
use crate::relay::error::RelayError;
use crate::relay::ledger::{RelayLedger, Start};
use crate::relay::settings::RelaySettings;
use crate::sink::{DeliveryReport, FailureKind, KafkaSink, SendError};
use crate::Lsn;

/// How long [`Session::take_back`] waits for the reports of the records
/// still in flight, first with only the queue purged (their real outcome
/// spares duplicates), then once more after purging them too.
const TAKE_BACK_WAIT: Duration = Duration::from_secs(5);

pub(super) struct AtLeastOnce {
    sink: KafkaSink,
    /// Since when the oldest record this producer holds has been the
    /// oldest, for the watchdog.
    oldest: OldestSample,
}

impl AtLeastOnce {
    /// Delivery reports on the producer's channel, statistics to the health
    /// endpoint when there is one.
    fn open(settings: &RelaySettings) -> Result<Self, RelayError> {
        let sink = producer(settings, None)?.0;
        Ok(AtLeastOnce {
            sink,
            oldest: OldestSample::default(),
        })
    }
}

/// Why a producer is being replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProducerEnd {
    /// A report said the broker refused a record: that explains the end.
    Refused,
    /// The producer failed; a refusal may explain it once its reports are
    /// in, or else Kafka is unreachable.
    Unexplained,
    /// The watchdog found it stuck while every partition had a leader
    /// (`kafka.stuck_after`): what it holds is purged at once and sent
    /// again on a fresh producer.
    Stuck,
}

/// What [`Session::take_back`] found among the last reports of a producer.
#[derive(Default)]
struct TakenBack {
    /// The broker refused a record (so the producer's end is explained).
    refused: bool,
    /// A failure that does mean Kafka is unreachable, or reports that never
    /// came: the session has to reconnect after all.
    outage: Option<String>,
}

impl DeliveryMode for AtLeastOnce {
    async fn start(
        settings: &RelaySettings,
        _ledger: &RelayLedger,
        _start: &Start,
        _start_lsn: Lsn,
        _ledger_key: &str,
    ) -> Result<Self, RelayError> {
        Self::open(settings)
    }

    #[inline]
    fn send(&mut self, entry: &mut InFlight) -> Result<(), SendError> {
        self.sink.send_record(entry.id.get(), &entry.record)
    }

    fn send_now(&self) {
        self.sink.send_now();
    }

    type News = Option<DeliveryReport>;

    async fn news(&mut self) -> Option<DeliveryReport> {
        self.sink.next_report().await
    }

    fn busy(&self) -> bool {
        false
    }

    /// Acknowledgements are final: the window alone decides.
    fn ceiling(&self) -> Lsn {
        Lsn::MAX
    }

    /// When the ledger writer would take the position the driver last
    /// confirmed, if it has not yet.
    fn wake_at(s: &Session<'_, Self>) -> Option<Instant> {
        let writer = s.ledger_writer.as_ref()?;
        let confirmed = s.stream.source.reported().confirmed;
        let at = writer.due_at(confirmed, std::time::Instant::now())?;
        Some(Instant::from_std(at))
    }

    /// A report, and every one already waiting behind it: one wake-up per
    /// burst of acks instead of one per ack.
    async fn on_news(s: &mut Session<'_, Self>, report: Option<DeliveryReport>) -> Step {
        let Some(report) = report else {
            return Ok(Some(Reconnect::producer_stopped()));
        };
        let mut next = Some(report);
        while let Some(report) = next {
            if let Some(end) = s.on_report(report).await? {
                return Ok(Some(end));
            }
            next = s.delivery.sink.try_report();
        }
        Ok(None)
    }

    /// Waits for Kafka to acknowledge something, in the middle of a batch
    /// whose turn is not told yet: so the window is told as it is, not as
    /// the last turn left it (CI saw 93 in flight where the queue held
    /// 100). For as long as a hung broker takes, but not for a stuck
    /// producer: the watchdog replaces it meanwhile (its records then wait
    /// in the window, and the one that found no room with them).
    async fn make_room(s: &mut Session<'_, Self>) -> Step {
        let reported = s.stream.source.reported();
        s.tell_turn(reported);
        s.next_report().await
    }

    /// Waits until nothing else is in flight, sends the suspect, and waits
    /// for its report before going on. Acked, it is acquitted (it was a
    /// batch-mate of the real culprit); refused alone, it is poison for
    /// certain.
    async fn trial(s: &mut Session<'_, Self>, mut entry: InFlight) -> Step {
        if let Some(end) = s.drain_reports(|w| w.with_producer() == 0).await? {
            return Ok(Some(end));
        }
        Window::isolate(&mut entry);
        let id = entry.id;
        if let Some(end) = s.deliver(entry).await? {
            return Ok(Some(end));
        }
        s.drain_reports(|w| !w.is_with_producer(id)).await
    }

    async fn refused(
        s: &mut Session<'_, Self>,
        entry: InFlight,
        code: RDKafkaErrorCode,
        kind: FailureKind,
        message: String,
    ) -> Step {
        if ends_with_the_producer(code) {
            // The producer died, most likely of a refusal whose report is
            // still on its way: take back what it held.
            s.window.hold(entry);
            return s.replace_producer(ProducerEnd::Unexplained, &message).await;
        }
        let error = SendError::Rejected {
            code,
            kind,
            message,
        };
        let cause = format!("delivery failed: {error}");
        s.telemetry.emit(TelemetryEvent::KafkaDown(&cause));
        Ok(Some(Reconnect::delivery(&error)))
    }

    async fn end_turn(s: &mut Session<'_, Self>) -> Step {
        let reported = s.confirm();
        // What the driver confirmed, which the tracker called confirmable:
        // the ledger never leads the acknowledgements.
        if let Some(writer) = s.ledger_writer.as_mut() {
            let now = std::time::Instant::now();
            if let Some(entry) =
                writer.offer(reported.confirmed, now, crate::clock::now_unix_micros())
            {
                s.ledger.submit(entry);
            }
        }
        Ok(None)
    }

    async fn drain(s: &mut Session<'_, Self>) -> Result<Drain, RelayError> {
        if s.window.halted().is_none() {
            let done = s.stream.drained && s.window.in_flight() == 0;
            return Ok(if done { Drain::Done } else { Drain::Going });
        }
        // Halted: nothing after the poison event is read, so its
        // transaction never finishes, and the poison event holds its
        // tracker slot for good. Only what the producer still holds can be
        // acked: once its reports are all on the channel, take them and
        // stop.
        if s.delivery.sink.in_queue() > 0 {
            return Ok(Drain::Going);
        }
        while let Some(report) = s.delivery.sink.try_report() {
            if let Some(end) = s.on_report(report).await? {
                return Ok(Drain::End(end));
            }
        }
        Ok(Drain::Done)
    }

    /// The ledger's last entry, for the position the stream finished at.
    async fn finish(s: &mut Session<'_, Self>, confirmed: Lsn) {
        let entry = s.ledger_writer.as_mut();
        if let Some(entry) = entry.and_then(|w| w.flush(confirmed, crate::clock::now_unix_micros()))
        {
            s.ledger.flush(entry).await;
        }
    }

    /// What the producer holds is reported or purged as it goes: nothing
    /// to wait for.
    async fn close(_s: &mut Session<'_, Self>) {}

    fn holding_since(s: &mut Session<'_, Self>, now: Instant) -> Option<Instant> {
        let oldest = s.window.oldest_with_producer().map(|entry| entry.id.get());
        s.delivery.oldest.observe(now, oldest)
    }

    fn holding(s: &Session<'_, Self>) -> (String, BTreeSet<String>) {
        let count = s.window.with_producer();
        let what = match s.window.oldest_with_producer() {
            Some(entry) => format!(
                "the oldest of {count} record(s) the producer holds (event {} for topic {}, \
                 commit LSN {}; its partition is known once acknowledged)",
                entry
                    .record
                    .event_id
                    .as_deref()
                    .map_or_else(|| "-".into(), |id| String::from_utf8_lossy(id).into_owned()),
                entry.record.topic,
                entry.event.commit_lsn,
            ),
            None => "no record".into(),
        };
        (what, s.window.topics_with_producer())
    }

    /// Purges everything the producer holds and sends it again on a fresh
    /// one, keeping the stream: duplicates are bounded by what it held.
    async fn replace_stuck(s: &mut Session<'_, Self>, stuck: Stuck<'_>) -> Step {
        s.telemetry.emit(TelemetryEvent::ProducerStuck {
            age: stuck.age,
            holding: stuck.holding,
            leaders: stuck.leaders,
            then: "new producer, sending again what the old one had not delivered",
        });
        let cause = format!(
            "the producer was stuck: {} unacknowledged for {:.1} s",
            stuck.holding,
            stuck.age.as_secs_f64()
        );
        s.replace_producer(ProducerEnd::Stuck, &cause).await
    }
}

impl Session<'_, AtLeastOnce> {
    /// One report: the window judges it, and the producer is replaced (or
    /// the session ends) when it asks for that.
    async fn on_report(&mut self, report: DeliveryReport) -> Step {
        match self.book(report) {
            None => Ok(None),
            // Suspect it (alone it was the culprit), and go on with a
            // fresh producer.
            Some(Trouble::Refusal(cause)) => {
                self.replace_producer(ProducerEnd::Refused, &cause).await
            }
            Some(Trouble::ProducerEnded(cause)) => {
                self.replace_producer(ProducerEnd::Unexplained, &cause)
                    .await
            }
            Some(Trouble::Outage(cause)) => Ok(Some(self.give_up(&cause))),
        }
    }

    /// Handles delivery reports until `done` holds (or the session must end).
    async fn drain_reports(&mut self, done: impl Fn(&Window<'_>) -> bool) -> Step {
        while !done(&self.window) && self.window.halted().is_none() {
            if let Some(end) = self.next_report().await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// Waits for the next report and handles it, or for the watchdog to
    /// replace the producer (which takes back what it held).
    async fn next_report(&mut self) -> Step {
        let report = self
            .watched(|mode: &mut AtLeastOnce| Box::pin(mode.sink.next_report()))
            .await?;
        match report {
            Watched::Done(Some(report)) => self.on_report(report).await,
            Watched::Done(None) => Ok(Some(Reconnect::producer_stopped())),
            Watched::Replaced(end) => Ok(end),
        }
    }

    /// Takes back what the producer held and replaces it, keeping the
    /// stream. Falls back to a reconnect when Kafka turns out to be
    /// unreachable too, or when a fatal error is not explained by a refusal
    /// (`cause`).
    async fn replace_producer(&mut self, why: ProducerEnd, cause: &str) -> Step {
        let found = self.take_back(why).await;
        if let Some(outage) = found.outage {
            return Ok(Some(self.give_up(&outage)));
        }
        if why == ProducerEnd::Unexplained && !found.refused {
            return Ok(Some(self.give_up(cause)));
        }
        let fresh = AtLeastOnce::open(self.settings)?;
        retire(std::mem::replace(&mut self.delivery, fresh).sink);
        if why != ProducerEnd::Stuck {
            self.telemetry.emit(TelemetryEvent::ProducerReplaced {
                waiting: self.window.waiting(),
            });
        }
        Ok(None)
    }

    /// Collects the reports of everything the producer holds: the window
    /// judges each as it does any report; what never reports waits to be
    /// sent again. A stuck producer's in-flight records are purged at
    /// once: their real outcome is what it could not get.
    async fn take_back(&mut self, why: ProducerEnd) -> TakenBack {
        let mut found = TakenBack::default();
        let steps: &[bool] = match why {
            ProducerEnd::Stuck => &[true],
            ProducerEnd::Refused | ProducerEnd::Unexplained => &[false, true],
        };
        for &purge_in_flight in steps {
            if self.window.with_producer() == 0 {
                break;
            }
            if purge_in_flight {
                self.delivery.sink.purge();
            } else {
                self.delivery.sink.purge_queued();
            }
            let deadline = Instant::now() + TAKE_BACK_WAIT;
            while self.window.with_producer() > 0 {
                let next = tokio::time::timeout_at(deadline, self.delivery.sink.next_report());
                let Ok(Some(report)) = next.await else {
                    break;
                };
                match self.book(report) {
                    Some(Trouble::Refusal(_)) => found.refused = true,
                    Some(Trouble::Outage(cause)) => {
                        found.outage.get_or_insert(cause);
                    }
                    Some(Trouble::ProducerEnded(_)) | None => {}
                }
            }
        }
        if self.window.with_producer() > 0 {
            found.outage.get_or_insert(format!(
                "no delivery report for {} record(s) from the producer being replaced",
                self.window.with_producer()
            ));
            self.window.take_back_unreported();
        }
        found
    }
}
