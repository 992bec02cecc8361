//! Progress of an audit on stderr, only when stderr is a terminal: one bar
//! per phase (rows, records, comparison). A log file or a pipe gets the
//! report alone.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Clone)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Bars when stderr is a terminal, else nothing.
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

    /// A new phase: `what` counted up to `total` when it is known.
    pub(crate) fn start_phase(&self, what: &str, total: Option<u64>) {
        let Some(bar) = &self.bar else {
            return;
        };
        bar.reset();
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
