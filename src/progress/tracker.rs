//! The ack tracker: one FIFO of deliveries and checkpoints in WAL order.
//!
//! See the module documentation of [`crate::progress`] for the invariant.
//!
//! Layout: `deliveries[i]` is the delivery with id `base() + i`, where
//! `base() = next_id - deliveries.len()`. Acked deliveries are popped from the
//! front eagerly, so the front (if any) is always unacked and `base()` is the
//! oldest unacked id. Checkpoints are kept beside the deliveries as
//! `(lsn, watermark)` pairs: the checkpoint was pushed when `watermark` was the
//! next id to be issued, so it becomes confirmable once `base() >= watermark`.
//! Both queues only grow at the back and shrink at the front, and their
//! buffers are kept across `reset` (tests only): no per-operation allocation
//! beyond the amortized growth of the two deques.

use std::collections::VecDeque;
use std::fmt;

use crate::Lsn;

/// Identifies one pushed event until it is acked or failed.
///
/// Issued by [`AckTracker::push_event`] as a monotonically increasing
/// sequence that keeps increasing across `reset` (tests only), so a late
/// delivery report from before a reset is recognised as
/// [`TrackerError::Stale`] instead of being mistaken for a new delivery.
/// Only the tracker creates ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct DeliveryId(u64);

impl DeliveryId {
    /// The sequence number, e.g. for logs.
    pub(crate) fn get(self) -> u64 {
        self.0
    }

    /// Tests need ids the tracker never issued.
    #[cfg(test)]
    pub(super) const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }
}

impl fmt::Display for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A delivery report the tracker cannot match to a pending delivery.
///
/// All of them mean the caller's bookkeeping and the tracker disagree (except
/// `Stale`, which is expected after a reset): log them, they never corrupt the
/// tracker, which ignores the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TrackerError {
    /// The id was never issued by this tracker.
    #[error("delivery {0} was never issued")]
    Unknown(DeliveryId),
    /// The delivery was already acked.
    #[error("delivery {0} was already acked")]
    AlreadyAcked(DeliveryId),
    /// The delivery was issued before the last `reset` and was dropped by it.
    #[error("delivery {0} was dropped by a reset")]
    Stale(DeliveryId),
}

/// One pushed event, and what the caller handed to the producer for it
/// (see [`AckTracker::sent`]).
#[derive(Debug)]
struct Delivery<T> {
    bytes: usize,
    acked: bool,
    sent: Option<T>,
}

/// A position that becomes confirmable once every delivery before it is acked.
#[derive(Clone, Copy, Debug)]
struct Checkpoint {
    lsn: Lsn,
    /// The id the next pushed event got: ids below it precede the checkpoint.
    watermark: u64,
}

/// Tracks which WAL position can be confirmed to the replication slot, given
/// out-of-order Kafka acks. Pure: no I/O, no clock.
///
/// It also keeps, by delivery id, whatever the caller handed to the producer
/// for a delivery (`T`, the relay's record) until its report comes back, so
/// one structure owns what is in flight.
#[derive(Debug)]
pub(crate) struct AckTracker<T = ()> {
    /// Deliveries from the oldest unacked one on; see the file comment.
    deliveries: VecDeque<Delivery<T>>,
    /// Checkpoints not yet confirmable, with strictly increasing LSNs and
    /// non-decreasing watermarks.
    checkpoints: VecDeque<Checkpoint>,
    /// The id the next event gets.
    next_id: u64,
    /// The first id issued since the last reset; lower ids are stale.
    epoch_start: u64,
    /// What [`AckTracker::confirmable`] returns.
    confirmed: Lsn,
    /// The highest checkpoint accepted (or the start): lower ones are ignored.
    last_checkpoint: Lsn,
    /// Whether events were pushed since the last commit, i.e. a transaction
    /// with events is open and a keepalive is not a checkpoint.
    txn_open: bool,
    /// Pushed and not acked, counted here so acks in the middle of the deque
    /// stay O(1).
    in_flight: usize,
    in_flight_bytes: usize,
    /// Deliveries whose `sent` is `Some`.
    sent: usize,
    /// The first failed delivery; `Some` freezes `confirmed` until reset.
    failed: Option<DeliveryId>,
}

impl<T> AckTracker<T> {
    /// A tracker whose confirmable LSN starts at `start` (the slot's
    /// `confirmed_flush_lsn`, or the position replication starts from).
    pub(crate) fn new(start: Lsn) -> Self {
        Self::with_capacity(start, 0)
    }

    /// Like [`AckTracker::new`], with room for `events` in-flight deliveries
    /// before the first reallocation (e.g. the producer's queue limit).
    pub(crate) fn with_capacity(start: Lsn, events: usize) -> Self {
        Self {
            deliveries: VecDeque::with_capacity(events),
            checkpoints: VecDeque::new(),
            next_id: 0,
            epoch_start: 0,
            confirmed: start,
            last_checkpoint: start,
            txn_open: false,
            in_flight: 0,
            in_flight_bytes: 0,
            sent: 0,
            failed: None,
        }
    }

    /// Records an event handed to the producer, in WAL order, and returns the
    /// id to [`ack`](Self::ack) or [`fail`](Self::fail) it with. `bytes` is
    /// its size for [`in_flight_bytes`](Self::in_flight_bytes) (0 if unused).
    pub(crate) fn push_event(&mut self, bytes: usize) -> DeliveryId {
        let id = DeliveryId(self.next_id);
        self.deliveries.push_back(Delivery {
            bytes,
            acked: false,
            sent: None,
        });
        self.next_id += 1;
        self.in_flight += 1;
        self.in_flight_bytes += bytes;
        self.txn_open = true;
        self.debug_check();
        id
    }

    /// Records the end of a transaction (its Commit's **end** LSN), after its
    /// last event; also for transactions without events. An `end_lsn` not
    /// above the last checkpoint is ignored, so progress never goes back.
    pub(crate) fn commit(&mut self, end_lsn: Lsn) {
        self.txn_open = false;
        self.push_checkpoint(end_lsn);
    }

    /// Records an idle position reported by the server (keepalive
    /// `wal_end`), to be called only between transactions. Ignored while a
    /// transaction with events is open (a position inside a transaction is
    /// not a checkpoint) and when not above the last checkpoint.
    ///
    /// While deliveries are pending it waits behind them like a commit, so an
    /// idle outbox reaches the keepalive position as soon as the last ack
    /// arrives and does not pin WAL.
    pub(crate) fn keepalive(&mut self, lsn: Lsn) {
        if !self.txn_open {
            self.push_checkpoint(lsn);
        }
    }

    /// Records a successful delivery. Acks may arrive in any order. After a
    /// [`fail`](Self::fail), acks are ignored and return `Ok` until
    /// `reset` (tests only); the producer is being torn down by then.
    pub(crate) fn ack(&mut self, id: DeliveryId) -> Result<(), TrackerError> {
        if self.failed.is_some() {
            return Ok(());
        }
        let index = self.pending_index(id)?;
        let delivery = &mut self.deliveries[index];
        delivery.acked = true;
        if delivery.sent.take().is_some() {
            self.sent -= 1;
        }
        let bytes = delivery.bytes;
        // Counters cover exactly the unacked entries, so they cannot underflow.
        debug_assert!(self.in_flight > 0 && self.in_flight_bytes >= bytes);
        self.in_flight -= 1;
        self.in_flight_bytes -= bytes;
        if index == 0 {
            // Only acking the oldest unacked delivery can move `base()`.
            self.pop_acked();
            self.advance();
        }
        self.debug_check();
        Ok(())
    }

    /// Records a failed delivery (timed out, purged, fatal): Kafka may now
    /// have a gap, so [`confirmable`](Self::confirmable) freezes until
    /// `reset` (tests only). Only the first failure is kept; later
    /// `fail`s and `ack`s are ignored.
    ///
    /// An id that is `Unknown` or `AlreadyAcked` still poisons the tracker
    /// (the caller's bookkeeping is off, stopping is the safe side) and is
    /// reported. A `Stale` id belongs to deliveries the last reset dropped,
    /// which are re-read from the slot anyway: reported, no poisoning.
    pub(crate) fn fail(&mut self, id: DeliveryId) -> Result<(), TrackerError> {
        if self.failed.is_some() {
            return Ok(());
        }
        let result = self.pending_index(id).map(|_| ());
        if !matches!(result, Err(TrackerError::Stale(_))) {
            self.failed = Some(id);
        }
        result
    }

    /// Keeps `payload` as what was handed to the producer for `id`, until
    /// [`take_sent`](Self::take_sent). Returns it back if `id` is not pending.
    pub(crate) fn sent(&mut self, id: DeliveryId, payload: T) -> Result<(), T> {
        let Ok(index) = self.pending_index(id) else {
            return Err(payload);
        };
        if self.deliveries[index].sent.replace(payload).is_none() {
            self.sent += 1;
        }
        Ok(())
    }

    /// What was handed to the producer for the delivery numbered `raw` (a
    /// delivery report's id), taken back; `None` if nothing is (any more).
    pub(crate) fn take_sent(&mut self, raw: u64) -> Option<T> {
        let index = self.pending_index(DeliveryId(raw)).ok()?;
        let payload = self.deliveries[index].sent.take();
        if payload.is_some() {
            self.sent -= 1;
        }
        payload
    }

    /// Whether the producer holds the delivery `id` (see [`sent`](Self::sent)).
    pub(crate) fn is_sent(&self, id: DeliveryId) -> bool {
        self.pending_index(id)
            .is_ok_and(|index| self.deliveries[index].sent.is_some())
    }

    /// How many deliveries the producer holds.
    pub(crate) fn sent_count(&self) -> usize {
        self.sent
    }

    /// The oldest delivery the producer holds, and what it was handed.
    pub(crate) fn oldest_sent(&self) -> Option<(DeliveryId, &T)> {
        if self.sent == 0 {
            return None;
        }
        let base = self.base();
        self.deliveries
            .iter()
            .enumerate()
            .find_map(|(i, d)| d.sent.as_ref().map(|t| (DeliveryId(base + i as u64), t)))
    }

    /// What the producer holds, in id order.
    pub(crate) fn iter_sent(&self) -> impl Iterator<Item = &T> {
        self.deliveries.iter().filter_map(|d| d.sent.as_ref())
    }

    /// Takes back everything the producer holds, in id order.
    pub(crate) fn take_all_sent(&mut self) -> Vec<T> {
        self.sent = 0;
        self.deliveries
            .iter_mut()
            .filter_map(|d| d.sent.take())
            .collect()
    }

    /// The greatest checkpoint LSN such that every delivery pushed before it
    /// is acked (or the start). Never decreases between resets; frozen after
    /// a failure. This is what to send as the flush position.
    pub(crate) fn confirmable(&self) -> Lsn {
        self.confirmed
    }

    /// Deliveries pushed and not yet acked.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Sum of the `bytes` of the deliveries pushed and not yet acked.
    pub(crate) fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    /// The oldest unacked delivery: the one holding progress back.
    pub(crate) fn oldest_unacked(&self) -> Option<DeliveryId> {
        // The front is never acked (see `pop_acked`), so it is the oldest.
        (!self.deliveries.is_empty()).then(|| DeliveryId(self.base()))
    }

    /// The oldest unacked id, or `next_id` when nothing is unacked.
    fn base(&self) -> u64 {
        // Every issued id since the epoch start is either in the deque or
        // popped (acked) from its front, so the deque ends at `next_id`.
        self.next_id - self.deliveries.len() as u64
    }

    /// The deque index of `id` if it is pending (issued, not acked).
    fn pending_index(&self, id: DeliveryId) -> Result<usize, TrackerError> {
        if id.0 >= self.next_id {
            return Err(TrackerError::Unknown(id));
        }
        if id.0 < self.epoch_start {
            return Err(TrackerError::Stale(id));
        }
        // Ids of this epoch below `base()` were acked and popped.
        let index =
            id.0.checked_sub(self.base())
                .ok_or(TrackerError::AlreadyAcked(id))?;
        // `index < len` because `id < next_id = base() + len`: fits a usize.
        let index = index as usize;
        if self.deliveries[index].acked {
            return Err(TrackerError::AlreadyAcked(id));
        }
        Ok(index)
    }

    /// Queues a checkpoint at `lsn` after everything pushed so far.
    fn push_checkpoint(&mut self, lsn: Lsn) {
        if lsn <= self.last_checkpoint {
            // Clamp: a lower (or repeated) position must never lower progress.
            return;
        }
        self.last_checkpoint = lsn;
        let watermark = self.next_id;
        match self.checkpoints.back_mut() {
            // No event since the previous checkpoint: both become confirmable
            // at the same ack, so keep only the higher one. This bounds the
            // queue by the number of transactions with events in flight.
            Some(last) if last.watermark == watermark => last.lsn = lsn,
            _ => self.checkpoints.push_back(Checkpoint { lsn, watermark }),
        }
        self.advance();
        self.debug_check();
    }

    /// Pops acked deliveries off the front, keeping the front unacked.
    fn pop_acked(&mut self) {
        // Amortized O(1): each delivery is popped once.
        while self.deliveries.front().is_some_and(|d| d.acked) {
            self.deliveries.pop_front();
        }
    }

    /// Moves `confirmed` to the last checkpoint whose deliveries are all acked.
    fn advance(&mut self) {
        if self.failed.is_some() {
            // A failed delivery may be a gap in Kafka: never confirm past it.
            return;
        }
        let base = self.base();
        while let Some(checkpoint) = self.checkpoints.front().copied() {
            if checkpoint.watermark > base {
                break;
            }
            // Checkpoints are accepted only above `last_checkpoint`, which
            // starts at `confirmed`, so this only moves forward.
            debug_assert!(checkpoint.lsn > self.confirmed);
            self.confirmed = checkpoint.lsn;
            self.checkpoints.pop_front();
        }
    }

    /// Structural invariants, checked in debug builds after each mutation.
    /// O(1) so it does not change the complexity of debug test runs.
    fn debug_check(&self) {
        debug_assert!(
            self.epoch_start <= self.base(),
            "deque reaches into a previous epoch"
        );
        debug_assert!(
            self.deliveries.front().map_or(true, |d| !d.acked),
            "acked front not popped"
        );
        debug_assert!(self.in_flight <= self.deliveries.len());
        debug_assert!(self.sent <= self.in_flight);
        debug_assert_eq!(self.in_flight == 0, self.deliveries.is_empty());
        debug_assert!(self.confirmed <= self.last_checkpoint);
        debug_assert!(self
            .checkpoints
            .back()
            .map_or(true, |c| c.lsn == self.last_checkpoint));
        debug_assert!(self
            .checkpoints
            .back()
            .map_or(true, |c| c.watermark <= self.next_id));
        // Without a failure, `advance` leaves no confirmable checkpoint behind.
        debug_assert!(
            self.failed.is_some()
                || self
                    .checkpoints
                    .front()
                    .map_or(true, |c| c.watermark > self.base())
        );
    }
}

/// Asked only by the tests: the relay starts a tracker per session (no
/// reset) and reads only the confirmable position and the counts.
#[cfg(test)]
impl<T> AckTracker<T> {
    /// Starts over after a reconnect: drops every queued delivery and
    /// checkpoint, clears the failure, and restarts progress at `start` (the
    /// slot's `confirmed_flush_lsn`, which may be below the previous
    /// [`confirmable`](Self::confirmable) if that was never sent: the slot is
    /// the only offset that counts). Ids keep increasing; reports for the
    /// dropped ones come back as [`TrackerError::Stale`].
    pub(crate) fn reset(&mut self, start: Lsn) {
        // `clear` keeps the buffers, so a reconnect does not reallocate.
        self.deliveries.clear();
        self.checkpoints.clear();
        self.epoch_start = self.next_id;
        self.confirmed = start;
        self.last_checkpoint = start;
        self.txn_open = false;
        self.in_flight = 0;
        self.in_flight_bytes = 0;
        self.sent = 0;
        self.failed = None;
        self.debug_check();
    }

    /// The next LSN `confirmable` will move to: the oldest checkpoint still
    /// waiting for acks (or for a reset, after a failure).
    pub(crate) fn pending_checkpoint_lsn(&self) -> Option<Lsn> {
        self.checkpoints.front().map(|c| c.lsn)
    }

    /// The highest checkpoint accepted since the last reset (or the start):
    /// where `confirmable` ends up once everything in flight is acked.
    pub(crate) fn last_checkpoint_lsn(&self) -> Lsn {
        self.last_checkpoint
    }

    /// Nothing in flight and no checkpoint waiting: `confirmable` is the last
    /// checkpoint. Always false after a failure with checkpoints queued.
    pub(crate) fn is_idle(&self) -> bool {
        self.deliveries.is_empty() && self.checkpoints.is_empty()
    }

    /// Whether a delivery failed since the last reset.
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The first delivery reported to [`fail`](Self::fail) since the last
    /// reset.
    pub(crate) fn failed_delivery(&self) -> Option<DeliveryId> {
        self.failed
    }
}
