//! The outbox-columns check: every column the record mapper reads from a
//! row must be in the table, published, and of a type whose text form is
//! what the mapper and consumers expect. A missing one would fail every
//! event at run time, long after deploy.

use crate::config::outbox::COLUMN_ROLES;
use crate::config::routing::{parse_template, resolve_column, TemplatePart};
use crate::config::OutboxTable;
use crate::source::admin::{self, Issue, Target, TypeFit};

use super::line::{Line, Verdict};
use super::postgres_facts::Facts;

/// `(column, setting naming it, role for the type rules)` for every column
/// the record mapper reads from a row: a missing one fails every event.
fn wanted_columns(t: &OutboxTable) -> Vec<(String, String, &'static str)> {
    let (columns, routing, rk) = (&t.columns, &t.routing, &t.routing_key);
    let mut wanted: Vec<(String, String, &'static str)> = Vec::new();
    let mut add = |column: &str, setting: String, role: &'static str| {
        if !wanted.iter().any(|(c, _, _)| c == column) {
            wanted.push((column.to_string(), setting, role));
        }
    };
    for role in COLUMN_ROLES {
        if let Some(c) = columns.column_for_role(role) {
            add(c, format!("{}.columns.{role}", t.key), role);
        }
    }
    for (name, source) in &routing.additional_headers {
        let setting = format!("{rk}.additional_headers.{name}");
        add(resolve_column(columns, source), setting, "header");
    }
    if routing.format.is_cloudevents() {
        for (name, source) in &routing.cloudevents.extensions {
            let setting = format!("{rk}.cloudevents.extensions.{name}");
            add(resolve_column(columns, source), setting, "header");
        }
    }
    let rules = routing.rules.iter().enumerate();
    let templates = std::iter::once((format!("{rk}.topic"), &routing.topic))
        .chain(rules.map(|(i, r)| (format!("{rk}.rules[{i}].topic"), &r.topic)));
    for (setting, template) in templates {
        for part in parse_template(template).unwrap_or_default() {
            if let TemplatePart::Column(c) = part {
                add(c, setting.clone(), "topic");
            }
        }
    }
    wanted
}

pub(super) fn columns_line(table_cfg: &OutboxTable, facts: &Facts, t: &Target<'_>) -> Line {
    let table = admin::qualified(t);
    let Some(tf) = &facts.table else {
        return Line::skip(
            "outbox columns",
            &format!("{table} does not exist (see publication)"),
        );
    };
    // Before 18, pgoutput never sends generated columns; from 15 on the
    // publication's column list (attnames) says what it sends.
    let generated_unpublished = facts.server.version_num < 180000;
    let mut findings = Vec::new();
    let mut fine = Vec::new();
    for (column, setting, role) in wanted_columns(table_cfg) {
        let Some(c) = tf.columns.iter().find(|c| c.name == column) else {
            let issue = Issue::ColumnMissing {
                column,
                setting,
                table: table.clone(),
            };
            findings.push((Verdict::Fail, issue.to_string()));
            continue;
        };
        let unlisted = facts
            .publication
            .as_ref()
            .and_then(|p| p.columns.as_ref())
            .is_some_and(|list| !list.contains(&column));
        if (c.generated && generated_unpublished) || unlisted {
            let issue = Issue::ColumnNotPublished {
                column,
                setting,
                publication: t.publication.into(),
            };
            findings.push((Verdict::Fail, issue.to_string()));
            continue;
        }
        let (verdict, reason) = match admin::type_fit(role, &c.base_type, &c.category) {
            TypeFit::Good => {
                fine.push(format!("{} {}", c.name, c.type_name));
                continue;
            }
            TypeFit::Doubtful(reason) => (Verdict::Warn, reason),
            TypeFit::Unusable(reason) => (Verdict::Fail, reason),
        };
        let issue = Issue::ColumnType {
            column,
            setting,
            type_name: c.type_name.clone(),
            reason,
        };
        findings.push((verdict, issue.to_string()));
    }
    Line::worst("outbox columns", findings, fine.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn wanted_columns_follow_roles_headers_and_templates() {
        let cfg = Config::from_toml_str(
            "[postgres]\nurl = \"postgresql://u@h/db\"\n\
             [outbox.columns]\ntimestamp = \"occurred_at\"\n\
             [routing]\ntopic = \"t.${column:tenant}\"\n\
             additional_headers = { eventType = \"event_type\", trace = \"trace_id\" }\n",
        )
        .unwrap();
        let got: Vec<(String, String)> = wanted_columns(&cfg.tables()[0])
            .into_iter()
            .map(|(c, s, _)| (c, s))
            .collect();
        let want = [
            ("id", "outbox.columns.id"),
            ("aggregate_id", "outbox.columns.key"),
            ("aggregate_type", "outbox.columns.aggregate_type"),
            ("event_type", "outbox.columns.event_type"),
            ("payload", "outbox.columns.payload"),
            ("occurred_at", "outbox.columns.timestamp"),
            ("trace_id", "routing.additional_headers.trace"),
            ("tenant", "routing.topic"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(c, s)| (c.to_string(), s.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn cloudevents_extension_and_trace_columns_are_wanted() {
        let cfg = Config::from_toml_str(
            "[postgres]\nurl = \"postgresql://u@h/db\"\n\
             [outbox.columns]\ntrace_context = \"trace\"\nce_extensions = \"ext\"\n\
             [routing]\nformat = \"cloudevents-binary\"\n\
             [routing.cloudevents]\nextensions = { region = \"region_col\" }\n",
        )
        .unwrap();
        let got: Vec<(String, String, &str)> = wanted_columns(&cfg.tables()[0]);
        for want in [
            ("trace", "outbox.columns.trace_context", "trace_context"),
            ("ext", "outbox.columns.ce_extensions", "ce_extensions"),
            (
                "region_col",
                "routing.cloudevents.extensions.region",
                "header",
            ),
        ] {
            assert!(
                got.iter()
                    .any(|(c, s, r)| (c.as_str(), s.as_str(), *r) == want),
                "{want:?} not in {got:?}"
            );
        }
    }
}
