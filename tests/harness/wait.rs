//! Waiting for a condition in a test, and the tail of a log for a
//! failure message.

use std::time::{Duration, Instant};

pub fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    wait_for_or(what, timeout, cond, String::new)
}

/// As [`wait_for`], the failure message ending with `context()`: what the
/// system showed when the wait ran out.
pub fn wait_for_or(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
    context: impl FnOnce() -> String,
) {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() >= timeout {
            let context = context();
            if context.is_empty() {
                panic!("timed out after {timeout:?} waiting for {what}");
            }
            // Said again after a long context, whose end is what CI shows.
            panic!("timed out after {timeout:?} waiting for {what}\n{context}\n^ timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last `n` lines of `text`, for failure messages.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
