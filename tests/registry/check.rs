//! Issue 37 §3-4: `outboxd check` against the real registry (the subject's
//! id, version and compatibility; `--sample N` lists exactly the newest
//! rows that cannot be encoded), and a wrong registry password: a
//! permanent error naming `schema_registry.password`, the password in no
//! output.

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};

use super::avro::{avro_env, avro_env_at, order, order_schema};
use super::json_schema;
use crate::harness::http::free_port;
use crate::harness::outboxd::bin;
use crate::harness::registry::shared as registry;
use crate::harness::registry_auth::AuthGate;
use crate::harness::relay::{edit_config, Env, Relay};

pub(super) fn check(e: &Env, args: &[&str], vars: &[(&str, &str)]) -> (Output, String) {
    let out = Command::new(bin())
        .arg("check")
        .arg("--config")
        .arg(&e.config)
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .expect("run outboxd check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

/// The check's line `name` (with the lines indented under it).
pub(super) fn line<'a>(text: &'a str, verdict: &str, name: &str) -> Vec<&'a str> {
    let mut found = Vec::new();
    let mut inside = false;
    for l in text.lines() {
        if l.starts_with(&format!("{verdict:<4}  {name} ")) {
            inside = true;
            found.push(l);
        } else if inside && l.starts_with(' ') {
            found.push(l);
        } else {
            inside = false;
        }
    }
    found
}

/// Row `i`'s payload: good, or (every ninth from 3 on) broken one of four
/// ways, each marked `writer` = 1.
fn row(i: usize) -> (Value, bool) {
    let mut p = order(0, i).0;
    if i % 9 != 3 {
        return (p, false);
    }
    p["writer"] = json!(1);
    match (i / 9) % 4 {
        0 => p["seq"] = json!("not a number"),
        1 => p["status"] = json!("LOST"),
        2 => p["unknown_field"] = json!(true),
        _ => {
            p.as_object_mut().unwrap().remove("customer");
        }
    }
    (p, true)
}

#[test]
fn check_names_a_json_schema_subject_and_sample_lists_the_row_it_rejects() {
    let reg = registry();
    let (e, topic) = json_schema::json_schema_env("regcheckjson", "");
    let subject = format!("{topic}-value");
    let id = reg.register_json_schema(&subject, &json_schema::order_schema());
    let mut bad = json_schema::order(0, 7);
    bad["lines"][2]["qty"] = json!(0);
    for p in [json_schema::order(0, 5), bad, json_schema::order(0, 8)] {
        json_schema::insert(&e, "k", &[p]);
    }
    let (_, text) = check(&e, &["--sample", "10"], &[]);
    let schema = line(&text, "ok", "schema").join("\n");
    assert!(
        schema.contains(&format!("subject `{subject}`"))
            && schema.contains(&format!("schema id {id}, version 1, parses (JSON schema)")),
        "{text}"
    );
    let sample = line(&text, "FAIL", "sample").join("\n");
    assert!(
        sample.contains("the newest 3 row(s)")
            && sample.contains("1 would fail")
            && sample.contains("at JSON pointer \"/lines/2/qty\""),
        "{text}"
    );
}

#[test]
fn check_names_the_schema_and_sample_lists_exactly_the_rows_that_cannot_be_encoded() {
    let reg = registry();
    let (e, topic) = avro_env("regcheck", reg, "");
    let subject = format!("{topic}-value");
    let id = reg.register_avro(&subject, &order_schema());
    reg.set_compatibility(Some(&subject), "BACKWARD");
    // 130 rows a second apart; the newest 100 are 30..130.
    let values: Vec<String> = (0..130)
        .map(|i| {
            format!(
                "('order', 'k', 'placed', '{}'::jsonb, \
                 '2026-01-01 00:00:00+00'::timestamptz + {i} * interval '1 second')",
                row(i).0.to_string().replace('\'', "''")
            )
        })
        .collect();
    e.pg.psql(
        "app",
        &format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
             VALUES {}",
            values.join(", ")
        ),
    );
    let bad_newest: BTreeSet<String> =
        e.pg.psql(
            "app",
            "SELECT id FROM outbox WHERE payload->>'writer' = '1' \
             AND created_at >= '2026-01-01 00:00:30+00'",
        )
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let bad_older = (0..30).filter(|&i| row(i).1).count();
    assert!(bad_newest.len() >= 10 && bad_older >= 3);

    let (out, text) = check(&e, &["--sample", "100"], &[]);
    let schema = line(&text, "ok", "schema").join("\n");
    assert!(
        schema.contains(&format!("subject `{subject}`"))
            && schema.contains(&format!("schema id {id}, version 1, parses (AVRO schema)"))
            && schema.contains("compatibility BACKWARD"),
        "{text}"
    );
    assert!(!line(&text, "ok", "registry").is_empty(), "{text}");
    let sample = line(&text, "FAIL", "sample");
    assert!(
        sample[0].contains("the newest 100 row(s)")
            && sample[0].contains(&format!("{} would fail", bad_newest.len())),
        "{text}"
    );
    let listed: BTreeSet<String> = sample[1..]
        .iter()
        .map(|l| {
            let l = l.trim();
            l.strip_prefix("id ")
                .and_then(|r| r.split_once(':'))
                .map(|(id, _)| id.to_owned())
                .unwrap_or_else(|| panic!("not a row line: {l}"))
        })
        .collect();
    assert_eq!(listed, bad_newest, "{text}");
    // Each with its reason.
    for needle in [
        "at $.seq the schema expects a long",
        "LOST",
        "unknown_field",
        "customer",
    ] {
        assert!(
            sample.iter().any(|l| l.contains(needle)),
            "{needle}: {text}"
        );
    }
    assert_eq!(out.status.code(), Some(1), "{text}");
    // Nothing was sent.
    assert_eq!(crate::harness::kafka::shared().record_count(&topic), 0);
}

#[test]
fn a_wrong_registry_password_stops_the_relay_naming_the_setting_and_is_never_shown() {
    let reg = registry();
    let gate = AuthGate::start(reg.url(), "relay", "the-right-one");
    let (e, topic) = avro_env_at(
        "regauth",
        gate.url(),
        "username = \"relay\"\npassword = \"${REGISTRY_PASSWORD}\"\n",
    );
    reg.register_avro(&format!("{topic}-value"), &order_schema());
    let wrong = "wr0ng-Secret-4711";

    let (out, text) = check(&e, &[], &[("REGISTRY_PASSWORD", wrong)]);
    let failed = line(&text, "FAIL", "registry").join("\n");
    assert!(
        failed.contains("schema_registry.password") && failed.contains("401"),
        "{text}"
    );
    assert!(!text.contains(wrong), "the password is shown:\n{text}");
    assert_eq!(out.status.code(), Some(1));

    let mut relay = Relay::start_with_env(&e, &[("REGISTRY_PASSWORD", wrong)]);
    let status = relay
        .wait(Duration::from_secs(60))
        .expect("the relay stops: a wrong password is permanent");
    assert!(!status.success());
    let log = relay.log();
    assert!(log.contains("schema_registry.password"), "{log}");
    assert!(!log.contains(wrong), "the password is in the log:\n{log}");
    assert!(gate.refused() >= 2);

    // The right one passes the same gate.
    let (_, text) = check(&e, &[], &[("REGISTRY_PASSWORD", "the-right-one")]);
    assert!(
        line(&text, "ok", "registry")
            .join("\n")
            .contains("credentials of \"relay\" accepted"),
        "{text}"
    );
    assert!(!line(&text, "ok", "schema").is_empty(), "{text}");
    assert!(!text.contains("the-right-one"), "{text}");

    // A subject that does not exist: the check names it, with the curl
    // that registers a schema.
    edit_config(
        &e,
        "value_format = \"avro\"",
        "value_format = \"avro\"\nsubject = \"no-such-subject\"",
    );
    let (_, text) = check(&e, &[], &[("REGISTRY_PASSWORD", "the-right-one")]);
    let missing = line(&text, "FAIL", "schema").join("\n");
    assert!(
        missing.contains("subject `no-such-subject` does not exist")
            && missing.contains("curl -X POST"),
        "{text}"
    );

    // No registry at the URL: the check says it cannot be reached.
    edit_config(&e, gate.url(), &format!("http://127.0.0.1:{}", free_port()));
    let (_, text) = check(&e, &[], &[("REGISTRY_PASSWORD", "the-right-one")]);
    assert!(
        line(&text, "FAIL", "registry")
            .join("\n")
            .contains("cannot be reached"),
        "{text}"
    );
    assert!(line(&text, "skip", "schema").len() == 1, "{text}");
}
