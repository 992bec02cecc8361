//! Human-readable durations (`"500ms"`, `"1s"`, `"2m"`, `"1h"`) and byte sizes
//! (`"64MiB"`, or a plain integer of bytes), with serde helpers for use as
//! `#[serde(deserialize_with = "...")]`.
//!
//! Durations must carry a unit: a bare `5` could mean seconds or milliseconds
//! depending on which tool the reader last used, so it is rejected with a hint.
//! Sizes are 1024-based and spelled KiB/MiB/GiB; `MB` is rejected rather than
//! guessed, because 64MB and 64MiB differ by almost 5%.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};

const DURATION_HINT: &str = "a duration string such as \"500ms\", \"1s\", \"2m\" or \"1h\"";
const SIZE_HINT: &str =
    "a size such as \"64MiB\" (units B, KiB, MiB, GiB) or a plain integer number of bytes";

/// Parses `<integer><unit>` with unit `ms`, `s`, `m` or `h`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim_start());
    if num.is_empty() {
        return Err(format!("`{s}` is not {DURATION_HINT}"));
    }
    if unit.starts_with('.') {
        return Err(format!(
            "`{s}`: fractions are not supported; use a smaller unit (e.g. \"1500ms\" for 1.5s)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: number too large"))?;
    let scale_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => {
            return Err(format!(
                "`{s}` has no unit; write \"{n}s\" for seconds or \"{n}ms\" for milliseconds"
            ))
        }
        other => return Err(format!("`{s}`: unknown unit `{other}`; use ms, s, m or h")),
    };
    n.checked_mul(scale_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{s}`: duration too large"))
}

/// Parses `<integer>[ ]<unit>` with unit `B`, `KiB`, `MiB` or `GiB`, or a bare
/// integer of bytes.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim_start());
    if num.is_empty() {
        return Err(format!("`{s}` is not {SIZE_HINT}"));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: number too large"))?;
    let scale: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "K" | "KB" | "k" | "kB" | "M" | "MB" | "G" | "GB" => {
            return Err(format!(
                "`{s}`: ambiguous unit `{unit}`; sizes are 1024-based, write KiB, MiB or GiB"
            ))
        }
        other => {
            return Err(format!(
                "`{s}`: unknown unit `{other}`; use B, KiB, MiB or GiB"
            ))
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("`{s}`: size too large"))
}

/// Serde helper: a duration string (see [`parse_duration`]).
pub(crate) fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    d.deserialize_any(DurationVisitor)
}

/// Serde helper: an optional duration string (see [`parse_duration`]).
pub(crate) fn de_opt_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    d.deserialize_any(DurationVisitor).map(Some)
}

/// Serde helper: a size string or integer of bytes (see [`parse_size`]).
pub(crate) fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(SizeVisitor)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(DURATION_HINT)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "expected {DURATION_HINT}, found the bare number {v}; \
             quote it with a unit, e.g. \"{v}s\" or \"{v}ms\""
        )))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
        self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "expected {DURATION_HINT}, found the bare number {v}; \
             quote it with a unit, e.g. \"1500ms\""
        )))
    }
}

struct SizeVisitor;

impl Visitor<'_> for SizeVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SIZE_HINT)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse_size(v).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("size must not be negative, found {v}")))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 10 s "), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn duration_errors_explain() {
        assert!(parse_duration("5").unwrap_err().contains("\"5s\""));
        assert!(parse_duration("1.5s").unwrap_err().contains("1500ms"));
        assert!(parse_duration("3d")
            .unwrap_err()
            .contains("unknown unit `d`"));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("1234"), Ok(1234));
    }

    #[test]
    fn size_errors_explain() {
        assert!(parse_size("64MB").unwrap_err().contains("MiB"));
        assert!(parse_size("64TiB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("18446744073709551615GiB").is_err());
    }

    #[derive(Debug, serde::Deserialize)]
    struct T {
        #[serde(default, deserialize_with = "de_duration")]
        d: Duration,
        #[serde(default, deserialize_with = "de_size")]
        s: u64,
    }

    #[test]
    fn serde_helpers() {
        let t: T = toml::from_str("d = \"2m\"\ns = 1024").unwrap();
        assert_eq!((t.d, t.s), (Duration::from_secs(120), 1024));
        let t: T = toml::from_str("s = \"2KiB\"").unwrap();
        assert_eq!(t.s, 2048);
        let err = toml::from_str::<T>("d = 5").unwrap_err().to_string();
        assert!(
            err.contains("bare number 5") && err.contains("\"5s\""),
            "{err}"
        );
        assert!(toml::from_str::<T>("s = -5").is_err());
        assert!(toml::from_str::<T>("d = true").is_err());
    }
}
