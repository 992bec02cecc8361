//! What this process knows of the slot from streaming it: whether a session
//! opened a stream (the last one, and any), and the position confirmed last
//! and when it moved there. The relay's decisions about the slot (never create one once
//! streamed; the lost slot's message) are made from this record, which its
//! sessions write; the health endpoint's state only reports.

use std::time::SystemTime;

use crate::clock::unix_micros;

use crate::Lsn;

pub(super) struct SlotRecord {
    /// The current session opened a replication stream.
    opened: bool,
    /// A session of this process streamed the slot.
    streamed: bool,
    /// The position the driver last confirmed to the slot.
    confirmed: Lsn,
    /// When `confirmed` last moved.
    moved_at: SystemTime,
}

impl SlotRecord {
    pub(super) fn new() -> Self {
        SlotRecord {
            opened: false,
            streamed: false,
            confirmed: Lsn(0),
            moved_at: SystemTime::now(),
        }
    }

    /// A session opened the stream, starting at `start`.
    pub(super) fn stream_opened(&mut self, start: Lsn) {
        self.opened = true;
        self.confirmed(start);
    }

    /// The driver confirmed `lsn` to the slot. Called on every turn of the
    /// session's loop; reads the clock only when the position moved (at
    /// most once per status update).
    pub(super) fn confirmed(&mut self, lsn: Lsn) {
        if lsn != self.confirmed {
            self.confirmed = lsn;
            self.moved_at = SystemTime::now();
        }
    }

    /// Whether the session that just ended had opened a stream; the next
    /// one starts without.
    pub(super) fn session_ended(&mut self) -> bool {
        let opened = std::mem::take(&mut self.opened);
        self.streamed |= opened;
        opened
    }

    /// Whether a session of this process has streamed the slot: a slot
    /// missing now was dropped or lost, not yet to be created.
    pub(super) fn streamed(&self) -> bool {
        self.streamed
    }

    /// The position last confirmed, and when (Unix time in microseconds) it
    /// moved there.
    pub(super) fn last_confirmed(&self) -> (Lsn, i64) {
        (self.confirmed, unix_micros(self.moved_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_that_opened_no_stream_leaves_no_mark() {
        let mut r = SlotRecord::new();
        assert!(!r.session_ended());
        assert!(!r.streamed());
        r.stream_opened(Lsn(100));
        assert!(r.session_ended());
        assert!(!r.session_ended(), "the next session has not opened one");
        assert!(r.streamed(), "but this process has streamed the slot");
    }

    #[test]
    fn the_confirmed_time_is_when_the_position_last_moved() {
        let mut r = SlotRecord::new();
        r.stream_opened(Lsn(100));
        let (lsn, moved) = r.last_confirmed();
        assert_eq!(lsn, Lsn(100));
        std::thread::sleep(std::time::Duration::from_millis(5));
        r.confirmed(Lsn(100));
        assert_eq!(r.last_confirmed(), (Lsn(100), moved), "it did not move");
        r.confirmed(Lsn(200));
        let (lsn, later) = r.last_confirmed();
        assert_eq!(lsn, Lsn(200));
        assert!(later > moved);
    }
}
