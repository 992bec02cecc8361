//! Cancel-safe framing of backend messages over a (possibly TLS) socket.
//!
//! Frames are read with `read_buf` into a `BytesMut` and split off only when
//! complete, so a `read_message` future dropped by a losing `select!` branch
//! loses nothing. CopyData and CopyBothResponse are recognised here because
//! postgres-protocol's parser rejects `'W'`, and because CopyData payloads
//! should stay zero-copy `Bytes` for the decoder.

use bytes::{Buf, Bytes, BytesMut};
use postgres_protocol::message::backend::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::{ReplicationError, ServerError};

/// Any byte stream: a TcpStream or a TLS stream over one.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// A backend frame, sorted the way the walsender flows need it.
pub enum Frame {
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

pub struct FramedConnection {
    socket: Box<dyn Socket>,
    read_buf: BytesMut,
    pub(crate) write_buf: BytesMut,
    /// `user@host:port/db`, for errors.
    pub(crate) server: String,
}

impl FramedConnection {
    pub fn new(socket: Box<dyn Socket>, server: String) -> Self {
        FramedConnection {
            socket,
            read_buf: BytesMut::with_capacity(READ_BUF_CAPACITY),
            write_buf: BytesMut::with_capacity(1024),
            server,
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
    pub async fn read_frame(&mut self) -> Result<Frame, ReplicationError> {
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

    /// Sends and clears `write_buf`. Not cancel-safe: never call it inside a
    /// `select!` branch condition.
    pub async fn flush(&mut self) -> Result<(), ReplicationError> {
        let buf = self.write_buf.split();
        self.socket
            .write_all(&buf)
            .await
            .map_err(|e| self.io_err(e))?;
        self.socket.flush().await.map_err(|e| self.io_err(e))
    }

    /// Sends Terminate and closes the socket; errors are irrelevant by then.
    pub async fn close(mut self) {
        postgres_protocol::message::frontend::terminate(&mut self.write_buf);
        let _ = self.flush().await;
        let _ = self.socket.shutdown().await;
    }
}
