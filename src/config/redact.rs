//! Keeps secrets out of configuration errors. toml's errors quote the line
//! they are about, and a syntax error on the `url` line is exactly the line
//! that holds the password. So TOML errors are rendered here, in toml's own
//! layout, from a copy of the line with every secret replaced by [`MASK`]:
//! - the password in a URL's userinfo (`postgresql://user:secret@host`),
//! - the value of a `password=` parameter (URL query or key=value string),
//! - the value of a key that names a secret (`sasl.password`,
//!   `sasl.oauthbearer.client.secret`, ...),
//! - any value substituted from the environment into such a key or into a
//!   `url` (`url = "${OUTBOXD_PG_URL}"`): it may be the password itself or a
//!   URL holding one, and which part is secret cannot be told once the text
//!   is broken.
//!
//! Masking errs on the side of hiding: a broken line may hide more than the
//! secret (e.g. everything after `password=`), never less.

use std::ops::Range;

/// What a secret is replaced with.
pub(crate) const MASK: &str = "***";

/// Key words that make a key secret-bearing (matched in the lower-cased key).
const SECRET_WORDS: [&str; 6] = [
    "password",
    "secret",
    "token",
    "credential",
    "jaas",
    "key.pem",
];

/// Renders `e` (from parsing `text`) like toml does: position, the quoted
/// line and a caret, then the message; with secrets masked. `from_env` are
/// the byte ranges of `text` that came from the environment.
pub(crate) fn toml_error(e: &toml::de::Error, text: &str, from_env: &[Range<usize>]) -> String {
    let message = mask_known(e.message().trim_end(), text, from_env);
    let Some(span) = e.span() else {
        return message;
    };
    let at = span.start.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let line = text[line_start..line_end].trim_end_matches('\r');
    let line_no = text[..line_start].matches('\n').count() + 1;
    let masks = secret_ranges(line, line_start, from_env);
    let (shown, caret_at) = apply(line, &masks, at - line_start);
    let column = line[..(at - line_start).min(line.len())].chars().count() + 1;
    let gutter = " ".repeat(line_no.to_string().len());
    let caret_pad = " ".repeat(shown[..caret_at].chars().count());
    format!(
        "TOML parse error at line {line_no}, column {column}\n\
         {gutter} |\n\
         {line_no} | {shown}\n\
         {gutter} | {caret_pad}^\n\
         {message}"
    )
}

/// Masks, in a free-standing message, every secret found anywhere in `text`
/// (for messages that repeat a value, e.g. "invalid type: string ...").
fn mask_known(message: &str, text: &str, from_env: &[Range<usize>]) -> String {
    let mut secrets: Vec<&str> = Vec::new();
    let mut start = 0;
    for line in text.split('\n') {
        for r in secret_ranges(line, start, from_env) {
            secrets.push(&line[r]);
        }
        start += line.len() + 1;
    }
    // Longest first, so a secret containing another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
        .into_iter()
        .filter(|s| !s.is_empty())
        .fold(message.to_owned(), |m, s| m.replace(s, MASK))
}

/// The line with `masks` (sorted, disjoint, line-relative byte ranges)
/// replaced by [`MASK`], and where byte `at` of the line ended up: at the
/// start of a mask it falls into, shifted past the masks before it.
fn apply(line: &str, masks: &[Range<usize>], at: usize) -> (String, usize) {
    let mut out = String::with_capacity(line.len());
    let mut copied = 0;
    let mut caret = None;
    for r in masks {
        if caret.is_none() && at < r.end {
            caret = Some(out.len() + at.saturating_sub(copied).min(r.start - copied));
        }
        out.push_str(&line[copied..r.start]);
        out.push_str(MASK);
        copied = r.end;
    }
    let caret = caret.unwrap_or(out.len() + at.saturating_sub(copied));
    out.push_str(&line[copied..]);
    let caret = caret.min(out.len());
    // A caret inside a multi-byte character is moved to its start.
    let caret = (0..=caret)
        .rev()
        .find(|&i| out.is_char_boundary(i))
        .unwrap_or(0);
    (out, caret)
}

/// `key = value` with every secret in it masked (for listing a setting).
pub(crate) fn mask_line(line: &str) -> String {
    apply(line, &secret_ranges(line, 0, &[]), 0).0
}

/// The byte ranges of `line` (which starts at byte `line_start` of the
/// substituted text) that hold secrets: sorted, merged.
pub(crate) fn secret_ranges(
    line: &str,
    line_start: usize,
    from_env: &[Range<usize>],
) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    url_passwords(line, &mut found);
    password_params(line, &mut found);
    let key = line_key(line);
    let secret_key = key.as_deref().is_some_and(is_secret_key);
    if let Some(value) = value_start(line) {
        let inline_secret = line[value..].starts_with('{')
            && SECRET_WORDS
                .iter()
                .any(|w| line[value..].to_ascii_lowercase().contains(w));
        if secret_key || inline_secret {
            found.push(value..line.len());
        }
    }
    let is_url = key
        .as_deref()
        .is_some_and(|k| k == "url" || k.ends_with(".url"));
    if secret_key || is_url {
        let line_end = line_start + line.len();
        for r in from_env {
            let (s, e) = (r.start.max(line_start), r.end.min(line_end));
            if s < e {
                found.push(s - line_start..e - line_start);
            }
        }
    }
    merge(found)
}

/// `scheme://user:PASSWORD@host`: everything between the first `:` of the
/// userinfo and the last `@` of the line (a password may hold a raw `@`).
fn url_passwords(line: &str, found: &mut Vec<Range<usize>>) {
    let mut from = 0;
    while let Some(i) = line[from..].find("://") {
        let auth = from + i + 3;
        if let Some(at) = line[auth..].rfind('@') {
            if let Some(colon) = line[auth..auth + at].find(':') {
                found.push(auth + colon + 1..auth + at);
            }
        }
        from = auth;
    }
}

/// `password=VALUE`, case-insensitive, up to the next `&` or the end of the
/// line (a broken line has no reliable end of the value).
fn password_params(line: &str, found: &mut Vec<Range<usize>>) {
    let lower = line.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = lower[from..].find("password=") {
        let value = from + i + "password=".len();
        let end = line[value..].find('&').map_or(line.len(), |j| value + j);
        found.push(value..end);
        from = value;
    }
}

/// The key of a `key = value` line, unquoted and lower-cased; `None` for
/// table headers, comments and lines without `=`.
fn line_key(line: &str) -> Option<String> {
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') || trimmed.starts_with('#') {
        return None;
    }
    let eq = line.find('=')?;
    let key: String = line[..eq]
        .chars()
        .filter(|c| !matches!(c, '"' | '\'' | ' ' | '\t'))
        .collect();
    Some(key.to_ascii_lowercase())
}

/// Where the value of a `key = value` line starts (after `=` and blanks).
fn value_start(line: &str) -> Option<usize> {
    line_key(line)?;
    let eq = line.find('=')? + 1;
    let blanks = line[eq..].len() - line[eq..].trim_start().len();
    Some(eq + blanks)
}

/// A key whose value is a secret. `password_env` and `password_file` name
/// where the password is, not the password.
fn is_secret_key(key: &str) -> bool {
    !(key.ends_with("_env") || key.ends_with("_file"))
        && SECRET_WORDS.iter().any(|w| key.contains(w))
}

fn merge(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.retain(|r| r.start < r.end);
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}
