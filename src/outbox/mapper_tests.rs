//! Tests of `RecordMapper`: rows and messages to Kafka records.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::config::routing::RoutingRule;
use crate::outbox::event::{ColumnInfo, Row};
use crate::Lsn;

const UUID: u32 = 2950;
const VARCHAR: u32 = 1043;
const TEXT: u32 = 25;
const JSONB: u32 = 3802;
const JSON: u32 = 114;
const TIMESTAMPTZ: u32 = 1184;
const INT4: u32 = 23;
const INT8: u32 = 20;
const BYTEA: u32 = 17;

/// 2026-11-30 02:04:20 UTC, in microseconds.
const COMMIT_US: i64 = 1_796_004_260_123_456;
const COMMIT_MS: i64 = 1_796_004_260_123;

const EVENT_ID: &str = "4d47e190-0402-4048-bc2c-89dd54343cdc";
const PAYMENT_ID: &str = "9a1f6b0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
const PAYLOAD: &str = r#"{"amount": 1999, "userId": "u-1", "currency": "EUR", "paymentId": "9a1f6b0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"}"#;
const CREATED_AT: &str = "2026-11-30 02:04:20.875758+00";

fn table(columns: &[(&str, u32)]) -> Arc<TableInfo> {
    Arc::new(TableInfo {
        oid: 16_384,
        schema: "public".into(),
        name: "outbox".into(),
        columns: columns
            .iter()
            .map(|&(name, type_oid)| ColumnInfo {
                name: name.into(),
                type_oid,
            })
            .collect(),
    })
}

/// A row whose text values are slices of one buffer, as pgoutput's are of
/// the WAL frame. Returns the frame too.
fn row_with_frame(table: &Arc<TableInfo>, values: &[Option<&str>]) -> (OutboxEvent, Bytes) {
    assert_eq!(table.columns.len(), values.len());
    let mut buf = Vec::new();
    let mut ranges = Vec::new();
    for v in values {
        ranges.push(v.map(|s| {
            let start = buf.len();
            buf.extend_from_slice(b"\x00\x00\x00\x00t");
            buf.extend_from_slice(s.as_bytes());
            start + 5..buf.len()
        }));
    }
    let frame = Bytes::from(buf);
    let values = ranges
        .into_iter()
        .map(|r| r.map_or(ColumnValue::Null, |r| ColumnValue::Text(frame.slice(r))))
        .collect();
    let event = OutboxEvent {
        commit_lsn: Lsn(0x16_B374_D848),
        xid: 742,
        commit_time_us: COMMIT_US,
        kind: EventKind::Row(Row {
            table: table.clone(),
            values,
        }),
    };
    (event, frame)
}

fn row(table: &Arc<TableInfo>, values: &[Option<&str>]) -> OutboxEvent {
    row_with_frame(table, values).0
}

fn message(content: &str) -> OutboxEvent {
    OutboxEvent {
        commit_lsn: Lsn(0x16_B374_D848),
        xid: 742,
        commit_time_us: COMMIT_US,
        kind: EventKind::Message {
            transactional: true,
            prefix: "outbox".into(),
            content: Bytes::copy_from_slice(content.as_bytes()),
        },
    }
}

/// The seed article's outbox table.
fn seed_table() -> Arc<TableInfo> {
    table(&[
        ("id", UUID),
        ("aggregate_type", VARCHAR),
        ("aggregate_id", UUID),
        ("event_type", VARCHAR),
        ("payload", JSONB),
        ("created_at", TIMESTAMPTZ),
        ("published_at", TIMESTAMPTZ),
        ("attempts", INT4),
        ("last_error", TEXT),
    ])
}

fn seed_row_values<'a>(aggregate_type: &'a str, event_type: &'a str) -> Vec<Option<&'a str>> {
    vec![
        Some(EVENT_ID),
        Some(aggregate_type),
        Some(PAYMENT_ID),
        Some(event_type),
        Some(PAYLOAD),
        Some(CREATED_AT),
        None,
        Some("0"),
        None,
    ]
}

fn seed_row(aggregate_type: &str, event_type: &str) -> OutboxEvent {
    row(&seed_table(), &seed_row_values(aggregate_type, event_type))
}

fn mapper(columns: &ColumnsConfig, routing: &RoutingConfig) -> RecordMapper {
    RecordMapper::new(columns, routing, "/test").unwrap()
}

fn default_mapper() -> RecordMapper {
    mapper(&ColumnsConfig::default(), &RoutingConfig::default())
}

fn envelope_routing() -> RoutingConfig {
    RoutingConfig {
        value: ValueFormat::Envelope,
        ..Default::default()
    }
}

fn header_names(r: &KafkaRecord) -> Vec<&str> {
    r.headers.iter().map(|(n, _)| &**n).collect()
}

fn text(b: &Bytes) -> &str {
    std::str::from_utf8(b).unwrap()
}

fn points_into(part: &Bytes, frame: &Bytes) -> bool {
    let (p, f) = (part.as_ptr() as usize, frame.as_ptr() as usize);
    p >= f && p + part.len() <= f + frame.len()
}

#[test]
fn seed_table_maps_with_default_config() {
    let r = default_mapper()
        .map(&seed_row("payment", "payment.completed"))
        .unwrap();
    assert_eq!(&*r.topic, "outbox.event.payment");
    assert_eq!(r.key.as_ref().map(text), Some(PAYMENT_ID));
    assert_eq!(r.value.as_ref().map(text), Some(PAYLOAD));
    assert_eq!(header_names(&r), ["id", "aggregateType", "eventType"]);
    assert_eq!(r.header("id").map(text), Some(EVENT_ID));
    assert_eq!(r.header("aggregateType").map(text), Some("payment"));
    assert_eq!(r.header("eventType").map(text), Some("payment.completed"));
    // No timestamp column configured: commit time, not created_at.
    assert_eq!(r.timestamp_ms, Some(COMMIT_MS));
    assert_eq!(r.event_id.as_ref().map(text), Some(EVENT_ID));
    let expected_size = PAYMENT_ID.len()
        + PAYLOAD.len()
        + "id".len()
        + EVENT_ID.len()
        + "aggregateType".len()
        + "payment".len()
        + "eventType".len()
        + "payment.completed".len();
    assert_eq!(r.size, expected_size);
}

#[test]
fn payload_mode_passes_bytes_through_without_copying() {
    let t = seed_table();
    let (event, frame) = row_with_frame(&t, &seed_row_values("payment", "payment.completed"));
    let r = default_mapper().map(&event).unwrap();
    let value = r.value.unwrap();
    assert_eq!(&value[..], PAYLOAD.as_bytes());
    assert!(points_into(&value, &frame), "payload was copied");
    assert!(
        points_into(r.key.as_ref().unwrap(), &frame),
        "key was copied"
    );
    for (name, v) in &r.headers {
        let v = v.as_ref().expect("no NULL column in the row");
        assert!(points_into(v, &frame), "header {name} was copied");
    }
}

#[test]
fn bytea_columns_give_their_bytes_and_the_rest_stays_shared() {
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", BYTEA),
        ("event_type", TEXT),
        ("payload", BYTEA),
    ]);
    let (e, frame) = row_with_frame(
        &t,
        &[
            Some(EVENT_ID),
            Some("order"),
            Some("\\xdeadbeef"),
            Some("order.created"),
            Some("\\x00ff7b7d"),
        ],
    );
    let r = default_mapper().map(&e).unwrap();
    assert_eq!(r.key.as_deref(), Some(&b"\xde\xad\xbe\xef"[..]));
    assert_eq!(r.value.as_deref(), Some(&b"\x00\xff{}"[..]));
    assert_eq!(
        r.size,
        4 + 4
            + r.headers
                .iter()
                .map(|(n, v)| n.len() + v.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()
    );
    // Only the bytea values are new buffers.
    assert!(points_into(r.event_id.as_ref().unwrap(), &frame));
    // A value that is no bytea text is a mapping error naming the column.
    let bad = row(
        &t,
        &[
            Some(EVENT_ID),
            Some("order"),
            Some("\\xzz"),
            Some("order.created"),
            Some("\\x"),
        ],
    );
    let err = default_mapper().map(&bad).unwrap_err();
    assert!(err.to_string().contains("aggregate_id"), "{err}");
    // key_and_id still finds them, for the dead-letter copy.
    let (key, id) = default_mapper().key_and_id(&e);
    assert_eq!(key.as_deref(), Some(&b"\xde\xad\xbe\xef"[..]));
    assert_eq!(id.as_deref(), Some(EVENT_ID.as_bytes()));
}

#[test]
fn payload_mode_keeps_text_as_sent() {
    // Not JSON, odd spacing: sent exactly as PostgreSQL sent it.
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", TEXT),
    ]);
    let payload = " not json {\"b\": 1,   \"a\": 2}\n";
    let e = row(
        &t,
        &[
            Some("e1"),
            Some("order"),
            Some("o-1"),
            Some("order.created"),
            Some(payload),
        ],
    );
    let r = default_mapper().map(&e).unwrap();
    assert_eq!(r.value.as_deref(), Some(payload.as_bytes()));
}

#[test]
fn envelope_matches_the_seed_design() {
    let mut m = mapper(&ColumnsConfig::default(), &envelope_routing());
    let r = m.map(&seed_row("Payment", "payment.completed")).unwrap();
    let value: Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
    assert_eq!(
        value,
        json!({
            "id": EVENT_ID,
            "type": "payment.completed",
            "aggregateId": PAYMENT_ID,
            "aggregateType": "Payment",
            "payload": serde_json::from_str::<Value>(PAYLOAD).unwrap(),
            "occurredAt": "2026-11-30T02:04:20.875Z",
        })
    );
    // Key, headers and topic are as in payload mode.
    assert_eq!(r.key.as_ref().map(text), Some(PAYMENT_ID));
    assert_eq!(&*r.topic, "outbox.event.Payment");
    assert_eq!(header_names(&r), ["id", "aggregateType", "eventType"]);
    assert!(r.size > r.value.as_ref().unwrap().len());
}

#[test]
fn envelope_embeds_payload_verbatim() {
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSON),
    ]);
    let payload = r#"{"b": 1, "a": 2,  "n": 1.50}"#;
    let e = row(
        &t,
        &[
            Some("e1"),
            Some("order"),
            Some("o-1"),
            Some("order.created"),
            Some(payload),
        ],
    );
    let r = mapper(&ColumnsConfig::default(), &envelope_routing())
        .map(&e)
        .unwrap();
    let value = text(r.value.as_ref().unwrap()).to_owned();
    assert!(
        value.contains(&format!(r#""payload":{payload},"#)),
        "{value}"
    );
    // No created_at column: occurredAt is the commit time.
    assert!(
        value.ends_with(r#""occurredAt":"2026-11-30T02:04:20.123Z"}"#),
        "{value}"
    );
}

#[test]
fn envelope_embeds_non_json_text_as_a_string() {
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", TEXT),
    ]);
    let e = row(
        &t,
        &[
            Some("e1"),
            Some("order"),
            None,
            Some("order.created"),
            Some("plain \"text\""),
        ],
    );
    let r = mapper(&ColumnsConfig::default(), &envelope_routing())
        .map(&e)
        .unwrap();
    let value: Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
    assert_eq!(value["payload"], "plain \"text\"");
    assert_eq!(value["aggregateId"], Value::Null);
    assert_eq!(r.key, None);
}

#[test]
fn envelope_occurred_at_prefers_the_timestamp_column() {
    let columns = ColumnsConfig {
        timestamp: "occurred_at".into(),
        ..Default::default()
    };
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("created_at", TIMESTAMPTZ),
        ("occurred_at", INT8),
    ]);
    let e = row(
        &t,
        &[
            Some("e1"),
            Some("order"),
            Some("o-1"),
            Some("order.created"),
            Some("{}"),
            Some(CREATED_AT),
            Some("0"),
        ],
    );
    let r = mapper(&columns, &envelope_routing()).map(&e).unwrap();
    let value: Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
    assert_eq!(value["occurredAt"], "1970-01-01T00:00:00.000Z");
    assert_eq!(r.timestamp_ms, Some(0));
}

#[test]
fn default_headers_and_custom_header_to_column() {
    let routing = RoutingConfig {
        additional_headers: BTreeMap::from([
            ("eventType".to_owned(), "event_type".to_owned()),
            ("attempt".to_owned(), "attempts".to_owned()),
            ("error".to_owned(), "last_error".to_owned()),
            ("key".to_owned(), "key".to_owned()),
        ]),
        ..Default::default()
    };
    let r = mapper(&ColumnsConfig::default(), &routing)
        .map(&seed_row("payment", "payment.completed"))
        .unwrap();
    // "error" (last_error) is NULL: a null value, as Debezium sends it.
    // Config order is by name.
    assert_eq!(
        header_names(&r),
        ["id", "attempt", "error", "eventType", "key"]
    );
    assert_eq!(r.header_value("error"), Some(None));
    assert_eq!(r.header("attempt").map(text), Some("0"));
    assert_eq!(r.header("key").map(text), Some(PAYMENT_ID));

    let none = RoutingConfig {
        additional_headers: BTreeMap::new(),
        ..Default::default()
    };
    let r = mapper(&ColumnsConfig::default(), &none)
        .map(&seed_row("payment", "payment.completed"))
        .unwrap();
    assert_eq!(header_names(&r), ["id"]);
}

#[test]
fn null_id_and_header_columns_give_null_valued_headers() {
    // Debezium's router: `id` and every `additional.placement=…:header`
    // column are added whatever their value; a NULL is a null value, which
    // Kafka tells from an empty one.
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("tenant", TEXT),
    ]);
    let routing = RoutingConfig {
        additional_headers: BTreeMap::from([
            ("eventType".to_owned(), "event_type".to_owned()),
            ("tenant".to_owned(), "tenant".to_owned()),
        ]),
        ..Default::default()
    };
    let mut m = mapper(&ColumnsConfig::default(), &routing);
    let with = |id: Option<&'static str>, tenant: Option<&'static str>| {
        row(
            &t,
            &[
                id,
                Some("order"),
                Some("o-1"),
                Some("created"),
                Some("{}"),
                tenant,
            ],
        )
    };

    let r = m.map(&with(Some("e1"), None)).unwrap();
    assert_eq!(header_names(&r), ["id", "eventType", "tenant"]);
    assert_eq!(r.header_value("tenant"), Some(None));
    assert_eq!(r.header("tenant"), None);
    // A null value counts its name only.
    assert_eq!(
        r.size,
        "o-1".len() + "{}".len() + "id".len() + 2 + "eventType".len() + 7 + "tenant".len()
    );

    // Empty is not NULL.
    let r = m.map(&with(Some("e1"), Some(""))).unwrap();
    assert_eq!(r.header_value("tenant").flatten().map(text), Some(""));

    let r = m.map(&with(Some("e1"), Some("acme"))).unwrap();
    assert_eq!(r.header("tenant").map(text), Some("acme"));

    // A NULL id: the `id` header is still there, null.
    let r = m.map(&with(None, Some("acme"))).unwrap();
    assert_eq!(header_names(&r), ["id", "eventType", "tenant"]);
    assert_eq!(r.header_value("id"), Some(None));
    assert_eq!(r.event_id, None);
}

#[test]
fn header_column_missing_from_the_table_is_an_error() {
    let routing = RoutingConfig {
        additional_headers: BTreeMap::from([("tenant".to_owned(), "tenant_id".to_owned())]),
        ..Default::default()
    };
    let err = mapper(&ColumnsConfig::default(), &routing)
        .map(&seed_row("payment", "payment.completed"))
        .unwrap_err();
    assert_eq!(
        err,
        MappingError::MissingColumn {
            column: "tenant_id".into(),
            role: "routing.additional_headers.tenant".into()
        }
    );
}

#[test]
fn headers_column_adds_its_entries() {
    let columns = ColumnsConfig {
        headers: "headers".into(),
        ..Default::default()
    };
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("headers", JSONB),
    ]);
    let headers = r#"{"traceparent": "00-abc-01", "retries": 3, "quoted": "a\"b", "gone": null}"#;
    let (e, frame) = row_with_frame(
        &t,
        &[
            Some("e1"),
            Some("order"),
            Some("o-1"),
            Some("order.created"),
            Some("{}"),
            Some(headers),
        ],
    );
    let mut m = mapper(&columns, &RoutingConfig::default());
    let r = m.map(&e).unwrap();
    assert_eq!(
        header_names(&r),
        [
            "id",
            "aggregateType",
            "eventType",
            "traceparent",
            "retries",
            "quoted"
        ]
    );
    assert_eq!(r.header("traceparent").map(text), Some("00-abc-01"));
    assert!(points_into(r.header("traceparent").unwrap(), &frame));
    assert_eq!(r.header("retries").map(text), Some("3"));
    assert_eq!(r.header("quoted").map(text), Some("a\"b"));
    // Names are interned across events.
    let again = m.map(&e).unwrap();
    assert!(Arc::ptr_eq(&r.headers[3].0, &again.headers[3].0));

    let bad = row(
        &t,
        &[
            Some("e1"),
            Some("order"),
            Some("o-1"),
            Some("order.created"),
            Some("{}"),
            Some("[1]"),
        ],
    );
    assert!(matches!(
        m.map(&bad),
        Err(MappingError::InvalidHeaders { column, .. }) if column == "headers"
    ));
    let null = row(
        &t,
        &[
            Some("e1"),
            Some("order"),
            Some("o-1"),
            Some("order.created"),
            Some("{}"),
            None,
        ],
    );
    assert_eq!(m.map(&null).unwrap().headers.len(), 3);
}

#[test]
fn default_topic_template() {
    let r = default_mapper()
        .map(&seed_row("payment", "payment.completed"))
        .unwrap();
    assert_eq!(&*r.topic, "outbox.event.payment");
}

#[test]
fn seed_rule_routes_by_event_type_prefix() {
    let routing = RoutingConfig {
        rules: vec![
            RoutingRule {
                event_type_prefix: Some("payment.".into()),
                topic: "payments".into(),
                ..Default::default()
            },
            RoutingRule {
                aggregate_type: Some("customer".into()),
                topic: "crm.${event_type}".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let mut m = mapper(&ColumnsConfig::default(), &routing);
    let r = m.map(&seed_row("payment", "payment.completed")).unwrap();
    assert_eq!(&*r.topic, "payments");
    let r = m.map(&seed_row("customer", "customer.created")).unwrap();
    assert_eq!(&*r.topic, "crm.customer.created");
    let r = m.map(&seed_row("order", "order.created")).unwrap();
    assert_eq!(&*r.topic, "outbox.event.order");
}

#[test]
fn topics_are_interned() {
    let mut m = default_mapper();
    let a = m.map(&seed_row("payment", "payment.completed")).unwrap();
    let b = m.map(&seed_row("payment", "payment.failed")).unwrap();
    assert!(Arc::ptr_eq(&a.topic, &b.topic));
    m.map(&seed_row("order", "order.created")).unwrap();
    assert_eq!(m.cached_topics(), 2);
}

#[test]
fn per_row_topic_column_overrides_routing() {
    let columns = ColumnsConfig {
        topic: "topic".into(),
        ..Default::default()
    };
    let routing = RoutingConfig {
        rules: vec![RoutingRule {
            event_type_prefix: Some("payment.".into()),
            topic: "payments".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("topic", TEXT),
    ]);
    let ev = |topic: Option<&str>| {
        row(
            &t,
            &[
                Some("e1"),
                Some("payment"),
                Some("p-1"),
                Some("payment.completed"),
                Some("{}"),
                topic,
            ],
        )
    };
    let mut m = mapper(&columns, &routing);
    assert_eq!(
        &*m.map(&ev(Some("billing.special"))).unwrap().topic,
        "billing.special"
    );
    // NULL or empty: routing applies.
    assert_eq!(&*m.map(&ev(None)).unwrap().topic, "payments");
    assert_eq!(&*m.map(&ev(Some(""))).unwrap().topic, "payments");
    assert_eq!(
        m.map(&ev(Some("no/slashes"))).unwrap_err(),
        MappingError::InvalidTopic {
            topic: "no/slashes".into(),
            reason: "it contains `/`; only letters, digits, '.', '_' and '-' are allowed".into()
        }
    );
}

#[test]
fn null_or_missing_placeholder_is_an_error() {
    let t = seed_table();
    let mut values = seed_row_values("payment", "payment.completed");
    values[1] = None;
    let err = default_mapper().map(&row(&t, &values)).unwrap_err();
    assert_eq!(
        err,
        MappingError::TopicPlaceholder {
            placeholder: "${aggregate_type}".into()
        }
    );
    assert!(err.to_string().contains("${aggregate_type}"));

    values[1] = Some("");
    assert!(matches!(
        default_mapper().map(&row(&t, &values)),
        Err(MappingError::TopicPlaceholder { .. })
    ));

    let routing = RoutingConfig {
        topic: "events.${column:tenant}".into(),
        ..Default::default()
    };
    let err = mapper(&ColumnsConfig::default(), &routing)
        .map(&seed_row("payment", "payment.completed"))
        .unwrap_err();
    assert_eq!(
        err,
        MappingError::TopicPlaceholder {
            placeholder: "${column:tenant}".into()
        }
    );
}

#[test]
fn column_placeholder_uses_any_column() {
    let routing = RoutingConfig {
        topic: "events.${column:attempts}.${key}".into(),
        ..Default::default()
    };
    let r = mapper(&ColumnsConfig::default(), &routing)
        .map(&seed_row("payment", "payment.completed"))
        .unwrap();
    assert_eq!(&*r.topic, format!("events.0.{PAYMENT_ID}"));
}

#[test]
fn invalid_topic_is_an_error() {
    let err = default_mapper()
        .map(&seed_row("Zahlungsausgänge", "payment.completed"))
        .unwrap_err();
    match &err {
        MappingError::InvalidTopic { topic, reason } => {
            assert_eq!(topic, "outbox.event.Zahlungsausgänge");
            assert!(reason.contains("0xc3"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let long = "a".repeat(300);
    assert!(matches!(
        default_mapper().map(&seed_row(&long, "x")),
        Err(MappingError::InvalidTopic { reason, .. }) if reason.contains("249")
    ));
    let routing = RoutingConfig {
        topic: "${aggregate_type}".into(),
        ..Default::default()
    };
    assert!(matches!(
        mapper(&ColumnsConfig::default(), &routing).map(&seed_row("..", "x")),
        Err(MappingError::InvalidTopic { .. })
    ));
}

#[test]
fn tombstone_on_empty_payload() {
    let routing = RoutingConfig {
        tombstone_on_empty_payload: true,
        ..Default::default()
    };
    let t = seed_table();
    let mut m = mapper(&ColumnsConfig::default(), &routing);
    let mut values = seed_row_values("payment", "payment.deleted");
    values[4] = None;
    let r = m.map(&row(&t, &values)).unwrap();
    assert_eq!(r.value, None);
    assert_eq!(r.key.as_ref().map(text), Some(PAYMENT_ID));
    values[4] = Some("");
    assert_eq!(m.map(&row(&t, &values)).unwrap().value, None);

    // Also in envelope mode.
    let routing = RoutingConfig {
        tombstone_on_empty_payload: true,
        value: ValueFormat::Envelope,
        ..Default::default()
    };
    let mut m = mapper(&ColumnsConfig::default(), &routing);
    assert_eq!(m.map(&row(&t, &values)).unwrap().value, None);
}

#[test]
fn null_payload_without_tombstones_is_an_error() {
    let t = seed_table();
    let mut values = seed_row_values("payment", "payment.deleted");
    values[4] = None;
    let err = default_mapper().map(&row(&t, &values)).unwrap_err();
    assert_eq!(err, MappingError::NullPayload);
    assert!(err
        .to_string()
        .contains("routing.tombstone_on_empty_payload"));
    // An empty payload is sent as an empty value.
    values[4] = Some("");
    let r = default_mapper().map(&row(&t, &values)).unwrap();
    assert_eq!(r.value.as_deref(), Some(&b""[..]));
}

#[test]
fn timestamp_column() {
    let columns = ColumnsConfig {
        timestamp: "created_at".into(),
        ..Default::default()
    };
    let t = seed_table();
    let mut m = mapper(&columns, &RoutingConfig::default());
    let base = 1_796_004_260_875;
    for (value, expected) in [
        ("2026-11-30 02:04:20.875758+00", Some(base)),
        ("2026-11-30 05:04:20.875+03", Some(base)),
        ("2026-11-30 02:04:20.8+00", Some(base - 75)),
        ("2026-11-30 02:04:20+00", Some(base - 875)),
        ("2026-11-30T02:04:20.875Z", Some(base)),
        ("1796004260875", Some(base)),
    ] {
        let mut values = seed_row_values("payment", "payment.completed");
        values[5] = Some(value);
        assert_eq!(
            m.map(&row(&t, &values)).unwrap().timestamp_ms,
            expected,
            "{value}"
        );
    }
    // NULL: the commit time.
    let mut values = seed_row_values("payment", "payment.completed");
    values[5] = None;
    assert_eq!(
        m.map(&row(&t, &values)).unwrap().timestamp_ms,
        Some(COMMIT_MS)
    );
    values[5] = Some("yesterday");
    assert_eq!(
        m.map(&row(&t, &values)).unwrap_err(),
        MappingError::InvalidTimestamp {
            column: "created_at".into(),
            value: "yesterday".into()
        }
    );
}

#[test]
fn missing_required_column() {
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregateid", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
    ]);
    let e = row(
        &t,
        &[
            Some("e1"),
            Some("order"),
            Some("o-1"),
            Some("order.created"),
            Some("{}"),
        ],
    );
    let err = default_mapper().map(&e).unwrap_err();
    assert_eq!(
        err,
        MappingError::MissingColumn {
            column: "aggregate_id".into(),
            role: "outbox.columns.key".into()
        }
    );
    assert!(err.to_string().contains("outbox.columns.key"), "{err}");
}

#[test]
fn configured_optional_column_missing_from_the_table() {
    let columns = ColumnsConfig {
        timestamp: "occurred_at".into(),
        ..Default::default()
    };
    let err = mapper(&columns, &RoutingConfig::default())
        .map(&seed_row("payment", "payment.completed"))
        .unwrap_err();
    assert_eq!(
        err,
        MappingError::MissingColumn {
            column: "occurred_at".into(),
            role: "outbox.columns.timestamp".into()
        }
    );
}

#[test]
fn null_key_gives_a_keyless_record() {
    let t = seed_table();
    let mut values = seed_row_values("payment", "payment.completed");
    values[2] = None;
    let r = default_mapper().map(&row(&t, &values)).unwrap();
    assert_eq!(r.key, None);
}

#[test]
fn unchanged_toast_is_an_error() {
    let mut e = seed_row("payment", "payment.completed");
    if let EventKind::Row(r) = &mut e.kind {
        r.values[4] = ColumnValue::UnchangedToast;
    }
    assert_eq!(
        default_mapper().map(&e).unwrap_err(),
        MappingError::UnavailableValue {
            column: "payload".into()
        }
    );
}

#[test]
fn non_utf8_event_type_with_rules() {
    let routing = RoutingConfig {
        rules: vec![RoutingRule {
            event_type: Some("x".into()),
            topic: "x".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut e = seed_row("payment", "payment.completed");
    if let EventKind::Row(r) = &mut e.kind {
        r.values[3] = ColumnValue::Text(Bytes::from_static(b"\xff"));
    }
    assert_eq!(
        mapper(&ColumnsConfig::default(), &routing)
            .map(&e)
            .unwrap_err(),
        MappingError::InvalidText {
            column: "event_type".into(),
            role: "outbox.columns.event_type".into()
        }
    );
    // Without rules the event type is only copied into a header.
    assert!(default_mapper().map(&e).is_ok());
}

#[test]
fn table_shape_changes_are_picked_up() {
    let mut m = default_mapper();
    m.map(&seed_row("payment", "payment.completed")).unwrap();
    // Same columns, other order (a new Relation message).
    let t = table(&[
        ("payload", JSONB),
        ("event_type", TEXT),
        ("aggregate_id", TEXT),
        ("aggregate_type", TEXT),
        ("id", UUID),
    ]);
    let r = m
        .map(&row(
            &t,
            &[
                Some("{}"),
                Some("order.created"),
                Some("o-1"),
                Some("order"),
                Some("e2"),
            ],
        ))
        .unwrap();
    assert_eq!(&*r.topic, "outbox.event.order");
    assert_eq!(r.key.as_ref().map(text), Some("o-1"));
    assert_eq!(r.event_id.as_ref().map(text), Some("e2"));
    assert_eq!(r.value.as_ref().map(text), Some("{}"));
}

#[test]
fn debezium_shaped_table() {
    let columns = ColumnsConfig {
        key: "aggregateid".into(),
        aggregate_type: "aggregatetype".into(),
        event_type: "type".into(),
        ..Default::default()
    };
    let routing = RoutingConfig {
        additional_headers: BTreeMap::new(),
        ..Default::default()
    };
    let t = table(&[
        ("id", UUID),
        ("aggregatetype", VARCHAR),
        ("aggregateid", VARCHAR),
        ("type", VARCHAR),
        ("payload", JSONB),
    ]);
    let e = row(
        &t,
        &[
            Some(EVENT_ID),
            Some("order"),
            Some("1"),
            Some("OrderCreated"),
            Some(r#"{"id": 1}"#),
        ],
    );
    let r = mapper(&columns, &routing).map(&e).unwrap();
    assert_eq!(&*r.topic, "outbox.event.order");
    assert_eq!(r.key.as_ref().map(text), Some("1"));
    assert_eq!(header_names(&r), ["id"]);
    assert_eq!(r.value.as_ref().map(text), Some(r#"{"id": 1}"#));
}

#[test]
fn logical_message_maps_like_a_row() {
    let content = format!(
        r#"{{"id":"{EVENT_ID}","aggregate_type":"payment","aggregate_id":"{PAYMENT_ID}",
            "event_type":"payment.completed","payload":{PAYLOAD},"attempts":0}}"#
    );
    let e = message(&content);
    let routing = RoutingConfig {
        additional_headers: BTreeMap::from([
            ("eventType".to_owned(), "event_type".to_owned()),
            ("attempts".to_owned(), "attempts".to_owned()),
            ("tenant".to_owned(), "tenant".to_owned()),
        ]),
        ..Default::default()
    };
    let r = mapper(&ColumnsConfig::default(), &routing).map(&e).unwrap();
    assert_eq!(&*r.topic, "outbox.event.payment");
    assert_eq!(r.key.as_ref().map(text), Some(PAYMENT_ID));
    // The payload's raw JSON text, as written, sliced from the message.
    let value = r.value.clone().unwrap();
    assert_eq!(text(&value), PAYLOAD);
    let EventKind::Message { content, .. } = &e.kind else {
        unreachable!()
    };
    assert!(points_into(&value, content));
    // An absent optional field (tenant) is NULL, a null-valued header;
    // numbers become their text.
    assert_eq!(header_names(&r), ["id", "attempts", "eventType", "tenant"]);
    assert_eq!(r.header_value("tenant"), Some(None));
    assert_eq!(r.header("attempts").map(text), Some("0"));
    assert_eq!(r.timestamp_ms, Some(COMMIT_MS));
}

#[test]
fn logical_message_in_envelope_mode_and_with_escapes() {
    let e = message(
        r#"{"id":"e-1","aggregate_type":"order","aggregate_id":"o\"1","event_type":"order.created",
            "payload":{"b": 1, "a": [true, null]},"created_at":"2026-11-30 02:04:20.875+00"}"#,
    );
    let r = mapper(&ColumnsConfig::default(), &envelope_routing())
        .map(&e)
        .unwrap();
    assert_eq!(r.key.as_ref().map(text), Some("o\"1"));
    let value = text(r.value.as_ref().unwrap()).to_owned();
    assert!(
        value.contains(r#""payload":{"b": 1, "a": [true, null]},"#),
        "{value}"
    );
    let parsed: Value = serde_json::from_str(&value).unwrap();
    assert_eq!(parsed["aggregateId"], "o\"1");
    assert_eq!(parsed["occurredAt"], "2026-11-30T02:04:20.875Z");
}

#[test]
fn logical_message_errors() {
    let mut m = default_mapper();
    for bad in ["not json", "[1,2]", r#""x""#, r#"{"id":"e"} trailing"#] {
        assert!(
            matches!(
                m.map(&message(bad)),
                Err(MappingError::InvalidMessage { .. })
            ),
            "{bad}"
        );
    }
    let err = m
        .map(&message(
            r#"{"id":"e","aggregate_type":"order","event_type":"x","payload":{}}"#,
        ))
        .unwrap_err();
    assert_eq!(
        err,
        MappingError::MissingColumn {
            column: "aggregate_id".into(),
            role: "outbox.columns.key".into()
        }
    );
    // Explicit nulls are NULLs.
    let err = m
        .map(&message(
            r#"{"id":"e","aggregate_type":"order","aggregate_id":null,"event_type":"x","payload":null}"#,
        ))
        .unwrap_err();
    assert_eq!(err, MappingError::NullPayload);
}

#[test]
fn config_errors() {
    let bad_template = RoutingConfig {
        topic: "outbox.${nope}".into(),
        ..Default::default()
    };
    let err = RecordMapper::new(&ColumnsConfig::default(), &bad_template, "/test").unwrap_err();
    assert!(err.to_string().starts_with("routing.topic:"), "{err}");
    let no_payload = ColumnsConfig {
        payload: String::new(),
        ..Default::default()
    };
    let err = RecordMapper::new(&no_payload, &RoutingConfig::default(), "/test").unwrap_err();
    assert!(err.to_string().contains("outbox.columns.payload"), "{err}");
    let bad_literal = RoutingConfig {
        rules: vec![RoutingRule {
            aggregate_type: Some("x".into()),
            topic: "..".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let err = RecordMapper::new(&ColumnsConfig::default(), &bad_literal, "/test").unwrap_err();
    assert!(
        err.to_string().starts_with("routing.rules[0].topic:"),
        "{err}"
    );
}

fn arb_rules() -> impl Strategy<Value = Vec<RoutingRule>> {
    let name = prop::sample::select(vec!["a", "a.b", "a.c", "b", "b.a"]);
    let rule = (
        prop::option::of(name.clone()),
        prop::option::of(prop::sample::select(vec!["a", "a.", "b"])),
        prop::option::of(prop::sample::select(vec!["x", "y"])),
        0u8..100,
    )
        .prop_filter("rules need a matcher, not both event type matchers", |r| {
            (r.0.is_some() || r.1.is_some() || r.2.is_some()) && !(r.0.is_some() && r.1.is_some())
        })
        .prop_map(|(et, prefix, at, n)| RoutingRule {
            event_type: et.map(str::to_owned),
            event_type_prefix: prefix.map(str::to_owned),
            aggregate_type: at.map(str::to_owned),
            topic: format!("t{n}"),
            value_format: None,
            schema_file: None,
        });
    prop::collection::vec(rule, 0..5)
}

proptest! {
    #[test]
    fn rule_choice_matches_topic_template_for(
        rules in arb_rules(),
        et in prop::sample::select(vec!["a", "a.b", "a.c", "b", "b.a", ""]),
        at in prop::sample::select(vec!["x", "y", "z"]),
    ) {
        let routing = RoutingConfig { rules, ..Default::default() };
        let m = mapper(&ColumnsConfig::default(), &routing);
        let chosen = m
            .rule_for(et, at)
            .map_or(routing.topic.as_str(), |i| routing.rules[i].topic.as_str());
        prop_assert_eq!(chosen, routing.topic_template_for(et, at));
    }

    #[test]
    fn envelope_is_valid_json_for_any_text(
        id in ".*",
        et in ".*",
        payload in ".*",
    ) {
        let t = table(&[
            ("id", TEXT),
            ("aggregate_type", TEXT),
            ("aggregate_id", TEXT),
            ("event_type", TEXT),
            ("payload", TEXT),
        ]);
        let e = row(&t, &[Some(&id), Some("agg"), None, Some(&et), Some(&payload)]);
        let r = mapper(&ColumnsConfig::default(), &envelope_routing()).map(&e).unwrap();
        let v: Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
        prop_assert_eq!(&v["id"], &Value::String(id));
        prop_assert_eq!(&v["type"], &Value::String(et));
        if serde_json::from_str::<Value>(&payload).is_err() {
            prop_assert_eq!(&v["payload"], &Value::String(payload));
        }
    }
}

/// Several tables: a row by its relation's table, a message by its prefix,
/// each with that entry's columns and routing; the label follows.
#[test]
fn table_mappers_map_each_event_by_its_table() {
    let cfg = crate::config::Config::from_toml_str_with_env(
        "[postgres]\nurl = \"postgresql://u@h/db\"\n\
         [routing]\ntopic = \"orders.${aggregate_type}\"\n\
         [[outbox]]\ntable = \"public.outbox\"\n\
         [[outbox]]\ntable = \"billing.events\"\nmessage_prefix = \"billing\"\n\
         [outbox.columns]\nkey = \"account\"\n\
         [outbox.routing]\ntopic = \"billing.${event_type}\"\n",
        |_| None,
    )
    .unwrap();
    let mut mappers = crate::outbox::tables::TableMappers::new(&cfg.tables()).unwrap();
    let values = [
        Some(EVENT_ID),
        Some("payment"),
        Some(PAYMENT_ID),
        Some("payment.completed"),
        Some(PAYLOAD),
    ];
    let columns = |key: &'static str| {
        [
            ("id", UUID),
            ("aggregate_type", TEXT),
            (key, TEXT),
            ("event_type", TEXT),
            ("payload", JSONB),
        ]
    };
    let orders = row(&table(&columns("aggregate_id")), &values);
    let mut billing_table = (*table(&columns("account"))).clone();
    billing_table.schema = "billing".into();
    billing_table.name = "events".into();
    let billing = row(&Arc::new(billing_table), &values);
    let r = mappers.map(&orders).unwrap();
    assert_eq!(&*r.topic, "orders.payment");
    assert_eq!(mappers.label(&orders), "public.outbox");
    let r = mappers.map(&billing).unwrap();
    assert_eq!(&*r.topic, "billing.payment.completed");
    assert_eq!(r.key.as_ref().map(text), Some(PAYMENT_ID));
    assert_eq!(mappers.label(&billing), "billing.events");
    let content = format!(
        r#"{{"id":"{EVENT_ID}","aggregate_type":"payment","account":"acc-1",
            "event_type":"invoice.sent","payload":{PAYLOAD}}}"#
    );
    let mut m = message(&content);
    if let EventKind::Message { prefix, .. } = &mut m.kind {
        *prefix = "billing".into();
    }
    let r = mappers.map(&m).unwrap();
    assert_eq!(&*r.topic, "billing.invoice.sent");
    assert_eq!(r.key.as_ref().map(text), Some("acc-1"));
    assert_eq!(mappers.label(&m), "billing.events");
}

#[test]
fn framed_payloads_pass_unchanged_once_the_registry_confirmed_their_id() {
    let t = table(&[
        ("id", UUID),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", BYTEA),
    ]);
    let routing = RoutingConfig {
        value_format: ValueEncoding::Framed,
        ..RoutingConfig::default()
    };
    let mut m =
        RecordMapper::with_schemas(&ColumnsConfig::default(), &routing, "/t", &SchemaSet::new())
            .unwrap();
    let event = |payload: &str| {
        row(
            &t,
            &[
                Some(EVENT_ID),
                Some("order"),
                Some("k"),
                Some("order.created"),
                Some(payload),
            ],
        )
    };
    // Magic byte, id 7, then the record's bytes.
    let framed = event("\\x000000000702ff");
    assert_eq!(
        m.map(&framed).unwrap_err(),
        MappingError::SchemaIdUnchecked {
            event_id: EVENT_ID.into(),
            id: 7
        }
    );
    let schema_7 = crate::outbox::registered::FramedSchema::new(7, None, "http://registry:8081");
    m.learn_schema_id(7, schema_7.clone());
    let r = m.map(&framed).unwrap();
    assert_eq!(
        r.value.as_deref(),
        Some(&b"\x00\x00\x00\x00\x07\x02\xff"[..])
    );
    assert!(
        !r.headers.iter().any(|(n, _)| n.starts_with("ce_")),
        "plain"
    );

    // CloudEvents binary: the bytes unchanged, the content type of the
    // id's schema type, and where the registry serves it.
    let ce = RoutingConfig {
        format: crate::config::cloudevents::EventFormat::CloudeventsBinary,
        ..routing.clone()
    };
    let mut binary =
        RecordMapper::with_schemas(&ColumnsConfig::default(), &ce, "/t", &SchemaSet::new())
            .unwrap();
    for (id, schema_type, content_type) in [
        (7u8, None, "application/avro"),
        (8, Some("JSON"), "application/schema+json"),
        (9, Some("PROTOBUF"), "application/protobuf"),
    ] {
        let framed = event(&format!("\\x000000000{id}02ff"));
        assert!(matches!(
            binary.map(&framed),
            Err(MappingError::SchemaIdUnchecked { .. })
        ));
        binary.learn_schema_id(
            id.into(),
            crate::outbox::registered::FramedSchema::new(
                id.into(),
                schema_type,
                "http://registry:8081",
            ),
        );
        let r = binary.map(&framed).unwrap();
        assert_eq!(r.value.as_deref(), Some(&[0, 0, 0, 0, id, 0x02, 0xff][..]));
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(n, _)| &**n == name)
                .and_then(|(_, v)| v.as_deref())
                .map(|v| std::str::from_utf8(v).unwrap().to_owned())
        };
        assert_eq!(header("content-type").as_deref(), Some(content_type));
        assert_eq!(
            header("ce_dataschema"),
            Some(format!("http://registry:8081/schemas/ids/{id}"))
        );
        assert_eq!(header("ce_specversion").as_deref(), Some("1.0"));
    }

    let e = m.map(&event("\\x010000000702")).unwrap_err().to_string();
    assert!(e.contains("the first byte is 0x01"), "{e}");
    let e = m.map(&event("\\x000007")).unwrap_err().to_string();
    assert!(e.contains("too short"), "{e}");
    // Commands that do not read the registry refuse the format at start.
    let e = RecordMapper::new(&ColumnsConfig::default(), &routing, "/t").unwrap_err();
    assert!(e.to_string().contains("routing.value_format"), "{e}");
}

#[test]
fn cloudevents_binary_carries_the_encoded_value_its_content_type_and_dataschema() {
    use crate::config::cloudevents::EventFormat;
    use crate::outbox::registered::{RegisteredSchema, SchemaKind};
    let schema = |kind: SchemaKind| {
        Arc::new(RegisteredSchema {
            id: 12,
            subject: "payments-value".into(),
            version: 3,
            schema: kind,
            url: "http://registry:8081".into(),
        })
    };
    for (encoding, kind, content_type) in [
        (
            ValueEncoding::JsonSchema,
            SchemaKind::parse(Some("JSON"), r#"{"type": "object"}"#).unwrap(),
            "application/schema+json",
        ),
        (
            ValueEncoding::Avro,
            SchemaKind::parse(
                None,
                r#"{"type": "record", "name": "P", "fields": [{"name": "amount", "type": "long"}]}"#,
            )
            .unwrap(),
            "application/avro",
        ),
    ] {
        let routing = RoutingConfig {
            topic: "payments".into(),
            value_format: encoding,
            format: EventFormat::CloudeventsBinary,
            ..RoutingConfig::default()
        };
        let schemas = SchemaSet::from([("payments-value".to_owned(), schema(kind))]);
        let mut m =
            RecordMapper::with_schemas(&ColumnsConfig::default(), &routing, "/t", &schemas)
                .unwrap();
        let e = row(
            &seed_table(),
            &[
                Some(EVENT_ID),
                Some("payment"),
                Some(PAYMENT_ID),
                Some("payment.made"),
                Some(r#"{"amount": 1999}"#),
                Some(CREATED_AT),
                None,
                Some("0"),
                None,
            ],
        );
        let r = m.map(&e).unwrap();
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(n, _)| &**n == name)
                .and_then(|(_, v)| v.as_deref())
                .map(|v| std::str::from_utf8(v).unwrap().to_owned())
        };
        assert_eq!(header("content-type").as_deref(), Some(content_type));
        assert_eq!(
            header("ce_dataschema").as_deref(),
            Some("http://registry:8081/schemas/ids/12")
        );
        let value = r.value.unwrap();
        assert_eq!(&value[..5], &[0, 0, 0, 0, 12]);
        if encoding == ValueEncoding::JsonSchema {
            assert_eq!(&value[5..], br#"{"amount": 1999}"#);
        }
    }
}

#[test]
fn per_event_subjects_are_asked_for_once_and_rules_choose_the_value_format() {
    use crate::config::value_format::SchemaVersion;
    use crate::outbox::registered::{RegisteredSchema, SchemaKind};
    let routing = RoutingConfig {
        topic: "orders".into(),
        subject: "com.acme.${event_type}".into(),
        rules: vec![RoutingRule {
            event_type_prefix: Some("payment.".into()),
            topic: "payments".into(),
            value_format: Some(ValueEncoding::JsonSchema),
            ..RoutingRule::default()
        }],
        ..RoutingConfig::default()
    };
    let mut m =
        RecordMapper::with_schemas(&ColumnsConfig::default(), &routing, "/t", &SchemaSet::new())
            .unwrap();
    let event = |event_type: &str| {
        let mut values = seed_row_values("payment", event_type);
        values[4] = Some(r#"{"amount": 5}"#);
        row(&seed_table(), &values)
    };
    // The default (json) route needs no schema.
    let r = m.map(&event("order.created")).unwrap();
    assert_eq!(r.value.as_deref(), Some(&br#"{"amount": 5}"#[..]));
    assert_eq!(
        m.map(&event("payment.made")).unwrap_err(),
        MappingError::SchemaSubjectUnchecked {
            event_id: EVENT_ID.into(),
            subject: "com.acme.payment.made".into(),
            version: SchemaVersion::Latest,
        }
    );
    let schema = Arc::new(RegisteredSchema {
        id: 77,
        subject: "com.acme.payment.made".into(),
        version: 1,
        schema: SchemaKind::parse(Some("JSON"), r#"{"required": ["amount"]}"#).unwrap(),
        url: "http://r".into(),
    });
    m.learn_subject("com.acme.payment.made", &schema);
    let r = m.map(&event("payment.made")).unwrap();
    assert_eq!(&r.topic[..], "payments");
    assert_eq!(
        r.value.as_deref().map(|v| &v[..5]),
        Some(&[0, 0, 0, 0, 77][..])
    );
    // Another event type is another subject.
    assert!(matches!(
        m.map(&event("payment.refunded")),
        Err(MappingError::SchemaSubjectUnchecked { subject, .. }) if subject == "com.acme.payment.refunded"
    ));
    // An Avro schema under the subject does not serve json-schema.
    let avro = Arc::new(RegisteredSchema {
        id: 78,
        subject: "com.acme.payment.refunded".into(),
        version: 1,
        schema: SchemaKind::parse(None, r#""long""#).unwrap(),
        url: "http://r".into(),
    });
    m.learn_subject("com.acme.payment.refunded", &avro);
    let e = m.map(&event("payment.refunded")).unwrap_err().to_string();
    assert!(e.contains("its schema type is AVRO"), "{e}");
}
