//! Tests of `${ENV_VAR}` substitution (see `env.rs` for the rules).

use crate::config::env::substitute_with;
use crate::config::ConfigError;

fn sub(text: &str) -> Result<String, ConfigError> {
    substitute_with(text, |name| match name {
        "HOST" => Some("db.internal".into()),
        "EMPTY" => Some(String::new()),
        "TRICKY" => Some("p\"a\\ss'w\nd".into()),
        "N" => Some("3".into()),
        _ => None,
    })
}

#[test]
fn defined_variable_is_substituted() {
    assert_eq!(
        sub("url = \"pg://${HOST}/app\"").unwrap(),
        "url = \"pg://db.internal/app\""
    );
}

#[test]
fn default_used_when_unset_or_empty() {
    assert_eq!(sub("a = \"${NOPE:-x:y}\"").unwrap(), "a = \"x:y\"");
    assert_eq!(
        sub("a = \"${EMPTY:-fallback}\"").unwrap(),
        "a = \"fallback\""
    );
    assert_eq!(
        sub("a = \"${HOST:-fallback}\"").unwrap(),
        "a = \"db.internal\""
    );
    assert_eq!(sub("a = \"${NOPE:-}\"").unwrap(), "a = \"\"");
}

#[test]
fn set_but_empty_without_default_is_empty() {
    assert_eq!(sub("a = \"${EMPTY}\"").unwrap(), "a = \"\"");
}

#[test]
fn missing_variable_names_variable_and_line() {
    let err = sub("a = 1\n\nb = \"${OUTBOXD_NOPE}\"").unwrap_err();
    match &err {
        ConfigError::MissingEnv { name, line } => {
            assert_eq!((name.as_str(), *line), ("OUTBOXD_NOPE", 3));
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("OUTBOXD_NOPE") && msg.contains("line 3"),
        "{msg}"
    );
}

#[test]
fn double_dollar_escapes_a_literal() {
    assert_eq!(
        sub("a = \"$${HOST} $${x}\"").unwrap(),
        "a = \"${HOST} ${x}\""
    );
}

#[test]
fn lower_case_placeholders_are_untouched() {
    let t = "topic = \"outbox.${aggregate_type}.${column:tenant}\"";
    assert_eq!(sub(t).unwrap(), t);
}

#[test]
fn comments_are_untouched() {
    let t = "# password = \"${UNSET_IN_COMMENT}\"\na = \"${HOST}\" # ${ALSO_UNSET}\n";
    assert_eq!(
        sub(t).unwrap(),
        "# password = \"${UNSET_IN_COMMENT}\"\na = \"db.internal\" # ${ALSO_UNSET}\n"
    );
}

#[test]
fn hash_inside_string_is_not_a_comment() {
    assert_eq!(sub("a = \"#${HOST}\"").unwrap(), "a = \"#db.internal\"");
    assert!(sub("a = \"#${NOPE}\"").is_err());
}

#[test]
fn values_are_escaped_for_basic_strings() {
    let out = sub("a = \"${TRICKY}\"").unwrap();
    let v: toml::Table = toml::from_str(&out).unwrap();
    assert_eq!(v["a"].as_str(), Some("p\"a\\ss'w\nd"));
}

#[test]
fn literal_string_cannot_hold_quote() {
    let err = sub("a = '${TRICKY}'").unwrap_err().to_string();
    assert!(err.contains("TRICKY") && err.contains("line 1"), "{err}");
    assert_eq!(sub("a = '${HOST}'").unwrap(), "a = 'db.internal'");
}

#[test]
fn bare_values_are_pasted() {
    assert_eq!(sub("n = ${N}\nm = ${NOPE:-7}").unwrap(), "n = 3\nm = 7");
}

#[test]
fn malformed_references_are_errors() {
    for t in [
        "a = \"${HOST\"",
        "a = \"${HOST:x}\"",
        "a = \"${Host}\"",
        "a = \"${X:-oops\n\"",
    ] {
        let err = sub(t).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{t}: {err:?}");
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}

#[test]
fn escaped_quote_does_not_end_string() {
    // The `#` after `\"` is still inside the string, so the reference counts.
    assert!(sub("a = \"\\\" # ${NOPE}\"").is_err());
}

#[test]
fn multibyte_text_is_preserved() {
    assert_eq!(
        sub("a = \"é${HOST}ü\" # ñ").unwrap(),
        "a = \"édb.internalü\" # ñ"
    );
}
