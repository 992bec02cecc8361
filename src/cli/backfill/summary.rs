//! What a backfill did, counted as it goes and printed as its last line.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// What a backfill did; printed as its last line whatever happened.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub dry_run: bool,
    /// `schema.table`, the time column and the window as PostgreSQL read it.
    pub table: String,
    pub time_column: String,
    pub since: String,
    pub until: Option<String>,
    pub read: u64,
    /// Acked per topic (in a dry run: would be sent).
    pub published: BTreeMap<String, u64>,
    /// Rows the mapper refused that went to the dead-letter topic (in a dry
    /// run: rows the mapper refuses).
    pub dead_lettered: u64,
    pub unmappable: u64,
    /// Records Kafka did not acknowledge.
    pub failed: u64,
    pub elapsed: Duration,
    /// Why the backfill ended before the end of the window.
    pub stopped: Option<String>,
}

impl Summary {
    pub(crate) fn published_total(&self) -> u64 {
        self.published.values().sum()
    }

    /// Rows read but neither published, dead-lettered nor failed: the
    /// backfill stopped before sending them (or, under `on_error = "stop"`,
    /// the row it stopped at).
    pub fn not_sent(&self) -> u64 {
        if self.dry_run {
            return 0;
        }
        self.read
            .saturating_sub(self.published_total() + self.dead_lettered + self.failed)
    }

    /// True when every row read reached Kafka (or the dead-letter topic).
    pub fn complete(&self) -> bool {
        self.stopped.is_none() && self.failed == 0 && self.not_sent() == 0
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let until = self.until.as_deref().unwrap_or("now");
        write!(
            f,
            "{}: {} rows with {} from {} to {}: read {}, ",
            if self.dry_run {
                "backfill dry run"
            } else {
                "backfill"
            },
            self.table,
            self.time_column,
            self.since,
            until,
            self.read
        )?;
        let topics: Vec<String> = self
            .published
            .iter()
            .map(|(t, n)| format!("{t}: {n}"))
            .collect();
        let verb = if self.dry_run {
            "would publish"
        } else {
            "published"
        };
        write!(
            f,
            "{verb} {} ({})",
            self.published_total(),
            topics.join(", ")
        )?;
        if self.dry_run {
            write!(f, ", unmappable {}", self.unmappable)?;
        } else {
            write!(
                f,
                ", dead-lettered {}, failed {}, not sent {}",
                self.dead_lettered,
                self.failed,
                self.not_sent()
            )?;
        }
        write!(f, ", in {:.1}s", self.elapsed.as_secs_f64())?;
        if let Some(why) = &self.stopped {
            write!(f, "; stopped: {why}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_what_was_not_sent() {
        let mut s = Summary {
            table: "public.outbox".into(),
            time_column: "created_at".into(),
            since: "2026-12-01 10:00:00+00".into(),
            read: 10,
            dead_lettered: 1,
            failed: 2,
            ..Summary::default()
        };
        s.published.insert("t.order".into(), 3);
        s.published.insert("t.payment".into(), 2);
        assert_eq!(s.not_sent(), 2);
        assert!(!s.complete());
        assert_eq!(
            s.to_string(),
            "backfill: public.outbox rows with created_at from 2026-12-01 10:00:00+00 to now: \
             read 10, published 5 (t.order: 3, t.payment: 2), dead-lettered 1, failed 2, \
             not sent 2, in 0.0s"
        );
    }
}
