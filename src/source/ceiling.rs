//! [`ConfirmCeiling`]: the highest position a session may confirm, and
//! what the driver would confirm if it could.

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
///
/// The other way, the driver says what it would confirm
/// ([`ConfirmCeiling::want`]): whoever vouches learns whether anything
/// waits on it ([`ConfirmCeiling::waiting`]), and is woken when something
/// starts to ([`ConfirmCeiling::wants`]), so an idle relay need not vouch
/// on a fast beat for nothing.
#[derive(Debug, Clone)]
pub(crate) struct ConfirmCeiling {
    ceiling: Arc<watch::Sender<Lsn>>,
    wanted: Arc<watch::Sender<Lsn>>,
}

/// Moves a watched position up to `lsn`; never down. Wakes receivers only
/// when it moved.
fn raise_to(position: &watch::Sender<Lsn>, lsn: Lsn) {
    position.send_if_modified(|at| {
        let higher = lsn > *at;
        if higher {
            *at = lsn;
        }
        higher
    });
}

impl ConfirmCeiling {
    pub(crate) fn new(at: Lsn) -> Self {
        ConfirmCeiling {
            ceiling: Arc::new(watch::Sender::new(at)),
            wanted: Arc::new(watch::Sender::new(at)),
        }
    }

    /// Moves the ceiling up to `lsn`; never down.
    pub(crate) fn raise(&self, lsn: Lsn) {
        raise_to(&self.ceiling, lsn);
    }

    pub(crate) fn get(&self) -> Lsn {
        *self.ceiling.borrow()
    }

    /// A receiver that wakes on every raise.
    pub(crate) fn raises(&self) -> watch::Receiver<Lsn> {
        self.ceiling.subscribe()
    }

    /// The driver would confirm up to `lsn` (acked, or an idle keepalive);
    /// never down.
    pub(crate) fn want(&self, lsn: Lsn) {
        raise_to(&self.wanted, lsn);
    }

    /// Something the driver would confirm is held back by the ceiling.
    pub(crate) fn waiting(&self) -> bool {
        *self.wanted.borrow() > self.get()
    }

    /// A receiver that wakes whenever the driver wants more.
    pub(crate) fn wants(&self) -> watch::Receiver<Lsn> {
        self.wanted.subscribe()
    }
}
