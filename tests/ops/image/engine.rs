//! The container engine as `scripts/image.sh` picks it (docker when a Docker
//! daemon answers, else podman with the flags this kind of machine needs),
//! the image built once per test run from the binary under test, and
//! containers that are removed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::outboxd::bin;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Engine {
    Docker,
    Podman,
}

pub fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    *ENGINE.get_or_init(|| {
        let docker = Command::new("docker")
            .arg("info")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if docker {
            Engine::Docker
        } else {
            Engine::Podman
        }
    })
}

/// The engine's command with its global flags: podman as root on a host
/// with hybrid cgroups needs runc and cgroupfs (crun refuses to start).
pub fn cli() -> Command {
    match engine() {
        Engine::Docker => Command::new("docker"),
        Engine::Podman => {
            let mut c = Command::new("podman");
            let flags = std::env::var("OUTBOXD_PODMAN_FLAGS")
                .unwrap_or_else(|_| "--runtime runc --cgroup-manager cgroupfs".into());
            c.args(flags.split_whitespace());
            c
        }
    }
}

/// Runs the engine with `args`; panics with its output unless it succeeds.
pub fn run(args: &[&str]) -> String {
    let out = output(args);
    assert!(
        out.status.success(),
        "{:?} failed ({}):\n{}{}",
        args,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub fn output(args: &[&str]) -> Output {
    cli()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run the container engine: {e} (scripts/setup.sh installs podman)")
        })
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What `scripts/image.sh` built.
#[derive(Debug)]
pub struct Image {
    pub tag: String,
    pub id: String,
    pub bytes: u64,
    pub build_time: Duration,
}

/// The image, built once per test run by `scripts/image.sh --binary` from
/// the binary under test, through the Dockerfile's `prebuilt` stage.
pub fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let started = Instant::now();
        let out = Command::new(repo().join("scripts/image.sh"))
            .arg("--binary")
            .arg(bin())
            .env_remove("OUTBOXD_IMAGE")
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/image.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "scripts/image.sh failed ({}):\n{stdout}{stderr}",
            out.status
        );
        let last = stdout.lines().last().unwrap_or_default();
        let words: Vec<&str> = last.split_whitespace().collect();
        assert_eq!(words.len(), 3, "last line of scripts/image.sh: {last:?}");
        let image = Image {
            tag: words[0].to_string(),
            id: words[1].to_string(),
            bytes: words[2].parse().expect("image size"),
            build_time: started.elapsed(),
        };
        eprintln!(
            "ops::image: built {} ({}) in {:.1} s: {:.1} MiB\n{}",
            image.tag,
            &image.id[..12.min(image.id.len())],
            image.build_time.as_secs_f64(),
            image.bytes as f64 / 1048576.0,
            stderr.trim()
        );
        image
    })
}

/// `image inspect` of the built image.
pub fn inspect_image() -> Value {
    let text = run(&["image", "inspect", &image().id]);
    let v: Value = serde_json::from_str(&text).expect("image inspect JSON");
    v[0].clone()
}

/// The image's HEALTHCHECK test (podman reports it beside the config,
/// docker inside it).
pub fn healthcheck_test() -> Value {
    let v = inspect_image();
    match &v["Healthcheck"] {
        Value::Null => v["Config"]["Healthcheck"]["Test"].clone(),
        h => h["Test"].clone(),
    }
}

/// Flags every container of the tests gets: the host's network (the
/// harness' servers listen on loopback), a read-only root with nothing
/// writable added (as Kubernetes' readOnlyRootFilesystem), and rlimits
/// within what this kind of host lets a container have.
fn run_flags() -> Vec<String> {
    let mut flags: Vec<String> = [
        "--network",
        "host",
        "--read-only",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1000:1000",
    ]
    .map(String::from)
    .into();
    if engine() == Engine::Podman {
        flags.push("--read-only-tmpfs=false".into());
    }
    flags
}

/// A container's options: environment, a mounted config file, arguments.
#[derive(Default)]
pub struct Spec<'a> {
    pub env: Vec<(&'a str, String)>,
    pub mount_config: Option<&'a Path>,
    pub args: Vec<&'a str>,
}

impl Spec<'_> {
    fn flags(&self) -> Vec<String> {
        let mut flags = run_flags();
        for (k, v) in &self.env {
            flags.push("--env".into());
            flags.push(format!("{k}={v}"));
        }
        if let Some(path) = self.mount_config {
            flags.push("--volume".into());
            flags.push(format!("{}:/etc/outboxd/outboxd.toml:ro", path.display()));
        }
        flags
    }
}

/// Runs the image to completion (`run --rm`): exit code and output.
pub fn run_once(spec: &Spec<'_>) -> (Option<i32>, String) {
    let flags = spec.flags();
    let mut args: Vec<&str> = vec!["run", "--rm"];
    args.extend(flags.iter().map(String::as_str));
    args.push(&image().id);
    args.extend(spec.args.iter().copied());
    let out = output(&args);
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A detached container; removed (killed if need be) when dropped.
pub struct Container {
    pub name: String,
}

impl Container {
    pub fn start(name: &str, spec: &Spec<'_>) -> Container {
        let name = format!("outboxd-test-{name}-{}", std::process::id());
        // A leftover of an earlier run killed before it could clean up.
        let _ = output(&["rm", "-f", &name]);
        let flags = spec.flags();
        let mut args: Vec<&str> = vec!["run", "--detach", "--name", &name];
        args.extend(flags.iter().map(String::as_str));
        args.push(&image().id);
        args.extend(spec.args.iter().copied());
        run(&args);
        Container { name }
    }

    pub fn logs(&self) -> String {
        let out = output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    pub fn inspect(&self) -> Value {
        let text = run(&["container", "inspect", &self.name]);
        let v: Value = serde_json::from_str(&text).expect("container inspect JSON");
        v[0].clone()
    }

    /// Waits up to `timeout` for `cond`; panics with the container's log.
    pub fn wait_for(&self, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
        let started = Instant::now();
        while !cond() {
            assert!(
                started.elapsed() < timeout,
                "timed out after {timeout:?} waiting for {what}; container log:\n{}",
                self.logs()
            );
            assert_eq!(
                self.inspect()["State"]["Running"],
                true,
                "the container stopped while waiting for {what}; its log:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The container's main process as the host sees it.
    pub fn pid(&self) -> u32 {
        let pid = self.inspect()["State"]["Pid"].as_u64().unwrap_or(0);
        assert!(pid > 0, "container not running:\n{}", self.logs());
        pid as u32
    }

    /// The image's HEALTHCHECK command run in the container, as the engine
    /// runs it: exit status and output.
    pub fn health_check(&self) -> (bool, String) {
        let test: Vec<String> = healthcheck_test()
            .as_array()
            .expect("the image has a HEALTHCHECK")
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(test[0], "CMD", "exec form, no shell in the image");
        let mut args: Vec<&str> = vec!["exec", &self.name];
        args.extend(test[1..].iter().map(String::as_str));
        let out = output(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if engine() == Engine::Podman {
            // podman's own runner agrees (it keeps HEALTHCHECK only in the
            // docker image format, which scripts/image.sh builds).
            let own = output(&["healthcheck", "run", &self.name]);
            assert_eq!(
                own.status.success(),
                out.status.success(),
                "podman healthcheck run: {}{}",
                String::from_utf8_lossy(&own.stdout),
                String::from_utf8_lossy(&own.stderr)
            );
        }
        (out.status.success(), text)
    }

    /// `stop` (SIGTERM, then SIGKILL after `grace`): the exit code and how
    /// long the container took.
    pub fn stop(&self, grace: Duration) -> (i64, Duration) {
        let started = Instant::now();
        run(&["stop", "--time", &grace.as_secs().to_string(), &self.name]);
        let took = started.elapsed();
        let code = self.inspect()["State"]["ExitCode"]
            .as_i64()
            .expect("exit code");
        (code, took)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = output(&["rm", "--force", &self.name]);
    }
}
