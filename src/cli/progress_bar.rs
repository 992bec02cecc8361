//! The progress bar of `backfill` and `audit`: on stderr, and only when
//! stderr is a terminal (a log file or a pipe gets the summary or the
//! report alone). A backfill has one phase (rows); an audit one bar per
//! phase (rows, records, comparison).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Clone)]
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

    pub fn hidden() -> Progress {
        Progress { bar: None }
    }

    pub(crate) fn is_visible(&self) -> bool {
        self.bar.is_some()
    }

    /// A new phase: the bar starts over, `what` counted up to `total` when
    /// it is known.
    pub(crate) fn start_phase(&self, what: &str, total: Option<u64>) {
        if let Some(bar) = &self.bar {
            bar.reset();
            describe(bar, what, total);
        }
    }

    /// The total of the phase under way, counted once it had started (a
    /// backfill counts its rows after connecting; rows written meanwhile
    /// may take the bar past it). The clock goes on.
    pub(crate) fn set_total(&self, what: &str, total: u64) {
        if let Some(bar) = &self.bar {
            describe(bar, what, Some(total));
        }
    }

    pub(crate) fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The audit's phases, on the bar.
impl crate::audit::ProgressReporter for Progress {
    fn is_visible(&self) -> bool {
        Progress::is_visible(self)
    }

    fn start_phase(&self, what: &str, total: Option<u64>) {
        Progress::start_phase(self, what, total)
    }

    fn inc(&self, n: u64) {
        Progress::inc(self, n)
    }
}

/// A bar up to `total`, or a spinner when there is none.
fn describe(bar: &ProgressBar, what: &str, total: Option<u64>) {
    let template = match total {
        Some(n) => {
            bar.set_length(n);
            format!("{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} ({{per_sec}}, eta {{eta}})")
        }
        None => {
            bar.unset_length();
            format!("{{elapsed_precise}} {{spinner}} {{pos}} {what} ({{per_sec}})")
        }
    };
    let style = ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
}
