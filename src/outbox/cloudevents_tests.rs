//! The CloudEvents formats and the trace context headers, through
//! `RecordMapper`: rows and messages to records, exact bytes.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::config::cloudevents::EventFormat;
use crate::config::outbox::ColumnsConfig;
use crate::config::routing::RoutingConfig;
use crate::outbox::error::MappingError;
use crate::outbox::event::{ColumnInfo, ColumnValue, EventKind, OutboxEvent, Row, TableInfo};
use crate::outbox::mapper::RecordMapper;
use crate::outbox::record::KafkaRecord;
use crate::Lsn;

const TEXT: u32 = 25;
const JSONB: u32 = 3802;
/// 2026-11-30T02:04:20.875758Z.
const COMMIT_US: i64 = 1_796_004_260_875_758;
const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const PAYLOAD: &str = r#"{"amount": 1999,  "currency": "EUR"}"#;

fn table() -> Arc<TableInfo> {
    let columns = [
        ("id", TEXT),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", TEXT),
        ("tenant", TEXT),
        ("trace", TEXT),
        ("ext", JSONB),
    ];
    Arc::new(TableInfo {
        oid: 1,
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

/// id, aggregate_id, payload, tenant, trace, ext.
fn row(
    id: Option<&str>,
    agg: Option<&str>,
    payload: Option<&str>,
    tenant: Option<&str>,
    trace: Option<&str>,
    ext: Option<&str>,
) -> OutboxEvent {
    let values = [
        id,
        Some("payment"),
        agg,
        Some("payment.completed"),
        payload,
        tenant,
        trace,
        ext,
    ];
    OutboxEvent {
        commit_lsn: Lsn(1),
        xid: 1,
        commit_time_us: COMMIT_US,
        kind: EventKind::Row(Row {
            table: table(),
            values: values
                .iter()
                .map(|v| {
                    v.map_or(ColumnValue::Null, |s| {
                        ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
                    })
                })
                .collect(),
        }),
    }
}

fn good_row() -> OutboxEvent {
    row(
        Some("e-1"),
        Some("p-1"),
        Some(PAYLOAD),
        Some("acme"),
        Some(TP),
        Some(r#"{"region": "eu", "priority": 3, "replayed": false, "gone": null}"#),
    )
}

fn columns() -> ColumnsConfig {
    ColumnsConfig {
        trace_context: "trace".into(),
        ce_extensions: "ext".into(),
        ..Default::default()
    }
}

fn routing(format: EventFormat) -> RoutingConfig {
    let mut r = RoutingConfig {
        format,
        ..Default::default()
    };
    if format.is_cloudevents() {
        r.cloudevents
            .extensions
            .insert("tenant".into(), "tenant".into());
    }
    r
}

fn mapper(format: EventFormat) -> RecordMapper {
    let columns = if format.is_cloudevents() {
        columns()
    } else {
        ColumnsConfig {
            trace_context: "trace".into(),
            ..Default::default()
        }
    };
    RecordMapper::new(&columns, &routing(format), "/outboxd/app/public.outbox").unwrap()
}

fn headers(r: &KafkaRecord) -> Vec<(&str, &str)> {
    r.headers
        .iter()
        .map(|(n, v)| (&**n, std::str::from_utf8(v.as_ref().unwrap()).unwrap()))
        .collect()
}

#[test]
fn plain_format_adds_traceparent() {
    let r = mapper(EventFormat::Plain).map(&good_row()).unwrap();
    assert_eq!(r.value.as_deref(), Some(PAYLOAD.as_bytes()));
    assert_eq!(
        headers(&r),
        [
            ("id", "e-1"),
            ("aggregateType", "payment"),
            ("eventType", "payment.completed"),
            ("traceparent", TP),
        ]
    );
}

#[test]
fn binary_mode_puts_attributes_in_headers_and_leaves_the_value() {
    let r = mapper(EventFormat::CloudeventsBinary)
        .map(&good_row())
        .unwrap();
    assert_eq!(r.key.as_deref(), Some(&b"p-1"[..]));
    assert_eq!(r.value.as_deref(), Some(PAYLOAD.as_bytes()));
    assert_eq!(
        headers(&r),
        [
            ("id", "e-1"),
            ("aggregateType", "payment"),
            ("eventType", "payment.completed"),
            ("traceparent", TP),
            ("content-type", "application/json"),
            ("ce_specversion", "1.0"),
            ("ce_id", "e-1"),
            ("ce_source", "/outboxd/app/public.outbox"),
            ("ce_type", "payment.completed"),
            ("ce_time", "2026-11-30T02:04:20.875758Z"),
            ("ce_subject", "p-1"),
            ("ce_tenant", "acme"),
            ("ce_priority", "3"),
            ("ce_region", "eu"),
            ("ce_replayed", "false"),
        ]
    );
    assert_eq!(
        r.size,
        KafkaRecord::compute_size(r.key.as_ref(), r.value.as_ref(), &r.headers)
    );
}

#[test]
fn structured_mode_writes_one_json_event_with_the_payload_verbatim() {
    let r = mapper(EventFormat::CloudeventsStructured)
        .map(&good_row())
        .unwrap();
    let value = std::str::from_utf8(r.value.as_deref().unwrap()).unwrap();
    assert_eq!(
        value,
        r#"{"specversion":"1.0","source":"/outboxd/app/public.outbox","datacontenttype":"application/json","id":"e-1","type":"payment.completed","time":"2026-11-30T02:04:20.875758Z","subject":"p-1","tenant":"acme","priority":3,"region":"eu","replayed":false,"data":{"amount": 1999,  "currency": "EUR"}}"#
    );
    let h = headers(&r);
    assert!(
        h.contains(&("content-type", "application/cloudevents+json")),
        "{h:?}"
    );
    assert!(h.contains(&("traceparent", TP)), "{h:?}");
    assert!(!h.iter().any(|(n, _)| n.starts_with("ce_")), "{h:?}");
}

#[test]
fn structured_mode_embeds_non_json_payloads_as_strings() {
    let mut m = mapper(EventFormat::CloudeventsStructured);
    let r = m
        .map(&row(
            Some("e"),
            None,
            Some("plain \"text\""),
            None,
            None,
            None,
        ))
        .unwrap();
    let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
    assert_eq!(v["data"], json!("plain \"text\""));
    // No aggregate id: no subject (and no key).
    assert!(v.get("subject").is_none(), "{v}");
}

#[test]
fn a_tombstone_carries_its_attributes_in_headers_in_both_modes() {
    for format in [
        EventFormat::CloudeventsBinary,
        EventFormat::CloudeventsStructured,
    ] {
        let mut routing = routing(format);
        routing.tombstone_on_empty_payload = true;
        let mut m = RecordMapper::new(&columns(), &routing, "/s").unwrap();
        let r = m
            .map(&row(Some("e"), Some("k"), None, None, None, None))
            .unwrap();
        assert_eq!(r.value, None);
        let h = headers(&r);
        assert!(h.contains(&("ce_id", "e")), "{h:?}");
        assert!(!h.iter().any(|(n, _)| *n == "content-type"), "{h:?}");
    }
}

#[test]
fn a_null_column_is_a_null_plain_header_but_no_attribute_and_no_trace() {
    // A NULL placed as a plain header is sent null (Debezium's router
    // does); CloudEvents treat a null attribute as unset and a trace
    // context as absent, so those headers are left out.
    let mut routing = routing(EventFormat::CloudeventsBinary);
    routing
        .additional_headers
        .insert("tenant".into(), "tenant".into());
    let mut m = RecordMapper::new(&columns(), &routing, "/s").unwrap();
    let r = m
        .map(&row(Some("e"), None, Some("{}"), None, None, None))
        .unwrap();
    let names: Vec<&str> = r.headers.iter().map(|(n, _)| &**n).collect();
    assert_eq!(
        names,
        [
            "id",
            "aggregateType",
            "eventType",
            "tenant",
            "content-type",
            "ce_specversion",
            "ce_id",
            "ce_source",
            "ce_type",
            "ce_time"
        ]
    );
    assert_eq!(r.header_value("tenant"), Some(None));
    let nulls = r.headers.iter().filter(|(_, v)| v.is_none()).count();
    assert_eq!(nulls, 1, "{:?}", r.headers);
}

fn cloud_event_error(e: MappingError) -> String {
    match e {
        MappingError::CloudEvent { reason } => reason,
        other => panic!("not a CloudEvent error: {other}"),
    }
}

#[test]
fn events_that_cannot_be_cloudevents_are_mapping_errors() {
    let mut m = mapper(EventFormat::CloudeventsBinary);
    let e = m
        .map(&row(None, Some("k"), Some("{}"), None, None, None))
        .unwrap_err();
    assert!(cloud_event_error(e).contains("outbox.columns.id"));
    for (ext, want) in [
        (r#"{"Region": "eu"}"#, "lower-case"),
        (r#"{"tenant_id": "x"}"#, "lower-case"),
        (r#"{"time": "x"}"#, "context attribute"),
        (r#"{"tenant": "x"}"#, "set it once"),
        (r#"{"n": 1.5}"#, "integer"),
        (r#"{"n": 4294967296}"#, "integer"),
        (r#"{"o": {"a": 1}}"#, "integer"),
        (r#"[1]"#, "JSON object"),
    ] {
        let e = m
            .map(&row(
                Some("e"),
                Some("k"),
                Some("{}"),
                Some("t"),
                None,
                Some(ext),
            ))
            .unwrap_err();
        let reason = cloud_event_error(e);
        assert!(reason.contains(want), "{ext}: {reason}");
        assert!(reason.contains("outbox.columns.ce_extensions"), "{reason}");
    }
}

#[test]
fn invalid_trace_context_is_a_mapping_error_and_empty_is_none() {
    let mut m = mapper(EventFormat::Plain);
    let bad = TP.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32));
    let e = m
        .map(&row(
            Some("e"),
            Some("k"),
            Some("{}"),
            None,
            Some(&bad),
            None,
        ))
        .unwrap_err();
    assert!(
        matches!(&e, MappingError::InvalidTraceContext { column, .. } if column == "trace"),
        "{e}"
    );
    assert!(e.to_string().contains("all zeros"), "{e}");
    for none in [None, Some(""), Some("  ")] {
        let r = m
            .map(&row(Some("e"), Some("k"), Some("{}"), None, none, None))
            .unwrap();
        assert!(r.header("traceparent").is_none());
    }
    let json = format!(r#"{{"traceparent":"{TP}","tracestate":"rojo=1"}}"#);
    let r = m
        .map(&row(
            Some("e"),
            Some("k"),
            Some("{}"),
            None,
            Some(&json),
            None,
        ))
        .unwrap();
    assert_eq!(r.header("traceparent").map(|b| &b[..]), Some(TP.as_bytes()));
    assert_eq!(r.header("tracestate").map(|b| &b[..]), Some(&b"rojo=1"[..]));
}

#[test]
fn a_message_carries_its_trace_context_as_a_field() {
    let mut m = mapper(EventFormat::CloudeventsBinary);
    let content = json!({
        "id": "m-1",
        "aggregate_type": "payment",
        "aggregate_id": "p-9",
        "event_type": "payment.refunded",
        "payload": {"n": 1},
        "trace": {"traceparent": TP, "tracestate": "congo=t61rcWkgMzE"},
        "ext": {"region": "us"},
    });
    let event = OutboxEvent {
        commit_lsn: Lsn(1),
        xid: 1,
        commit_time_us: COMMIT_US,
        kind: EventKind::Message {
            transactional: true,
            prefix: "outbox".into(),
            content: Bytes::from(content.to_string()),
        },
    };
    let r = m.map(&event).unwrap();
    let h = headers(&r);
    assert!(h.contains(&("traceparent", TP)), "{h:?}");
    assert!(h.contains(&("tracestate", "congo=t61rcWkgMzE")), "{h:?}");
    assert!(h.contains(&("ce_id", "m-1")), "{h:?}");
    assert!(h.contains(&("ce_region", "us")), "{h:?}");
    assert_eq!(r.value.as_deref(), Some(&br#"{"n":1}"#[..]));
}

#[test]
fn time_follows_each_commit_time() {
    let mut m = mapper(EventFormat::CloudeventsBinary);
    for (us, want) in [
        (COMMIT_US, "2026-11-30T02:04:20.875758Z"),
        (COMMIT_US, "2026-11-30T02:04:20.875758Z"),
        (COMMIT_US + 1, "2026-11-30T02:04:20.875759Z"),
        (COMMIT_US, "2026-11-30T02:04:20.875758Z"),
    ] {
        let mut event = good_row();
        event.commit_time_us = us;
        let r = m.map(&event).unwrap();
        assert_eq!(r.header("ce_time").map(|b| &b[..]), Some(want.as_bytes()));
    }
}
