//! Logical decoding messages as row-like values. A message carries a JSON
//! object whose field names are the configured column names; it is parsed
//! (messages are rare) into one value per slot, and then mapped exactly as a
//! row.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::outbox::error::MappingError;
use crate::outbox::event::ColumnValue;
use crate::outbox::json::{json_value_text, sub_bytes, JsonStr};

/// A message's fields by slot (`columns` is slot -> column name): `None`
/// where the field is absent, `Null` for JSON `null`. The `payload` and
/// `headers` fields are kept as their JSON text (the payload is sent or
/// embedded as JSON, the headers object is read later); every other field
/// becomes its text, strings unescaped.
pub(super) fn values(
    content: &Bytes,
    columns: &[Box<str>],
    payload: usize,
    headers: Option<usize>,
) -> Result<Vec<Option<ColumnValue>>, MappingError> {
    let invalid = |reason: String| MappingError::InvalidMessage { reason };
    let fields: HashMap<JsonStr<'_>, &RawValue> =
        serde_json::from_slice(content).map_err(|e| invalid(format!("not a JSON object: {e}")))?;
    let mut values = Vec::with_capacity(columns.len());
    for (slot, column) in columns.iter().enumerate() {
        let Some(raw) = fields.get(&**column) else {
            values.push(None);
            continue;
        };
        let text = raw.get();
        let value = if text == "null" {
            ColumnValue::Null
        } else if slot == payload || Some(slot) == headers {
            ColumnValue::Text(sub_bytes(content, text.as_bytes()))
        } else {
            ColumnValue::Text(
                json_value_text(content, raw)
                    .map_err(|e| invalid(format!("field `{column}`: {e}")))?,
            )
        };
        values.push(Some(value));
    }
    Ok(values)
}
