//! `routing.auto_register` / `routing.schema_file`: each error names its key.

use crate::config::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str_with_env(text, |_| None)
}

fn routing(keys: &str) -> String {
    format!(
        "[postgres]\nurl = \"postgresql://u@127.0.0.1/app\"\n[routing]\n{keys}\n\
         [schema_registry]\nurl = \"http://127.0.0.1:8081\"\n"
    )
}

#[track_caller]
fn invalid(keys: &str, key: &str, hint: &str) {
    match parse(&routing(keys)) {
        Err(ConfigError::Invalid { key: k, reason }) => {
            assert_eq!(k, key, "reason: {reason}");
            assert!(reason.contains(hint), "{key}: `{reason}` lacks `{hint}`");
        }
        other => panic!("expected Invalid for {key}, got {other:?}"),
    }
}

const AVRO: &str = "topic = \"orders\"\nvalue_format = \"avro\"\n";

#[test]
fn auto_register_is_off_by_default_and_takes_a_schema_file() {
    let c = parse(&routing(AVRO)).unwrap();
    assert!(!c.routing.auto_register);
    assert_eq!(c.routing.schema_file, None);
    let c = parse(&routing(&format!(
        "{AVRO}auto_register = true\nschema_file = \"schemas/order.avsc\""
    )))
    .unwrap();
    assert!(c.routing.auto_register);
    assert_eq!(
        c.routing.schema_file.as_deref(),
        Some(std::path::Path::new("schemas/order.avsc"))
    );
}

#[test]
fn auto_register_errors_name_the_key() {
    invalid(
        &format!("{AVRO}auto_register = true"),
        "routing.schema_file",
        "must name the local schema file",
    );
    invalid(
        &format!("{AVRO}schema_file = \"o.avsc\""),
        "routing.schema_file",
        "only with routing.auto_register = true",
    );
    invalid(
        "topic = \"orders\"\nauto_register = true\nschema_file = \"o.avsc\"",
        "routing.auto_register",
        "registry value format",
    );
    // A subject that varies per event cannot be registered at start.
    invalid(
        &format!("{AVRO}subject = \"com.acme.${{event_type}}\"\nauto_register = true\nschema_file = \"o.avsc\""),
        "routing.subject",
        "varies per event",
    );
}

/// The subject check on its own (the value-format checks before it refuse
/// per-event subjects too, for now).
#[test]
fn only_subjects_known_at_start_can_be_registered() {
    let columns = crate::config::outbox::ColumnsConfig::default();
    let with = |topic: &str, subject: &str| crate::config::routing::RoutingConfig {
        topic: topic.to_owned(),
        subject: subject.to_owned(),
        value_format: crate::config::value_format::ValueEncoding::Avro,
        auto_register: true,
        schema_file: Some("o.avsc".into()),
        ..Default::default()
    };
    let check = |topic: &str, subject: &str| {
        crate::config::auto_register::validate(&with(topic, subject), &columns)
    };
    assert!(check("orders", "${topic}-value").is_ok());
    assert!(check("orders", "com.acme.Order").is_ok());
    assert!(check("orders.${event_type}", "fixed").is_ok());
    for (topic, subject) in [
        ("orders.${event_type}", "${topic}-value"),
        ("orders", "com.acme.${event_type}"),
        ("orders", "${column:tenant}-value"),
    ] {
        match check(topic, subject) {
            Err(ConfigError::Invalid { key, reason }) => {
                assert_eq!(key, "routing.subject");
                assert!(reason.contains("routing.auto_register"), "{reason}");
            }
            other => panic!("{topic} / {subject}: {other:?}"),
        }
    }
}

/// A `[[routing.rules]]` entry with a schema file of its own: its errors
/// name the rule's key.
#[test]
fn a_rules_own_schema_file_is_checked_under_its_key() {
    const RULE: &str = "[[routing.rules]]\nevent_type = \"paid\"\ntopic = \"payments\"\n";
    let c = parse(&routing(&format!(
        "{AVRO}auto_register = true\nschema_file = \"o.avsc\"\n{RULE}schema_file = \"p.avsc\""
    )))
    .unwrap();
    assert_eq!(
        c.routing.rules[0].schema_file.as_deref(),
        Some(std::path::Path::new("p.avsc"))
    );
    // A rule's file alone is enough when the default route needs none.
    parse(&routing(&format!(
        "topic = \"orders\"\nauto_register = true\n{RULE}value_format = \"avro\"\n\
         schema_file = \"p.avsc\""
    )))
    .unwrap();

    invalid(
        &format!("{AVRO}{RULE}schema_file = \"p.avsc\""),
        "routing.rules[0].schema_file",
        "only with routing.auto_register = true",
    );
    invalid(
        &format!(
            "{AVRO}auto_register = true\nschema_file = \"o.avsc\"\n{RULE}\
             value_format = \"framed\"\nschema_file = \"p.avsc\""
        ),
        "routing.rules[0].schema_file",
        "this rule's value format is \"framed\"",
    );
    // A registry rule with no file, and none to fall back on.
    invalid(
        &format!("topic = \"orders\"\nauto_register = true\n{RULE}value_format = \"avro\""),
        "routing.schema_file",
        "must name the local schema file",
    );
    invalid(
        &format!("{AVRO}auto_register = true\n{RULE}schema_file = \"p.avsc\""),
        "routing.schema_file",
        "must name the local schema file",
    );
    // Two files for one subject.
    invalid(
        &format!(
            "{AVRO}subject = \"com.acme.Event\"\nauto_register = true\n\
             schema_file = \"o.avsc\"\n{RULE}schema_file = \"p.avsc\""
        ),
        "routing.rules[0].schema_file",
        "registers under subject `com.acme.Event`, as routing.schema_file does",
    );
    invalid(
        &format!(
            "{AVRO}auto_register = true\nschema_file = \"o.avsc\"\n{RULE}schema_file = \"p.avsc\"\n\
             [[routing.rules]]\nevent_type = \"refunded\"\ntopic = \"payments\"\n"
        ),
        "routing.schema_file",
        "as routing.rules[0].schema_file does",
    );
}
