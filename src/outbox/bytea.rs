//! `bytea` values from pgoutput's text form back to their bytes (pure).
//!
//! pgoutput (protocol 1) sends every value through the type's output
//! function, so a `bytea` arrives as PostgreSQL prints it: `\x` and two hex
//! digits per byte under the default `bytea_output = hex`, or the escape
//! format (printable ASCII as is, `\\` for a backslash, `\nnn` octal for the
//! rest) under `bytea_output = escape`. Kafka gets the bytes.

use bytes::Bytes;

/// PostgreSQL's type OID of `bytea`.
pub(crate) const BYTEA_TYPE_OID: u32 = 17;

/// The bytes a `bytea`'s text form stands for; `None` if it is not one.
pub(crate) fn decode(text: &[u8]) -> Option<Bytes> {
    match text.strip_prefix(b"\\x") {
        Some(hex) => decode_hex(hex),
        None => decode_escape(text),
    }
    .map(Bytes::from)
}

fn decode_hex(hex: &[u8]) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    hex.chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn decode_escape(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&c, tail)) = rest.split_first() {
        if c != b'\\' {
            out.push(c);
            rest = tail;
            continue;
        }
        match tail {
            [b'\\', more @ ..] => {
                out.push(b'\\');
                rest = more;
            }
            [a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7', more @ ..] => {
                out.push((a - b'0') << 6 | (b - b'0') << 3 | (c - b'0'));
                rest = more;
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_form() {
        assert_eq!(decode(b"\\x").unwrap(), Bytes::new());
        assert_eq!(
            decode(b"\\x7b22ff00Ab").unwrap(),
            Bytes::from_static(b"{\"\xff\x00\xab")
        );
        assert_eq!(decode(b"\\x7b2"), None);
        assert_eq!(decode(b"\\xzz"), None);
    }

    #[test]
    fn escape_form() {
        assert_eq!(
            decode(b"ab\\\\c\\377\\000").unwrap(),
            Bytes::from_static(b"ab\\c\xff\x00")
        );
        assert_eq!(decode(b"plain").unwrap(), Bytes::from_static(b"plain"));
        assert_eq!(decode(b"bad\\9"), None);
        assert_eq!(decode(b"trailing\\"), None);
    }
}
