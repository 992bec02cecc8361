//! Metric names: those a PromQL expression refers to, those `/metrics`
//! exports, and those the code declares.

use std::collections::BTreeSet;

use super::repo;

/// Sample names in Prometheus text (histograms as `_bucket`, `_sum`, `_count`).
pub fn exported_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// `"outboxd_..."` string literals in src/metrics/: the names the code declares.
pub fn declared_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(repo().join("src/metrics")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for piece in text.split('"').skip(1).step_by(2) {
                if piece.starts_with("outboxd_") && piece.chars().all(is_name_char) {
                    names.insert(piece.to_string());
                }
            }
        }
    }
    names
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The `outboxd_*` metric names a PromQL expression refers to (outside
/// string literals).
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut outside = String::new();
    let mut quote = None;
    for c in expr.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' || c == '`' => {
                quote = Some(c);
                outside.push(' ');
            }
            None => outside.push(c),
        }
    }
    for word in outside.split(|c: char| !is_name_char(c)) {
        if word.starts_with("outboxd_") {
            names.insert(word.to_string());
        }
    }
    names
}

#[test]
fn metric_names_skip_strings_and_keep_suffixes() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(outboxd_commit_to_ack_seconds_bucket{job=\"outboxd_x\"}[5m]))) \
         or outboxd_halted == 1",
    );
    assert_eq!(
        names,
        ["outboxd_commit_to_ack_seconds_bucket", "outboxd_halted"]
            .map(String::from)
            .into()
    );
}
