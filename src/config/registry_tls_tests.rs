//! `schema_registry.cert_file` / `key_file`: both or neither, and the key
//! file's path stays out of a Debug rendering.

use crate::config::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str_with_env(text, |_| None)
}

fn with(keys: &str) -> String {
    format!(
        "[postgres]\nurl = \"postgresql://u@127.0.0.1/app\"\n[routing]\ntopic = \"orders\"\n\
         value_format = \"avro\"\n[schema_registry]\nurl = \"https://r:1\"\n\
         ca_file = \"/etc/ca.pem\"\n{keys}\n"
    )
}

#[test]
fn a_client_certificate_needs_its_key_and_the_other_way_round() {
    for (keys, missing) in [
        ("cert_file = \"/etc/c.pem\"", "schema_registry.key_file"),
        ("key_file = \"/etc/c.key\"", "schema_registry.cert_file"),
    ] {
        match parse(&with(keys)) {
            Err(ConfigError::Invalid { key, reason }) => {
                assert_eq!(key, missing, "{reason}");
                assert!(reason.contains("both"), "{reason}");
            }
            other => panic!("{keys}: {other:?}"),
        }
    }
    let c = parse(&with(
        "cert_file = \"/etc/c.pem\"\nkey_file = \"/etc/secret-dir/c.key\"",
    ))
    .unwrap();
    assert_eq!(
        c.schema_registry.cert_file.as_deref(),
        Some(std::path::Path::new("/etc/c.pem"))
    );
    let shown = format!("{c:?}");
    assert!(
        shown.contains("/etc/c.pem") && !shown.contains("secret-dir"),
        "{shown}"
    );
}
