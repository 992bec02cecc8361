//! `[outbox]` and `[[outbox]]`: both forms parse, entries are validated
//! with their index, and the environment sets an entry's keys.

use crate::config::{Config, ConfigError, OutboxSection};

const URL: &str = "[postgres]\nurl = \"postgresql://u@h/db\"\n";

const TWO: &str = r#"
[routing]
topic = "shared.${aggregate_type}"

[[outbox]]
table = "orders.outbox"
message_prefix = "orders"

[[outbox]]
table = "billing.events"
[outbox.columns]
key = "account_id"
event_type = "kind"
[outbox.routing]
topic = "billing.${event_type}"
additional_headers = {}
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str_with_env(&format!("{URL}{text}"), |_| None)
}

fn invalid_key(text: &str) -> String {
    match parse(text) {
        Err(e) => e
            .key()
            .unwrap_or_else(|| panic!("not a key error: {e}"))
            .to_owned(),
        Ok(_) => panic!("accepted:\n{text}"),
    }
}

#[test]
fn the_single_table_form_is_one_table_routed_by_routing() {
    let c = parse("[outbox]\ntable = \"app.outbox\"\n[routing]\ntopic = \"t\"\n").unwrap();
    assert!(matches!(c.outbox, OutboxSection::Single(_)));
    let t = c.tables();
    assert_eq!(t.len(), 1);
    assert_eq!(
        (t[0].key.as_str(), t[0].label().as_str()),
        ("outbox", "app.outbox")
    );
    assert_eq!(t[0].routing.topic, "t");
    assert_eq!(t[0].routing_key, "routing");
    // The single form keeps its message default.
    assert_eq!(t[0].message_prefix.as_deref(), Some("outbox"));
    // And with nothing configured, the documented default table.
    assert_eq!(parse("").unwrap().tables()[0].label(), "public.outbox");
}

#[test]
fn entries_have_their_own_columns_and_routing_or_inherit_routing() {
    let c = parse(TWO).unwrap();
    let t = c.tables();
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].label(), "orders.outbox");
    assert_eq!(t[0].routing.topic, "shared.${aggregate_type}");
    assert_eq!(t[0].routing_key, "routing");
    assert_eq!(t[0].message_prefix.as_deref(), Some("orders"));
    assert_eq!(t[0].columns.key, "aggregate_id");
    assert_eq!(t[1].label(), "billing.events");
    assert_eq!(t[1].key, "outbox[1]");
    assert_eq!(t[1].routing.topic, "billing.${event_type}");
    assert_eq!(t[1].routing_key, "outbox[1].routing");
    assert!(t[1].routing.additional_headers.is_empty());
    assert_eq!(t[1].message_prefix, None);
    assert_eq!(
        (t[1].columns.key.as_str(), t[1].columns.event_type.as_str()),
        ("account_id", "kind")
    );
}

#[test]
fn errors_name_the_entry_by_index() {
    let bad_column = TWO.replace("key = \"account_id\"", "key = \"\"");
    assert_eq!(invalid_key(&bad_column), "outbox[1].columns.key");
    let bad_route = TWO.replace("billing.${event_type}", "billing.${topic}");
    assert_eq!(invalid_key(&bad_route), "outbox[1].routing.topic");
    let bad_table = TWO.replace("\"billing.events\"", "\"a.b.c\"");
    assert_eq!(invalid_key(&bad_table), "outbox[1].table");
    let twice = TWO.replace("\"billing.events\"", "\"orders.outbox\"");
    assert_eq!(invalid_key(&twice), "outbox[1].table");
    let e = parse(&twice).unwrap_err().to_string();
    assert!(e.contains("already the table of outbox[0]"), "{e}");
    // `public.x` and `x` are one table.
    let same = "[[outbox]]\ntable = \"x\"\n[[outbox]]\ntable = \"public.x\"\n";
    assert_eq!(invalid_key(same), "outbox[1].table");
    let prefixes = TWO.replace(
        "table = \"billing.events\"",
        "table = \"billing.events\"\nmessage_prefix = \"orders\"",
    );
    assert_eq!(invalid_key(&prefixes), "outbox[1].message_prefix");
    let empty = Config::from_toml_str_with_env(&format!("outbox = []\n{URL}"), |_| None);
    assert_eq!(empty.unwrap_err().key(), Some("outbox"));
    // A typo inside an entry is a parse error naming the key.
    let e = parse("[[outbox]]\ntable = \"a.b\"\ncolumns = { idd = \"x\" }\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("idd"), "{e}");
    // An entry has no default table: it would be a second `public.outbox`.
    let e = parse("[[outbox]]\nmessage_prefix = \"m\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("table"), "{e}");
}

mod environment {
    use super::*;
    use std::io::Write;

    fn load(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        write!(f, "{URL}{text}").unwrap();
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        Config::load_from(Some(f.path()), &vars).map(|l| l.config)
    }

    #[test]
    fn an_entry_key_is_set_by_its_index() {
        let c = load(
            TWO,
            &[
                ("OUTBOXD_OUTBOX__1__TABLE", "ledger.outbox"),
                ("OUTBOXD_OUTBOX__0__COLUMNS__KEY", "order_id"),
                ("OUTBOXD_OUTBOX__1__ROUTING__TOPIC", "ledger.all"),
                (
                    "OUTBOXD_OUTBOX__1__ROUTING__ADDITIONAL_HEADERS__kind",
                    "event_type",
                ),
                ("OUTBOXD_ROUTING__TOPIC", "top.${event_type}"),
            ],
        )
        .unwrap();
        let t = c.tables();
        assert_eq!(t[1].label(), "ledger.outbox");
        assert_eq!(t[1].columns.key, "account_id", "the file's other keys stay");
        assert_eq!(t[0].columns.key, "order_id");
        assert_eq!(t[1].routing.topic, "ledger.all");
        assert_eq!(
            t[1].routing
                .additional_headers
                .get("kind")
                .map(String::as_str),
            Some("event_type")
        );
        assert_eq!(
            t[0].routing.topic, "top.${event_type}",
            "entry 0 inherits [routing]"
        );
    }

    #[test]
    fn entries_can_come_from_the_environment_alone() {
        let c = load(
            "",
            &[
                ("OUTBOXD_OUTBOX__0__TABLE", "a.outbox"),
                ("OUTBOXD_OUTBOX__1__TABLE", "b.outbox"),
            ],
        )
        .unwrap();
        let labels: Vec<String> = c.tables().iter().map(|t| t.label()).collect();
        assert_eq!(labels, ["a.outbox", "b.outbox"]);
    }

    #[test]
    fn bad_entry_variables_are_named() {
        let e = load(
            "[outbox]\ntable = \"a.b\"\n",
            &[("OUTBOXD_OUTBOX__0__TABLE", "c.d")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("OUTBOXD_OUTBOX__0__TABLE") && e.contains("[[outbox]]"),
            "{e}"
        );
        let e = load(TWO, &[("OUTBOXD_OUTBOX__0__TABEL", "c.d")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("OUTBOXD_OUTBOX__0__TABEL"), "{e}");
        let e = load(TWO, &[("OUTBOXD_OUTBOX__1__COLUMNS__KEY", "")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("outbox[1].columns.key"), "{e}");
        // The single form's variables keep working.
        let c = load("", &[("OUTBOXD_OUTBOX__TABLE", "x.y")]).unwrap();
        assert_eq!(c.tables()[0].label(), "x.y");
    }
}

/// The annotated file's commented `[[outbox]]` example, uncommented in
/// place of its `[outbox]` tables, is a valid configuration.
#[test]
fn the_documented_entries_example_parses() {
    let example = include_str!("../../config/outboxd.toml");
    let start = example
        .find("# [[outbox]]")
        .expect("the example is documented");
    let block: String = example[start..]
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim_start())
        .collect::<Vec<_>>()
        .join("\n");
    let c = parse(&block).unwrap();
    let labels: Vec<String> = c.tables().iter().map(|t| t.label()).collect();
    assert_eq!(labels, ["orders.outbox", "billing.outbox"]);
    assert_eq!(c.tables()[1].routing.topic, "billing.${event_type}");
    assert_eq!(c.tables()[1].columns.key, "account_id");
}
