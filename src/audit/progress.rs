//! How the audit tells its progress to whoever runs it.

/// How far the audit got, told as it goes: the library draws nothing, the
/// caller shows it (a progress bar on a terminal) or not.
pub trait ProgressReporter: Clone + Send + 'static {
    /// Whether anyone looks: a phase's total costs a count, made only then.
    fn is_visible(&self) -> bool;
    /// A new phase: `what` counted up to `total` when it is known.
    fn start_phase(&self, what: &str, total: Option<u64>);
    /// `n` more done in the phase under way.
    fn inc(&self, n: u64);
}
