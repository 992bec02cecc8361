//! The header that tells a backfilled record from the relay's.

use std::sync::Arc;

use crate::outbox::{KafkaRecord, BACKFILL_HEADER};

/// The record a backfilled event becomes: the relay's, plus the header.
pub(crate) fn mark(mut record: KafkaRecord) -> KafkaRecord {
    let value = bytes::Bytes::from_static(b"true");
    record.size += BACKFILL_HEADER.len() + value.len();
    let header = (Arc::from(BACKFILL_HEADER), Some(value));
    record.headers.push(header);
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_records_carry_the_header_last() {
        let r = KafkaRecord {
            topic: Arc::from("t"),
            key: None,
            value: Some(bytes::Bytes::from_static(b"v")),
            headers: vec![(Arc::from("id"), Some(bytes::Bytes::from_static(b"1")))],
            timestamp_ms: None,
            event_id: None,
            size: 4,
        };
        let m = mark(r);
        assert_eq!(m.headers.len(), 2);
        assert_eq!(
            m.header(BACKFILL_HEADER).map(|b| &b[..]),
            Some(&b"true"[..])
        );
        assert_eq!(m.size, 4 + BACKFILL_HEADER.len() + 4);
    }
}
