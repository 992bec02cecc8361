//! Record headers: the event id, `routing.additional_headers` (each the value
//! of a column), and the entries of the JSON object in the
//! `outbox.columns.headers` column (json or jsonb).
//!
//! The id and the additional headers are what Debezium's router sends (`id`
//! and `table.fields.additional.placement=…:header`), so they follow it for
//! NULL too: the header is sent with a null value. The `headers` column is
//! outboxd's own; its `null` entries are left out.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::{self, MapAccess, Visitor};
use serde::Deserializer;
use serde_json::value::RawValue;

use crate::config::outbox::ColumnsConfig;
use crate::config::routing::{resolve_column, RoutingConfig};
use crate::outbox::error::{MappingError, HEADERS_SETTING};
use crate::outbox::fields::Fields;
use crate::outbox::json::{json_value_text, JsonStr};
use crate::outbox::record::RecordHeader;

/// Header carrying the event id, as Debezium's router names it.
pub(crate) const ID_HEADER: &str = "id";
/// Header on every record `outboxd backfill` sends (and its dead-letter
/// copies): the audit tells such copies from the relay's duplicates by it.
pub const BACKFILL_HEADER: &str = "outboxd.backfill";
/// Distinct header names from the `headers` column remembered before the
/// cache is emptied.
pub(crate) const MAX_CACHED_HEADER_NAMES: usize = 1024;

/// The header settings, compiled.
#[derive(Debug)]
pub(super) struct HeaderPlan {
    id_header: Arc<str>,
    extra: Vec<ExtraHeader>,
    /// Slot of the `headers` column.
    column: Option<usize>,
}

#[derive(Debug)]
struct ExtraHeader {
    name: Arc<str>,
    slot: usize,
    /// `routing.additional_headers.<name>`, for errors.
    setting: Box<str>,
}

impl HeaderPlan {
    /// `column` is the slot of the `headers` column; `slot_for` hands out
    /// the slots of the columns `routing.additional_headers` reads.
    pub(super) fn new(
        columns: &ColumnsConfig,
        routing: &RoutingConfig,
        column: Option<usize>,
        mut slot_for: impl FnMut(&str) -> usize,
    ) -> HeaderPlan {
        let extra = routing
            .additional_headers
            .iter()
            .map(|(name, source)| ExtraHeader {
                name: Arc::from(name.as_str()),
                slot: slot_for(resolve_column(columns, source)),
                setting: format!("routing.additional_headers.{name}").into(),
            })
            .collect();
        HeaderPlan {
            id_header: Arc::from(ID_HEADER),
            extra,
            column,
        }
    }

    /// Slot of the `headers` column, if one is configured.
    pub(super) fn column(&self) -> Option<usize> {
        self.column
    }

    /// The headers of one event whose id is `id` (`None`: NULL), with room
    /// for `more`.
    pub(super) fn build(
        &self,
        f: &Fields<'_>,
        id: Option<&Bytes>,
        names: &mut HeaderNames,
        more: usize,
    ) -> Result<Vec<RecordHeader>, MappingError> {
        let mut headers = Vec::with_capacity(
            1 + self.extra.len() + if self.column.is_some() { 4 } else { 0 } + more,
        );
        headers.push((self.id_header.clone(), id.cloned()));
        for h in &self.extra {
            let value = f.text(h.slot, &h.setting, true)?;
            headers.push((h.name.clone(), value.cloned()));
        }
        if let Some(slot) = self.column {
            if let Some(json) = f.text(slot, HEADERS_SETTING, true)? {
                append_json_headers(json, &mut headers, names).map_err(|reason| {
                    MappingError::InvalidHeaders {
                        column: f.column(slot).to_string(),
                        reason,
                    }
                })?;
            }
        }
        Ok(headers)
    }
}

/// Header names seen in the `headers` column, as shared strings; bounded by
/// [`MAX_CACHED_HEADER_NAMES`].
#[derive(Debug, Default)]
pub(super) struct HeaderNames(HashMap<Box<str>, Arc<str>>);

impl HeaderNames {
    fn intern(&mut self, name: Cow<'_, str>) -> Arc<str> {
        match self.0.get(&*name) {
            Some(n) => n.clone(),
            None => {
                if self.0.len() >= MAX_CACHED_HEADER_NAMES {
                    self.0.clear();
                }
                let n: Arc<str> = Arc::from(&*name);
                self.0.insert(name.into(), n.clone());
                n
            }
        }
    }
}

/// Appends the entries of a JSON object of header name to value. Strings are
/// sent unquoted, other values as JSON text, `null` entries left out.
fn append_json_headers(
    json: &Bytes,
    out: &mut Vec<RecordHeader>,
    names: &mut HeaderNames,
) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(json);
    de.deserialize_map(HeaderVisitor {
        src: json,
        out,
        names,
    })
    .and_then(|()| de.end())
    .map_err(|e| e.to_string())
}

struct HeaderVisitor<'a> {
    src: &'a Bytes,
    out: &'a mut Vec<RecordHeader>,
    names: &'a mut HeaderNames,
}

impl<'de> Visitor<'de> for HeaderVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(JsonStr(name)) = map.next_key::<JsonStr<'de>>()? {
            let raw: &'de RawValue = map.next_value()?;
            if raw.get() == "null" {
                continue;
            }
            let value = json_value_text(self.src, raw).map_err(de::Error::custom)?;
            let name = self.names.intern(name);
            self.out.push((name, Some(value)));
        }
        Ok(())
    }
}
