//! The client against a scripted registry on loopback: which answer becomes
//! which error, URLs tried in turn, and what the cache saves.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// A registry that answers every request with `status` and `body`, and
/// keeps the requests' heads.
struct Scripted {
    url: String,
    requests: Arc<std::sync::Mutex<Vec<String>>>,
    count: Arc<AtomicUsize>,
}

async fn scripted(status: u16, body: &'static str) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/apis/ccompat/v7", listener.local_addr().unwrap());
    let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let (seen, n) = (requests.clone(), count.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 4096];
            let len = s.read(&mut buf).await.unwrap_or(0);
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..len]).into_owned());
            n.fetch_add(1, Ordering::SeqCst);
            let answer = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(answer.as_bytes()).await;
        }
    });
    Scripted {
        url,
        requests,
        count,
    }
}

fn config(url: &str) -> SchemaRegistryConfig {
    SchemaRegistryConfig {
        url: url.to_owned(),
        username: Some("relay".into()),
        password: Some("pw-secret".into()),
        request_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

const FOUND: &str = r#"{"subject":"orders-value","version":2,"id":41,"schema":"{\"type\":\"record\",\"name\":\"O\",\"fields\":[{\"name\":\"n\",\"type\":\"long\"}]}"}"#;

#[tokio::test]
async fn fetches_parses_and_caches_pinned_versions() {
    let r = scripted(200, FOUND).await;
    let mut reg = SchemaRegistry::new(&config(&r.url)).unwrap();
    let s = reg
        .resolve("orders-value", SchemaVersion::Number(2))
        .await
        .unwrap();
    assert_eq!(
        (s.id, s.version, s.subject.as_str()),
        (41, 2, "orders-value")
    );
    assert_eq!(
        s.encode_framed(br#"{"n": 1}"#).unwrap(),
        vec![0, 0, 0, 0, 41, 2]
    );
    // Pinned and cached: no second request.
    reg.resolve("orders-value", SchemaVersion::Number(2))
        .await
        .unwrap();
    assert_eq!(r.count.load(Ordering::SeqCst), 1);
    assert_eq!(reg.cached(), 1);
    let head = r.requests.lock().unwrap()[0].clone();
    assert!(
        head.starts_with("GET /apis/ccompat/v7/subjects/orders-value/versions/2 HTTP/1.1"),
        "{head}"
    );
    // Basic auth: base64("relay:pw-secret").
    assert!(
        head.contains("authorization: Basic cmVsYXk6cHctc2VjcmV0"),
        "{head}"
    );
}

#[tokio::test]
async fn answers_become_errors_that_name_the_setting() {
    let r = scripted(401, r#"{"error_code":40101,"message":"no"}"#).await;
    let e = SchemaRegistry::new(&config(&r.url))
        .unwrap()
        .resolve("orders-value", SchemaVersion::Latest)
        .await
        .unwrap_err();
    assert!(!e.is_retryable());
    let text = e.to_string();
    assert!(text.contains("schema_registry.password"), "{text}");
    assert!(!text.contains("pw-secret"), "{text}");

    let r = scripted(404, r#"{"error_code":40401,"message":"Subject not found"}"#).await;
    let e = SchemaRegistry::new(&config(&r.url))
        .unwrap()
        .resolve("orders-value", SchemaVersion::Latest)
        .await
        .unwrap_err();
    assert!(matches!(e, RegistryError::SubjectNotFound { .. }), "{e}");
    assert!(
        e.to_string().contains("/subjects/orders-value/versions"),
        "{e}"
    );

    let r = scripted(404, r#"{"error_code":40402,"message":"Version not found"}"#).await;
    let e = SchemaRegistry::new(&config(&r.url))
        .unwrap()
        .resolve("orders-value", SchemaVersion::Number(9))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has no version 9"), "{e}");

    let r = scripted(
        200,
        r#"{"subject":"s","version":1,"id":3,"schema":"syntax = \"proto3\";","schemaType":"PROTOBUF"}"#,
    )
    .await;
    let e = SchemaRegistry::new(&config(&r.url))
        .unwrap()
        .resolve("s", SchemaVersion::Latest)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is a PROTOBUF schema"), "{e}");
}

#[tokio::test]
async fn tries_each_url_in_turn_and_retries_only_outages() {
    let down = scripted(503, "overloaded").await;
    let up = scripted(200, FOUND).await;
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let mut reg =
        SchemaRegistry::new(&config(&format!("{refused}, {}, {}", down.url, up.url))).unwrap();
    let s = reg
        .resolve("orders-value", SchemaVersion::Latest)
        .await
        .unwrap();
    assert_eq!(s.id, 41);
    assert_eq!(down.count.load(Ordering::SeqCst), 1);

    let e = SchemaRegistry::new(&config(&format!("{refused}, {}", down.url)))
        .unwrap()
        .resolve("orders-value", SchemaVersion::Latest)
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("503"), "{e}");
}

#[tokio::test]
async fn compatibility_reads_the_subjects_level_and_tells_an_unset_one() {
    let r = scripted(200, r#"{"compatibilityLevel":"BACKWARD"}"#).await;
    let mut reg = SchemaRegistry::new(&config(&r.url)).unwrap();
    assert_eq!(
        reg.compatibility(Some("orders/value")).await.unwrap(),
        Some("BACKWARD".to_owned())
    );
    let head = r.requests.lock().unwrap()[0].clone();
    assert!(
        head.starts_with("GET /apis/ccompat/v7/config/orders%2Fvalue HTTP/1.1"),
        "{head}"
    );

    // Confluent's 40408: the subject has no level of its own.
    let r = scripted(404, r#"{"error_code":40408,"message":"not configured"}"#).await;
    let mut reg = SchemaRegistry::new(&config(&r.url)).unwrap();
    assert_eq!(reg.compatibility(Some("s")).await.unwrap(), None);
    // The global level must answer.
    assert!(reg.compatibility(None).await.is_err());

    let r = scripted(403, "{}").await;
    let e = SchemaRegistry::new(&config(&r.url))
        .unwrap()
        .compatibility(None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("schema_registry.password"), "{e}");
}

#[tokio::test]
async fn the_cache_gauge_and_latest_always_asks() {
    let r = scripted(200, FOUND).await;
    let mut reg = SchemaRegistry::new(&config(&r.url)).unwrap();
    for _ in 0..3 {
        reg.resolve("orders-value", SchemaVersion::Latest)
            .await
            .unwrap();
    }
    // `latest` may have moved: asked each time, cached once by id.
    assert_eq!(r.count.load(Ordering::SeqCst), 3);
    assert_eq!(reg.cached(), 1);
}

#[tokio::test]
async fn a_schema_id_found_once_costs_no_more_requests() {
    let r = scripted(200, r#"{"schema":"{}","schemaType":"JSON"}"#).await;
    let mut reg = SchemaRegistry::new(&config(&r.url)).unwrap();
    let found = crate::outbox::registered::FramedSchema {
        content_type: "application/schema+json",
        dataschema: format!("{}/schemas/ids/7", r.url).into(),
    };
    assert_eq!(reg.has_schema_id(7).await.unwrap(), Ok(found.clone()));
    assert_eq!(reg.has_schema_id(7).await.unwrap(), Ok(found));
    assert_eq!(r.count.load(Ordering::SeqCst), 1);
    assert!(r.requests.lock().unwrap()[0].starts_with("GET /apis/ccompat/v7/schemas/ids/7 "));

    let r = scripted(404, r#"{"error_code":40403,"message":"Schema not found"}"#).await;
    let mut reg = SchemaRegistry::new(&config(&r.url)).unwrap();
    assert_eq!(reg.has_schema_id(8).await.unwrap(), Err(r.url.clone()));
    let r = scripted(401, "{}").await;
    let e = SchemaRegistry::new(&config(&r.url))
        .unwrap()
        .has_schema_id(8)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("schema_registry.password"), "{e}");
}

/// The client certificate's files: each error names its key and the path,
/// never what the key file holds.
#[test]
fn client_certificate_files_are_checked_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let cert = dir.path().join("client.pem");
    std::fs::write(
        &ca,
        include_str!("../source/replication/channel_binding_test_cert.pem"),
    )
    .unwrap();
    std::fs::write(
        &cert,
        include_str!("../source/replication/channel_binding_test_ed25519.pem"),
    )
    .unwrap();
    let with = |cert_file: &std::path::Path, key_file: &std::path::Path| {
        let c = SchemaRegistryConfig {
            url: "https://127.0.0.1:1".into(),
            ca_file: Some(ca.clone()),
            cert_file: Some(cert_file.to_owned()),
            key_file: Some(key_file.to_owned()),
            ..Default::default()
        };
        match SchemaRegistry::new(&c) {
            Err(RegistryError::Config { key, reason }) => (key, reason),
            Err(e) => panic!("not a config error: {e}"),
            Ok(_) => panic!("accepted {cert_file:?} / {key_file:?}"),
        }
    };
    let missing = dir.path().join("nowhere.key");
    let (key, reason) = with(&cert, &missing);
    assert_eq!(key, "schema_registry.key_file");
    assert!(reason.contains("nowhere.key"), "{reason}");
    let (key, _) = with(&missing, &cert);
    assert_eq!(key, "schema_registry.cert_file");

    // A key that does not parse: its contents are not repeated.
    let garbage = dir.path().join("garbage.key");
    let secret = "U2VjcmV0S2V5TWF0ZXJpYWxOb3RUb0JlU2hvd24K";
    std::fs::write(
        &garbage,
        format!("-----BEGIN PRIVATE KEY-----\n{secret}\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let (key, reason) = with(&cert, &garbage);
    assert_eq!(key, "schema_registry.key_file");
    assert!(!reason.contains(secret), "{reason}");

    // A well-formed key of another certificate.
    let other =
        ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
    let other_key = dir.path().join("other.key");
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, other.as_ref());
    std::fs::write(
        &other_key,
        format!("-----BEGIN PRIVATE KEY-----\n{b64}\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let (key, reason) = with(&cert, &other_key);
    assert_eq!(key, "schema_registry.key_file");
    assert!(
        reason.contains("does not fit schema_registry.cert_file"),
        "{reason}"
    );
    assert!(!reason.contains(&b64), "{reason}");
}

/// `routing.auto_register`: the file goes as the `schema` of a POST to the
/// subject's versions; a refusal names `routing.schema_file`.
#[tokio::test]
async fn registers_the_schema_file_and_names_it_when_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("o.avsc");
    std::fs::write(
        &file,
        r#"{"type":"record","name":"O","fields":[{"name":"n","type":"long"}]}"#,
    )
    .unwrap();
    let routing = crate::config::RoutingConfig {
        topic: "orders".into(),
        value_format: crate::config::value_format::ValueEncoding::Avro,
        auto_register: true,
        schema_file: Some(file.clone()),
        ..Default::default()
    };
    let files = read_schema_files(&routing).unwrap();
    assert_eq!(files.len(), 1);
    let schema = &files[0];
    assert_eq!(schema.subject, "orders-value");

    let r = scripted(200, r#"{"id":17}"#).await;
    let mut reg = SchemaRegistry::new(&config(&r.url)).unwrap();
    assert_eq!(reg.register("orders value", schema).await.unwrap(), 17);
    let request = r.requests.lock().unwrap()[0].clone();
    assert!(
        request.starts_with("POST /apis/ccompat/v7/subjects/orders%20value/versions HTTP/1.1"),
        "{request}"
    );
    assert!(
        request.contains("application/vnd.schemaregistry.v1+json")
            && request.contains(r#"{"schema":"{\"type\":\"record\""#),
        "{request}"
    );

    let r = scripted(409, r#"{"error_code":409,"message":"incompatible"}"#).await;
    let mut reg = SchemaRegistry::new(&config(&r.url)).unwrap();
    let e = reg.register("orders-value", schema).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("routing.schema_file")
            && text.contains("o.avsc")
            && text.contains("incompatible")
            && !e.is_retryable(),
        "{text}"
    );

    // Unreadable, and not a schema: named with the key and the path.
    for (contents, hint) in [
        (None, "cannot be read"),
        (Some("{\"type\": 3}"), "not an Avro schema"),
    ] {
        let path = dir.path().join("bad.avsc");
        let _ = std::fs::remove_file(&path);
        if let Some(c) = contents {
            std::fs::write(&path, c).unwrap();
        }
        let routing = crate::config::RoutingConfig {
            schema_file: Some(path),
            ..routing.clone()
        };
        match read_schema_files(&routing) {
            Err(RegistryError::Config { key, reason }) => {
                assert_eq!(key, "routing.schema_file");
                assert!(
                    reason.contains("bad.avsc") && reason.contains(hint),
                    "{reason}"
                );
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("{hint}: accepted"),
        }
    }
}

/// Each route registers under its own subject: a rule's own
/// `schema_file` for its subject, `routing.schema_file` for the others.
#[test]
fn auto_register_registers_each_rules_own_file_under_its_subject() {
    use crate::config::routing::RoutingRule;
    use crate::config::value_format::ValueEncoding;
    let dir = tempfile::tempdir().unwrap();
    let order = dir.path().join("order.avsc");
    std::fs::write(&order, r#"{"type":"record","name":"O","fields":[]}"#).unwrap();
    let payment = dir.path().join("payment.json");
    std::fs::write(&payment, r#"{"type":"object"}"#).unwrap();
    let routing = crate::config::RoutingConfig {
        topic: "orders".into(),
        value_format: ValueEncoding::Avro,
        auto_register: true,
        schema_file: Some(order.clone()),
        rules: vec![
            RoutingRule {
                event_type: Some("paid".into()),
                topic: "payments".into(),
                value_format: Some(ValueEncoding::JsonSchema),
                schema_file: Some(payment.clone()),
                ..Default::default()
            },
            RoutingRule {
                event_type: Some("refunded".into()),
                topic: "payments".into(),
                value_format: Some(ValueEncoding::JsonSchema),
                schema_file: Some(payment.clone()),
                ..Default::default()
            },
            RoutingRule {
                event_type: Some("shipped".into()),
                topic: "shipments".into(),
                ..Default::default()
            },
            RoutingRule {
                event_type: Some("legacy".into()),
                topic: "legacy".into(),
                value_format: Some(ValueEncoding::Framed),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let files: Vec<_> = read_schema_files(&routing)
        .unwrap()
        .into_iter()
        .map(|f| (f.subject, f.key, f.path, f.schema_type))
        .collect();
    let shown = |p: &std::path::Path| p.display().to_string();
    assert_eq!(
        files,
        vec![
            (
                "orders-value".to_owned(),
                "routing.schema_file".to_owned(),
                shown(&order),
                None
            ),
            (
                "payments-value".to_owned(),
                "routing.rules[0].schema_file".to_owned(),
                shown(&payment),
                Some("JSON")
            ),
            (
                "shipments-value".to_owned(),
                "routing.schema_file".to_owned(),
                shown(&order),
                None
            ),
        ]
    );

    // A rule's file that does not parse is named by the rule's key.
    std::fs::write(&payment, "not json").unwrap();
    match read_schema_files(&routing) {
        Err(RegistryError::Config { key, reason }) => {
            assert_eq!(key, "routing.rules[0].schema_file");
            assert!(
                reason.contains("payment.json") && reason.contains("is not JSON"),
                "{reason}"
            );
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    }

    let off = crate::config::RoutingConfig {
        auto_register: false,
        ..routing
    };
    assert!(read_schema_files(&off).unwrap().is_empty());
}
