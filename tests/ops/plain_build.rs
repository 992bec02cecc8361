//! The plain build needs a C toolchain, cmake and OpenSSL's headers, not
//! libcurl's: librdkafka's `rdkafka_conf.c` includes `curl/curl.h` even
//! with OIDC off (`#ifdef` of a macro that config.h always defines, to 0 or
//! 1), so rdkafka's `curl-static` feature builds libcurl from source and
//! librdkafka compiles against that.
//!
//! The proof: in a mount namespace where every file of Debian's
//! `libcurl4-openssl-dev` is hidden (headers, pkg-config file, static
//! library; its symlinks point at the runtime library and stay),
//! cargo runs the build scripts with the features and profile of
//! `cargo build --release`. Headers are only read there: `cargo check`
//! runs every build script (librdkafka and curl compiled by cmake and cc)
//! and leaves out only the code generation of the Rust crates. Its target
//! directory is kept beside the suite's, so a later run only checks what
//! changed.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::harness::outboxd::bin;
use crate::harness::wait::last_lines;

/// Hides the files of libcurl's development package in a private mount
/// namespace, shows that curl.h is gone, then runs the command given.
const HIDE_LIBCURL_DEV: &str = r#"set -eu
if dpkg -L libcurl4-openssl-dev >/dev/null 2>&1; then
  for f in $(dpkg -L libcurl4-openssl-dev); do
    if [ -d "$f" ] && [ "$(basename "$f")" = curl ]; then
      mount -t tmpfs -o ro,size=4k none "$f"
    elif [ -f "$f" ] && [ ! -L "$f" ]; then
      mount --bind /dev/null "$f"
    fi
  done
fi
echo '#include <curl/curl.h>' | cc -E -x c - >/dev/null 2>&1 && { echo "curl/curl.h still visible" >&2; exit 97; }
pkg-config --exists libcurl 2>/dev/null && { echo "libcurl.pc still visible" >&2; exit 98; }
exec "$@"
"#;

#[test]
fn release_build_scripts_run_without_libcurl_headers() {
    // <target>/debug/outboxd -> <target>/clean-env
    let target: PathBuf = PathBuf::from(bin())
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .join("clean-env");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = is_root();
    let mut cmd = Command::new("unshare");
    if !root {
        // Without root, a user namespace gives the mount namespace.
        cmd.arg("--map-root-user");
    }
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        HIDE_LIBCURL_DEV,
        "sh",
    ])
    .arg(cargo)
    .args(["check", "--release", "--locked", "--bin", "outboxd"])
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .env("CARGO_TARGET_DIR", &target)
    .env("CARGO_TERM_COLOR", "never");
    let started = Instant::now();
    let out = cmd.output().expect("run unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the release build without libcurl's headers failed ({}):\n{}",
        out.status,
        last_lines(&stderr, 60)
    );
    eprintln!(
        "ops::plain_build: build scripts and check without libcurl headers in {:.0} s ({})",
        started.elapsed().as_secs_f64(),
        target.display()
    );
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
