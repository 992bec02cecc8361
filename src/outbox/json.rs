//! JSON text without copying: values as slices of the `Bytes` they were
//! parsed from, strings unescaped only when they have escapes. Shared by
//! logical decoding messages and the `headers` column.

use std::borrow::{Borrow, Cow};
use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// `part` as a slice of `src` when it lies inside it (no copy), else a copy.
pub(super) fn sub_bytes(src: &Bytes, part: &[u8]) -> Bytes {
    let start = src.as_ptr() as usize;
    let p = part.as_ptr() as usize;
    if p >= start && p + part.len() <= start + src.len() {
        src.slice_ref(part)
    } else {
        Bytes::copy_from_slice(part)
    }
}

/// A JSON value as header/column text: strings unescaped (without copying
/// when they have no escapes), other values as their JSON text.
pub(super) fn json_value_text(src: &Bytes, raw: &RawValue) -> Result<Bytes, String> {
    let text = raw.get();
    if !text.starts_with('"') {
        return Ok(sub_bytes(src, text.as_bytes()));
    }
    let inner = &text[1..text.len() - 1];
    if inner.contains('\\') {
        let s: String = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Ok(Bytes::from(s))
    } else {
        Ok(sub_bytes(src, inner.as_bytes()))
    }
}

/// A JSON string, borrowed from the input when it has no escapes.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct JsonStr<'a>(pub(super) Cow<'a, str>);

impl Borrow<str> for JsonStr<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for JsonStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}
