//! Which logical-decoding messages are skipped as they stream (pure).
//!
//! A `pg_logical_emit_message` with another prefix than the outbox's can be
//! as large as a frame may be (1 GiB), and outboxd ignores it. So the framing
//! decides from the first bytes of a CopyData frame - the XLogData header and
//! the pgoutput 'M' header (flags, LSN, prefix, content length) - and, for a
//! message it does not want, hands on that header with a content length of
//! 0 and drops the content bytes as they arrive. The decoder and the
//! transaction assembler then see an ordinary (empty) Message at the same
//! WAL position: progress, acks and transaction assembly are unchanged, only
//! the content is never held.

/// XLogData: tag 'w', wal_start, wal_end, server clock.
const XLOGDATA_HEADER_LEN: usize = 1 + 3 * 8;

/// The longest message header the framing waits for before deciding. A
/// prefix longer than this (PostgreSQL sets no limit; real ones are a word)
/// is not decided early: such a message is read whole, as any frame.
pub(crate) const MAX_HEADER_LEN: usize = 8 * 1024;

/// What to do with one CopyData frame of the replication stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Too few bytes of the frame are in to decide.
    NeedMore,
    /// Read the frame whole: anything but a message to skip, or a header
    /// that does not parse (the decoder reports it).
    Keep,
    /// The first `header_len` bytes are the message's header, ending in its
    /// 4-byte content length; the `content_len` bytes after it are dropped.
    Skip {
        header_len: usize,
        content_len: usize,
    },
}

/// The messages to skip: those whose prefix is none of `keep_prefixes`
/// (all of them when there is none).
#[derive(Debug, Clone)]
pub(crate) struct MessageSkip {
    keep_prefixes: Vec<Vec<u8>>,
    /// From protocol 2 on, a message inside a stream block (Stream Start …
    /// Stream Stop) has an xid after its tag. Set by whoever tracks the
    /// stream state (the decoder) before each frame is read.
    in_stream: bool,
}

impl MessageSkip {
    pub(crate) fn new<'a>(keep_prefixes: impl IntoIterator<Item = &'a str>) -> Self {
        MessageSkip {
            keep_prefixes: keep_prefixes
                .into_iter()
                .map(|p| p.as_bytes().to_vec())
                .collect(),
            in_stream: false,
        }
    }

    pub(crate) fn set_in_stream(&mut self, in_stream: bool) {
        self.in_stream = in_stream;
    }

    /// Decides from `head`, the first bytes of a CopyData payload whose full
    /// length is `payload_len`.
    pub(crate) fn decide(&self, head: &[u8], payload_len: usize) -> Decision {
        let complete = head.len() >= payload_len;
        let more = if complete {
            Decision::Keep
        } else {
            Decision::NeedMore
        };
        let mut pos = XLOGDATA_HEADER_LEN;
        match (head.first(), head.get(pos)) {
            (Some(b'w'), Some(b'M')) => {}
            (Some(b'w'), None) | (None, _) => return more,
            _ => return Decision::Keep,
        }
        // Tag, [xid], flags, LSN.
        pos += 1 + if self.in_stream { 4 } else { 0 } + 1 + 8;
        let Some(rest) = head.get(pos..) else {
            return more;
        };
        let Some(nul) = rest.iter().position(|&b| b == 0) else {
            return if rest.len() >= MAX_HEADER_LEN {
                Decision::Keep
            } else {
                more
            };
        };
        let prefix = &rest[..nul];
        pos += nul + 1;
        let Some(len) = head.get(pos..pos + 4) else {
            return more;
        };
        let header_len = pos + 4;
        let content_len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        // A content length that does not fill the frame exactly, or a
        // negative one, is the decoder's to report.
        if payload_len.checked_sub(header_len) != Some(content_len) {
            return Decision::Keep;
        }
        if self.keep_prefixes.iter().any(|p| p == prefix) {
            return Decision::Keep;
        }
        Decision::Skip {
            header_len,
            content_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(xid: Option<u32>, prefix: &str, content: &[u8]) -> Vec<u8> {
        let mut b = vec![b'w'];
        b.extend_from_slice(&[0; 24]);
        b.push(b'M');
        if let Some(x) = xid {
            b.extend_from_slice(&x.to_be_bytes());
        }
        b.push(1);
        b.extend_from_slice(&7u64.to_be_bytes());
        b.extend_from_slice(prefix.as_bytes());
        b.push(0);
        b.extend_from_slice(&(content.len() as u32).to_be_bytes());
        b.extend_from_slice(content);
        b
    }

    #[test]
    fn skips_another_prefix_and_keeps_the_outbox_one() {
        let skip = MessageSkip::new(Some("outbox"));
        let other = message(None, "other", &[9; 100]);
        let header_len = other.len() - 100;
        assert_eq!(
            skip.decide(&other[..header_len], other.len()),
            Decision::Skip {
                header_len,
                content_len: 100
            }
        );
        let ours = message(None, "outbox", &[9; 100]);
        assert_eq!(skip.decide(&ours, ours.len()), Decision::Keep);
        // Disabled messages: every prefix is skipped.
        let none = MessageSkip::new(None);
        assert!(matches!(
            none.decide(&ours, ours.len()),
            Decision::Skip { .. }
        ));
    }

    #[test]
    fn waits_for_the_header_then_decides() {
        let skip = MessageSkip::new(Some("outbox"));
        let other = message(None, "other", &[1; 50]);
        let header_len = other.len() - 50;
        for cut in 0..header_len {
            assert_eq!(
                skip.decide(&other[..cut], other.len()),
                Decision::NeedMore,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_stream_block_message_has_an_xid() {
        let mut skip = MessageSkip::new(Some("outbox"));
        let streamed = message(Some(42), "other", &[1; 10]);
        skip.set_in_stream(true);
        assert_eq!(
            skip.decide(&streamed, streamed.len()),
            Decision::Skip {
                header_len: streamed.len() - 10,
                content_len: 10
            }
        );
        let ours = message(Some(42), "outbox", &[1; 10]);
        assert_eq!(skip.decide(&ours, ours.len()), Decision::Keep);
    }

    #[test]
    fn other_frames_and_bad_lengths_are_kept() {
        let skip = MessageSkip::new(Some("outbox"));
        let mut insert = message(None, "x", b"");
        insert[25] = b'I';
        assert_eq!(skip.decide(&insert, insert.len()), Decision::Keep);
        assert_eq!(skip.decide(b"k", 18), Decision::Keep);
        let other = message(None, "other", &[1; 10]);
        // One trailing byte: the decoder rejects the frame, so it is read whole.
        assert_eq!(skip.decide(&other, other.len() + 1), Decision::Keep);
        // A prefix without NUL within the limit.
        let mut long = message(None, "", b"");
        long.truncate(35);
        long.extend(std::iter::repeat_n(b'a', MAX_HEADER_LEN));
        assert_eq!(skip.decide(&long, 1 << 20), Decision::Keep);
    }
}
