//! Ack-gated progress: which WAL position may be confirmed to the slot.
//!
//! # Invariant
//!
//! **The confirmable LSN is strictly below the end LSN of every transaction
//! that has an unacked event.** Hence a crash (or a reconnect after a failed
//! delivery) re-delivers at most the unacked window and never skips an event:
//! the server resends every transaction that commits after the confirmed
//! position. Consumers deduplicate on the `id` header.
//!
//! # How
//!
//! The relay reads the stream in WAL order and pushes, in that order, into
//! one FIFO ([`AckTracker`]):
//!
//! - each event handed to the producer ([`AckTracker::push_event`], which
//!   returns its [`DeliveryId`]; the record itself is kept with it until its
//!   report, [`AckTracker::sent`]);
//! - a checkpoint after the last event of each transaction: the Commit's
//!   **end** LSN ([`AckTracker::commit`], also for transactions without
//!   events), never its commit LSN, which would replay the transaction;
//! - a checkpoint for an idle position from a server keepalive
//!   ([`AckTracker::keepalive`], between transactions only), so an idle
//!   outbox does not pin WAL.
//!
//! Kafka acks deliveries out of order ([`AckTracker::ack`]); the confirmable
//! LSN ([`AckTracker::confirmable`]) moves to a checkpoint only once every
//! delivery before it is acked, and never moves back. A checkpoint not above
//! the last one is ignored. The invariant then follows from WAL order: a
//! transaction's end LSN is above every checkpoint pushed before its events,
//! and every checkpoint pushed after them waits for their acks.
//!
//! It relies on the caller pushing in WAL order (commit end LSNs increase
//! along the stream, as pgoutput sends them). A commit below an earlier
//! checkpoint is a caller bug the tracker can only ignore.
//!
//! A failed delivery ([`AckTracker::fail`]) may leave a gap in Kafka:
//! progress freezes for good. The relay then drops the producer and the
//! stream and starts a new session, with a new tracker, from the slot (the
//! tests do the same with `reset`).
//!
//! Pure and synchronous: no I/O, no clock, O(1) amortized per operation.

pub mod ledger;
mod tracker;

pub(crate) use tracker::{AckTracker, DeliveryId};

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
