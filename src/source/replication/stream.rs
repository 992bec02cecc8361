//! A started replication stream: receive XLogData and keepalives, report
//! progress with standby status updates.
//!
//! The position reported is always chosen by the caller (the relay confirms
//! only what Kafka acked; `tail` what it printed) and never goes backwards:
//! the stream keeps the highest value it has sent and clamps to it.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;

use super::error::{ReplicationError, ServerError};
use super::framed::{Frame, FramedConnection};
use super::message_skip::MessageSkip;
use super::protocol::{encode_status_update, parse_server_message, pg_now_us, ServerMessage};
use crate::Lsn;

/// Silence allowed before the link is presumed dead, until the caller sets
/// its own with [`ReplicationStream::set_stream_timeout`].
pub(crate) const DEFAULT_STREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `finish` waits for the server to acknowledge the end of the
/// stream; the server answers at once unless the connection is already gone.
const FINISH_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct ReplicationStream {
    framed: FramedConnection,
    /// Highest position sent in a status update.
    sent: Lsn,
    last_status_at: Instant,
    /// Highest WAL position the server told us about (XLogData or keepalive).
    received: Lsn,
    liveness: Liveness,
}

/// When a silent stream is asked for a reply, and when it is presumed dead.
///
/// An idle walsender need not send anything, but it answers a status update
/// with the reply-requested flag at once. So after a third of the timeout
/// without a message the stream asks (and again after another third); if
/// nothing at all arrives within the timeout, the link is dead: a dropped
/// packet path (a dead switch, a moved VIP, a NAT timeout) sends no reset,
/// and the kernel would take many minutes to give up on its own.
#[derive(Debug, Clone)]
pub(crate) struct Liveness {
    timeout: Duration,
    /// Start of the current silence: the last message, or when the caller
    /// last resumed listening.
    since: Instant,
    probed_at: Option<Instant>,
}

impl Liveness {
    pub(crate) fn new(timeout: Duration, now: Instant) -> Liveness {
        Liveness {
            timeout,
            since: now,
            probed_at: None,
        }
    }

    /// A message arrived, or the caller was busy elsewhere (not reading):
    /// the silence starts over.
    pub(crate) fn heard(&mut self, now: Instant) {
        self.since = now;
        self.probed_at = None;
    }

    fn probe_every(&self) -> Duration {
        self.timeout / 3
    }

    /// When the next reply request is due.
    pub(crate) fn next_probe(&self) -> Instant {
        self.probed_at.unwrap_or(self.since) + self.probe_every()
    }

    pub(crate) fn probe_due(&self, now: Instant) -> bool {
        now >= self.next_probe()
    }

    pub(crate) fn probed(&mut self, now: Instant) {
        self.probed_at = Some(now);
    }

    /// When the link counts as dead if nothing arrives before.
    pub(crate) fn dead_at(&self) -> Instant {
        self.since + self.timeout
    }
}

impl ReplicationStream {
    pub(crate) fn new(framed: FramedConnection, start: Lsn) -> Self {
        ReplicationStream {
            framed,
            sent: start,
            last_status_at: Instant::now(),
            received: start,
            liveness: Liveness::new(DEFAULT_STREAM_TIMEOUT, Instant::now()),
        }
    }

    /// Skip the logical-decoding messages `skip` does not keep as they
    /// stream, never holding their content (see [`MessageSkip`]).
    pub(crate) fn skip_messages(&mut self, skip: MessageSkip) {
        self.framed.skip_messages(skip);
    }

    /// Whether the next message is inside a stream block (the decoder's
    /// state), which changes how a message's header is laid out.
    pub(crate) fn set_in_stream(&mut self, in_stream: bool) {
        self.framed.set_in_stream(in_stream);
    }

    /// Silence allowed before [`dead_at`](Self::dead_at) passes
    /// (`postgres.stream_timeout`).
    pub(crate) fn set_stream_timeout(&mut self, timeout: Duration) {
        self.liveness = Liveness::new(timeout, Instant::now());
    }

    /// The caller did not read for a while (backpressure, a handler waiting
    /// on Kafka): what the server sent meanwhile waits in the socket, so that
    /// time is no silence.
    pub(crate) fn reset_silence(&mut self) {
        self.liveness.heard(Instant::now());
    }

    /// When to send a status update asking for a reply (see [`Liveness`]).
    pub(crate) fn next_probe(&self) -> Instant {
        self.liveness.next_probe()
    }

    pub(crate) fn probe_due(&self) -> bool {
        self.liveness.probe_due(Instant::now())
    }

    /// When the stream counts as dead if nothing arrives before.
    pub(crate) fn dead_at(&self) -> Instant {
        self.liveness.dead_at()
    }

    /// The error for a stream silent past [`dead_at`](Self::dead_at).
    pub(crate) fn silent_error(&self) -> ReplicationError {
        ReplicationError::Silent {
            server: self.framed.server.clone(),
            seconds: self.liveness.timeout.as_secs(),
        }
    }

    /// Next message from the server. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Result<ServerMessage, ReplicationError> {
        loop {
            let frame = self.framed.read_frame().await?;
            self.liveness.heard(Instant::now());
            match frame {
                Frame::CopyData(data) => {
                    let msg = parse_server_message(data)
                        .map_err(|e| self.framed.protocol_err(e.to_string()))?;
                    let end = match &msg {
                        ServerMessage::XLogData {
                            wal_start, wal_end, ..
                        } => (*wal_start).max(*wal_end),
                        ServerMessage::Keepalive { wal_end, .. } => *wal_end,
                    };
                    self.received = self.received.max(end);
                    return Ok(msg);
                }
                Frame::Other(Message::ErrorResponse(body)) => {
                    return Err(self.framed.server_err(ServerError::from_body(&body)));
                }
                // The server ends the stream: CopyDone, or on a fast
                // shutdown the walsender's CommandComplete and ReadyForQuery
                // once it has sent everything. Either way: reconnect later.
                Frame::Other(Message::CopyDone)
                | Frame::Other(Message::CommandComplete(_))
                | Frame::Other(Message::ReadyForQuery(_)) => {
                    return Err(ReplicationError::Closed {
                        server: self.framed.server.clone(),
                    })
                }
                Frame::Other(Message::NoticeResponse(_))
                | Frame::Other(Message::ParameterStatus(_)) => {}
                Frame::Other(_) | Frame::CopyBothResponse => {
                    return Err(self
                        .framed
                        .protocol_err("unexpected message in replication stream"))
                }
            }
        }
    }

    /// Sends a standby status update confirming `confirmed` (clamped so the
    /// reported position never decreases). Not cancel-safe: call it from a
    /// handler body, not as a `select!` branch.
    pub(crate) async fn send_status(
        &mut self,
        confirmed: Lsn,
        reply_requested: bool,
    ) -> Result<(), ReplicationError> {
        self.sent = self.sent.max(confirmed);
        let mut buf = BytesMut::with_capacity(34);
        encode_status_update(self.sent, reply_requested, pg_now_us(), &mut buf);
        frontend::CopyData::new(buf.freeze())
            .map_err(|e| self.framed.protocol_err(e.to_string()))?
            .write(&mut self.framed.write_buf);
        self.framed.flush().await?;
        self.last_status_at = Instant::now();
        if reply_requested {
            self.liveness.probed(self.last_status_at);
        }
        Ok(())
    }

    /// True when `interval` has passed since the last update, or `confirmed`
    /// is ahead of what the server was last told and at least `min_gap` has
    /// passed (so a busy relay batches its updates instead of sending one per
    /// transaction).
    pub(crate) fn status_due(&self, confirmed: Lsn, interval: Duration, min_gap: Duration) -> bool {
        let elapsed = self.last_status_at.elapsed();
        (confirmed > self.sent && elapsed >= min_gap) || elapsed >= interval
    }

    /// When the next interval-driven update is due.
    pub(crate) fn next_status_deadline(&self, interval: Duration) -> Instant {
        self.last_status_at + interval
    }

    pub(crate) fn last_sent(&self) -> Lsn {
        self.sent
    }

    pub(crate) fn received(&self) -> Lsn {
        self.received
    }

    /// Sends a final status update, ends the copy and closes the connection.
    pub(crate) async fn finish(mut self, confirmed: Lsn) -> Result<(), ReplicationError> {
        self.send_status(confirmed, false).await?;
        frontend::copy_done(&mut self.framed.write_buf);
        self.framed.flush().await?;
        // Wait for the server to end its side too, so the status update above
        // has been processed before the connection goes away.
        let drain = async {
            loop {
                match self.framed.read_frame().await {
                    Ok(Frame::Other(Message::ReadyForQuery(_))) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(FINISH_DRAIN_TIMEOUT, drain).await;
        self.framed.close().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_stream_is_probed_twice_then_dead() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut l = Liveness::new(s(30), t0);
        assert!(!l.probe_due(t0 + s(9)));
        assert!(l.probe_due(t0 + s(10)));
        l.probed(t0 + s(10));
        assert!(!l.probe_due(t0 + s(19)));
        assert_eq!(l.next_probe(), t0 + s(20));
        assert_eq!(l.dead_at(), t0 + s(30));
        // Any message, e.g. the answer to a probe, starts the silence over.
        l.heard(t0 + s(11));
        assert_eq!(l.dead_at(), t0 + s(41));
        assert_eq!(l.next_probe(), t0 + s(21));
    }
}
