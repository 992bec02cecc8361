//! The relay's mapper against a scripted registry: a payload that does not
//! fit makes it read the subject's latest version once and use it from then
//! on; an unreachable registry leaves the event unmapped (for the caller to
//! retry) and `/readyz` naming the registry.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::*;
use crate::config::Config;
use crate::outbox::registered::SchemaSet;
use crate::outbox::EventKind;
use crate::registry::SchemaRegistry;
use crate::Lsn;

/// The registry's one answer, to whatever is asked: (status, body).
type Answer = Arc<Mutex<(u16, String)>>;

async fn registry(answer: Answer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let (status, body) = answer.lock().unwrap().clone();
            let text = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(text.as_bytes()).await;
        }
    });
    url
}

/// Version `version` (id `id`) of `orders-value`: `n` a long, and from
/// version 2 on an optional string `c`.
fn version(id: u32, version: u32) -> (u16, String) {
    let mut fields = vec![serde_json::json!({"name": "n", "type": "long"})];
    if version >= 2 {
        fields.push(serde_json::json!({"name": "c", "type": ["null", "string"], "default": null}));
    }
    let schema = serde_json::json!({"type": "record", "name": "O", "fields": fields});
    let body = serde_json::json!({
        "subject": "orders-value", "version": version, "id": id, "schema": schema.to_string()
    });
    (200, body.to_string())
}

fn event(payload: &str) -> OutboxEvent {
    let content = format!(
        r#"{{"id": "e1", "aggregate_id": "k", "aggregate_type": "order", "event_type": "placed", "payload": {payload}}}"#
    );
    OutboxEvent {
        commit_lsn: Lsn(1),
        xid: 1,
        commit_time_us: 0,
        kind: EventKind::Message {
            transactional: true,
            prefix: "outbox".into(),
            content: Bytes::from(content),
        },
    }
}

fn schema_id(record: &KafkaRecord) -> u32 {
    let v = record.value.as_ref().unwrap();
    u32::from_be_bytes(v[1..5].try_into().unwrap())
}

#[tokio::test]
async fn a_misfit_reads_latest_once_and_an_outage_leaves_the_event_unmapped() {
    let answer: Answer = Arc::new(Mutex::new(version(1, 1)));
    let url = registry(answer.clone()).await;
    let config = Config::from_toml_str(&format!(
        "[postgres]\nurl = \"postgresql://u@127.0.0.1/app\"\n\
         [routing]\ntopic = \"orders\"\nvalue_format = \"avro\"\n\
         [schema_registry]\nurl = \"{url}\"\nrequest_timeout = \"1s\"\n"
    ))
    .unwrap();
    let tables = config.tables();
    let mut registry = SchemaRegistry::new(&config.schema_registry).unwrap();
    let schemas = registry.schemas_for(&tables).await.unwrap();
    let health = Arc::new(Health::new(&config));
    let (_found, updates) = watch::channel(Vec::new());
    let mut mapper = RelayMapper::new(
        TableMappers::with_schemas(&tables, &schemas).unwrap(),
        Some(LiveSchemas {
            registry: Arc::new(tokio::sync::Mutex::new(registry)),
            latest: Arc::new(Mutex::new(BTreeSet::from(["orders-value".to_owned()]))),
            updates,
            health: health.clone(),
        }),
    );

    let fits_v1 = mapper.map(&event(r#"{"n": 1}"#)).await.unwrap().unwrap();
    assert_eq!(schema_id(&fits_v1), 1);

    // Version 2 registered: a payload with its field makes the relay ask,
    // and version 2 encodes from then on, old-shaped payloads too.
    *answer.lock().unwrap() = version(7, 2);
    let needs_v2 = mapper.map(&event(r#"{"n": 2, "c": "x"}"#)).await;
    assert_eq!(schema_id(&needs_v2.unwrap().unwrap()), 7);
    let old_shape = mapper.map(&event(r#"{"n": 3}"#)).await.unwrap().unwrap();
    assert_eq!(schema_id(&old_shape), 7);

    // A payload no version fits: asked once more, then given up on.
    let misfit = mapper.map(&event(r#"{"n": "four"}"#)).await.unwrap();
    assert!(
        matches!(
            misfit,
            Err(MappingError::SchemaMismatch { schema_id: 7, .. })
        ),
        "{misfit:?}"
    );

    // The registry down: what fits is mapped without it; what needs it
    // waits, and /readyz names the registry until it answers again.
    *answer.lock().unwrap() = (503, "down".into());
    let fits = mapper.map(&event(r#"{"n": 5}"#)).await.unwrap().unwrap();
    assert_eq!(schema_id(&fits), 7);
    let waiting = mapper.map(&event(r#"{"n": 6, "d": 1}"#)).await.unwrap_err();
    assert!(waiting.is_retryable(), "{waiting}");
    health.postgres_up();
    health.kafka_up();
    let reason = health.readiness().unwrap_err();
    assert!(
        reason.starts_with("schema registry unavailable"),
        "{reason}"
    );
    *answer.lock().unwrap() = version(7, 2);
    assert!(mapper
        .map(&event(r#"{"n": 6, "d": 1}"#))
        .await
        .unwrap()
        .is_err());
    health.readiness().unwrap();
}

/// Version 1 (id `id`) of `subject`: `n` a long.
fn subject_version(subject: &str, id: u32) -> (u16, String) {
    let schema = serde_json::json!({"type": "record", "name": "O", "fields": [
        {"name": "n", "type": "long"}
    ]});
    let body = serde_json::json!({
        "subject": subject, "version": 1, "id": id, "schema": schema.to_string()
    });
    (200, body.to_string())
}

#[tokio::test]
async fn a_per_event_subject_is_asked_once_and_an_outage_leaves_the_event_unmapped() {
    let answer: Answer = Arc::new(Mutex::new((503, "down".into())));
    let url = registry(answer.clone()).await;
    let config = Config::from_toml_str(&format!(
        "[postgres]\nurl = \"postgresql://u@127.0.0.1/app\"\n\
         [routing]\ntopic = \"orders\"\nvalue_format = \"avro\"\n\
         subject = \"com.acme.${{event_type}}\"\n\
         [schema_registry]\nurl = \"{url}\"\nrequest_timeout = \"1s\"\n"
    ))
    .unwrap();
    let tables = config.tables();
    let registry = SchemaRegistry::new(&config.schema_registry).unwrap();
    let health = Arc::new(Health::new(&config));
    health.postgres_up();
    health.kafka_up();
    let (_found, updates) = watch::channel(Vec::new());
    let latest: LatestSubjects = Arc::new(Mutex::new(BTreeSet::new()));
    let mut mapper = RelayMapper::new(
        TableMappers::with_schemas(&tables, &SchemaSet::new()).unwrap(),
        Some(LiveSchemas {
            registry: Arc::new(tokio::sync::Mutex::new(registry)),
            latest: latest.clone(),
            updates,
            health: health.clone(),
        }),
    );

    // The subject is met first while the registry is down: not mapped, not
    // given up on, and /readyz names the registry.
    let waiting = mapper.map(&event(r#"{"n": 1}"#)).await.unwrap_err();
    assert!(waiting.is_retryable(), "{waiting}");
    let reason = health.readiness().unwrap_err();
    assert!(
        reason.starts_with("schema registry unavailable"),
        "{reason}"
    );

    // Back: fetched once, then the event's subject is a lookup (a registry
    // down again does not matter), and it follows `latest` from then on.
    *answer.lock().unwrap() = subject_version("com.acme.placed", 4);
    let first = mapper.map(&event(r#"{"n": 1}"#)).await.unwrap().unwrap();
    assert_eq!(schema_id(&first), 4);
    health.readiness().unwrap();
    assert!(latest.lock().unwrap().contains("com.acme.placed"));
    *answer.lock().unwrap() = (503, "down".into());
    let second = mapper.map(&event(r#"{"n": 2}"#)).await.unwrap().unwrap();
    assert_eq!(schema_id(&second), 4);

    // A subject the registry does not have is the event's fault: it
    // follows `relay.on_error`.
    *answer.lock().unwrap() = (404, r#"{"error_code":40401,"message":"no"}"#.into());
    let content = r#"{"id": "e2", "aggregate_id": "k", "aggregate_type": "order", "event_type": "shipped", "payload": {"n": 3}}"#;
    let shipped = OutboxEvent {
        kind: EventKind::Message {
            transactional: true,
            prefix: "outbox".into(),
            content: Bytes::from(content),
        },
        ..event("{}")
    };
    let missing = mapper.map(&shipped).await.unwrap();
    assert!(
        matches!(&missing, Err(MappingError::SchemaUnavailable { reason, .. }) if reason.contains("com.acme.shipped")),
        "{missing:?}"
    );
}
