//! Command-line entry points. The binary only parses arguments, sets up
//! logging and adds context to errors; the work happens in these functions.

pub mod audit;
pub mod backfill;
pub mod check;
pub mod health;
pub mod malloc;
mod progress_bar;
pub mod settings;
pub mod tail;
