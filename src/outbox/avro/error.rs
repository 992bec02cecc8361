//! Why a payload cannot be encoded with a schema: shared by the Avro schema,
//! the JSON to Avro mapping and the JSON Schema check.

use std::fmt;

/// Why a payload cannot be encoded with a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EncodeError {
    /// The payload is not UTF-8 JSON.
    NotJson(String),
    /// The payload is JSON that does not fit the schema: at `path` (`$` is
    /// the payload, `$.order.lines[2]` a part of it) the schema expects
    /// `expected`, and the payload has something else (`problem`).
    Mismatch {
        path: String,
        expected: String,
        problem: String,
    },
    /// The payload is JSON its JSON Schema rejects: at `pointer` (RFC 6901,
    /// `""` is the payload), the keyword `keyword` fails for `reason`.
    Invalid {
        pointer: String,
        keyword: String,
        reason: String,
    },
    /// The Avro library refused the value built for the schema (a bug here,
    /// or a schema feature the mapping does not cover).
    Encode(String),
}

impl EncodeError {
    /// The `reason` label of `outboxd_value_encode_failures_total`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            EncodeError::NotJson(_) => "not_json",
            EncodeError::Mismatch { .. } => "mismatch",
            EncodeError::Invalid { .. } => "invalid",
            EncodeError::Encode(_) => "encode",
        }
    }
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::NotJson(reason) => f.write_str(reason),
            EncodeError::Mismatch {
                path,
                expected,
                problem,
            } => write!(f, "at {path} the schema expects {expected}: {problem}"),
            EncodeError::Invalid {
                pointer,
                keyword,
                reason,
            } => write!(
                f,
                "at JSON pointer \"{pointer}\" the schema's `{keyword}` keyword fails: {reason}"
            ),
            EncodeError::Encode(reason) => write!(f, "cannot encode: {reason}"),
        }
    }
}
