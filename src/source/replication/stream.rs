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
use super::protocol::{encode_status_update, parse_server_message, pg_now_us, ServerMessage};
use crate::Lsn;

/// How long `finish` waits for the server to acknowledge the end of the
/// stream; the server answers at once unless the connection is already gone.
const FINISH_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub struct ReplicationStream {
    framed: FramedConnection,
    /// Highest position sent in a status update.
    sent: Lsn,
    last_status_at: Instant,
    /// Highest WAL position the server told us about (XLogData or keepalive).
    received: Lsn,
}

impl ReplicationStream {
    pub(crate) fn new(framed: FramedConnection, start: Lsn) -> Self {
        ReplicationStream {
            framed,
            sent: start,
            last_status_at: Instant::now(),
            received: start,
        }
    }

    /// Next message from the server. Cancel-safe.
    pub async fn recv(&mut self) -> Result<ServerMessage, ReplicationError> {
        loop {
            match self.framed.read_frame().await? {
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
    pub async fn send_status(
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
        Ok(())
    }

    /// True when `interval` has passed since the last update, or `confirmed`
    /// is ahead of what the server was last told and at least `min_gap` has
    /// passed (so a busy relay batches its updates instead of sending one per
    /// transaction).
    pub fn status_due(&self, confirmed: Lsn, interval: Duration, min_gap: Duration) -> bool {
        let elapsed = self.last_status_at.elapsed();
        (confirmed > self.sent && elapsed >= min_gap) || elapsed >= interval
    }

    /// When the next interval-driven update is due.
    pub fn next_status_deadline(&self, interval: Duration) -> Instant {
        self.last_status_at + interval
    }

    pub fn last_sent(&self) -> Lsn {
        self.sent
    }

    pub fn received(&self) -> Lsn {
        self.received
    }

    /// Sends a final status update, ends the copy and closes the connection.
    pub async fn finish(mut self, confirmed: Lsn) -> Result<(), ReplicationError> {
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
