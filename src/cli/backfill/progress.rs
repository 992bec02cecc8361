//! The progress bar of a backfill: on stderr, and only when stderr is a
//! terminal (a log file or a pipe gets the summary line alone).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar when stderr is a terminal, else nothing.
    pub fn for_stderr() -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress::hidden();
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        Progress { bar: Some(bar) }
    }

    pub(crate) fn hidden() -> Progress {
        Progress { bar: None }
    }

    pub(crate) fn is_visible(&self) -> bool {
        self.bar.is_some()
    }

    /// Rows in the window, counted before reading (rows written meanwhile
    /// may take the bar past it).
    pub(crate) fn set_total(&self, rows: u64) {
        if let Some(bar) = &self.bar {
            bar.set_length(rows);
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} rows ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
        }
    }

    pub(crate) fn inc(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
