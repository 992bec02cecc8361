//! The audit's exit codes, shared by the audit and its report.

/// Nothing missing, nothing out of order (and, exactly-once, nothing doubled).
pub const EXIT_CLEAN: u8 = 0;
/// Events are missing or out of order (or doubled, exactly-once).
pub const EXIT_FOUND: u8 = 1;
/// The audit could not compare: no rows left to compare with (the
/// insert-then-delete helper), or PostgreSQL or Kafka failed.
pub const EXIT_CANNOT: u8 = 3;
