//! Issue 37 §1: mutual TLS to the registry (`schema_registry.cert_file` and
//! `key_file`), through a gate that requires a client certificate
//! (`harness::registry_tls`, in front of the shared Apicurio). With the
//! right certificate `check` passes and the relay relays; without one,
//! with one from another CA, or with a CA file that does not hold the
//! registry's CA, `check` and `run` stop naming the setting to fix.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use super::avro::{avro_env_at, insert, order, order_schema};
use super::check::{check, line};
use crate::harness::kafka::shared as broker;
use crate::harness::python::read_avro;
use crate::harness::registry::shared as registry;
use crate::harness::registry_tls::{TlsFiles, TlsGate};
use crate::harness::relay::{edit_config, Env, Relay};

fn tls_keys(files: &TlsFiles, ca: &str, client: Option<&str>) -> String {
    let mut keys = format!(
        "ca_file = \"{}\"\n",
        files.path(&format!("{ca}.pem")).display()
    );
    if let Some(c) = client {
        keys += &format!(
            "cert_file = \"{}\"\nkey_file = \"{}\"\n",
            files.path(&format!("{c}.pem")).display(),
            files.path(&format!("{c}.key")).display()
        );
    }
    keys
}

/// `check` fails on the registry line and `run` stops, both naming `key`
/// (and `also`, when given); the key file's contents appear nowhere.
#[track_caller]
fn refused(e: &Env, files: &TlsFiles, key: &str, also: Option<&str>) {
    let (out, text) = check(e, &[], &[]);
    let failed = line(&text, "FAIL", "registry").join("\n");
    assert!(failed.contains(key), "{key}: {text}");
    if let Some(a) = also {
        assert!(failed.contains(a), "{a}: {text}");
    }
    assert_eq!(out.status.code(), Some(1), "{text}");
    let mut relay = Relay::start(e);
    let status = relay
        .wait(Duration::from_secs(60))
        .expect("the relay stops: a refused certificate is permanent");
    assert!(!status.success());
    let log = relay.log();
    assert!(log.contains(key), "{key}: {log}");
    for name in ["client", "stranger"] {
        let pem = std::fs::read_to_string(files.path(&format!("{name}.key"))).unwrap();
        let body = pem.lines().nth(1).unwrap();
        assert!(!text.contains(body) && !log.contains(body));
    }
}

#[test]
fn mutual_tls_relays_with_the_right_client_certificate_and_names_the_setting_without_it() {
    let reg = registry();
    let files = TlsFiles::make();
    let gate = TlsGate::start(reg.url(), &files);
    let (e, topic) = avro_env_at(
        "regtls",
        gate.url(),
        &tls_keys(&files, "ca", Some("client")),
    );
    let id = reg.register_avro(&format!("{topic}-value"), &order_schema());

    let (out, text) = check(&e, &[], &[]);
    assert!(!line(&text, "ok", "registry").is_empty(), "{text}");
    assert!(
        line(&text, "ok", "schema")
            .join("\n")
            .contains(&format!("schema id {id}")),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(0), "{text}");

    // 3 keys × 100 rows through mutual TLS, decoded by confluent-kafka
    // (which reads the schemas from the registry directly).
    let relay = Relay::start(&e);
    let (writers, per) = (3, 100);
    for w in 0..writers {
        let payloads: Vec<Value> = (0..per).map(|i| order(w, i).0).collect();
        insert(&e, &format!("writer-{w}"), &payloads);
    }
    let got = broker().consume_all(&topic, writers * per, Duration::from_secs(90));
    assert_eq!(got.len(), writers * per, "{}", relay.log());
    let decoded = read_avro(reg.url(), &topic, &got);
    let mut seen: HashMap<(u64, u64), Value> = HashMap::new();
    for d in &decoded {
        assert!(d["error"].is_null(), "{d}");
        assert_eq!(d["schema_id"].as_u64(), Some(u64::from(id)));
        let v = &d["value"];
        let k = (v["writer"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
        assert!(seen.insert(k, v.clone()).is_none(), "{k:?} twice");
    }
    for w in 0..writers {
        for i in 0..per {
            assert_eq!(seen[&(w as u64, i as u64)], order(w, i).1, "row {w}/{i}");
        }
    }
    assert_eq!(gate.refused(), 0);
    drop(relay);

    // No client certificate.
    let with_client = tls_keys(&files, "ca", Some("client"));
    edit_config(&e, &with_client, &tls_keys(&files, "ca", None));
    refused(
        &e,
        &files,
        "schema_registry.cert_file",
        Some("schema_registry.key_file"),
    );
    // A client certificate from another CA.
    edit_config(
        &e,
        &tls_keys(&files, "ca", None),
        &tls_keys(&files, "ca", Some("stranger")),
    );
    refused(
        &e,
        &files,
        "schema_registry.cert_file",
        Some("schema_registry.key_file"),
    );
    // The right client certificate, but a CA file without the registry's CA.
    edit_config(
        &e,
        &tls_keys(&files, "ca", Some("stranger")),
        &tls_keys(&files, "other-ca", Some("client")),
    );
    refused(&e, &files, "schema_registry.ca_file", None);
    assert!(gate.refused() >= 4, "refused {}", gate.refused());
}
