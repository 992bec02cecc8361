//! The `value = "envelope"` record value: the event's metadata around its
//! payload, in the shape of the original outbox worker design:
//!
//! ```json
//! {"id":"…","type":"payment.completed","aggregateId":"…","aggregateType":"Payment",
//!  "payload":{…},"occurredAt":"2026-11-30T02:04:20.875Z"}
//! ```
//!
//! Written byte by byte: strings are escaped with serde_json, the payload is
//! copied verbatim (no parse and re-serialise, so key order, spacing and
//! number formatting survive). A payload that is not JSON text (e.g. from a
//! `text` column) is embedded as a JSON string. NULL metadata becomes `null`.

use crate::outbox::record::write_iso8601_ms;

/// What goes into an envelope; byte slices are column texts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EnvelopeFields<'a> {
    pub id: Option<&'a [u8]>,
    pub event_type: Option<&'a [u8]>,
    pub aggregate_id: Option<&'a [u8]>,
    pub aggregate_type: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    /// The payload is known to be JSON text (a `json`/`jsonb` column, or a
    /// message's raw payload), so it is embedded without checking.
    pub payload_is_json: bool,
    pub occurred_at_ms: i64,
}

/// Serialises `f` into a new buffer sized for it.
pub(crate) fn write_envelope(f: &EnvelopeFields<'_>) -> Vec<u8> {
    let text_len = |v: Option<&[u8]>| v.map_or(4, <[u8]>::len);
    let capacity = 96
        + text_len(f.id)
        + text_len(f.event_type)
        + text_len(f.aggregate_id)
        + text_len(f.aggregate_type)
        + text_len(f.payload);
    let mut buf = Vec::with_capacity(capacity);
    buf.extend_from_slice(b"{\"id\":");
    write_text(&mut buf, f.id);
    buf.extend_from_slice(b",\"type\":");
    write_text(&mut buf, f.event_type);
    buf.extend_from_slice(b",\"aggregateId\":");
    write_text(&mut buf, f.aggregate_id);
    buf.extend_from_slice(b",\"aggregateType\":");
    write_text(&mut buf, f.aggregate_type);
    buf.extend_from_slice(b",\"payload\":");
    match f.payload {
        Some(p) if f.payload_is_json || is_json_text(p) => buf.extend_from_slice(p),
        p => write_text(&mut buf, p),
    }
    buf.extend_from_slice(b",\"occurredAt\":\"");
    write_iso8601_ms(&mut buf, f.occurred_at_ms);
    buf.extend_from_slice(b"\"}");
    buf
}

/// Whether `b` is one complete JSON value (surrounding whitespace allowed).
pub(crate) fn is_json_text(b: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
}

/// A JSON string of the text, or `null`. Invalid UTF-8 is replaced (U+FFFD):
/// PostgreSQL sends text in the server encoding, which is UTF-8 in practice.
pub(super) fn write_text(buf: &mut Vec<u8>, text: Option<&[u8]>) {
    match text {
        None => buf.extend_from_slice(b"null"),
        Some(t) => {
            let s = String::from_utf8_lossy(t);
            // Serialising a str into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *buf, &*s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(payload: &[u8], is_json: bool) -> EnvelopeFields<'_> {
        EnvelopeFields {
            id: Some(b"e1"),
            event_type: Some(b"payment.completed"),
            aggregate_id: Some(b"p-\"1\""),
            aggregate_type: None,
            payload: Some(payload),
            payload_is_json: is_json,
            occurred_at_ms: 0,
        }
    }

    #[test]
    fn exact_bytes() {
        let v = write_envelope(&fields(br#"{"b": 1, "a": 2}"#, true));
        assert_eq!(
            std::str::from_utf8(&v).unwrap(),
            r#"{"id":"e1","type":"payment.completed","aggregateId":"p-\"1\"","aggregateType":null,"payload":{"b": 1, "a": 2},"occurredAt":"1970-01-01T00:00:00.000Z"}"#
        );
    }

    #[test]
    fn non_json_payload_becomes_a_string() {
        let v = write_envelope(&fields(b"hello \"world\"", false));
        let parsed: serde_json::Value = serde_json::from_slice(&v).unwrap();
        assert_eq!(parsed["payload"], "hello \"world\"");
        let v = write_envelope(&fields(b"", false));
        let parsed: serde_json::Value = serde_json::from_slice(&v).unwrap();
        assert_eq!(parsed["payload"], "");
        // JSON text in a text column is embedded as JSON.
        let v = write_envelope(&fields(b" [1,2] ", false));
        let parsed: serde_json::Value = serde_json::from_slice(&v).unwrap();
        assert_eq!(parsed["payload"], serde_json::json!([1, 2]));
    }

    #[test]
    fn json_detection() {
        assert!(is_json_text(b"{}"));
        assert!(is_json_text(b" 12 "));
        assert!(is_json_text(b"\"x\""));
        assert!(!is_json_text(b""));
        assert!(!is_json_text(b"{} {}"));
        assert!(!is_json_text(b"abc"));
    }
}
