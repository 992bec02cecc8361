//! Cancel-safe framing of backend messages over a (possibly TLS) socket.
//!
//! Frames are read with `read_buf` into a `BytesMut` and split off only when
//! complete, so a `read_message` future dropped by a losing `select!` branch
//! loses nothing. CopyData and CopyBothResponse are recognised here because
//! postgres-protocol's parser rejects `'W'`, and because CopyData payloads
//! should stay zero-copy `Bytes` for the decoder.
//!
//! With a [`MessageSkip`] set, a logical-decoding message outboxd does not
//! want is not buffered whole: its header is handed on with an empty content
//! and the content bytes are dropped as they arrive (`discard`), so a 1 GiB
//! message costs one read buffer. That state lives in `self` too, and each
//! call of `try_split_frame` changes it without awaiting: still cancel-safe.

use bytes::{Buf, Bytes, BytesMut};
use postgres_protocol::message::backend::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::{ReplicationError, ServerError};
use super::message_skip::{Decision, MessageSkip, MAX_HEADER_LEN};

/// Any byte stream: a TcpStream or a TLS stream over one.
pub(crate) trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// A backend frame, sorted the way the walsender flows need it.
pub(crate) enum Frame {
    CopyBothResponse,
    CopyData(Bytes),
    /// Anything else, parsed by postgres-protocol.
    Other(Message),
}

/// Upper bound on one frame. PostgreSQL caps a message at 1 GiB; a larger
/// length means a corrupt stream, not a big row.
const MAX_FRAME_LEN: usize = 1 << 30;

/// Initial read buffer; grows to the largest frame seen.
const READ_BUF_CAPACITY: usize = 64 * 1024;

pub(crate) struct FramedConnection {
    socket: Box<dyn Socket>,
    read_buf: BytesMut,
    /// Which messages are skipped as they stream; `None` before the stream
    /// starts (and in the startup flows).
    skip: Option<MessageSkip>,
    /// Bytes of a skipped message's content still to drop.
    discard: usize,
    pub(crate) write_buf: BytesMut,
    /// `user@host:port/db`, for errors.
    pub(crate) server: String,
}

impl FramedConnection {
    pub(crate) fn new(socket: Box<dyn Socket>, server: String) -> Self {
        FramedConnection {
            socket,
            read_buf: BytesMut::with_capacity(READ_BUF_CAPACITY),
            skip: None,
            discard: 0,
            write_buf: BytesMut::with_capacity(1024),
            server,
        }
    }

    /// Skip the messages `skip` does not keep from now on.
    pub(crate) fn skip_messages(&mut self, skip: MessageSkip) {
        self.skip = Some(skip);
    }

    /// Whether the next frame is inside a stream block (see [`MessageSkip`]).
    pub(crate) fn set_in_stream(&mut self, in_stream: bool) {
        if let Some(skip) = &mut self.skip {
            skip.set_in_stream(in_stream);
        }
    }

    fn io_err(&self, source: std::io::Error) -> ReplicationError {
        ReplicationError::Io {
            server: self.server.clone(),
            source,
        }
    }

    pub(crate) fn protocol_err(&self, reason: impl Into<String>) -> ReplicationError {
        ReplicationError::Protocol {
            server: self.server.clone(),
            reason: reason.into(),
        }
    }

    pub(crate) fn server_err(&self, error: ServerError) -> ReplicationError {
        ReplicationError::Server {
            server: self.server.clone(),
            error: Box::new(error),
        }
    }

    /// Reads the next frame. Cancel-safe.
    pub(crate) async fn read_frame(&mut self) -> Result<Frame, ReplicationError> {
        loop {
            if let Some(frame) = self.try_split_frame()? {
                return Ok(frame);
            }
            let n = self
                .socket
                .read_buf(&mut self.read_buf)
                .await
                .map_err(|e| self.io_err(e))?;
            if n == 0 {
                return Err(ReplicationError::Closed {
                    server: self.server.clone(),
                });
            }
        }
    }

    /// Splits one complete frame off the buffer, if there is one.
    fn try_split_frame(&mut self) -> Result<Option<Frame>, ReplicationError> {
        if self.drop_discarded() {
            return Ok(None);
        }
        if self.read_buf.len() < 5 {
            return Ok(None);
        }
        let tag = self.read_buf[0];
        let len = u32::from_be_bytes([
            self.read_buf[1],
            self.read_buf[2],
            self.read_buf[3],
            self.read_buf[4],
        ]) as usize;
        if !(4..=MAX_FRAME_LEN).contains(&len) {
            return Err(
                self.protocol_err(format!("frame {:?} with invalid length {len}", tag as char))
            );
        }
        let total = len + 1;
        if tag == b'd' {
            if let Some(frame) = self.try_skip(total) {
                return Ok(frame);
            }
        }
        if self.read_buf.len() < total {
            self.read_buf.reserve(total - self.read_buf.len());
            return Ok(None);
        }
        match tag {
            b'W' => {
                self.read_buf.advance(total);
                Ok(Some(Frame::CopyBothResponse))
            }
            b'd' => {
                let mut frame = self.read_buf.split_to(total).freeze();
                frame.advance(5);
                Ok(Some(Frame::CopyData(frame)))
            }
            _ => match Message::parse(&mut self.read_buf) {
                Ok(Some(msg)) => Ok(Some(Frame::Other(msg))),
                Ok(None) => Err(self.protocol_err("incomplete frame after length check")),
                Err(e) => {
                    Err(self.protocol_err(format!("unparseable {:?} frame: {e}", tag as char)))
                }
            },
        }
    }

    /// Drops buffered bytes of a skipped content; true while more are due.
    fn drop_discarded(&mut self) -> bool {
        let n = self.discard.min(self.read_buf.len());
        self.read_buf.advance(n);
        self.discard -= n;
        self.discard > 0
    }

    /// For a CopyData frame of `total` bytes (tag and length included) at
    /// the start of the buffer: `Some(None)` while its header is incomplete,
    /// `Some(Some(header))` when it is a message to skip, `None` to read it
    /// whole.
    fn try_skip(&mut self, total: usize) -> Option<Option<Frame>> {
        let skip = self.skip.as_ref()?;
        let head = self.read_buf.get(5..total.min(self.read_buf.len()))?;
        match skip.decide(head, total - 5) {
            Decision::Keep => None,
            Decision::NeedMore => {
                let wanted = (total - self.read_buf.len()).min(MAX_HEADER_LEN);
                self.read_buf.reserve(wanted);
                Some(None)
            }
            Decision::Skip {
                header_len,
                content_len,
            } => {
                let mut header = self.read_buf.split_to(5 + header_len);
                header.advance(5);
                // The content length becomes 0: the decoder sees a whole,
                // empty message at the same WAL position.
                let n = header.len();
                header[n - 4..].fill(0);
                self.discard = content_len;
                self.drop_discarded();
                Some(Some(Frame::CopyData(header.freeze())))
            }
        }
    }

    /// Sends and clears `write_buf`. Not cancel-safe: never call it inside a
    /// `select!` branch condition.
    pub(crate) async fn flush(&mut self) -> Result<(), ReplicationError> {
        let buf = self.write_buf.split();
        self.socket
            .write_all(&buf)
            .await
            .map_err(|e| self.io_err(e))?;
        self.socket.flush().await.map_err(|e| self.io_err(e))
    }

    /// Sends Terminate and closes the socket; errors are irrelevant by then.
    pub(crate) async fn close(mut self) {
        postgres_protocol::message::frontend::terminate(&mut self.write_buf);
        let _ = self.flush().await;
        let _ = self.socket.shutdown().await;
    }
}

#[cfg(test)]
impl FramedConnection {
    /// Bytes as if read from the socket.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        self.read_buf.extend_from_slice(bytes);
    }

    /// Every frame complete in what was fed so far.
    pub(crate) fn frames(&mut self) -> Result<Vec<Frame>, ReplicationError> {
        let mut out = Vec::new();
        while let Some(f) = self.try_split_frame()? {
            out.push(f);
        }
        Ok(out)
    }

    pub(crate) fn read_capacity(&self) -> usize {
        self.read_buf.capacity()
    }
}

#[cfg(test)]
#[path = "framed_tests.rs"]
mod tests;
