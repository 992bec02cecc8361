//! `${ENV_VAR}` substitution, applied to the config text before TOML parsing.
//!
//! Rules:
//! - `${NAME}` is replaced by the value of the environment variable `NAME`; an
//!   unset variable is an error naming the variable and the line.
//! - `${NAME:-default}` uses `default` when `NAME` is unset *or empty* (as the
//!   shell does). The default runs to the first `}` and is inserted verbatim.
//! - Only `NAME`s in UPPER_SNAKE_CASE (`[A-Z_][A-Z0-9_]*`) are environment
//!   references. Lower-case placeholders such as `${aggregate_type}` or
//!   `${column:tenant}` are left untouched for the topic router, so routing
//!   templates never need escaping. A `${` followed by an upper-case letter or
//!   `_` that is not a well-formed reference is an error rather than being
//!   passed through, so a typo such as `${PG_URL` cannot reach a URL parser.
//! - `$${` produces a literal `${` (and is never treated as a reference).
//! - Comments are left alone, so commented-out examples may name variables that
//!   are not set.
//! - Inside a quoted string the value is escaped for that kind of string, so a
//!   password containing `"` or `\` survives intact in `"..."`; a `'...'`
//!   string cannot hold a `'` or a line break, which is reported. Outside quotes
//!   the value is pasted as-is, so `topic_partitions = ${PARTITIONS:-3}` works.

use std::ops::Range;

use crate::config::error::ConfigError;

/// The substituted text, and where in it each value taken from the
/// environment landed (byte ranges), so errors quoting a line can mask them:
/// such a value is often a secret (`${OUTBOXD_PG_URL}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Substituted {
    pub text: String,
    pub from_env: Vec<Range<usize>>,
}

/// Substitutes references using `lookup` in place of the process environment,
/// so callers (and tests) need not mutate global state.
#[cfg(test)]
pub(crate) fn substitute_with<F>(text: &str, lookup: F) -> Result<String, ConfigError>
where
    F: FnMut(&str) -> Option<String>,
{
    substitute_tracked(text, lookup).map(|s| s.text)
}

/// As [`substitute_with`], also returning where the environment's values went.
pub(crate) fn substitute_tracked<F>(text: &str, mut lookup: F) -> Result<Substituted, ConfigError>
where
    F: FnMut(&str) -> Option<String>,
{
    let mut from_env = Vec::new();
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut ctx = Ctx::Bare;
    // Start of the run of input not yet copied to `out`. Only ever set at the
    // position of an ASCII byte, so slicing `text` there is on a char boundary.
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if ctx != Ctx::Comment && rest.starts_with(b"$${") {
            out.push_str(&text[copied..i]);
            out.push_str("${");
            i += 3;
            copied = i;
            continue;
        }
        if ctx != Ctx::Comment && rest.starts_with(b"${") && rest.get(2).is_some_and(is_name_start)
        {
            let r = parse_reference(text, i)?;
            let (value, env) = match (lookup(r.name), r.default) {
                (Some(v), Some(d)) if v.is_empty() => (d.to_owned(), false),
                (Some(v), _) => (escape_for(ctx, r.name, &v, line_of(bytes, i))?, true),
                (None, Some(d)) => (d.to_owned(), false),
                (None, None) => {
                    return Err(ConfigError::MissingEnv {
                        name: r.name.to_owned(),
                        line: line_of(bytes, i),
                    })
                }
            };
            out.push_str(&text[copied..i]);
            if env && !value.is_empty() {
                from_env.push(out.len()..out.len() + value.len());
            }
            out.push_str(&value);
            i = r.end;
            copied = i;
            continue;
        }
        let (next_ctx, consumed) = ctx.step(rest);
        ctx = next_ctx;
        i += consumed;
    }
    out.push_str(&text[copied..]);
    Ok(Substituted {
        text: out,
        from_env,
    })
}

/// Where in the TOML text the scanner is; decides escaping and comment skipping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Bare,
    Comment,
    Basic,
    MlBasic,
    Literal,
    MlLiteral,
}

impl Ctx {
    /// Advances over the token at the start of `rest`: returns the new context
    /// and how many bytes were consumed (at least one).
    fn step(self, rest: &[u8]) -> (Ctx, usize) {
        let b = rest[0];
        match self {
            Ctx::Bare => match b {
                b'#' => (Ctx::Comment, 1),
                b'"' if rest.starts_with(b"\"\"\"") => (Ctx::MlBasic, 3),
                b'\'' if rest.starts_with(b"'''") => (Ctx::MlLiteral, 3),
                b'"' => (Ctx::Basic, 1),
                b'\'' => (Ctx::Literal, 1),
                _ => (Ctx::Bare, 1),
            },
            Ctx::Comment => (if b == b'\n' { Ctx::Bare } else { Ctx::Comment }, 1),
            // A backslash escapes the next byte, so `\"` does not end the string.
            Ctx::Basic | Ctx::MlBasic if b == b'\\' => (self, rest.len().min(2)),
            // A line break ends a single-line string in our scan: TOML rejects
            // it anyway, and resyncing keeps later comments recognised.
            Ctx::Basic | Ctx::Literal if b == b'\n' => (Ctx::Bare, 1),
            Ctx::Basic if b == b'"' => (Ctx::Bare, 1),
            Ctx::Literal if b == b'\'' => (Ctx::Bare, 1),
            // A multi-line string may end in up to five quotes (`""""" `): the
            // last three close it, so swallow the whole run.
            Ctx::MlBasic if rest.starts_with(b"\"\"\"") => (Ctx::Bare, quote_run(rest, b'"')),
            Ctx::MlLiteral if rest.starts_with(b"'''") => (Ctx::Bare, quote_run(rest, b'\'')),
            _ => (self, 1),
        }
    }
}

fn quote_run(rest: &[u8], q: u8) -> usize {
    rest.iter().take(5).take_while(|&&b| b == q).count()
}

struct Reference<'a> {
    name: &'a str,
    default: Option<&'a str>,
    /// Byte offset just past the closing `}`.
    end: usize,
}

/// Parses the reference starting at `start` (which points at `${` followed by
/// a name-start character).
fn parse_reference(text: &str, start: usize) -> Result<Reference<'_>, ConfigError> {
    let bytes = text.as_bytes();
    let name_start = start + 2;
    let name_end = name_start
        + bytes[name_start..]
            .iter()
            .take_while(|b| is_name_start(b) || b.is_ascii_digit())
            .count();
    let name = &text[name_start..name_end];
    let after = &bytes[name_end..];
    if after.first() == Some(&b'}') {
        return Ok(Reference {
            name,
            default: None,
            end: name_end + 1,
        });
    }
    if after.starts_with(b":-") {
        let def_start = name_end + 2;
        let close = bytes[def_start..]
            .iter()
            .position(|&b| b == b'}' || b == b'\n');
        if let Some(off) = close.filter(|&off| bytes[def_start + off] == b'}') {
            return Ok(Reference {
                name,
                default: Some(&text[def_start..def_start + off]),
                end: def_start + off + 1,
            });
        }
        return Err(bad_reference(
            bytes,
            start,
            name,
            "no closing `}` on the same line",
        ));
    }
    Err(bad_reference(
        bytes,
        start,
        name,
        "expected `}` or `:-default}` after the variable name",
    ))
}

fn bad_reference(bytes: &[u8], at: usize, name: &str, what: &str) -> ConfigError {
    ConfigError::Parse {
        message: format!(
            "line {}: malformed environment reference `${{{name}`: {what}. \
             Write ${{UPPER_SNAKE_NAME}} or ${{UPPER_SNAKE_NAME:-default}}; \
             write $${{ for a literal `${{`",
            line_of(bytes, at)
        ),
    }
}

/// Makes `value` safe to paste into the current TOML context.
fn escape_for(ctx: Ctx, name: &str, value: &str, line: usize) -> Result<String, ConfigError> {
    let unfit = |what: &str| ConfigError::Parse {
        message: format!(
            "line {line}: the value of environment variable {name} contains {what}, \
             which a '...' string cannot hold; put the reference in a \"...\" string instead"
        ),
    };
    match ctx {
        Ctx::Bare | Ctx::Comment => Ok(value.to_owned()),
        Ctx::Basic | Ctx::MlBasic => Ok(escape_basic(value)),
        Ctx::Literal if value.contains('\'') => Err(unfit("a single quote")),
        Ctx::Literal if value.chars().any(|c| c.is_control() && c != '\t') => {
            Err(unfit("a line break or control character"))
        }
        Ctx::MlLiteral if value.contains("'''") => Err(unfit("`'''`")),
        Ctx::Literal | Ctx::MlLiteral => Ok(value.to_owned()),
    }
}

fn escape_basic(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push('\t'),
            c if c.is_control() => s.push_str(&format!("\\u{:04X}", c as u32)),
            c => s.push(c),
        }
    }
    s
}

fn is_name_start(b: &u8) -> bool {
    b.is_ascii_uppercase() || *b == b'_'
}

fn line_of(bytes: &[u8], at: usize) -> usize {
    bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1
}
