//! A sans-IO decoder for pgoutput, PostgreSQL's logical replication output
//! plugin, protocol versions 1 to 4.
//!
//! Input is the payload of one XLogData frame (the bytes after the 'w' header);
//! output is one [`LogicalMessage`]. Values are zero-copy slices of the input.
//!
//! The decoder is not stateless: from protocol 2 on, changes sent between
//! Stream Start and Stream Stop carry an extra xid after their tag, so whether
//! a stream block is open decides how the next message is laid out. The
//! [`Decoder`] tracks that, and therefore must see every message of the
//! stream, in order, and be replaced by a fresh one on reconnect.
//!
//! Decoding is strict: truncated fields, trailing bytes, messages the
//! negotiated protocol version does not have, and stream boundaries in the
//! wrong place are all errors, so a misread surfaces at the message that
//! caused it. Malformed input never panics and never allocates more than its
//! own size.

mod decode;
mod error;
mod messages;
mod reader;
mod tuple;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod test_encoder;
#[cfg(test)]
mod tests;

use bytes::Bytes;

pub use error::DecodeError;
pub use messages::*;

/// Decodes the messages of one replication stream.
#[derive(Debug, Clone)]
pub struct Decoder {
    protocol_version: u32,
    /// Between Stream Start and Stream Stop. Changes only on a message that
    /// decoded successfully.
    in_stream: bool,
}

impl Decoder {
    /// The protocol versions this decoder understands.
    pub const SUPPORTED_VERSIONS: std::ops::RangeInclusive<u32> = 1..=4;

    /// A decoder for a stream started with `proto_version` set to
    /// `protocol_version`. An unsupported version is reported by every
    /// [`Decoder::decode`] call rather than guessed at.
    pub fn new(protocol_version: u32) -> Self {
        Decoder {
            protocol_version,
            in_stream: false,
        }
    }

    pub fn protocol_version(&self) -> u32 {
        self.protocol_version
    }

    /// Whether a stream block (Stream Start … Stream Stop) is open.
    pub fn in_stream(&self) -> bool {
        self.in_stream
    }

    /// Decodes one pgoutput message (the payload of one XLogData frame, i.e.
    /// the bytes after the 'w' header). Values are zero-copy slices
    /// (`Bytes::slice`) of `data`.
    ///
    /// On error the decoder state is unchanged.
    pub fn decode(&mut self, data: Bytes) -> Result<LogicalMessage, DecodeError> {
        if !Self::SUPPORTED_VERSIONS.contains(&self.protocol_version) {
            return Err(DecodeError::UnsupportedProtocolVersion(
                self.protocol_version,
            ));
        }
        let ctx = decode::Context {
            protocol_version: self.protocol_version,
            in_stream: self.in_stream,
        };
        let message = decode::decode(data, ctx)?;
        match message {
            LogicalMessage::StreamStart(_) => self.in_stream = true,
            LogicalMessage::StreamStop => self.in_stream = false,
            _ => {}
        }
        Ok(message)
    }
}
