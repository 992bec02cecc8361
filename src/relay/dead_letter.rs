//! Dead-letter records (pure): what goes to the DLQ topic when an event
//! cannot be delivered, and the headers that say why.

use std::sync::Arc;

use bytes::Bytes;

use crate::outbox::mapper::ID_HEADER;
use crate::outbox::{EventKind, KafkaRecord, OutboxEvent, RecordHeader};

/// Header names on dead-lettered records.
pub(crate) const HEADER_ERROR: &str = "outboxd.error";
pub(crate) const HEADER_ERROR_KIND: &str = "outboxd.error.kind";
pub(crate) const HEADER_TOPIC: &str = "outboxd.original.topic";
pub(crate) const HEADER_LSN: &str = "outboxd.source.commit_lsn";
pub(crate) const HEADER_XID: &str = "outboxd.source.xid";
/// Byte length of a value left out of the DLQ copy because it was too large.
pub(crate) const HEADER_VALUE_SIZE: &str = "outboxd.original.value_size";

/// The DLQ copy of a record that Kafka refused (e.g. too large): same key,
/// value and headers (null-valued ones included), plus the error. Refused for its size (`too_large`), it
/// would be refused on the DLQ topic too: it goes without its value, and a
/// header says how big the value was.
pub(crate) fn from_record(
    record: &KafkaRecord,
    dlq_topic: &Arc<str>,
    event: &OutboxEvent,
    kind: &str,
    error: &str,
    too_large: bool,
) -> KafkaRecord {
    let mut headers = record.headers.clone();
    headers.extend(error_headers(kind, error, Some(&record.topic), event));
    let value = if too_large {
        let len = record.value.as_ref().map_or(0, |v| v.len());
        headers.push((
            Arc::from(HEADER_VALUE_SIZE),
            Some(Bytes::from(len.to_string())),
        ));
        None
    } else {
        record.value.clone()
    };
    KafkaRecord {
        topic: Arc::clone(dlq_topic),
        key: record.key.clone(),
        value,
        headers,
        timestamp_ms: record.timestamp_ms,
        event_id: record.event_id.clone(),
        size: record.size,
    }
}

/// The DLQ record for an event that could not even be mapped: the raw row as
/// JSON (column → text, NULL as null) or the raw message content, keyed and
/// with an `id` header when the event has a key and an id (see
/// [`RecordMapper::key_and_id`](crate::outbox::RecordMapper::key_and_id)).
pub(crate) fn from_unmappable(
    event: &OutboxEvent,
    dlq_topic: &Arc<str>,
    error: &str,
    key: Option<Bytes>,
    id: Option<Bytes>,
) -> KafkaRecord {
    let value: Bytes = match &event.kind {
        EventKind::Row(row) => {
            let mut obj = serde_json::Map::new();
            for (info, v) in row.table.columns.iter().zip(&row.values) {
                let value = match v.as_bytes() {
                    Some(b) => serde_json::Value::String(String::from_utf8_lossy(b).into_owned()),
                    None => serde_json::Value::Null,
                };
                obj.insert(info.name.clone(), value);
            }
            Bytes::from(serde_json::Value::Object(obj).to_string())
        }
        EventKind::Message { content, .. } => content.clone(),
    };
    let mut headers = Vec::new();
    if let Some(id) = &id {
        headers.push((Arc::from(ID_HEADER), Some(id.clone())));
    }
    headers.extend(error_headers("mapping", error, None, event));
    let value = Some(value);
    let size = KafkaRecord::compute_size(key.as_ref(), value.as_ref(), &headers);
    KafkaRecord {
        topic: Arc::clone(dlq_topic),
        key,
        value,
        headers,
        timestamp_ms: Some(event.commit_time_us / 1000),
        event_id: id,
        size,
    }
}

fn error_headers(
    kind: &str,
    error: &str,
    topic: Option<&str>,
    event: &OutboxEvent,
) -> Vec<RecordHeader> {
    let text = |name: &str, value: String| (Arc::from(name), Some(Bytes::from(value)));
    let mut h = vec![
        text(HEADER_ERROR, error.to_string()),
        text(HEADER_ERROR_KIND, kind.to_string()),
        text(HEADER_LSN, event.commit_lsn.to_string()),
        text(HEADER_XID, event.xid.to_string()),
    ];
    if let Some(t) = topic {
        h.push(text(HEADER_TOPIC, t.to_string()));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Lsn;

    #[test]
    fn a_refused_record_goes_to_the_dlq_with_its_null_valued_headers() {
        let event = OutboxEvent::test_message(Lsn(0x10));
        let headers: Vec<RecordHeader> = vec![
            (Arc::from(ID_HEADER), Some(Bytes::from_static(b"e1"))),
            (Arc::from("tenant"), None),
        ];
        let value = Some(Bytes::from_static(b"{}"));
        let size = KafkaRecord::compute_size(None, value.as_ref(), &headers);
        let record = KafkaRecord {
            topic: Arc::from("orders"),
            key: None,
            value,
            headers,
            timestamp_ms: None,
            event_id: None,
            size,
        };
        for too_large in [false, true] {
            let dlq = from_record(
                &record,
                &Arc::from("dlq"),
                &event,
                "refused",
                "too large",
                too_large,
            );
            assert_eq!(dlq.headers[..2], record.headers[..]);
            assert_eq!(dlq.header_value("tenant"), Some(None));
            assert_eq!(
                dlq.header(HEADER_TOPIC).map(|v| &v[..]),
                Some(&b"orders"[..])
            );
        }
    }
}
