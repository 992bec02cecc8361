//! The text forms of Avro's logical types: ISO 8601 dates, times and
//! timestamps, and UUIDs. Epoch numbers are read by the caller.

use crate::outbox::record::{days_from_civil, days_in_month, parse_timestamp_text_us};

/// `YYYY-MM-DD` as days since 1970-01-01.
pub(super) fn date_days(s: &str) -> Option<i32> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        s.get(r.clone())
            .filter(|t| t.bytes().all(|c| c.is_ascii_digit()))?
            .parse()
            .ok()
    };
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&m) || d < 1 || d > days_in_month(y, m) {
        return None;
    }
    i32::try_from(days_from_civil(y, m, d)).ok()
}

/// `HH:MM:SS[.ffffff]` as microseconds after midnight (fractions beyond
/// microseconds are refused, not cut).
pub(super) fn time_of_day_us(s: &str) -> Option<i64> {
    let (hms, frac) = s.split_once('.').unwrap_or((s, ""));
    let b = hms.as_bytes();
    if b.len() != 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        hms.get(r)
            .filter(|t| t.bytes().all(|c| c.is_ascii_digit()))?
            .parse()
            .ok()
    };
    let (h, m, sec) = (num(0..2)?, num(3..5)?, num(6..8)?);
    if h > 23 || m > 59 || sec > 59 {
        return None;
    }
    if s.contains('.') && (frac.is_empty() || frac.len() > 6) {
        return None;
    }
    if !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mut us: i64 = 0;
    for i in 0..6 {
        us = us * 10 + frac.as_bytes().get(i).map_or(0, |c| i64::from(c - b'0'));
    }
    Some(((h * 60 + m) * 60 + sec) * 1_000_000 + us)
}

/// An ISO 8601 / RFC 3339 timestamp (`2026-12-04T20:22:42.123Z`, an offset
/// `+01:00`, or PostgreSQL's `2026-12-04 20:22:42.123+00`) as microseconds
/// since the epoch. `local`: the wall-clock time of a `local-timestamp`, so
/// no zone may be given.
pub(super) fn timestamp_us(s: &str, local: bool) -> Option<i64> {
    if local && has_zone(s) {
        return None;
    }
    // More than microseconds would be cut: refuse instead.
    if let Some(dot) = s.find('.') {
        let digits = s[dot + 1..].bytes().take_while(u8::is_ascii_digit).count();
        if digits > 6 {
            return None;
        }
    }
    parse_timestamp_text_us(s.as_bytes())
}

/// A zone after the time of day: `Z`, or a sign after the date.
fn has_zone(s: &str) -> bool {
    s.ends_with(['Z', 'z']) || s.get(10..).is_some_and(|t| t.contains(['+', '-']))
}

/// The canonical 8-4-4-4-12 hexadecimal form.
pub(super) fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(date_days("1970-01-01"), Some(0));
        assert_eq!(date_days("2026-12-04"), Some(20_791));
        assert_eq!(date_days("1969-12-31"), Some(-1));
        assert_eq!(date_days("2026-02-29"), None);
        assert_eq!(date_days("2026-1-04"), None);
    }

    #[test]
    fn times() {
        assert_eq!(time_of_day_us("00:00:00"), Some(0));
        assert_eq!(time_of_day_us("01:02:03.5"), Some(3_723_500_000));
        assert_eq!(time_of_day_us("23:59:59.999999"), Some(86_399_999_999));
        assert_eq!(time_of_day_us("24:00:00"), None);
        assert_eq!(time_of_day_us("12:00:00.1234567"), None);
    }

    #[test]
    fn timestamps() {
        assert_eq!(timestamp_us("1970-01-01T00:00:01Z", false), Some(1_000_000));
        assert_eq!(
            timestamp_us("2026-12-04T20:22:42.123456+01:00", false),
            Some(1_796_415_762_123_456 - 3_600_000_000)
        );
        assert_eq!(
            timestamp_us("2026-12-04 20:22:42.1+00", false),
            Some(1_796_415_762_100_000)
        );
        assert_eq!(timestamp_us("2026-12-04T20:22:42.1234567Z", false), None);
        assert_eq!(
            timestamp_us("2026-12-04T20:22:42", true),
            Some(1_796_415_762_000_000)
        );
        assert_eq!(timestamp_us("2026-12-04T20:22:42Z", true), None);
        assert_eq!(timestamp_us("yesterday", false), None);
    }

    #[test]
    fn uuids() {
        assert!(is_uuid("123e4567-e89b-12d3-a456-426614174000"));
        assert!(!is_uuid("123e4567e89b12d3a456426614174000"));
        assert!(!is_uuid("123e4567-e89b-12d3-a456-42661417400g"));
    }
}
