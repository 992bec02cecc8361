//! `cargo` run from inside a test as from the command line.
//!
//! Cargo runs a test with its package's variables set (CARGO_PKG_*,
//! CARGO_MANIFEST_DIR, ...), and ring's build script reruns when those
//! change. Handed on to a nested `cargo build` in the shared target dir, they
//! made it recompile ring, rustls and outboxd (about 80 s of ops::bench's
//! 135 s), and the next build without them (`cargo test`, or another test's
//! build from here) did the same again the other way.

use std::process::Command;

/// A `cargo` command (the one running the tests) without the variables cargo
/// sets only for a running test.
pub fn cargo() -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_the_test) {
            command.env_remove(name);
        }
    }
    command
}

fn set_by_cargo_for_the_test(name: &str) -> bool {
    [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_BIN_",
        "CARGO_CFG_",
        "CARGO_FEATURE_",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ]
        .contains(&name)
}
