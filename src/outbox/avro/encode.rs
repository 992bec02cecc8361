//! JSON → Avro: the payload's JSON walked together with the compiled schema
//! ([`Plan`]), writing the Avro binary as it goes. The rules
//! (docs/schema-registry.md says the same for users):
//!
//! - `null`, `boolean`, `string`: the same JSON type. `int`, `long`: a JSON
//!   integer in range (no fraction, no exponent). `float`, `double`: any
//!   JSON number. `bytes`, `fixed`: a base64 string (what JSON libraries
//!   write for byte arrays); `fixed` needs exactly its size.
//! - `record`: a JSON object. Fields are matched by name (or alias); an
//!   absent field takes the schema's default, and without one it is an
//!   error. A member the record has no field for is an error: a typo must
//!   not silently drop data.
//! - `enum`: one of its symbols as a string.
//! - `array`: a JSON array. `map`: a JSON object.
//! - union: JSON `null` takes the `null` branch. Anything else takes the
//!   first branch, in the schema's order, that it fits (so with
//!   `["null", "int", "long"]` the number 5 is an `int`, and with
//!   `["null", "string", "MyEnum"]` a string is a `string`). Avro's JSON
//!   encoding's `{"type": value}` wrapper is not read: payloads are plain
//!   JSON.
//! - logical types: `decimal` from a JSON number or string, exactly (no
//!   rounding; more places than the scale is an error); `uuid` from its
//!   8-4-4-4-12 string; `date` from `YYYY-MM-DD` or days since the epoch;
//!   `time-millis`/`-micros` from `HH:MM:SS[.ffffff]` or the count;
//!   `timestamp-millis`/`-micros` from ISO 8601 (with `Z` or an offset; no
//!   zone = UTC) or epoch milliseconds / microseconds; `local-timestamp-*`
//!   from ISO 8601 without a zone or the count; `timestamp-nanos` and
//!   `local-timestamp-nanos` from epoch nanoseconds only.
//!   `duration` and `big-decimal` are not supported (an error names them).
//! - A field default (schema JSON) follows Avro's rules instead: a union's
//!   default is of its first branch, and `bytes`/`fixed` defaults are
//!   strings of code points 0-255.
//!
//! Nothing is written that a later check could refuse except inside a
//! union branch being tried, which is cut off again when it does not fit.
//! On an error the caller drops the whole output.

use base64::Engine;

use crate::outbox::avro::binary::{write_bytes, write_long};
use crate::outbox::avro::error::EncodeError;
use crate::outbox::avro::json::{self, Json};
use crate::outbox::avro::plan::{Node, NodeId, Plan, Record};
use crate::outbox::avro::{decimal, logical};

/// Where the JSON came from: the payload, or a field default in the schema
/// (which Avro reads by other rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    Payload,
    Default,
}

type Result<T> = std::result::Result<T, EncodeError>;

/// Appends the Avro binary of the payload's `json` for the plan's root.
pub(super) fn encode(plan: &Plan, json: &Json<'_>, out: &mut Vec<u8>) -> Result<()> {
    Encoder::new(plan, None).value(0, json, Origin::Payload, out)
}

/// Appends the Avro binary of JSON `text` (a field default) for `node`.
pub(super) fn encode_text(
    plan: &Plan,
    node: NodeId,
    text: &str,
    origin: Origin,
    out: &mut Vec<u8>,
) -> Result<()> {
    let json = json::parse(text).map_err(EncodeError::Encode)?;
    Encoder::new(plan, None).value(node, &json, origin, out)
}

/// One step of the path an error names; kept as borrowed parts so that the
/// path is only written out when there is an error.
enum Step<'p, 'j> {
    Field(&'p str),
    Index(usize),
    Key(&'j str),
}

struct Encoder<'p, 'j> {
    plan: &'p Plan,
    /// The path above the JSON being walked when it is not the payload's
    /// root `$` (a default read inside a payload).
    prefix: Option<String>,
    path: Vec<Step<'p, 'j>>,
}

impl<'p, 'j> Encoder<'p, 'j> {
    fn new(plan: &'p Plan, prefix: Option<String>) -> Encoder<'p, 'j> {
        Encoder {
            plan,
            prefix,
            path: Vec::new(),
        }
    }

    /// `$`, then `.field`, `[3]`, `["key"]`: where in the payload we are.
    fn path(&self) -> String {
        let mut p = self.prefix.clone().unwrap_or_else(|| "$".into());
        for step in &self.path {
            match step {
                Step::Field(name) => {
                    p.push('.');
                    p.push_str(name);
                }
                Step::Index(i) => p.push_str(&format!("[{i}]")),
                Step::Key(k) => p.push_str(&format!("[{}]", quoted(k))),
            }
        }
        p
    }

    fn mismatch(&self, expected: impl Into<String>, json: &Json<'_>) -> EncodeError {
        let problem = match json {
            Json::Number(n) => format!("found the number {n}"),
            Json::String(s) => format!("found the string {}", quoted(s)),
            other => format!("found {}", other.kind()),
        };
        self.problem(expected, problem)
    }

    fn problem(&self, expected: impl Into<String>, problem: impl Into<String>) -> EncodeError {
        EncodeError::Mismatch {
            path: self.path(),
            expected: expected.into(),
            problem: problem.into(),
        }
    }

    fn value(
        &mut self,
        node: NodeId,
        json: &'j Json<'j>,
        origin: Origin,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let plan = self.plan;
        match &plan.nodes[node] {
            Node::Null => match json {
                Json::Null => Ok(()),
                j => Err(self.mismatch("null", j)),
            },
            Node::Boolean => match json {
                Json::Bool(b) => {
                    out.push(u8::from(*b));
                    Ok(())
                }
                j => Err(self.mismatch("a boolean", j)),
            },
            Node::Int => {
                let v = self.integer::<i32>(json, "an int (32-bit integer)")?;
                write_long(v.into(), out);
                Ok(())
            }
            Node::Long => {
                let v = self.integer::<i64>(json, "a long (64-bit integer)")?;
                write_long(v, out);
                Ok(())
            }
            Node::Float => match json {
                Json::Number(n) => {
                    let f = n
                        .parse::<f32>()
                        .ok()
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| self.problem("a float", format!("{n} is out of its range")))?;
                    out.extend_from_slice(&f.to_le_bytes());
                    Ok(())
                }
                j => Err(self.mismatch("a float (a number)", j)),
            },
            Node::Double => match json {
                Json::Number(n) => {
                    let f = n
                        .parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| {
                            self.problem("a double", format!("{n} is out of its range"))
                        })?;
                    out.extend_from_slice(&f.to_le_bytes());
                    Ok(())
                }
                j => Err(self.mismatch("a double (a number)", j)),
            },
            Node::String => match json {
                Json::String(s) => {
                    write_bytes(s.as_bytes(), out);
                    Ok(())
                }
                j => Err(self.mismatch("a string", j)),
            },
            Node::Bytes => {
                let b = self.bytes(json, origin, "bytes (a base64 string)")?;
                write_bytes(&b, out);
                Ok(())
            }
            Node::Fixed { size, expected } => {
                let b = self.bytes(json, origin, expected)?;
                if b.len() != *size {
                    return Err(
                        self.problem(expected.as_str(), format!("it decodes to {} bytes", b.len()))
                    );
                }
                out.extend_from_slice(&b);
                Ok(())
            }
            Node::Enum { symbols, label } => match json {
                Json::String(s) => match symbols.iter().position(|x| x == s.as_ref()) {
                    Some(i) => {
                        write_long(i as i64, out);
                        Ok(())
                    }
                    None => Err(self.problem(
                        format!("a symbol of {label}: {}", symbols.join(", ")),
                        format!("found {}", quoted(s)),
                    )),
                },
                j => Err(self.mismatch(format!("a symbol of {label} (a string)"), j)),
            },
            Node::Array(items_node) => match json {
                Json::Array(items) => {
                    // One block holding every item, then the empty block.
                    if !items.is_empty() {
                        write_long(items.len() as i64, out);
                    }
                    for (i, item) in items.iter().enumerate() {
                        self.path.push(Step::Index(i));
                        let r = self.value(*items_node, item, origin, out);
                        self.path.pop();
                        r?;
                    }
                    out.push(0);
                    Ok(())
                }
                j => Err(self.mismatch("an array", j)),
            },
            Node::Map(values_node) => match json {
                Json::Object(members) => {
                    if !members.is_empty() {
                        write_long(members.len() as i64, out);
                    }
                    for (k, item) in members {
                        write_bytes(k.as_bytes(), out);
                        self.path.push(Step::Key(k));
                        let r = self.value(*values_node, item, origin, out);
                        self.path.pop();
                        r?;
                    }
                    out.push(0);
                    Ok(())
                }
                j => Err(self.mismatch("a map (an object)", j)),
            },
            Node::Record(r) => self.record(r, json, origin, out),
            Node::Union(u) => {
                if let Json::Null = json {
                    return match u.null {
                        Some(i) => {
                            write_long(i as i64, out);
                            Ok(())
                        }
                        None => Err(self.mismatch(u.expected.as_str(), json)),
                    };
                }
                if origin == Origin::Default {
                    // Avro: a union's default is a value of its first branch.
                    write_long(0, out);
                    return self.value(u.branches[0], json, origin, out);
                }
                let mark = out.len();
                let mut first_error = None;
                for &i in &u.candidates {
                    write_long(i as i64, out);
                    match self.value(u.branches[i], json, origin, out) {
                        Ok(()) => return Ok(()),
                        Err(e) => {
                            out.truncate(mark);
                            first_error.get_or_insert(e);
                        }
                    }
                }
                // One branch besides null (an optional value): its own error
                // says exactly where inside it the payload differs.
                match (u.candidates.len(), first_error) {
                    (1, Some(e)) => Err(e),
                    _ => Err(self.mismatch(u.expected.as_str(), json)),
                }
            }
            Node::Decimal {
                precision,
                scale,
                fixed,
            } => {
                let text = match json {
                    Json::Number(n) => *n,
                    Json::String(s) => s.as_ref(),
                    j => {
                        return Err(self.mismatch(
                            format!("a decimal({precision}, {scale}) (a number or a string)"),
                            j,
                        ))
                    }
                };
                let bytes = decimal::unscaled_bytes(text, *precision, *scale).map_err(|reason| {
                    self.problem(format!("a decimal({precision}, {scale})"), reason)
                })?;
                match fixed {
                    None => write_bytes(&bytes, out),
                    Some((size, label)) => {
                        if bytes.len() > *size {
                            return Err(self.problem(
                                format!("a decimal in {label} of {size} bytes"),
                                format!("`{text}` needs {} bytes", bytes.len()),
                            ));
                        }
                        // Sign-extended to the fixed size.
                        let sign = if bytes[0] & 0x80 != 0 { 0xff } else { 0 };
                        out.resize(out.len() + size - bytes.len(), sign);
                        out.extend_from_slice(&bytes);
                    }
                }
                Ok(())
            }
            Node::Uuid => match json {
                Json::String(s) if logical::is_uuid(s) => {
                    write_bytes(s.as_bytes(), out);
                    Ok(())
                }
                j => Err(self.mismatch(
                    "a uuid (a string like 123e4567-e89b-12d3-a456-426614174000)",
                    j,
                )),
            },
            Node::Date => {
                let days = match json {
                    Json::String(s) => logical::date_days(s).ok_or_else(|| {
                        self.mismatch("a date (YYYY-MM-DD or days since 1970-01-01)", json)
                    })?,
                    Json::Number(_) => self.integer::<i32>(json, "a date (days since 1970-01-01)")?,
                    j => return Err(self.mismatch("a date (YYYY-MM-DD or days since 1970-01-01)", j)),
                };
                write_long(days.into(), out);
                Ok(())
            }
            Node::TimeMillis => {
                let ms = match json {
                    Json::String(s) => logical::time_of_day_us(s)
                        .filter(|us| us % 1000 == 0)
                        .map(|us| (us / 1000) as i32)
                        .ok_or_else(|| self.mismatch("a time-millis (HH:MM:SS[.fff])", json))?,
                    _ => self.integer::<i32>(json, "a time-millis (HH:MM:SS[.fff] or milliseconds)")?,
                };
                write_long(ms.into(), out);
                Ok(())
            }
            Node::TimeMicros => {
                let us = match json {
                    Json::String(s) => logical::time_of_day_us(s)
                        .ok_or_else(|| self.mismatch("a time-micros (HH:MM:SS[.ffffff])", json))?,
                    _ => self.integer::<i64>(
                        json,
                        "a time-micros (HH:MM:SS[.ffffff] or microseconds)",
                    )?,
                };
                write_long(us, out);
                Ok(())
            }
            Node::Timestamp {
                local,
                per_unit,
                expected,
            } => {
                let v = self.timestamp(json, *local, *per_unit, expected)?;
                write_long(v, out);
                Ok(())
            }
            Node::Nanos { expected } => {
                let v = self.integer::<i64>(json, expected)?;
                write_long(v, out);
                Ok(())
            }
            Node::Unsupported => Err(self.problem(
                "a duration or big-decimal",
                "outboxd does not map JSON to these logical types; use a record, a long or a decimal",
            )),
            Node::Unknown(full) => Err(EncodeError::Encode(format!(
                "the schema refers to an unknown type {full}"
            ))),
        }
    }

    fn integer<T: std::str::FromStr>(&self, json: &Json<'_>, expected: &str) -> Result<T> {
        match json {
            Json::Number(n) => n.parse::<T>().map_err(|_| {
                let why = if n.contains(['.', 'e', 'E']) {
                    format!("found {n}, not an integer")
                } else {
                    format!("{n} is out of its range")
                };
                self.problem(expected, why)
            }),
            j => Err(self.mismatch(expected, j)),
        }
    }

    /// ISO 8601 text or an epoch count in the type's unit; `per_unit`:
    /// microseconds per unit (1000 for millis, 1 for micros).
    fn timestamp(
        &self,
        json: &Json<'_>,
        local: bool,
        per_unit: i64,
        expected: &str,
    ) -> Result<i64> {
        match json {
            Json::String(s) => {
                let us =
                    logical::timestamp_us(s, local).ok_or_else(|| self.mismatch(expected, json))?;
                if us.rem_euclid(per_unit) != 0 {
                    return Err(self.problem(
                        expected,
                        format!("{} has more precision than the type keeps", quoted(s)),
                    ));
                }
                Ok(us.div_euclid(per_unit))
            }
            _ => self.integer::<i64>(json, expected),
        }
    }

    fn bytes(&self, json: &Json<'_>, origin: Origin, expected: &str) -> Result<Vec<u8>> {
        let Json::String(s) = json else {
            return Err(self.mismatch(expected, json));
        };
        match origin {
            Origin::Payload => base64::engine::general_purpose::STANDARD
                .decode(s.as_bytes())
                .map_err(|e| self.problem(expected, format!("{} is not base64: {e}", quoted(s)))),
            // Avro's JSON for bytes: one code point (0-255) per byte.
            Origin::Default => s
                .chars()
                .map(|c| u8::try_from(u32::from(c)).ok())
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| self.problem(expected, "the default has a code point above 255")),
        }
    }

    fn record(
        &mut self,
        r: &'p Record,
        json: &'j Json<'j>,
        origin: Origin,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let Json::Object(members) = json else {
            return Err(self.mismatch(format!("a record {} (an object)", r.name), json));
        };
        let mut used = Used::new(members.len());
        for field in &r.fields {
            let found = members.iter().position(|(k, _)| {
                *k == field.name.as_str() || field.aliases.iter().any(|a| a == k)
            });
            self.path.push(Step::Field(&field.name));
            let result = match found {
                Some(i) => {
                    used.set(i);
                    self.value(field.node, &members[i].1, origin, out)
                }
                None => match &field.default {
                    Some(d) => match &d.encoded {
                        Some(bytes) => {
                            out.extend_from_slice(bytes);
                            Ok(())
                        }
                        None => self.default(field.node, &d.text, out),
                    },
                    None => Err(self.problem(
                        format!("field `{}` of record {}", field.name, r.name),
                        "it is missing and the schema gives it no default",
                    )),
                },
            };
            self.path.pop();
            result?;
        }
        if let Some(i) = used.first_unset() {
            return Err(self.problem(
                r.with_fields.as_str(),
                format!("member {} is not one of them", quoted(&members[i].0)),
            ));
        }
        Ok(())
    }

    /// A default that did not encode when the schema was compiled: read
    /// again here so that its error names where in the payload it was
    /// needed.
    fn default(&self, node: NodeId, text: &str, out: &mut Vec<u8>) -> Result<()> {
        let json = json::parse(text).map_err(EncodeError::Encode)?;
        Encoder::new(self.plan, Some(self.path())).value(node, &json, Origin::Default, out)
    }
}

/// Which members of an object a record's fields took: a bit set, on the
/// heap only for objects of more than 64 members.
enum Used {
    Small { bits: u64, len: usize },
    Large(Vec<bool>),
}

impl Used {
    fn new(len: usize) -> Used {
        if len <= 64 {
            Used::Small { bits: 0, len }
        } else {
            Used::Large(vec![false; len])
        }
    }

    fn set(&mut self, i: usize) {
        match self {
            Used::Small { bits, .. } => *bits |= 1 << i,
            Used::Large(v) => v[i] = true,
        }
    }

    fn first_unset(&self) -> Option<usize> {
        match self {
            Used::Small { bits, len } => {
                Some((!bits).trailing_zeros() as usize).filter(|i| i < len)
            }
            Used::Large(v) => v.iter().position(|u| !u),
        }
    }
}

/// A JSON string as an error shows it: quoted, at most 64 characters.
fn quoted(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((end, _)) => format!("\"{}…\"", &s[..end]),
        None => format!("\"{s}\""),
    }
}
