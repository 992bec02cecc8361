//! The walsender's CopyData sub-protocol (pure): XLogData and primary
//! keepalive from the server, standby status updates to it.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::Lsn;

/// Seconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ServerMessage {
    /// One pgoutput message and the WAL range it came from. `wal_start` may be
    /// 0/0 (Relation messages) and is not monotonic.
    XLogData {
        wal_start: Lsn,
        wal_end: Lsn,
        data: Bytes,
    },
    /// `wal_end` is the server's current end of WAL.
    Keepalive { wal_end: Lsn, reply_requested: bool },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ServerMessageError {
    #[error("replication CopyData too short for {kind}: {len} bytes")]
    Truncated { kind: &'static str, len: usize },
    #[error("unknown replication CopyData tag {0:#04x}")]
    UnknownTag(u8),
    #[error("empty replication CopyData")]
    Empty,
}

/// Parses one CopyData payload of the replication stream. Zero-copy for data.
pub(crate) fn parse_server_message(mut frame: Bytes) -> Result<ServerMessage, ServerMessageError> {
    let len = frame.len();
    if frame.is_empty() {
        return Err(ServerMessageError::Empty);
    }
    match frame.get_u8() {
        b'w' => {
            // wal_start, wal_end, server clock: 3 × 8 bytes.
            if frame.len() < 24 {
                return Err(ServerMessageError::Truncated {
                    kind: "XLogData",
                    len,
                });
            }
            let wal_start = Lsn(frame.get_u64());
            let wal_end = Lsn(frame.get_u64());
            let _server_time = frame.get_i64();
            Ok(ServerMessage::XLogData {
                wal_start,
                wal_end,
                data: frame,
            })
        }
        b'k' => {
            if frame.len() != 17 {
                return Err(ServerMessageError::Truncated {
                    kind: "keepalive",
                    len,
                });
            }
            let wal_end = Lsn(frame.get_u64());
            let _server_time = frame.get_i64();
            Ok(ServerMessage::Keepalive {
                wal_end,
                reply_requested: frame.get_u8() == 1,
            })
        }
        tag => Err(ServerMessageError::UnknownTag(tag)),
    }
}

/// Encodes a standby status update. PostgreSQL treats `flush` as the
/// confirmed position of a logical slot; write and apply are informational,
/// so all three carry the same value.
pub(crate) fn encode_status_update(
    position: Lsn,
    reply_requested: bool,
    now_pg_us: i64,
    out: &mut BytesMut,
) {
    out.put_u8(b'r');
    out.put_u64(position.0);
    out.put_u64(position.0);
    out.put_u64(position.0);
    out.put_i64(now_pg_us);
    out.put_u8(u8::from(reply_requested));
}

/// Now, in microseconds since 2000-01-01, the clock of the protocol.
pub(crate) fn pg_now_us() -> i64 {
    crate::clock::now_unix_micros() - (PG_EPOCH_UNIX_SECS as i64) * 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_xlogdata_zero_copy() {
        let mut b = BytesMut::new();
        b.put_u8(b'w');
        b.put_u64(0x10);
        b.put_u64(0x20);
        b.put_i64(5);
        b.put_slice(b"Bpayload");
        let frame = b.freeze();
        let msg = parse_server_message(frame.clone()).unwrap();
        let ServerMessage::XLogData {
            wal_start,
            wal_end,
            data,
        } = msg
        else {
            panic!("not XLogData")
        };
        assert_eq!((wal_start, wal_end), (Lsn(0x10), Lsn(0x20)));
        assert_eq!(&data[..], b"Bpayload");
        assert_eq!(data.as_ptr(), frame[25..].as_ptr());
    }

    #[test]
    fn parses_keepalive() {
        let mut b = BytesMut::new();
        b.put_u8(b'k');
        b.put_u64(0xABCDEF);
        b.put_i64(1);
        b.put_u8(1);
        assert_eq!(
            parse_server_message(b.freeze()).unwrap(),
            ServerMessage::Keepalive {
                wal_end: Lsn(0xABCDEF),
                reply_requested: true
            }
        );
    }

    #[test]
    fn rejects_every_truncation_without_panicking() {
        let mut b = BytesMut::new();
        b.put_u8(b'k');
        b.put_u64(1);
        b.put_i64(1);
        b.put_u8(0);
        let full = b.freeze();
        for n in 0..full.len() {
            assert!(parse_server_message(full.slice(..n)).is_err(), "prefix {n}");
        }
        assert_eq!(
            parse_server_message(Bytes::from_static(b"x")),
            Err(ServerMessageError::UnknownTag(b'x'))
        );
        assert!(parse_server_message(Bytes::from_static(b"w123")).is_err());
    }

    #[test]
    fn status_update_layout() {
        let mut out = BytesMut::new();
        encode_status_update(Lsn(0x0102), true, 7, &mut out);
        assert_eq!(out.len(), 34);
        assert_eq!(out[0], b'r');
        assert_eq!(&out[1..9], &0x0102u64.to_be_bytes());
        assert_eq!(&out[17..25], &0x0102u64.to_be_bytes());
        assert_eq!(out[33], 1);
    }
}
