//! The `outbox.columns.trace_context` column: W3C Trace Context to relay as
//! the `traceparent` and `tracestate` headers, the convention of
//! OpenTelemetry's Kafka instrumentation. The column may hold
//!
//! - a `traceparent` string (`00-<trace id>-<parent id>-<flags>`), as outbox
//!   libraries write it;
//! - a JSON object with `traceparent` and optionally `tracestate`;
//! - Debezium's `tracingspancontext` text: a `java.util.Properties` as
//!   `Properties.store` writes it (a `#` date comment, then `key=value`
//!   lines, `=` and `:` escaped with `\`).
//!
//! Values are checked as the W3C Trace Context recommendation says a
//! receiver must: a `traceparent` with a bad version, wrong lengths,
//! upper-case or non-hex digits, or an all-zero trace or parent id is
//! refused, not passed on; so is a malformed `tracestate`.

use bytes::Bytes;

use crate::outbox::json::sub_bytes;

/// What the headers get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceContext {
    pub traceparent: Bytes,
    /// `None` when absent or empty.
    pub tracestate: Option<Bytes>,
}

/// Why a trace context value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TraceContextError {
    #[error("it is neither a traceparent, a JSON object nor java.util.Properties text: {0}")]
    Unreadable(String),
    #[error("it has no traceparent")]
    MissingTraceparent,
    #[error("the traceparent is {0} characters long; version 00 has 55")]
    Length(usize),
    #[error("the traceparent's version `{0}` is not two lower-case hex digits other than ff")]
    Version(String),
    #[error("the traceparent's {0} is not lower-case hex digits separated by '-'")]
    Field(&'static str),
    #[error("the traceparent's trace id is all zeros, which the spec makes invalid")]
    ZeroTraceId,
    #[error("the traceparent's parent id is all zeros, which the spec makes invalid")]
    ZeroParentId,
    #[error("the traceparent has data after its flags, which version 00 does not allow")]
    Trailing,
    #[error("the tracestate is not a W3C tracestate list: {0}")]
    Tracestate(String),
}

/// The trace context in a column value; `Ok(None)` when the value is empty
/// (or JSON `null`).
pub(crate) fn parse(value: &Bytes) -> Result<Option<TraceContext>, TraceContextError> {
    let text = value.trim_ascii();
    if text.is_empty() || text == b"null" {
        return Ok(None);
    }
    let (traceparent, tracestate) = if text[0] == b'{' {
        from_json(text)?
    } else if text.iter().any(|b| matches!(b, b'=' | b':' | b'\n' | b'#')) {
        from_properties(text)?
    } else {
        (sub_bytes(value, text), None)
    };
    check_traceparent(traceparent.trim_ascii())?;
    let traceparent = if traceparent.trim_ascii().len() == traceparent.len() {
        traceparent
    } else {
        sub_bytes(&traceparent, traceparent.trim_ascii())
    };
    let tracestate = match tracestate {
        Some(s) if !s.trim_ascii().is_empty() => {
            check_tracestate(&s)?;
            Some(sub_bytes(&s, s.trim_ascii()))
        }
        _ => None,
    };
    Ok(Some(TraceContext {
        traceparent,
        tracestate,
    }))
}

type Parts = (Bytes, Option<Bytes>);

fn from_json(text: &[u8]) -> Result<Parts, TraceContextError> {
    #[derive(serde::Deserialize)]
    struct Object {
        traceparent: Option<String>,
        tracestate: Option<String>,
    }
    let o: Object = serde_json::from_slice(text)
        .map_err(|e| TraceContextError::Unreadable(format!("as JSON: {e}")))?;
    let traceparent = o.traceparent.ok_or(TraceContextError::MissingTraceparent)?;
    Ok((Bytes::from(traceparent), o.tracestate.map(Bytes::from)))
}

fn from_properties(text: &[u8]) -> Result<Parts, TraceContextError> {
    let text = std::str::from_utf8(text)
        .map_err(|_| TraceContextError::Unreadable("it is not UTF-8".into()))?;
    let (mut traceparent, mut tracestate) = (None, None);
    for (key, value) in properties(text) {
        match key.as_str() {
            "traceparent" => traceparent = Some(value),
            "tracestate" => tracestate = Some(value),
            _ => {}
        }
    }
    let traceparent = traceparent.ok_or(TraceContextError::MissingTraceparent)?;
    Ok((Bytes::from(traceparent), tracestate.map(Bytes::from)))
}

/// The entries of `java.util.Properties` text, as `Properties.load` reads
/// it: comment lines (`#`, `!`), `key=value`, `key:value` or `key value`,
/// `\` escapes (`\uXXXX` too) and `\` line continuations. Later keys win.
fn properties(text: &str) -> Vec<(String, String)> {
    let mut entries = Vec::new();
    let mut lines = text.lines();
    while let Some(first) = lines.next() {
        let mut line = first.trim_start_matches([' ', '\t', '\x0c']).to_owned();
        if line.is_empty() || line.starts_with(['#', '!']) {
            continue;
        }
        while ends_in_continuation(&line) {
            line.pop();
            match lines.next() {
                Some(next) => line.push_str(next.trim_start_matches([' ', '\t', '\x0c'])),
                None => break,
            }
        }
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() && !matches!(chars[i], '=' | ':' | ' ' | '\t' | '\x0c') {
            i += if chars[i] == '\\' { 2 } else { 1 };
        }
        let key_end = i.min(chars.len());
        while i < chars.len() && matches!(chars[i], ' ' | '\t' | '\x0c') {
            i += 1;
        }
        if i < chars.len() && matches!(chars[i], '=' | ':') {
            i += 1;
        }
        while i < chars.len() && matches!(chars[i], ' ' | '\t' | '\x0c') {
            i += 1;
        }
        entries.push((unescape(&chars[..key_end]), unescape(&chars[i..])));
    }
    entries
}

fn ends_in_continuation(line: &str) -> bool {
    line.bytes().rev().take_while(|&b| b == b'\\').count() % 2 == 1
}

fn unescape(chars: &[char]) -> String {
    let mut out = String::with_capacity(chars.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if c != '\\' || i == chars.len() {
            out.push(c);
            continue;
        }
        let e = chars[i];
        i += 1;
        match e {
            't' => out.push('\t'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            'f' => out.push('\x0c'),
            'u' => {
                let hex: String = chars[i..chars.len().min(i + 4)].iter().collect();
                match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    Some(u) if hex.len() == 4 => {
                        out.push(u);
                        i += 4;
                    }
                    _ => out.push('u'),
                }
            }
            other => out.push(other),
        }
    }
    out
}

fn is_lower_hex(b: &[u8]) -> bool {
    b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// `version "-" trace-id "-" parent-id "-" trace-flags`, 2-32-16-2 lower-case
/// hex digits. A version above 00 may carry more after a `-`; ff is invalid.
fn check_traceparent(s: &[u8]) -> Result<(), TraceContextError> {
    if s.len() < 55 {
        return Err(TraceContextError::Length(s.len()));
    }
    let version = &s[0..2];
    if !is_lower_hex(version) || version == b"ff" {
        return Err(TraceContextError::Version(
            String::from_utf8_lossy(version).into_owned(),
        ));
    }
    for (at, field, range) in [
        (2, "trace id", 3..35),
        (35, "parent id", 36..52),
        (52, "trace flags", 53..55),
    ] {
        if s[at] != b'-' || !is_lower_hex(&s[range]) {
            return Err(TraceContextError::Field(field));
        }
    }
    if version == b"00" && s.len() != 55 {
        return Err(TraceContextError::Length(s.len()));
    }
    if s.len() > 55 && s[55] != b'-' {
        return Err(TraceContextError::Trailing);
    }
    if s[3..35].iter().all(|&b| b == b'0') {
        return Err(TraceContextError::ZeroTraceId);
    }
    if s[36..52].iter().all(|&b| b == b'0') {
        return Err(TraceContextError::ZeroParentId);
    }
    Ok(())
}

/// At most 32 comma-separated `key=value` members (empty members allowed),
/// keys unique, per the W3C grammar.
fn check_tracestate(s: &[u8]) -> Result<(), TraceContextError> {
    let bad = |m: String| TraceContextError::Tracestate(m);
    let mut keys: Vec<&[u8]> = Vec::new();
    for member in s.split(|&b| b == b',') {
        let member = member.trim_ascii_start();
        let member = trim_ows_end(member);
        if member.is_empty() {
            continue;
        }
        let Some(eq) = member.iter().position(|&b| b == b'=') else {
            return Err(bad(format!("member `{}` has no '='", lossy(member))));
        };
        let (key, value) = (&member[..eq], &member[eq + 1..]);
        if !valid_key(key) {
            return Err(bad(format!("`{}` is not a tracestate key", lossy(key))));
        }
        let nblk = |b: u8| (0x21..=0x7e).contains(&b) && b != b',' && b != b'=';
        if value.is_empty()
            || value.len() > 256
            || !value.iter().all(|&b| b == b' ' || nblk(b))
            || !nblk(value[value.len() - 1])
        {
            return Err(bad(format!(
                "the value of `{}` is not 1 to 256 printable characters without ',' and '='",
                lossy(key)
            )));
        }
        if keys.contains(&key) {
            return Err(bad(format!("key `{}` appears twice", lossy(key))));
        }
        keys.push(key);
    }
    if keys.len() > 32 {
        return Err(bad(format!(
            "{} members; at most 32 are allowed",
            keys.len()
        )));
    }
    Ok(())
}

fn trim_ows_end(b: &[u8]) -> &[u8] {
    let end = b
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(0, |i| i + 1);
    &b[..end]
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `simple-key` or `tenant-id "@" system-id`.
fn valid_key(key: &[u8]) -> bool {
    let rest = |b: &u8| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/');
    match key.iter().position(|&b| b == b'@') {
        None => {
            !key.is_empty()
                && key.len() <= 256
                && key[0].is_ascii_lowercase()
                && key[1..].iter().all(rest)
        }
        Some(at) => {
            let (tenant, system) = (&key[..at], &key[at + 1..]);
            !tenant.is_empty()
                && tenant.len() <= 241
                && (tenant[0].is_ascii_lowercase() || tenant[0].is_ascii_digit())
                && tenant[1..].iter().all(rest)
                && !system.is_empty()
                && system.len() <= 14
                && system[0].is_ascii_lowercase()
                && system[1..].iter().all(rest)
        }
    }
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
