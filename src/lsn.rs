//! PostgreSQL log sequence numbers.
//!
//! An LSN is a 64-bit byte position in the WAL, written by PostgreSQL as two
//! hexadecimal halves `X/Y`. Positions are compared numerically; the text form
//! is only for humans, SQL and replication commands.

use std::fmt;
use std::str::FromStr;

/// A WAL position. `Lsn(0)` is PostgreSQL's `0/0` ("invalid"/"start").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);
    /// Above every position: no ceiling.
    pub const MAX: Lsn = Lsn(u64::MAX);
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Self {
        Lsn(v)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid LSN {0:?}: expected two hexadecimal halves like 16/B374D848")]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_string());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let valid =
            |h: &str| !h.is_empty() && h.len() <= 8 && h.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid(hi) || !valid(lo) {
            return Err(err());
        }
        let hi = u64::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u64::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((hi << 32) | lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_text_form() {
        for s in ["0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "0/1"] {
            let lsn: Lsn = s.parse().unwrap();
            assert_eq!(lsn.to_string(), s);
        }
        assert_eq!("16/B374D848".parse::<Lsn>().unwrap(), Lsn(0x16_B374_D848));
    }

    #[test]
    fn rejects_malformed_text() {
        for s in ["", "/", "1/", "/1", "1-2", "G/0", "123456789/0", "1/2/3"] {
            assert!(s.parse::<Lsn>().is_err(), "{s} should be rejected");
        }
    }
}
