//! `routing.value_format`, `routing.subject`, `routing.schema_version` and
//! `[schema_registry]`: each error names its key.

use crate::config::value_format::{parse_subject, SchemaVersion, SubjectPart, ValueEncoding};
use crate::config::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str_with_env(text, |name| {
        (name == "REGISTRY_PASSWORD").then(|| "s3cret-pw".to_owned())
    })
}

#[track_caller]
fn invalid(text: &str, key: &str, hint: &str) {
    match parse(text) {
        Err(ConfigError::Invalid { key: k, reason }) => {
            assert_eq!(k, key, "reason: {reason}");
            assert!(reason.contains(hint), "{key}: `{reason}` lacks `{hint}`");
        }
        other => panic!("expected Invalid for {key}, got {other:?}"),
    }
}

const BASE: &str = "[postgres]\nurl = \"postgresql://u@127.0.0.1/app\"\n";

fn avro(extra_routing: &str) -> String {
    format!(
        "{BASE}[routing]\ntopic = \"orders\"\nvalue_format = \"avro\"\n{extra_routing}\n\
         [schema_registry]\nurl = \"http://127.0.0.1:8081\"\n"
    )
}

#[test]
fn avro_with_a_registry_is_valid() {
    let c = parse(&avro("schema_version = 3")).unwrap();
    assert_eq!(c.routing.value_format, ValueEncoding::Avro);
    assert_eq!(c.routing.schema_version, SchemaVersion::Number(3));
    assert_eq!(c.routing.subject, "${topic}-value");
    let c = parse(&avro(
        "schema_version = \"latest\"\nsubject = \"com.acme.Order\"",
    ))
    .unwrap();
    assert_eq!(c.routing.schema_version, SchemaVersion::Latest);
    // Fixed topics by rule are fine too.
    parse(&avro(
        "[[routing.rules]]\nevent_type = \"paid\"\ntopic = \"payments\"",
    ))
    .unwrap();
}

#[test]
fn unknown_value_format_names_the_key() {
    let e = parse(&format!("{BASE}[routing]\nvalue_format = \"protobuf\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("value_format") && e.contains("protobuf"), "{e}");
    let e = parse(&avro("schema_version = 0")).unwrap_err().to_string();
    assert!(e.contains("schema_version"), "{e}");
}

#[test]
fn avro_needs_a_registry() {
    invalid(
        &format!("{BASE}[routing]\ntopic = \"orders\"\nvalue_format = \"avro\"\n"),
        "schema_registry.url",
        "routing.value_format = \"avro\"",
    );
}

#[test]
fn subjects_have_known_placeholders_and_configured_roles() {
    invalid(
        &avro("subject = \"${nope}-value\""),
        "routing.subject",
        "unknown placeholder `${nope}`",
    );
    invalid(
        &avro("subject = \"${topic\""),
        "routing.subject",
        "unterminated",
    );
    // Per-event subjects and topics: fetched when first met.
    parse(&avro("subject = \"com.acme.${event_type}\"")).unwrap();
    parse(&avro("subject = \"${column:tenant}.${topic}-value\"")).unwrap();
    parse(&format!(
        "{BASE}[routing]\nvalue_format = \"avro\"\n[schema_registry]\nurl = \"http://r:1\"\n"
    ))
    .unwrap();
    invalid(
        &avro("subject = \"${timestamp}-value\""),
        "routing.subject",
        "outbox.columns.timestamp is empty",
    );
    assert_eq!(
        parse_subject("a.${topic}.${column:t}.${event_type}").unwrap(),
        vec![
            SubjectPart::Literal("a."),
            SubjectPart::Topic,
            SubjectPart::Literal("."),
            SubjectPart::Column("t"),
            SubjectPart::Literal("."),
            SubjectPart::Role("event_type"),
        ]
    );
}

#[test]
fn combinations_that_cannot_work_are_refused() {
    invalid(
        &avro("format = \"cloudevents-structured\""),
        "routing.value_format",
        "cloudevents-structured",
    );
    invalid(&avro("value = \"envelope\""), "routing.value", "envelope");
    invalid(
        &format!("{BASE}[routing]\nvalue_format = \"framed\"\nvalue = \"envelope\"\n[schema_registry]\nurl = \"http://r:1\"\n"),
        "routing.value",
        "envelope",
    );
}

#[test]
fn cloudevents_binary_carries_registry_values_with_their_content_type() {
    let c = parse(&avro("format = \"cloudevents-binary\"")).unwrap();
    assert_eq!(c.routing.value_format, ValueEncoding::Avro);
    invalid(
        &avro("format = \"cloudevents-binary\"\ncloudevents = { data_content_type = \"application/json\" }"),
        "routing.cloudevents.data_content_type",
        "application/avro",
    );
    // `framed`: the content type is that of the schema the frame names.
    let framed = format!(
        "{BASE}[routing]\nvalue_format = \"framed\"\nformat = \"cloudevents-binary\"\n\
         [schema_registry]\nurl = \"http://r:1\"\n"
    );
    assert_eq!(
        parse(&framed).unwrap().routing.value_format,
        ValueEncoding::Framed
    );
    invalid(
        &framed.replace(
            "format = \"cloudevents-binary\"\n",
            "format = \"cloudevents-binary\"\ncloudevents = { data_content_type = \"x/y\" }\n",
        ),
        "routing.cloudevents.data_content_type",
        "the schema the frame names",
    );
}

#[test]
fn framed_needs_a_registry_but_no_fixed_subject() {
    // The payload names its schema: per-event topics are fine.
    let c = parse(&format!(
        "{BASE}[routing]\nvalue_format = \"framed\"\n[schema_registry]\nurl = \"http://r:1\"\n"
    ))
    .unwrap();
    assert_eq!(c.routing.value_format, ValueEncoding::Framed);
    invalid(
        &format!("{BASE}[routing]\nvalue_format = \"framed\"\n"),
        "schema_registry.url",
        "routing.value_format = \"framed\"",
    );
}

#[test]
fn registry_settings_are_checked() {
    let with = |reg: &str| {
        format!("{BASE}[routing]\ntopic = \"orders\"\nvalue_format = \"avro\"\n[schema_registry]\n{reg}\n")
    };
    invalid(&with("url = \"ftp://r\""), "schema_registry.url", "scheme");
    invalid(
        &with("url = \"https://r\""),
        "schema_registry.ca_file",
        "PEM",
    );
    invalid(
        &with("url = \"http://u:p@r\""),
        "schema_registry.url",
        "credentials",
    );
    invalid(
        &with("url = \"http://r\"\nusername = \"u\""),
        "schema_registry.password",
        "both",
    );
    invalid(
        &with("url = \"http://r\"\nrequest_timeout = \"0s\""),
        "schema_registry.request_timeout",
        "more than 0",
    );
    let c = parse(&with(
        "url = \"http://a:1/apis/ccompat/v7/, http://b:2\"\nusername = \"u\"\npassword = \"${REGISTRY_PASSWORD}\"",
    ))
    .unwrap();
    assert_eq!(
        c.schema_registry.urls(),
        vec!["http://a:1/apis/ccompat/v7", "http://b:2"]
    );
    assert_eq!(c.schema_registry.password.as_deref(), Some("s3cret-pw"));
    // Never in a Debug rendering.
    assert!(!format!("{c:?}").contains("s3cret-pw"));
}
