//! TupleData: the row images inside Insert, Update and Delete.
//!
//! Layout: Int16 column count, then per column a kind byte — 'n' (null),
//! 'u' (unchanged TOAST), or 't'/'b' followed by an Int32 length and that
//! many bytes (text or binary format).

use super::error::DecodeError;
use super::messages::{OldTuple, TupleData, TupleValue};
use super::reader::Reader;

/// Marks the new row image.
pub(crate) const NEW: u8 = b'N';
/// Marks an old row image holding only the replica identity columns.
pub(crate) const KEY: u8 = b'K';
/// Marks a full old row image (replica identity FULL).
pub(crate) const OLD: u8 = b'O';

const NULL: u8 = b'n';
const UNCHANGED_TOAST: u8 = b'u';
const TEXT: u8 = b't';
const BINARY: u8 = b'b';

/// Reads a TupleData (without its leading 'N'/'K'/'O' marker).
pub(crate) fn read_tuple(r: &mut Reader) -> Result<TupleData, DecodeError> {
    let count = r.len_i16("tuple column count")?;
    // Every column takes at least its kind byte.
    let mut values = Vec::with_capacity(r.capacity_for(count, 1));
    for _ in 0..count {
        values.push(read_value(r)?);
    }
    Ok(TupleData(values))
}

fn read_value(r: &mut Reader) -> Result<TupleValue, DecodeError> {
    match r.u8()? {
        NULL => Ok(TupleValue::Null),
        UNCHANGED_TOAST => Ok(TupleValue::UnchangedToast),
        TEXT => Ok(TupleValue::Text(read_data(r)?)),
        BINARY => Ok(TupleValue::Binary(read_data(r)?)),
        kind => Err(DecodeError::UnknownTupleKind(kind)),
    }
}

fn read_data(r: &mut Reader) -> Result<bytes::Bytes, DecodeError> {
    let len = r.len_i32("column value length")?;
    r.bytes(len)
}

/// Turns an already-read 'K'/'O' marker and the tuple after it into an
/// [`OldTuple`].
pub(crate) fn read_old_tuple(marker: u8, r: &mut Reader) -> Result<OldTuple, DecodeError> {
    match marker {
        KEY => Ok(OldTuple::Key(read_tuple(r)?)),
        OLD => Ok(OldTuple::Full(read_tuple(r)?)),
        other => Err(DecodeError::UnexpectedTupleMarker(other)),
    }
}

/// Reads the 'N' marker and the new row image.
pub(crate) fn read_new_tuple(r: &mut Reader) -> Result<TupleData, DecodeError> {
    match r.u8()? {
        NEW => read_tuple(r),
        other => Err(DecodeError::UnexpectedTupleMarker(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn read(bytes: &[u8]) -> Result<TupleData, DecodeError> {
        let mut r = Reader::new(Bytes::copy_from_slice(bytes), "test");
        let tuple = read_tuple(&mut r)?;
        r.finish()?;
        Ok(tuple)
    }

    #[test]
    fn decodes_every_column_kind() {
        let tuple =
            read(b"\x00\x05nut\x00\x00\x00\x0242b\x00\x00\x00\x01\xFFt\x00\x00\x00\x00").unwrap();
        assert_eq!(
            tuple,
            TupleData(vec![
                TupleValue::Null,
                TupleValue::UnchangedToast,
                TupleValue::Text(Bytes::from_static(b"42")),
                TupleValue::Binary(Bytes::from_static(b"\xFF")),
                TupleValue::Text(Bytes::new()),
            ])
        );
    }

    #[test]
    fn empty_tuple() {
        assert_eq!(read(b"\x00\x00").unwrap(), TupleData(vec![]));
    }

    #[test]
    fn rejects_bad_kinds_and_lengths() {
        assert_eq!(read(b"\x00\x01x"), Err(DecodeError::UnknownTupleKind(b'x')));
        assert!(matches!(
            read(b"\xFF\xFF"),
            Err(DecodeError::NegativeLength { value: -1, .. })
        ));
        assert!(matches!(
            read(b"\x00\x01t\xFF\xFF\xFF\xFF"),
            Err(DecodeError::NegativeLength { value: -1, .. })
        ));
        // A length far beyond the message must not allocate or panic.
        assert!(matches!(
            read(b"\x00\x01t\x7F\xFF\xFF\xFFabc"),
            Err(DecodeError::Truncated { .. })
        ));
        // A huge column count with no columns behind it.
        assert!(matches!(
            read(b"\x7F\xFF"),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn markers() {
        let mut r = Reader::new(Bytes::from_static(b"\x00\x00"), "test");
        assert_eq!(
            read_old_tuple(b'K', &mut r).unwrap(),
            OldTuple::Key(TupleData(vec![]))
        );
        let mut r = Reader::new(Bytes::from_static(b"\x00\x00"), "test");
        assert_eq!(
            read_old_tuple(b'O', &mut r).unwrap(),
            OldTuple::Full(TupleData(vec![]))
        );
        let mut r = Reader::new(Bytes::from_static(b"\x00\x00"), "test");
        assert_eq!(
            read_old_tuple(b'N', &mut r),
            Err(DecodeError::UnexpectedTupleMarker(b'N'))
        );
        let mut r = Reader::new(Bytes::from_static(b"K\x00\x00"), "test");
        assert_eq!(
            read_new_tuple(&mut r),
            Err(DecodeError::UnexpectedTupleMarker(b'K'))
        );
    }
}
