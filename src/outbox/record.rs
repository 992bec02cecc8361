//! The Kafka record an outbox event becomes, and the timestamp conversions
//! used to fill it: PostgreSQL `timestamptz` text to epoch milliseconds, and
//! epoch milliseconds to ISO-8601 UTC for the envelope.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;

/// One record header: its name and its value, `None` for a header whose
/// value is null (Kafka tells a null value from an empty one; Debezium sends
/// null for a NULL column placed as a header). `Option<Bytes>` is no bigger
/// than `Bytes` (checked below), so the common non-null header costs nothing
/// more.
pub(crate) type RecordHeader = (Arc<str>, Option<Bytes>);

const _: () = assert!(std::mem::size_of::<Option<Bytes>>() == std::mem::size_of::<Bytes>());

/// One record ready for the producer. Cheap to build: text values are
/// [`Bytes`] slices of the WAL frame they arrived in, topic and header names
/// are shared strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KafkaRecord {
    /// Interned by the mapper: events for the same topic share one string.
    pub topic: Arc<str>,
    /// The key column's text (the aggregate id); `None` when it is NULL, in
    /// which case Kafka spreads the records and per-aggregate order is lost.
    pub key: Option<Bytes>,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
    /// `id` (the event id) first, then `routing.additional_headers` in the
    /// config's order, then the entries of the `headers` column. A NULL id
    /// or additional-header column gives a header with a null value, as
    /// Debezium's router sends it; `null` entries of the `headers` column
    /// are left out.
    pub headers: Vec<RecordHeader>,
    /// Commit time of the transaction, or the `timestamp` column when one is
    /// configured and not NULL.
    pub timestamp_ms: Option<i64>,
    /// The event id, for logs and dead-letter headers.
    pub event_id: Option<Bytes>,
    /// Approximate bytes (key + value + header names and values), for
    /// in-flight accounting.
    pub size: usize,
}

impl KafkaRecord {
    /// The value of the first header with this name: `None` when there is
    /// no such header, `Some(None)` when its value is null.
    #[cfg(test)]
    pub(crate) fn header_value(&self, name: &str) -> Option<Option<&Bytes>> {
        self.headers
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v.as_ref())
    }

    /// The first header with this name, if it has a value (not null).
    #[cfg(test)]
    pub(crate) fn header(&self, name: &str) -> Option<&Bytes> {
        self.header_value(name).flatten()
    }

    /// key + value + headers, as stored in [`KafkaRecord::size`].
    pub(crate) fn compute_size(
        key: Option<&Bytes>,
        value: Option<&Bytes>,
        headers: &[RecordHeader],
    ) -> usize {
        key.map_or(0, Bytes::len)
            + value.map_or(0, Bytes::len)
            + headers
                .iter()
                .map(|(n, v)| n.len() + v.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()
    }
}

const MS_PER_DAY: i64 = 86_400_000;

/// Parses a timestamp column's text to milliseconds since the Unix epoch.
///
/// Accepts what PostgreSQL prints for `timestamptz` in the ISO date style
/// (`2026-11-30 02:04:20.875758+00`, offsets `+03`, `-05:30`, `+00:53:28`),
/// the same with `T` and/or `Z` (ISO-8601 / RFC 3339 text), `timestamp`
/// without a zone (taken as UTC), and a plain integer (a `bigint` column of
/// epoch milliseconds). Fractions beyond milliseconds are truncated.
/// Returns `None` for anything else, including `infinity` and BC dates.
pub(crate) fn parse_timestamp_ms(text: &[u8]) -> Option<i64> {
    let s = text.trim_ascii();
    if s.is_empty() {
        return None;
    }
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
        return std::str::from_utf8(s).ok()?.parse().ok();
    }
    parse_timestamp_text_us(s).map(|us| us.div_euclid(1000))
}

/// The text forms [`parse_timestamp_ms`] reads (not the plain integer), in
/// microseconds since the epoch; fractions beyond microseconds are
/// truncated.
pub(crate) fn parse_timestamp_text_us(s: &[u8]) -> Option<i64> {
    let mut p = Cursor { s, i: 0 };
    let year = p.number(4, 9)?;
    p.expect(b'-')?;
    let month = p.number(2, 2)?;
    p.expect(b'-')?;
    let day = p.number(2, 2)?;
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    match p.peek() {
        Some(b' ' | b'T' | b't') => p.i += 1,
        _ => return None,
    }
    let hour = p.number(2, 2)?;
    p.expect(b':')?;
    let minute = p.number(2, 2)?;
    p.expect(b':')?;
    let second = p.number(2, 2)?;
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut micros = 0;
    if p.peek() == Some(b'.') {
        p.i += 1;
        let start = p.i;
        while let Some(d) = p.peek().filter(u8::is_ascii_digit) {
            if p.i - start < 6 {
                micros = micros * 10 + i64::from(d - b'0');
            }
            p.i += 1;
        }
        let n = p.i - start;
        if n == 0 {
            return None;
        }
        for _ in n..6 {
            micros *= 10;
        }
    }
    let offset_s = match p.peek() {
        None => 0,
        Some(b'Z' | b'z') => {
            p.i += 1;
            0
        }
        Some(sign @ (b'+' | b'-')) => {
            p.i += 1;
            let h = p.number(2, 2)?;
            let mut secs = h * 3600;
            for unit in [60, 1] {
                if p.peek() == Some(b':') {
                    p.i += 1;
                }
                match p.peek() {
                    Some(d) if d.is_ascii_digit() => secs += p.number(2, 2)? * unit,
                    _ => break,
                }
            }
            if h > 15 {
                return None;
            }
            if sign == b'-' {
                -secs
            } else {
                secs
            }
        }
        Some(_) => return None,
    };
    if p.i != s.len() {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    secs.checked_mul(1_000_000)?.checked_add(micros)
}

/// Appends `ms` (since the Unix epoch) as ISO-8601 UTC with milliseconds,
/// `2026-11-30T02:04:20.875Z`, the form JavaScript's `toISOString` gives.
pub(crate) fn write_iso8601_ms(buf: &mut Vec<u8>, ms: i64) {
    let days = ms.div_euclid(MS_PER_DAY);
    let in_day = ms.rem_euclid(MS_PER_DAY);
    let (y, m, d) = civil_from_days(days);
    let (h, rest) = (in_day / 3_600_000, in_day % 3_600_000);
    let (min, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1000, rest % 1000);
    // Writing to a Vec cannot fail.
    let _ = if (0..=9999).contains(&y) {
        write!(buf, "{y:04}")
    } else {
        write!(buf, "{}{:06}", if y < 0 { '-' } else { '+' }, y.abs())
    };
    let _ = write!(buf, "-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z");
}

/// Appends `us` (microseconds since the Unix epoch, as PostgreSQL keeps
/// commit times) as RFC 3339 UTC with microseconds,
/// `2026-11-30T02:04:20.875758Z`: the CloudEvents `time`.
pub(crate) fn write_rfc3339_us(buf: &mut Vec<u8>, us: i64) {
    let ms = us.div_euclid(1000);
    write_iso8601_ms(buf, ms);
    // Replace the trailing "Z" with the remaining three digits and the "Z".
    buf.pop();
    let _ = write!(buf, "{:03}Z", us.rem_euclid(1000));
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// `min..=max` ASCII digits.
    fn number(&mut self, min: usize, max: usize) -> Option<i64> {
        let start = self.i;
        let mut n: i64 = 0;
        while self.i - start < max {
            match self.peek() {
                Some(d) if d.is_ascii_digit() => {
                    n = n * 10 + i64::from(d - b'0');
                    self.i += 1;
                }
                _ => break,
            }
        }
        (self.i - start >= min).then_some(n)
    }
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

pub(crate) fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iso(ms: i64) -> String {
        let mut b = Vec::new();
        write_iso8601_ms(&mut b, ms);
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn parses_postgres_timestamptz() {
        // 2026-11-30T02:04:20.875Z
        let base = 1_796_004_260_875;
        assert_eq!(
            parse_timestamp_ms(b"2026-11-30 02:04:20.875758+00"),
            Some(base)
        );
        assert_eq!(
            parse_timestamp_ms(b"2026-11-30 05:04:20.875758+03"),
            Some(base)
        );
        assert_eq!(
            parse_timestamp_ms(b"2026-11-29 20:34:20.875-05:30"),
            Some(base)
        );
        assert_eq!(
            parse_timestamp_ms(b"2026-11-30 02:04:20.8+00"),
            Some(base - 75)
        );
        assert_eq!(
            parse_timestamp_ms(b"2026-11-30 02:04:20+00"),
            Some(base - 875)
        );
        assert_eq!(parse_timestamp_ms(b"2026-11-30T02:04:20.875Z"), Some(base));
        assert_eq!(parse_timestamp_ms(b"2026-11-30 02:04:20.875"), Some(base));
        assert_eq!(
            parse_timestamp_ms(b"2026-11-30 02:57:48.875+00:53:28"),
            Some(base)
        );
        assert_eq!(parse_timestamp_ms(b"1796004260875"), Some(base));
        assert_eq!(parse_timestamp_ms(b"-1"), Some(-1));
        assert_eq!(parse_timestamp_ms(b"1970-01-01 00:00:00+00"), Some(0));
        assert_eq!(
            parse_timestamp_ms(b"2024-02-29 00:00:00+00"),
            Some(1_709_164_800_000)
        );
    }

    #[test]
    fn rejects_other_text() {
        for bad in [
            &b""[..],
            b"infinity",
            b"-infinity",
            b"2026-11-30",
            b"2026-13-01 00:00:00+00",
            b"2025-02-29 00:00:00+00",
            b"2026-11-30 24:00:00+00",
            b"2026-11-30 02:04:20.+00",
            b"2026-11-30 02:04:20+00 BC",
            b"30/11/2026 02:04:20",
            b"12.5",
        ] {
            assert_eq!(
                parse_timestamp_ms(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn formats_iso8601() {
        assert_eq!(iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso(1_796_004_260_875), "2026-11-30T02:04:20.875Z");
        assert_eq!(iso(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(iso(1_709_164_800_000), "2024-02-29T00:00:00.000Z");
    }

    #[test]
    fn formats_rfc3339_microseconds() {
        let us = |v: i64| {
            let mut b = Vec::new();
            write_rfc3339_us(&mut b, v);
            String::from_utf8(b).unwrap()
        };
        assert_eq!(us(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(us(1_796_004_260_875_758), "2026-11-30T02:04:20.875758Z");
        assert_eq!(us(-1), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn parse_and_format_round_trip() {
        for ms in [
            0,
            1,
            951_782_400_000,
            4_102_444_799_999,
            -62_135_596_800_000,
        ] {
            let text = iso(ms);
            assert_eq!(parse_timestamp_ms(text.as_bytes()), Some(ms), "{text}");
        }
    }
}
