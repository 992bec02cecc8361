//! A bounds-checked cursor over one message body.
//!
//! Every read checks the remaining length first and reports a
//! [`DecodeError::Truncated`] instead of panicking, so parsers can be written
//! as straight-line code over untrusted bytes. Byte fields are returned as
//! [`Bytes::slice`]s of the input: values are never copied.

use bytes::Bytes;

use super::error::DecodeError;
use crate::Lsn;

pub(crate) struct Reader {
    buf: Bytes,
    /// Invariant: `pos <= buf.len()`.
    pos: usize,
    /// Names the message in errors.
    message: &'static str,
}

impl Reader {
    pub(crate) fn new(buf: Bytes, message: &'static str) -> Self {
        Reader {
            buf,
            pos: 0,
            message,
        }
    }

    pub(crate) fn remaining(&self) -> usize {
        // Cannot underflow: see the invariant on `pos`.
        self.buf.len() - self.pos
    }

    fn truncated(&self, needed: usize) -> DecodeError {
        DecodeError::Truncated {
            message: self.message,
            needed,
            remaining: self.remaining(),
        }
    }

    /// The next `n` bytes, zero-copy.
    pub(crate) fn bytes(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if n > self.remaining() {
            return Err(self.truncated(n));
        }
        // Cannot overflow: pos + n <= buf.len().
        let end = self.pos + n;
        let out = self.buf.slice(self.pos..end);
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let out: [u8; N] = self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.get(..N))
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| self.truncated(N))?;
        self.pos += N;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        self.array::<1>().map(|[b]| b)
    }

    pub(crate) fn i16(&mut self) -> Result<i16, DecodeError> {
        self.array().map(i16::from_be_bytes)
    }

    pub(crate) fn i32(&mut self) -> Result<i32, DecodeError> {
        self.array().map(i32::from_be_bytes)
    }

    /// OIDs and xids are unsigned 32-bit values sent as Int32.
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_be_bytes)
    }

    pub(crate) fn i64(&mut self) -> Result<i64, DecodeError> {
        self.array().map(i64::from_be_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_be_bytes)
    }

    pub(crate) fn lsn(&mut self) -> Result<Lsn, DecodeError> {
        self.u64().map(Lsn)
    }

    /// A NUL-terminated UTF-8 string; the NUL is consumed, not returned.
    pub(crate) fn cstring(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul { field })?;
        let text = rest.get(..len).unwrap_or_default();
        let text = std::str::from_utf8(text).map_err(|_| DecodeError::InvalidUtf8 { field })?;
        let text = text.to_owned();
        // Cannot overflow: the NUL at `pos + len` is inside the buffer.
        self.pos += len + 1;
        Ok(text)
    }

    /// A non-negative Int32 length or count, as a `usize`.
    pub(crate) fn len_i32(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let value = self.i32()?;
        usize::try_from(value).map_err(|_| DecodeError::NegativeLength { field, value })
    }

    /// A non-negative Int16 count, as a `usize`.
    pub(crate) fn len_i16(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let value = self.i16()?;
        usize::try_from(value).map_err(|_| DecodeError::NegativeLength {
            field,
            value: value.into(),
        })
    }

    /// An upper bound for `Vec::with_capacity` when `count` comes off the wire:
    /// no more elements than the remaining bytes could hold, so a forged count
    /// cannot make us allocate more than the message size.
    pub(crate) fn capacity_for(&self, count: usize, min_element_size: usize) -> usize {
        count.min(self.remaining() / min_element_size.max(1))
    }

    /// Ends the message: anything left over is an error.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            remaining => Err(DecodeError::TrailingBytes {
                message: self.message,
                remaining,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(bytes: &'static [u8]) -> Reader {
        Reader::new(Bytes::from_static(bytes), "test")
    }

    #[test]
    fn reads_big_endian_integers() {
        let mut r = reader(&[
            0x01, 0xFF, 0xFE, 0x00, 0x00, 0x01, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0x16, 0xB3,
            0x74, 0xD8, 0x48,
        ]);
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.i16().unwrap(), -2);
        assert_eq!(r.u32().unwrap(), 256);
        assert_eq!(r.i32().unwrap(), -1);
        assert_eq!(r.lsn().unwrap(), Lsn(0x16_B374_D848));
        r.finish().unwrap();
    }

    #[test]
    fn short_reads_report_truncation_without_consuming() {
        let mut r = reader(&[1, 2, 3]);
        let err = r.i64().unwrap_err();
        assert_eq!(
            err,
            DecodeError::Truncated {
                message: "test",
                needed: 8,
                remaining: 3
            }
        );
        assert_eq!(r.remaining(), 3);
        assert!(r.bytes(4).is_err());
        assert_eq!(r.bytes(3).unwrap().as_ref(), &[1, 2, 3]);
        assert!(r.u8().is_err());
    }

    #[test]
    fn cstring_needs_nul_and_utf8() {
        let mut r = reader(b"public\0users\0");
        assert_eq!(r.cstring("a").unwrap(), "public");
        assert_eq!(r.cstring("b").unwrap(), "users");
        r.finish().unwrap();

        assert_eq!(
            reader(b"abc").cstring("name"),
            Err(DecodeError::MissingNul { field: "name" })
        );
        assert_eq!(
            reader(b"").cstring("name"),
            Err(DecodeError::MissingNul { field: "name" })
        );
        assert_eq!(
            reader(b"\xFF\xFE\0").cstring("name"),
            Err(DecodeError::InvalidUtf8 { field: "name" })
        );
        assert_eq!(reader(b"\0").cstring("name").unwrap(), "");
    }

    #[test]
    fn negative_lengths_are_rejected() {
        assert_eq!(
            reader(&[0xFF, 0xFF, 0xFF, 0xFE]).len_i32("len"),
            Err(DecodeError::NegativeLength {
                field: "len",
                value: -2
            })
        );
        assert_eq!(
            reader(&[0x80, 0x00]).len_i16("count"),
            Err(DecodeError::NegativeLength {
                field: "count",
                value: -32768
            })
        );
    }

    #[test]
    fn bytes_are_slices_of_the_input() {
        let buf = Bytes::from_static(b"xxhello");
        let mut r = Reader::new(buf.clone(), "test");
        r.bytes(2).unwrap();
        let hello = r.bytes(5).unwrap();
        assert_eq!(hello.as_ptr(), buf[2..].as_ptr());
    }

    #[test]
    fn capacity_is_capped_by_remaining_bytes() {
        let r = reader(&[0; 40]);
        assert_eq!(r.capacity_for(usize::MAX, 4), 10);
        assert_eq!(r.capacity_for(3, 4), 3);
        assert_eq!(r.capacity_for(100, 0), 40);
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let mut r = reader(&[1, 2]);
        r.u8().unwrap();
        assert_eq!(
            r.finish(),
            Err(DecodeError::TrailingBytes {
                message: "test",
                remaining: 1
            })
        );
    }
}
