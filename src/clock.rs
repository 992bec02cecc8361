//! Wall-clock time as the position ledger, the metrics and the
//! replication protocol count it: microseconds since an epoch. One place,
//! so that a clock set before the epoch reads the same (0) everywhere.

use std::time::{SystemTime, UNIX_EPOCH};

/// `at`, in microseconds since the Unix epoch; 0 before it.
pub fn unix_micros(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Now, in microseconds since the Unix epoch.
pub fn now_unix_micros() -> i64 {
    unix_micros(SystemTime::now())
}
