//! Every key from the environment: `OUTBOXD_<SECTION>__<KEY>`, as
//! containers are configured. The environment wins over the file, and the
//! file is optional when the environment supplies every required key.
//!
//! Names: the section and the key upper-cased, joined by `__`; a nested
//! table adds a level (`OUTBOXD_OUTBOX__COLUMNS__ID`). Two tables have keys
//! the user chooses:
//! - `[kafka.properties]`: `OUTBOXD_KAFKA__PROPERTIES__<NAME>` with the
//!   librdkafka name encoded as Confluent's images do it: upper-cased, `.`
//!   as `_`, `_` as `__`, `-` as `___` (`SASL_MECHANISMS` is
//!   `sasl.mechanisms`);
//! - `routing.additional_headers`: `OUTBOXD_ROUTING__ADDITIONAL_HEADERS__<Header>`,
//!   the header name as written (case kept).
//!
//! Values: the type comes from the key's documented default in
//! `config/outboxd.toml` (the schema; built in), so `OUTBOXD_POSTGRES__SLOT=123`
//! stays a string and `OUTBOXD_KAFKA__CREATE_TOPICS=false` is a boolean. A
//! value starting with `[` or `{` is read as TOML (an array such as
//! `routing.rules`, or an inline table). Other `OUTBOXD_` variables (without
//! `__`, e.g. `OUTBOXD_PG_URL` for a `${...}` reference, `OUTBOXD_LOG`,
//! `OUTBOXD_CONFIG`) are not keys and are left alone.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use toml::{Table, Value};

use crate::config::error::ConfigError;

pub(crate) const PREFIX: &str = "OUTBOXD_";
pub(crate) const SEPARATOR: &str = "__";

/// The documented file: every key with its default, the schema of the
/// overrides (and of `check`'s listing of defaults).
const DOCUMENTED: &str = include_str!("../../config/outboxd.toml");

/// Tables whose keys are the user's, not outboxd's.
const FREE_TABLES: [&str; 3] = [
    "kafka.properties",
    "routing.additional_headers",
    "routing.cloudevents.extensions",
];

/// Where a value of the effective configuration came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    Default,
    File,
    /// The variable that set it.
    Env(String),
}

/// One `OUTBOXD_..__..` variable, read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Override {
    pub var: String,
    /// Dotted path, e.g. `["kafka", "properties", "sasl.mechanisms"]`.
    pub path: Vec<String>,
    pub value: Value,
}

impl Override {
    pub(crate) fn dotted(&self) -> String {
        self.path.join(".")
    }
}

/// What the schema says of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Bool,
    Integer,
    Float,
    /// Arrays and tables: the value is TOML.
    Toml,
}

struct Schema {
    /// Dotted key -> kind, for every key the documented file sets or shows
    /// commented out.
    kinds: BTreeMap<String, Kind>,
    /// Dotted key -> documented default, for keys the file sets.
    defaults: BTreeMap<String, Value>,
}

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let table: Table = toml::from_str(DOCUMENTED).expect("config/outboxd.toml parses");
        let mut defaults = BTreeMap::new();
        flatten("", &table, &mut defaults);
        let mut kinds: BTreeMap<String, Kind> = defaults
            .iter()
            .map(|(k, v)| (k.clone(), kind_of(v)))
            .collect();
        for (key, kind) in commented_keys(DOCUMENTED) {
            kinds.entry(key).or_insert(kind);
        }
        Schema { kinds, defaults }
    })
}

fn kind_of(v: &Value) -> Kind {
    match v {
        Value::String(_) | Value::Datetime(_) => Kind::String,
        Value::Boolean(_) => Kind::Bool,
        Value::Integer(_) => Kind::Integer,
        Value::Float(_) => Kind::Float,
        Value::Array(_) | Value::Table(_) => Kind::Toml,
    }
}

/// Keys the documented file shows only in comments (`# password_env = ...`,
/// `# [[routing.rules]]`), with the kind their example value has. Lines of
/// prose and of free tables are skipped, and so are the keys shown inside a
/// commented array of tables (they belong to its elements).
fn commented_keys(text: &str) -> Vec<(String, Kind)> {
    let mut section = String::new();
    let mut in_array = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = name.trim().to_owned();
            in_array = false;
            continue;
        }
        let Some(body) = trimmed.strip_prefix('#').map(str::trim) else {
            continue;
        };
        if let Some(name) = body.strip_prefix("[[").and_then(|s| s.strip_suffix("]]")) {
            if let Some((table, key)) = name.rsplit_once('.') {
                out.push((format!("{table}.{key}"), Kind::Toml));
            }
            in_array = true;
            continue;
        }
        if in_array || body.is_empty() || FREE_TABLES.contains(&section.as_str()) {
            continue;
        }
        let Some((key, value)) = body.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        // Only a line that is itself a valid `key = value` is an example.
        if let Ok(t) = toml::from_str::<Table>(&format!("{key} = {}", value.trim())) {
            if let Some(v) = t.get(key) {
                out.push((format!("{section}.{key}"), kind_of(v)));
            }
        }
    }
    out
}

/// Leaves of `table` as dotted keys. Free tables and inline tables are one
/// value each only when they are free tables; other tables are walked.
pub(crate) fn flatten(prefix: &str, table: &Table, out: &mut BTreeMap<String, Value>) {
    for (k, v) in table {
        let dotted = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(t) if !FREE_TABLES.contains(&dotted.as_str()) => flatten(&dotted, t, out),
            Value::Table(t) => {
                for (name, value) in t {
                    out.insert(format!("{dotted}.{name}"), value.clone());
                }
            }
            _ => {
                out.insert(dotted, v.clone());
            }
        }
    }
}

/// The key path an `OUTBOXD_` variable names: `None` when it names no key
/// (no `__`), an error when it does but the key does not exist.
pub(crate) fn path_of(var: &str) -> Option<Result<Vec<String>, ConfigError>> {
    let rest = var.strip_prefix(PREFIX)?;
    if !rest.contains(SEPARATOR) {
        return None;
    }
    Some(parse_path(var, rest))
}

fn parse_path(var: &str, rest: &str) -> Result<Vec<String>, ConfigError> {
    // `[[outbox]]` entries: OUTBOXD_OUTBOX__<index>__<KEY>, the key being one
    // of `[outbox]`'s or, under ROUTING__, one of `[routing]`'s.
    let entry = rest
        .strip_prefix("OUTBOX__")
        .and_then(|r| r.split_once(SEPARATOR))
        .filter(|(i, _)| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    if let Some((index, key)) = entry {
        let mut path = vec!["outbox".to_owned(), index.to_owned()];
        if let Some(routing) = key.strip_prefix("ROUTING__") {
            let mut inner = parse_path(var, &format!("ROUTING__{routing}"))?;
            path.append(&mut inner);
        } else {
            let mut inner = parse_path(var, &format!("OUTBOX__{key}"))?;
            path.extend(inner.drain(1..));
        }
        return Ok(path);
    }
    let unknown = |what: String| ConfigError::invalid(var, what);
    for free in FREE_TABLES {
        let encoded = free.replace('.', SEPARATOR).to_ascii_uppercase() + SEPARATOR;
        if let Some(name) = rest.strip_prefix(encoded.as_str()) {
            if name.is_empty() {
                return Err(unknown(format!("names no key of [{free}]")));
            }
            let name = match free {
                "kafka.properties" => decode_property(name),
                // CloudEvents attribute names are lower-case by rule.
                "routing.cloudevents.extensions" => name.to_ascii_lowercase(),
                _ => name.to_owned(),
            };
            let mut path: Vec<String> = free.split('.').map(str::to_owned).collect();
            path.push(name);
            return Ok(path);
        }
    }
    let path: Vec<String> = rest.split(SEPARATOR).map(str::to_ascii_lowercase).collect();
    let dotted = path.join(".");
    if FREE_TABLES.contains(&dotted.as_str()) || schema().kinds.contains_key(&dotted) {
        return Ok(path);
    }
    Err(unknown(format!(
        "names the key {dotted}, which does not exist; the keys are those of config/outboxd.toml, \
         e.g. OUTBOXD_POSTGRES__SLOT for postgres.slot"
    )))
}

/// `SASL_MECHANISMS` -> `sasl.mechanisms`; `__` -> `_`, `___` -> `-`.
fn decode_property(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut underscores = 0;
    let flush = |n: &mut usize, out: &mut String| {
        match *n {
            0 => {}
            1 => out.push('.'),
            2 => out.push('_'),
            3 => out.push('-'),
            // Runs longer than three are read greedily as `-` then the rest.
            _ => {
                out.push('-');
                let mut rest = *n - 3;
                while rest > 0 {
                    let take = rest.min(3);
                    out.push(['.', '_', '-'][take - 1]);
                    rest -= take;
                }
            }
        }
        *n = 0;
    };
    for c in name.chars() {
        if c == '_' {
            underscores += 1;
        } else {
            flush(&mut underscores, &mut out);
            out.push(c.to_ascii_lowercase());
        }
    }
    flush(&mut underscores, &mut out);
    out
}

/// The value of `var` for the key at `path`, typed by the schema.
fn typed(var: &str, path: &[String], raw: &str) -> Result<Value, ConfigError> {
    let dotted = path.join(".");
    let kind = schema()
        .kinds
        .get(&schema_key(path))
        .copied()
        .unwrap_or(Kind::String);
    let as_toml = |what: &str| {
        toml::from_str::<Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .ok_or_else(|| {
                ConfigError::invalid(
                    var,
                    format!("{dotted} takes {what}; the value is not one (written as in TOML)"),
                )
            })
    };
    let trimmed = raw.trim_start();
    if trimmed.starts_with('[') || trimmed.starts_with('{') {
        return as_toml("a TOML array or inline table");
    }
    match kind {
        Kind::String => Ok(Value::String(raw.to_owned())),
        Kind::Bool => match raw.trim() {
            "true" => Ok(Value::Boolean(true)),
            "false" => Ok(Value::Boolean(false)),
            _ => Err(ConfigError::invalid(
                var,
                format!("{dotted} takes true or false"),
            )),
        },
        Kind::Integer => raw
            .trim()
            .parse()
            .map(Value::Integer)
            .map_err(|_| ConfigError::invalid(var, format!("{dotted} takes a whole number"))),
        Kind::Float => raw
            .trim()
            .parse()
            .map(Value::Float)
            .map_err(|_| ConfigError::invalid(var, format!("{dotted} takes a number"))),
        Kind::Toml => as_toml("a TOML array or inline table"),
    }
}

/// The documented key a path stands for: an `[[outbox]]` entry's keys are
/// `[outbox]`'s (`outbox.0.table` -> `outbox.table`) or `[routing]`'s.
fn schema_key(path: &[String]) -> String {
    match path {
        [outbox, index, rest @ ..] if outbox == "outbox" && index.parse::<usize>().is_ok() => {
            match rest.first().map(String::as_str) {
                Some("routing") => rest.join("."),
                _ => format!("outbox.{}", rest.join(".")),
            }
        }
        _ => path.join("."),
    }
}

/// The overrides among `vars`, sorted by variable name (so two variables
/// for the same key resolve the same way every time: the later name wins).
pub(crate) fn collect<'a>(
    vars: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<Override>, ConfigError> {
    let mut out = Vec::new();
    for (var, raw) in vars {
        let Some(path) = path_of(var) else {
            continue;
        };
        let path = path?;
        let value = typed(var, &path, raw)?;
        out.push(Override {
            var: var.to_owned(),
            path,
            value,
        });
    }
    out.sort_by(|a, b| a.var.cmp(&b.var));
    Ok(out)
}

/// Sets `o` in `table`, creating the tables on its path.
pub(crate) fn apply(table: &mut Table, o: &Override) -> Result<(), ConfigError> {
    let (last, parents) = o.path.split_last().expect("a path has a key");
    let mut at = table;
    let mut parents = parents.iter().enumerate().peekable();
    while let Some((i, name)) = parents.next() {
        let index = parents
            .peek()
            .and_then(|(_, n)| n.parse::<usize>().ok())
            .filter(|_| name == "outbox");
        let entry = at.entry(name.clone()).or_insert_with(|| match index {
            Some(_) => Value::Array(Vec::new()),
            None => Value::Table(Table::new()),
        });
        let entry = match (index, entry) {
            // `[[outbox]]` entry `index`: created (with the ones before it)
            // when the file has fewer.
            (Some(index), Value::Array(entries)) => {
                parents.next();
                while entries.len() <= index {
                    entries.push(Value::Table(Table::new()));
                }
                &mut entries[index]
            }
            (Some(_), _) => {
                return Err(ConfigError::invalid(
                    &o.var,
                    "names an [[outbox]] entry, but the file has a single [outbox] table; \
                     write [[outbox]] entries in the file, or use OUTBOXD_OUTBOX__<KEY>",
                ))
            }
            (None, entry) => entry,
        };
        at = match entry {
            Value::Table(t) => t,
            _ => {
                return Err(ConfigError::invalid(
                    &o.var,
                    format!(
                        "{} is not a table in the configuration file, so {} cannot be set",
                        o.path[..=i].join("."),
                        o.dotted()
                    ),
                ))
            }
        };
    }
    at.insert(last.clone(), o.value.clone());
    Ok(())
}

/// The documented default of every key the documented file sets, for
/// listing what was not set (`${VAR:-x}` defaults there are examples, not
/// defaults: those keys have none).
pub(crate) fn documented_defaults() -> impl Iterator<Item = (&'static str, Option<&'static Value>)>
{
    schema().kinds.keys().map(|k| {
        let v = schema()
            .defaults
            .get(k)
            .filter(|v| !v.as_str().is_some_and(|s| s.contains("${")));
        (k.as_str(), v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(var: &str, value: &str) -> Result<Override, ConfigError> {
        collect([(var, value)]).map(|mut v| v.remove(0))
    }

    #[test]
    fn names_map_to_keys() {
        assert_eq!(
            one("OUTBOXD_POSTGRES__SLOT", "s").unwrap().dotted(),
            "postgres.slot"
        );
        assert_eq!(
            one("OUTBOXD_OUTBOX__COLUMNS__ID", "event_id")
                .unwrap()
                .dotted(),
            "outbox.columns.id"
        );
        assert_eq!(
            one("OUTBOXD_RELAY__MAX_IN_FLIGHT_EVENTS", "5")
                .unwrap()
                .dotted(),
            "relay.max_in_flight_events"
        );
        let p = one(
            "OUTBOXD_ROUTING__CLOUDEVENTS__EXTENSIONS__TENANT",
            "tenant_id",
        )
        .unwrap();
        assert_eq!(p.path, ["routing", "cloudevents", "extensions", "tenant"]);
        assert_eq!(
            one("OUTBOXD_ROUTING__FORMAT", "cloudevents-binary")
                .unwrap()
                .dotted(),
            "routing.format"
        );
        let p = one("OUTBOXD_KAFKA__PROPERTIES__SASL_MECHANISMS", "PLAIN").unwrap();
        assert_eq!(p.path, ["kafka", "properties", "sasl.mechanisms"]);
        let p = one("OUTBOXD_KAFKA__PROPERTIES__SSL_KEYSTORE_LOCATION", "/k").unwrap();
        assert_eq!(p.path[2], "ssl.keystore.location");
        let p = one(
            "OUTBOXD_ROUTING__ADDITIONAL_HEADERS__eventType",
            "event_type",
        )
        .unwrap();
        assert_eq!(p.path, ["routing", "additional_headers", "eventType"]);
        // Commented-out keys of the documented file exist too.
        assert_eq!(
            one("OUTBOXD_POSTGRES__PASSWORD_ENV", "PW")
                .unwrap()
                .dotted(),
            "postgres.password_env"
        );
        assert_eq!(
            one("OUTBOXD_METRICS__LISTEN", "0.0.0.0:9187")
                .unwrap()
                .dotted(),
            "metrics.listen"
        );
    }

    #[test]
    fn other_outboxd_variables_are_not_keys() {
        for var in [
            "OUTBOXD_PG_URL",
            "OUTBOXD_LOG",
            "OUTBOXD_CONFIG",
            "PATH",
            "OUTBOXD_",
        ] {
            assert!(path_of(var).is_none(), "{var}");
        }
    }

    #[test]
    fn an_unknown_key_names_the_variable() {
        let e = one("OUTBOXD_POSTGRES__SLOTT", "x").unwrap_err().to_string();
        assert!(
            e.contains("OUTBOXD_POSTGRES__SLOTT") && e.contains("postgres.slott"),
            "{e}"
        );
        let e = one("OUTBOXD_KAFKA__PROPERTIES__", "x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("OUTBOXD_KAFKA__PROPERTIES__"), "{e}");
    }

    #[test]
    fn values_take_the_documented_type() {
        assert_eq!(
            one("OUTBOXD_POSTGRES__SLOT", "123").unwrap().value,
            Value::String("123".into())
        );
        assert_eq!(
            one("OUTBOXD_KAFKA__CREATE_TOPICS", "false").unwrap().value,
            Value::Boolean(false)
        );
        assert_eq!(
            one("OUTBOXD_KAFKA__TOPIC_PARTITIONS", "6").unwrap().value,
            Value::Integer(6)
        );
        let e = one("OUTBOXD_KAFKA__CREATE_TOPICS", "yes")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("OUTBOXD_KAFKA__CREATE_TOPICS") && e.contains("true or false"),
            "{e}"
        );
        let e = one("OUTBOXD_KAFKA__TOPIC_PARTITIONS", "six")
            .unwrap_err()
            .to_string();
        assert!(e.contains("whole number"), "{e}");
        let rules = one(
            "OUTBOXD_ROUTING__RULES",
            r#"[{ event_type = "a", topic = "b" }]"#,
        )
        .unwrap();
        assert!(rules.value.is_array());
        // A librdkafka property stays text whatever it looks like.
        let p = one("OUTBOXD_KAFKA__PROPERTIES__LINGER_MS", "5").unwrap();
        assert_eq!(p.value, Value::String("5".into()));
    }

    #[test]
    fn property_names_decode_like_confluent_images() {
        assert_eq!(decode_property("SASL_MECHANISMS"), "sasl.mechanisms");
        assert_eq!(decode_property("SSL_KEY__PEM"), "ssl.key_pem");
        assert_eq!(decode_property("A___B"), "a-b");
        assert_eq!(decode_property("LINGER_MS"), "linger.ms");
    }

    #[test]
    fn the_schema_knows_every_documented_key_and_its_type() {
        let kinds = &schema().kinds;
        assert_eq!(kinds.get("postgres.create_slot"), Some(&Kind::Bool));
        assert_eq!(
            kinds.get("relay.max_in_flight_events"),
            Some(&Kind::Integer)
        );
        assert_eq!(kinds.get("routing.rules"), Some(&Kind::Toml));
        assert_eq!(kinds.get("relay.dead_letter_topic"), Some(&Kind::String));
        // Keys inside the commented rule examples are not keys of [routing].
        assert!(!kinds.contains_key("routing.event_type"));
        assert!(!kinds.contains_key("kafka.properties.linger.ms"));
    }

    mod loading {
        use std::path::Path;

        use crate::config::{Config, Origin, Setting};

        fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }

        fn file(text: &str) -> tempfile::NamedTempFile {
            let f = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(f.path(), text).unwrap();
            f
        }

        fn setting<'a>(settings: &'a [Setting], key: &str) -> &'a Setting {
            settings
                .iter()
                .find(|s| s.key == key)
                .unwrap_or_else(|| panic!("no {key} in {settings:#?}"))
        }

        const FILE: &str = "[postgres]\nurl = \"postgresql://a@db/app\"\nslot = \"from_file\"\n\n[kafka]\nbrokers = \"k:9092\"\n";

        #[test]
        fn the_environment_wins_over_the_file_and_each_value_says_where_it_came_from() {
            let f = file(FILE);
            let loaded = Config::load_from(
                Some(f.path()),
                &vars(&[
                    ("OUTBOXD_POSTGRES__SLOT", "from_env"),
                    ("OUTBOXD_RELAY__MAX_IN_FLIGHT_EVENTS", "77"),
                ]),
            )
            .unwrap();
            assert_eq!(loaded.config.postgres.slot, "from_env");
            assert_eq!(loaded.config.relay.max_in_flight_events, 77);
            assert_eq!(loaded.config.kafka.brokers.as_deref(), Some("k:9092"));
            let s = &loaded.settings;
            assert_eq!(
                setting(s, "postgres.slot").origin,
                Origin::Env("OUTBOXD_POSTGRES__SLOT".into())
            );
            assert_eq!(
                setting(s, "postgres.slot").value.as_deref(),
                Some("\"from_env\"")
            );
            assert_eq!(setting(s, "kafka.brokers").origin, Origin::File);
            let d = setting(s, "relay.shutdown_timeout");
            assert_eq!(
                (d.origin.clone(), d.value.as_deref()),
                (Origin::Default, Some("\"30s\""))
            );
        }

        #[test]
        fn without_a_file_the_environment_supplies_everything() {
            let loaded = Config::load_from(
                None,
                &vars(&[
                    (
                        "OUTBOXD_POSTGRES__URL",
                        "postgresql://outboxd:hunter2@db:5432/app",
                    ),
                    ("OUTBOXD_KAFKA__BROKERS", "k1:9092,k2:9092"),
                    (
                        "OUTBOXD_KAFKA__PROPERTIES__SASL_MECHANISMS",
                        "SCRAM-SHA-512",
                    ),
                    ("OUTBOXD_KAFKA__PROPERTIES__SASL_PASSWORD", "s3cret"),
                    ("OUTBOXD_OUTBOX__COLUMNS__ID", "event_id"),
                ]),
            )
            .unwrap();
            let c = &loaded.config;
            c.validate_for_relay().unwrap();
            assert_eq!(c.tables()[0].columns.id, "event_id");
            assert_eq!(c.kafka.properties["sasl.mechanisms"], "SCRAM-SHA-512");
            assert_eq!(c.kafka.properties["sasl.password"], "s3cret");
            // Listed masked: the URL's password and the SASL password.
            let listed = format!("{:?}", loaded.settings);
            assert!(
                !listed.contains("hunter2") && !listed.contains("s3cret"),
                "{listed}"
            );
            assert_eq!(
                setting(&loaded.settings, "postgres.url").value.as_deref(),
                Some("\"postgresql://outboxd:***@db:5432/app\"")
            );
        }

        #[test]
        fn a_required_key_missing_from_both_is_named() {
            let e = Config::load_from(None, &[]).unwrap_err().to_string();
            assert!(e.contains("postgres.url"), "{e}");
            let e = Config::load(Some(Path::new("/nonexistent/outboxd.toml")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("/nonexistent/outboxd.toml"), "{e}");
        }

        #[test]
        fn a_value_that_does_not_fit_names_the_variable() {
            let f = file(FILE);
            let e = Config::load_from(
                Some(f.path()),
                &vars(&[("OUTBOXD_RELAY__ON_ERROR", "bogus")]),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("OUTBOXD_RELAY__ON_ERROR") && e.contains("bogus"),
                "{e}"
            );
        }

        #[test]
        fn a_whole_table_from_the_environment_replaces_the_files() {
            let f = file(&format!(
                "{FILE}\n[kafka.properties]\n\"linger.ms\" = \"9\"\n"
            ));
            let loaded = Config::load_from(
                Some(f.path()),
                &vars(&[("OUTBOXD_KAFKA__PROPERTIES", r#"{ "acks" = "all" }"#)]),
            )
            .unwrap();
            let props = &loaded.config.kafka.properties;
            assert_eq!(props.len(), 1, "{props:?}");
            assert!(loaded
                .settings
                .iter()
                .all(|s| s.key != "kafka.properties.linger.ms"));
        }
    }
}
