//! A JSON reader that keeps each number as the text it was written as.
//!
//! serde_json turns numbers into `f64` unless the crate-wide
//! `arbitrary_precision` feature is on (which would change every other use
//! of it here), and an Avro `decimal` or a `long` must not lose a digit on
//! the way. So the payload is read into [`Json`], numbers as their literal
//! (checked against RFC 8259's grammar), strings unescaped only when they
//! hold an escape.

use std::borrow::Cow;

/// A parsed JSON value borrowing from the payload text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json<'a> {
    Null,
    Bool(bool),
    /// The number's literal, e.g. `-12.50e3`.
    Number(&'a str),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    /// Members in the order written; a name given twice is refused.
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
}

impl Json<'_> {
    /// What it is, for errors.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }
}

/// Nesting deeper than this is refused rather than risking the stack.
const MAX_DEPTH: usize = 128;

/// Parses one JSON text (surrounding whitespace allowed).
pub(crate) fn parse(text: &str) -> Result<Json<'_>, String> {
    let mut p = Parser {
        s: text,
        b: text.as_bytes(),
        i: 0,
    };
    let v = p.value(0)?;
    p.ws();
    if p.i != p.b.len() {
        return Err(p.error("unexpected text after the JSON value"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, what: &str) -> String {
        format!("the payload is not JSON: {what} at byte {}", self.i)
    }

    fn ws(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &str, v: Json<'a>) -> Result<Json<'a>, String> {
        if self.b[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.error("unexpected character"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json<'a>, String> {
        if depth > MAX_DEPTH {
            return Err(self.error("nested too deeply"));
        }
        self.ws();
        match self.b.get(self.i) {
            None => Err(self.error("unexpected end")),
            Some(b'n') => self.literal("null", Json::Null),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.b.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Array(items));
                        }
                        _ => return Err(self.error("expected `,` or `]`")),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut members: Vec<(Cow<'a, str>, Json<'a>)> = Vec::new();
                self.ws();
                if self.b.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Object(members));
                }
                loop {
                    self.ws();
                    if self.b.get(self.i) != Some(&b'"') {
                        return Err(self.error("expected a member name"));
                    }
                    let name = self.string()?;
                    if members.iter().any(|(n, _)| *n == name) {
                        return Err(self.error(&format!("member `{name}` given twice")));
                    }
                    self.ws();
                    if self.b.get(self.i) != Some(&b':') {
                        return Err(self.error("expected `:`"));
                    }
                    self.i += 1;
                    let v = self.value(depth + 1)?;
                    members.push((name, v));
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Object(members));
                        }
                        _ => return Err(self.error("expected `,` or `}`")),
                    }
                }
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("unexpected character")),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<Json<'a>, String> {
        let start = self.i;
        if self.b[self.i] == b'-' {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("a number needs digits")),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.error("a number needs digits after `.`"));
            }
        }
        if matches!(self.b.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.b.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("a number needs digits in its exponent"));
            }
        }
        Ok(Json::Number(&self.s[start..self.i]))
    }

    fn string(&mut self) -> Result<Cow<'a, str>, String> {
        self.i += 1; // the opening quote
        let start = self.i;
        // Most strings hold no escape: find their end in one scan.
        let stop = self.b[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20);
        self.i = stop.map_or(self.b.len(), |n| start + n);
        match self.b.get(self.i) {
            None => return Err(self.error("unterminated string")),
            Some(b'"') => {
                let s = &self.s[start..self.i];
                self.i += 1;
                return Ok(Cow::Borrowed(s));
            }
            Some(b'\\') => {}
            Some(_) => return Err(self.error("control character in a string")),
        }
        // An escape: unescape into an owned string from here on.
        let mut out = String::from(&self.s[start..self.i]);
        loop {
            match self.b.get(self.i) {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(Cow::Owned(out));
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = match self.b.get(self.i) {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.i += 1;
                            let c = self.unicode_escape()?;
                            out.push(c);
                            continue;
                        }
                        _ => return Err(self.error("invalid escape")),
                    };
                    self.i += 1;
                    out.push(c);
                }
                Some(c) if *c < 0x20 => return Err(self.error("control character in a string")),
                Some(_) => {
                    // Copy one UTF-8 character (the text is valid UTF-8).
                    let ch = self.s[self.i..].chars().next().expect("in bounds");
                    out.push(ch);
                    self.i += ch.len_utf8();
                }
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .filter(|_| self.b[self.i..self.i + 4].iter().all(u8::is_ascii_hexdigit))
            .ok_or_else(|| self.error("invalid \\u escape"))?;
        self.i += 4;
        Ok(h)
    }

    /// After `\u`: one code point, a surrogate pair taken together.
    fn unicode_escape(&mut self) -> Result<char, String> {
        let hi = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&hi) {
            if !self.b[self.i..].starts_with(b"\\u") {
                return Err(self.error("lone surrogate in a \\u escape"));
            }
            self.i += 2;
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(self.error("lone surrogate in a \\u escape"));
            }
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else {
            hi
        };
        char::from_u32(code).ok_or_else(|| self.error("lone surrogate in a \\u escape"))
    }
}
