//! Cleanup when the test process dies without running destructors (killed
//! by a CI timeout, or aborted): a detached shell waits for this process to
//! exit, then stops what a test started, so a failed run leaves no servers
//! behind to slow down or confuse the next one. After a normal drop the
//! watchdog finds its target gone and exits by itself.

use std::path::Path;
use std::process::{Command, Stdio};

/// When this process exits, sends `signal` to the process whose pid is the
/// first line of `pid_file` (PostgreSQL's postmaster.pid) or to `pid`, then
/// removes `remove_dir` if given. Gives up as soon as `pid_file` is gone.
pub fn watch(target: Target<'_>, signal: &str, remove_dir: Option<&Path>) {
    let parent = std::process::id();
    let (alive, pid) = match target {
        Target::PidFile(f) => (
            format!("[ -e '{}' ]", f.display()),
            format!("$(head -n 1 '{}' 2>/dev/null)", f.display()),
        ),
        Target::Pid(p) => (format!("kill -0 {p} 2>/dev/null"), p.to_string()),
    };
    let cleanup = remove_dir
        .map(|d| format!("; sleep 2; rm -rf '{}'", d.display()))
        .unwrap_or_default();
    let script = format!(
        "while kill -0 {parent} 2>/dev/null; do {alive} || exit 0; sleep 1; done; \
         {alive} && kill -{signal} {pid} 2>/dev/null{cleanup}"
    );
    use std::os::unix::process::CommandExt;
    let _ = Command::new("bash")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C or kill of the test's group must
        // not take the watchdog with it.
        .process_group(0)
        .spawn();
}

pub enum Target<'a> {
    /// A pid file that exists exactly while the process runs.
    PidFile(&'a Path),
    Pid(u32),
}
