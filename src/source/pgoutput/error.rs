//! Why a pgoutput message could not be decoded.
//!
//! Every variant means the bytes are not what the negotiated protocol promises:
//! a bug, a version mismatch or corruption. None of them is fixed by retrying
//! the same message, so callers should treat them as fatal for the stream and
//! report the error (reconnecting replays the same bytes).

/// A pgoutput message that does not follow the documented layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message ended before a field was complete.
    #[error("{message} message truncated: needed {needed} more bytes, {remaining} left")]
    Truncated {
        message: &'static str,
        needed: usize,
        remaining: usize,
    },

    /// The first byte names no pgoutput message.
    #[error("unknown pgoutput message tag '{}'", .0.escape_ascii())]
    UnknownTag(u8),

    /// A name field is not UTF-8. Names are decoded as UTF-8 because the relay
    /// requires a UTF-8 server encoding; anything else is a misconfiguration.
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 { field: &'static str },

    /// A C string ran to the end of the message without its terminating NUL.
    #[error("{field} is missing its terminating NUL byte")]
    MissingNul { field: &'static str },

    /// A column in TupleData has a kind other than 'n', 'u', 't' or 'b'.
    #[error("unknown tuple column kind '{}'", .0.escape_ascii())]
    UnknownTupleKind(u8),

    /// Where 'N' (new tuple), 'K' (key) or 'O' (old tuple) was expected, or one
    /// of them appeared where the message does not allow it.
    #[error("unexpected tuple marker '{}'", .0.escape_ascii())]
    UnexpectedTupleMarker(u8),

    /// Bytes were left after a complete message. Being strict here catches a
    /// misread field (or a protocol version mismatch) at the message that
    /// caused it instead of several messages later.
    #[error("{message} message has {remaining} trailing bytes")]
    TrailingBytes {
        message: &'static str,
        remaining: usize,
    },

    /// A length or count field is negative.
    #[error("{field} is negative ({value})")]
    NegativeLength { field: &'static str, value: i32 },

    /// The decoder was built for a protocol version pgoutput does not have.
    #[error("unsupported pgoutput protocol version {0} (supported: 1 to 4)")]
    UnsupportedProtocolVersion(u32),

    /// The message exists only in a later protocol version than the one
    /// negotiated, so the server cannot have sent it on this stream.
    #[error("message '{}' requires protocol version {required}, stream uses {version}", .tag.escape_ascii())]
    NotInProtocol {
        tag: u8,
        required: u32,
        version: u32,
    },

    /// The message cannot appear where it did relative to Stream Start/Stop.
    /// Decoding would otherwise go on with the wrong idea of whether changes
    /// carry an xid, misreading every later message.
    #[error("message '{}' is not valid {} a stream block", .tag.escape_ascii(), if *.in_stream { "inside" } else { "outside" })]
    StreamBoundary { tag: u8, in_stream: bool },
}
