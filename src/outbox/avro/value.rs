//! JSON → Avro: the payload's JSON walked together with the schema into the
//! Avro value the schema describes. The rules (docs/schema-registry.md says
//! the same for users):
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

use std::collections::HashMap;

use apache_avro::schema::{Name, Namespace, RecordSchema, Schema};
use apache_avro::types::Value;
use base64::Engine;

use crate::outbox::avro::error::EncodeError;
use crate::outbox::avro::json::{self, Json};
use crate::outbox::avro::{decimal, logical};

/// Where the JSON came from: the payload, or a field default in the schema
/// (which Avro reads by other rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Payload,
    Default,
}

pub(super) struct Mapper<'s> {
    names: &'s HashMap<Name, Schema>,
    /// `$`, `.field`, `[3]`, `["key"]`: where in the payload we are.
    path: Vec<String>,
}

type Result<T> = std::result::Result<T, EncodeError>;

impl<'s> Mapper<'s> {
    pub(super) fn new(names: &'s HashMap<Name, Schema>) -> Mapper<'s> {
        Mapper {
            names,
            path: Vec::new(),
        }
    }

    /// The value of `json` for `schema`; `ns` is the enclosing namespace.
    pub(super) fn map(
        &mut self,
        schema: &Schema,
        ns: &Namespace,
        json: &Json<'_>,
    ) -> Result<Value> {
        self.value(schema, ns, json, Origin::Payload)
    }

    fn path(&self) -> String {
        let mut p = String::from("$");
        for s in &self.path {
            p.push_str(s);
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
        schema: &Schema,
        ns: &Namespace,
        json: &Json<'_>,
        origin: Origin,
    ) -> Result<Value> {
        let names = self.names;
        match schema {
            Schema::Ref { name } => {
                let full = name.fully_qualified_name(ns);
                let target = names.get(&full).ok_or_else(|| {
                    EncodeError::Encode(format!("the schema refers to an unknown type {full}"))
                })?;
                self.value(target, ns, json, origin)
            }
            Schema::Null => match json {
                Json::Null => Ok(Value::Null),
                j => Err(self.mismatch("null", j)),
            },
            Schema::Boolean => match json {
                Json::Bool(b) => Ok(Value::Boolean(*b)),
                j => Err(self.mismatch("a boolean", j)),
            },
            Schema::Int => self.integer::<i32>(json, "an int (32-bit integer)").map(Value::Int),
            Schema::Long => self.integer::<i64>(json, "a long (64-bit integer)").map(Value::Long),
            Schema::Float => match json {
                Json::Number(n) => n
                    .parse::<f32>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(Value::Float)
                    .ok_or_else(|| self.problem("a float", format!("{n} is out of its range"))),
                j => Err(self.mismatch("a float (a number)", j)),
            },
            Schema::Double => match json {
                Json::Number(n) => n
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(Value::Double)
                    .ok_or_else(|| self.problem("a double", format!("{n} is out of its range"))),
                j => Err(self.mismatch("a double (a number)", j)),
            },
            Schema::String => match json {
                Json::String(s) => Ok(Value::String(s.to_string())),
                j => Err(self.mismatch("a string", j)),
            },
            Schema::Bytes => self.bytes(json, origin, "bytes (a base64 string)").map(Value::Bytes),
            Schema::Fixed(f) => {
                let expected = format!("fixed {} of {} bytes (a base64 string)", f.name, f.size);
                let b = self.bytes(json, origin, &expected)?;
                if b.len() != f.size {
                    return Err(self.problem(expected, format!("it decodes to {} bytes", b.len())));
                }
                Ok(Value::Fixed(f.size, b))
            }
            Schema::Enum(e) => match json {
                Json::String(s) => match e.symbols.iter().position(|x| x == s.as_ref()) {
                    Some(i) => Ok(Value::Enum(i as u32, s.to_string())),
                    None => Err(self.problem(
                        format!("a symbol of enum {}: {}", e.name, e.symbols.join(", ")),
                        format!("found {}", quoted(s)),
                    )),
                },
                j => Err(self.mismatch(format!("a symbol of enum {} (a string)", e.name), j)),
            },
            Schema::Array(a) => match json {
                Json::Array(items) => {
                    let mut out = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        self.path.push(format!("[{i}]"));
                        let v = self.value(&a.items, ns, item, origin);
                        self.path.pop();
                        out.push(v?);
                    }
                    Ok(Value::Array(out))
                }
                j => Err(self.mismatch("an array", j)),
            },
            Schema::Map(m) => match json {
                Json::Object(members) => {
                    let mut out = HashMap::with_capacity(members.len());
                    for (k, item) in members {
                        self.path.push(format!("[{}]", quoted(k)));
                        let v = self.value(&m.types, ns, item, origin);
                        self.path.pop();
                        out.insert(k.to_string(), v?);
                    }
                    Ok(Value::Map(out))
                }
                j => Err(self.mismatch("a map (an object)", j)),
            },
            Schema::Record(r) => self.record(r, ns, json, origin),
            Schema::Union(u) => {
                let branches = u.variants();
                if let Json::Null = json {
                    return match branches.iter().position(|b| *b == Schema::Null) {
                        Some(i) => Ok(Value::Union(i as u32, Box::new(Value::Null))),
                        None => Err(self.mismatch(union_expected(branches), json)),
                    };
                }
                if origin == Origin::Default {
                    // Avro: a union's default is a value of its first branch.
                    let v = self.value(&branches[0], ns, json, origin)?;
                    return Ok(Value::Union(0, Box::new(v)));
                }
                let candidates: Vec<usize> = (0..branches.len())
                    .filter(|&i| branches[i] != Schema::Null)
                    .collect();
                let mut first_error = None;
                for &i in &candidates {
                    match self.value(&branches[i], ns, json, origin) {
                        Ok(v) => return Ok(Value::Union(i as u32, Box::new(v))),
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                // One branch besides null (an optional value): its own error
                // says exactly where inside it the payload differs.
                match (candidates.len(), first_error) {
                    (1, Some(e)) => Err(e),
                    _ => Err(self.mismatch(union_expected(branches), json)),
                }
            }
            Schema::Decimal(d) => {
                let text = match json {
                    Json::Number(n) => *n,
                    Json::String(s) => s.as_ref(),
                    j => {
                        return Err(self.mismatch(
                            format!("a decimal({}, {}) (a number or a string)", d.precision, d.scale),
                            j,
                        ))
                    }
                };
                let bytes = decimal::unscaled_bytes(text, d.precision, d.scale).map_err(|reason| {
                    self.problem(format!("a decimal({}, {})", d.precision, d.scale), reason)
                })?;
                if let Schema::Fixed(f) = d.inner.as_ref() {
                    if bytes.len() > f.size {
                        return Err(self.problem(
                            format!("a decimal in fixed {} of {} bytes", f.name, f.size),
                            format!("`{text}` needs {} bytes", bytes.len()),
                        ));
                    }
                }
                Ok(Value::Decimal(apache_avro::Decimal::from(bytes)))
            }
            Schema::Uuid => match json {
                Json::String(s) if logical::is_uuid(s) => Ok(Value::String(s.to_string())),
                j => Err(self.mismatch("a uuid (a string like 123e4567-e89b-12d3-a456-426614174000)", j)),
            },
            Schema::Date => match json {
                Json::String(s) => logical::date_days(s)
                    .map(Value::Date)
                    .ok_or_else(|| self.mismatch("a date (YYYY-MM-DD or days since 1970-01-01)", json)),
                Json::Number(_) => self.integer::<i32>(json, "a date (days since 1970-01-01)").map(Value::Date),
                j => Err(self.mismatch("a date (YYYY-MM-DD or days since 1970-01-01)", j)),
            },
            Schema::TimeMillis => match json {
                Json::String(s) => logical::time_of_day_us(s)
                    .filter(|us| us % 1000 == 0)
                    .map(|us| Value::TimeMillis((us / 1000) as i32))
                    .ok_or_else(|| self.mismatch("a time-millis (HH:MM:SS[.fff])", json)),
                _ => self.integer::<i32>(json, "a time-millis (HH:MM:SS[.fff] or milliseconds)").map(Value::TimeMillis),
            },
            Schema::TimeMicros => match json {
                Json::String(s) => logical::time_of_day_us(s)
                    .map(Value::TimeMicros)
                    .ok_or_else(|| self.mismatch("a time-micros (HH:MM:SS[.ffffff])", json)),
                _ => self.integer::<i64>(json, "a time-micros (HH:MM:SS[.ffffff] or microseconds)").map(Value::TimeMicros),
            },
            Schema::TimestampMillis => self.timestamp(json, false, 1000, "a timestamp-millis (ISO 8601 or epoch milliseconds)").map(Value::TimestampMillis),
            Schema::TimestampMicros => self.timestamp(json, false, 1, "a timestamp-micros (ISO 8601 or epoch microseconds)").map(Value::TimestampMicros),
            Schema::LocalTimestampMillis => self.timestamp(json, true, 1000, "a local-timestamp-millis (ISO 8601 without a zone, or milliseconds)").map(Value::LocalTimestampMillis),
            Schema::LocalTimestampMicros => self.timestamp(json, true, 1, "a local-timestamp-micros (ISO 8601 without a zone, or microseconds)").map(Value::LocalTimestampMicros),
            Schema::TimestampNanos => self.integer::<i64>(json, "a timestamp-nanos (epoch nanoseconds)").map(Value::TimestampNanos),
            Schema::LocalTimestampNanos => self.integer::<i64>(json, "a local-timestamp-nanos (nanoseconds)").map(Value::LocalTimestampNanos),
            Schema::Duration | Schema::BigDecimal => Err(self.problem(
                "a duration or big-decimal",
                "outboxd does not map JSON to these logical types; use a record, a long or a decimal",
            )),
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
        r: &RecordSchema,
        ns: &Namespace,
        json: &Json<'_>,
        origin: Origin,
    ) -> Result<Value> {
        let Json::Object(members) = json else {
            return Err(self.mismatch(format!("a record {} (an object)", r.name), json));
        };
        let inner_ns = r.name.fully_qualified_name(ns).namespace;
        let mut used = vec![false; members.len()];
        let mut out = Vec::with_capacity(r.fields.len());
        for field in &r.fields {
            let found = members.iter().position(|(k, _)| {
                k == &field.name
                    || field
                        .aliases
                        .as_ref()
                        .is_some_and(|a| a.iter().any(|x| x == k))
            });
            self.path.push(format!(".{}", field.name));
            let v = match found {
                Some(i) => {
                    used[i] = true;
                    self.value(&field.schema, &inner_ns, &members[i].1, origin)
                }
                None => match &field.default {
                    Some(default) => self.default(&field.schema, &inner_ns, default),
                    None => Err(self.problem(
                        format!("field `{}` of record {}", field.name, r.name),
                        "it is missing and the schema gives it no default",
                    )),
                },
            };
            self.path.pop();
            out.push((field.name.clone(), v?));
        }
        if let Some(i) = used.iter().position(|u| !u) {
            let fields: Vec<&str> = r.fields.iter().map(|f| f.name.as_str()).collect();
            return Err(self.problem(
                format!("record {} with the fields {}", r.name, fields.join(", ")),
                format!("member {} is not one of them", quoted(&members[i].0)),
            ));
        }
        Ok(Value::Record(out))
    }

    /// A field's default, by Avro's rules for defaults.
    fn default(
        &mut self,
        schema: &Schema,
        ns: &Namespace,
        default: &serde_json::Value,
    ) -> Result<Value> {
        let text = default.to_string();
        let json = json::parse(&text).map_err(EncodeError::Encode)?;
        self.value(schema, ns, &json, Origin::Default)
    }
}

fn union_expected(branches: &[Schema]) -> String {
    let names: Vec<String> = branches.iter().map(branch_name).collect();
    format!("one of the union's branches [{}]", names.join(", "))
}

fn branch_name(s: &Schema) -> String {
    match s {
        Schema::Record(r) => r.name.to_string(),
        Schema::Enum(e) => e.name.to_string(),
        Schema::Fixed(f) => f.name.to_string(),
        Schema::Ref { name } => name.to_string(),
        Schema::Array(_) => "array".into(),
        Schema::Map(_) => "map".into(),
        other => format!("{:?}", apache_avro::schema::SchemaKind::from(other)).to_lowercase(),
    }
}

/// A JSON string as an error shows it: quoted, at most 64 characters.
fn quoted(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((end, _)) => format!("\"{}…\"", &s[..end]),
        None => format!("\"{s}\""),
    }
}
