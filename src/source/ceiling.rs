//! [`ConfirmCeiling`]: the highest position a session may confirm.

use std::sync::Arc;

use tokio::sync::watch;

use crate::Lsn;

/// The highest position a session may confirm, raised by whoever vouches
/// for positions (the relay's table watch). Shared, so the watch can raise
/// it while the session confirms from anywhere in the relay; a raise wakes
/// the driver ([`ConfirmCeiling::raises`]), so a position held back only by
/// the ceiling is sent as soon as it is vouched for, not at the next status
/// period (which under a steady flow of acks was seen to add up to a
/// period, a whole `status_interval`, to the slot's lag).
#[derive(Debug, Clone)]
pub(crate) struct ConfirmCeiling(Arc<watch::Sender<Lsn>>);

impl ConfirmCeiling {
    pub(crate) fn new(at: Lsn) -> Self {
        ConfirmCeiling(Arc::new(watch::Sender::new(at)))
    }

    /// Moves the ceiling up to `lsn`; never down.
    pub(crate) fn raise(&self, lsn: Lsn) {
        self.0.send_if_modified(|at| {
            let higher = lsn > *at;
            if higher {
                *at = lsn;
            }
            higher
        });
    }

    pub(crate) fn get(&self) -> Lsn {
        *self.0.borrow()
    }

    /// A receiver that wakes on every raise.
    pub(crate) fn raises(&self) -> watch::Receiver<Lsn> {
        self.0.subscribe()
    }
}
