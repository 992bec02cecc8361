//! The walsender's driver: one task that alone owns the replication stream,
//! in the manner of tokio-postgres's `Connection`, and a cheap
//! [`SourceHandle`] the relay (or `outboxd tail`) talks to it through.
//!
//! The task reads, decodes and assembles, and hands on what it found in WAL
//! order over a bounded channel ([`Streamed`]), idle checkpoints from
//! keepalives included, so their order with the commits holds. It keeps the
//! walsender alive on its own: status updates on its own timer, a reply-
//! requested keepalive answered at once, the silence detector. Whatever the
//! consumer is doing (waiting on Kafka, a full window), the server keeps
//! hearing from us; when the channel is full the task stops reading the
//! socket (the server keeps the WAL) but not its timers.
//!
//! Progress comes the other way as a [`watch`] of the confirmable position:
//! a status update never reports less than before, nor more than the
//! [`ConfirmCeiling`]. The driver tells the ceiling what it would confirm
//! (so the table watch knows whether anything waits on it), and measures
//! how long a confirmable position waits to be confirmed
//! (`outboxd_confirmation_lag_seconds`, [`ConfirmationLag`]).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::assembler::{IgnoredCounts, SourceItem, TransactionAssembler};
use super::ceiling::ConfirmCeiling;
use super::confirmation_lag::ConfirmationLag;
use super::error::SourceError;
use super::pgoutput::Decoder;
use super::replication::{MessageSkip, ReplicationError, ReplicationStream, ServerMessage};
use crate::Lsn;

/// Items the driver may read ahead of its consumer. Small: the consumer has
/// its own window (`relay.max_in_flight_*`); this only smooths the hand-over.
const CHANNEL_CAPACITY: usize = 256;

/// Least time between two status updates while the confirmable position
/// moves: batches updates under load, still confirms within a blink.
const MIN_STATUS_GAP: Duration = Duration::from_millis(100);

/// What the driver hands on, in WAL order.
#[derive(Debug)]
pub(crate) enum Streamed {
    /// An event, or the checkpoint after a transaction's last event.
    /// `received_at`: when the message carrying it arrived.
    Item {
        item: SourceItem,
        received_at: Instant,
    },
    /// A server keepalive with no transaction open: everything before
    /// `wal_end` has been handed on, so it is an idle checkpoint.
    Idle(Lsn),
    /// After [`SourceHandle::drain`]: the open transaction is complete and
    /// nothing more follows.
    Drained,
}

/// What the driver last told the server, for metrics and health.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Reported {
    /// The position in the last status update.
    pub(crate) confirmed: Lsn,
    /// The highest WAL position the server told us about.
    pub(crate) received: Lsn,
    /// Changes filtered out, as of the last status update: confirmed past,
    /// they are never read (or counted) again.
    pub(crate) ignored: IgnoredCounts,
}

/// How the driver keeps the walsender alive.
#[derive(Debug, Clone)]
pub(crate) struct DriverOptions {
    /// `postgres.status_interval`.
    pub(crate) status_interval: Duration,
    /// `postgres.stream_timeout`: silence before the link counts as dead.
    pub(crate) stream_timeout: Duration,
    /// `None`: confirm whatever the consumer says (`outboxd tail`).
    pub(crate) ceiling: Option<ConfirmCeiling>,
    /// Where the confirmation lag is told (`outboxd_confirmation_lag_seconds`
    /// in the relay), if anywhere.
    pub(crate) lag_gauge: Option<metrics::Gauge>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Stream,
    Drain,
    Finish,
}

/// The consumer's side of a running driver. Dropping it stops the driver
/// (the connection closes without a final status update).
pub(crate) struct SourceHandle {
    items: mpsc::Receiver<Streamed>,
    confirm: watch::Sender<Lsn>,
    control: watch::Sender<Control>,
    reported: watch::Receiver<Reported>,
    task: JoinHandle<Result<(), SourceError>>,
    /// The task's outcome, once taken from `task`.
    ended: Option<Result<(), SourceError>>,
}

impl Drop for SourceHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SourceHandle {
    pub(crate) fn spawn(
        stream: ReplicationStream,
        decoder: Decoder,
        assembler: TransactionAssembler,
        start: Lsn,
        wal_sender_timeout: Duration,
        opts: DriverOptions,
    ) -> SourceHandle {
        let (items_tx, items) = mpsc::channel(CHANNEL_CAPACITY);
        let (confirm, confirm_rx) = watch::channel(start);
        let (control, control_rx) = watch::channel(Control::Stream);
        let (reported_tx, reported) = watch::channel(Reported {
            confirmed: start,
            received: start,
            ignored: IgnoredCounts::default(),
        });
        let mut stream = stream;
        stream.set_stream_timeout(opts.stream_timeout);
        // Messages the assembler would ignore are dropped as they stream:
        // only their header reaches the decoder (issue: a 200 MB message of
        // another prefix used to be held whole).
        stream.skip_messages(MessageSkip::new(assembler.message_prefixes()));
        let driver = Driver {
            stream,
            decoder,
            assembler,
            raises: opts.ceiling.as_ref().map(|c| c.raises()),
            lag: opts
                .lag_gauge
                .map(|gauge| (ConfirmationLag::default(), gauge)),
            ceiling: opts.ceiling,
            items: items_tx,
            confirm: confirm_rx,
            control: control_rx,
            reported: reported_tx,
            period: status_period(opts.status_interval, wal_sender_timeout),
            pending: VecDeque::new(),
            drained: false,
            was_reading: true,
            scratch: Vec::new(),
        };
        SourceHandle {
            items,
            confirm,
            control,
            reported,
            task: tokio::spawn(driver.run()),
            ended: None,
        }
    }

    /// The next item in WAL order, or the error that ended the driver.
    /// Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Result<Streamed, SourceError> {
        match self.items.recv().await {
            Some(s) => Ok(s),
            None => Err(self.failure().await),
        }
    }

    /// [`recv`](Self::recv) while the consumer is `reading`; otherwise only
    /// the driver's [`failure`](Self::failure). Cancel-safe.
    pub(crate) async fn next(&mut self, reading: bool) -> Result<Streamed, SourceError> {
        if reading {
            self.recv().await
        } else {
            Err(self.failure().await)
        }
    }

    /// The next item if one is waiting.
    pub(crate) fn try_recv(&mut self) -> Option<Streamed> {
        self.items.try_recv().ok()
    }

    /// Resolves with the error that ended the driver: for a consumer that
    /// is not calling [`recv`](Self::recv) (backpressure) and still needs to
    /// know the stream is gone. Cancel-safe.
    pub(crate) async fn failure(&mut self) -> SourceError {
        if self.ended.is_none() {
            let outcome = match (&mut self.task).await {
                Ok(r) => r,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Aborted: only by our own Drop, which cannot be running.
                Err(_) => Ok(()),
            };
            self.ended = Some(outcome);
        }
        match self.ended.take() {
            Some(Err(e)) => {
                self.ended = Some(Ok(()));
                e
            }
            // Ended without an error (finished), or the error was taken
            // already: this never resolves.
            other => {
                self.ended = other;
                std::future::pending().await
            }
        }
    }

    /// Everything up to `lsn` may be confirmed (within the ceiling). Lower
    /// values than before are ignored.
    pub(crate) fn confirm(&self, lsn: Lsn) {
        self.confirm.send_if_modified(|at| {
            let higher = lsn > *at;
            if higher {
                *at = lsn;
            }
            higher
        });
    }

    /// Stop reading once the open transaction is complete; a
    /// [`Streamed::Drained`] follows its last item.
    pub(crate) fn drain(&self) {
        self.control.send_if_modified(|c| {
            let first = *c == Control::Stream;
            if first {
                *c = Control::Drain;
            }
            first
        });
    }

    /// What the driver last told the server.
    pub(crate) fn reported(&self) -> Reported {
        *self.reported.borrow()
    }

    /// Status updates as they are sent: a receiver of its own, so a
    /// consumer can wait for one beside [`next`](Self::next).
    pub(crate) fn status_updates(&self) -> StatusUpdates {
        StatusUpdates(self.reported.clone())
    }

    /// Confirms `confirmed` (within the ceiling) in a last status update
    /// and closes the connection cleanly.
    pub(crate) async fn finish(&mut self, confirmed: Lsn) -> Result<(), SourceError> {
        self.confirm(confirmed);
        let _ = self.control.send(Control::Finish);
        match self.ended.replace(Ok(())) {
            Some(outcome) => outcome,
            None => match (&mut self.task).await {
                Ok(outcome) => outcome,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Ok(()),
            },
        }
    }
}

/// See [`SourceHandle::status_updates`].
pub(crate) struct StatusUpdates(watch::Receiver<Reported>);

impl StatusUpdates {
    /// Resolves when the driver has told the server something since this
    /// last resolved; never once the driver is gone. Cancel-safe.
    pub(crate) async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// How often the driver sends a status update unasked: the configured
/// interval, but at least three times per `wal_sender_timeout`, since while
/// the consumer holds back these updates are all the server hears from us.
fn status_period(status_interval: Duration, wal_sender_timeout: Duration) -> Duration {
    if wal_sender_timeout.is_zero() {
        status_interval
    } else {
        status_interval.min(wal_sender_timeout / 3)
    }
}

struct Driver {
    stream: ReplicationStream,
    decoder: Decoder,
    assembler: TransactionAssembler,
    /// `None` for `outboxd tail`, which confirms what it is told.
    ceiling: Option<ConfirmCeiling>,
    /// The [`ConfirmCeiling`]'s raises: each may let a held-back position go.
    raises: Option<watch::Receiver<Lsn>>,
    /// With a ceiling (the relay): how long confirmable positions wait.
    lag: Option<(ConfirmationLag, metrics::Gauge)>,
    items: mpsc::Sender<Streamed>,
    confirm: watch::Receiver<Lsn>,
    control: watch::Receiver<Control>,
    reported: watch::Sender<Reported>,
    /// Unasked status updates go at least this often.
    period: Duration,
    /// Read and not yet handed on (the channel was full): the socket is not
    /// read again until these are gone.
    pending: VecDeque<Streamed>,
    /// [`Streamed::Drained`] is queued: nothing more is read.
    drained: bool,
    /// The last turn of the loop read the socket.
    was_reading: bool,
    scratch: Vec<SourceItem>,
}

impl Driver {
    async fn run(mut self) -> Result<(), SourceError> {
        loop {
            let control = *self.control.borrow_and_update();
            if control == Control::Finish {
                return self.finish().await;
            }
            if control == Control::Drain && !self.drained && !self.assembler.in_transaction() {
                self.drained = true;
                self.pending.push_back(Streamed::Drained);
            }
            self.confirmable_now();
            let reading = self.pending.is_empty() && !self.drained;
            if !(reading && self.was_reading) {
                // Not listening is no silence: what the server sends waits
                // in the socket (up to the turn that resumes reading).
                self.stream.reset_silence();
            }
            self.was_reading = reading;
            let target = self.target();
            let mut status_at = if target > self.stream.last_sent() {
                self.stream.next_status_deadline(MIN_STATUS_GAP)
            } else {
                self.stream.next_status_deadline(self.period)
            };
            if reading {
                status_at = status_at.min(self.stream.next_probe());
            }
            let status_at = Instant::from_std(status_at);
            self.stream.set_in_stream(self.decoder.in_stream());
            let dead_at = Instant::from_std(self.stream.dead_at());
            tokio::select! {
                biased;
                changed = self.control.changed() => {
                    // The handle is gone: nobody to stream for.
                    if changed.is_err() {
                        return Ok(());
                    }
                }
                _ = tokio::time::sleep_until(status_at) => {
                    let probe = reading && self.stream.probe_due();
                    if probe || self.stream.status_due(target, self.period, MIN_STATUS_GAP) {
                        self.send_status(probe).await?;
                    }
                }
                changed = self.confirm.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                }
                // Vouched for up to a higher position: what the ceiling held
                // back is sent within `MIN_STATUS_GAP`, not a period later.
                _ = ceiling_raised(&mut self.raises) => {}
                // Owned: a borrowed permit would hold `self` for the whole
                // `select!`.
                permit = self.items.clone().reserve_owned(), if !self.pending.is_empty() => {
                    let Ok(permit) = permit else { return Ok(()) };
                    if let Some(first) = self.pending.pop_front() {
                        permit.send(first);
                    }
                    self.hand_on();
                }
                // Nothing arrived, not even the answer to a reply request.
                _ = tokio::time::sleep_until(dead_at), if reading => {
                    return Err(self.stream.silent_error().into());
                }
                msg = self.stream.recv(), if reading => {
                    let msg = msg?;
                    self.on_message(msg).await?;
                    self.hand_on();
                }
            }
        }
    }

    /// Hands on what fits in the channel without waiting.
    fn hand_on(&mut self) {
        while let Some(next) = self.pending.pop_front() {
            match self.items.try_send(next) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(next))
                | Err(mpsc::error::TrySendError::Closed(next)) => {
                    self.pending.push_front(next);
                    return;
                }
            }
        }
    }

    async fn on_message(&mut self, msg: ServerMessage) -> Result<(), SourceError> {
        match msg {
            ServerMessage::XLogData {
                wal_start, data, ..
            } => {
                let received_at = Instant::now();
                let decoded = self
                    .decoder
                    .decode(data)
                    .map_err(|source| SourceError::Decode {
                        lsn: wal_start,
                        source,
                    })?;
                self.assembler
                    .handle(decoded, &mut self.scratch)
                    .map_err(|source| SourceError::Assemble {
                        lsn: wal_start,
                        source,
                    })?;
                self.pending.extend(
                    self.scratch
                        .drain(..)
                        .map(|item| Streamed::Item { item, received_at }),
                );
            }
            ServerMessage::Keepalive {
                wal_end,
                reply_requested,
            } => {
                if !self.assembler.in_transaction() {
                    self.pending.push_back(Streamed::Idle(wal_end));
                }
                if reply_requested {
                    self.send_status(false).await?;
                }
            }
        }
        Ok(())
    }

    /// The confirmable position lowered to the ceiling.
    fn target(&self) -> Lsn {
        let confirmable = *self.confirm.borrow();
        match &self.ceiling {
            Some(c) => confirmable.min(c.get()),
            None => confirmable,
        }
    }

    /// Tells the ceiling what the consumer would confirm, and the lag what
    /// waits; refreshes the lag's gauge. Each turn of the loop: at least
    /// once per status period while anything waits (the period's update).
    fn confirmable_now(&mut self) {
        let confirmable = *self.confirm.borrow();
        if let Some(c) = &self.ceiling {
            c.want(confirmable);
        }
        if let Some((lag, gauge)) = &mut self.lag {
            let now = Instant::now();
            lag.confirmable(confirmable, now);
            lag.confirmed(self.stream.last_sent());
            gauge.set(lag.lag(now).as_secs_f64());
        }
    }

    async fn send_status(&mut self, reply_requested: bool) -> Result<(), ReplicationError> {
        // Counted before the server may drop what they were counted from.
        let ignored = self.assembler.ignored();
        self.stream
            .send_status(self.target(), reply_requested)
            .await?;
        let (confirmed, received) = (self.stream.last_sent(), self.stream.received());
        self.reported.send_replace(Reported {
            confirmed,
            received,
            ignored,
        });
        Ok(())
    }

    async fn finish(self) -> Result<(), SourceError> {
        let confirmed = self.target();
        let mut reported = *self.reported.borrow();
        reported.ignored = self.assembler.ignored();
        self.stream.finish(confirmed).await?;
        reported.confirmed = reported.confirmed.max(confirmed);
        self.reported.send_replace(reported);
        Ok(())
    }
}

/// Resolves when the ceiling rises; never without a ceiling (`outboxd
/// tail`) or once its owner is gone. Cancel-safe.
async fn ceiling_raised(ceiling: &mut Option<watch::Receiver<Lsn>>) {
    let raised = match ceiling {
        Some(raises) => raises.changed().await.is_ok(),
        None => false,
    };
    if !raised {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_updates_go_at_least_three_times_per_server_timeout() {
        let s = Duration::from_secs;
        assert_eq!(status_period(s(1), s(60)), s(1));
        assert_eq!(status_period(s(10), s(3)), s(1));
        // wal_sender_timeout = 0: the server never times out.
        assert_eq!(status_period(s(10), Duration::ZERO), s(10));
    }
}
